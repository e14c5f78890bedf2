"""Executes notebooks/speculative_decoding_tour.ipynb on CPU (nbclient) and checks its results.

Known answers checked in the outputs: at temperature 0 speculative decoding equals autoregressive
decoding; the round-by-round replay equals `speculative_decode`'s tokens; alpha lies in [0, 1];
each printed Theorem 3.8 value is `theory.speedup` of the printed alpha, gamma and c; the speedup
plot is drawn. Runs with the bundled mini models when installed, else with the random fallback.
"""

import json
import os
import re
import sys
import time

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

from speculative import theory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "notebooks", "speculative_decoding_tour.ipynb")
KERNEL = "speculative-tests"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    # A kernelspec that runs this interpreter (so the kernel imports this checkout's package),
    # whatever other "python3" kernels the machine has.
    jupyter_dir = tmp_path_factory.mktemp("jupyter")
    kernel_dir = jupyter_dir / "kernels" / KERNEL
    kernel_dir.mkdir(parents=True)
    (kernel_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "speculative tests", "language": "python"}))
    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "JAX_PLATFORMS", "MPLBACKEND")}
    os.environ.update(JUPYTER_PATH=str(jupyter_dir), JAX_PLATFORMS="cpu")
    os.environ.pop("MPLBACKEND", None)
    try:
        assert KERNEL in KernelSpecManager().find_kernel_specs()
        nb = nbformat.read(NOTEBOOK, as_version=4)
        start = time.perf_counter()
        NotebookClient(nb, kernel_name=KERNEL, timeout=600,
                       resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}}).execute()
        seconds = time.perf_counter() - start
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {cell.id: cell for cell in nb.cells}, seconds


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_notebook_runs_without_errors(executed):
    cells, seconds = executed
    code = [c for c in cells.values() if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert seconds < 300, f"the tour took {seconds:.0f} s; keep it under a minute on 2 cores"


def test_models_are_bundled_or_the_fallback_says_so(executed):
    text = _text(executed[0]["load-models"])
    assert "bundled mini models" in text or "FALLBACK: tiny random T5 models" in text
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
    assert [int(r[0]) for r in rows] == [1, 2, 4, 6]
    for gamma, alpha, measured, predicted in rows:
        assert float(measured) > 0
        # Printed values are rounded (alpha, c to 3 decimals): compare with a matching tolerance.
        assert float(predicted) == pytest.approx(
            theory.speedup(float(alpha), int(gamma), c), abs=0.02)
    assert any("image/png" in o.get("data", {}) for o in cell.outputs)
