"""The README's commands run as written: every code block marked `<!-- runnable -->` is run.

A marker may carry extra arguments for the test, `<!-- runnable: --gin.NUM_EXAMPLES=2 -->`,
appended to the block's command so that it runs on tiny settings; `out/` in a command becomes a
fresh temporary directory. The set-up commands are not marked: CI runs them (`.ci/run`).
"""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKED = re.compile(r"<!-- runnable(?:: (?P<extra>.*?))? -->\n```(?P<lang>\w+)\n(?P<code>.*?)```",
                    re.S)


def runnable_blocks(text: str):
    """[(language, code, extra arguments)] of the marked blocks, in order."""
    return [(m["lang"], m["code"], m["extra"] or "") for m in MARKED.finditer(text)]


def _readme_blocks():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        return runnable_blocks(f.read())


def test_markers_are_found_and_well_formed():
    blocks = _readme_blocks()
    assert [lang for lang, _, _ in blocks] == ["python", "bash", "bash"]
    # A marker that does not sit right above a fence would silently skip its block.
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        assert f.read().count("<!-- runnable") == len(blocks)
    assert runnable_blocks("<!-- runnable: --x=1 -->\n```bash\necho hi\n```\n") == [
        ("bash", "echo hi\n", "--x=1")]


@pytest.mark.parametrize("index", range(len(_readme_blocks())))
def test_readme_block_runs_as_written(index, tmp_path):
    lang, code, extra = _readme_blocks()[index]
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if lang == "python":
        cmd = [sys.executable, "-c", code]
    else:
        command = re.sub(r'(?<=["=])out/', f"{tmp_path}/out/", code.strip())
        assert command.startswith("python scripts/"), "README examples start one way"
        cmd = ["bash", "-c", f"{command} {extra}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if lang == "python":  # the snippet prints the translations, then alpha and tokens per call
        alpha, per_call = map(float, proc.stdout.strip().splitlines()[-1].split())
        assert 0 < alpha <= 1 and 1 <= per_call <= 6
    else:  # each script wrote its results into the fresh directory
        assert os.listdir(tmp_path / "out")
