"""Checks of the arguments a user passes to the public decode entry points, before any work.

One rule set and one wording for `decoding.autoregressive_decode`, `speculative_decode`,
`beam_search` and `speculative_beam_search`: each message names the argument, the value and
the fix. Nothing is truncated, wrapped or clipped.
"""

from __future__ import annotations

import os
from typing import List, Optional

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers 'bfloat16' with numpy)
import numpy as np

from speculative.decode import sampling as sampling_lib

PAD_ID = 0
MAX_MEMORY_FRACTION = 0.5  # of physical memory, for one buffer a call would allocate


def positive_int(value, name: str, what: str = "") -> int:
    """`value` as an int >= 1, or ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid: give an int >= 1"
                         + (f" ({what})." if what else "."))
    return int(value)


def batch_request(num, batch_size, skip) -> None:
    """The bundle's batch helpers' counts: `num` None (all) or >= 1, `batch_size` >= 1, `skip`
    >= 0; 0 is never a sentinel."""
    if num is not None:
        positive_int(num, "num", "examples; None for the whole split")
    positive_int(batch_size, "batch_size")
    if isinstance(skip, bool) or not isinstance(skip, (int, np.integer)) or skip < 0:
        raise ValueError(f"skip={skip!r} is invalid: give an int >= 0 (examples to pass over).")


def schedule(draft_confidence, gamma_schedule: str, initial_gamma, gamma: int) -> None:
    """`speculative_decode`'s dynamic-gamma arguments: `draft_confidence` a number in [0, 1],
    `gamma_schedule` 'constant' or 'heuristic', `initial_gamma` (heuristic only) in [1, gamma]."""
    if isinstance(draft_confidence, bool) or not isinstance(draft_confidence,
                                                              (int, float, np.floating)):
        raise TypeError(f"draft_confidence={draft_confidence!r} is not a number: give a float "
                        "in [0, 1] (0 = always draft gamma tokens).")
    if not 0.0 <= draft_confidence <= 1.0:
        raise ValueError(f"draft_confidence={draft_confidence!r} must lie in [0, 1] (0 = always "
                         "draft gamma tokens).")
    if gamma_schedule not in ("constant", "heuristic"):
        raise ValueError(f"gamma_schedule={gamma_schedule!r} is invalid: 'constant' (always "
                         "gamma drafts) or 'heuristic' (+2 / -1 per round, within [1, gamma]).")
    if initial_gamma is not None and gamma_schedule == "constant":
        raise ValueError(f"initial_gamma={initial_gamma!r} applies to gamma_schedule="
                         "'heuristic' only; the constant schedule always drafts gamma. Drop "
                         "initial_gamma or pass gamma_schedule='heuristic'.")
    if initial_gamma is not None and (isinstance(initial_gamma, bool) or not isinstance(
            initial_gamma, (int, np.integer)) or not 1 <= initial_gamma <= gamma):
        raise ValueError(f"initial_gamma={initial_gamma!r} is invalid: an int in [1, gamma="
                         f"{gamma}] (or None = gamma).")


FLOAT_DTYPES = ("float32", "bfloat16", "float16")


def float_dtype(value, name: str) -> Optional[str]:
    """`value` (None, or a float dtype or its name) as a dtype name, or an error naming it."""
    if value is None:
        return None
    try:
        dtype = np.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in FLOAT_DTYPES:
        raise ValueError(f"{name}={value!r} is not a parameter dtype: use one of "
                         f"{list(FLOAT_DTYPES)} (or None to keep the stored dtype).")
    return dtype.name


def token_ids(ids: np.ndarray, vocab_size: int, *, needs_token_per_row: bool,
              right_padded: bool = False, name: str = "inputs") -> np.ndarray:
    """Host-side check of `[batch, length]` token ids: one length for every row, integers (not
    bool or float), batch and length >= 1, every id in [0, vocab_size), (for an encoder) a
    non-padding token in every row, and (with `right_padded`, for decoder-only prompts) no 0
    before a row's last token. Returns them as int32."""
    try:
        ids = np.asarray(ids)
    except ValueError:  # ragged nested lists
        ids = None
    if ids is None or ids.dtype == object:
        raise ValueError(f"{name} must be [batch, length] token ids of one length; got rows of "
                         "different lengths: pad every row on the right with 0 to the longest.")
    if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name} have dtype {ids.dtype}: pass integer token ids (tokenize text "
                        "first, e.g. with the task's vocabulary); floats are never truncated.")
    if ids.ndim != 2 or 0 in ids.shape:
        raise ValueError(f"{name} must be [batch, length] token ids with batch, length >= 1; "
                         f"got shape {tuple(ids.shape)}.")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name} hold token ids outside [0, vocab_size={vocab_size}): min {low}, "
                         f"max {high}; encode with the model's own vocabulary (0 = padding).")
    if needs_token_per_row:
        empty = np.nonzero(~np.any(ids != PAD_ID, axis=1))[0]
        if empty.size:
            raise ValueError(
                f"{name} rows {empty.tolist()[:20]} are all padding (id 0): an encoder needs at "
                "least one token per row (e.g. EOS = 1 after the text); drop empty rows instead "
                "of decoding them. (An empty prompt is fine for a decoder-only model: it "
                "generates from BOS.)")
    if right_padded:
        held = ids != PAD_ID
        gaps = held[:, 1:] & ~held[:, :-1]  # a token right after a 0
        rows = np.nonzero(np.any(gaps, axis=1))[0]
        if rows.size:
            first = int(np.argmax(gaps[rows[0]]))
            raise ValueError(
                f"{name} rows {rows.tolist()[:20]} have a 0 before their last token (row "
                f"{int(rows[0])}: position {first}): a decoder-only prompt is its tokens, then "
                "padding (0) on the right. Left padding, or a 0 inside a prompt, would change "
                "the continuation; id 0 is padding and BOS, never a prompt token.")
    return ids.astype(np.int32)


def memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no check
        return 1 << 62


def fits_memory(num_bytes: int, what: str, fix: str, total: Optional[int] = None) -> None:
    """Refuses a buffer larger than MAX_MEMORY_FRACTION of physical memory, naming its bytes."""
    total = memory_bytes() if total is None else total
    if num_bytes > MAX_MEMORY_FRACTION * total:
        raise ValueError(f"{what} needs {num_bytes / 2**30:.1f} GiB, more than "
                         f"{MAX_MEMORY_FRACTION:.0%} of this machine's {total / 2**30:.1f} GiB; "
                         f"{fix}.")


def positive_ints(values, name: str, what: str) -> List[int]:
    """A non-empty list of ints >= 1 (a single int is accepted); errors name the bad value."""
    if isinstance(values, (int, np.integer)) and not isinstance(values, bool):
        values = [values]
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{name}={values!r} is invalid: give a list of ints >= 1 ({what}).")
    if not values:
        raise ValueError(f"{name}={list(values)!r} is empty: give at least one value ({what}), "
                         "e.g. [1, 2, 4].")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} holds {v!r}, which is invalid: each entry must be an int "
                             f">= 1 ({what}).")
    return [int(v) for v in values]


# ----------------------------------------------------------------------------------------------
# The decode loops' calls.


