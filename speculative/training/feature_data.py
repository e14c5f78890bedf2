"""The target's own outputs and hidden states, cached once for training a target-aware draft.

A target-aware draft (`models/feature_draft.py`) reads three things of the target: its encoder
output, the hidden states of some decoder layers, and (as the training signal) its next-token
distributions. All three are produced by one greedy (or sampled) decode of each source with the
frozen target, with the cached `extend` the decode loops use, so the features are exactly those
the draft will see at inference. They are written in shards (`shard_00000.npz`, ...), each
renamed into place when complete, so a stopped run resumes at the first missing shard:

    manifest.json        sources, feature layers, temperature, shard size, the target's name
    shard_00000.npz      src [n, L_in] int16, out [n, N] int16 (0 after EOS), out_len [n]
                         (incl. EOS), enc [sum src_len, E] and feat [sum out_len, F] as bfloat16
                         bits (uint16), top_ids [sum out_len, k] int16, top_probs float16

Row j of a sentence's `feat` (and of its `top_*`) is the target's state after reading decoder
input j (BOS, y_1, ..., y_{m-1}), the state that predicts y_{j+1}; `top_*` is its top-k
distribution at temperature 1 (the training target). A shard holds its sentences in order of
source length (the decode batches); sentences whose output reaches the length limit without EOS
are dropped and counted in the shard (`dropped`).

A decoder-only target (`t5.DecoderOnly`) has no sources and nothing to decode: its cache
holds corpus text read once by teacher forcing (`capture_lm`, one cached `extend` of
`[BOS] + chunk[:-1]` per batch, the verify call's code path), in the same format with empty
sources: `src [n, 0]`, `enc [0, E]`, `out` the chunk itself (trailing 0 = padding).

Shape legend: B batch, L length, N max_decode_len, E embed, F feature width, k top-k.
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from absl import logging

from speculative import files
from speculative.decode import contract
from speculative.models import t5

Array = jax.Array
FORMAT = 1


def _capture_fn(module: t5.Transformer, feature_layers: Tuple[int, ...], top_k: int,
                max_len: int, temperature: float):
    """A jitted decode of `[B, L_in]` sources recording every step (see the module docstring)."""
    width = len(feature_layers) * module.config.emb_dim

    @jax.jit
    def run(params, inputs, rng):
        batch = inputs.shape[0]
        variables = {"params": params}
        cache = module.apply(variables, inputs, max_len + 1, True, method="init_cache")
        bufs = dict(out=jnp.zeros((batch, max_len), jnp.int32),
                    feat=jnp.zeros((batch, max_len, width), jnp.bfloat16),
                    top_ids=jnp.zeros((batch, max_len, top_k), jnp.int32),
                    top_probs=jnp.zeros((batch, max_len, top_k), jnp.float32))

        def cond(carry):
            i, _, _, done, _, _ = carry
            return (i < max_len) & ~jnp.all(done)

        def body(carry):
            i, cache, last, done, rng, bufs = carry
            logits, feats, cache = module.apply(variables, cache, last[:, None], feature_layers,
                                                method="extend_with_features")
            logits = logits[:, 0]
            probs, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
            if temperature == 0.0:
                token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            else:
                rng, sub = jax.random.split(rng)
                token = jax.random.categorical(sub, logits / temperature).astype(jnp.int32)
            token = jnp.where(done, 0, token)

            def put(buf, value):
                return jax.lax.dynamic_update_slice_in_dim(buf, value[:, None].astype(buf.dtype),
                                                           i, axis=1)

            bufs = dict(out=put(bufs["out"], token), feat=put(bufs["feat"], feats[:, 0]),
                        top_ids=put(bufs["top_ids"], ids), top_probs=put(bufs["top_probs"], probs))
            return i + 1, cache, token, done | (token == contract.EOS_ID), rng, bufs

        init = (jnp.zeros((), jnp.int32), cache, cache.pending, jnp.zeros((batch,), bool), rng,
                bufs)
        _, cache, _, _, _, bufs = jax.lax.while_loop(cond, body, init)
        return cache.encoded.astype(jnp.bfloat16), bufs

    return run


def _lm_capture_fn(module: t5.DecoderOnly, feature_layers: Tuple[int, ...], top_k: int):
    """A jitted teacher-forced read of `[B, L]` corpus chunks (0-padded at the end)."""

    @jax.jit
    def run(params, chunks):
        batch, length = chunks.shape
        variables = {"params": params}
        cache = module.apply(variables, jnp.zeros((batch, 0), jnp.int32), length + 1,
                             method="init_cache")  # empty: BOS pending, nothing cached
        fed = jnp.concatenate([jnp.full((batch, 1), contract.BOS_ID, jnp.int32), chunks[:, :-1]], 1)
        logits, feats, _ = module.apply(variables, cache, fed, feature_layers,
                                        method="extend_with_features")
        probs, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
        return feats.astype(jnp.bfloat16), ids, probs

    return run


def capture_lm(module: t5.DecoderOnly, params, chunks: np.ndarray, *, feature_layers,
               top_k: int, batch_size: int = 64) -> Dict:
    """One shard's arrays (module docstring) for corpus `chunks [n, L]` of a decoder-only
    target: row j of a chunk's `feat` / `top_*` is the state after reading `[BOS] +
    chunk[:j]`, the one that predicts `chunk[j]`."""
    run = _lm_capture_fn(module, tuple(feature_layers), top_k)
    lengths = np.sum(chunks > 0, axis=1)
    feat, top_ids, top_probs = [], [], []
    for s in range(0, len(chunks), batch_size):
        batch = np.zeros((batch_size, chunks.shape[1]), np.int32)
        part = chunks[s:s + batch_size]
        batch[:len(part)] = part  # filler rows: zeros, dropped below
        got = jax.device_get(run(params, jnp.asarray(batch)))
        for r in range(len(part)):
            m = int(lengths[s + r])
            feat.append(np.asarray(got[0][r, :m]).view(np.uint16))
            top_ids.append(got[1][r, :m].astype(np.int16))
            top_probs.append(got[2][r, :m].astype(np.float16))
    emb = module.config.emb_dim
    return dict(src=np.zeros((len(chunks), 0), np.int16), out=chunks.astype(np.int16),
                out_len=lengths.astype(np.int32), enc=np.zeros((0, emb), np.uint16),
                feat=np.concatenate(feat), top_ids=np.concatenate(top_ids),
                top_probs=np.concatenate(top_probs), dropped=np.asarray(0))


def _bits(x) -> np.ndarray:
    return np.asarray(x).astype(ml_dtypes.bfloat16).view(np.uint16)


def from_bits(x) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32."""
    return np.asarray(x).view(ml_dtypes.bfloat16).astype(np.float32)


def capture(module: t5.Transformer, params, sources: np.ndarray, *, feature_layers, top_k: int,
            max_len: int, temperature: float, rng: Array, batch_size: int = 256) -> Dict:
    """One shard's arrays (module docstring) for `sources [n, L]` (0-padded encoder inputs)."""
    run = _capture_fn(module, tuple(feature_layers), top_k, max_len, temperature)
    lengths = np.sum(sources > 0, axis=1)
    order = np.argsort(lengths, kind="stable")
    keep_src, keep_out, enc, feat, top_ids, top_probs, out_len = [], [], [], [], [], [], []
    dropped = 0
    for k, s in enumerate(range(0, len(order), batch_size)):
        idx = order[s:s + batch_size]
        pad_len = int(-(-max(int(lengths[idx].max()), 1) // 8) * 8)
        batch = np.zeros((batch_size, pad_len), np.int32)
        batch[:len(idx), :min(pad_len, sources.shape[1])] = sources[idx, :pad_len]
        batch[len(idx):] = batch[len(idx) - 1]  # filler rows: copies, dropped below
        got_enc, bufs = jax.device_get(run(params, jnp.asarray(batch),
                                           jax.random.fold_in(rng, k)))
        for r, i in enumerate(idx):
            out = bufs["out"][r]
            eos = np.nonzero(out == contract.EOS_ID)[0]
            if not eos.size:
                dropped += 1
                continue
            m = int(eos[0]) + 1
            keep_src.append(sources[i])
            keep_out.append(out)
            out_len.append(m)
            enc.append(_bits(got_enc[r, :lengths[i]]))
            feat.append(np.asarray(bufs["feat"][r, :m]).view(np.uint16))
            top_ids.append(bufs["top_ids"][r, :m].astype(np.int16))
            top_probs.append(bufs["top_probs"][r, :m].astype(np.float16))
    out = np.zeros((len(keep_out), max_len), np.int16)
    for r, o in enumerate(keep_out):
        out[r, :out_len[r]] = o[:out_len[r]]

    def cat(parts, width, dtype):  # a shard may keep no sentence at all
        return np.concatenate(parts) if parts else np.zeros((0, width), dtype)

    emb = module.config.emb_dim
    return dict(src=np.asarray(keep_src, np.int16).reshape(-1, sources.shape[1]), out=out,
                out_len=np.asarray(out_len, np.int32), enc=cat(enc, emb, np.uint16),
                feat=cat(feat, len(feature_layers) * emb, np.uint16),
                top_ids=cat(top_ids, top_k, np.int16), top_probs=cat(top_probs, top_k, np.float16),
                dropped=np.asarray(dropped))


def build(cache_dir: str, module: t5.Transformer | t5.DecoderOnly, params, sources: np.ndarray, *,
          target_name: str, feature_layers: Sequence[int], top_k: int = 32, max_len: int = 48,
          temperature: float = 0.0, shard_size: int = 2048, seed: int = 0,
          max_shards: Optional[int] = None) -> List[str]:
    """Writes (or resumes) the shards of `sources [n, L]` into `cache_dir`; returns their paths.

    `sources` are encoder inputs for a `t5.Transformer` (decoded greedily, or sampled at
    `temperature`), or corpus chunks for a `t5.DecoderOnly` (read by teacher forcing;
    `temperature` must stay 0 and `max_len` is the chunks' width). Refuses a `cache_dir` whose
    manifest was written for other sources or settings instead of mixing two caches.
    `max_shards` stops after that many shards exist (the rest can be added by running again
    with a larger value)."""
    lm = isinstance(module, t5.DecoderOnly)
    if sources.ndim != 2 or not len(sources):
        raise ValueError(f"sources must be [n, L] {'corpus chunks' if lm else 'encoder inputs'}"
                         f" with n >= 1; got {sources.shape}.")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy outputs).")
    if lm and temperature != 0.0:
        raise ValueError(f"temperature={temperature}: a decoder-only target's cache reads "
                         "corpus text by teacher forcing; there is nothing to sample (use 0).")
    if lm:
        max_len = sources.shape[1]
    os.makedirs(cache_dir, exist_ok=True)
    manifest = dict(format=FORMAT, target=target_name, **({"teacher_forced": True} if lm else {}),
                    feature_layers=list(feature_layers),
                    emb_dim=module.config.emb_dim, top_k=top_k, max_len=max_len,
                    temperature=temperature, shard_size=shard_size, seed=seed,
                    num_sources=int(len(sources)),
                    sources_checksum=int(np.sum(sources.astype(np.int64)
                                                * (np.arange(sources.size) % 9973 + 1)
                                                .reshape(sources.shape)) % (1 << 61)))
    path = os.path.join(cache_dir, "manifest.json")
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old != manifest:
            diff = {k: (old.get(k), v) for k, v in manifest.items() if old.get(k) != v}
            raise ValueError(f"{cache_dir} holds a feature cache written with other settings "
                             f"{diff}; pass another cache_dir or delete it.")
    else:
        files.write_atomic(path, json.dumps(manifest, indent=1))
    num = -(-len(sources) // shard_size)
    if max_shards is not None:
        num = min(num, max_shards)
    paths = []
    rng = jax.random.PRNGKey(seed)
    for k in range(num):
        shard = os.path.join(cache_dir, f"shard_{k:05d}.npz")
        paths.append(shard)
        if os.path.exists(shard):
            continue
        start = time.time()
        part = sources[k * shard_size:(k + 1) * shard_size]
        if lm:
            arrays = capture_lm(module, params, part, feature_layers=feature_layers, top_k=top_k)
        else:
            arrays = capture(module, params, part, feature_layers=feature_layers, top_k=top_k,
                             max_len=max_len, temperature=temperature,
                             rng=jax.random.fold_in(rng, k))
        tmp = shard[:-4] + f".tmp-{os.getpid()}.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, shard)
        logging.info("feature cache: shard %d/%d (%d sentences, %d dropped) in %.0f s", k + 1,
                     num, len(arrays["out_len"]), int(arrays["dropped"]), time.time() - start)
        print(f"feature cache {cache_dir}: shard {k + 1}/{num} in {time.time() - start:.0f} s",
              flush=True)
    return paths


def read_manifest(cache_dir: str) -> dict:
    path = os.path.join(cache_dir, "manifest.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"No feature cache in {cache_dir} (no manifest.json); build it "
                                "first (scripts/train.py --run=feature_cache).")
    with open(path) as f:
        return json.load(f)


def load_shards(cache_dir: str, max_shards: Optional[int] = None,
                keys: Optional[Sequence[str]] = None) -> List[Dict[str, np.ndarray]]:
    """The complete shards of a cache, in order (a missing shard ends the list); `keys` reads
    only those arrays of each (an .npz is read lazily, array by array)."""
    read_manifest(cache_dir)
    shards = []
    k = 0
    while max_shards is None or k < max_shards:
        path = os.path.join(cache_dir, f"shard_{k:05d}.npz")
        if not os.path.exists(path):
            break
        with np.load(path) as data:
            shards.append({name: data[name] for name in (keys or data.files)})
        k += 1
    if not shards:
        raise FileNotFoundError(f"{cache_dir} has no complete shard yet.")
    return shards


def hot_vocabulary(cache_dir: str, size: int, vocab: int,
                   max_shards: Optional[int] = None) -> Tuple[Tuple[int, ...], float]:
    """The `size` ids of the target's `vocab` it emits most often in the cache's outputs (ties
    by id), ascending: a draft's `FeatureDraftConfig.hot_ids`; and the share of those outputs'
    tokens they cover."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= vocab:
        raise ValueError(f"size={size!r} must be an int in [1, {vocab}] (the target's "
                         "vocabulary).")
    counts = _output_counts(cache_dir, vocab, max_shards)
    order = np.lexsort((np.arange(vocab), -counts))  # most frequent first, then lower id
    ids = np.sort(order[:size])
    return tuple(int(i) for i in ids), float(counts[ids].sum() / max(counts.sum(), 1))


def _output_counts(cache_dir: str, vocab: int, max_shards: Optional[int]) -> np.ndarray:
    counts = np.zeros(vocab, np.int64)
    for shard in load_shards(cache_dir, max_shards, keys=("out", "out_len")):
        keep = np.arange(shard["out"].shape[1])[None] < shard["out_len"][:, None]
        counts += np.bincount(shard["out"][keep].astype(np.int64), minlength=vocab)[:vocab]
    return counts
