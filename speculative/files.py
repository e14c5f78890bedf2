"""Writing results so that an interruption never leaves a half-written or mixed output.

`write_atomic` writes one file under a temporary name in the same directory and renames it into
place (a rename within a filesystem is atomic); `replace_directory` swaps a complete staging
directory in for an earlier one. Every writer of results, checkpoints' metadata and model cards
goes through these two.

`new_run_dir` makes a fresh directory for one run (never an earlier run's), and `append_run`
adds that run's record to the append-only index `results/runs.jsonl`.
"""

import contextlib
import datetime
import json
import math
import os
import shutil
from typing import Any, Dict, Iterable, Optional, Sequence, Set, Union

import numpy as np


@contextlib.contextmanager
def quiet_stderr():
    """Silences file descriptor 2 for the block (C++ libraries that log before any setting can
    reach them, e.g. TensorFlow's start-up lines). A Python exception raised inside still
    propagates with its message once the block ends."""
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def json_ready(obj: Any) -> Any:
    """For strict JSON: NaN/inf -> None, numpy -> Python, tuples -> lists, dict keys -> str
    (recursively)."""
    if isinstance(obj, dict):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_ready(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        obj = float(obj)
        return obj if math.isfinite(obj) else None
    return obj


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table (the reports' `.md` files): the header, its rule, one line per
    row (cells through `str`), a final newline."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]) + "\n"


def write_atomic(path: str, data: Union[str, bytes], *, fsync: bool = False) -> str:
    """Writes `data` (text as UTF-8, or bytes) to `path` through a temporary file renamed into
    place: readers see the earlier file or the complete new one. The directory is created if
    missing; on any failure (Ctrl-C included) the temporary file is removed. Returns `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def write_atomic_group(contents: Dict[str, Union[str, bytes]]) -> None:
    """Writes several files that belong together (a result and its config): every one is
    written in full under a temporary name first, then all are renamed into place back to
    back, in the given order (the results file last). An interruption while writing leaves the
    earlier files untouched; only the renames, microseconds apart, could be split."""
    staged = []
    try:
        for path, data in contents.items():
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            tmp = f"{path}.tmp{os.getpid()}"
            staged.append((tmp, path))
            with open(tmp, "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
        for tmp, path in staged:
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.remove(tmp)


def replace_directory(staging: str, final: str) -> None:
    """Moves the complete directory `staging` to `final`, replacing what was there: the earlier
    directory is renamed aside first and deleted after, so an interruption leaves one complete
    version (between the two renames, the earlier one waits in `<final>.old-*`). Interrupted
    (Ctrl-C, SIGTERM through `runs.config.stop_cleanly_on_sigterm`), it puts the earlier
    directory back and removes `staging`."""
    old = None
    try:
        if os.path.exists(final):
            old = f"{final}.old-{os.getpid()}"
            os.replace(final, old)
        os.replace(staging, final)
    except BaseException:
        if old and os.path.exists(old) and not os.path.exists(final):
            os.replace(old, final)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old:
        shutil.rmtree(old)


def check_report(output_dir: str, stem: str, overwrite: bool) -> None:
    """Refuses, before any work, a report (`<stem>.json` + `<stem>.md`) that would replace an
    earlier one in `output_dir` unless `overwrite`."""
    path = os.path.join(output_dir, f"{stem}.json")
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path} exists; pass --overwrite or another --output_dir.")


def write_report(output_dir: str, stem: str, result: Dict, markdown: str) -> None:
    """A report's `<stem>.md` and `<stem>.json` (strict JSON), written together
    (`write_atomic_group`, the JSON last)."""
    os.makedirs(output_dir, exist_ok=True)
    write_atomic_group({os.path.join(output_dir, f"{stem}.md"): markdown,
                        os.path.join(output_dir, f"{stem}.json"):
                            json.dumps(json_ready(result), indent=1)})


def check_writable(directory: str, what: str) -> None:
    """Creates `directory` if needed and writes and removes a probe file there, so a place a
    run cannot write fails before the run's work, naming `what` (e.g. 'OUTPUT_DIR')."""
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".write_probe_{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:  # the reason in words, without Python's "[Errno N]" prefix
        reason = f"{e.strerror.lower()}: {e.filename}" if e.strerror and e.filename else (
            e.strerror or str(e))
        raise PermissionError(f"{what}={directory!r} cannot be written ({reason}); choose a "
                              "writable directory.") from e


def check_output_dir(output_dir, name: Optional[str] = None, overwrite: bool = True) -> str:
    """Before any work: a usable directory path, writable, and (unless `overwrite`) without an
    earlier results file `name`."""
    if not isinstance(output_dir, str) or not output_dir:
        raise ValueError(f"output_dir={output_dir!r} is invalid: give a directory path, e.g. "
                         "--gin.OUTPUT_DIR=\\\"/tmp/bench\\\".")
    if name and not overwrite and os.path.exists(os.path.join(output_dir, name)):
        raise FileExistsError(f"{os.path.join(output_dir, name)} holds an earlier run; choose "
                              "another OUTPUT_DIR or pass --gin.OVERWRITE=True to replace it.")
    check_writable(output_dir, "output_dir")
    return output_dir


def check_run_dir(output_dir: str, own: Set[str], overwrite: bool, what: str) -> None:
    """Before any work, for a run that replaces its directory whole (`replace_directory`): refuse
    a path that is a file, a directory that holds files unless `overwrite`, and, even with
    `overwrite`, a directory that holds anything but the run's `own` files (replacing the
    directory would delete them); and make sure the directory can be created and written.
    `what` names the setting in the errors (e.g. 'INFER_OUTPUT_DIR')."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise FileExistsError(f"{what}={output_dir!r} is a file, not a directory; choose a "
                              "directory path.")
    held = sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []
    foreign = sorted(set(held) - set(own))
    if foreign:
        raise FileExistsError(
            f"{what}={output_dir!r} holds {foreign[:5]}, which are not this run's files; a run "
            "replaces its directory whole, so it refuses one holding anything else (even with "
            "--gin.OVERWRITE=True). Choose a new directory.")
    if held and not overwrite:
        raise FileExistsError(
            f"{what}={output_dir!r} already holds {held[:5]} from an earlier run; choose a new "
            "directory or pass --gin.OVERWRITE=True to replace that run.")
    check_writable(os.path.dirname(os.path.abspath(output_dir)), what)


def new_run_dir(root: str, stem: str) -> str:
    """Creates and returns a fresh directory `root/<stem>-<UTC yyyymmdd-HHMMSS>`, with `-2`,
    `-3`, ... appended when that name is taken: never an existing directory, so a run cannot mix
    its files with an earlier run's (creation is `os.mkdir`, which fails on an existing name)."""
    os.makedirs(root, exist_ok=True)
    base = os.path.join(
        root, f"{stem}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}")
    path, n = base, 1
    while True:
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            n += 1
            path = f"{base}-{n}"


def append_run(index_path: str, record: Dict) -> None:
    """Appends `record` (strict JSON, one line) to the append-only run index `index_path`
    (`results/runs.jsonl`): one `write` of the whole line to a file opened for appending, then
    flush and fsync, so concurrent writers do not interleave within a line and a crash loses at
    most the line being written. Earlier lines are never rewritten."""
    line = json.dumps(json_ready(record), sort_keys=True, separators=(",", ":")) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(index_path)), exist_ok=True)
    with open(index_path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
