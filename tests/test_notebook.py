"""Executes notebooks/speculative_decoding_tour.ipynb on CPU (nbclient) and checks its results.

Known answers checked in the outputs: at temperature 0 speculative decoding equals autoregressive
decoding; the round-by-round replay equals `speculative_decode`'s tokens; alpha lies in [0, 1];
each printed Theorem 3.8 value is `theory.speedup` of the printed alpha, gamma and c; the speedup
plot is drawn. Runs with the bundled large pair when installed, else with the random fallback.
`python tests/test_notebook.py` executes it and saves the outputs into the committed copy.
"""

import importlib.metadata
import json
import os
import re
import sys
import time

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

from speculative.measure import analysis as theory
from tests.helpers import REPO

NOTEBOOK = os.path.join(REPO, "notebooks", "speculative_decoding_tour.ipynb")
KERNEL = "speculative-tests"


# The suite runs the tour with a shorter sweep (its parameters, as papermill would set them);
# `python tests/test_notebook.py` runs and saves it as committed.
QUICK = {"GAMMAS = (2, 4, 6)": "GAMMAS = (2, 4)",
         "def timed(decode_all, repeats=3):": "def timed(decode_all, repeats=1):"}


def execute(notebook: str, jupyter_dir: str, replace=None):
    """Runs `notebook` in a kernel of this interpreter (so it imports this checkout's package,
    whatever other "python3" kernels the machine has) on the CPU -> (notebook, seconds).
    `replace` ({old: new}) edits code cells first; each `old` must occur."""
    kernel_dir = os.path.join(jupyter_dir, "kernels", KERNEL)
    os.makedirs(kernel_dir, exist_ok=True)
    with open(os.path.join(kernel_dir, "kernel.json"), "w") as f:
        json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f",
                            "{connection_file}"],
                   "display_name": "speculative tests", "language": "python"}, f)
    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "JAX_PLATFORMS", "MPLBACKEND")}
    os.environ.update(JUPYTER_PATH=jupyter_dir, JAX_PLATFORMS="cpu")
    os.environ.pop("MPLBACKEND", None)
    try:
        assert KERNEL in KernelSpecManager().find_kernel_specs()
        nb = nbformat.read(notebook, as_version=4)
        for old, new in (replace or {}).items():
            hits = [c for c in nb.cells if c.cell_type == "code" and old in c.source]
            assert hits, f"the notebook no longer has {old!r}; update QUICK"
            for c in hits:
                c.source = c.source.replace(old, new)
        start = time.perf_counter()
        NotebookClient(nb, kernel_name=KERNEL, timeout=600,
                       resources={"metadata": {"path": os.path.dirname(notebook)}}).execute()
        seconds = time.perf_counter() - start
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb, seconds


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb, seconds = execute(NOTEBOOK, str(tmp_path_factory.mktemp("jupyter")), QUICK)
    return {cell.id: cell for cell in nb.cells}, seconds


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_notebook_runs_without_errors(executed):
    cells, seconds = executed
    code = [c for c in cells.values() if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert seconds < 300, f"the tour took {seconds:.0f} s; keep it under a minute on 2 cores"


def test_committed_copy_keeps_its_outputs_and_shows_a_speedup():
    """Readers on GitHub and Colab see the outputs of a run (`python tests/test_notebook.py`
    writes them): every code cell has run, in order, and the large pair's sweep shows a
    speedup above 1 at T = 0."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    assert all(c.outputs for c in code)
    cells = {c.id: c for c in nb.cells}
    assert "target large_target, draft large_draft_kdtv" in _text(cells["load-models"])
    speedups = [float(x) for x in re.findall(r"measured speedup ([\d.]+)x", _text(cells["sweep"]))]
    assert len(speedups) == 3 and max(speedups) > 1.0, speedups
    # The install cell and the device cell are there for Colab.
    assert "pip" in cells["install"].source and "jax.devices()" in cells["setup"].source
    assert "colab.research.google.com/github/" in cells["intro"].source


def test_install_cell_keeps_a_recent_runtime_jax_and_replaces_an_older_one(capsys):
    """The Colab install cell: a runtime JAX at or above what the package's flax needs is kept
    (pinned, so pip cannot swap it for a build for another device); an older one, or none, gets
    CI's JAX for the runtime's device through setup.py's [cuda] / [tpu] extras. The cell runs
    here as in a checkout (the package is importable, so it installs nothing)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    [cell] = [c for c in nb.cells if c.id == "install"]
    namespace = {}
    exec(compile(cell.source, "install-cell", "exec"), namespace)  # pylint: disable=exec-used
    assert "speculative is importable: True" in capsys.readouterr().out
    targets = namespace["pip_targets"]
    assert targets("speculative", "0.10.2", "0.10.2", "cuda") == [
        "speculative", "jax==0.10.2", "jaxlib==0.10.2"]
    assert targets("speculative", "0.11.0", None, "cpu") == ["speculative", "jax==0.11.0"]
    assert targets("speculative", "0.6.2", "0.6.2", "cuda") == ["speculative[cuda]"]
    assert targets("speculative", "0.4.33", "0.4.33", "tpu") == ["speculative[tpu]"]
    assert targets("speculative", None, None, "cpu") == ["speculative"]
    assert namespace["runtime_device"]() in ("cuda", "tpu", "cpu")
    # The floor is the one the installed flax declares, and the extras the cell names exist.
    [need] = [r for r in importlib.metadata.requires("flax") if re.match(r"jax\s*>=", r)]
    assert namespace["MIN_JAX"] == tuple(int(n) for n in re.findall(r"\d+", need)[:2]), need
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        setup = f.read()
    assert '"cuda": [f"jax[cuda12]==' in setup and '"tpu": [f"jax[tpu]==' in setup


def test_the_tour_names_the_main_jobs_default_draft():
    """The tour replays rounds with a separate T5 draft, and says that the main job's default
    (the README's) is large_feature_draft."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = {c.id: c for c in nb.cells}
    assert "`large_feature_draft`" in cells["intro"].source
    assert "best separate T5 draft" in cells["intro"].source
    assert "large_feature_draft" in cells["models-md"].source


def test_models_are_bundled_or_the_fallback_says_so(executed):
    text = _text(executed[0]["load-models"])
    assert ("bundled models: target large_target, draft large_draft_kdtv" in text
            or "FALLBACK: tiny random T5 models" in text)
    assert re.search(r"target:\s+[\d.]+M parameters", text)
    assert re.search(r"draft :\s+[\d.]+M parameters", text)


def test_decode_cell_shows_exactness_alpha_and_tokens_per_call(executed):
    text = _text(executed[0]["decode"])
    assert "identical to autoregressive decoding: True" in text
    alpha = float(re.search(r"alpha = ([\d.]+)", text).group(1))
    assert 0.0 <= alpha <= 1.0
    per_call = float(re.search(r"tokens per target call = ([\d.]+) with gamma = 4", text).group(1))
    assert 1.0 <= per_call <= 5.0  # at most gamma + 1 tokens per target call


def test_trace_replays_speculative_decode(executed):
    text = _text(executed[0]["trace"])
    assert re.search(r"round  1: accepted [0-4]/4", text)
    assert "trace == speculative_decode: True" in text
    rounds = len(re.findall(r"^round +\d+:", text, flags=re.M))
    assert f"in {rounds} target calls" in text


def test_sweep_matches_theorem_3_8_and_plots(executed):
    cell = executed[0]["sweep"]
    text = _text(cell)
    c = float(re.search(r"c = ([\d.]+)", text).group(1))
    rows = re.findall(r"gamma (\d+): alpha ([\d.]+)\s+measured speedup ([\d.]+)x\s+"
                      r"Theorem 3.8 ([\d.]+)x", text)
    assert [int(r[0]) for r in rows] == [2, 4]  # QUICK's sweep
    for gamma, alpha, measured, predicted in rows:
        assert float(measured) > 0
        # Printed values are rounded (alpha, c to 3 decimals): compare with a matching tolerance.
        assert float(predicted) == pytest.approx(
            theory.speedup(float(alpha), int(gamma), c), abs=0.02)
    assert any("image/png" in o.get("data", {}) for o in cell.outputs)


if __name__ == "__main__":
    # `python tests/test_notebook.py`: executes the notebook and saves it with its outputs (the
    # committed copy keeps them, for readers on GitHub and Colab); run it on a quiet machine.
    import tempfile  # pylint: disable=g-import-not-at-top

    with tempfile.TemporaryDirectory() as tmp:
        executed_nb, took = execute(NOTEBOOK, tmp)
    for cell in executed_nb.cells:  # outputs only: no kernel-specific metadata
        cell.metadata.pop("execution", None)
    executed_nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                          "name": "python3"}
    nbformat.write(executed_nb, NOTEBOOK)
    print(f"executed in {took:.0f} s and saved with its outputs: {NOTEBOOK}")
