"""speculative/runs/calibration_cache.py: a GAMMA 'auto' choice is stored per (host, models,
batch size, lengths, sampling), found again only under the same key, and a rerun takes it
without timing; the closing summary says so (infer_choice.decision). Choices made because the
run was short are not stored."""

import dataclasses
import json
import os

import pytest

from speculative.decode.kernel import SamplingConfig
from speculative.measure import prior as prior_lib
from speculative.measure import speculation
from speculative.runs import calibration_cache as cache
from speculative.runs import config as config_lib
from speculative.runs import infer, infer_choice, infer_models
from tests.helpers.runs import INFER_GIN, infer_bindings

pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "calibration"))
    return tmp_path / "calibration"


@pytest.fixture
def settings(tiny_gin):
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(None))
    return infer.infer(dry_run=True, gamma="auto")


def _candidate(kind, gamma, speedup):
    return speculation.SpeculationCandidate(kind=kind, gamma=gamma, tree=None, seconds=1.0,
                                            first_call_s=2.0, tokens=10, speedup=speedup,
                                            tokens_per_target_call=2.0 if gamma else 1.0)


def _gate(pays=True, fits=True, opened=True):
    return speculation.SpeculationGate(alpha=0.8, gamma=2, step_s=0.01, verify_cost=1.1,
                                       remaining_s=3.0, compile_s=1.0, max_bound=2.0,
                                       steps=10, rounds=4.0, bound=2.0, open=opened,
                                       seconds=0.1, pays=pays, fits=fits)


def _choice(gate, candidates, prior=None):
    return speculation.SpeculationChoice(best=candidates[-1], candidates=tuple(candidates),
                                         batch_size=1, batches=1, repeats=1, seconds=1.5,
                                         results=(object(),), gate=gate, prior=prior)


def _decide(settings, batches):
    """GAMMA 'auto''s choice as infer.run makes it: the cached one, else a new one."""
    cached = infer_choice.cached_choice(settings, len(batches))
    return infer_choice.choose(settings, None, None, batches, cached)


def test_a_choice_is_found_only_under_its_own_key(settings, cache_dir):
    key = cache.calibration_key(settings)
    assert cache.load(key) is None
    path = cache.store(key, {"mode": "speculative", "gamma": 4})
    assert os.path.dirname(path) == str(cache_dir)
    assert cache.load(key) == {"mode": "speculative", "gamma": 4, "cache_file": path}
    for changed in (dict(batch_size=settings.batch_size * 2),
                    dict(sampling=SamplingConfig(temperature=1.0)),
                    dict(task_feature_lengths={"inputs": settings.input_length + 1,
                                               "targets": settings.max_decode_len})):
        other = cache.calibration_key(infer.infer(settings, dry_run=True, **changed))
        assert other != key and cache.load(other) is None, changed
    with open(path, encoding="utf-8") as f:  # a file whose key differs is not taken
        stored = json.load(f)
    stored["key"]["batch_size"] = 99
    with open(path, "w", encoding="utf-8") as f:
        json.dump(stored, f)
    assert cache.load(key) is None


def test_the_cache_turns_off_and_a_retrained_checkpoint_is_a_new_key(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, "0")
    assert cache.cache_dir() is None and cache.store({"a": 1}, {}) is None
    assert cache.load({"a": 1}) is None
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "params").write_bytes(b"1234")
    before = cache.files_signature(str(ckpt))
    (ckpt / "params").write_bytes(b"12345")
    after = cache.files_signature(str(ckpt))
    assert before["files"] == after["files"] == 1 and before["digest"] != after["digest"]
    assert cache.files_signature(None) is None


def test_a_changed_decode_source_is_a_new_key(settings, tmp_path, monkeypatch):
    """The key holds a digest of the decode/beam/models/measure sources: edit one, new key."""
    key = cache.calibration_key(settings)
    assert key["code"] == cache.code_digest() and len(key["code"]) == 16
    package = tmp_path / "speculative"
    for folder in cache.CODE_DIRS:
        (package / folder).mkdir(parents=True)
        (package / folder / "a.py").write_text("x = 1\n")
    (package / "runs").mkdir()
    fake = package / "runs" / "calibration_cache.py"
    monkeypatch.setattr(cache, "__file__", str(fake))
    cache.code_digest.cache_clear()
    try:
        first = cache.code_digest()
        (package / "runs" / "other.py").write_text("y = 2\n")  # outside CODE_DIRS: same key
        cache.code_digest.cache_clear()
        assert cache.code_digest() == first
        (package / "decode" / "a.py").write_text("x = 2\n")
        cache.code_digest.cache_clear()
        assert cache.code_digest() != first
    finally:
        monkeypatch.undo()
        cache.code_digest.cache_clear()
    assert cache.calibration_key(settings) == key


