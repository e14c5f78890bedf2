"""speculative/runs/infer_decode.py: the chunks cover every batch once, in order, whatever
CHECKPOINT_PERIOD is (batch i decodes with its own key), and chunks already done are skipped."""

import pytest

from speculative.runs import config as config_lib
from speculative.runs import infer, infer_choice, infer_decode
from tests.helpers.runs import INFER_GIN, infer_bindings

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_chunks_cover_the_batches_and_skip_what_is_done(tiny_gin):
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(None, NUM_EXAMPLES="5"))
    settings = infer.infer(dry_run=True, progress=False)
    task, examples = infer.load_examples(settings)
    target, draft = infer.load_models(settings)
    vocabulary = task.output_features["targets"].vocabulary
    plan = infer_choice.DecodePlan("speculative", gamma=3)
    all_batches = list(infer.batches(examples, 2, settings.input_length))  # 2, 2 and 1 rows

    def chunks(period, done=frozenset()):
        s = infer.infer(settings, dry_run=True, checkpoint_period=period)
        return list(infer_decode.decode_chunks(s, plan, target, draft, examples, all_batches,
                                               vocabulary, done=done))

    one = chunks(1)
    assert [c.index for c in one] == [0, 1, 2] and [c.rows for c in one] == [[2], [2], [1]]
    assert one[0].compile_seconds > 0 and one[1].compile_seconds == 0
    whole = chunks(3)
    assert len(whole) == 1 and whole[0].records == [r for c in one for r in c.records]
    assert [r["index"] for r in whole[0].records] == [0, 1, 2, 3, 4]  # the filler row dropped
    rest = chunks(1, done={0, 2})
    assert [c.index for c in rest] == [1] and rest[0].records == one[1].records
