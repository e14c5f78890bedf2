"""Document checks: the tables the README and results/README.md show are what the committed
results files give; every results file records how it was made and is indexed; docs/ is
reference, not a diary, and within its size; every relative link in every Markdown file
resolves. These check committed files against each other; they do not test code."""

import json
import os
import re
import subprocess
import sys

import pytest

from speculative.data import bundles
from speculative.experiments import mini_results
from tests.helpers import REPO

RESULTS_README = os.path.join(REPO, "results", "README.md")
BEAM = os.path.join(REPO, "results", "beam")


def _written():
    """(results, directory) of every bundled target whose results are written."""
    return [(mini_results.load_results(os.path.join(REPO, mini_results.RESULT_DIRS[t])),
             mini_results.RESULT_DIRS[t]) for t in bundles.targets()
            if os.path.exists(os.path.join(REPO, mini_results.RESULT_DIRS[t], "results.json"))]


def test_results_readme_links_every_pairs_tables():
    """results/README.md links each written pair's Tables 2, 3 and 4 (the files
    test_mini.py checks against their results.json) instead of copying them."""
    readme = open(RESULTS_README, encoding="utf-8").read()
    written = _written()
    assert written, "no results written"
    for _, directory in written:
        for name in ("table2.md", "table3.md", "table4.md"):
            link = os.path.relpath(os.path.join(directory, name), "results")
            assert f"]({link})" in readme, f"results/README.md does not link {link}"


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
    assert len(text.encode("utf-8")) <= 13_000
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


def _results_jsons():
    """Every committed results JSON (relative paths), except partial stages."""
    out = []
    for root, _, names in os.walk(os.path.join(REPO, "results")):
        out += [os.path.relpath(os.path.join(root, n), REPO) for n in names
                if n.endswith(".json") and ".partial" not in n]
    return sorted(out)


