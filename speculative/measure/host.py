"""Facts about the machine a run measures on, and the bytes a decode step must read there.

    env = environment()            # device, versions, CPU model and cache sizes (results files)
    parts = step_bytes(config, t5.param_shapes(config), batch_size=1, position=20.0,
                       encoder_length=20.0)                     # bytes one decode step reads
    regime = cache_regime(parts["total"], cpu_facts()["cache_bytes"])   # memory-bound or not
    bandwidth = measure_bandwidth()                              # streaming reads, GB/s
    load = LoadAverage()      # when a timed run starts ...
    load.record()             # ... and ends: {"before": 0.4, "after": 1.7}, for its results file
    provenance(load=load)     # {commit, command, date, host}: a results JSON's "provenance"

Whether speculative decoding pays on a CPU depends on whether the target's weights fit its
last-level cache: a virtual machine can land on a host whose L3 holds the whole target, and then
a step is no longer memory-bound. Every results file records these facts so that runs on
different hosts can be told apart.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from typing import Any, Dict, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative.measure import costs as costs_lib
from speculative.models import t5

BANDWIDTH_BYTES = 1 << 30  # far above any last-level cache (32 MB on the machine of the README)


def _sysfs_size(size: str) -> int:
    """'48K', '2048K', '260M' (sysfs cache sizes) in bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size = size.strip()
    return int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size)


def cpu_facts(sys_dir: str = "/sys/devices/system/cpu/cpu0/cache",
              cpuinfo: str = "/proc/cpuinfo") -> Dict[str, Any]:
    """The host CPU's model name and data/unified cache sizes in bytes per level ({"L1": ...,
    "L2": ..., "L3": ...}), read from Linux's /proc and /sys (empty where they cannot be read).

    Whether a target is memory-bound on a CPU depends on its last-level cache: a virtual machine
    can land on a host whose L3 is larger than the whole target (a 260 MB L3 against
    large_target's 122 MB), and then verification is further from free. Results record it so
    that runs on different hosts can be told apart.
    """
    model = None
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), None)
    except OSError:
        pass
    caches = {}
    try:
        for index in sorted(os.listdir(sys_dir)):
            folder = os.path.join(sys_dir, index)
            try:
                with open(os.path.join(folder, "type"), encoding="utf-8") as f:
                    kind = f.read().strip()
                with open(os.path.join(folder, "level"), encoding="utf-8") as f:
                    level = f.read().strip()
                with open(os.path.join(folder, "size"), encoding="utf-8") as f:
                    size = _sysfs_size(f.read())
            except (OSError, ValueError):
                continue
            if kind != "Instruction":
                caches[f"L{level}"] = size
    except OSError:
        pass
    return {"model": model, "cache_bytes": caches}


