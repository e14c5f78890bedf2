"""Transformer layers with T5X's parameter names and numerics, plus a chunked KV cache.

Everything here follows `t5x/examples/t5/layers.py`:

* kernels are stored 2-D `[prod(in), prod(out)]` in float32 and cast to the compute dtype at call
  time; no biases anywhere;
* RMSNorm with eps 1e-6, statistics in float32;
* no 1/sqrt(head_dim) query scaling (T5 folds it into the query initialiser);
* one relative-position bias module per stack, shared by its layers;
* every parameter carries logical axis names (`nn.with_logical_partitioning`), so that
  `partitioning.py` can map them to a mesh with T5X's rules.

What T5X does not have (its decoding caches one token per step): a decode mode that appends K
tokens per row at that row's own position. `MultiHeadAttention.extend` writes K new keys/values
into a head-major cache `[B, H, L, D]` at `lengths[b]` with a per-row `dynamic_update_slice`
(overwrite semantics, so rewinding a row is just lowering its length: stale slots are masked,
never added to) and attends query i of row b to keys `j <= lengths[b] + i`.

Shape legend: B batch, L length (keys), K chunk (queries), H heads, D head dim, E embed, V vocab.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from speculative.decode.contract import write_rows

Array = jax.Array
DType = jnp.dtype
Initializer = Callable[..., Array]

# Large negative number used to mask attention logits (T5X uses -1e10 too).
NEG_INF = -1e10

default_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def _normalize_axes(axes, ndim: int) -> Tuple[int, ...]:
    if isinstance(axes, int):
        axes = (axes,)
    return tuple(a if a >= 0 else a + ndim for a in axes)


# The name of a DenseGeneral kernel stored `[out, in]` (`transpose_kernels`).
TRANSPOSED_KERNEL = "kernel_t"
KERNEL_LAYOUTS = ("auto", "t5x", "transposed")


def transpose_kernels(params: Any) -> Any:
    """The same weights with every DenseGeneral `kernel [in, out]` stored as `kernel_t [out, in]`.

    T5X stores a dense kernel `[in, out]`. XLA:CPU's few-row products (the 2-9 tokens of a
    verify call, run by YNNPACK) cost up to twice as much with it as with the kernel stored
    `[out, in]` and used as the dot's left operand, contracted over its minor axis (the layout
    XNNPACK-style libraries keep fully-connected weights in; docs/limits.md measures both).
    One row (a decode step) took 0.92-1.11x the T5X layout's time on the hosts measured (the
    demo times both baselines). The module needs no other setting: a
    DenseGeneral computes with `kernel_t` when its params hold one. Outputs agree with the T5X
    layout to float32 round-off (the sum order differs).
    """
    return _rename_kernels(params, "kernel", TRANSPOSED_KERNEL)


def untranspose_kernels(params: Any) -> Any:
    """The inverse of `transpose_kernels`: T5X's `[in, out]` kernels (a no-op on T5X params)."""
    return _rename_kernels(params, TRANSPOSED_KERNEL, "kernel")


def _rename_kernels(tree: Any, old: str, new: str) -> Any:
    if not isinstance(tree, Mapping):
        return tree
    out = {}
    for key, value in tree.items():
        if key == old and not isinstance(value, Mapping) and np.ndim(value) == 2:
            out[new] = jnp.transpose(jnp.asarray(value))
        else:
            out[key] = _rename_kernels(value, old, new)
    return out


def kernel_layout(params: Any) -> str:
    """'transposed' if a param tree holds `transpose_kernels`' kernels, else 't5x'."""
    paths = jax.tree_util.tree_flatten_with_path(params)[0]
    return ("transposed" if any(getattr(p[-1], "key", None) == TRANSPOSED_KERNEL
                                for p, _ in paths) else "t5x")


def resolve_kernel_layout(layout: str, *, sharded: bool = False) -> str:
    """'t5x' or 'transposed' for a `kernel_layout` setting: 'auto' is 'transposed' on a CPU
    backend without a mesh (where it is faster) and 't5x' elsewhere."""
    if layout not in KERNEL_LAYOUTS:
        raise ValueError(f"kernel_layout={layout!r} is not one of {KERNEL_LAYOUTS}.")
    if layout == "transposed" and sharded:
        raise ValueError("kernel_layout='transposed' is for unsharded models: the partitioning "
                         "rules name T5X's [in, out] kernels; use 't5x' (or 'auto') with a mesh.")
    if layout == "auto":
        return "transposed" if not sharded and jax.default_backend() == "cpu" else "t5x"
    return layout


