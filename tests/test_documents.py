"""Document checks: the tables the README and results/README.md show are what the committed
results files give. These check committed files against each other (a results file changed
without its table, or the reverse); they do not test code."""

import json
import os

import pytest

from speculative.data import bundles
from speculative.experiments import mini_results
from speculative.runs import mini

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_README = os.path.join(REPO, "results", "README.md")
BEAM = os.path.join(REPO, "results", "beam")


def _written():
    """(results, directory) of every bundled target whose results are written."""
    return [(mini_results.load_results(os.path.join(REPO, mini_results.RESULT_DIRS[t])),
             mini_results.RESULT_DIRS[t]) for t in bundles.targets()
            if os.path.exists(os.path.join(REPO, mini_results.RESULT_DIRS[t], "results.json"))]


@pytest.mark.skipif(not mini.available(), reason="no bundled models")
def test_results_readme_shows_the_results_files():
    readme = open(RESULTS_README, encoding="utf-8").read()
    written = _written()
    assert written, "no results written"
    for _, directory in written:
        for name in ("table2.md", "table3.md", "table4.md"):
            table = open(os.path.join(REPO, directory, name)).read().strip()
            assert table in readme, f"results/README.md does not show {directory}/{name}"


@pytest.mark.skipif(not os.path.isdir(BEAM), reason="results/beam not written yet")
def test_beam_table_is_the_results_files():
    """The beam table rows are results/beam/w*/metrics.json (scripts/infer.py's output): BLEU,
    target forwards, the target's own forwards and the saving, each run the speculative
    search."""
    readme = open(RESULTS_README, encoding="utf-8").read()
    widths = sorted(int(d[1:]) for d in os.listdir(BEAM) if d.startswith("w"))
    assert widths == [1, 2, 4]
    for w in widths:
        with open(os.path.join(BEAM, f"w{w}", "metrics.json")) as f:
            m = json.load(f)
        d = m["decoding"]
        assert m["mode"] == "speculative_beam_search" and m["settings"]["beam_size"] == w
        assert d["target_calls"] < d["target_alone_forwards"]
        row = (f"| {w} | {m['metrics']['bleu']:.1f} | {d['target_calls']} | "
               f"{d['target_alone_forwards']} | {100 * d['target_calls_saved']:.0f}% |")
        assert row in readme, f"results/README.md's beam table lacks {row}"


def test_readme_fits_a_screen_and_starts_with_the_two_commands():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert len(text.encode("utf-8")) <= 12_000
    head = "\n".join(text.splitlines()[:40])
    assert "python scripts/demo.py" in head and "python -m pytest -q" in head
    ci = open(os.path.join(REPO, ".ci", "run"), encoding="utf-8").read()
    test_command = next(line for line in text.splitlines() if "python -m pytest -q" in line)
    assert test_command.strip() in ci, "README's test command differs from .ci/run's"


def test_accelerator_extras_pin_the_jax_ci_tests():
    """`pip install -e ".[tpu]"` / `".[cuda]"` install the JAX release constraints.txt pins."""
    import re  # pylint: disable=import-outside-toplevel

    pins = dict(re.findall(r"^(jax|jaxlib)==(\S+)$", open(os.path.join(REPO, "constraints.txt"))
                           .read(), flags=re.M))
    setup = open(os.path.join(REPO, "setup.py")).read()
    assert f'JAX_VERSION = "{pins["jax"]}"' in setup and pins["jaxlib"] == pins["jax"]
    for extra, spec in (("tpu", "jax[tpu]"), ("cuda", "jax[cuda12]"), ("cuda13", "jax[cuda13]")):
        assert f'"{extra}": [f"{spec}=={{JAX_VERSION}}"]' in setup, extra


