"""Read and write T5 parameters: T5X legacy (msgpack + zarr), Orbax (OCDBT), HF safetensors.

`load_params(path)` detects the format and returns the `target` tree as
nested dicts of numpy arrays with T5X names. `path` is a model dir (its largest
`checkpoint_<step>`; `.tmp-*` dirs are ignored), a step dir, the msgpack `checkpoint` file, an
Orbax item dir (`.../state`) or an HF dir (model.safetensors + config.json):

    params = load_params('gs://t5-data/pretrained_models/t5x/t5_1_1_small', config=preset(...))
    params = load_params('/hf/flan-t5-small', dtype='bfloat16')
    shapes = load_metadata(path)              # ShapeDtypeStructs; reads no array data
    save_t5x(params, '/ckpt/mine', step=0)    # legacy format version 3, readable by t5x

Arrays are read one at a time straight into the result (the msgpack is streamed, zarr arrays go
through tensorstore), so a checkpoint is never held twice; optimizer state is never read.

Here: the T5X legacy and Orbax readers, the format detection, `load_params` / `load_metadata`
and the T5X writer `save_t5x`. The Hugging Face side (state-dict and config.json mapping, the
safetensors reader, `save_hf_t5`) is `checkpoints.hf`, what both share (`CheckpointError`,
`validate_params`) `checkpoints.param_trees`; import their names from there.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import os
import re
import shutil
import time
from typing import Any, Dict, Mapping, Optional, Tuple

import jax
import ml_dtypes
import msgpack
import numpy as np
import tensorstore as ts
from absl import logging
from flax import serialization
from tqdm import tqdm

from speculative.checkpoints import config_gin, paths
from speculative.checkpoints.hf import _hf_leaves, config_from_hf
from speculative.checkpoints.param_trees import (
    CheckpointError,
    Key,
    _ArrayLeaf,
    _dtype,
    _flatten,
    _name,
    _unflatten,
    validate_params,
)
from speculative.decode import validation
from speculative.models import layers, t5

__all__ = ["load_params", "load_metadata", "save_t5x", "check_t5x_target"]

_CHUNK_BYTES = 64 * 1024 * 1024  # T5X `_DESIRED_CHUNK_SIZE_BYTES`
_RECOPY = "The copy is incomplete or corrupt: copy the checkpoint directory again."


# ---------------------------------------------------------------- streaming msgpack reader
_BIN_HEADER = {0xC4: 2, 0xC5: 3, 0xC6: 5}  # msgpack bin8/16/32: marker + length bytes


def _ext_hook(code: int, data: bytes):
    """flax's ExtType 1 (ndarray) / 3 (scalar), packed `(shape, dtype, bytes)`: one copy."""
    if code not in (1, 3):
        return complex(*msgpack.unpackb(data)) if code == 2 else msgpack.ExtType(code, data)
    head = msgpack.Unpacker(raw=False)
    head.feed(data[:1024])
    if head.read_array_header() != 3:
        raise ValueError("an inline array is not (shape, dtype, data)")
    shape, dtype = tuple(head.unpack()), _dtype(head.unpack())
    start = head.tell() + _BIN_HEADER.get(data[head.tell()], len(data) + 1)
    if start + math.prod(shape) * dtype.itemsize != len(data):
        raise ValueError(f"an inline {dtype.name} array of shape {shape} is truncated")
    out = np.empty(shape, dtype)
    out.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8, out.nbytes, start)
    return out


def _read_msgpack(path: str) -> dict:
    """The top-level dict of a flax/T5X msgpack, streamed from the file; `optimizer` holds
    only `target` (its `state` and the top-level `state`/`flax_mutables` are skipped unread)."""
    with paths.open_file(path) as f:
        u = msgpack.Unpacker(f, raw=False, strict_map_key=False, ext_hook=_ext_hook,
                             max_buffer_size=2**31 - 1)
        try:
            tree = {}
            for _ in range(u.read_map_header()):
                key = u.unpack()
                if key in ("state", "flax_mutables"):
                    u.skip()
                elif key != "optimizer":
                    tree[key] = u.unpack()
                else:
                    tree[key] = {}
                    for _ in range(u.read_map_header()):
                        sub = u.unpack()
                        tree[key][sub] = u.unpack() if sub == "target" else u.skip()
            with contextlib.suppress(msgpack.OutOfData):
                u.skip()
                raise ValueError("garbage after the data")
        except (msgpack.UnpackException, ValueError, TypeError, KeyError, IndexError) as e:
            why = "the file is truncated" if isinstance(e, msgpack.OutOfData) else e
            raise CheckpointError(f"{path} is not a valid msgpack checkpoint ({why}). {_RECOPY}") \
                from None
    return tree


