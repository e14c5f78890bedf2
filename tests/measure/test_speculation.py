"""GAMMA = 'auto': `speculation.choose_speculation` picks the fastest way of decoding from the
timing engine's numbers, the baseline (no speculation) among them.

The timings are injected (a fake `timer` in place of `costs.interleaved`): these tests pin the
logic (what is timed, what wins, what is recorded), never a machine's speed. Known answers: the
baseline wins when every candidate is slower than it; the fastest speculative candidate wins
otherwise, by ms per generated token; a block draft's block is timed at gammas capped by its
max_gamma; a tree is timed only when speculation paid; `min_speedup` keeps the baseline on a
narrow win; the JSON and the log line say what was timed and why. The gate (stage 0) runs on a
tiny random pair: its bound is Theorem 3.8 of its own measured costs, and where it closes the
baseline's results are the run's and no speculative program is timed.
"""

import json
import types

import jax
import numpy as np
import pytest

from speculative.decode import drafters, tree_drafter
from speculative.decode import loops as decoding
from speculative.decode.kernel import SamplingConfig
from speculative.measure import analysis as theory
from speculative.measure import prior as prior_lib
from speculative.measure import speculation
from speculative.models import t5
from tests.helpers import decoding as td
from tests.helpers import tiny_config

# The stages' logic with injected timings: no gate (the gate decodes for real, tested below).
SEARCH = speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=16,
                                       gate=False)


def _result(tokens_per_row=(8, 6), target_calls=(4, 3)):
    return types.SimpleNamespace(lengths=np.asarray(tokens_per_row),
                                 stats=types.SimpleNamespace(target_calls=np.asarray(target_calls)))


class FakeTimer:
    """`interleaved`'s signature and outputs, with seconds from `seconds[(kind, gamma)]`; the
    programs are never called (no model runs)."""

    def __init__(self, seconds, tokens=None):
        self.seconds, self.tokens, self.calls = seconds, tokens or {}, []

    def __call__(self, programs, repeats):
        self.calls.append(list(programs))
        first = {name: 9.0 for name in programs}  # the compiling first call: never compared
        times = {name: [self.seconds[name[:2]]] * repeats for name in programs}
        outputs = {name: [_result(self.tokens.get(name[:2], (8, 6)))] for name in programs}
        return first, times, outputs


DRAFT = types.SimpleNamespace()  # a chain draft: no drafter methods, no block


def test_the_baseline_wins_when_speculation_is_slower():
    timer = FakeTimer({("baseline", None): 1.0, ("chain", 2): 1.2, ("chain", 4): 1.1,
                       ("chain", 6): 1.3})
    choice = speculation.choose_speculation(None, DRAFT, [np.zeros((2, 4))], SEARCH, timer=timer)
    assert choice.best.kind == "baseline" and not choice.best.speculative
    # The probe (the chain's smallest gamma, its cheapest round) lost: nothing more is timed.
    assert [c.name for c in choice.candidates] == ["baseline", "chain g2"]
    assert choice.candidates[1].speedup == pytest.approx(1.0 / 1.2)
    assert "no speculation (the baseline was fastest)" in choice.line()
    assert len(timer.calls) == 1


def test_the_fastest_chain_wins_by_ms_per_token():
    tree_asked = []
    timer = FakeTimer({("baseline", None): 1.4, ("chain", 2): 1.1, ("chain", 4): 1.0,
                       ("chain", 6): 1.05},
                      # at T > 0 each program generates its own tokens: compared per token
                      tokens={("chain", 6): (10, 10)})
    choice = speculation.choose_speculation(None, DRAFT, [np.zeros((2, 4))], SEARCH, timer=timer,
                                      tree_for=lambda best: tree_asked.append(best) or None)
    best = choice.best
    assert (best.kind, best.gamma) == ("chain", 6)  # 1.05 s for 20 tokens beats 1.0 s for 14
    assert best.speedup == pytest.approx((1.4 / 14) / (1.05 / 20))
    assert best.ms_per_token == pytest.approx(1000 * 1.05 / 20)
    assert tree_asked == [best]  # speculation paid: the tree chooser was asked
    # The probe paid, so the other gammas were timed against the baseline again; the tree
    # chooser named no tree, so nothing more.
    assert [[n[:2] for n in call] for call in timer.calls] == [
        [("baseline", None), ("chain", 2)], [("baseline", None), ("chain", 4), ("chain", 6)]]
    assert [c.stage for c in choice.candidates] == [1, 1, 2, 2, 2]
    line = choice.line()
    assert line.startswith("gamma auto: baseline 100 ms/token, chain g2 78.6, g4 71.4, g6 52.5")
    assert line.endswith(f"-> chain gamma 6 ({best.speedup:.2f}x)")
    assert best.tokens_per_target_call == pytest.approx(20 / 7)