class DenseGeneral(nn.Module):
    """A bias-free linear map over (possibly several) axes, with a 2-D stored kernel.

    The stored kernel is `[prod(in_dims), prod(features)]` exactly as in T5X checkpoints; it is
    reshaped to `in_dims + features` at call time. For q/k/v, `features=(H, D)`, so column
    `h * D + d` is head h, dim d. Params made by `transpose_kernels` hold its transpose
    `kernel_t` instead, used the same way.
    """

    features: int | Tuple[int, ...]
    axis: int | Tuple[int, ...] = -1
    dtype: DType = jnp.float32
    kernel_init: Initializer = default_kernel_init
    kernel_axes: Tuple[str, ...] = ()

    @nn.compact
    def __call__(self, inputs: Array) -> Array:
        features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
        axis = _normalize_axes(self.axis, inputs.ndim)
        in_dims = tuple(inputs.shape[a] for a in axis)
        kernel_shape = (int(np.prod(in_dims)), int(np.prod(features)))

        def init_fn(key, shape, dtype):
            # Initialise in the unflattened shape so fan-in is computed as in T5X.
            full = self.kernel_init(key, in_dims + features, dtype)
            return jnp.reshape(full, shape)

        inputs = jnp.asarray(inputs, self.dtype)
        if self.has_variable("params", TRANSPOSED_KERNEL):  # `transpose_kernels`' layout
            kernel = self.get_variable("params", TRANSPOSED_KERNEL)
            num = len(features)
            kernel = jnp.asarray(kernel, self.dtype).reshape(features + in_dims)
            # The kernel as the dot's left operand, contracted over its minor axes.
            out = jax.lax.dot_general(kernel, inputs,
                                      ((tuple(range(num, kernel.ndim)), axis), ((), ())))
            return jnp.moveaxis(out, tuple(range(num)), tuple(range(out.ndim - num, out.ndim)))
        kernel = self.param(
            "kernel",
            nn.with_logical_partitioning(init_fn, self.kernel_axes),
            kernel_shape,
            jnp.float32,
        )
        kernel = jnp.asarray(kernel, self.dtype).reshape(in_dims + features)
        contract_inputs = axis
        contract_kernel = tuple(range(len(axis)))
        return jax.lax.dot_general(inputs, kernel, ((contract_inputs, contract_kernel), ((), ())))


class RMSNorm(nn.Module):
    """T5 layer norm: `x * rsqrt(mean(x^2) + eps) * scale`; no mean subtraction, no bias."""

    epsilon: float = 1e-6
    dtype: DType = jnp.float32

    @nn.compact
    def __call__(self, x: Array) -> Array:
        x = jnp.asarray(x, jnp.float32)
        features = x.shape[-1]
        mean2 = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        y = jnp.asarray(x * jax.lax.rsqrt(mean2 + self.epsilon), self.dtype)
        scale = self.param(
            "scale",
            nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
            (features,),
            jnp.float32,
        )
        return y * jnp.asarray(scale, self.dtype)


def _activation(name: str) -> Callable[[Array], Array]:
    if name == "linear":
        return lambda x: x
    if name == "gelu":
        return functools.partial(nn.gelu, approximate=True)  # T5X: jax default, tanh form.
    if name == "relu":
        return nn.relu
    if name == "gelu_exact":
        return functools.partial(nn.gelu, approximate=False)
    if name == "silu":
        return nn.silu
    raise ValueError(
        f"Unknown MLP activation {name!r}; use one of 'relu', 'gelu', 'gelu_exact', 'silu', "
        "'linear'."
    )


