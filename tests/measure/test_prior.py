"""speculative/measure/prior.py: GAMMA 'auto''s prior is Theorem 3.8 per batch. Known answers:
one long row gives Theorem 3.8's speedup (rounds of E[tokens] each); a batch waits for its
slowest row, so more rows predict less; a drafter object's cost is not timed (0)."""

import types

import pytest

from speculative.measure import analysis as theory
from speculative.measure import prior


@pytest.mark.parametrize("alpha,c,verify", [(0.78, 0.14, 1.0), (0.5, 0.3, 1.2)])
def test_one_long_row_predicts_theorem_3_8(alpha, c, verify):
    n = 4000
    got = prior.predicted_speedups(alpha=alpha, c=c, verify_cost=verify, steps=n,
                                   lengths=[[n]], gammas=(2, 4, 6))
    for g, speedup in got.items():
        assert speedup == pytest.approx(theory.speedup(alpha, g, c, verify), rel=1e-2), g


def test_the_verify_runs_on_a_line_from_one_step_to_its_timed_cost():
    assert prior.verify_costs(1.6, (2, 4, 6)) == pytest.approx({2: 1.2, 4: 1.4, 6: 1.6})
    assert prior.verify_costs(1.0, (2, 4)) == {2: 1.0, 4: 1.0}  # memory-bound: flat
    spread = prior.predicted_speedups(alpha=0.8, c=0.0, verify_cost={2: 1.0, 4: 2.0},
                                      steps=4000, lengths=[[4000]], gammas=(2, 4))
    assert spread[4] == pytest.approx(theory.speedup(0.8, 4, 0.0, 2.0), rel=1e-2)
    assert spread[2] == pytest.approx(theory.speedup(0.8, 2, 0.0, 1.0), rel=1e-2)


def test_a_batch_waits_for_its_slowest_row():
    one = prior.predicted_speedups(alpha=0.7, c=0.1, verify_cost=1.0, steps=48,
                                   lengths=[[48]], gammas=(4,))[4]
    many = prior.predicted_speedups(alpha=0.7, c=0.1, verify_cost=1.0, steps=48,
                                    lengths=[[48] * 16], gammas=(4,))[4]
    assert 1.0 < many < one


def test_a_drafter_object_or_a_draft_without_a_model_costs_nothing_untimed():
    drafter = types.SimpleNamespace(propose=None, layout=None)  # what drafters.is_drafter asks
    for draft in (drafter, types.SimpleNamespace()):  # ... and a draft with no `module`
        assert prior.draft_step_cost(None, draft, [[1, 2]], seed=0, max_decode_len=4,
                                     step_s=0.01) == 0.0


def test_the_verdict_says_what_was_predicted_and_measured():
    made = prior.SpeculationPrior(alpha=0.78, c=0.14, verify_cost=1.0, gamma=4, predicted=1.88,
                                  measured=0.9, kept=False, seconds=1.0)
    assert made.verdict() == (
        "no speculation: no time to time candidates; Theorem 3.8 at the card's alpha 0.78, "
        "c 0.14 and a verify of 1.00 steps predicts 1.88x for chain gamma 4, but it measured "
        "0.90x on the first batches")
    kept = prior.SpeculationPrior(**{**made.to_json(), "measured": 1.5, "kept": True})
    assert kept.verdict().startswith("chain gamma 4 from the prior")
    assert "measured 1.50x" in kept.verdict()


def test_a_model_drafts_cost_is_its_timed_extends_in_baseline_steps(monkeypatch):
    from speculative.models import t5  # pylint: disable=g-import-not-at-top
    from tests.helpers import decoding as td  # pylint: disable=g-import-not-at-top
    from tests.helpers import tiny_config  # pylint: disable=g-import-not-at-top
    target, draft = td.pair(t5.Transformer(tiny_config()))
    ran = []

    def first_call(program):  # runs the real extends, reports 0.5 s for them
        ran.append(program())
        return 0.5, 0.0, ran[-1]

    monkeypatch.setattr(prior.costs_lib, "first_call", first_call)
    c = prior.draft_step_cost(target, draft, td.prompts([3, 5], 6), seed=0, max_decode_len=6,
                              step_s=0.01)
    # 0.1 s of 0.01 s steps: 10 extends timed, 0.05 s each, 5 baseline steps.
    assert len(ran) == 1 and c == pytest.approx(0.5 / 10 / 0.01)
