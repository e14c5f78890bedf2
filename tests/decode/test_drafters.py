"""Drafters as objects (speculative/decode/drafters.py): the block drafter's one call per round,
greedy identity and the target's law (chain and tree), a negative control, and the argument
checks every drafter shares."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from speculative import decoding
from speculative.decode import drafters, tree_drafter, trees
from speculative.decode.kernel import SamplingConfig
from speculative.models import adapters, t5
from speculative.models import block_draft as bd
from speculative.models import feature_draft as fd
from tests.helpers import decoding as td
from tests.helpers import random_params, tiny_config

GREEDY = SamplingConfig(temperature=0.0)


def _block_draft(vocab, max_gamma=4, seed=5, cross_attention=True):
    cfg = fd.FeatureDraftConfig(vocab_size=vocab, target_emb_dim=16, feature_layers=(1, 2),
                                cross_attention=cross_attention,
                                emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                                relative_attention_num_buckets=8,
                                relative_attention_max_distance=16)
    module = bd.BlockDraft(cfg, max_gamma=max_gamma)
    return bd.BlockDraftModel(module, bd.init_params(module, jax.random.PRNGKey(seed)))


@pytest.fixture(scope="module")
def block_pair():
    module = t5.Transformer(tiny_config(vocab_size=td.VOCAB))
    target = adapters.EncoderDecoderModel(module, random_params(module, 3))
    return module, target, _block_draft(td.VOCAB)


def _sources(batch=3, seed=0):
    rng = np.random.default_rng(seed)
    inputs = np.zeros((batch, 7), np.int32)
    for b, n in enumerate([7, 2, 5][:batch]):
        inputs[b, :n] = rng.integers(2, td.VOCAB, n)
    return inputs


def _check_greedy_identity_one_call_per_round(target, draft, inputs, tree, max_decode_len):
    kw = dict(rng=jax.random.PRNGKey(0), sampling=GREEDY, max_decode_len=max_decode_len)
    plain = decoding.autoregressive_decode(target, inputs, **kw)
    spec = decoding.speculative_decode(target, draft, inputs, gamma=3, tree=tree, **kw)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.lengths, plain.lengths)
    # one draft forward per round and row, whatever gamma or the tree
    np.testing.assert_array_equal(spec.stats.draft_calls, spec.stats.target_calls)
    assert spec.stats.summary()["draft_calls_per_round"] == 1.0


@pytest.mark.parametrize("tree", [None, (2, 1, 1)])
def test_block_drafter_greedy_identity_with_one_draft_call_per_round(block_pair, tree):
    _, target, draft = block_pair
    _check_greedy_identity_one_call_per_round(target, draft, _sources(), tree, 12)


@pytest.mark.parametrize("tree", [None, (2, 1, 1)])
def test_block_drafter_greedy_identity_on_a_decoder_only_target(tree):
    # The decoder-only case: the draft reads the target's features of the prompt and of each
    # accepted token (no encoder, no cross-attention); prompts of different lengths per row.
    module = t5.DecoderOnly(tiny_config(vocab_size=16))
    target = adapters.as_decode_model(module, random_params(module, 3))
    draft = _block_draft(16, cross_attention=False)
    inputs = td.prompts([3, 6, 1], 6)  # ids in [2, 16)
    _check_greedy_identity_one_call_per_round(target, draft, inputs, tree, 10)


def _sample(target, draft, enc, cfg, seed, drafter=None, tree=None):
    inputs = np.repeat(enc, td.N_SAMPLES, 0)
    out = decoding.speculative_decode(
        target, drafter or draft, inputs, rng=jax.random.PRNGKey(seed),
        gamma=None if drafter else 3, sampling=cfg, max_decode_len=3, tree=tree)
    return np.asarray(out.tokens), out.stats


@pytest.mark.parametrize("tree,name", [
    (None, "t1"), ((2, 2, 1), "t1"),
    pytest.param(None, "t0.7_topk3", marks=pytest.mark.slow),
    pytest.param((2, 2, 1), "t0.7_topk3", marks=pytest.mark.slow)])
def test_block_drafter_keeps_the_targets_law(block_pair, tree, name):
    module, target, draft = block_pair
    enc = np.array([[3, 5, 2, 7, 1]], np.int32)
    cfg = td.JOINT_CONFIGS[name]
    probs = td.exact_joint(module, target.params, enc, cfg)
    samples, stats = _sample(target, draft, enc, cfg, seed=7, tree=tree)
    assert float(jnp.mean(stats.accepted)) > 0.2  # drafts are accepted: the test has teeth
    assert td.joint_pvalue(samples, probs) > 1e-6


@struct.dataclass
class _LyingBlockDrafter(drafters.BlockDrafter):
    """Reports q as uniform while the drafts are drawn from the block's q: not exact."""

    def propose(self, state, last, start, keys, verifier):
        proposal, state = super().propose(state, last, start, keys, verifier)
        return proposal.replace(q=jnp.full_like(proposal.q, 1.0 / proposal.q.shape[-1])), state


def test_negative_control_a_misreported_q_fails(block_pair):
    module, target, draft = block_pair
    enc = np.array([[3, 5, 2, 7, 1]], np.int32)
    cfg = td.JOINT_CONFIGS["t1"]
    probs = td.exact_joint(module, target.params, enc, cfg)
    samples, _ = _sample(target, draft, enc, cfg, seed=7, drafter=_LyingBlockDrafter(draft, 3))
    assert td.joint_pvalue(samples, probs) < 1e-6


def test_drafters_check_their_settings_and_the_target(block_pair):
    _, target, draft = block_pair
    inputs = _sources()
    kw = dict(rng=jax.random.PRNGKey(0), sampling=GREEDY, max_decode_len=6)
    with pytest.raises(ValueError, match="placeholders for gamma <= 4"):
        decoding.speculative_decode(target, draft, inputs, gamma=5, **kw)
    with pytest.raises(TypeError, match="confidence"):  # a block has no chain settings
        drafters.BlockDrafter(draft, 3, confidence=0.5)
    with pytest.raises(ValueError, match="with a drafter object"):
        decoding.speculative_decode(target, drafters.BlockDrafter(draft, 2), inputs,
                                    gamma=None, tree=(2, 1), **kw)

    @dataclasses.dataclass(frozen=True)
    class NoTrees:  # a target without the TreeTarget capability
        inner: object

        def __getattr__(self, name):
            if name in ("extend_tree", "keep_path"):
                raise AttributeError(name)
            return getattr(self.inner, name)

    plain_target = NoTrees(target)
    with pytest.raises(TypeError, match="TreeTarget.*lacks extend_tree, keep_path"):
        tree_drafter.TreeDrafter(drafters.ChainDrafter(draft, 2), trees.Tree((2, 1))).check(
            plain_target)


def test_a_draft_trained_for_another_target_is_refused_by_name():
    """large_feature_draft reads large_target's layers 2, 4, 6; mini_target has 3 decoder
    layers: refused before any work, saying the draft belongs to another target."""
    from speculative.runs import mini  # pylint: disable=import-outside-toplevel

    target, draft = mini.load("mini_target"), mini.load("large_feature_draft")
    inputs = mini.Vocabulary().encode_sources(["Open the file"], 16)
    with pytest.raises(ValueError, match="trained for another target.*belongs to large_target"):
        decoding.speculative_decode(target, draft, inputs, rng=jax.random.PRNGKey(0), gamma=2,
                                    sampling=GREEDY, max_decode_len=4)
