"""TreeDrafter (speculative/decode/tree_drafter.py) as an object: what it answers for itself
(depth, kind, the base's capabilities), its settings checks, and one draft call per tree level
with its proposal's shape and validity. Its laws and greedy identity through the loop are in
tests/decode/test_trees.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.decode import drafters, rounds, trees, verifiers
from speculative.decode.kernel import SamplingConfig
from speculative.decode.tree_drafter import TreeDrafter
from speculative.models import t5
from tests.helpers import decoding as td
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def tiny_pair():
    return td.pair(t5.Transformer(tiny_config(vocab_size=td.VOCAB)))


def test_a_tree_answers_for_itself_and_defers_to_its_base(tiny_pair):
    _, draft = tiny_pair
    base = drafters.ChainDrafter(draft, 5)
    tree = TreeDrafter(base, trees.as_tree((2, 1, 1)))
    assert (tree.gamma, tree.kind, tree.needs_tree, tree.model) == (3, "tree", True, draft)
    assert tree.reads_target is base.reads_target and tree.unrolls is base.unrolls
    assert isinstance(tree.layout, rounds.TreeLayout) and tree.layout.tree == tree.tree
    assert tree.candidates((2, 4), 8) == ((tree,),)  # a fixed shape: itself, whatever gamma
    other = tree.with_tree((3, 1))
    assert isinstance(other, TreeDrafter) and other.tree.branching == (3, 1)
    assert other.base.gamma == 2  # the base chain follows the new tree's depth


def test_a_tree_refuses_a_base_with_dynamic_gamma(tiny_pair):
    target, draft = tiny_pair
    for kw in (dict(confidence=0.5), dict(schedule="heuristic")):
        tree = TreeDrafter(drafters.ChainDrafter(draft, 2, **kw), trees.as_tree((2, 1)))
        with pytest.raises(ValueError, match=r"tree=\(2, 1\) drafts a fixed shape"):
            tree.check(target)


def test_one_draft_call_per_level_and_a_tree_of_valid_nodes(tiny_pair):
    target, draft = tiny_pair
    tree = TreeDrafter(drafters.ChainDrafter(draft, 3), trees.as_tree((2, 2, 1)))
    tree.check(target)
    inputs = np.asarray([[3, 4, 5, 6, 1, 0], [2, 3, 1, 0, 0, 0]], np.int32)
    view = tree.view(target)
    tstate, state = tree.start(view, jnp.asarray(inputs), 8, tree.layout.width)
    keys = jax.random.split(jax.random.PRNGKey(0), tree.gamma)
    greedy = verifiers.for_sampling(SamplingConfig(temperature=0.0))
    propose = jax.jit(tree.propose, static_argnums=4)
    proposal, _ = propose(state, tstate.pending, tstate.lengths, keys, greedy)
    nodes = tree.tree.num_nodes - 1  # 2 + 4 + 4: every node but the root
    assert proposal.tokens.shape == (2, nodes) and proposal.valid.shape == (2, nodes)
    np.testing.assert_array_equal(proposal.draft_calls, [3, 3])  # one call per level
    np.testing.assert_array_equal(proposal.num_drafted, [3, 3])
    # At T = 0 a node's children are its top tokens: distinct, so every node is valid.
    assert bool(jnp.all(proposal.valid))
    first = proposal.tokens[:, :2]
    assert bool(jnp.all(first[:, 0] != first[:, 1]))
