"""The T5 presets have one meaning: `t5.preset(name)` and configs/models/<name>.gin give the same
T5Config for every preset, and every T5 1.x model file has its preset."""

import dataclasses
import os

import gin
import pytest

from speculative.models import t5
from speculative.runs import config as config_lib
from tests.helpers import REPO

MODELS = os.path.join(REPO, "configs", "models")
GIN_PRESETS = sorted(f[:-4] for f in os.listdir(MODELS) if f.startswith("t5_1_"))


def test_every_t5_model_file_has_its_preset_and_back():
    assert GIN_PRESETS == sorted(t5.PRESETS)


@pytest.mark.parametrize("name", GIN_PRESETS)
def test_the_gin_file_and_the_preset_agree(name):
    gin.clear_config()
    try:
        config_lib.parse_gin([f"configs/models/{name}.gin"], [], search_paths=(REPO,))
        bound = {}
        for field in dataclasses.fields(t5.T5Config):
            try:
                bound[field.name] = gin.query_parameter(f"{name}/t5.T5Config.{field.name}")
            except ValueError:  # not bound in the file: the dataclass default
                pass
    finally:
        gin.clear_config()
    assert t5.T5Config(**bound) == t5.preset(name), name
