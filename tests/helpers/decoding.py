"""Decoding helpers several test files share: tiny random pairs and prompts, the exact law of
the first three sampled tokens (teacher forcing, V^2 prefixes in one batch) with its chi-square
test, a deliberately wrong kernel for negative controls, and tiny target-aware pairs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from speculative.decode import contract, drafters
from speculative.decode import kernel as sampling
from speculative.decode import loops as decoding
from speculative.decode.kernel import SamplingConfig
from speculative.models import adapters, t5
from speculative.models import feature_draft as fd
from tests.helpers import random_params, tiny_config

VOCAB = 8


N_SAMPLES = 50_000


def pair(module, seeds=(0, 1), **kw):
    adapter = (adapters.DecoderOnlyModel if isinstance(module, t5.DecoderOnly)
               else adapters.EncoderDecoderModel)
    return tuple(adapter(module, random_params(module, s), **kw) for s in seeds)


def prompts(lengths, width, seed=0):
    rng = np.random.default_rng(seed)
    out = np.zeros((len(lengths), width), np.int32)
    for b, n in enumerate(lengths):
        out[b, :n] = rng.integers(2, 16, n)
    return out


def exact_joint(module, params, enc, cfg, vocab=VOCAB):
    """P(y1, y2, y3) under the target's adjusted distributions; tokens after EOS are 0."""
    prefixes = np.array([[0, a, b] for a in range(vocab) for b in range(vocab)], np.int32)
    logits = module.apply({"params": params}, np.repeat(enc, len(prefixes), 0), prefixes)
    return joint_of_steps(logits, cfg, vocab)


def joint_of_steps(logits, cfg, vocab):
    """The chain rule over `logits [vocab * vocab, 3, vocab]`: row a * vocab + b holds the
    target's logits for y1, y2, y3 after the prefix (a, b) (y1's ignore it, y2's read a)."""
    probs = np.asarray(sampling.adjusted_probs(logits, cfg), np.float64)
    probs = probs.reshape(vocab, vocab, 3, vocab)
    joint = np.zeros((vocab,) * 3)
    eos = contract.EOS_ID
    for y1 in range(vocab):
        p1 = probs[0, 0, 0, y1]
        if y1 == eos:
            joint[y1, 0, 0] += p1
            continue
        for y2 in range(vocab):
            p2 = p1 * probs[y1, 0, 1, y2]
            if y2 == eos:
                joint[y1, y2, 0] += p2
                continue
            joint[y1, y2] += p2 * probs[y1, y2, 2]
    return joint.reshape(-1)


def joint_pvalue(samples, probs, vocab=VOCAB):
    idx = samples[:, 0] * vocab * vocab + samples[:, 1] * vocab + samples[:, 2]
    counts = np.bincount(idx, minlength=len(probs)).astype(np.float64)
    assert counts[probs == 0].sum() == 0, "an impossible sequence was generated"
    expected = probs * len(samples)
    big = expected >= 5  # pool the sparse cells into one bin (chi-square validity)
    obs, exp = counts[big], expected[big]
    if expected[~big].sum() > 0:
        obs, exp = np.r_[obs, counts[~big].sum()], np.r_[exp, expected[~big].sum()]
    exp *= obs.sum() / exp.sum()
    return stats.chisquare(obs, exp).pvalue


def sample_three(target, draft, enc, cfg, gamma, seed, tree=None, **drafting):
    """`drafting`: ChainDrafter settings (confidence, schedule, initial_gamma)."""
    inputs = np.repeat(enc, N_SAMPLES, 0)
    if drafting:
        draft, gamma = drafters.ChainDrafter(draft, gamma, **drafting), None
    out = decoding.speculative_decode(target, draft, inputs, rng=jax.random.PRNGKey(seed),
                                      gamma=gamma, sampling=cfg, max_decode_len=3, tree=tree)
    return np.asarray(out.tokens), out.stats


JOINT_CONFIGS = {
    "t1": SamplingConfig(1.0),
    "t0.7_topk3": SamplingConfig(0.7, top_k=3),
    "topp0.8": SamplingConfig(1.0, top_p=0.8),
}


_EXACT_KERNEL = sampling.speculative_sample


def kernel_resampling_from_p(p_probs, q_probs, draft_tokens, rng, lenience=1.0, **kw):
    """A classic bug: on rejection, resample from p instead of norm(max(0, p - q))."""
    n, _ = _EXACT_KERNEL(p_probs, q_probs, draft_tokens, rng, lenience, **kw)
    p_next = jnp.take_along_axis(p_probs, n[:, None, None], axis=1)[:, 0]
    return n, sampling.sample(jax.random.fold_in(rng, 7), p_next)


def sample_three_with_wrong_kernel(monkeypatch, target, draft, enc, cfg, gamma, seed):
    """`sample_three` with `kernel_resampling_from_p` in place of the exact kernel (a negative
    control: the law test must reject it); the compiled loops are dropped before and after, so
    neither the exact nor the wrong kernel's program leaks into another test."""
    jax.clear_caches()
    monkeypatch.setattr(sampling, "speculative_sample", kernel_resampling_from_p)
    try:
        samples, _ = sample_three(target, draft, enc, cfg, gamma=gamma, seed=seed)
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    return samples


@functools.lru_cache(maxsize=None)  # building the models takes seconds; they are immutable
def aware_pair(vocab=16, feature_layers=(1, 2), seed=0, decoder_only=False):
    """A tiny random target (encoder-decoder, or decoder-only) and a target-aware draft for it
    (no cross-attention for a decoder-only target)."""
    module = (t5.DecoderOnly if decoder_only else t5.Transformer)(tiny_config(vocab_size=vocab))
    target = adapters.as_decode_model(module, random_params(module, seed))
    cfg = fd.FeatureDraftConfig(vocab_size=vocab, target_emb_dim=16,
                                cross_attention=not decoder_only,
                                feature_layers=feature_layers, emb_dim=8, num_heads=2,
                                head_dim=4, mlp_dim=16, relative_attention_num_buckets=8,
                                relative_attention_max_distance=16)
    dmod = fd.FeatureDraft(cfg)
    draft = fd.FeatureDraftModel(dmod, fd.init_params(dmod, jax.random.PRNGKey(seed + 1)))
    return module, target, draft


def aware_lm_pair(vocab=16, feature_layers=(1, 2), seed=0):
    return aware_pair(vocab, feature_layers, seed, decoder_only=True)