def test_min_speedup_keeps_the_baseline_on_a_narrow_win():
    timer = FakeTimer({("baseline", None): 1.0, ("chain", 2): 0.98, ("chain", 4): 0.99,
                       ("chain", 6): 1.2})
    search = speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=16,
                                           min_speedup=1.05, gate=False)
    assert speculation.choose_speculation(None, DRAFT, [np.zeros((2, 4))], search,
                                    timer=timer).best.kind == "baseline"
    assert speculation.choose_speculation(None, DRAFT, [np.zeros((2, 4))], SEARCH,
                                    timer=timer).best.gamma == 2


def test_a_tree_is_timed_only_when_speculation_paid_and_wins_when_faster():
    seconds = {("baseline", None): 1.0, ("chain", 2): 0.8, ("chain", 4): 0.7,
               ("chain", 6): 0.75, ("tree", 3): 0.5}
    timer = FakeTimer(seconds)
    choice = speculation.choose_speculation(None, DRAFT, [np.zeros((2, 4))], SEARCH, timer=timer,
                                      tree_for=lambda best: (2, 1, 1))
    assert [len(c) for c in timer.calls] == [2, 3, 2]  # probe, gammas, tree: each with the baseline
    assert (choice.best.kind, choice.best.tree, choice.best.gamma) == ("tree", (2, 1, 1), 3)
    assert "-> tree (2, 1, 1)" in choice.line()
    # Speculation lost: no tree is asked for.
    slow = FakeTimer({**seconds, **{("chain", g): 2.0 for g in (2, 4, 6)}})
    choice = speculation.choose_speculation(None, DRAFT, [np.zeros((2, 4))], SEARCH, timer=slow,
                                      tree_for=lambda best: pytest.fail("tree asked"))
    assert choice.best.kind == "baseline" and len(slow.calls) == 1


def test_a_block_draft_times_its_block_beside_the_chain():
    block = types.SimpleNamespace(extend_block=lambda *a, **k: None, reads_target=True,
                                  max_gamma=4)
    assert speculation.speculation_candidates(block, SEARCH) == [
        ("chain", 2), ("chain", 4), ("chain", 6), ("block", 2), ("block", 4)]
    timer = FakeTimer({("baseline", None): 1.0, ("chain", 2): 0.9, ("chain", 4): 0.85,
                       ("chain", 6): 0.95, ("block", 2): 0.8, ("block", 4): 0.6})
    choice = speculation.choose_speculation(None, block, [np.zeros((2, 4))], SEARCH, timer=timer)
    assert [n[:2] for n in timer.calls[0]] == [("baseline", None), ("chain", 2), ("block", 2)]
    assert (choice.best.kind, choice.best.gamma) == ("block", 4)
    line = choice.line()
    assert "chain g2 64.3, g4 60.7, g6 67.9, block g2 57.1, g4 42.9" in line
    assert line.endswith(f"-> block gamma 4 ({1 / 0.6:.2f}x)")
    # The drafters each candidate decodes with: one call per round for the block, the same
    # model as a target-aware chain for 'chain'.
    assert isinstance(speculation.speculation_drafter(block, "block", 4), drafters.BlockDrafter)
    chain = speculation.speculation_drafter(block, "chain", 2)
    assert type(chain) is drafters.TargetAwareDrafter and chain.gamma == 2
    assert type(speculation.speculation_drafter(DRAFT, "chain", 3)) is drafters.ChainDrafter
    tree = speculation.speculation_drafter(DRAFT, "tree", 2, (2, 1))
    assert isinstance(tree, tree_drafter.TreeDrafter)


