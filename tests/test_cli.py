"""The scripts' command line, run as a user runs it (subprocesses): mistakes end in one line
naming the fix, `--help` exits 0, SIGTERM ends a process within seconds wherever it is (inside
a long jitted decode, or waiting for the peers of a multi-host job), and progress bars show only
on a terminal. The shared mechanism is `speculative.runs.config` (`run`, `run_app`)."""

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import REPO


def _env(**extra):
    return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO,
                **extra)


def _script(name, *args, timeout=120, **env):
    return subprocess.run([sys.executable, os.path.join(REPO, "scripts", name), *args],
                          capture_output=True, text=True, env=_env(**env), timeout=timeout,
                          cwd=REPO)


_LOG = re.compile(r"^[IWE]\d{4} ")  # absl log lines (JAX's "Connecting to ...")


def _lines(stderr: str) -> list:
    """stderr's lines other than absl's log lines."""
    return [line for line in stderr.strip().splitlines() if not _LOG.match(line)]


def _one_line(proc) -> str:
    """The process's stderr (log lines aside), which must be exactly one line."""
    lines = _lines(proc.stderr)
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_every_script_enters_through_the_shared_entry_point():
    """`config.run` (gin scripts) or `config.run_app`: one-line errors, --help exit 0, prompt
    stops on signals and progress bars on a terminal only, the same in every script."""
    scripts = os.path.join(REPO, "scripts")
    for name in sorted(n for n in os.listdir(scripts) if n.endswith(".py")):
        with open(os.path.join(scripts, name), encoding="utf-8") as f:
            main = f.read().split('if __name__ == "__main__":')[-1]
        shared = re.search(r"\bconfig(_lib)?\.(run|run_app)\(main", main)
        assert shared, (name, main)


def test_infer_without_a_gin_file_names_the_run_file():
    proc = _script("infer.py")
    line = _one_line(proc)
    assert proc.returncode == 2
    assert line.startswith("error: no --gin_file") and "--gin_file=configs/runs/infer.gin" in line


def test_an_unquoted_gin_string_is_shown_quoted():
    proc = _script("infer.py", "--gin_file=configs/runs/infer.gin",
                   "--gin.INFER_OUTPUT_DIR=out/b4")
    line = _one_line(proc)
    assert proc.returncode == 2
    assert "--gin.INFER_OUTPUT_DIR=out/b4" in line
    assert '--gin.INFER_OUTPUT_DIR=\\"out/b4\\"' in line  # the form to type in a shell
    assert 'INFER_OUTPUT_DIR = "out/b4"' in line  # and in a gin file


def test_a_gin_file_syntax_error_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text('include "configs/runs/infer.gin"\nNUM_EXAMPLES = = 3\n')
    proc = _script("infer.py", f"--gin_file={bad}")
    line = _one_line(proc)
    assert proc.returncode == 2
    assert f"{bad}, line 2" in line and "NUM_EXAMPLES = = 3" in line and "fix that line" in line


def test_a_binding_gin_cannot_parse_is_named():
    proc = _script("infer.py", "--gin_file=configs/runs/infer.gin", "--gin.NUM_EXAMPLES=[1,")
    line = _one_line(proc)
    assert proc.returncode == 2 and "NUM_EXAMPLES = [1," in line and "Python literal" in line


def test_unset_required_settings_are_one_line():
    proc = _script("measure_alpha.py", "--gin_file=configs/runs/measure_alpha.gin")
    line = _one_line(proc)
    assert proc.returncode == 2 and line.startswith("error: ") and "TARGET_MODEL" in line


@pytest.mark.parametrize("script,flag", [("infer.py", "--help"), ("infer.py", "-h"),
                                         ("demo.py", "--help"), ("train.py", "--helpshort"),
                                         ("convert_checkpoint.py", "--help")])
def test_help_exits_0_and_lists_the_gin_flags(script, flag):
    proc = _script(script, flag)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Example" in proc.stdout
    if script not in ("demo.py", "convert_checkpoint.py"):
        assert "--gin_file" in proc.stdout and "--gin_search_paths" in proc.stdout


