"""T5X-style gin flags for the scripts: `--gin_file`, `--gin_bindings`, `--gin.NAME=VALUE`.

    python scripts/benchmark.py --gin_file=configs/runs/benchmark.gin \
        --gin.GAMMA=5 --gin.OUTPUT_DIR=\"/tmp/bench\"

`--gin.NAME=VALUE` is rewritten into `--gin_bindings=NAME = VALUE` (t5x/gin_utils.py
`rewrite_gin_args`); string values need literal quotes as in T5X. Files are searched in
`--gin_search_paths` (default: the current directory and the repository root, so
`configs/...` works from anywhere inside a checkout).

Every script enters through `run` (gin scripts) or `run_app` (flag-only scripts), which give
them the same behaviour: a mistake a user can make (a bad flag, an unquoted gin string, a
missing `--gin_file`) ends in one line `error: ...` naming the fix (exit 2); `--help` exits 0;
SIGTERM and Ctrl-C stop the process within seconds, even inside a long jitted call or XLA
compilation, leaving every result already written as it was (`stop_promptly_on_signals`);
progress bars show only when stderr is a terminal (`progress_bars_on_terminal_only`);
compiles go through JAX's persistent compilation cache (`enable_compilation_cache`: in
~/.cache/speculative/jax_cache, or JAX_COMPILATION_CACHE_DIR; SPECULATIVE_JAX_CACHE=0 turns it
off, SPECULATIVE_JAX_CACHE=DIR moves it), so a rerun compiles nothing.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import signal
import sys
import threading
import tokenize
from typing import Callable, Optional, Sequence

import gin
from absl import app, flags

from speculative import files
from speculative.checkpoints import config_gin

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
_MACRO_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_ALIAS = re.compile(r"^[A-Z][A-Z0-9_]*\s*=\s*%([A-Z][A-Z0-9_]*)\s*$", re.MULTILINE)


def _macro_sources(gin_files: Sequence[str], search_paths: Sequence[str]):
    """({macro: file defining it}, {macro referenced as %NAME: a file reading it}, {macros
    some file reads only as another's alias, `A = %B`: B}) over the files and their includes."""
    defined, referenced, todo, seen = {}, {}, list(gin_files), set()
    aliased = set()
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
        aliased.update(_ALIAS.findall(text))
        todo += _INCLUDE.findall(text)
    return defined, referenced, aliased


def defined_macros(gin_files: Sequence[str], search_paths: Sequence[str]) -> set:
    """Macro names (`NAME = ...` at the top level) the files and their includes define."""
    return set(_macro_sources(gin_files, search_paths)[0])


def check_macros(gin_files: Sequence[str], gin_bindings: Sequence[str],
                 search_paths: Sequence[str] = (".", REPO_ROOT)) -> None:
    """Refuses a binding `NAME = ...` of a macro no gin file defines (gin would accept it and
    never use it: a typo like --gin.TEMPERATUR=1.0 would silently keep the default)."""
    defined, referenced, _ = _macro_sources(gin_files, search_paths)
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
    and a binding of an unknown macro raises with the closest known name.

    One of T5X's own model gin files (e.g. `t5x/examples/t5/t5_1_1/tiny.gin`, which includes
    base.gin) is read, not executed: its `network.T5Config` becomes our T5Config bound in the
    `network` scope, picked as `--gin.TARGET_MODEL=@network/t5.T5Config()`; what only T5X's
    trainer reads (optimizer, vocabulary, losses) is skipped with a one-line note."""
    for path in search_paths:
        gin.add_config_file_search_path(path)
    ours, t5x_models = [], []
    for name in gin_files:
        path = _find(name, search_paths)
        if path is None:
            raise FileNotFoundError(
                f"Gin file {name!r} not found in {list(search_paths)}; pass a path relative to "
                "one of them or an absolute path.")
        if config_gin.is_t5x_gin(path):
            model = config_gin.read_t5x_gin(path, search_paths)
            logging.info("%s is a T5X model gin file: %s; pick it as @network/t5.T5Config()",
                         name, model.describe())
            for note in model.skipped:
                logging.info("%s: %s", name, note)
            t5x_models.append(config_gin.gin_bindings(model))
        else:
            ours.append(name)
    check_macros(ours, gin_bindings, search_paths)
    try:
        for text in t5x_models:
            gin.parse_config(text)
        gin.parse_config_files_and_bindings(ours, list(gin_bindings), finalize_config=False)
    except (SyntaxError, tokenize.TokenError) as e:
        raise ValueError(parse_error_message(e, gin_bindings)) from None


# A value gin cannot read that starts like a bare word or a path: an unquoted string.
_BARE = re.compile(r"^[A-Za-z_./~][^'\"]*$")
_LITERALS = {"True", "False", "None"}


def _flag_form(binding: str) -> Optional[tuple]:
    """`NAME = value` -> (NAME, value) for a one-line binding, else None."""
    if "=" not in binding or "\n" in binding.strip():
        return None
    name, value = (part.strip() for part in binding.split("=", 1))
    return (name, value) if name and value else None


def _parses(binding: str) -> bool:
    """Whether gin's parser reads `binding` (unknown configurables allowed; nothing bound)."""
    from gin import config_parser  # pylint: disable=g-import-not-at-top

    try:
        for _ in config_parser.ConfigParser(binding, gin.config.ParserDelegate(skip_unknown=True)):
            pass
    except (SyntaxError, tokenize.TokenError, ValueError):
        return False
    return True


def parse_error_message(error: Exception, gin_bindings: Sequence[str] = ()) -> str:
    """One line for a gin syntax error: the binding or file line gin could not read, and the
    fix; a value that reads as a bare word or path is an unquoted string, and the line shows
    it quoted as the shell needs it (`--gin.OUT=\\"out/b4\\"`)."""
    for binding in gin_bindings:
        if _parses(binding):
            continue
        form = _flag_form(binding)
        if form and _BARE.match(form[1]) and form[1] not in _LITERALS:
            name, value = form
            return (f"--gin.{name}={value}: gin reads {value} as a name, not a string; quote it "
                    f'(in a shell: --gin.{name}=\\"{value}\\", in a gin file: {name} = '
                    f'"{value}"); references are written @name() and macros %NAME.')
        return (f"--gin_bindings={binding!r}: gin cannot parse it; write NAME = VALUE with a "
                "Python literal (quoted strings, numbers, lists, None), an @reference() or a "
                "%MACRO.")
    where = getattr(error, "filename", None)
    line = (getattr(error, "text", None) or "").strip()
    detail = getattr(error, "msg", None) or (error.args[0] if error.args else str(error))
    detail = str(detail).splitlines()[0]
    if where:
        return (f"{where}, line {getattr(error, 'lineno', '?')}: gin cannot parse {line!r} "
                f"({detail}); fix that line: NAME = VALUE with quoted strings, @references() "
                "and %MACROS.")
    return (f"gin cannot parse the gin files ({detail}): an unclosed bracket or quote in one of "
            "them; check each file's last lines.")


def unset_required(gin_files: Sequence[str],
                   search_paths: Sequence[str] = (".", REPO_ROOT)) -> list:
    """The macros the files define that are still `%gin.REQUIRED` after parsing (gin checks
    them only when a config is finalized, and a run would otherwise get its sentinel)."""
    missing = []
    defined, _, aliases = _macro_sources(gin_files, search_paths)
    # An alias (`TARGET_CHECKPOINT = %CHECKPOINT_PATH`: T5X's name for ours) is set when either
    # name is: the macro it reads is reported through the alias (`is_required` follows it),
    # never on its own.
    for name in sorted(defined):
        if name not in aliases and is_required(name):
            missing.append(name)
    return missing


def _macro_value(name: str):
    try:
        return gin.query_parameter(f"%{name}")
    except ValueError:
        return None


def is_required(name: str) -> bool:
    """Whether macro `name` is still `%gin.REQUIRED`, following aliases (`A = %B`)."""
    value, seen = _macro_value(name), {name}
    while isinstance(value, gin.config.ConfigurableReference) and str(value) != "%gin.REQUIRED":
        reference = str(value)[1:]
        if not _MACRO_NAME.fullmatch(reference) or reference in seen:
            return False
        seen.add(reference)
        value = _macro_value(reference)
    return value is gin.REQUIRED or (isinstance(value, gin.config.ConfigurableReference)
                                     and str(value) == "%gin.REQUIRED")


def check_required(gin_files: Sequence[str], search_paths: Sequence[str],
                   run_file: str) -> None:
    """Refuses, in one line, a run whose `%gin.REQUIRED` macros are not all bound."""
    missing = unset_required(gin_files, search_paths)
    if missing:
        raise ValueError(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} %gin.REQUIRED and not "
            "set: bind " + ("it" if len(missing) == 1 else "them") + ", e.g. "
            + " ".join(f"--gin.{m}=..." for m in missing) + f" ({run_file}'s header says what "
            "each takes).")


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
          "starts, the job stops after the timeout (--distributed_timeout).", flush=True)
    waiting = f"waiting for {num_processes or 'all'} processes to join at {where}"
    # JAX aborts the process (SIGABRT, a C++ stack) when its own deadline passes: this timer
    # ends it first, in one line; JAX's deadline is set a little later.
    timer = threading.Timer(timeout_s, _exit_now, args=(
        f"error: not all {num_processes or ''} processes joined at {where} within {timeout_s} s "
        "(--distributed_timeout): start every process (process 0 first) with the same "
        "--coordinator_address and --num_processes, or raise the timeout.", 2))
    timer.daemon = True
    timer.start()
    try:
        with busy(waiting):
            jax.distributed.initialize(coordinator_address=coordinator_address,
                                       num_processes=num_processes, process_id=process_id,
                                       initialization_timeout=timeout_s + 30)
    finally:
        timer.cancel()
    print(f"Joined: process {jax.process_index()} of {jax.process_count()}.", flush=True)