def test_gammas_beyond_max_decode_len_are_left_out_and_a_drafter_keeps_its_own():
    search = speculation.SpeculationSearch(sampling=SamplingConfig(1.0), max_decode_len=4)
    assert speculation.speculation_candidates(DRAFT, search) == [("chain", 2), ("chain", 4)]
    own = drafters.ChainDrafter(DRAFT, 3)
    assert speculation.speculation_candidates(own, search) == [("chain", 3)]
    with pytest.raises(ValueError, match="at least one calibration batch"):
        speculation.choose_speculation(None, DRAFT, [], search)


def test_the_choice_json_records_every_candidate_and_the_reused_results():
    timer = FakeTimer({("baseline", None): 1.0, ("chain", 2): 0.5, ("chain", 4): 0.6,
                       ("chain", 6): 0.7})
    batches = [np.zeros((2, 4)), np.zeros((2, 4))]
    choice = speculation.choose_speculation(None, DRAFT, batches, SEARCH, timer=timer)
    saved = json.loads(json.dumps(choice.to_json()))
    assert saved["choice"] == "chain g2" and saved["kind"] == "chain" and saved["gamma"] == 2
    assert saved["speedup"] == pytest.approx(2.0) and saved["batch_size"] == 2
    assert saved["calibration_batches"] == 2 and saved["calibration_seconds"] >= 0
    assert [(c["name"], c["stage"]) for c in saved["candidates"]] == [
        ("baseline", 1), ("chain g2", 1), ("baseline", 2), ("chain g4", 2), ("chain g6", 2)]
    assert saved["candidates"][0]["ms_per_token"] == pytest.approx(1000 / 14)
    assert len(choice.results) == 1  # the best program's first-call results (one per call)


@pytest.mark.parametrize("num_batches, batch_size, expected", [
    (972, 1, 8), (24, 1, 3), (16, 64, 1), (3, 2, 1), (100, 3, 3), (1, 1, 1)])
def test_the_calibration_slice_is_about_8_rows_and_at_most_an_eighth_of_the_run(
        num_batches, batch_size, expected):
    assert speculation.calibration_batches(num_batches, batch_size) == expected


@pytest.fixture(scope="module")
def tiny_pair():
    target, draft = td.pair(t5.Transformer(tiny_config()))
    return target, draft, [td.prompts([3, 5], 6), td.prompts([4, 2], 6, seed=1)]


def test_the_gate_closes_before_any_speculative_program_and_the_baseline_results_are_the_runs(
        tiny_pair):
    target, draft, batches = tiny_pair
    search = speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=6,
                                           alpha=0.5, min_speedup=1e6)
    never = FakeTimer({})  # any stage would call it (and fail on the missing seconds)
    choice = speculation.choose_speculation(target, draft, batches, search, timer=never)
    gate = choice.gate
    assert not never.calls and not gate.open and choice.repeats == 0
    assert [c.name for c in choice.candidates] == ["baseline"] and not choice.best.speculative
    assert gate.gamma == 2 and gate.alpha == 0.5 and gate.step_s > 0 and gate.verify_cost > 0
    # The bound: the baseline's steps over the expected rounds of each batch (its slowest row)
    # priced at the gate's verify cost (drafting free).
    rounds = sum(theory.expected_batch_rounds(0.5, 2, np.asarray(r.lengths))
                 for r in choice.results)
    assert gate.rounds == pytest.approx(rounds)
    assert gate.steps == sum(int(r.stats.rounds) for r in choice.results)
    assert gate.bound == pytest.approx(gate.steps / (rounds * gate.verify_cost))
    for i, (got, x) in enumerate(zip(choice.results, batches)):  # the run's: batch i, key i
        want = decoding.autoregressive_decode(
            target, x, rng=jax.random.fold_in(jax.random.PRNGKey(0), i),
            sampling=search.sampling, max_decode_len=6)
        np.testing.assert_array_equal(got.tokens, want.tokens)
    saved = json.loads(json.dumps(choice.to_json()))
    assert saved["gate"]["open"] is False and saved["choice"] == "baseline"
    assert "no speculation: a round verifies 3 tokens for" in choice.line()


