"""Shared fixtures: tiny T5 configs that compile in seconds on 2 CPU cores (the helpers
behind them live in tests/helpers)."""

import os

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
