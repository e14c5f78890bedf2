"""T5X-named parameter trees, as both checkpoint modules (`checkpoints`, `hf_checkpoints`) see them.

A tree is nested dicts of arrays with T5X names; flattened, its keys are name tuples such as
`('decoder', 'layers_0', 'mlp', 'wi_0', 'kernel')`, written `decoder/layers_0/mlp/wi_0/kernel`
in messages. Here: `CheckpointError` (what every reader raises), dtypes by name (`'bfloat16'`,
...), the leaf read on demand from an array in memory (an HF tensor, an inline msgpack array),
and `validate_params`, which checks a tree's names and shapes against the model.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

import flax.linen as nn
import ml_dtypes
import numpy as np
from flax import traverse_util

from speculative.models import t5

Key = Tuple[str, ...]


class CheckpointError(ValueError):
    """A checkpoint is corrupt, incomplete or does not match the model; the message says how."""


def _dtype(d) -> np.dtype:
    d = d.decode() if isinstance(d, bytes) else d
    if isinstance(d, str) and d not in ("finfo", "iinfo") and hasattr(ml_dtypes, d):
        return np.dtype(getattr(ml_dtypes, d))  # 'bfloat16', 'float8_e4m3fn', ...
    return np.dtype(d)


def _name(keys: Key) -> str:
    return "/".join(keys)


_flatten = traverse_util.flatten_dict  # {'a': {'b': x}} <-> {('a', 'b'): x}
_unflatten = traverse_util.unflatten_dict


class _ArrayLeaf:
    """An array fetched on demand (HF tensors), with a transpose and scale to apply."""

    def __init__(self, get: Callable[[], np.ndarray], shape, dtype, transpose=False, scale=None,
                 copy=True):
        self.get, self.transpose, self.scale, self.copy = get, transpose, scale, copy
        self.shape, self.dtype = tuple(shape)[::-1] if transpose else tuple(shape), _dtype(dtype)

    def read(self, dtype=None, index=None) -> np.ndarray:
        a = self.get()
        a = a.T if self.transpose else a
        if index is not None:  # a safetensors/msgpack leaf is in memory whole; keep the block
            a = a[tuple(index)]
        if self.scale is not None:
            a = (a.astype(np.float32) * np.float32(self.scale)).astype(a.dtype)
        return np.array(a, dtype=dtype or a.dtype, order="C", copy=self.copy or None)


@functools.lru_cache(maxsize=8)
def _expected(kind: str, config: t5.T5Config) -> Dict[Key, Any]:
    module = (t5.DecoderOnly if kind == "DecoderOnly" else t5.Transformer)(config)
    return _flatten(t5.param_shapes(module))  # jax.eval_shape: nothing is allocated


def validate_params(params, module_or_config, *, source: Optional[str] = None) -> None:
    """Checks names and shapes against `t5.param_shapes`; raises one error listing every problem.

    `module_or_config` is a `T5Config` (meaning `Transformer(config)`), a `Transformer` or
    `DecoderOnly`, or a tree of expected shapes. `params` may hold arrays or anything with
    `.shape` (e.g. `load_metadata`'s ShapeDtypeStructs). Each missing, extra and mis-shaped
    parameter is listed, e.g. `decoder/layers_3/mlp/wi_0/kernel: expected (512, 1024), got ...`.
    """
    m = module_or_config
    expected = (_expected("Transformer", m) if isinstance(m, t5.T5Config) else
                _expected(type(m).__name__, m.config) if isinstance(m, nn.Module) else _flatten(m))
    got = _flatten(params)
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    wrong = [k for k in expected if k in got and tuple(got[k].shape) != tuple(expected[k].shape)]
    if not (missing or extra or wrong):
        return
    lines = [f"  missing {_name(k)}: expected {tuple(expected[k].shape)}" for k in missing]
    lines += [f"  extra {_name(k)}: {tuple(got[k].shape)}, not in the model" for k in extra]
    lines += [f"  {_name(k)}: expected {tuple(expected[k].shape)}, got {tuple(got[k].shape)}"
              for k in wrong]
    odd, logits, hints = missing + extra, ("decoder", "logits_dense", "kernel"), []
    if logits in odd:
        hints.append(f"use logits_via_embedding={logits in missing} (the checkpoint "
                     f"{'ties' if logits in missing else 'does not tie'} logits to the embedding)")
    if any(len(k) > 2 and k[-2] in ("wi", "wi_0") for k in odd):
        hints.append("one MLP activation ('relu',) has mlp/wi, two ('gelu', 'linear') have "
                     "mlp/wi_0 and mlp/wi_1")
    if any(k[-1] == "kernel_t" for k in extra):
        hints.append("kernel_t is a dense kernel stored [out, in], as a model loaded on a CPU "
                     "holds it (layers.transpose_kernels); T5X names it kernel, [in, out]. Save "
                     "such params with speculative.checkpoints.save_t5x(params, dir), or pass "
                     "speculative.models.layers.untranspose_kernels(params)")
    elif wrong or any(len(k) > 1 and k[1].startswith("layers_") for k in odd):
        hints.append("check emb_dim, num_heads, head_dim, mlp_dim, vocab_size and the layer "
                     "counts, or pick the matching preset")
    raise CheckpointError(
        f"Parameters from {source or 'the given tree'} do not match the model ({len(missing)} "
        f"missing, {len(extra)} extra, {len(wrong)} mis-shaped):\n" + "\n".join(lines)
        + "".join(f"\nHint: {h}." for h in hints))