def test_an_open_gate_goes_on_to_time_the_candidates(tiny_pair):
    target, draft, batches = tiny_pair
    search = speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=6,
                                           min_speedup=0.0, gammas=(2,))
    timer = FakeTimer({("baseline", None): 1.0, ("chain", 2): 0.5})
    choice = speculation.choose_speculation(target, draft, batches, search, timer=timer)
    assert choice.gate.open and choice.gate.alpha == 1.0  # no alpha given: a perfect draft
    assert len(timer.calls) == 1 and choice.best.name == "chain g2"


@pytest.mark.parametrize("alpha", [-0.1, 1.5])
def test_the_gate_refuses_an_alpha_outside_0_1(alpha):
    with pytest.raises(ValueError, match=f"alpha={alpha}"):
        speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=6,
                                      alpha=alpha)


def test_a_run_too_short_to_repay_a_compile_runs_the_baseline_without_compiling_the_verify(
        tiny_pair):
    target, draft, batches = tiny_pair
    search = speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=6,
                                           min_speedup=0.0, run_batches=len(batches))
    never = FakeTimer({})
    choice = speculation.choose_speculation(target, draft, batches, search, timer=never)
    gate = choice.gate
    assert not never.calls and not choice.best.speculative
    # Nothing is left of the run after the slice: nothing to save, so not even the verify's
    # program compiles (its cost is taken at its least, one step).
    assert gate.remaining_s == 0.0 and not gate.pays and not gate.open
    assert not gate.verify_timed and gate.verify_cost == 1.0
    assert gate.bound == pytest.approx(gate.steps / gate.rounds)
    assert "could save at most 0.0 s" in choice.line()
    saved = json.loads(json.dumps(choice.to_json()))
    assert saved["gate"]["pays"] is False and saved["gate"]["remaining_s"] == 0.0


def _gate(**kwargs):
    fields = dict(alpha=0.8, gamma=2, step_s=0.01, verify_cost=1.2, steps=20, rounds=10.0,
                  bound=1.6, open=True, seconds=0.1, max_bound=2.0, compile_s=1.0,
                  remaining_s=10.0, perfect_bound=4.0)
    return speculation.SpeculationGate(**{**fields, **kwargs})


def test_the_saving_a_stage_may_hope_for():
    gate = _gate()
    assert gate.saving(1.0) == pytest.approx(10.0 * (1 - 1 / 2.0))
    assert gate.saving(1.5, 4.0) == pytest.approx(10.0 * (1 / 1.5 - 1 / 4.0))
    assert gate.saving(2.5) == 0.0  # already past the bound
    assert _gate(remaining_s=None).saving(1.0) == float("inf")  # the run's length unknown


@pytest.mark.parametrize("remaining_s, stages, why", [
    (10.0, 0, "the probe not timed: its ~1.6 s would take calibration past 1/8 of the rest of "
              "the run (1.2 s)"),
    (20.0, 1, "the other gammas not timed: it could save at most 5.0 s, less than its "
              "compiles (~17.0 s)"),
    (100.0, 1, "the other gammas not timed: its ~18.0 s would take calibration past 1/8"),
    (1000.0, 2, None)])
