"""The package's layers: contract and loops at the bottom, models beside them, then the library,
then the runs users start (`runs/`) and the reproduction reports (`experiments/`). These checks
read the import statements, so an arrow that runs back up fails here rather than in review."""

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "speculative"

# Modules the decode loops are built from: they may import each other, never a model.
CORE = {"contract", "decoding", "sampling", "verification", "stats", "validation", "theory"}


def _imports(path: pathlib.Path, top_level_only: bool = False):
    """`speculative.*` modules that `path` imports (`from speculative import x` counts as
    `speculative.x`)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] == "speculative":
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "speculative")
    return found


def _modules(sub=None):
    root = PACKAGE / sub if sub else PACKAGE
    return sorted(p for p in root.rglob("*.py") if p.name != "__init__.py")


def _layer(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE)
    if rel.parts[0] in ("models", "runs", "experiments"):
        return rel.parts[0]
    return "core" if rel.stem in CORE else "library"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_back_up(path):
    layer = _layer(path)
    forbidden = {"core": ("speculative.models", "speculative.runs", "speculative.experiments"),
                 "models": ("speculative.runs", "speculative.experiments",
                            "speculative.decode.loops", "speculative.training.distillation"),
                 "library": ("speculative.runs", "speculative.experiments"),
                 "runs": ("speculative.experiments",),
                 # one module per report: the reports share the library, never each other
                 "experiments": ("speculative.experiments",)}[layer]
    imports = _imports(path, top_level_only=path.stem == "decoding")
    bad = sorted(m for m in imports if m.startswith(forbidden))
    assert not bad, f"{path.relative_to(PACKAGE)} ({layer}) imports {bad}"


def test_importing_decoding_loads_no_model():
    """The decoder knows the contract only; the T5 adapters it re-exports load on first use."""
    code = ("import sys, speculative.decoding as d; "
            "print(sorted(m for m in sys.modules if m.startswith('speculative.')));"
            "d.EncoderDecoderModel; print('speculative.models.adapters' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent).stdout.splitlines()
    assert "models" not in out[0] and "runs" not in out[0], out[0]
    assert out[1] == "True"


def test_module_sizes():
    """One concept per module: none over 700 lines, and the runs users start stay small (the
    library does the work, the reports live in experiments/)."""
    sizes = {p.relative_to(PACKAGE): len(p.read_text().splitlines()) for p in _modules()}
    assert not {p: n for p, n in sizes.items() if n > 700}
    assert sum(n for p, n in sizes.items() if p.parts[0] == "runs") <= 2500