def is_writer() -> bool:
    """True in the process that writes a run's outputs (process 0; the only one if single)."""
    import jax  # pylint: disable=g-import-not-at-top

    return jax.process_index() == 0


def run(main: Callable[[], None], gin_file: Optional[str] = None) -> None:
    """Entry point for gin scripts: defines flags, rewrites `--gin.X`, parses gin, calls
    `main()`. `gin_file`: the run's own gin file (`configs/runs/infer.gin`); without any
    `--gin_file` the script stops in one line naming it.

    absl prints the script's module docstring for `--help`, so every script's docstring says
    what it does and shows an example command.
    """
    define_flags()
    _show_in_help(["gin_file", "gin_bindings", "gin_search_paths", "multihost",
                   "coordinator_address", "num_processes", "process_id", "distributed_timeout"])

    def _main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
        f = flags.FLAGS
        if gin_file and not f.gin_file:
            raise ValueError(f"no --gin_file: this script's settings are in {gin_file}; run it "
                             f"with --gin_file={gin_file} and set the macros its header lists "
                             "(--gin.NAME=VALUE).")
        parse_gin(f.gin_file, f.gin_bindings, f.gin_search_paths)
        if gin_file:
            check_required(f.gin_file, f.gin_search_paths, gin_file)
        # Any of the three flags means a multi-process job: an incomplete set is refused, never
        # run as a lone process that writes outputs as if it were alone.
        if (f.multihost or f.coordinator_address or f.num_processes is not None
                or f.process_id is not None):
            initialize_distributed(f.coordinator_address, f.num_processes, f.process_id,
                                   f.distributed_timeout)
        try:
            main()
        except RuntimeError as e:  # gin: a %gin.REQUIRED setting nobody bound
            if "Required bindings for" not in str(e):
                raise
            head = str(e).split("\n")[0].rstrip(".")
            how = (f"pass --gin_file={gin_file} and set the macros its header lists" if gin_file
                   else "set the macros the run's gin file lists")
            raise ValueError(f"{head}: {how} (--gin.NAME=VALUE).") from None

    run_app(_main, argv=rewrite_gin_args(sys.argv))


