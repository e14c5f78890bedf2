"""speculative/decode/contract.py: `write_rows` writes each row's update at its own start."""


import numpy as np
import pytest


def test_write_rows_writes_each_row_at_its_own_start_along_the_length_axis():
    """Head-major key/value caches `[B, H, L, D]` are written along axis 2, token histories
    `[B, L]` along axis 1; each row at its own start (the decode caches' one write)."""
    from speculative.decode.contract import write_rows  # pylint: disable=g-import-not-at-top

    cache = np.zeros((2, 3, 6, 2), np.float32)
    update = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2) + 1
    starts = np.array([1, 4], np.int32)
    want = cache.copy()
    for b, s in enumerate(starts):
        want[b, :, s:s + 2] = update[b]
    np.testing.assert_array_equal(write_rows(cache, update, starts, axis=2), want)
    hist = write_rows(np.zeros((2, 5), np.int32), np.array([[7], [8]]), np.array([0, 3]))
    np.testing.assert_array_equal(hist, [[7, 0, 0, 0, 0], [0, 0, 0, 8, 0]])
    with pytest.raises(ValueError, match="axis 0 is the batch"):
        write_rows(cache, update, starts, axis=0)
