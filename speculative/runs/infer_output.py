"""Stage 6 of inference (`runs/infer.py`): write the outputs as T5X's infer does, resumably.

    out = RunOutput(settings, task_name)   # before any work: refuses what must not be touched
    done = out.start(plan_json)            # chunks an interrupted run of this command finished
    out.write_chunk(chunk) ...             # each chunk, then its completion marker
    out.finish(metrics)                    # the merged file, metrics.json, config.gin

Files under INFER_OUTPUT_DIR, named as T5X names them:

  <task>-<mode>.jsonl-<shard:05d>-of-<num_shards:05d>   one line per example: `inputs` (the
                                 pretokenized features), `prediction` (mode 'predict') or
                                 `score` (mode 'score'), and our per-example numbers
  <that name>.COMPLETED          the shard is complete
  metrics.json                   (metrics-<shard:05d>-of-<num_shards:05d>.json with shards)
  config.gin                     the resolved config
  tmp-<task>-<shard:05d>-of-<num_shards:05d>/   while running: `<name>-chunk<i:05d>` (the
                                 chunk's lines) and `<name>-chunk<i:05d>.COMPLETED` (written
                                 after it; ours holds the chunk's decode statistics), the
                                 plan (`plan.json`) and the settings (`settings.json`)

Every file is written through a temporary name and renamed into place. A run killed at any
point leaves its complete chunks; the same command run again resumes after them (with the
recorded plan, so it decodes the rest as the first run would have) and the merged file equals
an uninterrupted run's, byte for byte (a multi-process run starts over instead: its processes
decode together, and only process 0 writes). Other settings in the same directory are refused
unless OVERWRITE. A completed shard is never replaced unless OVERWRITE: the new files then replace
the earlier ones together at the end (`files.write_atomic_group`), so an interruption leaves
the earlier complete run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np
from absl import logging

from speculative import files
from speculative.beam import search as beam_lib
from speculative.decode import stats as stats_lib
from speculative.runs import config as config_lib
from speculative.runs.infer_settings import InferSettings

CONFIG_FILE = "config.gin"
EXTENSION = "jsonl"
# Settings that change nothing in the lines: a rerun with other values still resumes.
NOT_IN_OUTPUT = ("overwrite", "progress", "time_limit_s", "tfds_data_dir")


def output_name(task_name: str, mode: str, shard_id: int, num_shards: int) -> str:
    """T5X's output file name: `<task>-<mode>.jsonl-<shard:05d>-of-<num_shards:05d>`."""
    return f"{task_name}-{mode}.{EXTENSION}-{shard_id:05d}-of-{num_shards:05d}"


def _stats_json(stats) -> Any:
    """A batch's statistics as JSON (a DecodeStats or BeamSearchResult's fields), or None."""
    if stats is None:
        return None
    return {"type": type(stats).__name__, **{
        f.name: None if getattr(stats, f.name) is None
        else np.asarray(getattr(stats, f.name)).tolist() for f in dataclasses.fields(stats)}}


def _stats_of(data) -> Any:
    if data is None:
        return None
    cls = {"DecodeStats": stats_lib.DecodeStats,
           "BeamSearchResult": beam_lib.BeamSearchResult}[data.pop("type")]
    return cls(**{k: np.asarray(v) if isinstance(v, list) else v for k, v in data.items()})


