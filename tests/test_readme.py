"""The README's commands run as written: every code block marked `<!-- runnable -->` in the
README, docs/extending.md and docs/target_aware_drafts.md is run.

A marker may carry extra arguments for the test, `<!-- runnable: --gin.NUM_EXAMPLES=2 -->`,
appended to the block's command so that it runs on tiny settings; `out/` in a command becomes a
fresh temporary directory. `<!-- runnable slow: ... -->` runs only with `pytest -m slow`. The
set-up commands are not marked: CI runs them (`.ci/run`).
"""

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

MARKED = re.compile(r"<!-- runnable(?P<slow> slow)?(?:: (?P<extra>.*?))? -->\n```(?P<lang>\w+)\n"
                    r"(?P<code>.*?)```", re.S)


def runnable_blocks(text: str):
    """[(language, code, extra arguments)] of the marked blocks, in order."""
    return [(m["lang"], m["code"], m["extra"] or "") for m in MARKED.finditer(text)]


def _slow(document: str) -> list:
    """Whether each marked block of `document` is marked `runnable slow` (run by -m slow)."""
    with open(os.path.join(REPO, document), encoding="utf-8") as f:
        return [bool(m["slow"]) for m in MARKED.finditer(f.read())]


DOCUMENTS = ("README.md", os.path.join("docs", "extending.md"),
             os.path.join("docs", "target_aware_drafts.md"))
EXPECTED = {"README.md": ["python", "bash", "bash"],
            os.path.join("docs", "extending.md"): ["python", "python"],
            os.path.join("docs", "target_aware_drafts.md"): ["python"]}


def _blocks(document):
    with open(os.path.join(REPO, document), encoding="utf-8") as f:
        return runnable_blocks(f.read())


@pytest.mark.parametrize("document", DOCUMENTS)
def test_markers_are_found_and_well_formed(document):
    blocks = _blocks(document)
    assert [lang for lang, _, _ in blocks] == EXPECTED[document]
    # A marker that does not sit right above a fence would silently skip its block.
    with open(os.path.join(REPO, document), encoding="utf-8") as f:
        assert f.read().count("<!-- runnable") == len(blocks)
    assert runnable_blocks("<!-- runnable: --x=1 -->\n```bash\necho hi\n```\n") == [
        ("bash", "echo hi\n", "--x=1")]


@pytest.mark.parametrize("document,index", [
    pytest.param(d, i, marks=pytest.mark.slow) if _slow(d)[i] else (d, i)
    for d in DOCUMENTS for i in range(len(EXPECTED[d]))])
def test_block_runs_as_written(document, index, tmp_path):
    lang, code, extra = _blocks(document)[index]
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if lang == "python":
        cmd = [sys.executable, "-c", code]
    else:
        command = re.sub(r'(?<=["=])out/', f"{tmp_path}/out/", code.strip())
        assert command.startswith("python scripts/"), "examples start one way"
        cmd = ["bash", "-c", f"{command} {extra}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if document == "README.md" and lang == "python":  # translations, then alpha, tokens/call
        alpha, per_call = map(float, proc.stdout.strip().splitlines()[-1].split())
        assert 0 < alpha <= 1 and 1 <= per_call <= 6
    elif lang == "bash":  # each script wrote its results into the fresh directory
        assert os.listdir(tmp_path / "out")
