"""GAMMA 'auto''s choices kept on disk, so a rerun of the same run skips calibration.

    key = calibration_key(settings)         # host, target, draft, batch size, lengths, sampling
    plan_json = load(key)                   # the DecodePlan's JSON a calibration made, or None
    store(key, plan_json)                   # atomic (files.write_atomic)

The cache is a folder of small JSON files, one per key (its SHA-256), in
~/.cache/speculative/calibration; SPECULATIVE_CALIBRATION_CACHE=DIR moves it and
SPECULATIVE_CALIBRATION_CACHE=0 turns it off. The key holds the host's fingerprint (node name,
CPU model, devices, jax version), each model's identity (its name or config, and the size and
modification time of every checkpoint file, so a retrained checkpoint is a new key), the batch
size, the input and decode lengths, the sampling, the lenience, and a digest of the code that
decodes (`code_digest`: the package's decode, beam, models and measure sources, so a changed
decode loop or kernel is a new key). A stored file whose key does
not match (a hash collision, a hand edit) is ignored.

Choices that do not depend on the run's length are kept for any run of the key (`cacheable`):
what was measured (the candidates timed, the prior checked on the slice) or bounded (the gate's
bound under `min_speedup`). A short run's 'the rest of the run cannot repay a compile' or 'no
time to calibrate' (`short_run`) is kept apart, with the run's number of batches, and holds only
for runs of at most that many (`load_short`): a rerun of the same command takes it without
compiling anything, and a longer run of the same settings is free to decide otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import os
import platform
from typing import Any, Dict, Optional

from speculative import files
from speculative.data import bundles

CACHE_ENV = "SPECULATIVE_CALIBRATION_CACHE"  # '0' (or off, false, no): no cache; DIR: there
DEFAULT_DIR = os.path.join("~", ".cache", "speculative", "calibration")
OFF = ("0", "off", "false", "no")


def cache_dir() -> Optional[str]:
    """The cache's folder: SPECULATIVE_CALIBRATION_CACHE when it names one, else
    ~/.cache/speculative/calibration; None when it is 0 (off, false, no)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() in OFF:
        return None
    return os.path.abspath(os.path.expanduser(value or DEFAULT_DIR))


def host_fingerprint() -> Dict[str, Any]:
    """What makes timings on this machine comparable: node name, architecture, CPU model,
    the devices JAX sees and its version."""
    import jax  # pylint: disable=g-import-not-at-top  (jax is loaded by then in a run)
    cpu = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), None)
    except OSError:
        pass
    return {"node": platform.node(), "machine": platform.machine(), "cpu": cpu,
            "devices": [d.device_kind for d in jax.devices()], "jax": jax.__version__}


def files_signature(path: Optional[str]) -> Optional[Dict[str, Any]]:
    """A checkpoint's identity: its real path and a digest of every file's relative path, size
    and modification time under it (None for no path)."""
    if not path:
        return None
    real = os.path.realpath(os.path.expanduser(path))
    found = []
    if os.path.isdir(real):
        for root, _, names in os.walk(real):
            for name in names:
                full = os.path.join(root, name)
                st = os.stat(full)
                found.append((os.path.relpath(full, real), st.st_size, st.st_mtime_ns))
    elif os.path.exists(real):
        st = os.stat(real)
        found.append(("", st.st_size, st.st_mtime_ns))
    digest = hashlib.sha256(json.dumps(sorted(found)).encode()).hexdigest()[:16]
    return {"path": real, "files": len(found), "digest": digest}