HELP_FLAGS = ("--help", "--helpshort", "--helpfull", "-?", "-h")
JAX_CACHE_ENV = "SPECULATIVE_JAX_CACHE"  # '0' (or off, false, no): no persistent cache; DIR: there
DEFAULT_JAX_CACHE = os.path.join("~", ".cache", "speculative", "jax_cache")
OFF = ("0", "off", "false", "no")


def compilation_cache_dir() -> Optional[str]:
    """Where the scripts' persistent compilation cache lives: SPECULATIVE_JAX_CACHE when it
    names a directory, else JAX_COMPILATION_CACHE_DIR, else ~/.cache/speculative/jax_cache;
    None when SPECULATIVE_JAX_CACHE is 0 (off, false, no)."""
    value = os.environ.get(JAX_CACHE_ENV, "").strip()
    if value.lower() in OFF:
        return None
    where = value or os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT_JAX_CACHE
    return os.path.abspath(os.path.expanduser(where))


def enable_compilation_cache() -> Optional[str]:
    """Turns on JAX's persistent compilation cache at `compilation_cache_dir()` for every
    compile, however short (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, when set, is kept), so
    a rerun of a script loads its programs instead of compiling them; returns the directory
    (None: turned off, nothing changed)."""
    where = compilation_cache_dir()
    if where is None:
        return None
    import jax  # pylint: disable=g-import-not-at-top  (the flag-only paths stay light)
    jax.config.update("jax_compilation_cache_dir", where)
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")))
    return where