def check_call(models, inputs, rng, sampling) -> jax.Array:
    """Host-side checks of a decode call's arguments, before anything is cast, traced or run;
    returns `inputs` as int32. Token ids must be integers in [0, vocab_size) (nothing is
    truncated or wrapped), every encoder input row must hold a token, `rng` must be a PRNG key
    and `sampling` a `SamplingConfig`."""
    if not isinstance(sampling, sampling_lib.SamplingConfig):
        raise TypeError(f"sampling={sampling!r} is not a SamplingConfig: pass e.g. "
                        "speculative.sampling.SamplingConfig(temperature=0.0).")
    key_data = getattr(rng, "dtype", None)
    is_key = key_data is not None and (
        jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
        or (np.dtype(rng.dtype) == np.uint32 and tuple(np.shape(rng)) == (2,)))
    if not is_key:
        raise TypeError(f"rng={rng!r} is not a PRNG key: pass jax.random.PRNGKey(seed) (or "
                        "jax.random.key(seed)), one key per call.")
    if isinstance(inputs, jax.core.Tracer):  # inside the caller's jit: shapes only
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise TypeError(f"inputs have dtype {inputs.dtype}; pass integer token ids.")
        return jnp.asarray(inputs, jnp.int32)
    if isinstance(inputs, jax.Array) and not inputs.is_fully_addressable:
        # Rows spread over several processes: each checks the rows it holds.
        ids = np.concatenate([np.asarray(s.data).reshape(-1, inputs.shape[-1])
                              for s in inputs.addressable_shards])
        shape = inputs.shape
    else:
        ids, shape = inputs, _shape_of(inputs)
    prompts = len(shape) == 2 and shape[1] > 0 and models[0].prefix_length(shape[1]) > 0
    ids = token_ids(ids, models[0].vocab_size,  # (this process's rows)
                               needs_token_per_row=len(shape) == 2 and not prompts,
                               right_padded=prompts)
    if isinstance(inputs, jax.Array):  # keeps its placement (e.g. rows sharded over 'data')
        return inputs.astype(jnp.int32)
    return jnp.asarray(ids, jnp.int32)


def _shape_of(inputs) -> tuple:
    """The shape of array-like `inputs`, or () for ragged rows (token_ids refuses them)."""
    try:
        return np.shape(inputs)
    except ValueError:
        return ()


def check_lengths(models, inputs, max_decode_len, gamma=None, target_width=None):
    """`target_width`: drafted tokens the target verifies per round when it is not gamma (the
    nodes of a token tree)."""
    if not isinstance(max_decode_len, (int, np.integer)) or max_decode_len < 1:
        raise ValueError(f"max_decode_len={max_decode_len!r} is invalid: it must be an int >= 1.")
    if gamma is not None and (not isinstance(gamma, (int, np.integer)) or isinstance(gamma, bool)
                              or gamma < 1):
        raise ValueError(f"gamma={gamma!r} is invalid: draft at least one token (gamma >= 1).")
    if gamma is not None and gamma > max(max_decode_len, 64):
        raise ValueError(f"gamma={gamma} drafts more tokens per round than max_decode_len="
                         f"{max_decode_len} (and 64) allow; Theorem 3.8's best gamma is far "
                         "smaller (speculative.theory.optimal_gamma).")
    if inputs.ndim != 2:
        raise ValueError(f"inputs must be [batch, length] token ids; got shape {inputs.shape}.")
    if len(models) == 2 and models[0].vocab_size != models[1].vocab_size:
        raise ValueError(
            f"Target and draft vocabularies differ: target vocab_size={models[0].vocab_size}, "
            f"draft vocab_size={models[1].vocab_size}; the draft must use the target's vocabulary.")
    if len(models) == 2 and (models[0].prefix_length(inputs.shape[1])
                             != models[1].prefix_length(inputs.shape[1])):
        raise ValueError(
            "Target and draft read `inputs` differently (one is encoder-decoder, the other "
            "decoder-only): wrap both the same way, e.g. DecoderOnlyModel for both, an n-gram "
            "draft with decoder_only=True or a FeatureDraftConfig with cross_attention=False "
            "for a decoder-only target.")
    for name, model in zip(("target", "draft"), models):
        width = target_width if name == "target" and target_width is not None else gamma
        extra = 0 if width is None else width + 1
        need = model.prefix_length(inputs.shape[1]) + max_decode_len + extra
        if model.max_length is not None and need > model.max_length:
            raise ValueError(
                f"The {name}'s cache holds {model.max_length} tokens but this call needs {need} "
                f"(prefix {model.prefix_length(inputs.shape[1])} + max_decode_len "
                f"{max_decode_len}" + (f" + gamma+1 {extra}" if extra else "") + "); shorten the "
                "prompt or lower max_decode_len.")
        if hasattr(model, "cache_bytes"):
            cache = model.cache_bytes(inputs.shape[0], need + 1)
            fits_memory(
                cache, f"The {name}'s KV cache for batch {inputs.shape[0]} x {need + 1} "
                f"positions (max_decode_len={max_decode_len})",
                "lower max_decode_len or the batch size")
