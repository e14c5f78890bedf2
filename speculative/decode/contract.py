"""The decode contract: what the decode loops need from a model, and nothing model-specific.

A model the loops can drive (a `DecodeModel`) is a pytree with

    init(params, inputs [B, L_in], max_len) -> state       # encoder pass / prompt prefill
    extend(params, state, tokens [B, K]) -> (logits [B, K, V] f32, state)
    rewind(state, lengths [B]) -> state                     # per-row rollback
    prefix_length(input_length) -> int                      # cache entries before decoding

and `params`, `vocab_size`, `max_length` (None = unbounded). A state exposes `lengths [B]`
(tokens in its cache) and `pending [B]` (the last prefix token, not yet in the cache). Optional:
`cache_bytes(batch, length)` (sizes the cache before anything is allocated).

What some drafters need beyond that is declared as a capability, a small Protocol checked once
per call by `require` (an error names the missing methods):

    FeatureTarget   a target a target-aware draft reads: init_for_draft, context,
                    pending_features, extend_with_features, feature_dim, release_context
    TreeTarget      a target that verifies a token tree in one forward: extend_tree, keep_path
    BlockDraft      a draft that gives a whole block's laws in one call: extend_block
    UnrolledDraft   a target-aware draft whose deeper drafts can be teacher-forced in one
                    call: unrolled_logits
    SharedRows      a model whose state has parts every row of one input shares (an
                    encoder-decoder's cross-attention keys and values): shared, reorder; beam
                    search reorders beams without moving them (`reorder_rows`)

Token conventions (T5's): id 0 is padding and BOS, id 1 is EOS.

The T5 adapters live with the models (`speculative/models/adapters.py`); n-gram tables and the
target-aware draft implement the contract themselves.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, Protocol, Sequence, Tuple

import jax
import jax.numpy as jnp

Array = jax.Array

BOS_ID = 0
PAD_ID = 0
EOS_ID = 1


class DecodeModel(Protocol):
    """What the decode loops need from a model (see the module docstring)."""

    params: Any
    vocab_size: int
    max_length: Optional[int]

    def init(self, params, inputs: Array, max_len: int) -> Any: ...

    def extend(self, params, state, tokens: Array) -> Tuple[Array, Any]: ...

    def rewind(self, state, lengths: Array) -> Any: ...

    def prefix_length(self, input_length: int) -> int: ...


class FeatureTarget(Protocol):
    """A target whose hidden states a target-aware draft reads (docs/design.md)."""

    def init_for_draft(self, params, inputs: Array, max_len: int,
                       feature_layers: Sequence[int] = ()) -> Any: ...

    def context(self, state) -> Any: ...

    def pending_features(self, state, feature_layers: Sequence[int]) -> Array: ...

    def extend_with_features(self, params, state, tokens: Array,
                             feature_layers: Sequence[int]) -> Tuple[Array, Array, Any]: ...

    def feature_dim(self, feature_layers: Sequence[int]) -> int: ...

    def release_context(self, state) -> Any: ...


class TreeTarget(Protocol):
    """A target that scores a token tree in one forward and keeps one path of it."""

    def extend_tree(self, params, state, tokens: Array, tree,
                    feature_layers: Sequence[int] = ()) -> Tuple[Array, Any, Any]: ...

    def keep_path(self, state, starts: Array, offsets: Array) -> Any: ...


class SharedRows(Protocol):
    """A model whose decode state has parts shared by all rows of one input."""

    def shared(self, state) -> Any: ...

    def reorder(self, state, rows: Array, shared) -> Any: ...


def missing(obj, capability) -> Tuple[str, ...]:
    """The methods of Protocol `capability` that `obj` lacks."""
    names = [n for n in capability.__dict__ if not n.startswith("_")]
    return tuple(n for n in names if not callable(getattr(obj, n, None)))


def require(target, capability, needed_for: str) -> None:
    """TypeError naming what `target` lacks of `capability` (e.g. `TreeTarget`), if anything."""
    lacks = missing(target, capability)
    if lacks:
        raise TypeError(
            f"{needed_for} needs a target with {capability.__name__}'s methods; "
            f"{type(target).__name__} lacks {', '.join(lacks)}. The T5 adapters "
            "(EncoderDecoderModel, DecoderOnlyModel) have them.")


def reads_target(draft) -> bool:
    """Whether draft model `draft` is target-aware (reads the target's context and features).
    Only drafters (decode/drafters.py) ask; everything else asks a drafter
    (`drafters.as_drafter(draft, gamma).reads_target`)."""
    return bool(getattr(draft, "reads_target", False))


class BlockDraft(Protocol):
    """A draft that gives the laws of a whole block of drafts in one call
    (models/block_draft.py)."""

    def extend_block(self, params, state, tokens: Array, features: Optional[Array],
                     num_placeholders: int, num_tokens: Optional[Array] = None
                     ) -> Tuple[Array, Any]:
        """Reads the committed `tokens [B, K]` (row b's first `num_tokens[b]`) and returns
        `(logits [B, 1 + num_placeholders, V] of q_1.., state holding the real tokens)`."""


class UnrolledDraft(Protocol):
    """A target-aware draft whose deeper drafts read its own states, teacher-forced in one call
    (models/feature_draft.py, models/block_draft.py): per-depth acceptance can be measured."""

    def unrolled_logits(self, params, context, tokens: Array, features: Optional[Array],
                        depth: int) -> Array:
        """`[depth, B, L, V]`: row d - 1 the d-th draft of a round started at each position."""


def drafts_blocks(draft) -> bool:
    """Whether `draft` proposes a whole block of drafts in one call (`BlockDraft`)."""
    return not missing(draft, BlockDraft)


def check_target_aware(target, draft) -> None:
    """A target-aware draft needs a target that returns its context and features
    (`FeatureTarget`), of the width and depth the draft was built for."""
    require(target, FeatureTarget, "A draft that reads the target's features")
    layers = tuple(draft.feature_layers)
    try:
        width = target.feature_dim(layers)
    except ValueError as e:  # a layer this target lacks: the draft belongs to another target
        raise ValueError(f"{e} The draft reads target layers {layers}: it was trained for "
                         "another target (a bundled draft's card names its target, e.g. "
                         "large_feature_draft belongs to large_target).") from None
    if layers and draft.feature_dim != width:
        raise ValueError(
            f"The target-aware draft reads {draft.feature_dim} features from target layers "
            f"{layers}; this target gives {width} there. Use the draft trained for this target.")


def take_rows(state: Any, index: Array) -> Any:
    """Rows `index` of a decode state, every leaf (all have batch first): a state repeated per
    beam or per tree path, or the rows of the kept ones."""
    return jax.tree_util.tree_map(lambda x: jnp.take(x, index, axis=0), state)


def write_rows(cache: Array, update: Array, starts: Array, axis: int = 1) -> Array:
    """Per-row overwrite along `axis`: `cache[b, starts[b] : starts[b] + K] = update[b]` for
    `axis=1` (`cache [B, L, ...]`, `update [B, K, ...]`), `cache[b, :, starts[b] : ...]` for a
    head-major key/value cache `[B, H, L, D]` (`axis=2`). `starts [B]`. Like
    `lax.dynamic_update_slice`, a start past `L - K` is clamped; callers allocate caches with
    room for the largest chunk.
    """
    if axis < 1:
        raise ValueError(f"write_rows axis={axis}: axis 0 is the batch; give the length axis.")

    def one(c, u, s):
        return jax.lax.dynamic_update_slice_in_dim(c, u.astype(c.dtype), s, axis=axis - 1)

    return jax.vmap(one)(cache, update, starts)


def reorder_rows(model, state: Any, rows: Array, shared: Any = None) -> Any:
    """Rows `rows` of `model`'s decode state, for beams (or proposed paths) of the same inputs.
    With `SharedRows` the shared parts do not move: they are `shared`, already in the result's
    row order (default: the state's own, for a reorder within its rows). Otherwise the state
    moves whole."""
    if missing(model, SharedRows):
        return take_rows(state, rows)
    return model.reorder(state, rows, model.shared(state) if shared is None else shared)


def shared_parts(model, state: Any, rows: Optional[Array] = None) -> Any:
    """`model`'s shared parts of `state` (`SharedRows.shared`), of its rows `rows` if given, or
    None for a model whose state moves whole: what `reorder_rows` takes to put rows of another
    state in this order."""
    if missing(model, SharedRows):
        return None
    shared = model.shared(state)
    return shared if rows is None else take_rows(shared, rows)


# ----------------------------------------------------------------------------------------------
# Compiling per class.


def class_key(*trees) -> tuple:
    """The class of every node of `trees`' structures (None for a leaf). jax (0.10) compares the
    tree structures of two flax struct classes with the same fields as equal while hashing them
    apart, so a jit cache can hand a subclass that overrides a method (a model's `rewind`, a
    drafter's `propose`) the program traced for its parent, or the reverse; a static argument
    holding this key keeps their programs apart (classes compare by identity)."""

    def walk(treedef):
        data = treedef.node_data()
        return ((None if data is None else data[0]),
                tuple(walk(child) for child in treedef.children()))

    return tuple(walk(jax.tree_util.tree_structure(t)) for t in trees)


def jit_by_class(fn: Callable, static_argnames: Sequence[str] = ()) -> Callable:
    """`jax.jit(fn, static_argnames)` whose compile cache is also keyed on `class_key` of its
    positional arguments (models, drafters, states): one program per class, never another's.
    Every jitted function that takes a model or drafter goes through here."""

    def keyed(*args, classes, **kwargs):
        del classes  # the cache key only
        return fn(*args, **kwargs)

    jitted = jax.jit(keyed, static_argnames=tuple(static_argnames) + ("classes",))
    # A static argument given by position is passed on by name (with those after it).
    names = [p.name for p in inspect.signature(fn).parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    first = min((names.index(n) for n in static_argnames if n in names), default=len(names))

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if len(args) > first:
            kwargs.update(zip(names[first:], args[first:]))
            args = args[:first]
        return jitted(*args, classes=class_key(*args), **kwargs)

    return call