CODE_DIRS = ("decode", "beam", "models", "measure")  # what a decode's speed depends on


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """A digest of the package's sources in `CODE_DIRS` (their relative paths and contents)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder in CODE_DIRS:
        for root, dirs, names in os.walk(os.path.join(package, folder)):
            dirs.sort()
            for name in sorted(n for n in names if n.endswith(".py")):
                full = os.path.join(root, name)
                digest.update(os.path.relpath(full, package).encode() + b"\0")
                with open(full, "rb") as f:
                    digest.update(f.read() + b"\0")
    return digest.hexdigest()[:16]


def model_identity(config, checkpoint: Optional[str]) -> Dict[str, Any]:
    """A model as a run names it (a bundled name, a config, or None with a checkpoint) with its
    checkpoint's `files_signature` (a bundled model's own checkpoint and card entry)."""
    if isinstance(config, str):
        found = bundles.bundled(config)
        entry = found.entry if found is not None else None
        own = found.checkpoint if found is not None and checkpoint is None else checkpoint
        return {"name": config, "entry": entry, "checkpoint": files_signature(own)}
    shown = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else repr(config)
    return {"config": shown, "checkpoint": files_signature(checkpoint)}


def calibration_key(settings) -> Dict[str, Any]:
    """The key of a run's GAMMA 'auto' choice (module docstring); `settings`: `InferSettings`."""
    return {"host": host_fingerprint(), "code": code_digest(),
            "target": model_identity(settings.target_config, settings.target_checkpoint),
            "draft": model_identity(settings.draft_config, settings.draft_checkpoint),
            "batch_size": settings.batch_size, "input_length": settings.input_length,
            "max_decode_len": settings.max_decode_len,
            "sampling": dataclasses.asdict(settings.sampling), "lenience": settings.lenience}


def _path(key: Dict[str, Any], where: str) -> str:
    text = json.dumps(key, sort_keys=True, default=repr)
    return os.path.join(where, hashlib.sha256(text.encode()).hexdigest()[:24] + ".json")


def load(key: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The plan JSON stored under `key`, with `cache_file` (its path); None when the cache is
    off, holds none, or the file's key differs (or it cannot be read)."""
    where = cache_dir()
    if where is None:
        return None
    path = _path(key, where)
    try:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return None
    if json.loads(json.dumps(key, default=repr)) != stored.get("key"):
        return None
    return dict(stored["plan"], cache_file=path)


def store(key: Dict[str, Any], plan_json: Dict[str, Any]) -> Optional[str]:
    """Writes `plan_json` under `key` (atomically); returns the file (None: the cache is off)."""
    where = cache_dir()
    if where is None:
        return None
    os.makedirs(where, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    text = json.dumps({"key": key, "plan": plan_json, "written": stamp}, indent=1,
                      sort_keys=True, default=repr)
    return files.write_atomic(_path(key, where), text + "\n")


def cacheable(choice) -> bool:
    """Whether a `speculation.SpeculationChoice` holds for any run of the same key: something
    was timed or the prior decided, or the gate's bound (not the run's length) closed it."""
    gate = choice.gate
    return bool(choice.prior is not None or len(choice.candidates) > 1 or (
        gate is not None and gate.pays and gate.fits and not gate.open))


def short_run(choice) -> bool:
    """Whether a `speculation.SpeculationChoice` is the baseline because the run was short:
    the gate closed by the payback or the calibration budget, with nothing timed and no prior."""
    gate = choice.gate
    return bool(gate is not None and not gate.open and choice.prior is None
                and len(choice.candidates) <= 1 and not (gate.pays and gate.fits))


def _short_key(key: Dict[str, Any]) -> Dict[str, Any]:
    return dict(key, short_run=True)


def store_short(key: Dict[str, Any], plan_json: Dict[str, Any],
                run_batches: int) -> Optional[str]:
    """Stores a `short_run` choice of a run of `run_batches` batches (its own entry)."""
    return store(_short_key(key), dict(plan_json, run_batches=int(run_batches)))


def load_short(key: Dict[str, Any], run_batches: int) -> Optional[Dict[str, Any]]:
    """A `short_run` choice stored under `key` by a run at least `run_batches` long, or None."""
    cached = load(_short_key(key))
    if cached is None or int(cached.get("run_batches", 0)) < int(run_batches):
        return None
    return cached
