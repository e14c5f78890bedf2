"""Token trees: the tree forward is the chain forward of every path, and decoding with a tree is
exact (greedy identity, joint law of three sampled tokens, a wrong verifier failing the same)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decode import trees, verifiers
from speculative.decode.kernel import SamplingConfig
from speculative.models import ngram, t5
from tests.helpers import decoding as td
from tests.helpers import random_params, tiny_config

GREEDY = SamplingConfig(0.0)
SHAPES = [(1, 1, 1), (2, 2), (3, 1, 1), pytest.param((2, 2, 2), marks=pytest.mark.slow),
          pytest.param((4,), marks=pytest.mark.slow)]


def test_tree_layout():
    tree = trees.Tree((2, 2))
    assert (tree.num_nodes, tree.num_leaves, tree.offsets) == (7, 4, (0, 1, 3, 7))
    depths, visible = tree.attention()
    np.testing.assert_array_equal(depths, [0, 1, 1, 2, 2, 2, 2])
    # Node 5 is the first child of node 2 (the root's second child).
    np.testing.assert_array_equal(np.nonzero(visible[5])[0], [0, 2, 5])
    chain_depths, chain_visible = trees.Tree((1, 1, 1)).attention()
    np.testing.assert_array_equal(chain_depths, np.arange(4))
    np.testing.assert_array_equal(chain_visible, np.tril(np.ones((4, 4), bool)))


def test_tree_refuses_bad_shapes():
    for bad in [(), (2, 0), 3, (1.5,), (True, 2)]:
        with pytest.raises(ValueError, match="tree="):
            trees.Tree(bad)
    with pytest.raises(ValueError, match="at most"):
        trees.Tree((8, 8, 8, 2))
    with pytest.raises(ValueError, match="gamma=2 disagrees"):
        trees.as_tree((2, 2, 1), gamma=2)


def _paths(tree):
    """Node ids along every root-to-node path (root first)."""
    depths, visible = tree.attention()
    return [np.nonzero(visible[n])[0] for n in range(tree.num_nodes)]


@pytest.mark.parametrize("decoder_only", [False, True])
def test_tree_forward_equals_the_chain_forward_of_each_path(decoder_only):
    """Every node's logits (and features) equal those of its root-to-node path fed as a chain;
    after `keep_path` the cache continues as if only that path had been fed."""
    config = tiny_config(vocab_size=32)
    module = t5.DecoderOnly(config) if decoder_only else t5.Transformer(config)
    adapter = decoding.DecoderOnlyModel if decoder_only else decoding.EncoderDecoderModel
    model = adapter(module, random_params(module, 0))
    rng = np.random.default_rng(0)
    inputs = td.prompts([5, 2], 5)
    tree = trees.Tree((2, 3))
    tokens = jnp.asarray(rng.integers(2, 32, (2, tree.num_nodes)), jnp.int32)
    extend = jax.jit(model.extend)  # (op-by-op flax is slower than one compile per shape)
    start = model.init(model.params, inputs, 24)
    # Advance the rows by different amounts first, so the tree sits at different offsets.
    _, start = extend(model.params, start, jnp.asarray([[3, 4, 5], [6, 7, 8]]))
    start = model.rewind(start, start.lengths - jnp.asarray([0, 2]))
    logits, features, state = jax.jit(model.extend_tree, static_argnums=4)(
        model.params, start, tokens, tree.attention(), (1, 2))
    for node, path in enumerate(_paths(tree)):
        chain, _ = extend(model.params, start, tokens[:, path])
        np.testing.assert_allclose(logits[:, node], chain[:, -1], rtol=2e-5, atol=2e-5)
    if not decoder_only:
        _, chain_features, _ = model.extend_with_features(model.params, start, tokens[:, :1],
                                                          (1, 2))
        np.testing.assert_allclose(features[:, 0], chain_features[:, 0], rtol=2e-5, atol=2e-5)
    # Keep path 0 -> 2 -> 8 in row 0 and 0 -> 1 -> 3 in row 1, then extend one more token.
    path = jnp.asarray([[0, 2, 8], [0, 1, 3]])
    kept = model.rewind(model.keep_path(state, start.lengths, path), start.lengths + 3)
    nxt = jnp.asarray([[9], [10]])
    got, _ = extend(model.params, kept, nxt)
    for b in range(2):
        want, _ = extend(model.params, start, jnp.concatenate([tokens[:, path[b]], nxt], 1))
        np.testing.assert_allclose(got[b, 0], want[b, -1], rtol=2e-5, atol=2e-5)


# ----------------------------------------------------------------------------------------------
# Greedy identity.


def _greedy_check(target, draft, inputs, tree, max_decode_len=16):
    ar = decoding.autoregressive_decode(target, inputs, rng=jax.random.PRNGKey(0),
                                        sampling=GREEDY, max_decode_len=max_decode_len)
    sp = decoding.speculative_decode(target, draft, inputs, rng=jax.random.PRNGKey(0),
                                     gamma=len(tree), sampling=GREEDY,
                                     max_decode_len=max_decode_len, tree=tree)
    np.testing.assert_array_equal(sp.tokens, ar.tokens)
    np.testing.assert_array_equal(sp.lengths, ar.lengths)
    return sp


@pytest.mark.parametrize("tree", SHAPES)
def test_greedy_identity_encoder_decoder_batch4(td_encdec, tree):
    target, draft = td_encdec
    inputs = td.prompts([7, 3, 5, 1], 7)
    _greedy_check(target, draft, inputs, tree)
    own = _greedy_check(target, target, inputs, tree)  # the target as draft: every depth kept
    assert own.stats.alpha == 1.0
    assert int(own.stats.rounds) <= -(-16 // (len(tree) + 1))


def test_chain_shaped_tree_is_the_chain(td_encdec):
    """tree=(1, 1, 1) drafts, verifies and keeps exactly what gamma=3 does."""
    target, draft = td_encdec
    inputs = td.prompts([7, 3, 5, 1], 7)
    chain = decoding.speculative_decode(target, draft, inputs, rng=jax.random.PRNGKey(0),
                                        gamma=3, sampling=GREEDY, max_decode_len=16)
    tree = _greedy_check(target, draft, inputs, (1, 1, 1))
    for name in ("rounds", "accepted", "tested", "accepted_per_position", "generated"):
        np.testing.assert_array_equal(getattr(tree.stats, name), getattr(chain.stats, name))


@pytest.mark.parametrize("tree", [(2, 2), (3, 1, 1)])
def test_greedy_identity_decoder_only(tree):
    target, draft = td.pair(t5.DecoderOnly(tiny_config()))
    _greedy_check(target, draft, td.prompts([6, 2, 4, 1], 6), tree)


@pytest.mark.parametrize("kind", ["bigram", "prompt_lookup"])
def test_greedy_identity_with_ngram_drafts(td_encdec, kind):
    target, _ = td_encdec
    inputs = td.prompts([7, 3, 5, 1], 7)
    if kind == "bigram":
        draft = ngram.fit_bigram(np.random.default_rng(0).integers(1, 16, (20, 10)), 16)
    else:
        draft = ngram.PromptLookupDraft(16)
    _greedy_check(target, draft, inputs, (3, 2))


@pytest.mark.slow  # ~14 s; test_feature_draft's checking draft runs a tree in CI
def test_greedy_identity_with_the_target_aware_draft():
    _, target, draft = td.aware_pair()
    _greedy_check(target, draft, td.prompts([7, 3, 5, 1], 7), (2, 2, 1))


def test_nonfinite_draft_is_never_accepted(td_encdec):
    target, draft = td_encdec
    broken = draft.replace(params=jax.tree_util.tree_map(lambda x: x * jnp.nan, draft.params))
    sp = _greedy_check(target, broken, td.prompts([7, 3, 5, 1], 7), (2, 2))
    assert int(jnp.sum(sp.stats.accepted)) == 0


def test_tree_arguments_are_checked(td_encdec):
    target, draft = td_encdec
    kw = dict(rng=jax.random.PRNGKey(0), sampling=GREEDY, max_decode_len=4)
    inputs = td.prompts([3], 3)
    with pytest.raises(ValueError, match="gamma=3 disagrees"):
        decoding.speculative_decode(target, draft, inputs, gamma=3, tree=(2, 2), **kw)
    with pytest.raises(ValueError, match="lenience=1"):
        decoding.speculative_decode(target, draft, inputs, gamma=2, tree=(2, 2), lenience=0.5,
                                    **kw)
    # lenience is the verifier's own: a lenient policy given as an object is refused the same
    # way, by the tree's layout, before anything compiles
    with pytest.raises(ValueError, match=r"tree=\(2, 2\) .* needs lenience=1 \(got 0.5\)"):
        decoding.speculative_decode(target, draft, inputs, gamma=2, tree=(2, 2),
                                    verifier=verifiers.GreedyVerifier(0.5), **kw)
    with pytest.raises(ValueError, match="tree="):
        decoding.speculative_decode(target, draft, inputs, gamma=2, tree=(2, -1), **kw)
    with pytest.raises(TypeError, match="extend_tree"):
        decoding.speculative_decode(ngram.PromptLookupDraft(16), draft, inputs,
                                    gamma=2, tree=(2, 2), **kw)


# ----------------------------------------------------------------------------------------------
# Joint law of the first three sampled tokens (the chain tests' enumeration and chi-square).


@pytest.mark.parametrize("tree,name", [
    ((2, 2), "t1"),  # CI; the other pairings are slow
    pytest.param((3, 1, 1), "t0.7_topk3", marks=pytest.mark.slow),
    pytest.param((3, 1, 1), "t1", marks=pytest.mark.slow),
    pytest.param((2, 2), "t0.7_topk3", marks=pytest.mark.slow)])
def test_joint_law_of_three_tokens_matches_target(td_joint, tree, name):
    module, target, draft, enc = td_joint
    cfg = td.JOINT_CONFIGS[name]
    probs = td.exact_joint(module, target.params, enc, cfg)
    samples, stats = td.sample_three(target, draft, enc, cfg, len(tree), seed=len(tree),
                                      tree=tree)
    assert float(jnp.mean(stats.accepted)) > 0.3  # the draft is good enough to test acceptance
    assert td.joint_pvalue(samples, probs) > 1e-6


@pytest.mark.slow  # ~25-35 s; CI: the tree chi-square at T = 1 and the chain's negative control
def test_negative_control_a_sibling_tested_against_the_uncorrected_target_fails(
        td_joint, monkeypatch):
    """The classic multi-draft bug: after a sibling is rejected, test the next one against p
    again instead of the residual. The same chi-square test must catch it."""
    module, target, draft, enc = td_joint
    cfg = td.JOINT_CONFIGS["t1"]
    probs = td.exact_joint(module, target.params, enc, cfg)
    jax.clear_caches()
    monkeypatch.setattr(trees, "residual_after_rejection", lambda r, q: r)
    try:
        samples, _ = td.sample_three(target, draft, enc, cfg, 2, seed=3, tree=(2, 2))
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    assert td.joint_pvalue(samples, probs) < 1e-6


def test_per_depth_rates_of_a_target_aware_draft_follow_its_decode_rounds():
    """Depth d's rates are the d-th draft of a round along the target's text. Checked at T = 0
    against the draft's own decode mode: depth 1 reads the target's features of every earlier
    position; depth 2 then extends one token (the target's) on the draft's own hidden state."""

    from speculative.measure import acceptance  # pylint: disable=g-import-not-at-top

    _, target, draft = td.aware_pair()
    inputs = td.prompts([7, 3, 5, 1], 7, seed=2)
    sampling, n = SamplingConfig(0.0), 8
    ranks = acceptance.rank_acceptance(target, draft, [inputs], sampling, max_rank=3,
                                       max_decode_len=n, max_depth=2)
    first = acceptance.rank_acceptance(target, draft, [inputs], sampling, max_rank=3,
                                       max_decode_len=n)
    assert ranks.rates == first.rates and ranks.depth_rates[0] == first.rates
    assert first.depth_rates == () and first.theory_rates == first.rates
    assert np.asarray(ranks.theory_rates).shape == (2, 3)
    out = decoding.autoregressive_decode(target, inputs, rng=jax.random.split(
        jax.random.PRNGKey(0), 3)[1], sampling=sampling, max_decode_len=n)
    lengths = np.asarray(out.lengths)
    assert ranks.depth_positions == tuple(int(np.sum(np.maximum(lengths - d, 0)))
                                          for d in range(2))

    # Depth 2 by hand: for each position j >= 1, the text up to j - 1 with the target's
    # features (one causal extend, rewound to j), then the target's token at j - 1 on the
    # draft's own state; rank the target's argmax at j in the draft's logits.
    @jax.jit
    def by_hand(x, generated):
        tstate = target.init(target.params, x, n + 1, keep_encoded=True)
        fed = jnp.concatenate([tstate.pending[:, None], generated[:, :-1]], axis=1)
        p_logits, feats, _ = target.extend_with_features(target.params, tstate, fed,
                                                         draft.feature_layers)
        prev = jnp.pad(feats[:, :-1], ((0, 0), (1, 0), (0, 0)))
        dstate = draft.init(draft.params, x, n + 1, context=target.context(tstate))
        _, full = draft.extend(draft.params, dstate, fed, prev)

        def second(j):
            token = jax.lax.dynamic_slice_in_dim(fed, j, 1, axis=1)
            q, _ = draft.extend(draft.params, draft.rewind(full, jnp.full((4,), j)), token)
            best = jnp.argmax(p_logits[:, j], -1)
            return jnp.sum(q[:, 0] > jnp.take_along_axis(q[:, 0], best[:, None], 1), -1)

        return jax.lax.map(second, jnp.arange(1, n))  # [n - 1, B]

    rank = np.asarray(by_hand(jnp.asarray(inputs), out.tokens))
    reached, kept = np.zeros(3, int), np.zeros(3, int)
    for j in range(1, n):
        for b in np.flatnonzero(lengths > j):
            reached[:min(rank[j - 1, b], 2) + 1] += 1
            if rank[j - 1, b] < 3:
                kept[rank[j - 1, b]] += 1
    rates = np.where(reached > 0, kept / np.maximum(reached, 1), 0.0)
    np.testing.assert_allclose(ranks.depth_rates[1], rates, atol=1e-12)
    with pytest.raises(ValueError, match="max_depth=0"):
        acceptance.rank_acceptance(target, draft, [inputs], sampling, max_rank=3,
                                   max_decode_len=n, max_depth=0)


@pytest.fixture(scope="module")
def td_encdec():
    return td.pair(t5.Transformer(tiny_config()))


@pytest.fixture(scope="module")
def td_joint():
    module = t5.Transformer(tiny_config(vocab_size=td.VOCAB))
    target, draft = td.pair(module, seeds=(3, 4))
    return module, target, draft, np.array([[3, 5, 2, 7, 1]], np.int32)


@pytest.mark.parametrize("temperature", [0.0, pytest.param(1.0, marks=pytest.mark.slow)])
def test_rank_acceptance_first_rank_is_the_chain_alpha(td_encdec, temperature):
    """The per-rank rates the tree chooser reads: the first rank's is the chain's alpha along
    the same text (exactly at T = 0; within Monte Carlo error of sum min(p, q) at T = 1), and
    every later rank is a probability of what reached it."""
    from speculative.measure import acceptance  # pylint: disable=g-import-not-at-top

    target, draft = td_encdec
    inputs = td.prompts([7, 3, 5, 1, 6, 2, 4, 7], 7, seed=1)
    sampling = SamplingConfig(temperature)
    ranks = acceptance.rank_acceptance(target, draft, [inputs], sampling, max_rank=3,
                                  max_decode_len=16, seed=0)
    decode_key = jax.random.split(jax.random.PRNGKey(0), 3)[1]  # rank_acceptance's (seed 0)
    out = decoding.autoregressive_decode(target, inputs, rng=decode_key, sampling=sampling,
                                         max_decode_len=16)
    betas = np.asarray(acceptance.forced_betas(target, draft, jnp.asarray(inputs), out.tokens,
                                          sampling=sampling))
    valid = np.arange(16)[None] < np.asarray(out.lengths)[:, None]
    kept, reached = np.asarray(ranks.kept_at_rank), np.asarray(ranks.reached_rank)
    assert np.all(kept <= reached) and np.all(np.diff(reached) <= 0)
    if temperature == 0.0:  # the same decode (greedy) and the same test
        assert ranks.rates[0] == pytest.approx(betas[valid].mean())
    else:
        assert ranks.positions == int(valid.sum())  # the same text
        assert abs(ranks.rates[0] - betas[valid].mean()) < 0.08  # ~4.5 Monte Carlo SEs
