"""T5X's own gin files: the config.gin T5X writes into a model directory, and its model gin files.

A checkpoint written with `save_t5x` beside a config.gin in T5X's written form
(tests/fixtures/) loads with no other configuration, from any of the paths a T5X user would
give, and decodes exactly as the model it was saved from. Where no config.gin is found, the
error says so and names the two ways to give a config.
"""

import logging
import os
import shutil

import pytest

from speculative import loading
from speculative.checkpoints import config_gin, t5x_config
from speculative.models import t5
from tests.helpers import FIXTURES, REPO
from tests.helpers.checkpoints import LM_CONFIG, LM_GIN, RUN_CONFIG, RUN_GIN, run_dir

T5X_TREE = os.path.join(FIXTURES, "t5x_gin")


def test_written_config_gin_gives_the_t5config():
    found = config_gin.read_t5x_gin(RUN_GIN)
    assert found.config == RUN_CONFIG
    assert found.decoder_only is False
    assert found.source == RUN_GIN
    # One line names what only T5X's trainer reads; nothing of it reaches the config.
    (note,) = found.skipped
    assert "adafactor.Adafactor" in note and "train/utils.DatasetConfig" not in note
    assert "utils.DatasetConfig" in note and "trainer.Trainer" in note
    assert t5x_config(RUN_GIN) == RUN_CONFIG


def test_decoder_only_config_gin():
    found = config_gin.read_t5x_gin(LM_GIN)
    assert found.decoder_only is True
    assert found.config == LM_CONFIG  # num_layers -> num_decoder_layers, no encoder


def test_config_gin_found_at_beside_and_above_a_checkpoint(tmp_path):
    model_dir, _ = run_dir(tmp_path, RUN_GIN, RUN_CONFIG)
    step = os.path.join(model_dir, "checkpoint_3")
    for path in (model_dir, step, os.path.join(step, "checkpoint"),
                 os.path.join(model_dir, "config.gin"), model_dir + "/"):
        assert t5x_config(path) == RUN_CONFIG, path
    # Not from the parent of a model dir: that may be another run's.
    shutil.copy(RUN_GIN, tmp_path / "config.gin")
    (tmp_path / "other_run").mkdir()
    with pytest.raises(config_gin.ConfigGinError, match="No T5X config.gin"):
        t5x_config(str(tmp_path / "other_run"))
    # An Orbax item dir two levels down.
    os.makedirs(os.path.join(model_dir, "checkpoint_7", "state"))
    assert config_gin.find_config_gin(os.path.join(model_dir, "checkpoint_7", "state")) == \
        os.path.join(model_dir, "config.gin")


def test_t5x_model_gin_files(tmp_path):
    """T5X's model gin layout: a size file including base.gin by its repository path, and a
    decoder-only file; %gin.REQUIRED dropout becomes 0.0 with a note."""
    small = config_gin.read_t5x_gin(os.path.join(T5X_TREE, "t5x/examples/t5/t5_1_1/tiny_test.gin"))
    assert small.config == t5.T5Config(
        vocab_size=32, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=24, num_encoder_layers=1,
        num_decoder_layers=2, mlp_activations=("gelu", "linear"), dropout_rate=0.0,
        logits_via_embedding=False, dtype="float32")
    assert small.decoder_only is False
    assert any("dropout_rate is %gin.REQUIRED" in n for n in small.skipped)
    assert any("adafactor.Adafactor" in n and "seqio.SentencePieceVocabulary" in n
               for n in small.skipped)
    lm = config_gin.read_t5x_gin(os.path.join(T5X_TREE,
                                              "t5x/examples/decoder_only/models/tiny_test.gin"))
    assert lm.decoder_only and lm.config == LM_CONFIG
    assert config_gin.is_t5x_gin(os.path.join(T5X_TREE, "t5x/examples/t5/t5_1_1/base.gin"))
    repo_root = REPO
    assert not config_gin.is_t5x_gin(os.path.join(repo_root, "configs/models/t5_1_1_small.gin"))
    # As our gin: the run picks it as @network/t5.T5Config().
    import gin  # pylint: disable=g-import-not-at-top

    with gin.unlock_config():
        gin.parse_config(config_gin.gin_bindings(small))
        try:
            made = gin.get_configurable("network/t5.T5Config")()
        finally:
            gin.clear_config()
    assert made == small.config