def test_demo_refuses_bad_flags_before_loading_models():
    """Each is refused in one line before any model is loaded (a model load alone takes
    seconds; the refusal is argument checks and the model card)."""
    for args, needle in ((["--gamma=100"], "gamma=100"),
                         (["--draft=nope"], "draft='nope' is not a bundled draft"),
                         (["--temperatures=x"], "--temperatures=x"),
                         (["--num_sentences=0"], "num_sentences=0")):
        proc = _script("demo.py", *args)
        line = _one_line(proc)
        assert proc.returncode == 2 and line.startswith("error: ") and needle in line, line


# A child that decodes for a long time in one jitted call: a unigram "model" that never emits
# EOS, as target and draft (every draft accepted), over max_decode_len tokens.
_DECODE_CHILD = textwrap.dedent('''
    import sys
    import jax
    import jax.numpy as jnp
    import numpy as np
    from speculative import decoding
    from speculative.decode.kernel import SamplingConfig
    from speculative.models import ngram
    from speculative.runs import config


    def main(argv):
        log_probs = np.full((16,), -1.0, np.float32)
        log_probs[1], log_probs[2] = -1e9, 0.0  # never EOS (id 1); argmax is 2
        model = ngram.UnigramDraft({"log_probs": jnp.asarray(log_probs)})
        inputs = np.full((1, 4), 3, np.int32)
        print("decoding", flush=True)
        out = decoding.speculative_decode(model, model, inputs, rng=jax.random.PRNGKey(0),
                                          gamma=4, sampling=SamplingConfig(0.0),
                                          max_decode_len=int(sys.argv[1]))
        print("done", int(out.lengths[0]), flush=True)


    config.run_app(main, argv=sys.argv[:1])
''')


