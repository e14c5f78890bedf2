"""Negligible-cost drafts (paper §3.6 items 2-3): unigram, bigram and prompt lookup.

Each draft is a `DecodeModel` (decoding.py) that plugs into `speculative_decode` unchanged: a
`flax.struct` pytree whose `params` are traced under jit and whose settings are static. Its state,
`NgramState`, mirrors `t5.DecodeCache`: `history [B, L]` holds the decoder-side sequence except the
`pending` token, `lengths [B]` counts the tokens held per row, and `extend` writes its K tokens at
each row's own `lengths` (like the KV cache), so `rewind` only moves `lengths`.

    UnigramDraft   logits[b, i] = log P(x)                   params {'log_probs': [V]}
    BigramDraft    logits[b, i] = log P(x | tokens[b, i])    params {'log_probs': [V, V]}
    PromptLookupDraft  copy the token that followed the longest, most recent earlier occurrence
                   of the n-gram ending at tokens[b, i]      params {} (parameter-free)

Modes (`decoder_only`, static): an encoder-decoder draft starts with an empty history and BOS
pending (`prefix_length` 0); a decoder-only draft holds `[BOS] + prompt[:-1]` with the prompt's
last token pending (`prefix_length` = input length + 1), exactly like `t5.DecoderOnly.init_cache`.
Use the mode of the target you pair the draft with.

Worked example (encoder-decoder, K = 2): after `init`, lengths = 0, pending = BOS. `extend([BOS,
a])` writes history[0:2] = [BOS, a]; logits[:, 0] is the next-token guess after BOS, logits[:, 1]
after BOS a; lengths = 2. `rewind(state, 1)` keeps BOS; slot 1 is ignored from then on.

Prompt lookup (HF's prompt-lookup decoding). The context of query i is the encoder input (its
padding dropped, preceded by a virtual BOS so that "copy the input from its start" is found at
the first step) followed by the decoder history up to and including tokens[:, i]. For n from
`max_ngram` down to `min_ngram`, the trailing n-gram (inside the decoder history) is searched in
the context, each occurrence lying within one segment and followed by a token of that segment;
the most recent occurrence of the longest matching n wins and its follower is predicted. Example:
input [5, 6, 7, 1]; history [BOS, 9, 5, 6]: the 3-gram [9, 5, 6] never occurred, the 2-gram [5, 6]
did (input 0:2), so the guess is 7. The search is one vectorised comparison over the `[B, K,
L_ctx]` context per n (n is static and small), so it is jittable with static shapes.

Memory: the bigram table is V * V float32, 256 MiB for V = 8192 and 4 GiB for T5's 32128; use
it for vocabularies up to ~8k (or where that memory is acceptable). The unigram table is V floats.

Smoothing: add-k, `P(x | c) = (count(c, x) + k) / (count(c) + k V)`, default k = 0.01. Alpha is
sum_x min(p, q) (Theorem 3.5), so the smoothing mass k V / (count(c) + k V) that a context moves
to unseen tokens is nearly all lost from alpha. Laplace (k = 1) would lose most of it for large V
(a bigram context seen 1000 times with V = 8192 keeps only 11% on its observed continuations);
k = 0.01 keeps 93% there, while every token keeps q > 0 and an unseen context is uniform.

Shape legend: B batch, L length, K chunk, V vocab.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from speculative.decode.contract import write_rows

Array = jax.Array

BOS_ID = 0
PAD_ID = 0
DEFAULT_SMOOTHING = 0.01


@struct.dataclass
class NgramState:
    """Decode state of an n-gram draft (a pytree; every leaf has batch as its leading axis).

    Attributes:
      lengths: `[B]` int32, tokens held in `history` per row (later slots are stale).
      pending: `[B]` int32, the last prefix token, not yet in the history (as `t5.DecodeCache`).
      history: `[B, L]` int32, the decoder-side sequence: BOS first, then prompt / generated text.
      context: `[B, L_in]` int32 encoder input tokens (0 = padding) used by prompt lookup;
        `[B, 0]` for a decoder-only draft, whose prompt is already in `history`.
    """

    lengths: Array
    pending: Array
    history: Array
    context: Array

    @property
    def max_length(self) -> int:
        return self.history.shape[1]


class _HistoryDraft:
    """`init` / `rewind` / `prefix_length` shared by every draft here (a mixin, not a pytree).

    Subclasses are `struct.dataclass`es with `params`, `decoder_only` and `max_length` fields.
    """

    def prefix_length(self, input_length: int) -> int:
        return input_length + 1 if self.decoder_only else 0

    def init(self, params, inputs: Array, max_len: int) -> NgramState:
        """Encoder-decoder: empty history, BOS pending. Decoder-only: prefill `[BOS] + prompt`."""
        del params
        inputs = jnp.asarray(inputs, jnp.int32)
        batch, input_len = inputs.shape
        history = jnp.zeros((batch, max_len), jnp.int32)
        if not self.decoder_only:
            return NgramState(lengths=jnp.zeros((batch,), jnp.int32),
                              pending=jnp.full((batch,), BOS_ID, jnp.int32),
                              history=history, context=inputs)
        if input_len + 1 > max_len:
            raise ValueError(
                f"Prompt length {input_len} (+1 for BOS) does not fit the draft history of "
                f"max_len={max_len}; increase max_len or shorten the prompt.")
        seq = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), inputs], axis=1)
        num = 1 + jnp.sum(inputs > 0, axis=1).astype(jnp.int32)  # tokens incl. BOS
        pending = jnp.take_along_axis(seq, (num - 1)[:, None], axis=1)[:, 0]
        # Slot num - 1 holds the pending token too; it is stale (masked) until extend rewrites it.
        history = history.at[:, :input_len + 1].set(seq)
        return NgramState(lengths=num - 1, pending=pending, history=history,
                          context=jnp.zeros((batch, 0), jnp.int32))

    def rewind(self, state: NgramState, lengths: Array) -> NgramState:
        """Rolls every row back to `lengths[b]` tokens; later slots are ignored, not cleared."""
        return state.replace(lengths=jnp.asarray(lengths, jnp.int32))

    @staticmethod
    def _write(state: NgramState, tokens: Array) -> NgramState:
        """Writes `tokens [B, K]` at each row's `lengths` and advances it by K."""
        tokens = jnp.asarray(tokens, jnp.int32)
        history = write_rows(state.history, tokens, state.lengths)
        return state.replace(history=history, lengths=state.lengths + tokens.shape[1])


