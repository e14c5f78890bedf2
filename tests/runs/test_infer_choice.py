"""speculative/runs/infer_choice.py: the plan is what the settings ask where nothing is timed,
it travels through JSON unchanged (a resumed run decodes as the first did), and it builds
the chosen drafter."""

import pytest

from speculative.decode import drafters
from speculative.runs import config as config_lib
from speculative.runs import infer, infer_choice
from tests.helpers.runs import INFER_GIN, infer_bindings

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_plans_without_timing(tiny_gin, monkeypatch):
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(None))
    settings = infer.infer(dry_run=True)
    monkeypatch.setattr(infer_choice, "choose_decoding", lambda *a: pytest.fail("timed"))
    monkeypatch.setattr(infer_choice, "choose_beam_search", lambda *a: pytest.fail("timed"))

    def plan(**overrides):
        return infer_choice.choose(infer.infer(settings, dry_run=True, **overrides), None,
                                   None, [])

    assert plan() == infer_choice.DecodePlan("speculative", gamma=3)
    assert plan(speculative=False).mode == "autoregressive"
    assert plan(mode="score").mode == "score" and not plan(mode="score").speculative
    assert plan(beam_size=2, speculative=False).mode == "beam_search"
    forced = plan(beam_size=2, force_speculative_beam=True, gamma="auto")
    assert (forced.mode, forced.gamma, forced.draft_beam) == (
        "speculative_beam_search", infer_choice.FORCED_BEAM_GAMMA, 2)
    assert forced.beams and forced.speculative


def test_a_plan_through_json_is_the_same_plan_and_builds_its_drafter(tiny_models):
    plan = infer_choice.DecodePlan("speculative", gamma=4, kind="chain",
                                   speculation={"choice": "chain g4"}, calibration_seconds=2.5,
                                   reused=((object(), 0.1),))
    again = infer_choice.DecodePlan.from_json(plan.to_json())
    assert again == plan and again.reused == ()  # results are not written
    tree = infer_choice.DecodePlan("speculative", gamma=2, kind="tree", tree=(2, 1))
    assert infer_choice.DecodePlan.from_json(tree.to_json()).tree == (2, 1)
    draft = tiny_models[1]
    built = plan.drafter(draft)
    assert drafters.is_drafter(built) and built.gamma == 4
    assert infer_choice.DecodePlan("speculative", gamma=4).drafter(draft) is draft
