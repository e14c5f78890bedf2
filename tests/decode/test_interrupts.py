"""Ctrl-C during a jitted decode or beam search called from plain Python (no script entry
point, as in a notebook or a user's own script) ends it within a second, saying that nothing of
the call is kept (`decode/interrupts.py`); before, it waited for the whole computation. Also:
`interrupts.wait` passes results through untouched, under a trace too."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np

from speculative.decode import interrupts
from tests.helpers import REPO

# A unigram "model" that never emits EOS, as target and draft: the call runs to max_decode_len
# (tens of seconds at the lengths below, far longer than the test waits).
_CHILD = textwrap.dedent('''
    import signal
    import sys
    import jax
    import jax.numpy as jnp
    import numpy as np
    from speculative import decoding
    from speculative.decode.kernel import SamplingConfig
    from speculative.models import ngram

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    log_probs = np.full((16,), -1.0, np.float32)
    log_probs[1], log_probs[2] = -1e9, 0.0  # never EOS (id 1); argmax is 2
    model = ngram.UnigramDraft({"log_probs": jnp.asarray(log_probs)})
    inputs = np.full((1, 4), 3, np.int32)
    print("running", flush=True)
    if sys.argv[1] == "decode":
        out = decoding.speculative_decode(model, model, inputs, rng=jax.random.PRNGKey(0),
                                          gamma=4, sampling=SamplingConfig(0.0),
                                          max_decode_len=40_000_000)
    else:
        out = decoding.beam_search(model, inputs, beam_size=2, max_decode_len=200_000)
    print("done", flush=True)
''')


def _interrupt(kind: str, delay: float = 3.0):
    """Runs the child, sends SIGINT `delay` s after it starts the call (past compilation);
    returns (returncode, stdout, stderr, seconds from the signal to the exit)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, kind], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        line = proc.stdout.readline()
        assert line.startswith("running"), line + proc.stderr.read()[-3000:]
        time.sleep(delay)
        assert proc.poll() is None, "the child ended before the signal"
        start = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        return proc.returncode, line + out, err, time.perf_counter() - start
    finally:
        if proc.poll() is None:
            proc.kill()


def _check(kind: str, what: str):
    rc, out, err, seconds = _interrupt(kind)
    assert "done" not in out  # stopped mid-call, not after it
    assert rc in (-signal.SIGINT, 128 + signal.SIGINT), (rc, err[-3000:])
    assert seconds < 5, seconds  # the call alone would run for tens of seconds more
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"KeyboardInterrupt: {what} of 1 row(s)"), err[-3000:]
    assert "nothing of this call is kept" in last, last
    assert "Fatal Python error" not in err and "terminate called" not in err, err[-3000:]


def test_ctrl_c_ends_a_long_jitted_decode_at_once():
    _check("decode", "speculative_decode")


def test_ctrl_c_ends_a_long_jitted_beam_search_at_once():
    _check("beam", "beam_search")


def test_wait_returns_its_argument_ready_and_passes_tracers_through():
    x = {"a": jnp.arange(4), "b": np.zeros(2), "c": None}
    assert interrupts.wait(x, "x") is x and x["a"].is_ready()
    seen = []

    @jax.jit
    def f(y):
        seen.append(interrupts.wait(y, "traced") is y)
        return y + 1

    assert int(f(jnp.int32(1))) == 2 and seen == [True]
