"""Ctrl-C during a jitted decode or beam search: `wait(result, what)` returns `result` when its
computation is done, and raises `KeyboardInterrupt` within milliseconds of a Ctrl-C, saying what
was abandoned and what was kept.

    out = interrupts.wait(_SPEC_JIT(target, drafter, inputs, rng, ...), "speculative_decode")

Why: a jitted call does not return to Python until its computation is done, and Python runs a
signal handler only between bytecodes, so a Ctrl-C (SIGINT) during a long decode used to wait
for the whole decode (SIGTERM, whose default is to end the process, ended it at once). Here the
main thread waits on a `threading.Event` (a lock wait, which a signal interrupts) while a helper
thread blocks on the arrays. After a Ctrl-C the abandoned computation runs to its end in the
background on the device and its result is dropped; nothing else is lost (in a notebook the
kernel and its state stay; the next call queues behind the abandoned one). SIGTERM raised as a
`KeyboardInterrupt` subclass (the scripts' `runs.config.Terminated`) keeps its type.

Off the main thread (signals never reach it) and under a trace, `wait` only blocks or returns.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from typing import Any, TypeVar

import jax

T = TypeVar("T")

_MIN_POLL_S, _MAX_POLL_S = 1e-4, 0.02
KEPT = ("nothing of this call is kept (its computation runs to its end in the background and "
        "is dropped); results returned or written before it are intact")


_ABANDONED = []  # (arrays, the KeyboardInterrupt raised) of each wait Ctrl-C ended


def _abandoned(arrays, err: BaseException) -> None:
    """Remembers a computation left running; at exit, `_exit_promptly` sees to it."""
    if not _ABANDONED:
        atexit.register(_exit_promptly)
    _ABANDONED.append((arrays, err))


def _exit_promptly() -> None:
    """At interpreter exit after the interrupt went uncaught (a plain `python script.py`): end
    the process now, as Python would after finalizing, rather than let finalization wait for the
    abandoned computation to finish (minutes, for a long decode)."""
    last = getattr(sys, "last_value", None)
    for arrays, err in _ABANDONED:
        if last is err and not all(x.is_ready() for x in arrays):
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            code = 128 + (signal.SIGTERM if type(err).__name__ == "Terminated"
                          else signal.SIGINT)
            os._exit(code)  # pylint: disable=protected-access


def _arrays(result: Any):
    leaves = jax.tree_util.tree_leaves(result)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return None  # under jit/vmap: nothing runs yet
    return [x for x in leaves if isinstance(x, jax.Array)]


def wait(result: T, what: str) -> T:
    """`result` (a pytree of jax Arrays) once every array is computed; Ctrl-C while waiting
    raises `KeyboardInterrupt` (the same subclass as the signal raised) whose message names
    `what` (e.g. 'speculative_decode of 4 row(s) x 48 tokens'), the seconds it ran, and that
    nothing of it is kept (`KEPT`); its `.during` is `what`."""
    arrays = _arrays(result)
    if not arrays:
        return result
    if threading.current_thread() is not threading.main_thread():
        return jax.block_until_ready(result)
    if all(x.is_ready() for x in arrays):
        return result
    start = time.perf_counter()
    try:
        while not all(x.is_ready() for x in arrays):
            # Sleep a hundredth of the time waited so far (0.1-20 ms): the wait ends at most
            # ~1% after the computation, and Python runs the signal handler between sleeps.
            time.sleep(min(_MAX_POLL_S, max(_MIN_POLL_S, (time.perf_counter() - start) / 100)))
    except KeyboardInterrupt as e:
        message = (f"{what} interrupted after {time.perf_counter() - start:.1f} s of its "
                   f"jitted computation: {KEPT}.")
        try:
            err = type(e)(message)
        except TypeError:
            err = KeyboardInterrupt(message)
        err.during = what
        _abandoned(arrays, err)
        raise err from None
    return result
