"""Feature-cache helpers (tests/training, tests/experiments): source batches, a cache built by
the target-aware draft's data pipeline, a target that ends its outputs (the `tiny_target`
fixture, tests/conftest.py), and a fake cache of outputs only."""

import json

import jax
import numpy as np

from speculative import decoding
from speculative.decode import contract
from speculative.decode.kernel import SamplingConfig
from speculative.models import t5
from speculative.training import feature_data
from tests.helpers import random_params, tiny_config


def sources(n=12, width=6, seed=0):
    rng = np.random.default_rng(seed)
    out = np.zeros((n, width), np.int32)
    for b in range(n):
        k = int(rng.integers(1, width + 1))
        out[b, :k] = rng.integers(2, 16, k)
    return out


def build_cache(path, module, params, **kw):
    kw = {**dict(target_name="tiny", feature_layers=(1, 2), top_k=4, max_len=30,
                 shard_size=5), **kw}
    return feature_data.build(str(path), module, params, sources(), **kw)


def ending_target():
    """A random target that ends its outputs: its EOS logit is a scaled copy of the logit of
    the token its greedy outputs emit most, so EOS wins wherever that token would."""
    module = t5.Transformer(tiny_config(vocab_size=16))
    params = random_params(module, 0)
    ar = decoding.autoregressive_decode(
        decoding.EncoderDecoderModel(module, params), sources(), rng=jax.random.PRNGKey(0),
        sampling=SamplingConfig(0.0), max_decode_len=30)
    common = int(np.argmax(np.bincount(np.asarray(ar.tokens).ravel(), minlength=16)[2:])) + 2
    kernel = params["decoder"]["logits_dense"]["kernel"]
    params["decoder"]["logits_dense"] = {
        "kernel": kernel.at[:, contract.EOS_ID].set(kernel[:, common] * 1.5)}
    return module, params


def fake_cache(path, outputs):
    """A cache directory holding only what the hot vocabulary reads: outputs and lengths."""
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps({"format": feature_data.FORMAT}))
    width = max(len(o) for o in outputs)
    out = np.zeros((len(outputs), width), np.int16)
    for i, o in enumerate(outputs):
        out[i, :len(o)] = o
    np.savez(path / "shard_00000.npz", out=out,
             out_len=np.asarray([len(o) for o in outputs], np.int32))
    return str(path)