class RunOutput:
    """The files of one shard of one run (module docstring); a no-op without INFER_OUTPUT_DIR
    (the chunks are then kept in memory)."""

    def __init__(self, settings: InferSettings, task_name: str):
        self.settings = settings
        self.dir = settings.output_dir
        shard = f"{settings.shard_id:05d}-of-{settings.num_shards:05d}"
        self.name = output_name(task_name, settings.infer_mode, settings.shard_id,
                                settings.num_shards)
        self.metrics_name = "metrics.json" if settings.num_shards == 1 else \
            f"metrics-{shard}.json"
        self._own = re.compile(
            rf"({re.escape(task_name)}-{settings.infer_mode}\.{EXTENSION}-\d{{5}}-of-\d{{5}}"
            rf"(\.COMPLETED)?|tmp-{re.escape(task_name)}-\d{{5}}-of-\d{{5}}|"
            rf"metrics(-\d{{5}}-of-\d{{5}})?\.json|{CONFIG_FILE})")
        self.tmp = os.path.join(self.dir, f"tmp-{task_name}-{shard}") if self.dir else None
        self._memory: Dict[int, Tuple[list, list, list]] = {}
        self.resumed: List[int] = []

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _settings_json(self) -> str:
        data = {k: v for k, v in self.settings.to_json().items() if k not in NOT_IN_OUTPUT}
        return json.dumps(files.json_ready(data), sort_keys=True, indent=1, default=str)

    def check(self) -> None:
        """Before any work: a file in the way, files that are not a run's, or an earlier
        complete shard (unless OVERWRITE) are refused; an unwritable place too."""
        if not self.dir:
            return
        what = "INFER_OUTPUT_DIR"
        if os.path.exists(self.dir) and not os.path.isdir(self.dir):
            raise FileExistsError(f"{what}={self.dir!r} is a file, not a directory; choose a "
                                  "directory path.")
        held = sorted(os.listdir(self.dir)) if os.path.isdir(self.dir) else []
        foreign = [n for n in held if not self._own.fullmatch(n)]
        if foreign:
            raise FileExistsError(
                f"{what}={self.dir!r} holds {foreign[:5]}, which are not this run's files; "
                "choose a new directory (a run never writes beside other files).")
        if os.path.exists(self.path(self.name + ".COMPLETED")) and not self.settings.overwrite:
            raise FileExistsError(
                f"{what}={self.dir!r} already holds {[self.name, self.metrics_name]} from an "
                "earlier run; choose a new directory or pass --gin.OVERWRITE=True to replace "
                "that run.")
        if self.tmp and os.path.isdir(self.tmp) and not self.settings.overwrite:
            saved = os.path.join(self.tmp, "settings.json")
            if os.path.exists(saved) and open(saved).read() != self._settings_json():
                raise FileExistsError(
                    f"{what}={self.dir!r} holds the chunks of an interrupted run with other "
                    f"settings ({saved}); rerun that command to resume it, choose a new "
                    "directory, or pass --gin.OVERWRITE=True to start over.")
        files.check_writable(os.path.dirname(os.path.abspath(self.dir)), what)

    def start(self) -> Tuple[Set[int], Optional[Dict[str, Any]]]:
        """`(chunks already complete, the recorded plan's JSON or None)`; with OVERWRITE an
        interrupted run's chunks are dropped and the run starts over."""
        if not self.tmp or not config_lib.is_writer():
            return set(), None
        import jax  # pylint: disable=g-import-not-at-top

        # Every process decodes every chunk together, and only process 0 sees the chunks: a
        # multi-process run starts over rather than resume on one process alone.
        if (self.settings.overwrite or jax.process_count() > 1) and os.path.isdir(self.tmp):
            shutil.rmtree(self.tmp)
        os.makedirs(self.tmp, exist_ok=True)
        files.write_atomic(os.path.join(self.tmp, "settings.json"), self._settings_json())
        done = set()
        for name in os.listdir(self.tmp):
            match = re.fullmatch(re.escape(self.name) + r"-chunk(\d{5})\.COMPLETED", name)
            if match and os.path.exists(os.path.join(self.tmp, name[:-len(".COMPLETED")])):
                done.add(int(match.group(1)))
        plan_path = os.path.join(self.tmp, "plan.json")
        plan = json.load(open(plan_path)) if done and os.path.exists(plan_path) else None
        if done:
            self.resumed = sorted(done)
            logging.warning("Resuming %s: chunks %s are complete (%s); decoding the rest.",
                            self.name, self.resumed, self.tmp)
        return done, plan

    def save_plan(self, plan_json: Dict[str, Any]) -> None:
        if self.tmp and config_lib.is_writer():
            files.write_atomic(os.path.join(self.tmp, "plan.json"),
                               json.dumps(files.json_ready(plan_json), indent=1))

    def _chunk(self, index: int) -> str:
        return os.path.join(self.tmp, f"{self.name}-chunk{index:05d}")

    def write_chunk(self, chunk) -> None:
        """The chunk's lines, then its marker (with its statistics), each written atomically."""
        if not self.tmp or not config_lib.is_writer():
            self._memory[chunk.index] = (chunk.records, chunk.stats, chunk.rows)
            return
        path = self._chunk(chunk.index)
        files.write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                         for r in chunk.records))
        files.write_atomic(path + ".COMPLETED", json.dumps(
            {"rows": chunk.rows, "stats": [_stats_json(s) for s in chunk.stats]}))
        logging.info("Wrote chunk %d (%d lines) to %s", chunk.index, len(chunk.records), path)

    def read_chunks(self, count: int) -> Tuple[List[Dict[str, Any]], List[Any], List[int]]:
        """`(records, stats, rows)` of chunks 0..count-1, in order (from disk or memory)."""
        records, stats, rows = [], [], []
        for index in range(count):
            if index in self._memory:
                r, s, n = self._memory[index]
            else:
                with open(self._chunk(index), encoding="utf-8") as f:
                    r = [json.loads(line) for line in f]
                with open(self._chunk(index) + ".COMPLETED", encoding="utf-8") as f:
                    marker = json.load(f)
                s, n = [_stats_of(x) for x in marker["stats"]], marker["rows"]
            records += r
            stats += s
            rows += n
        return records, stats, rows

    def finish(self, count: int, metrics: Dict[str, Any]) -> Dict[str, str]:
        """Merges the `count` chunks and writes the shard's files as one group (the marker
        last), then removes the chunks; returns {kind: path}."""
        if not self.dir or not config_lib.is_writer():
            return {}
        merged = b"".join(open(self._chunk(i), "rb").read() for i in range(count))
        paths = {"predictions": self.path(self.name), "config": self.path(CONFIG_FILE),
                 "metrics": self.path(self.metrics_name)}
        config_text = open(config_lib.write_config(self.tmp, CONFIG_FILE)).read()
        files.write_atomic_group({
            paths["predictions"]: merged, paths["config"]: config_text,
            paths["metrics"]: json.dumps(files.json_ready(dict(metrics, files=paths)),
                                         indent=2, ensure_ascii=False),
            self.path(self.name + ".COMPLETED"): ""})
        shutil.rmtree(self.tmp)
        return paths
