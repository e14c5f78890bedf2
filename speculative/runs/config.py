"""T5X-style gin flags for the scripts: `--gin_file`, `--gin_bindings`, `--gin.NAME=VALUE`.

    python scripts/benchmark.py --gin_file=configs/runs/benchmark.gin \
        --gin.GAMMA=5 --gin.OUTPUT_DIR=\"/tmp/bench\"

`--gin.NAME=VALUE` is rewritten into `--gin_bindings=NAME = VALUE` (t5x/gin_utils.py
`rewrite_gin_args`); string values need literal quotes as in T5X. Files are searched in
`--gin_search_paths` (default: the current directory and the repository root, so
`configs/...` works from anywhere inside a checkout).
"""

from __future__ import annotations

import difflib
import os
import re
import signal
import sys
import threading
from typing import Callable, Optional, Sequence

import gin
from absl import app, flags

from speculative import files
from speculative.files import check_writable as check_writable

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def define_flags() -> None:
    """Defines the gin flags once (scripts and tests may import several run modules)."""
    if "gin_file" in flags.FLAGS:
        return
    flags.DEFINE_multi_string("gin_file", [], "Gin files to parse, in order (later override).")
    flags.DEFINE_multi_string("gin_bindings", [], "Individual gin bindings, after the files; "
                              "write them as --gin.NAME=VALUE.")
    flags.DEFINE_list("gin_search_paths", [".", REPO_ROOT], "Where relative gin paths resolve.")
    flags.DEFINE_bool("multihost", False,
                      "Call jax.distributed.initialize() before the run (Cloud TPU pods, GKE and "
                      "SLURM need nothing else; elsewhere give the three flags below).")
    flags.DEFINE_string("coordinator_address", None,
                        "host:port of process 0, for jax.distributed (implies --multihost).")
    flags.DEFINE_integer("num_processes", None, "Processes in the job (jax.distributed).")
    flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")
    flags.DEFINE_integer("distributed_timeout", 300,
                         "Seconds to wait for every process of a multi-process job to join.")


def rewrite_gin_args(argv: Sequence[str]) -> list:
    """`--gin.NAME=VALUE` -> `--gin_bindings=NAME = VALUE` (other arguments unchanged)."""
    out = []
    for arg in argv:
        if arg.startswith("--gin.") and "=" in arg:
            name, value = arg[len("--gin."):].split("=", 1)
            out.append(f"--gin_bindings={name} = {value}")
        else:
            out.append(arg)
    return out


_MACRO = re.compile(r"^\s*([A-Z][A-Z0-9_]*)\s*=", re.M)
_INCLUDE = re.compile(r"^\s*include\s+['\"]([^'\"]+)['\"]", re.M)


def _find(name: str, search_paths: Sequence[str]) -> Optional[str]:
    for base in ("",) + tuple(search_paths):
        path = os.path.join(base, name)
        if os.path.exists(path):
            return path
    return None


_REFERENCE = re.compile(r"%([A-Z][A-Z0-9_]*)")


def _macro_sources(gin_files: Sequence[str], search_paths: Sequence[str]):
    """({macro: file defining it}, {macro referenced as %NAME: a file reading it}) over the
    files and their includes."""
    defined, referenced, todo, seen = {}, {}, list(gin_files), set()
    while todo:
        path = _find(todo.pop(), search_paths)
        if path is None or path in seen:
            continue
        seen.add(path)
        with open(path) as f:
            text = "\n".join(line.split("#", 1)[0] for line in f.read().splitlines())
        for name in _MACRO.findall(text):
            defined.setdefault(name, path)
        for name in _REFERENCE.findall(text):
            referenced.setdefault(name, path)
        todo += _INCLUDE.findall(text)
    return defined, referenced


def defined_macros(gin_files: Sequence[str], search_paths: Sequence[str]) -> set:
    """Macro names (`NAME = ...` at the top level) the files and their includes define."""
    return set(_macro_sources(gin_files, search_paths)[0])


def check_macros(gin_files: Sequence[str], gin_bindings: Sequence[str],
                 search_paths: Sequence[str] = (".", REPO_ROOT)) -> None:
    """Refuses a binding `NAME = ...` of a macro no gin file defines (gin would accept it and
    never use it: a typo like --gin.TEMPERATUR=1.0 would silently keep the default)."""
    defined, referenced = _macro_sources(gin_files, search_paths)
    known = set(defined) | set(referenced)  # a binding may define a macro a file only reads
    for binding in gin_bindings:
        match = _MACRO.match(binding)
        if match and match.group(1) not in known:
            name = match.group(1)
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise ValueError(
                f"--gin.{name}: no gin file defines the macro {name}"
                + (f"; did you mean {close[0]}?" if close else
                   f"; the files define {sorted(known)}."))
    # A macro read (%NAME) that nothing defines would reach the run as gin's bare macro object.
    for binding in gin_bindings:
        for name in _REFERENCE.findall(binding):
            referenced.setdefault(name, f"--gin binding {binding!r}")
    settable = set(defined) | {m.group(1) for m in map(_MACRO.match, gin_bindings) if m}
    for name, where in sorted(referenced.items()):
        if name not in settable:
            close = difflib.get_close_matches(name, sorted(settable), n=1)
            raise ValueError(
                f"{where}: %{name} is read but no gin file defines the macro {name}"
                + (f"; did you mean %{close[0]}?" if close else
                   f"; define it (e.g. {name} = ...) or bind it with --gin.{name}=..."))
    # A macro a file defines but nothing reads is a typo in that file (TEMPERATUR = 1.0).
    for name, path in sorted(defined.items()):
        if name not in referenced:
            close = difflib.get_close_matches(name, sorted(referenced), n=1)
            raise ValueError(
                f"{path}: the macro {name} is set but nothing reads it (no %{name} in the gin "
                "files)" + (f"; did you mean {close[0]}?" if close else "; remove it."))


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
              search_paths: Sequence[str] = (".", REPO_ROOT)) -> None:
    """Parses gin files and bindings; a missing file raises with the paths that were searched,
    and a binding of an unknown macro raises with the closest known name."""
    for path in search_paths:
        gin.add_config_file_search_path(path)
    for name in gin_files:
        if _find(name, search_paths) is None:
            raise FileNotFoundError(
                f"Gin file {name!r} not found in {list(search_paths)}; pass a path relative to "
                "one of them or an absolute path.")
    check_macros(gin_files, gin_bindings, search_paths)
    gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings), finalize_config=False)