# ---------------------------------------------------------------- leaves (one array each)
class _TsLeaf:
    """A zarr array opened through tensorstore; shape/dtype from the msgpack when recorded."""

    def __init__(self, name, spec, where, shape=None, dtype=None, context=None):
        self.name, self.spec, self.where, self.context = name, spec, where, context
        kv = spec["kvstore"]
        self.loc = (f"{kv['base']} key {kv['path']}" if kv["driver"] == "ocdbt" else
                    f"gs://{kv['bucket']}/{kv['path']}" if kv["driver"] == "gcs" else kv["path"])
        self.recorded = None if shape is None else tuple(shape)
        self.recorded_dtype = None if dtype is None else _dtype(dtype)
        self.shape = self.recorded if shape is not None else tuple(self.store.shape)
        self.dtype = _dtype(dtype if dtype is not None else self.store.dtype.numpy_dtype)

    @functools.cached_property
    def store(self):
        try:
            return ts.open(self.spec, open=True, read=True, context=self.context).result()
        except ValueError as e:
            what = "does not exist" if "NOT_FOUND" in str(e) else f"cannot be opened ({e})"
            raise CheckpointError(f"Parameter {self.name}: its zarr array {self.loc} {what} "
                                  f"(referenced by {self.where}). {_RECOPY}") from None

    def read(self, dtype=None, index=None) -> np.ndarray:
        """The array (cast to `dtype`), or only its block `index` (a tuple of slices: what one
        device holds), so a sharded load reads each shard and never the whole array."""
        store = self._checked_store
        if dtype is not None and _dtype(dtype) != store.dtype.numpy_dtype:
            store = ts.cast(store, _dtype(dtype))
        try:
            return (store if index is None else store[tuple(index)]).read().result()
        except ValueError as e:
            raise CheckpointError(f"Parameter {self.name}: a chunk of {self.loc} is corrupt or "
                                  f"truncated ({e}). {_RECOPY}") from None

    @functools.cached_property
    def _checked_store(self):
        """The opened store, after its shape, dtype and chunk files were checked (once)."""
        store = self.store
        if self.recorded is not None and tuple(store.shape) != self.recorded:
            raise CheckpointError(
                f"Parameter {self.name}: {self.where} records shape {self.recorded} but "
                f"{self.loc}.zarray says {tuple(store.shape)}: the zarr directory belongs to "
                f"another checkpoint. {_RECOPY}")
        if store.dtype.numpy_dtype == np.uint16:  # bfloat16 as stored by T5X format version 2
            raise CheckpointError(f"Parameter {self.name}: {self.loc} is uint16; re-save it.")
        if self.recorded_dtype is not None and self.recorded_dtype != store.dtype.numpy_dtype:
            raise CheckpointError(
                f"Parameter {self.name}: {self.where} records dtype {self.recorded_dtype} but "
                f"{self.loc}.zarray stores {store.dtype.numpy_dtype}: the zarr directory belongs "
                f"to another checkpoint or was rewritten. {_RECOPY}")
        meta = store.spec().to_json().get("metadata", {})
        grid = [math.ceil(s / c) for s, c in zip(meta.get("shape", []), meta.get("chunks", []))]
        if (self.spec["driver"] == "zarr" and meta.get("fill_value") is None and grid
                and meta.get("dimension_separator") == "." and math.prod(grid) <= 100_000):
            present = {k.decode() for k in store.kvstore.list().result()}
            missing = [k for k in map(".".join, itertools.product(*[map(str, range(g)) for g
                                                                    in grid])) if k not in present]
            if missing:  # zarr would silently read them as zeros
                raise CheckpointError(f"Parameter {self.name}: {len(missing)} chunk file(s) "
                                      f"missing from {self.loc} (e.g. {missing[:3]}). {_RECOPY}")
        return store