def run_app(main: Callable, argv: Optional[Sequence[str]] = None) -> None:
    """`absl.app.run(user_errors(main))` with this project's conventions (the module
    docstring's): `--help` (and `-h`) exits 0 where absl exits 1; compiles use the persistent
    compilation cache (`enable_compilation_cache`)."""
    argv = list(sys.argv if argv is None else argv)
    asks_help = any(a in HELP_FLAGS for a in argv[1:])
    argv = [("--help" if a == "-h" else a) for a in argv]
    if not asks_help:
        enable_compilation_cache()
    try:
        app.run(user_errors(main), argv=argv)
    except SystemExit as e:
        if asks_help and e.code == 1:
            sys.exit(0)
        raise


def _show_in_help(names: Sequence[str]) -> None:
    """Lists the shared flags under the script's own in `--help` (absl shows only the main
    module's flags there, and these are defined here)."""
    for name in names:
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, like Ctrl-C's KeyboardInterrupt."""


# Seconds a signal waits for the main thread to unwind (it runs the writers' clean-up) before
# the process ends without it: a jitted call or XLA compilation does not return to Python.
STOP_GRACE_S = 3.0
_doing = []  # what the main thread is waiting on, for the stop message (`busy`)
_watchdog = {}


class busy:  # pylint: disable=invalid-name
    """`with busy("waiting for ..."):` names what the process waits on in the message a
    signal prints if it must end the process there."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        _doing.append(self.what)

    def __exit__(self, *exc):
        _doing.remove(self.what)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()


def _exit_now(message: str, code: int) -> None:
    """Prints `message` and ends the process at once (no interpreter shutdown: JAX's
    compile and runtime threads may still run, and finalizing under them can crash)."""
    _flush()
    try:
        os.write(2, (message + "\n").encode())
    except OSError:
        pass
    os._exit(code)  # pylint: disable=protected-access


def _signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def _stop_message(signum: int, where: str) -> str:
    kind = "KeyboardInterrupt" if signum == signal.SIGINT else "Terminated"
    return (f"{kind}: stopped by {_signal_name(signum)}{' ' + where if where else ''}; results "
            "written before it are intact (every result file is written atomically).")


def _watch(read_fd: int, grace_s: float) -> None:
    """The watchdog thread: Python runs signal handlers only in the main thread, between
    bytecodes, so a main thread inside a jitted call, XLA compilation or
    `jax.distributed.initialize` never sees the signal. The C-level handler writes its number
    to the wakeup pipe; this thread reads it, gives the main thread `grace_s` to unwind, and
    otherwise ends the process in one line. A second signal ends it at once."""
    first = None
    while True:
        try:
            data = os.read(read_fd, 1)
        except OSError:
            return
        if not data:
            return
        signum = data[0]
        if signum not in (signal.SIGINT, signal.SIGTERM):
            continue
        if first is not None:
            _exit_now(_stop_message(signum, "(a second signal)"), 128 + signum)
        first = signum
        timer = threading.Timer(grace_s, lambda s=signum: _exit_now(_stop_message(
            s, "while " + (_doing[-1] if _doing else "JAX was busy (compiling, or running a "
                           "jitted call, which does not return to Python until it is done)")),
            128 + s))
        timer.daemon = True
        timer.start()


def stop_promptly_on_signals(grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM (a job scheduler's stop, `kill`, `timeout`) unwinds like Ctrl-C: `Terminated`
    is raised where the main thread is, so the writers' clean-up runs (staging directories
    and temporary files are removed, the earlier result stays), and the entry point prints one
    line and exits with 128 + the signal's number. Where the main thread cannot take the
    exception within `grace_s` seconds (XLA compilation, a long jitted call, a multi-host job
    waiting for its peers), a watchdog thread ends the process with the same one line; writes
    are atomic, so what was written stays whole. Ctrl-C keeps Python's KeyboardInterrupt (or
    stays ignored where the shell started the process ignoring it). Main thread only; once."""
    if threading.current_thread() is not threading.main_thread() or _watchdog:
        return

    def stop(signum, frame):
        raise Terminated(f"stopped by signal {signum} ({_signal_name(signum)})")

    signal.signal(signal.SIGTERM, stop)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        os.close(read_fd)
        os.close(write_fd)
        return
    thread = threading.Thread(target=_watch, args=(read_fd, grace_s), daemon=True,
                              name="stop-on-signal")
    thread.start()
    _watchdog.update(read=read_fd, write=write_fd, thread=thread)


