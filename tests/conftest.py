"""Shared fixtures: tiny T5 configs that compile in seconds on 2 CPU cores."""

import jax
import pytest

from speculative.models import t5


def tiny_config(**overrides) -> t5.T5Config:
    base = dict(vocab_size=16, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                num_encoder_layers=2, num_decoder_layers=2, mlp_activations=("gelu", "linear"),
                dropout_rate=0.0, relative_attention_num_buckets=8,
                relative_attention_max_distance=16)
    base.update(overrides)
    return t5.T5Config(**base)


@pytest.fixture
def tiny_cfg():
    return tiny_config()


def random_params(module, seed):
    return t5.init_params(module, jax.random.PRNGKey(seed))


def load_script(name: str):
    """`scripts/<name>.py` as a module (the scripts are not a package)."""
    import importlib.util  # pylint: disable=g-import-not-at-top
    import os  # pylint: disable=g-import-not-at-top

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                        f"{name}.py")
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


@pytest.fixture(scope="session")
def tiny_code_corpus(tmp_path_factory):
    """A code corpus of `TINY_CODE_PATHS` with a 400-piece vocabulary, built once by
    scripts/build_code_corpus.py (under a second); returns its directory."""
    out = tmp_path_factory.mktemp("code") / "corpus"
    load_script("build_code_corpus").build_code_corpus(
        str(out), paths=TINY_CODE_PATHS, valid_fraction=0.05, test_fraction=0.15,
        vocab_size=400)
    return out