def _index():
    with open(os.path.join(REPO, "results", "runs.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _provenance(path: str) -> dict:
    """A results JSON's `provenance` (`host.provenance()`: commit, command, date, host)."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return json.load(f).get("provenance") or {}


def test_every_results_json_records_commit_command_date_and_host():
    paths = _results_jsons()
    assert len(paths) >= 30, paths
    for path in paths:
        report = _provenance(path)
        missing = [k for k in ("commit", "command", "date", "host") if not report.get(k)]
        assert not missing, f"{path} lacks {missing}"
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", report["commit"]), path
        assert report["command"].startswith(("python ", "bash ")), path
        assert re.match(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}", report["date"]), path
        assert {"cpu_model", "last_level_cache_bytes", "cores", "load"} <= set(report["host"])


def test_runs_index_covers_every_results_json_once_with_its_provenance():
    records = _index()
    ids = [r["run_id"] for r in records]
    assert len(ids) == len(set(ids)), "run ids repeat"
    latest = {r["path"]: r for r in records}
    assert set(latest) == set(_results_jsons()), set(latest) ^ set(_results_jsons())
    for path, record in latest.items():
        report = _provenance(path)
        for key in ("commit", "command", "date"):
            assert record[key] == report[key], (path, key)
        assert re.fullmatch(r"[a-z_]+-\S+-\d{8}-\d{6}(-\d+)?", record["run_id"]), record["run_id"]
        assert record["headline"], f"{path}: no headline numbers in the index"


def test_results_large_and_results_readme_stay_small():
    assert len(os.listdir(os.path.join(REPO, "results", "large"))) <= 12
    assert os.path.getsize(RESULTS_README) <= 12 * 1024
    notebook = os.path.join(REPO, "results", "NOTEBOOK.md")
    assert not os.path.exists(notebook) or os.path.getsize(notebook) <= 25 * 1024


def test_results_readme_opens_with_the_current_numbers_and_their_commands():
    """A reader finds each current number, its run id and its command at the top."""
    text = open(RESULTS_README, encoding="utf-8").read()
    first_section = text.split("\n## ", 2)[1]
    assert first_section.startswith("Current numbers")
    rows = [line for line in first_section.splitlines() if line.startswith("| ")][2:]
    assert len(rows) >= 5
    ids = {r["run_id"] for r in _index()}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        run_id = re.match(r"\[([^\]]+)\]", cells[-2]).group(1)
        assert run_id in ids, row
        assert cells[-1].startswith("`python ") or cells[-1].startswith("`bash "), row


DOCS = os.path.join(REPO, "docs")
OTHERS_DOCS = {"design.md", "extending.md", "when_things_go_wrong.md"}
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bUTC\b|\b(January|February|March|April|May|June|"
                   r"July|August|September|October|November|December|Jan|Feb|Mar|Apr|Jun|Jul|"
                   r"Aug|Sep|Sept|Oct|Nov|Dec)\.? (\d{1,2}, )?20\d\d\b|\bsessions?\b|"
                   r"\bearlier runs? (gave|showed|measured|took|had|was|were|of|on|that)\b|"
                   r"\bin (an|the) earlier runs?\b", re.I)


def test_dated_line_pattern():
    for line in ("on 2026-12-04 it gave", "before 19:17 UTC", "in November 2026",
                 "Dec 4, 2026", "the first session", "an earlier run gave"):
        assert DATED.search(line), line
    for line in ("Theorem 3.8", "γ 7 on 2 CPU cores", "a session_id field", "runs earlier",
                 "refuses to overwrite an earlier run unless asked"):
        assert not DATED.search(line), line


def _docs():
    return sorted(n for n in os.listdir(DOCS) if n.endswith(".md"))


def test_docs_fit_their_budget():
    """docs/ in all <= 55 KiB; the reference docs other than design, extending and
    when_things_go_wrong (kept by others) <= 34 KiB of it (the glossary earned 3 KiB, Table 2's
    second task, summarization.md, 7)."""
    sizes = {n: os.path.getsize(os.path.join(DOCS, n)) for n in _docs()}
    assert sum(v for n, v in sizes.items() if n not in OTHERS_DOCS) <= 34 * 1024, sizes
    assert sum(sizes.values()) <= 55 * 1024, sizes


def test_docs_are_reference_not_a_diary():
    """Each doc opens with a title, and no line is dated or tells the history of runs."""
    dated = []
    for name in _docs():
        with open(os.path.join(DOCS, name), encoding="utf-8") as f:
            lines = f.read().splitlines()
        assert lines[0].startswith("# "), f"docs/{name} does not open with a title"
        dated += [f"docs/{name}:{i + 1}: {line}" for i, line in enumerate(lines)
                  if DATED.search(line)]
    assert not dated, "\n".join(dated)


def test_docs_say_who_they_are_for():
    for name in sorted(os.listdir(DOCS)):
        if name.endswith(".md") and name not in OTHERS_DOCS:
            opening = open(os.path.join(DOCS, name), encoding="utf-8").read().split("\n## ")[0]
            assert "For anyone" in opening, f"docs/{name} does not say who should read it"


def test_readme_gives_a_reading_order_of_every_doc():
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    order = readme.split("Read the docs in this order:", 1)[1].split("\n\n", 2)[1]
    for name in os.listdir(DOCS):
        if name.endswith(".md"):
            assert f"(docs/{name})" in order, f"the reading order misses docs/{name}"


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _anchors(text: str) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", m.strip().lower()).replace(" ", "-")
            for m in re.findall(r"^#+\s+(.*)$", text, flags=re.M)}


def _markdown_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"], cwd=REPO,
                         capture_output=True, text=True, check=False).stdout.split()
    if not out:  # not a git checkout: walk the tree
        for root, dirs, names in os.walk(REPO):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "node_modules"]
            out += [os.path.relpath(os.path.join(root, n), REPO) for n in names
                    if n.endswith(".md")]
    return sorted(p for p in out if os.path.exists(os.path.join(REPO, p)))


def broken_links(path: str) -> list:
    """The relative links of one Markdown file (outside code blocks) whose file, or whose
    #anchor in a Markdown file, does not exist."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, flags=re.I):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        full = (os.path.normpath(os.path.join(REPO, os.path.dirname(path), file_part))
                if file_part else os.path.join(REPO, path))
        if not os.path.exists(full):
            bad.append(target)
        elif anchor and full.endswith(".md"):
            with open(full, encoding="utf-8") as f:
                if anchor.lower() not in _anchors(f.read()):
                    bad.append(target)
    return bad


def test_link_checker_finds_broken_files_and_anchors(tmp_path, monkeypatch):
    (tmp_path / "a.md").write_text("# Top\n## Two words, here\n[ok](#two-words-here) "
                                   "[file](b.md) [gone](c.md) [bad](#nowhere) [web](https://x)\n"
                                   "```\n[in code](missing.md)\n```\n")
    (tmp_path / "b.md").write_text("# B\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    assert broken_links("a.md") == ["c.md", "#nowhere"]


def test_every_relative_link_in_every_markdown_file_resolves():
    files = _markdown_files()
    assert "README.md" in files and len(files) >= 20
    bad = {path: links for path in files if (links := broken_links(path))}
    assert not bad, bad