def _ts_read_spec(spec: Mapping[str, Any], ckpt_dir: str) -> Dict[str, Any]:
    """The tensorstore spec that opens the T5X msgpack leaf `spec` of the step dir `ckpt_dir`.

    T5X records paths relative to the step dir, in `kvstore.path` (or a top-level `path` before
    tensorstore 0.1.14) under a `file`, `gfile` or `gcs` (dummy bucket) driver; as in T5X, where
    `ckpt_dir` lives decides the driver."""
    kv = spec.get("kvstore")
    rel = kv.get("path") if isinstance(kv, Mapping) else re.sub(r"^g?file://", "", kv or "") or None
    rel = spec.get("path") if rel is None else rel
    if not isinstance(rel, str):
        raise CheckpointError(f"A tensorstore spec in {ckpt_dir} has no path: {dict(spec)}")
    full = rel if rel.startswith(("gs://", "/")) else ckpt_dir.rstrip("/") + "/" + rel.strip("/")
    return {"driver": spec.get("driver", "zarr"), "kvstore": paths.kvstore(full)}


def _legacy_leaves(path: str, context) -> Dict[Key, Any]:
    tree = _read_msgpack(path)
    if "version" in tree:
        if not isinstance(tree["version"], int) or tree["version"] < 2:
            raise CheckpointError(f"{path}: T5X checkpoint version {tree['version']!r} is not "
                                  "supported (t5x rejects versions < 2 too).")
        optimizer = tree.get("optimizer")
        target = optimizer.get("target") if isinstance(optimizer, Mapping) else None
    else:  # a plain flax checkpoint: a train state, variables, or the params themselves
        target = tree.get("target", tree.get("params", tree) if len(tree) == 1 else tree)
    if not isinstance(target, Mapping):
        raise CheckpointError(f"{path} has no parameter tree under optimizer/target (top-level "
                              f"keys: {sorted(map(str, tree))}).")
    ckpt_dir = path.rsplit("/", 1)[0] if "/" in path else "."
    is_spec = lambda v: "driver" in v and ("kvstore" in v or "path" in v)  # noqa: E731
    leaves: Dict[Key, Any] = {}
    for keys, v in _flatten(target, is_leaf=lambda _, v: is_spec(v) or
                            "__msgpack_chunked_array__" in v).items():
        if isinstance(v, Mapping) and is_spec(v):
            meta = v.get("metadata") or {}
            leaves[keys] = _TsLeaf(_name(keys), _ts_read_spec(v, ckpt_dir), path,
                                   meta.get("shape"), v.get("dtype", meta.get("dtype")), context)
        elif isinstance(v, Mapping):  # flax's __msgpack_chunked_array__
            chunks = [v["chunks"][str(i)] for i in range(len(v["chunks"]))]
            shape = tuple(v["shape"][str(i)] for i in range(len(v["shape"])))
            leaves[keys] = _ArrayLeaf(lambda c=chunks, s=shape: np.concatenate(c).reshape(s),
                                      shape, chunks[0].dtype, copy=False)
        elif isinstance(v, (np.ndarray, int, float)):
            a = np.asarray(v)
            leaves[keys] = _ArrayLeaf(lambda a=a: a, a.shape, a.dtype, copy=False)
        else:
            raise CheckpointError(f"{path}: parameter {_name(keys)} holds {str(v)[:80]!r}, "
                                  "neither an array nor a tensorstore spec.")
    return leaves