def test_a_stage_runs_only_if_it_can_repay_its_compiles_within_the_calibration_budget(
        monkeypatch, remaining_s, stages, why):
    # The gate: the slice takes the baseline 0.2 s (20 steps of 10 ms), its compile 1 s, the
    # bound 4x. The fake timer's first calls take 9 s and its timed ones 0.5 s: each program
    # compiles in about 8.5 s. A stage's cost: its compiles and two decodes of the slice per
    # program, plus the baseline's; the budget: 1/8 of the rest of the run.
    gate = _gate(remaining_s=remaining_s, max_bound=4.0)
    baseline = speculation._candidate(("baseline", None, None), [_result()], 0.2, 1.2, None, 0)
    monkeypatch.setattr(speculation, "speculation_gate", lambda *a: (gate, baseline, ()))
    timer = FakeTimer({("baseline", None): 1.0, ("chain", 2): 0.5, ("chain", 4): 0.4,
                       ("chain", 6): 0.45})
    search = speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=16)
    asked = []  # the tree stage (its pricing and its program: four compiles) likewise
    choice = speculation.choose_speculation(None, DRAFT, [np.zeros((2, 4))], search,
                                            timer=timer, tree_for=asked.append)
    assert len(timer.calls) == stages and choice.gate is gate
    assert choice.best.name == ["baseline", "chain g2", "chain g4"][stages]
    assert len(asked) == (stages == 2)
    if why is None:
        assert choice.notes == ()
    else:
        assert choice.notes[0].startswith(why) and why in choice.line()
    if stages == 0:
        assert "-> no speculation: the probe not timed" in choice.line()
        assert json.loads(json.dumps(choice.to_json()))["notes"] == list(choice.notes)


@pytest.mark.parametrize("run_batches", [0, 2.5, True])
def test_run_batches_must_be_a_positive_int(run_batches):
    with pytest.raises(ValueError, match=f"run_batches={run_batches!r}"):
        speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=6,
                                      run_batches=run_batches)


def test_stage_one_reuses_the_gates_baseline_decode_as_its_first_call(tiny_pair, monkeypatch):
    target, draft, batches = tiny_pair
    made = []
    real_gate = speculation.speculation_gate
    monkeypatch.setattr(speculation, "speculation_gate",
                        lambda *a: made.append(real_gate(*a)) or made[-1])
    firsts = {}

    def timer(programs, repeats):  # calls each program once, as the first call
        for name, program in programs.items():
            firsts[name] = program()
        seconds = {"baseline": 1.0, "chain": 1e3}  # the chain loses: the baseline's results
        return ({n: 1.0 for n in programs}, {n: [seconds[n[0]]] * repeats for n in programs},
                firsts)

    search = speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=6,
                                           min_speedup=1e-2, gammas=(2,))  # gate: open
    choice = speculation.choose_speculation(target, draft, batches, search, timer=timer)
    gate_results = made[0][2]
    assert choice.gate.open and not choice.best.speculative
    assert all(a is b for a, b in zip(firsts[("baseline", None, None)], gate_results))
    assert all(a is b for a, b in zip(choice.results, gate_results))


def test_a_probe_that_cannot_fit_the_calibration_budget_closes_the_gate_before_the_verify(
        tiny_pair):
    target, draft, batches = tiny_pair
    search = speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=6,
                                           min_speedup=0.0, run_batches=len(batches) + 1)
    for i, x in enumerate(batches):  # compiled already: the gate's compile_s is ~0
        decoding.autoregressive_decode(target, x, rng=jax.random.fold_in(
            jax.random.PRNGKey(0), i), sampling=search.sampling, max_decode_len=6)
    choice = speculation.choose_speculation(target, draft, batches, search, timer=FakeTimer({}))
    gate = choice.gate
    # One batch is left: a probe decodes the slice three times, more than 1/8 of that batch.
    assert gate.pays and not gate.fits and not gate.open and not gate.verify_timed
    assert not choice.best.speculative and "-> no speculation: the least probe" in choice.line()