def _static_field(default):
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class UnigramDraft(_HistoryDraft):
    """Context-free draft: every position gets the same smoothed unigram log-probabilities."""

    params: Any  # {'log_probs': [V] float32}
    decoder_only: bool = _static_field(False)
    max_length: Optional[int] = _static_field(None)

    kind = "unigram"

    @property
    def vocab_size(self) -> int:
        return int(self.params["log_probs"].shape[-1])

    def extend(self, params, state: NgramState, tokens: Array) -> Tuple[Array, NgramState]:
        state = self._write(state, tokens)
        log_probs = jnp.asarray(params["log_probs"], jnp.float32)
        return jnp.broadcast_to(log_probs, tokens.shape + log_probs.shape), state

    def save(self, path: str) -> None:
        _save(path, self.kind, self.params["log_probs"])

    @classmethod
    def load(cls, path: str, *, decoder_only: bool = False,
             max_length: Optional[int] = None) -> "UnigramDraft":
        return cls({"log_probs": _load(path, cls.kind, 1)}, decoder_only, max_length)


@struct.dataclass
class BigramDraft(_HistoryDraft):
    """`logits[b, i] = log P(next | tokens[b, i])`, a row lookup in a `[V, V]` table."""

    params: Any  # {'log_probs': [V, V] float32}, rows = previous token
    decoder_only: bool = _static_field(False)
    max_length: Optional[int] = _static_field(None)

    kind = "bigram"

    @property
    def vocab_size(self) -> int:
        return int(self.params["log_probs"].shape[-1])

    def extend(self, params, state: NgramState, tokens: Array) -> Tuple[Array, NgramState]:
        state = self._write(state, tokens)
        table = jnp.asarray(params["log_probs"], jnp.float32)
        return jnp.take(table, jnp.asarray(tokens, jnp.int32), axis=0), state

    def save(self, path: str) -> None:
        _save(path, self.kind, self.params["log_probs"])

    @classmethod
    def load(cls, path: str, *, decoder_only: bool = False,
             max_length: Optional[int] = None) -> "BigramDraft":
        return cls({"log_probs": _load(path, cls.kind, 2)}, decoder_only, max_length)