def environment() -> Dict[str, Any]:
    """Device and software versions, and the host CPU (`cpu_facts`), for the `environment`
    section of a results file."""
    import jaxlib  # pylint: disable=import-outside-toplevel

    device = jax.devices()[0]
    return {
        "device": str(device),
        "device_kind": getattr(device, "device_kind", None),
        "platform": device.platform,
        "device_count": jax.device_count(),
        "jax_version": jax.__version__,
        "jaxlib_version": getattr(jaxlib, "__version__", None),
        "python_version": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_facts(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


class LoadAverage:
    """The machine's 1-minute load average when a timed run starts (`before`, read at
    construction) and when it ends (`record()`). On 2 cores, above ~1.2 another process was
    busy during the run, and a verify call (a GEMM on both cores) slows more than a single step:
    every timed results file records the pair so that such runs can be told apart."""

    def __init__(self):
        self.before = os.getloadavg()[0]

    def record(self) -> Dict[str, float]:
        """`{"before": ..., "after": ...}`, the second read now."""
        return {"before": self.before, "after": os.getloadavg()[0]}


def step_bytes(config: t5.T5Config, params, *, batch_size: int, position: float,
               encoder_length: float) -> Dict[str, float]:
    """The bytes one decode step of a T5 model (`config`, `params`: arrays or
    `jax.ShapeDtypeStruct`s, e.g. `t5.param_shapes`) must read for one token per row, by part:

      decoder_weights  every decoder parameter except the output layer and the cross-attention
                       key/value kernels (the encoder output is projected once per sequence)
      output_layer     the output layer: the whole embedding when tied (logits via the
                       embedding), else the logits kernel plus the embedding rows of the inputs
      self_kv          keys and values of `position` cached tokens per row, every layer
      cross_kv         keys and values of `encoder_length` source positions per row
      total            their sum

    Weights count in their stored dtype, caches ([B, H, L, D] keys and values per layer, as
    `decoding` sizes them) in the compute dtype, all for `batch_size` rows. A verify call of
    gamma + 1 tokens reads the same, plus the gamma new cache rows it writes (negligible).
    """
    parts = {"decoder_weights": 0, "output_layer": 0}
    cross_attention = False
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [str(getattr(k, "key", k)) for k in path]
        size = int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
        if names[0] == "token_embedder":
            rows = x.shape[0] if config.logits_via_embedding else batch_size
            parts["output_layer"] += size // x.shape[0] * rows
        elif names[0] == "decoder":
            if "encoder_decoder_attention" in names:
                cross_attention = True
                if names[-2] in ("key", "value"):
                    continue
            parts["output_layer" if "logits_dense" in names else "decoder_weights"] += size
    per_position = (2 * config.num_decoder_layers * batch_size * config.num_heads
                    * config.head_dim * np.dtype(config.dtype).itemsize)
    parts["self_kv"] = per_position * position
    parts["cross_kv"] = per_position * encoder_length if cross_attention else 0
    parts["total"] = sum(parts.values())
    return {k: float(v) for k, v in parts.items()}


def cache_regime(weight_bytes: float, cache_bytes: Mapping[str, int]) -> Dict[str, Any]:
    """Whether a step reading `weight_bytes` of weights streams them from memory on a CPU with
    these caches (`host.cpu_facts()["cache_bytes"]`): memory-bound when the weights are at
    least 3x the last-level cache (the largest level). Returns {weight_bytes,
    last_level_cache_bytes, weights_over_cache, memory_bound}; the last three are None when the
    cache sizes are unknown."""
    last = max(cache_bytes.values()) if cache_bytes else None
    ratio = weight_bytes / last if last else None
    return {"weight_bytes": float(weight_bytes), "last_level_cache_bytes": last,
            "weights_over_cache": ratio, "memory_bound": None if ratio is None else ratio >= 3.0}


def mean_position(lengths: Sequence[int]) -> float:
    """The mean number of cached tokens a step attends to, over the generated tokens of rows of
    `lengths`: the step that generates a row's j-th token (0-based) reads j + 1 keys and values
    (BOS and the j tokens before it), so a row of n tokens averages (n + 1) / 2 and rows weigh
    by their tokens."""
    n = np.asarray(lengths, np.float64)
    return float((n * (n + 1) / 2).sum() / max(n.sum(), 1.0))


@jax.jit
def _read(x):
    return jnp.sum(x)


def measure_bandwidth(num_bytes: int = BANDWIDTH_BYTES, repeats: int = 10) -> Dict[str, float]:
    """Streaming-read bandwidth of the default device: a jitted sum over a float32 array of
    `num_bytes` (far above the last-level cache), timed by `costs.interleaved`."""
    x = jax.block_until_ready(jnp.ones((max(num_bytes // 4, 1),), jnp.float32))
    first, times, _ = costs_lib.interleaved({"read": lambda: _read(x)}, repeats)
    [read] = times.values()
    median, fastest = float(np.median(read)), float(np.min(read))
    return {"bytes": x.nbytes, "median_s": median, "min_s": fastest,
            "first_call_s": first["read"], "gb_per_s": x.nbytes / median / 1e9,
            "gb_per_s_best": x.nbytes / fastest / 1e9}


def git_commit(repo_dir: Optional[str] = None) -> Optional[str]:
    """The git HEAD sha of `repo_dir` (default: the repository holding this package), with
    '-dirty' appended when tracked files differ from it; None outside a git work tree or without
    git."""
    repo_dir = repo_dir or os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

    def git(*args):
        return subprocess.run(["git", "-C", repo_dir, *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "") if sha else None


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """The command that started this process, as it could be typed again: 'python ' plus
    `sys.argv` (or `argv`) shell-quoted."""
    return "python " + shlex.join(list(sys.argv if argv is None else argv))


def provenance(command: Optional[str] = None, *, load: Any = None, bandwidth: bool = False,
               repo_dir: Optional[str] = None) -> Dict[str, Any]:
    """What every results JSON records about how it was made, under its `provenance` key:

      commit   git HEAD sha, '-dirty' when the tree had changes; None outside git
      command  `command`, or this process's command line (`command_line`)
      date     UTC, ISO-8601 to the second
      host     {cpu_model, last_level_cache_bytes, cache_bytes, cores, load, bandwidth_gb_per_s}

    `load` is the run's `LoadAverage` (its `record()`: before and after) or a dict; without it
    the load is read now, as `before`. `bandwidth=True` adds a quick streaming-read figure
    (`measure_bandwidth` over 128 MiB, 3 repeats; a fraction of a second on a CPU, and not the
    1 GiB figure a timed run records), else None.
    """
    facts = cpu_facts()
    caches = facts["cache_bytes"]
    if load is None:
        load = {"before": os.getloadavg()[0]}
    elif isinstance(load, LoadAverage):
        load = load.record()
    gbps = None
    if bandwidth:
        gbps = measure_bandwidth(128 << 20, repeats=3)["gb_per_s"]
    return {
        "commit": git_commit(repo_dir),
        "command": command if command is not None else command_line(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpu_model": facts["model"],
                 "last_level_cache_bytes": max(caches.values()) if caches else None,
                 "cache_bytes": caches, "cores": os.cpu_count(), "load": dict(load),
                 "bandwidth_gb_per_s": gbps},
    }
