"""speculative/runs/predictions.py: the lines of infer's output file (one per example: the
prediction, how it ended, its row's counters) from a decode result, without a model."""

import numpy as np

from speculative.decode import contract
from speculative.decode.loops import DecodeResult
from speculative.decode.stats import DecodeStats
from speculative.runs import predictions

EOS = contract.EOS_ID


class _Vocabulary:
    def decode(self, ids):
        return " ".join(str(i) for i in ids)


def _example(index, truncated=False):
    return predictions.Example(index=index, inputs_text=f"in {index}",
                               targets_text=f"out {index}", input_ids=np.array([5, EOS]),
                               input_length=9 if truncated else 2, truncated=truncated)


def test_a_record_says_how_its_prediction_ended():
    vocab = _Vocabulary()
    ended = predictions.record(_example(3, truncated=True), [4, 5, EOS], vocab, max_decode_len=3)
    assert ended == {"index": 3, "inputs": {"inputs_pretokenized": "in 3",
                                            "targets_pretokenized": "out 3"},
                     "prediction": "4 5 1",
                     "prediction_tokens": [4, 5, EOS], "input_length": 9,
                     "input_truncated": True, "ended_with_eos": True,
                     "hit_max_decode_len": False}
    cut = predictions.record(_example(0), [4, 5, 6], vocab, max_decode_len=3)
    assert (cut["ended_with_eos"], cut["hit_max_decode_len"]) == (False, True)
    short = predictions.record(_example(0), [4], vocab, max_decode_len=3)
    assert (short["ended_with_eos"], short["hit_max_decode_len"]) == (False, False)
    assert predictions.record(_example(0), [], vocab, max_decode_len=3)["prediction"] == ""


def test_row_records_cut_each_row_at_its_length_and_divide_its_counters():
    """Row 0: 3 tokens in 2 target calls, 4 drafts tested with beta summing to 3; row 1: no
    drafts tested (alpha None)."""
    stats = DecodeStats(
        rounds=np.int32(2), target_calls=np.array([2, 1]), draft_calls=np.array([4, 2]),
        drafted=np.array([4, 2]), accepted=np.array([3, 0]), generated=np.array([3, 1]),
        beta_sum=np.array([3.0, 0.0], np.float32), tested=np.array([4, 0]),
        accepted_per_position=np.array([[2, 1], [0, 0]]), nonfinite=np.array([False, False]))
    result = DecodeResult(tokens=np.array([[4, 5, EOS, 0], [7, 0, 0, 0]]),
                          lengths=np.array([3, 1]), stats=stats)
    rows = predictions.row_records([_example(0), _example(1)], result, _Vocabulary(), 4)
    assert [r["prediction_tokens"] for r in rows] == [[4, 5, EOS], [7]]
    assert [r["ended_with_eos"] for r in rows] == [True, False]
    assert rows[0]["alpha"] == 0.75 and rows[1]["alpha"] is None
    assert [r["tokens_per_target_call"] for r in rows] == [1.5, 1.0]
    assert rows[0]["accepted_per_position"] == [2, 1] and rows[1]["draft_calls"] == 2


def test_the_best_beam_ends_at_its_eos():
    assert predictions.best_beam(np.array([4, 5, EOS, 0, 0])) == [4, 5, EOS]
    assert predictions.best_beam(np.array([4, 5, 6])) == [4, 5, 6]