def test_only_choices_that_hold_for_any_run_length_are_cacheable():
    base, chain = _candidate("baseline", None, 1.0), _candidate("chain", 4, 1.6)
    prior = prior_lib.SpeculationPrior(alpha=0.8, c=0.1, verify_cost=1.0, gamma=4,
                                         predicted=1.9, measured=1.6, kept=True, seconds=1.0)
    assert cache.cacheable(_choice(_gate(), [base, chain]))  # timed
    assert cache.cacheable(_choice(_gate(fits=False, opened=False), [base, chain], prior))
    assert cache.cacheable(_choice(_gate(opened=False), [base]))  # the bound closed the gate
    assert not cache.cacheable(_choice(_gate(pays=False, opened=False), [base]))  # short run
    assert not cache.cacheable(_choice(_gate(fits=False, opened=False), [base]))
    assert not cache.cacheable(_choice(None, [base]))


def test_a_rerun_takes_the_stored_choice_without_timing(settings, cache_dir, monkeypatch):
    base, chain = _candidate("baseline", None, 1.0), _candidate("chain", 4, 1.6)
    timed = []
    monkeypatch.setattr(infer_choice.speculation, "choose_speculation",
                        lambda *a, **k: timed.append(1) or _choice(_gate(), [base, chain]))
    batches = [(list(range(4)), [0])]
    first = _decide(settings, batches)
    assert timed == [1] and first.speculative and first.gamma == 4 and first.reused
    assert "chain gamma 4 (1.60x)" == infer_choice.decision(settings, first)["choice"]
    assert len(os.listdir(cache_dir)) == 1
    again = _decide(settings, batches)
    assert timed == [1]  # nothing timed
    assert (again.mode, again.gamma, again.kind) == (first.mode, first.gamma, first.kind)
    assert again.calibration_seconds == 0.0 and again.reused == ()
    said = infer_choice.decision(settings, again)
    assert said["choice"] == "chain gamma 4 (1.60x)"
    assert said["reason"].startswith("calibrated before on this host (" + str(cache_dir))
    assert first.speculation["line"] in said["reason"]


def test_a_short_runs_baseline_holds_for_reruns_no_longer_than_it(settings, cache_dir,
                                                                    monkeypatch):
    """'The run cannot repay a compile' is kept with the run's length: a rerun of the same or a
    shorter run takes it without timing; a longer run decides again."""
    base = _candidate("baseline", None, 1.0)
    timed = []
    monkeypatch.setattr(infer_choice.speculation, "choose_speculation",
                        lambda *a, **k: timed.append(1)
                        or _choice(_gate(pays=False, opened=False), [base]))
    batch = (list(range(4)), [0])
    plan = _decide(settings, [batch] * 3)
    assert timed == [1] and not plan.speculative
    said = infer_choice.decision(settings, plan)
    assert said["choice"] == "the baseline (no speculation)"
    assert "could save at most" in said["reason"]
    key = cache.calibration_key(settings)
    assert cache.load(key) is None  # not a choice for runs of any length
    assert cache.load_short(key, 3)["run_batches"] == 3
    for batches, timed_again in ((3, 0), (2, 0), (4, 1)):
        timed.clear()
        again = _decide(settings, [batch] * batches)
        assert not again.speculative and len(timed) == timed_again, batches
    # The longer run (4 batches, decided again: short too) now covers runs of up to 4.
    assert cache.load_short(key, 4)["run_batches"] == 4


def test_what_counts_as_a_short_runs_choice():
    base, chain = _candidate("baseline", None, 1.0), _candidate("chain", 4, 1.6)
    prior = prior_lib.SpeculationPrior(alpha=0.8, c=0.1, verify_cost=1.0, gamma=4,
                                         predicted=1.9, measured=1.6, kept=True, seconds=1.0)
    assert cache.short_run(_choice(_gate(pays=False, opened=False), [base]))  # payback
    assert cache.short_run(_choice(_gate(fits=False, opened=False), [base]))  # budget
    assert not cache.short_run(_choice(_gate(opened=False), [base]))  # the bound: any length
    assert not cache.short_run(_choice(_gate(fits=False, opened=False), [base, chain], prior))
    assert not cache.short_run(_choice(_gate(), [base, chain]))
    assert not cache.short_run(_choice(None, [base]))


def test_a_rerun_whose_cached_choice_is_the_baseline_loads_no_draft(tiny_gin, tmp_path,
                                                                     cache_dir, monkeypatch):
    """The cached choice is read before the models load: a baseline needs no draft, so the
    rerun never loads it, and decodes what the first run did."""
    base = _candidate("baseline", None, 1.0)
    short = dataclasses.replace(_choice(_gate(pays=False, opened=False), [base]), results=(),
                                batches=0)  # nothing decoded in calibration: the run does all
    monkeypatch.setattr(infer_choice.speculation, "choose_speculation", lambda *a, **k: short)
    runs, loads = [], []
    real = infer_models.load_draft
    monkeypatch.setattr(infer_models, "load_draft", lambda *a, **k: loads.append(1) or real(
        *a, **k))
    for name in ("first", "again"):
        config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(tmp_path / name)
                             + ["infer.infer.progress = False"])
        runs.append(infer.infer(gamma="auto"))
    assert loads == [1]  # the first run only
    assert runs[1].metrics["decision"]["reason"].startswith("calibrated before on this host")
    assert [r["prediction_tokens"] for r in runs[0].records] == \
        [r["prediction_tokens"] for r in runs[1].records]