@struct.dataclass
class PromptLookupDraft(_HistoryDraft):
    """Parameter-free copying draft (paper §3.6 item 3; HF prompt-lookup decoding).

    Attributes:
      vocab_size: V, the target's vocabulary size.
      max_ngram, min_ngram: n-gram lengths searched, longest first (defaults 3 and 1).
      eps: mass spread over the other V - 1 tokens when a match is found. 0 gives a one-hot
        distribution (-inf logits elsewhere, which the sampling code handles); with no match the
        distribution is uniform.
    """

    vocab_size: int = _static_field(None)
    params: Any = struct.field(pytree_node=True, default_factory=dict)
    decoder_only: bool = _static_field(False)
    max_length: Optional[int] = _static_field(None)
    max_ngram: int = _static_field(3)
    min_ngram: int = _static_field(1)
    eps: float = _static_field(0.0)

    copies_input = True  # a capability the drafters read (decode/drafters.py)

    def __post_init__(self):
        if not isinstance(self.vocab_size, (int, np.integer)) or self.vocab_size < 2:
            raise ValueError(f"PromptLookupDraft.vocab_size={self.vocab_size!r} is invalid: pass "
                             "the target's vocabulary size (an int >= 2).")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"PromptLookupDraft: need 1 <= min_ngram <= max_ngram, got min_ngram="
                f"{self.min_ngram}, max_ngram={self.max_ngram}.")
        if not 0.0 <= self.eps < 1.0:
            raise ValueError(f"PromptLookupDraft.eps={self.eps!r} is invalid: it must lie in "
                             "[0, 1) (0 = one-hot on the copied token).")

    def extend(self, params, state: NgramState, tokens: Array) -> Tuple[Array, NgramState]:
        found, logits, state = self.copy(params, state, tokens)
        uniform = jnp.full_like(logits, -np.log(self.vocab_size))
        return jnp.where(found[..., None], logits, uniform), state

    def copy(self, params, state: NgramState,
             tokens: Array) -> Tuple[Array, Array, NgramState]:
        """`extend` before its fallback: `(found [B, K], logits [B, K, V], state)`, the logits
        the copy's (one-hot, or 1 - eps on it) where `found`, junk elsewhere. The hybrid draft
        (models/hybrid.py) puts a model's logits where nothing was found."""
        del params
        old_lengths = state.lengths
        state = self._write(state, tokens)
        found, predicted = self.lookup(state, old_lengths, tokens.shape[1])
        vocab = self.vocab_size
        if self.eps == 0.0:
            hit, miss = 0.0, -jnp.inf
        else:
            hit, miss = np.log1p(-self.eps), np.log(self.eps / (vocab - 1))
        one_hot = jax.nn.one_hot(predicted, vocab, dtype=bool)  # [B, K, V]
        return found, jnp.where(one_hot, hit, miss).astype(jnp.float32), state

    def lookup(self, state: NgramState, start: Array, num: int) -> Tuple[Array, Array]:
        """Copy predictions for the `num` tokens at history slots `start[b] + i`.

        Returns `(found [B, K] bool, predicted [B, K] int32)`; `predicted` is 0 where not found.
        Only history slots `<= start + i` are read, so stale slots past `lengths` never match.
        """
        history = state.history
        batch = history.shape[0]
        if self.decoder_only:
            seq, real, offset = history, jnp.ones_like(history, bool), 0
        else:  # [virtual BOS, encoder input, history]
            ctx = state.context
            bos = jnp.full((batch, 1), BOS_ID, jnp.int32)
            seq = jnp.concatenate([bos, ctx, history], axis=1)
            real = jnp.concatenate(
                [jnp.ones((batch, 1), bool), ctx > 0, jnp.ones_like(history, bool)], axis=1)
            offset = 1 + ctx.shape[1]
        length = seq.shape[1]
        j = jnp.arange(length)  # candidate end of an earlier occurrence
        in_history = j >= offset
        cur = offset + start[:, None] + jnp.arange(num)[None]  # [B, K] current token's slot

        # The follower j + 1 exists in j's segment (and precedes or is the current token).
        next_real = jnp.concatenate([real[:, 1:], jnp.zeros((batch, 1), bool)], axis=1)
        follows_ctx = (j + 1 < offset)[None, None] & next_real[:, None]
        follows_hist = in_history[None, None] & (j[None, None] + 1 <= cur[..., None])
        match = follows_ctx | follows_hist  # [B, K, L_ctx]

        found = jnp.zeros(cur.shape, bool)
        predicted = jnp.zeros(cur.shape, jnp.int32)
        for m in range(self.max_ngram):  # the n-gram has n = m + 1 tokens; j - m is its start
            shifted = jnp.pad(seq, ((0, 0), (m, 0)), constant_values=-1)[:, :length]
            shifted_real = jnp.pad(real, ((0, 0), (m, 0)))[:, :length]
            same_segment = (j - m >= 0) & ((j - m >= offset) == in_history)
            want = jnp.take_along_axis(seq, jnp.maximum(cur - m, 0), axis=1)  # [B, K]
            trailing_ok = cur - m >= offset  # the trailing n-gram lies in the history
            match = (match & (shifted[:, None] == want[..., None]) & shifted_real[:, None]
                     & same_segment[None, None] & trailing_ok[..., None])
            if m + 1 >= self.min_ngram:  # longer n overrides shorter
                last = jnp.max(jnp.where(match, j, -1), axis=-1)  # most recent occurrence
                hit = last >= 0
                follower = jnp.take_along_axis(seq, jnp.clip(last + 1, 0, length - 1), axis=1)
                predicted = jnp.where(hit, follower, predicted)
                found = found | hit
        return found, predicted


