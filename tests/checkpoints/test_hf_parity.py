"""Our T5 logits equal HF transformers' PyTorch T5 on the same weights (an independent reference).

Weights go HF -> `checkpoints.from_hf_t5` -> our `Transformer`, for a T5 1.1-style model (gated
GELU, untied `lm_head`, unscaled) and a T5 1.0-style one (ReLU, tied and scaled by d_model**-0.5).
Sequences of 40 with `relative_attention_max_distance=16` exercise the logarithmic position
buckets; encoder rows are padded; `num_heads * d_kv != d_model`. HF configs are built locally with
random init (no download). Tolerance 1e-4 in float32.
"""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from speculative.checkpoints import hf as hf_checkpoints  # noqa: E402
from speculative.checkpoints import param_trees  # noqa: E402
from speculative.decode import contract  # noqa: E402
from speculative.models import t5  # noqa: E402

ATOL = 1e-4
torch.set_num_threads(1)


def _hf_model(kind: str, seed: int = 0):
    """A random tiny HF T5; 'v1_1' unties `lm_head` (transformers 5.x ties it by default)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=48, d_model=16, d_kv=4, dropout_rate=0.0, num_layers=2,
                  num_decoder_layers=3, relative_attention_max_distance=16)
    if kind == "v1_1":
        cfg = transformers.T5Config(**common, num_heads=3, d_ff=24, feed_forward_proj="gated-gelu",
                                    relative_attention_num_buckets=16, tie_word_embeddings=False)
    else:
        cfg = transformers.T5Config(**common, num_heads=4, d_ff=32, feed_forward_proj="relu",
                                    relative_attention_num_buckets=8, tie_word_embeddings=True)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    if kind == "v1_1":
        model.lm_head.weight = torch.nn.Parameter(torch.randn(48, 16) * 0.3)
    return model


def _inputs(seed: int, dec_len: int):
    rng = np.random.default_rng(seed)
    enc = rng.integers(2, 48, size=(3, 40)).astype(np.int32)
    for row, length in enumerate((40, 23, 5)):
        enc[row, length:] = 0  # padding
    dec = rng.integers(1, 48, size=(3, dec_len)).astype(np.int32)
    dec[:, 0] = contract.BOS_ID
    return enc, dec


def _hf_logits(model, enc, dec):
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(enc).long(),
                    attention_mask=torch.from_numpy(enc != 0).long(),
                    decoder_input_ids=torch.from_numpy(dec).long())
    return out.logits.numpy()


def _ours(model):
    hf_config = model.config.to_dict()
    params = hf_checkpoints.from_hf_t5(model.state_dict(), hf_config)
    config = hf_checkpoints.config_from_hf(hf_config, params)
    param_trees.validate_params(params, config)
    return config, params


@pytest.mark.parametrize("kind", ["v1_1", "v1_0"])
def test_transformer_logits_match_hf(kind):
    model = _hf_model(kind)
    config, params = _ours(model)
    assert config.logits_via_embedding == (kind == "v1_0")
    assert config.mlp_activations == (("gelu", "linear") if kind == "v1_1" else ("relu",))
    apply = jax.jit(t5.Transformer(config).apply)
    for dec_len in (1, 9, 40):
        enc, dec = _inputs(dec_len, dec_len)
        want = _hf_logits(model, enc, dec)
        got = np.asarray(apply({"params": params}, enc, dec))
        assert np.abs(want).max() > 1.0  # not trivially small
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"{kind} L={dec_len}")


@pytest.mark.parametrize("kind", ["v1_1", "v1_0"])
def test_decode_mode_matches_hf(kind):
    """Encoder once + `extend` in chunks of 1, 7 and 32 tokens gives HF's teacher-forced logits."""
    model = _hf_model(kind, seed=1)
    config, params = _ours(model)
    module = t5.Transformer(config)
    enc, dec = _inputs(7, 40)
    want = _hf_logits(model, enc, dec)
    variables = {"params": params}
    cache = jax.jit(lambda v, e: module.apply(v, e, 48, method="init_cache"))(variables, enc)
    extend = jax.jit(lambda v, c, x: module.apply(v, c, x, method="extend"))
    got, start = [], 0
    for size in (1, 7, 32):
        logits, cache = extend(variables, cache, dec[:, start:start + size])
        got.append(np.asarray(logits))
        start += size
    np.testing.assert_allclose(np.concatenate(got, axis=1), want, rtol=0, atol=ATOL)


@pytest.mark.parametrize("kind", ["v1_1", "v1_0"])
def test_decoder_only_matches_hf_with_zeroed_cross_attention(kind):
    """`DecoderOnly` against HF's decoder stack with every cross-attention output zeroed.

    HF has no decoder-only T5, but in `T5ForConditionalGeneration` each decoder layer adds
    `EncDecAttention.o(attention)` to the residual stream. With every `o` weight zero that term
    is exactly 0, so the HF decoder computes precisely a decoder-only T5 stack (causal
    self-attention with the unidirectional relative bias, MLP, final norm, output layer) and the
    encoder and its input do not matter. Our random `DecoderOnly` params are mapped to HF names by
    `checkpoints.hf.to_hf_t5` (which maps whatever subset of the tree it gets), loaded over a random
    HF model, and the logits compared.
    """
    model = _hf_model(kind, seed=2)
    config, _ = _ours(model)
    module = t5.DecoderOnly(config)
    rng = np.random.default_rng(3)
    shapes = t5.param_shapes(module)
    params = jax.tree_util.tree_map(
        lambda s: (rng.standard_normal(s.shape) * 0.5).astype(np.float32), shapes)
    state = {k: torch.from_numpy(v.copy()) for k, v in hf_checkpoints.to_hf_t5(params).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected
    assert all(k.startswith("encoder.") or "EncDecAttention" in k or "layer.1.layer_norm" in k
               or k in ("lm_head.weight", "decoder.embed_tokens.weight") for k in missing), missing
    with torch.no_grad():
        for block in model.decoder.block:
            block.layer[1].EncDecAttention.o.weight.zero_()
    if config.logits_via_embedding:
        assert model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr()
    enc, dec = _inputs(4, 40)
    want = _hf_logits(model, enc, dec)
    got = np.asarray(jax.jit(module.apply)({"params": params}, dec))
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
