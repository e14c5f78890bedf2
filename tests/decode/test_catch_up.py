"""speculative/decode/catch_up.py: the catch-up chunk's compiled widths and the narrowest read
(the target-aware re-read itself is tested through the drafters: test_drafters.py,
test_capabilities.py)."""

import jax
import jax.numpy as jnp
import pytest

from speculative.decode import catch_up


@pytest.mark.parametrize("width, widths", [(1, (1,)), (2, (1, 2)), (6, (1, 2, 4, 6)),
                                           (8, (1, 2, 4, 8)), (9, (1, 2, 4, 8, 9))])
def test_chunk_widths_are_powers_of_two_and_the_full_width(width, widths):
    assert catch_up.chunk_widths(width) == widths


@pytest.mark.parametrize("num_real, expected", [([1, 1], 1), ([1, 3], 4), ([2, 2], 2),
                                                ([5, 1], 8), ([8, 8], 8)])
def test_read_chunk_reads_the_narrowest_width_holding_every_rows_real_tokens(num_real, expected):
    tokens = jnp.arange(16).reshape(2, 8)
    features = jnp.ones((2, 8, 3))

    def read(t, f):  # the width it was given, and what it read
        return jnp.asarray(t.shape[1]), jnp.sum(t[:, :1]) + jnp.sum(f[:, :1])

    width, first = jax.jit(catch_up.read_chunk, static_argnums=0)(
        read, tokens, features, jnp.asarray(num_real))
    assert int(width) == expected and float(first) == 8 + 6
    width, _ = catch_up.read_chunk(lambda t, f: (jnp.asarray(t.shape[1]), f), tokens, None,
                                   jnp.asarray(num_real))
    assert int(width) == expected  # a draft without features
