"""speculative/training/train_config.py: `TrainConfig` normalises its buckets and refuses a bad
setting by its field's name before any training (the catalogue of bad settings,
tests/test_faults.py, holds the rest)."""

import pytest

from speculative.training import train_config as config


def test_buckets_become_ints_and_the_last_is_the_max_length():
    c = config.TrainConfig(steps=1, batch_tokens=64, buckets=[8.0, 16, 32])
    assert c.buckets == (8, 16, 32) and c.max_length == 32
    assert config.TrainConfig(steps=1).max_length == 48  # the default buckets end at 48


@pytest.mark.parametrize("kwargs,match", [
    (dict(buckets=(1, 8)), r"TrainConfig.buckets=\(1, 8\) is invalid: use ascending, >= 2"),
    (dict(buckets=(8, 8)), r"TrainConfig.buckets=\(8, 8\)"),
    (dict(buckets=()), r"TrainConfig.buckets=\(\)"),
    (dict(buckets=(8, 64), batch_tokens=32), "TrainConfig.batch_tokens=32 .*last bucket"),
    (dict(decay="linear"), "TrainConfig.decay='linear' .*'cosine', 'rsqrt' or 'constant'"),
    (dict(label_smoothing=-0.1), r"TrainConfig.label_smoothing=-0.1 .*in \[0, 1\)"),
    (dict(objective="js"), r"TrainConfig.objective='js' .*one of \('ce', 'kl', 'tv'\)"),
])
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        config.TrainConfig(steps=1, **kwargs)
