"""speculative/runs/alpha.py and scripts/measure_alpha.py: bad configs raise, and an identical
draft measures alpha 1."""

import json
import os
import subprocess
import sys

import pytest

from speculative.models import t5
from speculative.runs import alpha as alpha_lib
from tests.helpers import REPO
from tests.helpers.runs import BENCH_TINY, L_IN, N, bench_cfg

pytestmark = pytest.mark.usefixtures("clean_gin")

SETTING_KEYS = {"sampling", "num_tokens", "num_sequences", "mean_sequence_length", "alpha",
                "se_naive", "se_cluster", "se_batch_means", "batch_length",
                "lag1_autocorrelation", "effective_sample_size", "histogram"}


def test_bad_alpha_config_raises(tmp_path):
    with pytest.raises(ValueError, match="num_tokens holds 0"):
        alpha_lib.run(target_model=bench_cfg(), draft_model=bench_cfg(), output_dir=str(tmp_path),
                      num_tokens=0)
    with pytest.raises(TypeError, match="draft_model='small'"):
        alpha_lib.run(target_model=bench_cfg(), draft_model="small", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="draft vocab_size=32 differ"):
        alpha_lib.run(target_model=bench_cfg(), output_dir=str(tmp_path),
                      draft_model=t5.T5Config(**{**BENCH_TINY, "vocab_size": 32}))


def _script(name, *args, timeout=120):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, os.path.join(REPO, "scripts", name), *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


@pytest.mark.slow  # ~12 s; the benchmark CLI test covers the gin path in CI
def test_measure_alpha_cli_identical_draft_is_one(tmp_path, bench_gin):
    """The script end to end (gin file + --gin.X flags); a draft equal to the target: alpha = 1."""
    out = tmp_path / "cli"
    result = _script(
        "measure_alpha.py", f"--gin_file={bench_gin}", "--gin_file=configs/runs/measure_alpha.gin",
        "--gin.TARGET_MODEL=@tiny/t5.T5Config()", "--gin.DRAFT_MODEL=@tiny/t5.T5Config()",
        "--gin.TARGET_CHECKPOINT=None", "--gin.DRAFT_CHECKPOINT=None",
        "--gin.alpha.run.draft_seed=0",
        f"--gin.OUTPUT_DIR='{out}'", "--gin.TEMPERATURES=[0.0, 1.0]", "--gin.NUM_TOKENS=100",
        "--gin.BATCH_SIZE=4", f"--gin.MAX_DECODE_LEN={N}", f"--gin.INPUT_LENGTH={L_IN}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "alpha" in result.stdout and "se_seq" in result.stdout  # the printed table
    data = json.loads((out / "alpha.json").read_text())
    assert data["schema"] == "speculative.alpha/1"
    assert {"config", "environment", "settings"} <= set(data)
    assert "alpha.AlphaSettings.num_tokens = %NUM_TOKENS" in (out / "config.gin").read_text()
    greedy, sampled = data["settings"]
    for s in (greedy, sampled):
        assert SETTING_KEYS <= set(s)
        assert s["num_tokens"] == 100
        assert len(s["histogram"]["counts"]) == 20 and sum(s["histogram"]["counts"]) == 100
    assert greedy["sampling"]["temperature"] == 0.0 and greedy["alpha"] == 1.0
    assert greedy["lag1_autocorrelation"] is None  # beta is constant
    assert sampled["alpha"] == pytest.approx(1.0, abs=1e-5)
