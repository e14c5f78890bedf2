"""The package's rooms and the rules between them, read from the code's imports and syntax.

Rooms, lowest first: `files.py` (the one utility module), `decode/`, `beam/`, `models/`,
`checkpoints/`, `measure/`, `data/`, `training/`, the facades (`decoding.py`, `sampling.py`,
`theory.py`, `loading.py`: the public API names), `runs/`, `experiments/`. A module imports only
from its own room or a lower one, and the import graph has no cycle."""

import ast
import collections
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "speculative"
ROOMS = ("files", "decode", "beam", "models", "checkpoints", "measure", "data", "training",
         "facade", "runs", "experiments")
FACADES = ("decoding", "sampling", "theory", "loading")
LOOP = PACKAGE / "decode" / "loops.py"
# Functions allowed over 80 lines (each says why in its docstring).
LONG_FUNCTIONS_ALLOWED = 3


def _name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[1] in FACADES):
        return "facade"
    return parts[1] if parts[1] != "files" else "files"


def _imports(path: pathlib.Path):
    """`speculative.*` modules `path` imports anywhere (function-level imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] == "speculative":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "speculative")
    return {m for m in found if m in MODULES}


GRAPH = {m: _imports(p) for m, p in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_runs_back_up(module):
    up = sorted(d for d in GRAPH[module] if ROOMS.index(_room(d)) > ROOMS.index(_room(module)))
    assert not up, f"{module} ({_room(module)}) imports higher rooms: {up}"


def test_no_import_cycles():
    """Tarjan's strongly connected components of the module graph: all of size one."""
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_reports_do_not_import_each_other():
    shared = {f"speculative.experiments.{n}" for n in ("record", "headline")}
    for module, deps in GRAPH.items():
        if _room(module) == "experiments":
            others = {d for d in deps if _room(d) == "experiments" and d != module} - shared
            assert not others, f"{module} imports other reports {sorted(others)}"