def _orbax_leaves(item_dir: str, context) -> Dict[Key, Any]:
    """`target.*` arrays of an Orbax PyTree item (OCDBT, or one zarr dir per array)."""
    with paths.open_file(item_dir + "/_METADATA") as f:
        try:
            meta = json.load(f)
            entries = [[str(k["key"]) for k in e["key_metadata"]]
                       for e in meta["tree_metadata"].values()]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{item_dir}/_METADATA is not Orbax metadata ({e}). {_RECOPY}") \
                from None
    ocdbt = meta.get("use_ocdbt", True) and "manifest.ocdbt" in (paths.listdir(item_dir) or [])
    base = item_dir if item_dir.startswith("gs://") else "file://" + os.path.abspath(item_dir)
    # T5X's train state keeps the parameters under `target` (its `state.*`, the optimizer, is
    # never opened); a tree saved directly is the parameters, or a flax `{'params': ...}`.
    tops = {keys[0] for keys in entries}
    top = "target" if "target" in tops else "params" if tops == {"params"} else None
    leaves = {}
    for keys in entries:
        if top is None or keys[0] == top:
            name = ".".join(keys)
            kv = ({"driver": "ocdbt", "base": base, "path": name + "/"} if ocdbt
                  else paths.kvstore(item_dir + "/" + name))
            spec = {"driver": "zarr3" if meta.get("use_zarr3") else "zarr", "kvstore": kv}
            keys = keys if top is None else keys[1:]
            leaves[tuple(keys)] = _TsLeaf(_name(keys), spec, item_dir, context=context)
    return leaves


def _locate(path: str) -> Tuple[str, str]:
    """(format, where): 'legacy' msgpack file, 'orbax' item dir or 'hf' dir."""
    path = os.fspath(path).rstrip("/") or "/"
    if paths.is_file(path):
        return ("hf", os.path.dirname(path)) if path.endswith(".safetensors") else ("legacy", path)
    entries = paths.listdir(path)
    if entries is None:
        raise FileNotFoundError(
            f"Checkpoint path {path} does not exist. Pass a T5X model dir, a checkpoint_<step> "
            "dir, its msgpack `checkpoint` file, or an HF dir (model.safetensors + config.json).")
    hf = "config.json" in entries and bool(set(_HF_WEIGHTS) & set(entries))
    steps = [(int(m.group(1)), e) for e in entries if (m := re.fullmatch(r"checkpoint_(\d+)", e))]
    t5x = [e for e in ("checkpoint", "_METADATA") if e in entries]
    t5x += ["state/"] if "state" in entries and "_METADATA" in (
        paths.listdir(path + "/state") or []) else []
    t5x += [max(steps)[1]] if steps else []
    if hf and t5x:
        raise CheckpointError(
            f"{path} holds both an HF model ({', '.join(e for e in entries if e in _HF_WEIGHTS)} "
            f"+ config.json) and a T5X checkpoint ({', '.join(t5x)}), which may be different "
            f"models. Pass the one you mean: {path}/{t5x[-1].rstrip('/')} (T5X) or "
            f"{path}/model.safetensors (HF); better, move one into a directory of its own.")
    if "checkpoint" in entries and paths.is_file(path + "/checkpoint"):
        return "legacy", path + "/checkpoint"
    if "_METADATA" in entries:
        return "orbax", path
    if "state/" in t5x:
        return "orbax", path + "/state"
    if hf:
        return "hf", path
    if steps:
        return _locate(path + "/" + max(steps)[1])
    unfinished = [e for e in entries if re.fullmatch(r"checkpoint_-?\d+(\.tmp-.*)?", e)]
    raise FileNotFoundError(
        f"{path} holds no checkpoint: expected a msgpack `checkpoint` file, an Orbax `state/` "
        f"item, checkpoint_<step> dirs, or model.safetensors + config.json (an HF model saved "
        f"as pytorch_model.bin needs save_pretrained again); found {entries[:10]}."
        + (f" {unfinished[:3]} are interrupted saves (.tmp-) or not a step >= 0: save again."
           if unfinished else ""))


_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def _leaves(path):
    """(leaves by T5X key, HF config dict or None, where) of any supported checkpoint."""
    fmt, where = _locate(path)
    if fmt == "hf":
        return (*_hf_leaves(where), where)
    reader = _legacy_leaves if fmt == "legacy" else _orbax_leaves
    return _t5x_layout(reader(where, ts.Context()), where), None, where


