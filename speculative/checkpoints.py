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
through tensorstore), so a checkpoint is never held twice; optimizer state is never read. HF
interop: `from_hf_t5` / `to_hf_t5` map
state dicts (HF kernels are `[out, in]`, T5X's `[in, out]`), `config_from_hf` maps config.json.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import json
import math
import os
import re
import shutil
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import flax.linen as nn
import jax
import ml_dtypes
import msgpack
import numpy as np
import safetensors
import safetensors.numpy
import tensorstore as ts
from flax import serialization, traverse_util
from tqdm import tqdm

from speculative import files, validation
from speculative.models import t5

__all__ = ["CheckpointError", "load_params", "load_metadata", "validate_params", "save_t5x",
           "from_hf_t5", "to_hf_t5", "config_from_hf", "hf_config_dict", "load_hf_config",
           "save_hf_t5"]

Key = Tuple[str, ...]
_CHUNK_BYTES = 64 * 1024 * 1024  # T5X `_DESIRED_CHUNK_SIZE_BYTES`
_RECOPY = "The copy is incomplete or corrupt: copy the checkpoint directory again."


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


# ---------------------------------------------------------------- paths (local or gs://)
def _gcs(path: str) -> Tuple[dict, str]:
    bucket, _, key = path[len("gs://"):].partition("/")
    return {"driver": "gcs", "bucket": bucket}, key.strip("/")


def _kvstore(path: str) -> Dict[str, Any]:
    """A tensorstore kvstore spec for a local dir or a `gs://bucket/...` URL."""
    if path.startswith("gs://"):
        spec, key = _gcs(path)
        return {**spec, "path": key + "/"}
    return {"driver": "file", "path": os.path.abspath(path) + "/"}


def _listdir(path: str) -> Optional[list]:
    """Entries of a directory, or None when it is not one."""
    if not path.startswith("gs://"):
        return sorted(os.listdir(path)) if os.path.isdir(path) else None
    spec, key = _gcs(path)
    lo = key + "/" if key else ""
    keys = ts.KvStore.open(spec).result().list(ts.KvStore.KeyRange(
        lo, key + "0" if key else ""), strip_prefix_length=len(lo)).result()
    return sorted({k.decode().split("/")[0] for k in keys}) or None


def _is_file(path: str) -> bool:
    if not path.startswith("gs://"):
        return os.path.isfile(path)
    spec, key = _gcs(path)
    return bool(ts.KvStore.open(spec).result().list(ts.KvStore.KeyRange(key, key + "\0")).result())


def _open_file(path: str):  # a binary file object, local or gs://
    if not path.startswith("gs://"):
        return open(path, "rb")
    spec, key = _gcs(path)
    return io.BytesIO(ts.KvStore.open(spec).result().read(key).result().value)


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
    with _open_file(path) as f:
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


# ---------------------------------------------------------------- formats
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
    return {"driver": spec.get("driver", "zarr"), "kvstore": _kvstore(full)}


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
    with _open_file(item_dir + "/_METADATA") as f:
        try:
            meta = json.load(f)
            entries = [[str(k["key"]) for k in e["key_metadata"]]
                       for e in meta["tree_metadata"].values()]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{item_dir}/_METADATA is not Orbax metadata ({e}). {_RECOPY}") \
                from None
    ocdbt = meta.get("use_ocdbt", True) and "manifest.ocdbt" in (_listdir(item_dir) or [])
    base = item_dir if item_dir.startswith("gs://") else "file://" + os.path.abspath(item_dir)
    leaves = {}
    for keys in entries:
        if keys[0] == "target":  # `state.*` (optimizer) is never opened
            name = ".".join(keys)
            kv = ({"driver": "ocdbt", "base": base, "path": name + "/"} if ocdbt
                  else _kvstore(item_dir + "/" + name))
            spec = {"driver": "zarr3" if meta.get("use_zarr3") else "zarr", "kvstore": kv}
            leaves[tuple(keys[1:])] = _TsLeaf(_name(keys[1:]), spec, item_dir, context=context)
    return leaves


def _hf_leaves(hf_dir: str):
    """T5X-named leaves over the safetensors of an HF T5 dir, and its config.json dict."""
    if hf_dir.startswith("gs://"):
        raise CheckpointError(f"{hf_dir}: HF directories must be local; copy it first.")
    hf_config = load_hf_config(hf_dir, as_dict=True)
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    tensors = {}  # HF name -> (shape, dtype, reader)
    for fname in files:
        path = os.path.join(hf_dir, fname)
        try:
            f = safetensors.safe_open(path, "np")
            for name in f.keys():
                s = f.get_slice(name)
                tensors[name] = (s.get_shape(), _dtype(_ST_DTYPES[s.get_dtype()]),
                                 functools.partial(f.get_tensor, name))
        except Exception as e:  # pylint: disable=broad-except  # SafetensorError, missing file
            raise CheckpointError(f"{path} is not a readable safetensors file ({e}); download "
                                  "or save it again.") from None
    plan = _hf_plan({k: v[0] for k, v in tensors.items()}, lambda k: tensors[k][2](), hf_config)
    return {path: _ArrayLeaf(tensors[hf][2], *tensors[hf][:2], tr, scale, copy=False)
            for path, (hf, tr, scale) in plan.items()}, hf_config


def _locate(path: str) -> Tuple[str, str]:
    """(format, where): 'legacy' msgpack file, 'orbax' item dir or 'hf' dir."""
    path = os.fspath(path).rstrip("/") or "/"
    if _is_file(path):
        return ("hf", os.path.dirname(path)) if path.endswith(".safetensors") else ("legacy", path)
    entries = _listdir(path)
    if entries is None:
        raise FileNotFoundError(
            f"Checkpoint path {path} does not exist. Pass a T5X model dir, a checkpoint_<step> "
            "dir, its msgpack `checkpoint` file, or an HF dir (model.safetensors + config.json).")
    if "checkpoint" in entries and _is_file(path + "/checkpoint"):
        return "legacy", path + "/checkpoint"
    if "_METADATA" in entries:
        return "orbax", path
    if "state" in entries and "_METADATA" in (_listdir(path + "/state") or []):
        return "orbax", path + "/state"
    if "config.json" in entries and {"model.safetensors", "model.safetensors.index.json"} & set(
            entries):
        return "hf", path
    steps = [(int(m.group(1)), e) for e in entries if (m := re.fullmatch(r"checkpoint_(\d+)", e))]
    if steps:
        return _locate(path + "/" + max(steps)[1])
    raise FileNotFoundError(
        f"{path} holds no checkpoint: expected a msgpack `checkpoint` file, an Orbax `state/` "
        f"item, checkpoint_<step> dirs, or model.safetensors + config.json (an HF model saved "
        f"as pytorch_model.bin needs save_pretrained again); found {entries[:10]}.")


def _leaves(path):
    """(leaves by T5X key, HF config dict or None, where) of any supported checkpoint."""
    fmt, where = _locate(path)
    if fmt == "hf":
        return (*_hf_leaves(where), where)
    reader = _legacy_leaves if fmt == "legacy" else _orbax_leaves
    return reader(where, ts.Context()), None, where


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
    if wrong or any(len(k) > 1 and k[1].startswith("layers_") for k in odd):
        hints.append("check emb_dim, num_heads, head_dim, mlp_dim, vocab_size and the layer "
                     "counts, or pick the matching preset")
    raise CheckpointError(
        f"Parameters from {source or 'the given tree'} do not match the model ({len(missing)} "
        f"missing, {len(extra)} extra, {len(wrong)} mis-shaped):\n" + "\n".join(lines)
        + "".join(f"\nHint: {h}." for h in hints))


def _choose_chunk_shape(shape, target_elements: int) -> list:
    """As T5X's `_choose_chunk_shape`: the largest chunk of <= `target_elements` whose dims
    divide the array's, found by shrinking the currently largest dim to its next divisor."""
    divisors = [[d for d in range(1, max(1, s) + 1) if max(1, s) % d == 0] for s in shape]
    while math.prod(d[-1] for d in divisors) > max(1, target_elements):
        largest = max(range(len(shape)), key=lambda i: (divisors[i][-1], -i))  # first on ties
        divisors[largest].pop()
    return [d[-1] for d in divisors]


def save_t5x(params, path, step: int = 0, *, overwrite: bool = False,
             progress: bool = False) -> str:
    """Writes `params` as a T5X legacy (version 3) checkpoint `path/checkpoint_<step>`.

    Layout (as t5x/checkpoints.py writes it): msgpack `checkpoint` = `{'version': 3, 'optimizer':
    {'target': <tensorstore specs>, 'state': {'step': int32, 'param_states': {}}}}`, and one gzip
    zarr v2 dir `target.<dotted name>` per array, chunked to <= 64 MiB, in the array's own dtype
    (float32, bfloat16, ...). Written to `checkpoint_<step>.tmp-<time>`, renamed when complete.
    Returns the step dir.
    """
    path = os.fspath(path)
    if path.startswith("gs://"):
        raise CheckpointError(f"save_t5x writes local dirs only: save locally, then copy it to "
                              f"{path} with `gsutil -m cp -r`.")
    final = os.path.join(path, f"checkpoint_{int(step)}")
    if os.path.exists(final) and not overwrite:
        raise FileExistsError(f"{final} exists; pick another step or pass overwrite=True.")
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
            spec = {**target[keys], "kvstore": _kvstore(os.path.join(tmp, name))}
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
    return final


# ---------------------------------------------------------------- Hugging Face T5
# Per stack: T5X module of a layer -> (HF sublayer index j, HF module; None for its layer_norm).
_HF_LAYER = {
    "encoder": {"attention": (0, "SelfAttention"), "pre_attention_layer_norm": (0, None),
                "mlp": (1, "DenseReluDense"), "pre_mlp_layer_norm": (1, None)},
    "decoder": {"self_attention": (0, "SelfAttention"), "pre_self_attention_layer_norm": (0, None),
                "encoder_decoder_attention": (1, "EncDecAttention"),
                "pre_cross_attention_layer_norm": (1, None),
                "mlp": (2, "DenseReluDense"), "pre_mlp_layer_norm": (2, None)},
}
_ATTN = {"query": "q", "key": "k", "value": "v", "out": "o"}
_HF_IGNORED = re.compile(r"(encoder|decoder)\.embed_tokens\.weight|decoder\.block\.0\.layer\.1"
                         r"\.EncDecAttention\.relative_attention_bias\.weight")
_FFP = {"relu": ("relu",), "gated-gelu": ("gelu", "linear"), "gated-relu": ("relu", "linear"),
        "gated-silu": ("silu", "linear"), "silu": ("silu",), "gelu": ("gelu_exact",),
        "gelu_new": ("gelu",), "gated-gelu_new": ("gelu", "linear")}
# HF config.json key -> (T5Config field, transformers' default).
_HF_FIELDS = {"vocab_size": ("vocab_size", 32128), "d_model": ("emb_dim", 512),
              "num_heads": ("num_heads", 8), "d_kv": ("head_dim", 64), "d_ff": ("mlp_dim", 2048),
              "num_layers": ("num_encoder_layers", 6), "dropout_rate": ("dropout_rate", 0.1),
              "num_decoder_layers": ("num_decoder_layers", None),
              "relative_attention_num_buckets": ("relative_attention_num_buckets", 32),
              "relative_attention_max_distance": ("relative_attention_max_distance", 128)}
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}


