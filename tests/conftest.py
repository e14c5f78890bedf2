"""Shared fixtures: tiny T5 configs that compile in seconds on 2 CPU cores (the helpers
behind them live in tests/helpers)."""

import atexit
import os
import shutil
import tempfile

# The suite runs in two worker processes (pytest.ini); on a GPU each would otherwise reserve
# most of its memory.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

# Most of the suite's time is XLA compiling small programs. What it checks (exactness, sampling
# laws, formats, equality with references) does not depend on XLA's optimisation passes, and
# speed is measured by the benchmark scripts, never here: compile with most passes off (on a
# 2-core host that took the suite from 799 s to 560 s). The environment variable carries the
# setting into the scripts, README blocks and notebook kernel that tests run as subprocesses.
# SPECULATIVE_TEST_XLA_OPTIMIZE=1 runs it all fully optimised, as the scripts run by hand.
if os.environ.get("SPECULATIVE_TEST_XLA_OPTIMIZE") != "1":
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
    jax.config.update("jax_disable_most_optimizations", True)

# Many tests compile the same programs (the tiny pairs' decode loops, the bundled pairs') in
# both workers and in the scripts they run: XLA's persistent compilation cache, in a directory
# of this run only (made by the first process, inherited by the workers and the subprocesses,
# removed at its exit), compiles each once. Results do not depend on it; a directory given in
# JAX_COMPILATION_CACHE_DIR is used as it is (and kept).
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _CACHE = tempfile.mkdtemp(prefix="speculative-tests-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs",
                  float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                  int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))

# GAMMA 'auto''s choices are cached on disk per host and settings (runs/calibration_cache.py):
# off in the suite, so that every test (and every script it runs) calibrates as it says; the
# cache's own tests point it at a temporary folder.
os.environ.setdefault("SPECULATIVE_CALIBRATION_CACHE", "0")

from tests.helpers import TINY_CODE_PATHS, load_script, tiny_config  # noqa: E402


@pytest.fixture
def tiny_cfg():
    return tiny_config()


@pytest.fixture(scope="session")
def tiny_code_corpus(tmp_path_factory):
    """A code corpus of `TINY_CODE_PATHS` with a 400-piece vocabulary, built once by
    scripts/build_code_corpus.py (under a second); returns its directory."""
    out = tmp_path_factory.mktemp("code") / "corpus"
    load_script("build_code_corpus").build_code_corpus(
        str(out), paths=TINY_CODE_PATHS, valid_fraction=0.05, test_fraction=0.15,
        vocab_size=400)
    return out


@pytest.fixture
def clean_gin():
    """An empty gin config before and after the test (use with
    `pytestmark = pytest.mark.usefixtures("clean_gin")`)."""
    import gin  # pylint: disable=g-import-not-at-top

    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture(scope="module")
def tiny_gin(tmp_path_factory):
    """A gin file of tests/helpers/runs.py's `TINY_GIN` (tiny_target, tiny_draft, ... scopes of
    a 4000-piece vocabulary), for scripts/infer.py runs."""
    from tests.helpers.runs import TINY_GIN  # pylint: disable=g-import-not-at-top

    path = tmp_path_factory.mktemp("gin") / "tiny.gin"
    path.write_text(TINY_GIN)
    return str(path)


@pytest.fixture
def bench_gin(tmp_path):
    """A gin file of tests/helpers/runs.py's `BENCH_TINY_GIN` (scope `tiny`, vocabulary 16),
    for benchmark and alpha runs."""
    from tests.helpers.runs import BENCH_TINY_GIN  # pylint: disable=g-import-not-at-top

    path = tmp_path / "tiny.gin"
    path.write_text(BENCH_TINY_GIN)
    return str(path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A float32 T5X legacy checkpoint of tests/helpers/checkpoints.py's random `CFG` params at
    `<model_dir>/checkpoint_7`: (params, model_dir, step_dir) (do not modify)."""
    from speculative.checkpoints import t5x  # pylint: disable=g-import-not-at-top
    from tests.helpers.checkpoints import random_params  # pylint: disable=g-import-not-at-top

    model_dir = tmp_path_factory.mktemp("t5x")
    params = random_params()
    step_dir = t5x.save_t5x(params, str(model_dir), 7)
    return params, str(model_dir), step_dir


@pytest.fixture(scope="module")
def tiny_target():
    """(module, params) of a random tiny target that ends its outputs
    (tests/helpers/features.py's `ending_target`)."""
    from tests.helpers.features import ending_target  # pylint: disable=g-import-not-at-top

    return ending_target()


@pytest.fixture(scope="module")
def tiny_models():
    """A tiny random encoder-decoder target and draft (`tiny_config`, seeds 0 and 1)."""
    from speculative.models import adapters, t5  # pylint: disable=g-import-not-at-top
    from tests.helpers import random_params, tiny_config  # pylint: disable=g-import-not-at-top

    module = t5.Transformer(tiny_config())
    return (adapters.EncoderDecoderModel(module, random_params(module, 0)),
            adapters.EncoderDecoderModel(module, random_params(module, 1)))