# ----------------------------------------------------------------------------------------------
# Fitting, saving, loading.


def _sequences(token_id_sequences, vocab_size: int) -> list:
    """Lists/arrays of ids -> list of 1-D int64 arrays, trailing padding (0) dropped."""
    if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
        raise ValueError(f"vocab_size={vocab_size!r} is invalid: use the target's vocabulary "
                         "size (an int >= 2).")
    if isinstance(token_id_sequences, (np.ndarray, jax.Array)):
        token_id_sequences = np.asarray(token_id_sequences)
        if token_id_sequences.ndim == 1:
            token_id_sequences = token_id_sequences[None]
    out = []
    for k, seq in enumerate(token_id_sequences):
        seq = np.asarray(seq).reshape(-1)
        if seq.size and not np.issubdtype(seq.dtype, np.integer):
            raise ValueError(f"Sequence {k} has dtype {seq.dtype}; pass integer token ids.")
        seq = seq.astype(np.int64)
        if seq.size and (seq.min() < 0 or seq.max() >= vocab_size):
            raise ValueError(
                f"Sequence {k} has token ids in [{seq.min()}, {seq.max()}], outside the "
                f"vocabulary [0, {vocab_size}); check vocab_size or the tokenizer.")
        nonzero = np.flatnonzero(seq)
        out.append(seq[:nonzero[-1] + 1] if nonzero.size else seq[:0])
    return out


def _check_smoothing(smoothing: float) -> float:
    if not isinstance(smoothing, (int, float, np.floating)) or not smoothing > 0:
        raise ValueError(f"smoothing={smoothing!r} is invalid: add-k smoothing needs k > 0 "
                         f"(default {DEFAULT_SMOOTHING}).")
    return float(smoothing)


def _log_normalise(counts: np.ndarray, smoothing: float) -> np.ndarray:
    counts = counts.astype(np.float64) + smoothing
    return (np.log(counts) - np.log(counts.sum(-1, keepdims=True))).astype(np.float32)