class _TransposedLeaf:
    """A stored `kernel_t [out, in]` read as T5X's `kernel [in, out]`."""

    def __init__(self, leaf):
        self.leaf, self.shape, self.dtype = leaf, tuple(leaf.shape)[::-1], leaf.dtype

    def read(self, dtype=None, index=None) -> np.ndarray:
        block = self.leaf.read(dtype, None if index is None else tuple(index)[::-1])
        return np.ascontiguousarray(block.T)


def _t5x_layout(leaves: Dict[Key, Any], where: str) -> Dict[Key, Any]:
    """Leaves with the names `t5.Transformer` / `t5.DecoderOnly` use: T5X's decoder-only
    network keeps its embedding at `decoder/token_embedder` (ours: `token_embedder`, as the
    encoder-decoder's), and `kernel_t` (a CPU-loaded model's `[out, in]` kernels,
    `layers.transpose_kernels`, saved as they were) is read back as `kernel [in, out]`."""
    if not any(k[0] == "token_embedder" for k in leaves):
        leaves = {(k[1:] if k[:2] == ("decoder", "token_embedder") else k): v
                  for k, v in leaves.items()}
    moved = [k for k in leaves if k[-1] == layers.TRANSPOSED_KERNEL and len(leaves[k].shape) == 2]
    if not moved:
        return leaves
    both = [_name(k[:-1]) for k in moved if k[:-1] + ("kernel",) in leaves]
    if both:
        raise CheckpointError(f"{where} holds both kernel and kernel_t under {both[:3]}: not "
                              "one model's parameters. Save the model again with save_t5x.")
    logging.warning(
        "%s holds %d dense kernels as kernel_t [out, in] (a CPU-loaded model's layout, saved "
        "as it was): read here as T5X's kernel [in, out]. T5X itself cannot read it: save with "
        "speculative.checkpoints.save_t5x(params, dir), or save "
        "speculative.models.layers.untranspose_kernels(params).", where, len(moved))
    out = {k: v for k, v in leaves.items() if k not in moved}
    out.update({k[:-1] + ("kernel",): _TransposedLeaf(leaves[k]) for k in moved})
    return out


# ---------------------------------------------------------------- public API
def load_metadata(path) -> Dict[str, Any]:
    """The parameter tree as `jax.ShapeDtypeStruct`s, reading no array data: for T5X legacy
    checkpoints only the msgpack (its specs record shapes), for Orbax the `.zarray`s."""
    leaves = _leaves(path)[0]
    return _unflatten({k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in leaves.items()})


def load_params(path, dtype=None, config: Optional[t5.T5Config] = None, *,
                progress: bool = False, shardings: Any = None) -> Dict[str, Any]:
    """Loads the parameters (`target` only) of a T5X legacy, Orbax or HF T5 checkpoint.

    Args:
      path: model dir, step dir, msgpack file, Orbax item dir or HF dir (see the module doc).
      dtype: cast every array on load, e.g. 'bfloat16'; None keeps the stored dtype.
      config: if given, names and shapes are checked against `Transformer(config)` before any
        array is read (an HF dir is always checked against its config.json).
      progress: show a tqdm bar over parameters.
      shardings: None, or a tree like the parameters of `jax.sharding.Sharding`s: each
        parameter is then built as a `jax.Array` with that sharding from the blocks its
        addressable devices hold (`jax.make_array_from_callback`); tensorstore-backed formats
        (T5X, Orbax) read only those blocks, so no host materialises a whole sharded model.
    Returns:
      Nested dicts of numpy arrays (jax Arrays with `shardings`) with T5X names, e.g.
      `params['encoder']['encoder_norm']`.
    """
    dtype = validation.float_dtype(dtype, "dtype")  # before anything is read
    leaves, hf_config, where = _leaves(path)
    if config is None and hf_config is not None:
        config = config_from_hf(hf_config, _unflatten(leaves))
    if config is not None:
        validate_params(_unflatten(leaves), config, source=where)
    for keys, leaf in leaves.items():  # before any array is read
        if not _is_float(leaf.dtype):
            raise CheckpointError(f"Parameter {_name(keys)} in {where} has dtype {leaf.dtype}; "
                                  "model parameters are floats (is this an optimizer state or "
                                  "a step counter?).")
    bar = tqdm(list(leaves), desc="load", unit="param", disable=not progress)
    if shardings is not None:
        flat = _flatten(shardings)
        missing = sorted(_name(k) for k in leaves if k not in flat)
        if missing:
            raise ValueError(f"shardings has no entry for {missing[:5]} ({len(missing)} "
                             "parameters); give one Sharding per parameter.")

        def sharded(keys):
            leaf = leaves.pop(keys)
            return jax.make_array_from_callback(
                leaf.shape, flat[keys], lambda index: _checked(keys, leaf.read(dtype, index),
                                                               where))

        return _unflatten({keys: sharded(keys) for keys in bar})
    return _unflatten({keys: _checked(keys, leaves.pop(keys).read(dtype), where)
                       for keys in bar})  # one at a time


