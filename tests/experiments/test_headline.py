"""scripts/headline.py: the README's headline table, results/README.md's current numbers and
docs/limits.md's host table are made from the canonical results and results/runs.jsonl, and
the committed documents agree with them."""

import os
import shutil
import subprocess
import sys

import pytest

from speculative.experiments import headline
from tests.helpers import REPO


def test_committed_documents_agree_with_the_results():
    assert headline.stale(REPO) == [], "run: python scripts/headline.py --write"


def test_headline_rows_come_from_the_demo_files_with_their_run_ids():
    table = headline.headline_table(REPO)
    runs = headline.load_runs(REPO)
    rows = table.splitlines()[2:]
    assert len(rows) == 4  # two drafts at T = 0 and T = 1
    for path in headline.HEADLINE_RUNS:
        assert sum(f"[{runs[path]['run_id']}]({path})" in row for row in rows) == 2


def test_current_numbers_name_each_run_and_its_command():
    table = headline.current_table(REPO)
    runs = headline.load_runs(REPO)
    for path, what in headline.CURRENT_RUNS:
        row = next(line for line in table.splitlines() if line.startswith(f"| {what} |"))
        assert runs[path]["run_id"] in row and f"`{runs[path]['command']}`" in row


def test_replace_block():
    text = "a\n<!-- t:start -->\nold\n<!-- t:end -->\nb\n"
    assert headline.replace_block(text, "t", "new\n") == (
        "a\n<!-- t:start -->\nnew\n<!-- t:end -->\nb\n")
    with pytest.raises(ValueError, match="markers"):
        headline.replace_block("no markers", "t", "x\n")


def test_a_changed_number_is_caught_and_rewritten(tmp_path):
    shutil.copytree(os.path.join(REPO, "results"), tmp_path / "results")
    os.makedirs(tmp_path / "docs")
    for name in headline.DOCUMENTS.values():
        shutil.copy(os.path.join(REPO, name), tmp_path / name)
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    row = headline.headline_table(REPO).splitlines()[2]
    assert row in readme
    (tmp_path / "README.md").write_text(readme.replace(row, row.replace("| 7 |", "| 8 |", 1)),
                                        encoding="utf-8")
    assert headline.stale(str(tmp_path)) == ["README.md"]
    assert headline.write(str(tmp_path)) == ["README.md"]
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == readme
    assert headline.stale(str(tmp_path)) == []


def test_script_check_exits_zero_on_the_committed_documents():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "headline.py"),
                           "--check"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "agree" in proc.stdout
