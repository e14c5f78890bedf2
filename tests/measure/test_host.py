"""speculative/measure/host.py: step bytes by hand, CPU facts and cache regimes, bandwidth,
load averages and the git commit of a run."""

import os
import subprocess

import pytest

from speculative.measure import host
from speculative.models import t5
from speculative.runs import mini
from tests.helpers import tiny_config
from tests.helpers.host import needs_bundle, random_model, tiny_bytes


@pytest.mark.parametrize("tied", [False, True])
def test_step_bytes_by_hand(tied):
    config = tiny_config(logits_via_embedding=tied)
    params = t5.param_shapes(t5.Transformer(config))
    got = host.step_bytes(config, params, batch_size=3, position=5, encoder_length=7)
    assert got["total"] == tiny_bytes(tied, 3, 5, 7)
    assert got["self_kv"] == 4 * 2 * 2 * 3 * 16 * 5 and got["cross_kv"] == 4 * 2 * 2 * 3 * 16 * 7
    assert got["total"] == sum(v for k, v in got.items() if k != "total")
    # Real arrays count like their shapes; the KV terms match the decode loop's memory check.
    model = random_model(config)
    assert host.step_bytes(config, model.params, batch_size=3, position=5,
                             encoder_length=7) == got
    assert got["self_kv"] == model.cache_bytes(3, 5)


@needs_bundle
def test_step_bytes_large_target_weights():
    """large_target (E 512, 8 x 64 heads, MLP 2048, 6 decoder layers, 32 buckets, tied vocab
    4000): the ~122 MB of weights a generated token reads (configs/models/large_target.gin)."""
    config = mini.config(mini.LARGE_TARGET)
    got = host.step_bytes(config, t5.param_shapes(t5.Transformer(config)), batch_size=1,
                            position=0, encoder_length=0)
    per_layer = 4 * 512 * 512 + 2 * 512 * 512 + 3 * 512 * 2048 + 3 * 512
    assert got["decoder_weights"] == 4 * (6 * per_layer + 32 * 8 + 512)
    assert got["output_layer"] == 4 * 4000 * 512
    assert got["decoder_weights"] + got["output_layer"] == pytest.approx(122e6, rel=0.01)


def test_cpu_facts_and_cache_regime(tmp_path):
    """The CPU's caches come from sysfs (instruction caches skipped, sizes in bytes); a target
    is memory-bound when its weights are >= 3x the last-level cache, unknown without sizes."""

    for index, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                                 ("2", "Unified", "2048K"),
                                                 ("3", "Unified", "266240K")]):
        folder = tmp_path / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        for name, value in [("level", level), ("type", kind), ("size", size + "\n")]:
            (folder / name).write_text(value)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nflags\t: avx\n")
    facts = host.cpu_facts(str(tmp_path / "cache"), str(cpuinfo))
    assert facts == {"model": "Some CPU @ 2.0GHz",
                     "cache_bytes": {"L1": 48 << 10, "L2": 2 << 20, "L3": 260 << 20}}
    assert host.cpu_facts(str(tmp_path / "none"), str(tmp_path / "none")) == {
        "model": None, "cache_bytes": {}}
    big_cache = host.cache_regime(122e6, facts["cache_bytes"])
    assert big_cache["memory_bound"] is False and big_cache["last_level_cache_bytes"] == 260 << 20
    assert big_cache["weights_over_cache"] == pytest.approx(122e6 / (260 << 20))
    assert host.cache_regime(122e6, {"L2": 1 << 20, "L3": 32 << 20})["memory_bound"] is True
    assert host.cache_regime(122e6, {})["memory_bound"] is None


def test_measure_bandwidth_small():
    bw = host.measure_bandwidth(1 << 20, repeats=2)
    assert bw["bytes"] == 1 << 20
    assert bw["gb_per_s"] > 0 and bw["gb_per_s_best"] >= bw["gb_per_s"]


def test_load_average_reads_before_at_start_and_after_at_record(monkeypatch):
    loads = iter([(0.4, 0.0, 0.0), (1.7, 0.0, 0.0)])
    monkeypatch.setattr(host.os, "getloadavg", lambda: next(loads))
    load = host.LoadAverage()
    assert load.before == 0.4
    assert load.record() == {"before": 0.4, "after": 1.7}


# ----------------------------------------------------------------------------------------------
# From tests/test_provenance.py.
def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


def test_git_commit_clean_dirty_and_outside_git(tmp_path):
    try:
        _git(tmp_path, "init", "-q")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("git is not available")
    (tmp_path / "a.txt").write_text("one")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "one")
    sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert host.git_commit(str(tmp_path)) == sha
    assert host.provenance("x", repo_dir=str(tmp_path))["commit"] == sha
    (tmp_path / "a.txt").write_text("two")
    assert host.git_commit(str(tmp_path)) == sha + "-dirty"
    assert host.provenance("x", repo_dir=str(tmp_path))["commit"] == sha + "-dirty"
    lone = tmp_path.parent / (tmp_path.name + "_nogit")  # beside the repository, not in it
    lone.mkdir()
    assert host.git_commit(str(lone)) is None