def _hf_to_t5x_name(name: str) -> Optional[Key]:
    """T5X key of an HF T5 weight; None for HF's duplicates (`embed_tokens`, ...)."""
    if _HF_IGNORED.fullmatch(name):
        return None
    if name == "shared.weight":
        return ("token_embedder", "embedding")
    if m := re.fullmatch(r"(encoder|decoder)\.final_layer_norm\.weight", name):
        return (m[1], f"{m[1]}_norm", "scale")
    if m := re.fullmatch(r"(encoder|decoder)\.block\.0\.layer\.0\.SelfAttention\."
                         r"relative_attention_bias\.weight", name):
        return (m[1], "relpos_bias", "rel_embedding")
    m = re.fullmatch(r"(encoder|decoder)\.block\.(\d+)\.layer\.(\d+)\.(?:layer_norm|(\w+)\.(\w+))"
                     r"\.weight", name)
    for module, (j, hf_module) in _HF_LAYER[m[1]].items() if m else ():
        if j == int(m[3]) and hf_module == m[4]:
            if hf_module is None:
                return (m[1], f"layers_{m[2]}", module, "scale")
            subs = ({k: k for k in ("wi", "wi_0", "wi_1", "wo")} if hf_module == "DenseReluDense"
                    else {v: k for k, v in _ATTN.items()})
            if m[5] in subs:
                return (m[1], f"layers_{m[2]}", module, subs[m[5]], "kernel")
    raise CheckpointError(
        f"Unknown HF T5 weight {name!r}: only T5ForConditionalGeneration weights of T5 1.0/1.1 "
        "and Flan-T5 are supported (not umT5-style per-layer relative biases).")