ABLATIONS = {  # results/README.md's hand-kept tables of the target-aware drafts
    "feature_ablation_2l": ["large_draft_kdtv", "ttt2l", "ttt2l_hot2500"],
    "feature_ablation_1l": ["large_draft_kdtv", "ttt1s", "ttt1s_hot2500"],
    "feature_ablation_48": ["large_draft_kdtv", "large_feature_draft"],
}


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_target_aware_ablation_tables_are_the_results_files(name):
    """Each row's c, alphas, tokens per call and speedups in results/README.md are those of
    the ablation's ablation.json."""
    readme = open(RESULTS_README, encoding="utf-8").read()
    with open(os.path.join(REPO, "results", "large", "target_aware", name, "ablation.json")) as f:
        rows = json.load(f)["rows"]
    assert [r["draft"] for r in rows] == ABLATIONS[name]
    for row in rows:
        t0, t1 = row["t0"], row["t1"]
        cells = (f"| {row['c']:.3f} | {t0['alpha_forced']['alpha']:.3f} / {t0['alpha']:.3f} | "
                 f"{t1['alpha_forced']['alpha']:.3f} / {t1['alpha']:.3f} | ")
        tail = (f"{t0['tokens_per_target_call']:.2f} / {t1['tokens_per_target_call']:.2f} | "
                f"{t0['speedup']:.2f}x / {t1['speedup']:.2f}x |")
        assert cells in readme and tail in readme.split(cells, 1)[1].splitlines()[0], \
            f"results/README.md's {name} table lacks {cells}...{tail}"


@pytest.mark.parametrize("pair,tables", [("large", 2), ("code", 1)])
def test_alpha_by_confidence_tables_are_the_results_files(pair, tables):
    """docs/target_aware_drafts.md shows the rows of the committed alpha_by_confidence.md's
    tables (the drafts' bins; for the EN->DE pair the target's mean top p as well)."""
    doc = open(os.path.join(REPO, "docs", "target_aware_drafts.md"), encoding="utf-8").read()
    path = os.path.join(REPO, "results", pair, *(["target_aware"] if pair == "large" else []),
                        "alpha_by_confidence", "alpha_by_confidence.md")
    blocks = [[line for line in block.splitlines() if line.startswith("| ")][1:]  # no heading
              for block in open(path, encoding="utf-8").read().split("\n\n")
              if block.startswith("| ")]
    rows = [row for block in blocks[:tables] for row in block if not row.startswith("|---")]
    assert len(blocks) == 2 and rows and all(row in doc for row in rows), [
        row for row in rows if row not in doc]


@pytest.mark.parametrize("run", ["large_slow_memory", "large_fast_memory"])
def test_kernel_layout_table_is_the_results_file(run):
    """docs/limits.md's kernel layout tables (a slow-memory host, a faster one) show the
    committed kernel_layout.json's costs and speedups."""
    doc = open(os.path.join(REPO, "docs", "limits.md"), encoding="utf-8").read()
    with open(os.path.join(REPO, "results", "limits", "kernel_layout", run, "kernel_layout.json")) as f:
        report = json.load(f)
    gammas = list(report["rows"][0]["gammas"])
    for layout, label in (("t5x", "T5X `[in, out]`"), ("transposed", "`[out, in]`")):
        verify = " / ".join(f"{report['costs'][layout]['verify_cost'][g]:.2f}" for g in gammas)
        speeds = [" / ".join(f"{row['gammas'][g][layout]['speedup']:.2f}x" for g in gammas)
                  for row in report["rows"]]
        line = f"| {label} | {verify} | " + " | ".join(speeds) + " |"
        assert line in doc, line


def test_readme_headline_rows_are_the_demo_files():
    """Every row of the README's headline table shows the demo JSON it links: its draft,
    temperature, speedup (over the same layout's baseline and over the faster of the two), gamma,
    alpha, tokens per target call and both predictions."""
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    headline = readme.split("## Headline", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in headline.splitlines() if line.startswith("| large_")]
    assert len(rows) == 4, headline
    for line in rows:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        path = cells[-1].split("](", 1)[1].rstrip(")")
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            report = json.load(f)
        assert cells[0].split()[0] == report["draft"], line
        row = next(r for r in report["rows"] if r["temperature"] == float(cells[1]))
        expected = [f"{row['speedup']:.2f}x", f"{row['speedup_over_fastest_baseline']:.2f}x",
                    str(row["gamma"]), f"{row['alpha']:.2f}",
                    f"{row['tokens_per_target_call']:.2f}", f"{row['predicted_speedup']:.2f}x",
                    f"{row['predicted_speedup_loop']:.2f}x"]
        assert cells[2:9] == expected, (line, expected)
