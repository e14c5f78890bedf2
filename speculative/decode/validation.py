"""Checks of the arguments a user passes to the public decode entry points, before any work.

One rule set and one wording for `decoding.autoregressive_decode`, `speculative_decode`,
`beam_search` and `speculative_beam_search`: each message names the argument, the value and
the fix. Nothing is truncated, wrapped or clipped.

Bounded work: a `max_decode_len` the call could not finish is refused before any work. Its
buffers must fit in memory (`fits_memory`), and its worst case (no row stops at EOS, so every
step runs and attends over the whole `max_decode_len` cache) must take at most `TIME_LIMIT_S`
seconds by `decode_seconds`, a lower bound from the model's size and the length at this
machine's best rate. `TIME_LIMIT_S = None` (or a larger number) lifts the cap for every call;
the checks also take `time_limit_s=`.
"""

from __future__ import annotations

import math
import os
from typing import Any, List, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers 'bfloat16' with numpy)
import numpy as np

from speculative.decode import kernel as sampling_lib

PAD_ID = 0
MAX_MEMORY_FRACTION = 0.5  # of physical memory, for one buffer a call would allocate
TIME_LIMIT_S: Optional[float] = 600.0  # the most worst-case seconds a decode call may take
# Best rates, so that `decode_seconds` is a lower bound: a CPU core streams at most ~12 GB/s
# of memory and computes ~100 GFLOP/s in float32 (a socket at most ~150 GB/s); an accelerator
# device at most 8 TB/s (HBM3e) and 2.5 PFLOP/s.
CPU_BYTES_PER_S_PER_CORE, CPU_BYTES_PER_S_MAX, CPU_FLOPS_PER_CORE = 12e9, 150e9, 100e9
DEVICE_BYTES_PER_S, DEVICE_FLOPS = 8e12, 2.5e15
DEFAULT_LIMIT = object()  # a check's time_limit_s default: TIME_LIMIT_S when it runs


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


