"""Helpers the test files share (imported as `tests.helpers`; no test file imports
another test file): tiny T5 configs, the scripts as modules, greedy identity, runs
interrupted by a signal, directory snapshots, and the repository's paths."""

import os

import jax
import numpy as np

from speculative.models import t5

# The repository's root, and the tests' data.
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
FIXTURES = os.path.join(TESTS, "fixtures")
GOLDEN = os.path.join(TESTS, "golden")


def tiny_config(**overrides) -> t5.T5Config:
    base = dict(vocab_size=16, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                num_encoder_layers=2, num_decoder_layers=2, mlp_activations=("gelu", "linear"),
                dropout_rate=0.0, relative_attention_num_buckets=8,
                relative_attention_max_distance=16)
    base.update(overrides)
    return t5.T5Config(**base)


TINY_INPUTS = np.asarray([[5, 6, 7, 1], [9, 3, 1, 0]], np.int32)  # two rows, one padded


def random_params(module, seed):
    return t5.init_params(module, jax.random.PRNGKey(seed))


def load_script(name: str):
    """`scripts/<name>.py` as a module (the scripts are not a package)."""
    import importlib.util  # pylint: disable=g-import-not-at-top
    import os  # pylint: disable=g-import-not-at-top

    path = os.path.join(REPO, "scripts", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Real standard-library files for a tiny code corpus: by the hash of their paths, sched.py and
# token.py land in valid and keyword.py in test at fractions (0.05, 0.15); getopt.py and
# sqlite3/dbapi2.py hold non-ASCII text.
TINY_CODE_PATHS = ("sched.py", "token.py", "keyword.py", "bisect.py", "colorsys.py", "fnmatch.py",
                   "getopt.py", "sqlite3/dbapi2.py", "copy.py", "reprlib.py", "this.py",
                   "json/scanner.py", "glob.py")
TINY_CODE_SPLITS = {"valid": ["sched.py", "token.py"], "test": ["keyword.py"]}


def check_greedy_identity(target, draft, batches, max_decode_len: int, gamma: int = 4,
                          what: str = "draft", tree=None) -> None:
    """Speculative greedy output equals the target's greedy output on every row of `batches`;
    a row that differs must be a numerical tie: its two top target logits (teacher-forced
    along the target's own output) within 1e-4 at the first differing position, since the
    verification scores gamma + 1 tokens in one call, whose float32 rounding can differ from
    one-token steps. Prints the counts. `tree`: decode with that token tree (gamma = its
    depth)."""
    import numpy as np  # pylint: disable=g-import-not-at-top

    from speculative import decoding
    from speculative.decode.kernel import SamplingConfig  # pylint: disable=g-import-not-at-top
    from speculative.measure import acceptance

    forced = jax.jit(acceptance._forced_logits)  # pylint: disable=protected-access
    same, ties, total = 0, [], 0
    for b, inputs in enumerate(batches):
        kw = dict(rng=jax.random.PRNGKey(b), sampling=SamplingConfig(0.0),
                  max_decode_len=max_decode_len)
        base = np.asarray(decoding.autoregressive_decode(target, inputs, **kw).tokens)
        spec = np.asarray(decoding.speculative_decode(
            target, draft, inputs, gamma=len(tree) if tree else gamma, tree=tree, **kw).tokens)
        logits = np.asarray(forced(target, inputs, base))
        for row in range(len(base)):
            total += 1
            diff = np.nonzero(base[row] != spec[row])[0]
            if not diff.size:
                same += 1
                continue
            top2 = np.sort(logits[row, diff[0]])[-2:]
            ties.append((total - 1, int(diff[0]), float(top2[1] - top2[0])))
    print(f"greedy identity, {what}: {same}/{total} identical; numerical ties: {ties}")
    assert same + len(ties) == total and same > 0
    for row, position, gap in ties:
        assert gap <= 1e-4, f"{what}: row {row} differs at {position} with a logit gap {gap}"


# A script in its own process, sent a real signal just before its first rename into the
# result's place: what every writer must survive (the earlier result stays, nothing is left).
_INTERRUPT_CHILD = r'''
import os, runpy, signal, sys
signum, prefix = int(sys.argv[1]), sys.argv[2]
real_replace = os.replace


def replace(src, dst, *args, **kwargs):
    if str(dst).startswith(prefix) and not getattr(replace, "sent", False):
        replace.sent = True
        os.kill(os.getpid(), signum)  # delivered before the rename below returns
    return real_replace(src, dst, *args, **kwargs)


os.replace = replace
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
sys.argv = sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def run_interrupted(script: str, args, *, result: str, signum: int, env=None, timeout=600):
    """Runs scripts/<script> with `args`, sending `signum` to it just before its first
    `os.replace` into a path starting with `result`; returns the CompletedProcess."""
    import signal as signal_lib  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    repo = REPO
    env = dict(os.environ if env is None else env, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_CHILD, str(int(signum)), str(result),
         os.path.join(repo, "scripts", script), *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=repo)
    name = "KeyboardInterrupt" if signum == signal_lib.SIGINT else "Terminated"
    assert proc.returncode != 0 and name in proc.stderr, proc.stderr[-3000:]
    return proc


def snapshot(directory) -> dict:
    """{relative path: bytes} of every file under `directory`."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out
