"""speculative/runs/infer_settings.py: model forms and run settings, bound on the run or
passed as keywords."""


import gin
import pytest

from speculative.models import t5
from speculative.runs import infer
from tests.helpers.runs import TINY

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_model_forms_none_with_a_checkpoint_passes_and_a_bundled_name_with_one_shows_the_fix():
    from speculative.runs.infer_settings import InferSettings

    base = dict(draft_config=None, draft_checkpoint=None, mixture_or_task_name="mini_ende",
                task_feature_lengths={"inputs": 8, "targets": 8}, output_dir=None,
                speculative=False)
    # TARGET_MODEL = None: the architecture comes from the checkpoint's config.gin (at load).
    settings = InferSettings(target_config=None, target_checkpoint="out/large_t5x", **base)
    assert settings.target_config is None and settings.target_checkpoint == "out/large_t5x"
    with pytest.raises(ValueError, match="TARGET_MODEL=None"):  # no config and no checkpoint
        InferSettings(target_config=None, target_checkpoint=None, **base)
    with pytest.raises(ValueError) as err:  # a bundled name brings its own checkpoint
        InferSettings(target_config="large_target", target_checkpoint="out/large_t5x", **base)
    assert ('--gin_file=configs/models/large_target.gin '
            '--gin.TARGET_MODEL="@large_target/t5.T5Config()"') in str(err.value)


def test_run_settings_take_fields_bound_on_the_run_or_passed_as_keywords():
    """infer.infer, benchmark.run and alpha.run take a settings dataclass; fields given on the
    run itself (a gin binding or a keyword) replace its values, and an unknown one is named."""
    from speculative.runs.infer_settings import InferSettings, with_overrides

    tiny = t5.T5Config(**TINY, num_encoder_layers=1, num_decoder_layers=1)
    base = dict(target_config=tiny, draft_config=tiny,
                target_checkpoint=None, draft_checkpoint=None, mixture_or_task_name="mini_ende",
                task_feature_lengths={"inputs": 8, "targets": 8}, output_dir=None)
    settings = InferSettings(**base)
    assert with_overrides(InferSettings, settings, {}, "infer.infer") is settings
    changed = with_overrides(InferSettings, settings, {"gamma": 3, "mesh_shape": [1, 1]},
                             "infer.infer")
    assert (changed.gamma, changed.mesh_shape, changed.batch_size) == (3, (1, 1), 1)
    assert with_overrides(InferSettings, None, base, "infer.infer") == settings
    with pytest.raises(TypeError, match=r"infer.infer: unknown settings \['gama'\]"):
        with_overrides(InferSettings, settings, {"gama": 3}, "infer.infer")
    assert infer.infer(settings, dry_run=True, gamma=2).gamma == 2


def test_checkpoint_path_is_t5x_name_for_the_target_checkpoint(tiny_gin):
    """CHECKPOINT_PATH (T5X's infer.gin) and TARGET_CHECKPOINT set the same thing; a run that
    sets neither is refused naming TARGET_CHECKPOINT, one that sets either is not."""
    from speculative.runs import config as config_lib
    from tests.helpers.runs import INFER_GIN, infer_bindings

    def parse(**macros):
        gin.clear_config()
        bindings = [b for b in infer_bindings(None) if not b.startswith("TARGET_CHECKPOINT")]
        config_lib.parse_gin([INFER_GIN, tiny_gin],
                             bindings + [f"{k} = {v}" for k, v in macros.items()])
        return config_lib.unset_required([INFER_GIN, tiny_gin])

    assert parse(CHECKPOINT_PATH="'/ckpt/xxl'") == []
    assert infer.infer(dry_run=True).target_checkpoint == "/ckpt/xxl"
    assert parse(TARGET_CHECKPOINT="None") == []
    assert infer.infer(dry_run=True).target_checkpoint is None
    assert parse() == ["TARGET_CHECKPOINT"]


def test_time_limit_s_from_gin_bounds_the_run_and_is_restored(tiny_gin, tmp_path):
    from speculative.decode import validation
    from speculative.runs import config as config_lib
    from tests.helpers.runs import INFER_GIN, infer_bindings

    before = validation.TIME_LIMIT_S
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(None, TIME_LIMIT_S="1e-9"))
    assert infer.infer(dry_run=True).time_limit_s == 1e-9
    with pytest.raises(ValueError, match=r"max_decode_len=8 is more than .* limit"):
        infer.infer()
    assert validation.TIME_LIMIT_S == before
    with pytest.raises(ValueError, match="TIME_LIMIT_S=0 is invalid"):
        infer.infer(dry_run=True, time_limit_s=0)