def schedule(confidence, schedule_name: str, initial_gamma, gamma: int) -> None:
    """A `ChainDrafter`'s dynamic-gamma settings: `confidence` a number in [0, 1], `schedule`
    'constant' or 'heuristic', `initial_gamma` (heuristic only) in [1, gamma]."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float, np.floating)):
        raise TypeError(f"confidence={confidence!r} is not a number: give a float in [0, 1] "
                        "(0 = always draft gamma tokens).")
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"confidence={confidence!r} must lie in [0, 1] (0 = always draft gamma "
                         "tokens).")
    if schedule_name not in ("constant", "heuristic"):
        raise ValueError(f"schedule={schedule_name!r} is invalid: 'constant' (always gamma "
                         "drafts) or 'heuristic' (+2 / -1 per round, within [1, gamma]).")
    if initial_gamma is not None and schedule_name == "constant":
        raise ValueError(f"initial_gamma={initial_gamma!r} applies to schedule='heuristic' "
                         "only; the constant schedule always drafts gamma. Drop initial_gamma "
                         "or pass schedule='heuristic'.")
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


def cache_bytes(model, batch: int, length: int) -> Optional[int]:
    """`model.cache_bytes(batch, length)`, or None for a model that does not size its cache."""
    return model.cache_bytes(batch, length) if hasattr(model, "cache_bytes") else None


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


def check_lengths(models, inputs, max_decode_len, gamma=None, target_width=None, *,
                  time_limit_s=DEFAULT_LIMIT):
    """The lengths of a decode call, before any work: `max_decode_len` and `gamma` ints >= 1,
    the models' caches long enough, the KV caches within memory and the worst case within
    `time_limit_s` (`bounded_work`). `target_width`: drafted tokens the target verifies per
    round when it is not gamma (the nodes of a token tree)."""
    if isinstance(max_decode_len, bool) or not isinstance(max_decode_len, (int, np.integer)) \
            or max_decode_len < 1:
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
    bounded_work(models, inputs.shape[0], inputs.shape[1], max_decode_len,
                 "speculative_decode" if len(models) == 2 else "autoregressive_decode",
                 time_limit_s=time_limit_s, gamma=gamma if len(models) == 2 else None,
                 target_width=target_width)


# ----------------------------------------------------------------------------------------------
# Bounded work: a worst-case time estimate from the model's size and the length.


def _params(model) -> Any:
    """The parameters a decode step reads: the decoder's (a T5's encoder runs once)."""
    params = getattr(model, "params", None)
    return params.get("decoder", params) if isinstance(params, Mapping) else params


def _rates(models) -> tuple:
    """(bytes/s, flops/s, words): this machine's best rates for `models`' device(s)."""
    leaves = [x for m in models for x in jax.tree_util.tree_leaves(getattr(m, "params", None))
              if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)]
    devices = leaves[0].sharding.device_set if leaves else jax.local_devices()[:1]
    platform = next(iter(devices)).platform
    if platform == "cpu":
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return (min(cores * CPU_BYTES_PER_S_PER_CORE, CPU_BYTES_PER_S_MAX),
                cores * CPU_FLOPS_PER_CORE, f"{cores} CPU core{'s' * (cores > 1)}")
    return (len(devices) * DEVICE_BYTES_PER_S, len(devices) * DEVICE_FLOPS,
            f"{len(devices)} {platform.upper()} device{'s' * (len(devices) > 1)}")


def _call_seconds(model, rows: int, tokens: int, length: int, rates, gather: bool = False):
    """Least seconds of one call of `model` on `rows` x `tokens` new tokens over a cache of
    `length` slots: its parameters and its cache (read, and with `gather` reordered by beam:
    read and written again) at the best bandwidth, or its multiply-adds at the best rate."""
    leaves = jax.tree_util.tree_leaves(_params(model))
    sizes = [(math.prod(np.shape(x)), np.dtype(getattr(x, "dtype", np.float32)).itemsize)
             for x in leaves]
    param_bytes, num_params = sum(n * i for n, i in sizes), sum(n for n, _ in sizes)
    cache = model.cache_bytes(rows, length) if hasattr(model, "cache_bytes") and length else 0
    flops = rows * tokens * (2 * num_params + 2 * cache / 4 / max(rows, 1))  # QK^T and PV
    return max((param_bytes + cache * (3 if gather else 1)) / rates[0], flops / rates[1])


def decode_seconds(models: Sequence[Any], batch: int, input_length: int, max_decode_len: int,
                   gamma: Optional[int] = None, target_width: Optional[int] = None,
                   beams: int = 1, gather: bool = False, recompute: bool = False) -> float:
    """A lower bound on the seconds a decode call takes when no row stops at EOS.

    `models` = (target,) decodes one token per step (autoregressive, beam search with `beams`
    beams and, with `gather`, the cache reordered at every step); (target, draft) with `gamma`
    verifies `target_width` (default gamma) drafted tokens per round after gamma draft calls,
    so it takes at least max_decode_len / (gamma + 1) rounds. `recompute`: every step runs a
    full forward over max_decode_len positions (the host-driven reference searches). The jitted
    loops attend over the whole cache at every step, so a cache sized for a long
    `max_decode_len` costs at every step, however short the real output.
    """
    rates, rows, n = _rates(models), batch * beams, int(max_decode_len)
    target = models[0]
    if recompute:
        steps = n if gamma is None else math.ceil(n / (gamma + 1))
        return steps * _call_seconds(target, rows, n, 0, rates)
    width = target_width if target_width is not None else gamma
    extra = 0 if width is None else width + 1
    length = target.prefix_length(input_length) + n + extra + 1
    if gamma is None:
        return n * _call_seconds(target, rows, 1, length, rates, gather)
    per_round = _call_seconds(target, rows, width + 1, length, rates, gather)
    if len(models) > 1:
        draft = models[1]
        prefix = draft.prefix_length(input_length) if hasattr(draft, "prefix_length") else 0
        per_round += gamma * _call_seconds(draft, rows, 1, prefix + n + gamma + 2, rates, gather)
    return math.ceil(n / (gamma + 1)) * per_round


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def bounded_work(models: Sequence[Any], batch: int, input_length: int, max_decode_len: int,
                 what: str, *, time_limit_s=DEFAULT_LIMIT, **kwargs) -> None:
    """Refuses, naming max_decode_len, a call whose `decode_seconds(...)` exceeds
    `time_limit_s` (default `TIME_LIMIT_S`; None: no limit). The message gives the estimate,
    the largest max_decode_len that fits and the ways to lift the cap."""
    limit = TIME_LIMIT_S if time_limit_s is DEFAULT_LIMIT else time_limit_s
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, (int, float, np.number)) or limit <= 0:
        raise ValueError(f"time_limit_s={limit!r} is invalid: give seconds > 0, or None for no "
                         "limit.")
    estimate = decode_seconds(models, batch, input_length, max_decode_len, **kwargs)
    if estimate <= limit:
        return
    lo, hi = 0, int(max_decode_len)  # the largest length within the limit (monotone)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if decode_seconds(models, batch, input_length, mid,
                                             **kwargs) <= limit else (lo, mid)
    raise ValueError(
        f"max_decode_len={max_decode_len} is more than {what} can finish in reasonable time: if "
        f"no row stops at EOS it takes at least {_duration(estimate)} on {_rates(models)[2]} "
        f"(estimated from the model's size and the length: every step attends over the whole "
        f"max_decode_len cache), over the {_duration(limit)} limit. Lower max_decode_len "
        + (f"(at most {lo} fits)" if lo else "(even 1 does not fit: use a smaller model)")
        + ", or lift the cap: speculative.decode.validation.TIME_LIMIT_S = None (or more "
        "seconds).")
