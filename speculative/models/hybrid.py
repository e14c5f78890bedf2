"""The hybrid draft: copy from the input where it matches, a draft model elsewhere.

Summaries copy names from their input (a docstring names the function's arguments, a CNN/DM
highlight the article's people), but only in places: prompt lookup alone (models/ngram.py)
drafts well inside a copied span and guesses blindly outside it, a small model the reverse.
`HybridDraft` is one `DecodeModel` that asks both at every position and keeps

    q_i = the copy's law      where the trailing n-gram (n >= `copy.min_ngram`) occurs in the
                              input or the text so far (one-hot on its follower, or 1 - eps)
    q_i = the model's law     elsewhere

Both parts read every token (their caches stay in step), so switching costs nothing. The
choice depends only on the tokens before position i, so q_i is a law of the context like any
draft's: speculative sampling stays exact (the target's law) whatever q is, and greedy
speculative output equals the target's greedy output. What the copy adds shows in alpha and
tokens per target call (`scripts/measure_alpha.py`), at the price of one lookup per draft
token (a vectorised compare over the input, small next to a model call).

    draft = HybridDraft(t5_draft, ngram.PromptLookupDraft(vocab_size=8000, min_ngram=2))
    out = speculative_decode(target, draft, inputs, ...)     # as any chain draft

Shape legend: B batch, K chunk, V vocab.
"""

from __future__ import annotations

from typing import Any, Tuple

import jax
import jax.numpy as jnp
from flax import struct

from speculative.models import ngram

Array = jax.Array


@struct.dataclass
class HybridState:
    """The two parts' decode states (a pytree; each leaf has batch as its leading axis)."""

    model: Any
    copy: ngram.NgramState


@struct.dataclass
class HybridDraft:
    """Prompt lookup where it matches, `model` elsewhere (module docstring).

    Attributes:
      model: the draft model (any `DecodeModel`: a T5 draft, an n-gram table).
      copy: the copying part, a `PromptLookupDraft` for the same vocabulary and mode; its
        `min_ngram` is the shortest match that is trusted (2 ignores single-token matches,
        which on text with common words mostly guess wrong).
    """

    model: Any
    copy: ngram.PromptLookupDraft

    kind = "hybrid"
    copies_input = True  # a capability the drafters read (decode/drafters.py)

    def __post_init__(self):
        if not isinstance(self.copy, ngram.PromptLookupDraft):
            raise TypeError(f"HybridDraft.copy must be an ngram.PromptLookupDraft, got "
                            f"{type(self.copy).__name__}.")
        if self.copy.vocab_size != self.model.vocab_size:
            raise ValueError(
                f"HybridDraft: the copy's vocab_size={self.copy.vocab_size} differs from the "
                f"model's vocab_size={self.model.vocab_size}; build the PromptLookupDraft with "
                "the model's vocabulary size.")
        if self.copy.prefix_length(1) != self.model.prefix_length(1):
            raise ValueError("HybridDraft: the copy and the model disagree on decoder_only; "
                             "build the PromptLookupDraft with the model's mode.")

    @property
    def params(self) -> Any:
        return self.model.params

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def max_length(self):
        return self.model.max_length

    def prefix_length(self, input_length: int) -> int:
        return self.model.prefix_length(input_length)

    def init(self, params, inputs: Array, max_len: int) -> HybridState:
        return HybridState(model=self.model.init(params, inputs, max_len),
                           copy=self.copy.init({}, inputs, max_len))

    def extend(self, params, state: HybridState, tokens: Array) -> Tuple[Array, HybridState]:
        logits, model_state = self.model.extend(params, state.model, tokens)
        found, copied, copy_state = self.copy.copy({}, state.copy, tokens)
        logits = jnp.where(found[..., None], copied, logits.astype(jnp.float32))
        return logits, HybridState(model=model_state, copy=copy_state)

    def rewind(self, state: HybridState, lengths: Array) -> HybridState:
        return HybridState(model=self.model.rewind(state.model, lengths),
                           copy=self.copy.rewind(state.copy, lengths))
