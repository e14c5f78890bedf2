"""speculative/training/data.py: examples dropped or truncated keeping EOS, and batches that
bucket, pad and cover every example."""


import numpy as np

from speculative.decode import contract
from speculative.training import data as training_data

EOS = contract.EOS_ID


# ------------------------------------------------------------------------------------ batching

def test_make_examples_drops_or_truncates_keeping_eos():
    inputs = [[5, 6, EOS], [5, 6, 7, 8, 9, EOS], [4, EOS]]
    targets = [[3, EOS], [3, EOS], [3, 4, 5, 6, 7, 8, EOS]]
    kept, dropped = training_data.make_examples(inputs, targets, max_length=4)
    assert dropped == 2 and len(kept) == 1
    np.testing.assert_array_equal(kept[0][0], [5, 6, EOS])
    cut, dropped = training_data.make_examples(inputs, targets, max_length=4, truncate=True)
    assert dropped == 0
    np.testing.assert_array_equal(cut[1][0], [5, 6, 7, EOS])  # seqio append_eos_after_trim
    np.testing.assert_array_equal(cut[2][1], [3, 4, 5, EOS])


def test_batches_bucket_pad_and_cover_every_example():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=(37, 2))
    examples = [(np.arange(2, 2 + a, dtype=np.int32), np.arange(10, 10 + b, dtype=np.int32))
                for a, b in lengths]
    buckets, batch_tokens = (4, 8), 16
    seen = []
    for inputs, targets in training_data.batches(examples, buckets, batch_tokens,
                                            rng=np.random.default_rng(1)):
        length = inputs.shape[1]
        assert length in buckets and inputs.shape == targets.shape == (batch_tokens // length,
                                                                        length)
        assert inputs.dtype == np.int32
        for x, y in zip(inputs, targets):
            if not x.any():  # a filler row: all padding on both sides
                assert not y.any()
                continue
            n, m = int((x > 0).sum()), int((y > 0).sum())
            assert not x[n:].any() and not y[m:].any()  # right padding only
            assert max(n, m) <= length and (length == 4 or max(n, m) > 4)  # smallest bucket
            seen.append((tuple(x[:n]), tuple(y[:m])))
    assert sorted(seen) == sorted((tuple(x), tuple(y)) for x, y in examples)