def _prior_setup(tiny_pair, monkeypatch, speed):
    """The probe-cannot-fit run of the test above with the draft's alpha known (the prior
    decides), the draft's cost taken as free, the verify of 7 tokens as 1.5 steps and the
    prior's program (every first call after
    the gate's) reporting the gate's baseline seconds over `speed` (at T = 0 both generate the
    same tokens, so `speed` is its measured speedup)."""
    target, draft, batches = tiny_pair
    search = speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=6,
                                           alpha=0.9, run_batches=len(batches) + 1)
    for i, x in enumerate(batches):  # compiled already: the gate's compile_s is ~0
        decoding.autoregressive_decode(target, x, rng=jax.random.fold_in(
            jax.random.PRNGKey(0), i), sampling=search.sampling, max_decode_len=6)
    real, calls = speculation.costs_lib.first_call, []

    def first_call(fn):
        run_s, compile_s, result = real(fn)
        calls.append(run_s)
        return (run_s if len(calls) == 1 else calls[0] / speed), compile_s, result

    monkeypatch.setattr(speculation.costs_lib, "first_call", first_call)
    monkeypatch.setattr(prior_lib, "draft_step_cost", lambda *a, **k: 0.0)
    monkeypatch.setattr(speculation, "timed_verify_cost", lambda *a: 1.5)  # at gamma 6
    choice = speculation.choose_speculation(target, draft, batches, search, timer=FakeTimer({}))
    return choice, calls


@pytest.mark.parametrize("speed", [2.0, 0.98])  # 0.98: within the check's noise, kept
def test_where_no_probe_fits_the_prior_speculates_unless_measured_slower(
        tiny_pair, monkeypatch, speed):
    choice, calls = _prior_setup(tiny_pair, monkeypatch, speed)
    gate, prior = choice.gate, choice.prior
    assert gate.pays and not gate.fits and len(calls) == 2  # the gate's decode, the prior's
    # Theorem 3.8's model per batch at the card's alpha, c 0 and the verify on the line from 1
    # step (gamma 0) to 1.5 (gamma 6).
    rounds = {g: sum(theory.expected_batch_rounds(0.9, g, np.asarray(r.lengths))
                     for r in choice.results) for g in (2, 4, 6)}
    predicted = {g: gate.steps / (rounds[g] * (1 + 0.5 * g / 6)) for g in rounds}
    assert prior.gamma == max(predicted, key=predicted.get) and prior.c == 0.0
    assert prior.predicted == pytest.approx(predicted[prior.gamma])
    assert prior.verify_cost == pytest.approx(1 + 0.5 * prior.gamma / 6)
    assert prior.kept and prior.measured == pytest.approx(speed)
    assert choice.best.speculative and choice.best.gamma == prior.gamma
    assert choice.best.kind == "chain" and choice.candidates[1] is choice.best
    assert "from the prior" in choice.line() and json.loads(json.dumps(choice.to_json()))[
        "prior"]["gamma"] == prior.gamma


def test_where_no_probe_fits_the_prior_falls_back_when_measured_slower(tiny_pair, monkeypatch):
    choice, calls = _prior_setup(tiny_pair, monkeypatch, 0.9)
    prior = choice.prior
    assert not prior.kept and prior.measured == pytest.approx(0.9) and len(calls) == 2
    assert not choice.best.speculative and [c.kind for c in choice.candidates] == [
        "baseline", "chain"]
    assert f"it measured {prior.measured:.2f}x on the first batches" in choice.line()
    # The baseline's results are the gate's decode (greedy: the same tokens either way).
    assert all(np.array_equal(r.tokens, b.tokens) for r, b in
               zip(choice.results, (decoding.autoregressive_decode(
                   tiny_pair[0], x, rng=jax.random.fold_in(jax.random.PRNGKey(0), i),
                   sampling=SamplingConfig(0.0), max_decode_len=6)
                   for i, x in enumerate(tiny_pair[2]))))


def test_without_a_known_alpha_or_with_prior_off_no_prior_decides(tiny_pair):
    target, draft, batches = tiny_pair
    for alpha, prior in ((None, True), (0.9, False)):
        search = speculation.SpeculationSearch(sampling=SamplingConfig(0.0), max_decode_len=6,
                                               alpha=alpha, prior=prior,
                                               run_batches=len(batches) + 1)
        choice = speculation.choose_speculation(target, draft, batches, search,
                                                timer=FakeTimer({}))
        assert choice.prior is None and not choice.best.speculative, (alpha, prior)