def unigram_counts(token_id_sequences: Iterable, vocab_size: int) -> np.ndarray:
    """`[V]` int64 token counts over the sequences (trailing padding dropped)."""
    seqs = _sequences(token_id_sequences, vocab_size)
    flat = np.concatenate(seqs) if seqs else np.zeros((0,), np.int64)
    return np.bincount(flat, minlength=vocab_size).astype(np.int64)


def bigram_counts(token_id_sequences: Iterable, vocab_size: int) -> np.ndarray:
    """`[V, V]` float32 counts of (previous, next), each sequence preceded by BOS = 0."""
    counts = np.zeros((vocab_size, vocab_size), np.float32)
    for seq in _sequences(token_id_sequences, vocab_size):
        prev = np.concatenate([[BOS_ID], seq[:-1]])
        np.add.at(counts, (prev, seq), 1.0)
    return counts


def fit_unigram(token_id_sequences: Iterable, vocab_size: int,
                smoothing: float = DEFAULT_SMOOTHING, *, decoder_only: bool = False,
                max_length: Optional[int] = None) -> UnigramDraft:
    """Add-k unigram over decoder-side target sequences (lists or a right-padded array)."""
    smoothing = _check_smoothing(smoothing)
    counts = unigram_counts(token_id_sequences, vocab_size)
    return UnigramDraft({"log_probs": jnp.asarray(_log_normalise(counts, smoothing))},
                        decoder_only, max_length)


def fit_bigram(token_id_sequences: Iterable, vocab_size: int,
               smoothing: float = DEFAULT_SMOOTHING, *, decoder_only: bool = False,
               max_length: Optional[int] = None) -> BigramDraft:
    """Add-k bigram over decoder-side target sequences; P(first token | BOS) is learned.

    The table is `[V, V]` float32 (V^2 * 4 bytes: 256 MiB at V = 8192); unseen contexts are
    uniform.
    """
    smoothing = _check_smoothing(smoothing)
    counts = bigram_counts(token_id_sequences, vocab_size)
    return BigramDraft({"log_probs": jnp.asarray(_log_normalise(counts, smoothing))},
                       decoder_only, max_length)


def load(path: str, *, decoder_only: bool = False, max_length: Optional[int] = None):
    """The n-gram draft saved at `path` (`.save`), as the class its `kind` names."""
    try:
        with np.load(os.fspath(path), allow_pickle=False) as data:
            kind = str(data["kind"]) if "kind" in data else None
    except FileNotFoundError:
        raise FileNotFoundError(f"No n-gram draft at {path!r}; fit one with fit_unigram(...) "
                                "or fit_bigram(...) and .save(path).") from None
    classes = {"unigram": UnigramDraft, "bigram": BigramDraft}
    if kind not in classes:
        raise ValueError(f"{path!r} holds no n-gram draft (kind={kind!r}); expected one of "
                         f"{sorted(classes)}, written by UnigramDraft/BigramDraft.save.")
    return classes[kind].load(path, decoder_only=decoder_only, max_length=max_length)


def _save(path: str, kind: str, log_probs) -> None:
    with open(os.fspath(path), "wb") as f:  # keeps the path as given (no added '.npz')
        np.savez(f, kind=np.asarray(kind), log_probs=np.asarray(log_probs, np.float32))


def _load(path: str, kind: str, ndim: int) -> Array:
    try:
        with np.load(os.fspath(path), allow_pickle=False) as data:
            saved_kind = str(data["kind"]) if "kind" in data else None
            log_probs = np.asarray(data["log_probs"]) if "log_probs" in data else None
    except FileNotFoundError:
        raise FileNotFoundError(
            f"No {kind} draft at {path!r}; create one with fit_{kind}(...).save(path).") from None
    if saved_kind != kind or log_probs is None or log_probs.ndim != ndim:
        raise ValueError(
            f"{path!r} does not hold a {kind} draft (kind={saved_kind!r}, log_probs "
            f"{None if log_probs is None else log_probs.shape}); load it with the matching class "
            f"or refit with fit_{kind}.")
    if ndim == 2 and log_probs.shape[0] != log_probs.shape[1]:
        raise ValueError(f"{path!r}: a bigram table must be [V, V], got {log_probs.shape}.")
    return jnp.asarray(log_probs, jnp.float32)