def _hf_scaled(hf_config: Optional[Mapping], untied: bool) -> bool:
    """Whether HF scales the decoder output by d_model**-0.5 before `lm_head`: transformers 5.x
    says so in `scale_decoder_outputs`, 4.x in `tie_word_embeddings`; with no config, T5's
    conventions (1.0: tied and scaled; 1.1: untied, unscaled)."""
    if hf_config is None:
        return not untied
    tie = hf_config.get("tie_word_embeddings", True) is not False
    return bool(hf_config.get("scale_decoder_outputs", tie))


def _hf_plan(shapes: Mapping[str, tuple], get: Callable[[str], np.ndarray],
             hf_config: Optional[Mapping]) -> Dict[Key, Tuple[str, bool, Optional[float]]]:
    """T5X key -> (HF name, transpose, scale). Every 2-D HF weight but `shared` is `[out, in]`.
    The output layer is `logits_dense` unless HF ties it to `shared` and scales (T5 1.0)."""
    if "shared.weight" not in shapes:
        raise CheckpointError("The HF T5 weights have no `shared.weight` (token embedding).")
    plan = {}
    for name, shape in shapes.items():
        if name != "lm_head.weight" and (key := _hf_to_t5x_name(name)) is not None:
            plan[key] = (name, len(shape) == 2 and name != "shared.weight", None)
    untied = "lm_head.weight" in shapes and not (
        shapes["lm_head.weight"] == shapes["shared.weight"]
        and np.array_equal(get("lm_head.weight"), get("shared.weight")))
    scaled = _hf_scaled(hf_config, untied)
    if untied or not scaled:  # a scaled untied head folds the scale into the kernel
        scale = shapes["shared.weight"][1] ** -0.5 if scaled else None
        head = "lm_head.weight" if untied else "shared.weight"
        plan[("decoder", "logits_dense", "kernel")] = (head, True, scale)
    return plan


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor; bfloat16 keeps its bits
        x = x.detach().cpu().contiguous()
        if str(x.dtype) == "torch.bfloat16":
            import torch  # pylint: disable=import-outside-toplevel  # only ever for torch inputs
            return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return x.numpy()
    return np.asarray(x)