def test_no_module_file_name_occurs_twice():
    """A name says which module it is: `sampling.py` in two places made readers guess."""
    names = collections.Counter(p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert not [n for n, k in names.items() if k > 1], names.most_common(3)


def test_at_most_ten_modules_at_the_top():
    top = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 10, top


def test_the_loop_asks_no_model_what_it_is():
    """The decode loop's module neither probes objects (hasattr) nor branches on the draft's
    kind (reads_target): drafters, layouts and verifiers are objects chosen once per call."""
    source = LOOP.read_text()
    assert "hasattr(" not in source
    assert "reads_target(" not in source
    tree = ast.parse(source)
    body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_round")
    assert not [n for n in ast.walk(body) if isinstance(n, (ast.If, ast.IfExp))], \
        "the round body has no branches"


def test_importing_the_loops_loads_no_model():
    code = ("import sys, speculative.decode.loops, speculative.beam.search; "
            "print(sorted(m for m in sys.modules if m.startswith('speculative.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent).stdout
    assert "speculative.models" not in out and "speculative.checkpoints" not in out, out


def test_import_speculative_is_light_and_its_modules_come_on_first_use():
    """`import speculative` imports no JAX; `speculative.loading` (and the other public
    modules) are then there without their own import line."""
    code = ("import sys, speculative; light = 'jax' not in sys.modules; "
            "print(light, callable(speculative.loading.load_model), "
            "hasattr(speculative.decoding, 'speculative_decode'), "
            "speculative.sampling.SamplingConfig.__name__, "
            "callable(speculative.checkpoints.load_params), 'jax' in sys.modules, "
            "sorted(set(dir(speculative)) & {'decoding', 'loading', 'sampling', 'checkpoints'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent).stdout.split(None, 6)
    assert out[:6] == ["True", "True", "True", "SamplingConfig", "True", "True"], out
    assert out[6].strip() == "['checkpoints', 'decoding', 'loading', 'sampling']", out
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import speculative  # pylint: disable=import-outside-toplevel
        speculative.nope  # noqa: B018  # pylint: disable=pointless-statement


def _functions():
    for module, path in MODULES.items():
        if _room(module) == "experiments":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield module, node


def test_no_function_over_twelve_parameters():
    wide = []
    for module, node in _functions():
        a = node.args
        names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
        count = len(names) - (names[:1] in (["self"], ["cls"])) + bool(a.vararg) + bool(a.kwarg)
        if count > 12:
            wide.append(f"{module}.{node.name} ({count})")
    assert not wide, f"take a settings dataclass instead: {wide}"


def test_long_functions_are_few_and_say_why():
    long = [(module, node) for module, node in _functions()
            if node.end_lineno - node.lineno + 1 > 80]
    names = [f"{m}.{n.name} ({n.end_lineno - n.lineno + 1} lines)" for m, n in long]
    assert len(long) <= LONG_FUNCTIONS_ALLOWED, names
    for module, node in long:
        doc = ast.get_docstring(node) or ""
        assert "long" in doc.lower(), f"{module}.{node.name} is long: say why in its docstring"


def test_module_sizes():
    """One concept per module: none over 700 lines."""
    sizes = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    assert not {m: n for m, n in sizes.items() if n > 700}


def test_re_exports_only_for_the_public_api():
    """`from x import y as y` re-exports a name; only the public API's facades and the bundle
    (speculative.runs.mini) do that, so every other name is imported from where it lives."""
    allowed = {"speculative.runs.mini"}
    found = collections.defaultdict(list)
    for module, path in MODULES.items():
        if _room(module) == "facade" and module.split(".")[-1] in FACADES or module in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("speculative"):
                found[module] += [a.name for a in node.names if a.asname == a.name]
    found = {m: names for m, names in found.items() if names}
    assert not found, f"re-exported names (import them from where they live): {found}"


# ----------------------------------------------------------------------------------------------
# The tests mirror the package: speculative/<room>/<module>.py is tested by
# tests/<room>/test_<module>.py (a top-level module by tests/test_<module>.py). Tests of the
# repository as a whole (README, docs, layering, CLI and scripts, notebook, the catalogue of bad
# settings) stay at tests/ top level.

TESTS = pathlib.Path(__file__).resolve().parent
# Modules with no logic of their own: nothing to test apart from what they re-export.
NO_LOGIC = {
    "speculative.decoding": "facade: re-exports the decode loops' and adapters' public names",
    "speculative.sampling": "facade: re-exports the sampling policies' public names",
    "speculative.theory": "facade: re-exports speculative.measure.analysis's public names",
    "speculative.loading": "facade: re-exports the model loaders' public names",
}
# Modules with logic but no test file of their own yet, each with where (if anywhere) its code
# is exercised today. Keep this small: a module's first test file removes it from here.
NOT_YET_TESTED = {
}


def _test_file(module: str) -> pathlib.Path:
    parts = module.split(".")[1:]
    return TESTS.joinpath(*parts[:-1], f"test_{parts[-1]}.py")


def test_every_module_with_logic_has_its_mirrored_test_file():
    modules = {m for m, p in MODULES.items() if p.name != "__init__.py"}
    assert not (set(NO_LOGIC) | set(NOT_YET_TESTED)) - modules, "listed modules that are gone"
    assert not set(NO_LOGIC) & set(NOT_YET_TESTED)
    missing = sorted(str(_test_file(m).relative_to(TESTS.parent)) for m in modules
                     if m not in NO_LOGIC and m not in NOT_YET_TESTED and
                     not _test_file(m).exists())
    assert not missing, f"modules without their mirrored test file: {missing}"
    tested = sorted(m for m in NOT_YET_TESTED if _test_file(m).exists())
    assert not tested, f"tested now: take them out of NOT_YET_TESTED: {tested}"


def test_no_test_file_imports_another():
    """Shared helpers live in tests/helpers (and fixtures in conftest.py), never in a test file."""
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" if node.module else a.name for a in node.names]
                     if isinstance(node, ast.ImportFrom) else [])
            if isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
            bad += [f"{path.relative_to(TESTS)}: {n}" for n in names
                    if any(p.startswith("test_") or p == "conftest" for p in n.split("."))]
    assert not bad, f"test files importing test modules: {bad}"


# ----------------------------------------------------------------------------------------------
# Draft kinds are known by the drafters alone.

# Outside these, no module asks a model, draft or verifier what it is: the drafters answer
# (decode/drafters.py `Capabilities`). beam/ moves onto drafter objects on its own.
KINDS_KNOWN_IN = ("decode", "beam")
KIND_FACTORY = "data/bundles.py"  # the one factory: a name or a card entry's kind -> a drafter
KIND_CONSTANTS = {"READS_TARGET", "BLOCK_DRAFT", "FEATURE_DRAFT", "HYBRID"}
KIND_PROBES = {"reads_target", "drafts_blocks"}  # contract's model-level questions
# hasattr on things that are no model, draft or verifier: (file, the line's text).
HASATTR_ALLOWED = {
    ("checkpoints/param_trees.py", "hasattr(ml_dtypes, d)"),  # a dtype name
    ("checkpoints/hf.py", 'hasattr(x, "detach")'),  # a torch tensor
    ("experiments/limits.py", 'hasattr(os, "getloadavg")'),  # the platform
    ("runs/config.py", 'hasattr(sys.stderr, "isatty")'),  # the terminal
}


def _is_kindish(node) -> bool:
    """`x.kind`, `kind`, `entry.get("kind")`, `entry["kind"]`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Name):
        return node.id == "kind"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return (node.func.attr == "get" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    return False


DRAFT_KINDS = {"chain", "block", "tree", "baseline", "feature_draft", "block_draft", "hybrid",
               "unigram", "bigram", "prompt_lookup", "target-aware"}  # names a draft goes by


def _is_kind_value(node) -> bool:
    """A draft kind's name, a collection holding one, or one of the card's kind constants."""
    if isinstance(node, ast.Constant):
        return node.value in DRAFT_KINDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_kind_value(e) for e in node.elts)
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name in KIND_CONSTANTS


def kind_tests(source: str, allowed=frozenset()):
    """`(line, text)` of each place `source` asks an object what kind of draft it is: a
    `hasattr` (but the `allowed` lines), contract's `reads_target(...)` / `drafts_blocks(...)`,
    or a comparison of a kind with a string or a kind constant."""
    lines, found = source.splitlines(), []
    for node in ast.walk(ast.parse(source)):
        bad = False
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "hasattr":
                text = lines[node.lineno - 1]
                bad = not any(a in text for a in allowed)
            bad = bad or name in KIND_PROBES
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            bad = (any(_is_kindish(s) for s in sides) and any(_is_kind_value(s) for s in sides)
                   or any(_is_kind_value(s) and not isinstance(s, (ast.Constant, ast.Tuple,
                                                                  ast.List, ast.Set))
                          for s in sides))
        if bad:
            found.append((node.lineno, lines[node.lineno - 1].strip()))
    return sorted(found)


def test_the_kind_scan_finds_each_way_of_asking():
    """A negative control: the scan flags every form the drafters replaced."""
    bad = '\n'.join([
        'if contract.reads_target(model): pass',
        'depth = 4 if hasattr(draft, "unrolled_logits") else 1',
        'if entry.get("kind") in READS_TARGET: pass',
        'if entry.get("kind") == BLOCK_DRAFT: pass',
        'if plan.kind == "tree": pass',
        'block = contract.drafts_blocks(draft)',
        'x = entry["kind"] != "hybrid"',
    ])
    assert [n for n, _ in kind_tests(bad)] == [1, 2, 3, 4, 5, 6, 7]
    fine = '\n'.join([
        'if drafter.reads_target and not drafter.proposes_block: pass',
        'label = c.name if c.kind != kind else "g"',  # two records' kinds, compared
        'entry = {"kind": bundles.HYBRID}',  # a card entry written
        'load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None',
    ])
    assert kind_tests(fine, {'hasattr(os, "getloadavg")'}) == []


def test_no_module_outside_the_drafters_asks_what_kind_a_draft_is():
    """Outside decode/ (and beam/) and the one factory (`bundles`: a name or a card entry's
    `kind` becomes a model, then `drafters.as_drafter` its drafter) nothing probes a model,
    draft or verifier with `hasattr`, asks contract's `reads_target`, or compares a draft
    kind with a string: capabilities are the drafters' properties (decode/drafters.py)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.split("/")[0] in KINDS_KNOWN_IN or rel == KIND_FACTORY:
            continue
        allowed = {text for where, text in HASATTR_ALLOWED if where == rel}
        hits = kind_tests(path.read_text(), allowed)
        if hits:
            found[rel] = hits
    assert not found, found
    for where, text in HASATTR_ALLOWED:  # the allow-list names lines that still exist
        assert text in (PACKAGE / where).read_text(), (where, text)
