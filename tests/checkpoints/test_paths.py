"""speculative/checkpoints/paths.py: gs:// paths are read through one file function."""

import os

import pytest

from speculative.checkpoints import config_gin, paths, t5x_config
from speculative.models import t5
from tests.helpers import FIXTURES

RUN_GIN = os.path.join(FIXTURES, "t5x_run", "config.gin")

# What tests/fixtures/t5x_run/config.gin says (macros resolved; float32_attention_logits is
# accepted: attention logits are float32 here always).
RUN_CONFIG = t5.T5Config(vocab_size=32, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=24,
                         num_encoder_layers=1, num_decoder_layers=2,
                         mlp_activations=("gelu", "linear"), dropout_rate=0.05,
                         logits_via_embedding=False, dtype="float32")


def test_gs_paths_read_through_one_file_function(monkeypatch):
    """gs:// paths are looked up and read through `paths.is_file` / `paths.listdir` /
    `paths.open_file` (the tensorstore gcs kvstore), here served from memory: nothing reaches
    the network."""
    with open(RUN_GIN, "rb") as f:
        store = {"gs://bucket/runs/tiny/config.gin": f.read(),
                 "gs://bucket/runs/tiny/checkpoint_5/checkpoint": b""}
    import io  # pylint: disable=g-import-not-at-top

    def listdir(path):
        return sorted({k[len(path) + 1:].split("/")[0] for k in store
                       if k.startswith(path + "/")}) or None

    opened = []
    monkeypatch.setattr(paths, "is_file", lambda p: p in store)
    monkeypatch.setattr(paths, "listdir", listdir)
    monkeypatch.setattr(paths, "open_file", lambda p: opened.append(p) or io.BytesIO(store[p]))
    assert config_gin.config_gin_candidates("gs://bucket/runs/tiny/checkpoint_5/state") == [
        "gs://bucket/runs/tiny/checkpoint_5/state/config.gin", "gs://bucket/runs/tiny/config.gin"]
    assert t5x_config("gs://bucket/runs/tiny/checkpoint_5") == RUN_CONFIG
    assert opened == ["gs://bucket/runs/tiny/config.gin"]
    with pytest.raises(FileNotFoundError, match="checkpoint_6 does not exist"):
        t5x_config("gs://bucket/runs/tiny/checkpoint_6")