def flag_numbers(values: Sequence[str], name: str, kind: Callable = float) -> list:
    """A comma-separated list flag (`flags.DEFINE_list`) as numbers; a value that is not one is
    a usage error naming the flag and the fix."""
    from absl import app  # pylint: disable=g-import-not-at-top

    try:
        return [kind(v) for v in values]
    except ValueError as e:
        raise app.UsageError(f"--{name}={','.join(values)}: {e}; give comma-separated "
                             f"{kind.__name__}s.") from e


def write_config(output_dir: str, name: str = "config.gin") -> str:
    """Saves the operative (resolved) gin config next to a run's results; returns its path."""
    return files.write_atomic(os.path.join(output_dir, name), gin.operative_config_str())


def initialize_distributed(coordinator_address: Optional[str] = None,
                           num_processes: Optional[int] = None,
                           process_id: Optional[int] = None, timeout_s: int = 300) -> None:
    """`jax.distributed.initialize` (a multi-process job: every process runs the same script;
    meshes then span all processes' devices, each process feeds and reads only its devices'
    blocks, and process 0 writes the outputs). On CPU, collectives go through gloo."""
    import jax  # pylint: disable=g-import-not-at-top

    given = [coordinator_address is None, num_processes is None, process_id is None]
    if any(given) and not all(given):
        raise ValueError(
            f"coordinator_address={coordinator_address!r}, num_processes={num_processes!r}, "
            f"process_id={process_id!r}: give all three (or none, where the cluster is "
            "detected: Cloud TPU, GKE, SLURM).")
    if num_processes is not None and (num_processes < 1 or not 0 <= process_id < num_processes):
        raise ValueError(f"process_id={process_id} must lie in [0, num_processes={num_processes}).")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
        raise ValueError(f"distributed_timeout={timeout_s!r} must be a number of seconds >= 1.")
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    where = coordinator_address or "the cluster's coordinator"
    print(f"Waiting up to {timeout_s} s for {num_processes or 'all'} processes to join at {where} "
          f"(this is process {process_id if process_id is not None else '?'}); if a peer never "
          "starts, JAX stops the job after the timeout (--distributed_timeout).", flush=True)
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               initialization_timeout=timeout_s)
    print(f"Joined: process {jax.process_index()} of {jax.process_count()}.", flush=True)


def is_writer() -> bool:
    """True in the process that writes a run's outputs (process 0; the only one if single)."""
    import jax  # pylint: disable=g-import-not-at-top

    return jax.process_index() == 0


def run(main: Callable[[], None]) -> None:
    """Entry point for scripts: defines flags, rewrites `--gin.X`, parses gin, calls `main()`.

    absl prints the script's module docstring for `--help`, so every script's docstring says
    what it does and shows an example command.
    """
    define_flags()
    _show_in_help(["gin_file", "gin_bindings", "multihost", "coordinator_address",
                   "num_processes", "process_id", "distributed_timeout"])

    def _main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
        parse_gin(flags.FLAGS.gin_file, flags.FLAGS.gin_bindings, flags.FLAGS.gin_search_paths)
        f = flags.FLAGS
        # Any of the three flags means a multi-process job: an incomplete set is refused, never
        # run as a lone process that writes outputs as if it were alone.
        if (f.multihost or f.coordinator_address or f.num_processes is not None
                or f.process_id is not None):
            initialize_distributed(f.coordinator_address, f.num_processes, f.process_id,
                                   f.distributed_timeout)
        main()

    app.run(user_errors(_main), argv=rewrite_gin_args(sys.argv))


def _show_in_help(names: Sequence[str]) -> None:
    """Lists the shared flags under the script's own in `--help` (absl shows only the main
    module's flags there, and these are defined here)."""
    for name in names:
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, like Ctrl-C's KeyboardInterrupt."""


def stop_cleanly_on_sigterm() -> None:
    """Makes SIGTERM (a job scheduler's stop, `kill`, `timeout`) unwind like Ctrl-C: the
    writers' clean-up runs (staging directories and temporary files are removed, the earlier
    result stays), where Python's default would end the process on the spot."""
    def stop(signum, frame):
        raise Terminated(f"stopped by signal {signum} (SIGTERM)")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


# What a user's input can raise: one clear message (they name the value and the fix), exit 2.
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError,
               PermissionError)


def user_errors(main: Callable) -> Callable:
    """Wraps an absl main: a user error prints `error: <message>` and exits with status 2 (the
    traceback too with --verbose); other exceptions keep their traceback."""
    if "verbose" not in flags.FLAGS:
        flags.DEFINE_bool("verbose", False, "On a usage error, print the whole traceback too.")
    _show_in_help(["verbose"])

    def wrapped(argv):
        stop_cleanly_on_sigterm()
        try:
            return main(argv)
        except USER_ERRORS as e:
            if "verbose" in flags.FLAGS and flags.FLAGS.verbose:
                raise
            message = str(e).split("\n  In call to configurable")[0]  # gin's suffix
            print(f"error: {message}", file=sys.stderr)
            sys.exit(2)

    return wrapped
