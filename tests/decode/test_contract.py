"""speculative/decode/contract.py: `write_rows` writes each row's update at its own start;
`jit_by_class` compiles one program per class."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.decode import contract


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


def test_jit_by_class_never_runs_another_classes_program():
    """jax compares the tree structures of flax struct classes with the same fields as equal
    while hashing them apart, so plain `jax.jit` can run the program of one such class for
    another when its cache lookup collides (seen for 124 of 798 calls across 399 subclasses).
    `jit_by_class` keys each program on the classes: every call runs its own class's code."""
    from flax import struct  # pylint: disable=g-import-not-at-top

    @struct.dataclass
    class Base:
        w: jax.Array

        def value(self):
            return self.w

    classes = [struct.dataclass(type(f"Sub{i}", (Base,), {"value": lambda self, i=i: self.w + i}))
               for i in range(120)]
    run = contract.jit_by_class(lambda m: m.value())
    for _ in range(2):
        got = [int(run(cls(jnp.zeros((), jnp.int32)))) for cls in classes]
        assert got == list(range(120))
    assert contract.class_key(classes[0](jnp.zeros(()))) != contract.class_key(
        classes[1](jnp.zeros(())))
    assert contract.class_key(Base(jnp.zeros(()))) == contract.class_key(Base(jnp.ones(())))


def test_jit_by_class_takes_a_static_argument_by_position_or_name():
    def scaled(x, n, *, m=1):
        return x * n * m

    run = contract.jit_by_class(scaled, ("n", "m"))
    assert float(run(jnp.ones(()), 3)) == 3.0 and float(run(jnp.ones(()), n=4, m=2)) == 8.0
