"""speculative/decode/rounds.py: a round's pieces on their own (the loops that put them together:
tests/decode/test_loops.py and test_loops_scripted.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.decode import rounds, trees, verifiers


def test_round_keys_are_distinct_per_role_and_per_depth():
    keys = rounds.RoundKeys.split(jax.random.PRNGKey(0), 3)
    assert keys.draft.shape[0] == 3
    all_keys = [keys.next, keys.accept, *keys.draft]
    assert len({tuple(np.asarray(jax.random.key_data(k)).tolist()) for k in all_keys}) == 5
    again = rounds.RoundKeys.split(jax.random.PRNGKey(0), 3)
    np.testing.assert_array_equal(np.asarray(again.draft), np.asarray(keys.draft))


def test_layout_widths_and_depths():
    assert rounds.ChainLayout(4).width == 4
    tree = rounds.TreeLayout(trees.as_tree((2, 1)))  # 2 children, then 1 under each: 4 nodes
    assert (tree.gamma, tree.width) == (2, 4)


def test_a_tree_refuses_lenience_by_its_shape():
    """Lenience is read from the verifier, the one place it is set."""
    lenient = verifiers.GreedyVerifier(0.5)
    rounds.ChainLayout(3).check_verifier(lenient)  # any rule applies to a chain
    with pytest.raises(ValueError, match=r"tree=\(2, 1\) .* needs lenience=1 \(got 0.5\)"):
        rounds.TreeLayout(trees.as_tree((2, 1))).check_verifier(lenient)
    rounds.TreeLayout(trees.as_tree((2, 1))).check_verifier(verifiers.GreedyVerifier())


def test_a_tree_asks_its_verifier_for_the_tree_methods_only_a_chain_needs_fewer():
    @dataclasses.dataclass(frozen=True)
    class ChainOnly:  # a ChainVerifier: no children, no verify_tree
        lenience: float = 1.0

        def propose(self, logits, rng): ...

        def top_probability(self, logits, q): ...

        def verify(self, logits, q, x, num_drafted, rng): ...

        def next_token(self, logits, rng): ...

    verifiers.check_policy(ChainOnly())  # enough for a chain
    rounds.ChainLayout(3).check_verifier(ChainOnly())
    with pytest.raises(TypeError, match=r"lacks \['children', 'verify_tree'\].*TreeVerifier"):
        rounds.TreeLayout(trees.as_tree((2, 1))).check_verifier(ChainOnly())
    assert verifiers.methods(verifiers.ChainVerifier) == (
        "propose", "top_probability", "verify", "next_token")
    assert verifiers.methods(verifiers.TreeVerifier)[-2:] == ("children", "verify_tree")
    assert verifiers.Verifier is verifiers.TreeVerifier  # the old name


def _outcome(accepted, drafts, next_token, leaf=None):
    accepted = jnp.asarray(accepted)
    return rounds.Outcome(
        accepted=accepted, drafts=jnp.asarray(drafts), next_token=jnp.asarray(next_token),
        beta=jnp.zeros(np.shape(drafts)), broken=jnp.zeros_like(accepted, bool), features=None,
        leaf=jnp.zeros_like(accepted) if leaf is None else jnp.asarray(leaf))


def test_emitted_is_the_kept_drafts_then_the_next_token():
    out = _outcome([0, 2, 3], [[0, 0, 0], [5, 6, 0], [5, 6, 7]], [9, 7, 2])
    assert out.emitted().tolist() == [[9, 0, 0, 0], [5, 6, 7, 0], [5, 6, 7, 2]]


class _Recorder:
    """A view whose `keep_path` returns the offsets it was given."""

    def keep_path(self, state, starts, offsets):
        del state, starts
        return offsets


def test_tree_keep_moves_the_kept_path_to_contiguous_slots():
    """tree=(2, 1): nodes 0 (root), 1 and 2 (the root's children), 3 under 1, 4 under 2. Row 0
    kept both depths along the second leaf (nodes 2 and 4); row 1 kept only node 1 (a kept
    depth past n reads the root's slot)."""
    layout = rounds.TreeLayout(trees.as_tree((2, 1)))
    out = _outcome([2, 1], [[4, 5], [7, 0]], [6, 2], leaf=[1, 0])
    offsets = layout.keep(_Recorder(), None, jnp.zeros((2,), jnp.int32), out)
    assert offsets.tolist() == [[0, 2, 4], [0, 1, 0]]
    assert rounds.ChainLayout(2).keep(_Recorder(), "state", None, out) == "state"