def _is_float(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.floating) or np.dtype(dtype) in (
        np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn),
        np.dtype(ml_dtypes.float8_e5m2))


def _checked(keys, array: np.ndarray, where: str) -> np.ndarray:
    """A stored array that is not a float (a recorded float dtype over integer data) is
    refused: it would decode as junk."""
    if not _is_float(array.dtype):
        raise CheckpointError(f"Parameter {_name(keys)} in {where} holds {array.dtype} data; "
                              "model parameters are floats.")
    return array


def _choose_chunk_shape(shape, target_elements: int) -> list:
    """As T5X's `_choose_chunk_shape`: the largest chunk of <= `target_elements` whose dims
    divide the array's, found by shrinking the currently largest dim to its next divisor."""
    divisors = [[d for d in range(1, max(1, s) + 1) if max(1, s) % d == 0] for s in shape]
    while math.prod(d[-1] for d in divisors) > max(1, target_elements):
        largest = max(range(len(shape)), key=lambda i: (divisors[i][-1], -i))  # first on ties
        divisors[largest].pop()
    return [d[-1] for d in divisors]


def check_t5x_target(path, step: int, overwrite: bool = False) -> str:
    """Refuses, before any work, where `save_t5x(..., path, step)` cannot or must not write;
    returns the step dir `path/checkpoint_<step>`. `step` is an int >= 0; `path` a local
    directory (or one to create) that holds no HF model (a directory holding both is ambiguous
    to `load_params`); an existing step dir needs `overwrite`."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step={step!r} is invalid: give an int >= 0 (the checkpoint is "
                         "checkpoint_<step>; load_params reads the largest step).")
    path = os.fspath(path)
    if path.startswith("gs://"):
        raise CheckpointError(f"save_t5x writes local dirs only: save locally, then copy it to "
                              f"{path} with `gsutil -m cp -r`.")
    node = os.path.abspath(path)
    while not os.path.exists(node) and os.path.dirname(node) != node:
        node = os.path.dirname(node)
    if not os.path.isdir(node):
        raise NotADirectoryError(
            f"{path}: {node} is a file, not a directory. A T5X checkpoint is a directory "
            f"<model dir>/checkpoint_<step>/: give a model directory (created if missing).")
    if os.path.isdir(path):
        entries = os.listdir(path)
        if "config.json" in entries and set(_HF_WEIGHTS) & set(entries):
            raise CheckpointError(
                f"{path} holds an HF model (config.json + model.safetensors): a T5X "
                f"checkpoint_{step} beside it would make the directory ambiguous to load_params. "
                "Write the T5X checkpoint into a directory of its own.")
    final = os.path.join(path, f"checkpoint_{int(step)}")
    if os.path.exists(final) and not overwrite:
        raise FileExistsError(f"{final} exists; pick another step or pass overwrite=True.")
    return final


def save_t5x(params, path, step: int = 0, *, overwrite: bool = False,
             progress: bool = False, config: Optional[t5.T5Config] = None,
             decoder_only: bool = False) -> str:
    """Writes `params` as a T5X legacy (version 3) checkpoint `path/checkpoint_<step>`.

    Layout (as t5x/checkpoints.py writes it): msgpack `checkpoint` = `{'version': 3, 'optimizer':
    {'target': <tensorstore specs>, 'state': {'step': int32, 'param_states': {}}}}`, and one gzip
    zarr v2 dir `target.<dotted name>` per array, chunked to <= 64 MiB, in the array's own dtype
    (float32, bfloat16, ...). Written to `checkpoint_<step>.tmp-<time>`, renamed when complete.
    Returns the step dir. Kernels are written in T5X's `[in, out]` layout whichever layout the
    params decode in (`layers.transpose_kernels`, the default on a CPU). Where it cannot write
    (`check_t5x_target`) is refused before anything is written.

    With `config` (the model's `T5Config`; `decoder_only=True` for `t5.DecoderOnly`), the
    params are checked against it first, and `path/config.gin` is written beside the step dir
    in the form T5X writes it (`config_gin.write_config_gin`), so `load_model(None, path)`
    rebuilds the model. A config.gin already there is kept when it describes the same model
    (T5X's own holds the trainer's settings too) and refused, before anything is written, when
    it describes another or cannot be read.
    """
    final = check_t5x_target(path, step, overwrite)
    params = layers.untranspose_kernels(params)
    write_gin = config is not None and _check_config_gin(path, params, config, decoder_only)
    flat = _flatten(params)
    bad = [_name(k) for k in flat if any("." in p or "/" in p for p in k)]
    if bad:
        raise CheckpointError(f"Parameter names must not contain '.' or '/': {bad[:5]}.")
    tmp = f"{final}.tmp-{int(time.time())}"
    os.makedirs(tmp)
    try:
        target = {}
        for keys, arr in tqdm(flat.items(), desc="save", unit="param", disable=not progress):
            arr = np.asarray(arr)
            name = "target." + ".".join(keys)
            metadata = {"chunks": _choose_chunk_shape(arr.shape, _CHUNK_BYTES // arr.itemsize),
                        "compressor": {"id": "gzip", "level": 1}, "shape": list(arr.shape)}
            target[keys] = {"driver": "zarr", "dtype": arr.dtype.name,
                            "kvstore": {"driver": "file", "path": name}, "metadata": metadata}
            spec = {**target[keys], "kvstore": paths.kvstore(os.path.join(tmp, name))}
            ts.open(spec, create=True).result().write(arr).result()
        blob = serialization.msgpack_serialize({"version": 3, "optimizer": {
            "target": _unflatten(target), "state": {"step": np.int32(step), "param_states": {}}}})
        with open(os.path.join(tmp, "checkpoint"), "wb") as f:
            f.write(blob)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if write_gin:
        config_gin.write_config_gin(path, config, decoder_only, source="save_t5x")
    return final


def _check_config_gin(path, params, config: t5.T5Config, decoder_only: bool) -> bool:
    """Whether `save_t5x` writes `path/config.gin` for `config` (False: one describing this
    model is there); refuses params that do not fit `config`, and a config.gin for another
    model or one this project cannot read (a model dir holds one architecture)."""
    if not isinstance(config, t5.T5Config):
        raise TypeError(f"config={config!r} is not a speculative.models.t5.T5Config.")
    validate_params(params, t5.DecoderOnly(config) if decoder_only else config,
                    source="the params given to save_t5x")
    existing = os.path.join(os.fspath(path), config_gin.CONFIG_GIN)
    if not os.path.exists(existing):
        return True
    try:
        found = config_gin.read_t5x_gin(existing)
    except config_gin.ConfigGinError as e:
        raise CheckpointError(f"{existing} is there already and does not describe a T5 this "
                              f"project reads ({e}); save into another model dir, or move it "
                              "away.") from None
    if (found.config, found.decoder_only) != (config, bool(decoder_only)):
        kind = "decoder-only" if decoder_only else "encoder-decoder"
        raise CheckpointError(
            f"{existing} describes another model ({found.describe()}), not the {kind} "
            f"{config} being saved: a T5X model dir holds one architecture. Save into "
            "another model dir.")
    return False