class MlpBlock(nn.Module):
    """T5 MLP: `wo(prod_i act_i(wi_i(x)))`; one activation -> `wi`, several -> `wi_0`, `wi_1`..."""

    intermediate_dim: int
    activations: Sequence[str] = ("relu",)
    dtype: DType = jnp.float32
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: Array, deterministic: bool = True) -> Array:
        hidden = None
        for idx, act in enumerate(self.activations):
            name = "wi" if len(self.activations) == 1 else f"wi_{idx}"
            h = DenseGeneral(
                self.intermediate_dim, dtype=self.dtype, kernel_axes=("embed", "mlp"), name=name
            )(x)
            h = _activation(act)(h)
            hidden = h if hidden is None else hidden * h
        hidden = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))(
            hidden, deterministic=deterministic
        )
        return DenseGeneral(
            x.shape[-1], dtype=self.dtype, kernel_axes=("mlp", "embed"), name="wo"
        )(hidden)


class Embed(nn.Module):
    """Token embedding `[V, E]`; `attend` gives float32 logits against the same table."""

    num_embeddings: int
    features: int
    dtype: DType = jnp.float32

    def setup(self):
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0), ("vocab", "embed")),
            (self.num_embeddings, self.features),
            jnp.float32,
        )

    def __call__(self, ids: Array) -> Array:
        return jnp.asarray(jnp.take(self.embedding, ids, axis=0), self.dtype)

    def attend(self, query: Array) -> Array:
        """`[..., E] -> [..., V]` in float32 (T5X's `attend_dtype`)."""
        return jnp.dot(jnp.asarray(query, jnp.float32), jnp.asarray(self.embedding, jnp.float32).T)


@functools.lru_cache(maxsize=None)
def _bucket_table(bidirectional: bool, num_buckets: int, max_distance: int,
                  size: int) -> np.ndarray:
    """Bucket of every relative position `key - query` in `[-size, size]`, computed as T5X does.

    T5X computes buckets in numpy float32 (`RelativePositionBiases._relative_position_bucket`);
    computing them once here, on the host, and gathering from the table keeps the decode path
    bit-identical to the full forward (a device `log` could round differently at bucket edges).
    Index `size + rel` holds the bucket of relative position `rel`.
    """
    rel = np.arange(-size, size + 1, dtype=np.int32)
    n = -rel
    ret = np.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int32) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
        / np.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).astype(np.int32)
    val_if_large = np.minimum(val_if_large, num_buckets - 1)
    ret += np.where(is_small, n, val_if_large)
    return ret.astype(np.int32)


def relative_position_bucket(
    relative_position: np.ndarray | Array,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Array:
    """Maps `key_pos - query_pos` to a bucket id, exactly as T5 (works on traced arrays)."""
    # Beyond max_distance every bucket is saturated, so a table up to 2 * max_distance suffices.
    size = 2 * max_distance
    table = jnp.asarray(_bucket_table(bidirectional, num_buckets, max_distance, size))
    return table[jnp.clip(relative_position, -size, size) + size]


class RelativePositionBiases(nn.Module):
    """One per stack: `rel_embedding [H, num_buckets]`, gathered into `[B|1, H, K, L]` biases."""

    num_buckets: int
    max_distance: int
    num_heads: int
    dtype: DType = jnp.float32

    def setup(self):
        self.rel_embedding = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(
                nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                ("heads", "relpos_buckets"),
            ),
            (self.num_heads, self.num_buckets),
            jnp.float32,
        )

    def __call__(self, query_positions: Array, key_positions: Array, bidirectional: bool) -> Array:
        """`query_positions [B, K]`, `key_positions [B, L]` (either B may be 1) ->
        `[B, H, K, L]`."""
        rel = key_positions[:, None, :] - query_positions[:, :, None]  # [B, K, L]
        buckets = relative_position_bucket(rel, bidirectional, self.num_buckets, self.max_distance)
        bias = jnp.take(jnp.asarray(self.rel_embedding, self.dtype), buckets, axis=1)  # [H,B,K,L]
        return jnp.transpose(bias, (1, 0, 2, 3))