def _stop(cmd, ready: str, signum=signal.SIGTERM, delay=1.0, timeout=60, **env):
    """Starts `cmd`, waits for the stdout line starting with `ready`, sends `signum` `delay`
    seconds later; returns (CompletedProcess-like tuple (rc, stdout, stderr), seconds from the
    signal to the exit)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(**env), cwd=REPO)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(ready):
                break
        else:
            raise AssertionError(f"never printed {ready!r}: {''.join(seen)}"
                                 f"{proc.stderr.read()[-3000:]}")
        time.sleep(delay)
        assert proc.poll() is None, "the child ended before the signal"
        start = time.perf_counter()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, "".join(seen) + out, err, time.perf_counter() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_sigterm_during_a_long_decode_exits_within_seconds(tmp_path):
    """A jitted decode does not return to Python until it is done (here it would run for tens
    of seconds): the signal's watchdog ends the process after the grace period, in one line,
    with 128 + SIGTERM."""
    child = tmp_path / "decode_child.py"
    child.write_text(_DECODE_CHILD)
    rc, out, err, seconds = _stop([sys.executable, str(child), str(3_000_000)], "decoding")
    assert "done" not in out  # stopped mid-decode, not after it
    assert rc == 128 + signal.SIGTERM, err[-3000:]
    assert seconds < 15, seconds
    lines = _lines(err)
    assert len(lines) == 1 and lines[0].startswith("Terminated: stopped by SIGTERM"), err[-3000:]
    assert "Fatal Python error" not in err


# measure_alpha's required settings (never used: the process stops before the run).
_UNUSED = ["--gin.TARGET_MODEL=None", "--gin.DRAFT_MODEL=None", "--gin.TARGET_CHECKPOINT=None",
           "--gin.DRAFT_CHECKPOINT=None", '--gin.OUTPUT_DIR="/nonexistent/unused"']


# A child that compiles a large program (thousands of ops: seconds of XLA compilation).
_COMPILE_CHILD = textwrap.dedent('''
    import signal
    import sys
    import jax
    import jax.numpy as jnp
    from speculative.runs import config

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal


    def main(argv):
        def f(x):
            for i in range(3000):
                x = jnp.sin(x) * (i + 1.0) + jnp.cos(x[::-1])
            return x

        lowered = jax.jit(f).lower(jnp.ones((64,), jnp.float32))
        print("compiling", flush=True)
        lowered.compile()
        print("compiled", flush=True)


    config.run_app(main, argv=sys.argv[:1])
''')


def test_ctrl_c_during_xla_compilation_exits_cleanly(tmp_path):
    """Ctrl-C while XLA compiles (scripts/benchmark.py compiles for minutes): one line and
    128 + SIGINT, never "Fatal Python error: Segmentation fault" (rc 139) from an interpreter
    shutting down under XLA's threads."""
    child = tmp_path / "compile_child.py"
    child.write_text(_COMPILE_CHILD)
    rc, out, err, seconds = _stop([sys.executable, str(child)], "compiling",
                                  signum=signal.SIGINT, delay=0.5)
    assert "compiled" not in out
    assert rc == 128 + signal.SIGINT and seconds < 15, (rc, seconds, err[-3000:])
    lines = _lines(err)
    assert len(lines) == 1 and lines[0].startswith("KeyboardInterrupt: stopped by SIGINT"), err
    assert "Fatal Python error" not in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_while_waiting_for_a_missing_coordinator_exits_promptly():
    """jax.distributed.initialize blocks in C++ until its timeout (here 120 s) and then aborts
    (SIGABRT, rc 134); SIGTERM must end the wait within seconds, in one line naming it."""
    cmd = [sys.executable, os.path.join(REPO, "scripts", "measure_alpha.py"),
           "--gin_file=configs/runs/measure_alpha.gin", *_UNUSED,
           f"--coordinator_address=127.0.0.1:{_free_port()}", "--num_processes=2",
           "--process_id=1", "--distributed_timeout=120"]
    rc, _, err, seconds = _stop(cmd, "Waiting up to 120 s")
    assert rc == 128 + signal.SIGTERM and seconds < 15, (rc, seconds, err[-3000:])
    lines = _lines(err)
    assert len(lines) == 1 and "Terminated: stopped by SIGTERM while waiting for 2 processes" \
        in lines[0], err[-3000:]


def test_a_missing_coordinator_ends_at_the_timeout_in_one_line():
    """At --distributed_timeout the process stops with one line and status 2, not JAX's abort
    (rc 134 and a C++ stack)."""
    proc = _script("measure_alpha.py", "--gin_file=configs/runs/measure_alpha.gin", *_UNUSED,
                   f"--coordinator_address=127.0.0.1:{_free_port()}", "--num_processes=2",
                   "--process_id=1", "--distributed_timeout=3", timeout=60)
    line = _one_line(proc)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "not all 2 processes joined" in line and "--distributed_timeout" in line


_PROGRESS_CHILD = textwrap.dedent('''
    import sys
    from tqdm import tqdm
    from speculative.runs import config


    def main(argv):
        for _ in tqdm(range(3), desc="progress-probe", disable=False):
            pass
        print("finished", flush=True)


    config.run_app(main, argv=sys.argv[:1])
''')


def test_progress_bars_show_only_on_a_terminal(tmp_path):
    """stderr here is a pipe, not a terminal: no bar, even one asked for with disable=False;
    SPECULATIVE_PROGRESS=1 keeps bars anywhere."""
    child = tmp_path / "progress_child.py"
    child.write_text(_PROGRESS_CHILD)
    for forced, shown in ((None, False), ("1", True)):
        env = _env()
        env.pop("SPECULATIVE_PROGRESS", None)
        if forced:
            env["SPECULATIVE_PROGRESS"] = forced
        proc = subprocess.run([sys.executable, str(child)], capture_output=True, text=True,
                              env=env, timeout=60, cwd=REPO)
        assert proc.returncode == 0 and "finished" in proc.stdout, proc.stderr[-2000:]
        assert ("progress-probe" in proc.stderr) == shown, proc.stderr[-2000:]
