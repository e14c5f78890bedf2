"""speculative/runs/config.py: gin macros checked by name, and multi-host flags checked before any
work."""

import pytest

from speculative.runs import config as config_lib
from tests.helpers.runs import INFER_GIN, infer_bindings

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_incomplete_multihost_flags_are_refused_before_any_work():
    """--num_processes=2 --process_id=1 without a coordinator used to run one process that
    wrote outputs as if alone."""
    from speculative.runs import config as config_lib

    with pytest.raises(ValueError, match="give all three"):
        config_lib.initialize_distributed(None, 2, 1)
    with pytest.raises(ValueError, match=r"process_id=2 must lie in \[0, num_processes=2\)"):
        config_lib.initialize_distributed("localhost:1234", 2, 2)
    with pytest.raises(ValueError, match="distributed_timeout=0"):
        config_lib.initialize_distributed("localhost:1234", 2, 1, timeout_s=0)


def test_misspelled_gin_macro_is_refused_with_the_closest_name(tiny_gin, tmp_path):
    with pytest.raises(ValueError, match="TEMPERATUR.*did you mean TEMPERATURE"):
        config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(tmp_path) + ["TEMPERATUR = 1.0"])
    with pytest.raises(ValueError, match="no gin file defines the macro ZZZ"):
        config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(tmp_path) + ["ZZZ = 1"])
    # Bindings of configurable parameters are gin's to check; known macros pass.
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(tmp_path) + ["TEMPERATURE = 1.0"])


def test_the_compilation_cache_defaults_under_home_moves_and_turns_off(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv(config_lib.JAX_CACHE_ENV, raising=False)
    assert config_lib.compilation_cache_dir() == str(tmp_path / ".cache/speculative/jax_cache")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert config_lib.compilation_cache_dir() == str(tmp_path / "jax")
    monkeypatch.setenv(config_lib.JAX_CACHE_ENV, str(tmp_path / "mine"))
    assert config_lib.compilation_cache_dir() == str(tmp_path / "mine")
    for off in ("0", "off", "False"):
        monkeypatch.setenv(config_lib.JAX_CACHE_ENV, off)
        assert config_lib.compilation_cache_dir() is None
        assert config_lib.enable_compilation_cache() is None


def test_enabling_the_compilation_cache_points_jax_at_it(monkeypatch, tmp_path):
    import jax  # pylint: disable=g-import-not-at-top
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {n: getattr(jax.config, n) for n in names}
    monkeypatch.setenv(config_lib.JAX_CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    try:
        assert config_lib.enable_compilation_cache() == str(tmp_path / "cache")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    finally:
        for n, v in before.items():
            jax.config.update(n, v)