stop_cleanly_on_sigterm = stop_promptly_on_signals  # the earlier name


def progress_bars_on_terminal_only() -> bool:
    """Shows tqdm progress bars only when stderr is a terminal: in a log or a pipe their `\\r`
    redraws are clutter. Returns whether bars show. `SPECULATIVE_PROGRESS=1` keeps them,
    `=0` hides them anywhere."""
    wanted = os.environ.get("SPECULATIVE_PROGRESS")
    on_terminal = sys.stderr is not None and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    show = on_terminal if wanted is None else wanted not in ("0", "", "false", "False")
    if show:
        return True
    import tqdm  # pylint: disable=g-import-not-at-top

    cls = tqdm.std.tqdm
    if not getattr(cls, "_speculative_hidden", False):
        init = cls.__init__

        def quiet_init(self, *args, **kwargs):
            kwargs["disable"] = True
            init(self, *args, **kwargs)

        cls.__init__ = quiet_init
        cls._speculative_hidden = True  # pylint: disable=protected-access
    return False


# What a user's input can raise: one clear message (they name the value and the fix), exit 2.
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError,
               PermissionError)


def user_errors(main: Callable) -> Callable:
    """Wraps an absl main: a user error prints `error: <message>` and exits with status 2 (the
    traceback too with --verbose); Ctrl-C and SIGTERM print one line and exit with 128 + the
    signal's number (`stop_promptly_on_signals`); other exceptions keep their traceback. Also
    hides progress bars off a terminal (`progress_bars_on_terminal_only`)."""
    if "verbose" not in flags.FLAGS:
        flags.DEFINE_bool("verbose", False, "On a usage error, print the whole traceback too.")
    _show_in_help(["verbose"])

    def wrapped(argv):
        stop_promptly_on_signals()
        progress_bars_on_terminal_only()
        try:
            return main(argv)
        except USER_ERRORS as e:
            if "verbose" in flags.FLAGS and flags.FLAGS.verbose:
                raise
            message = str(e).split("\n  In call to configurable")[0]  # gin's suffix
            print(f"error: {message}", file=sys.stderr)
            sys.exit(2)
        except app.UsageError as e:  # absl would print the whole --help text above it
            if "verbose" in flags.FLAGS and flags.FLAGS.verbose:
                raise
            print(f"error: {e} (--help lists the flags)", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as Terminated: clean-up has run
            signum = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
            during = getattr(e, "during", None)  # a decode or search (decode/interrupts.py)
            _exit_now(_stop_message(signum, f"during {during}, whose result is dropped"
                                    if during else ""), 128 + signum)

    return wrapped