def test_a_t5x_model_gin_file_as_gin_file(caplog):
    """`--gin_file=t5x/examples/t5/t5_1_1/tiny_test.gin` (T5X's layout, including base.gin) next
    to a run file: its network.T5Config is ours in the `network` scope, picked with
    `--gin.TARGET_MODEL=@network/t5.T5Config()`; the trainer's configurables are named once."""
    import gin  # pylint: disable=g-import-not-at-top

    from speculative.runs import config as config_lib  # pylint: disable=g-import-not-at-top

    tiny = "t5x/examples/t5/t5_1_1/tiny_test.gin"
    with caplog.at_level(logging.INFO):
        try:
            config_lib.parse_gin(["configs/runs/infer.gin", tiny],
                                 ["TARGET_MODEL = @network/t5.T5Config()"],
                                 search_paths=(".", config_lib.REPO_ROOT, T5X_TREE))
            made = gin.query_parameter("%TARGET_MODEL").scoped_configurable_fn()
        finally:
            gin.clear_config()
    assert made == config_gin.read_t5x_gin(os.path.join(T5X_TREE, tiny)).config
    assert made.emb_dim == 16 and made.num_decoder_layers == 2 and made.vocab_size == 32
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith(tiny)]
    assert any("@network/t5.T5Config()" in n for n in notes)
    assert any("skipped" in n and "adafactor.Adafactor" in n for n in notes)


@pytest.mark.parametrize("text, match", [
    ("network.T5Config.vocab_size = 8\nnetwork.T5Config.num_experts = 4\n",
     r"network.T5Config.num_experts is not a field"),
    ("network.T5Config.emb_dim = 8\n", r"vocab_size is not set"),
    ("network.T5Config.vocab_size = %VOCAB\n", r"%VOCAB, a macro the file does not set"),
    ("t5_architecture.EncoderDecoder.shared_token_embedder = None\n",
     r"binds no network.T5Config.*flaxformer"),
    ("network.T5Config.vocab_size = = 3\n", r"config.gin:1: not a gin file"),
    ("network.T5Config.vocab_size = 8\nnetwork.T5Config.num_heads = 0\n",
     r"do not make a T5Config.*num_heads"),
    ("a/t5.T5Config.vocab_size = 8\nb/t5.T5Config.vocab_size = 9\n",
     r"binds t5.T5Config in several scopes \(a, b\)"),
])
def test_bad_config_gin_is_refused_by_name(tmp_path, text, match):
    (tmp_path / "config.gin").write_text(text)
    with pytest.raises(config_gin.ConfigGinError, match=match):
        t5x_config(str(tmp_path))


@pytest.mark.parametrize("config, decoder_only", [(RUN_CONFIG, False), (LM_CONFIG, True),
                                                  (t5.preset("t5_1_1_small"), False)])
def test_written_config_gin_reads_back_as_the_same_model(tmp_path, config, decoder_only):
    """`write_config_gin` writes T5X's form (its example networks' configurables, the buckets
    unsaid where T5X fixes them), and reads back as the same model with nothing skipped."""
    path = config_gin.write_config_gin(tmp_path, config, decoder_only, source="a test")
    text = open(path).read()
    assert config_gin.is_t5x_gin(path) and "from a test" in text
    net = "TransformerConfig" if decoder_only else "T5Config"
    assert f"network.{net}.vocab_size = {config.vocab_size}" in text
    assert "relative_attention" not in text  # 32 / 128: T5X's fixed values
    found = config_gin.read_t5x_gin(path)
    assert (found.config, found.decoder_only, found.skipped) == (config, decoder_only, ())
    with pytest.raises(ValueError, match="decoder_only=True but config.num_encoder_layers"):
        config_gin.t5x_gin_text(RUN_CONFIG, decoder_only=True)


def test_a_checkpoint_that_does_not_exist_is_named_as_missing(tmp_path):
    missing = str(tmp_path / "no_such_run" / "checkpoint_100")
    for call in (lambda: t5x_config(missing), lambda: loading.load_model(None, missing),
                 lambda: loading.build_model(None, missing)):
        with pytest.raises(FileNotFoundError, match=f"The checkpoint {missing} does not exist"):
            call()


# The bundled T5 checkpoints each carry a config.gin, written by scripts/write_config_gin.py
# from their model card's config.
_BUNDLED_T5 = sorted(n for n in loading.bundled_names() if loading.bundled(n).is_t5)


@pytest.mark.parametrize("name", _BUNDLED_T5)
def test_every_bundled_checkpoint_loads_from_its_directory_alone(name):
    """load_model(None, <bundled model dir>) works: the config.gin beside each bundled T5
    checkpoint is the one generated from the card (scripts/write_config_gin.py --bundled) and
    gives the card's config; the small models (under 2M parameters) load and match."""
    found = loading.bundled(name)
    model_dir = os.path.dirname(found.checkpoint)
    with open(os.path.join(model_dir, "config.gin")) as f:
        assert f.read() == config_gin.t5x_gin_text(found.config, found.decoder_only,
                                                   source=f"the model card's {name!r}")
    for path in (model_dir, found.checkpoint):
        model = config_gin.t5x_model_config(path)
        assert (model.config, model.decoder_only) == (found.config, found.decoder_only)
    if found.entry.get("params", 0) < 2_000_000:
        loaded = loading.load_model(None, model_dir, kernel_layout="t5x")
        assert loaded.module.config == found.config
        assert type(loaded) is type(found.load(kernel_layout="t5x"))