def dot_product_attention(
    query: Array, key: Array, value: Array, bias: Array, dtype: DType
) -> Array:
    """`query [B,K,H,D]`, `key/value [B,H,L,D]`, `bias [B|1, H|1, K, L]` -> `[B,K,H,D]`.

    No scaling. Logits and softmax are computed in float32 whatever the compute dtype. Keys and
    values are head-major (as T5X's decode cache keeps them), so both products are batched over
    (B, H). With `[B, L, H, D]` caches a single jitted extend of large_target transposed every
    layer's cache (7% of a one-token call, 15% at batch 4); inside the jitted decode loops XLA
    picks the carried cache's layout itself, and the two layouts time the same there.
    """
    logits = jnp.einsum("bqhd,bhkd->bhqk", query, key, preferred_element_type=jnp.float32)
    weights = jax.nn.softmax(logits + jnp.asarray(bias, jnp.float32), axis=-1)
    return jnp.einsum("bhqk,bhkd->bqhd", jnp.asarray(weights, dtype), value)


def mask_to_bias(mask: Array) -> Array:
    """Boolean mask (True = attend) -> additive bias (0 / -1e10) in float32."""
    return jnp.where(mask, 0.0, NEG_INF).astype(jnp.float32)


class MultiHeadAttention(nn.Module):
    """T5 multi-head attention with `query`, `key`, `value`, `out` kernels (names as T5X).

    Split into `project_kv` and `__call__` so that keys/values can come from a cache: the
    encoder-decoder attention projects the encoder output once per sequence, and the decoder
    self-attention appends K new rows per call (`extend`).
    """

    num_heads: int
    head_dim: int
    out_features: int
    dtype: DType = jnp.float32
    dropout_rate: float = 0.0

    def setup(self):
        qkv = functools.partial(
            DenseGeneral,
            features=(self.num_heads, self.head_dim),
            dtype=self.dtype,
            kernel_axes=("embed", "joined_kv"),
        )
        # T5X folds 1/sqrt(head_dim) into the query initialiser instead of scaling at run time.
        depth_scaling = float(np.sqrt(self.head_dim))

        def query_init(key, shape, dtype):
            return default_kernel_init(key, shape, dtype) / depth_scaling

        self.query = qkv(kernel_init=query_init)
        self.key = qkv()
        self.value = qkv()
        self.out = DenseGeneral(
            features=self.out_features,
            axis=(-2, -1),
            dtype=self.dtype,
            kernel_axes=("joined_kv", "embed"),
        )
        self.dropout = nn.Dropout(self.dropout_rate, broadcast_dims=(-2,))

    def project_kv(self, inputs_kv: Array) -> Tuple[Array, Array]:
        """`[B, L, E] -> (key, value)`, each head-major `[B, H, L, D]`."""
        return (jnp.swapaxes(self.key(inputs_kv), 1, 2),
                jnp.swapaxes(self.value(inputs_kv), 1, 2))

    def __call__(
        self,
        inputs_q: Array,
        key: Array,
        value: Array,
        bias: Array,
        deterministic: bool = True,
    ) -> Array:
        """Attends `inputs_q [B, K, E]` to `key/value [B, H, L, D]` under `bias [B|1,H|1,K,L]`."""
        query = self.query(inputs_q)
        x = dot_product_attention(query, key, value, bias, self.dtype)
        return self.dropout(self.out(x), deterministic=deterministic)

    def extend(
        self,
        inputs_q: Array,
        cache_kv: Tuple[Array, Array],
        lengths: Array,
        bias: Array,
        deterministic: bool = True,
    ) -> Tuple[Array, Tuple[Array, Array]]:
        """Self-attention over a cache: writes K new keys/values per row at `lengths[b]`.

        Args:
          inputs_q: `[B, K, E]` the new tokens' activations.
          cache_kv: `(key, value)`, each `[B, H, L, D]`; rows hold `lengths[b]` valid entries.
          lengths: `[B]` int32, the number of valid cache entries per row before this call.
          bias: `[B, H, K, L]`, relative position bias plus the mask `j <= lengths[b] + i`.
        Returns:
          `([B, K, E], (key, value))` with the K new entries written (lengths are not stored
          here: the caller advances them once for all layers).
        """
        new_k, new_v = self.project_kv(inputs_q)
        key = write_rows(cache_kv[0], new_k, lengths, axis=2)
        value = write_rows(cache_kv[1], new_v, lengths, axis=2)
        return self(inputs_q, key, value, bias, deterministic), (key, value)