def from_hf_t5(state_dict: Mapping[str, Any], hf_config: Optional[Mapping] = None,
               dtype=None) -> Dict[str, Any]:
    """HF T5 state dict (torch tensors or numpy arrays) -> T5X-named numpy params.

    Kernels are transposed; `shared.weight [V, E]` is `token_embedder/embedding`; block 0's
    `relative_attention_bias [32, H]` is the stack's `relpos_bias/rel_embedding [H, 32]`;
    `lm_head.weight` is `decoder/logits_dense/kernel` unless tied to `shared` (a T5 1.0 model,
    `logits_via_embedding=True`). Without `hf_config` (config.json as a dict) an untied head is
    taken as unscaled (T5 1.1) and a tied one as scaled by d_model**-0.5 (T5 1.0).
    """
    get = functools.lru_cache(maxsize=None)(lambda name: _to_numpy(state_dict[name]))
    plan = _hf_plan({k: tuple(v.shape) for k, v in state_dict.items()}, get, hf_config)
    return _unflatten({key: _ArrayLeaf(functools.partial(get, hf), get(hf).shape, get(hf).dtype,
                                       tr, scale).read(dtype)
                       for key, (hf, tr, scale) in plan.items()})


def to_hf_t5(params, config: Optional[t5.T5Config] = None) -> Dict[str, np.ndarray]:
    """T5X-named params -> HF T5 state dict of numpy arrays (the inverse of `from_hf_t5`).

    Any subset of the tree maps (e.g. `DecoderOnly` params); a tied model (no `logits_dense`) gets
    no `lm_head.weight` (HF ties it). With `config`, params are validated first."""
    if config is not None:
        validate_params(params, config)
    out = {}
    for keys, v in _flatten(params).items():
        a, stack = np.asarray(v), keys[0]
        layer = _HF_LAYER.get(stack, {}).get(keys[2]) if len(keys) > 3 else None
        if keys == ("token_embedder", "embedding"):
            out["shared.weight"] = a
        elif keys == ("decoder", "logits_dense", "kernel"):
            out["lm_head.weight"] = a.T
        elif keys[1:] == ("relpos_bias", "rel_embedding"):
            out[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = a.T
        elif keys[1:] == (f"{stack}_norm", "scale"):
            out[f"{stack}.final_layer_norm.weight"] = a
        elif layer and keys[1].startswith("layers_") and (layer[1] is None) == (len(keys) == 4):
            prefix = f"{stack}.block.{keys[1][len('layers_'):]}.layer.{layer[0]}"
            if layer[1] is None:
                out[f"{prefix}.layer_norm.weight"] = a
            else:
                out[f"{prefix}.{layer[1]}.{_ATTN.get(keys[3], keys[3])}.weight"] = a.T
        else:
            raise CheckpointError(f"Parameter {_name(keys)} has no HF T5 counterpart.")
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def config_from_hf(hf_config: Mapping[str, Any], params=None) -> t5.T5Config:
    """An HF T5 `config.json` dict -> `T5Config`, cross-checked against `params` if given.

    `logits_via_embedding` comes from the weights when given (no `decoder/logits_dense`), else
    from `scale_decoder_outputs` / `tie_word_embeddings`.
    """
    get = hf_config.get
    ffp, eps = get("feed_forward_proj", "relu"), get("layer_norm_epsilon", 1e-6)
    if ffp not in _FFP or abs(eps - 1e-6) > 1e-12:
        raise CheckpointError(f"Unsupported HF T5 config: feed_forward_proj={ffp!r} (supported: "
                              f"{sorted(_FFP)}), layer_norm_epsilon={eps} (T5 uses 1e-6).")
    fields = {ours: get(hf, default) for hf, (ours, default) in _HF_FIELDS.items()}
    fields["num_decoder_layers"] = fields["num_decoder_layers"] or fields["num_encoder_layers"]
    heads, d_kv = fields["num_heads"], fields["head_dim"]
    via_embedding = _hf_scaled(hf_config, untied=False)
    if params is not None:
        flat = _flatten(params)
        via_embedding = ("decoder", "logits_dense", "kernel") not in flat
        for key in (("encoder", "layers_0", "attention", "query", "kernel"),
                    ("decoder", "layers_0", "self_attention", "query", "kernel")):
            if key in flat and flat[key].shape[1] != heads * d_kv:
                raise CheckpointError(
                    f"HF config num_heads * d_kv = {heads} * {d_kv} = {heads * d_kv}, but the "
                    f"weight {_name(key)} has {flat[key].shape[1]} columns: fix num_heads or d_kv "
                    "in config.json.")
    return t5.T5Config(**fields, mlp_activations=_FFP[ffp], logits_via_embedding=via_embedding)


def hf_config_dict(config: t5.T5Config) -> Dict[str, Any]:
    """`T5Config` -> HF `config.json` dict (read alike by transformers 4.x and 5.x)."""
    ffp = next((k for k, v in _FFP.items() if v == tuple(config.mlp_activations)), None)
    if ffp is None:
        raise CheckpointError(f"mlp_activations={config.mlp_activations} has no HF equivalent.")
    tied = bool(config.logits_via_embedding)
    return {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
            **{hf: getattr(config, ours) for hf, (ours, _) in _HF_FIELDS.items()},
            "feed_forward_proj": ffp, "layer_norm_epsilon": 1e-6, "is_encoder_decoder": True,
            "pad_token_id": t5.PAD_ID, "eos_token_id": t5.EOS_ID,
            "decoder_start_token_id": t5.BOS_ID, "tie_word_embeddings": tied,
            "scale_decoder_outputs": tied}


def load_hf_config(hf_dir, as_dict: bool = False):
    """An HF dir's `config.json` as a `T5Config` (checked against the weights), or as a dict."""
    path = os.path.join(os.fspath(hf_dir), "config.json")
    with open(path) as f:
        try:
            cfg = json.load(f)
        except ValueError as e:
            raise CheckpointError(f"{path} is not valid JSON ({e}).") from None
    if cfg.get("model_type", "t5") != "t5":
        raise CheckpointError(f"{path}: model_type {cfg.get('model_type')!r} is not 't5'.")
    return cfg if as_dict else config_from_hf(cfg, load_metadata(hf_dir))


# What an HF model directory holds (weights, their index, configs): what overwrite may replace.
_HF_MODEL_FILE = re.compile(r"(config|generation_config)\.json|model(-[0-9]+-of-[0-9]+)?"
                            r"\.safetensors(\.index\.json)?|pytorch_model(-[0-9]+-of-[0-9]+)?"
                            r"\.bin(\.index\.json)?")


def check_hf_target(hf_dir, overwrite: bool = False, source=None) -> None:
    """Refuses an HF output directory that holds files unless `overwrite` (call it before
    loading anything: conversions of large models take minutes), and always one that is, holds
    or lies inside `source` (the checkpoint being converted: replacing the directory would
    delete it), or holds files an HF model does not (a user's notes: replacing would delete
    them)."""
    hf_dir = os.fspath(hf_dir)
    if source is not None and not os.fspath(source).startswith("gs://"):
        out, src = os.path.realpath(hf_dir), os.path.realpath(os.fspath(source))
        if os.path.commonpath([out, src]) in (out, src):
            raise ValueError(f"--hf_dir {hf_dir} and the source checkpoint {source} overlap: "
                             "writing the HF directory would replace the source. Choose an "
                             "--hf_dir outside it (e.g. a new sibling directory).")
    if os.path.isdir(hf_dir) and os.listdir(hf_dir) and not overwrite:
        raise FileExistsError(f"{hf_dir} already holds {sorted(os.listdir(hf_dir))[:5]}; choose "
                              "an empty directory or pass overwrite=True (--overwrite), which "
                              "replaces the whole directory.")
    foreign = sorted(n for n in os.listdir(hf_dir) if not _HF_MODEL_FILE.fullmatch(n)) \
        if os.path.isdir(hf_dir) else []
    if foreign:  # overwrite replaces the directory whole: never a user's other files
        raise FileExistsError(
            f"{hf_dir} holds {foreign[:5]}, which are not an HF model's files; overwrite "
            "replaces the whole directory, so it refuses one holding anything else. Choose a "
            "new --hf_dir.")


def save_hf_t5(params, config: t5.T5Config, hf_dir, *, overwrite: bool = False,
               source=None) -> str:
    """Writes `model.safetensors` + `config.json` for transformers' T5ForConditionalGeneration.

    A directory that holds files is refused unless `overwrite`, which replaces it whole: files
    of an earlier model (a sharded `model.safetensors.index.json`, which readers would prefer)
    never survive next to the new weights. Written to a staging directory, then swapped in.
    """
    hf_dir = os.path.abspath(os.fspath(hf_dir))
    check_hf_target(hf_dir, overwrite, source)
    tensors = to_hf_t5(params, config)
    staging = f"{hf_dir}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    try:
        safetensors.numpy.save_file(tensors, os.path.join(staging, "model.safetensors"),
                                    metadata={"format": "pt"})
        with open(os.path.join(staging, "config.json"), "w") as f:
            json.dump(hf_config_dict(config), f, indent=2)
        for name in os.listdir(staging):  # readable by others, as any file a user writes
            os.chmod(os.path.join(staging, name), 0o644)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files.replace_directory(staging, hf_dir)
    return hf_dir
