r"""Converts T5 checkpoints between Hugging Face and T5X's legacy format.

HF -> T5X: reads an HF T5 directory (model.safetensors + config.json, e.g. from
`T5ForConditionalGeneration.save_pretrained`) and writes a T5X legacy checkpoint
(msgpack + gzip zarr, format version 3, readable by t5x and by
`speculative.checkpoints.load_params`) at <t5x_dir>/checkpoint_<step>, and the
model's config.gin beside it as T5X writes one (so `load_model(None, t5x_dir)`
needs no other configuration). The matching T5Config is logged.

T5X -> HF (--to_hf): reads a T5X checkpoint (model dir: latest step; step dir; or
the msgpack file; legacy or Orbax) and writes <hf_dir>/model.safetensors and
<hf_dir>/config.json for transformers' T5ForConditionalGeneration. The model
shape comes from --preset or from an HF --config_json; the checkpoint is checked
against it before anything is written.

All logic is in speculative/checkpoints/; a progress bar counts parameters. Refused before any
work: the same directory for both, a negative --step, a --t5x_dir that is a file, an output
directory that already holds the other format.

Examples (from the repository root, in the activated venv; t5_1_1_small in float32 is ~300 MB
either way):

  python scripts/convert_checkpoint.py --to_hf --model=large_target --hf_dir=out/large_target_hf

  python scripts/convert_checkpoint.py --hf_dir=out/large_target_hf --t5x_dir=out/large_t5x

  python scripts/convert_checkpoint.py \
      --hf_dir=/models/flan-t5-small --t5x_dir=/ckpts/flan_t5_small --step=0

  python scripts/convert_checkpoint.py --to_hf \
      --t5x_dir=/ckpts/t5_1_1_small/checkpoint_1000000 --preset=t5_1_1_small \
      --hf_dir=/models/t5_1_1_small_hf
"""

import json
import os

from absl import app, flags, logging

from speculative import loading
from speculative.checkpoints import hf as hf_checkpoints
from speculative.checkpoints import t5x as checkpoints
from speculative.models import t5
from speculative.runs import config as config_lib

FLAGS = flags.FLAGS

flags.DEFINE_string("hf_dir", None, "HF T5 directory (input, or output with --to_hf).")
flags.DEFINE_string("t5x_dir", None, "T5X model dir (output), or checkpoint (input with --to_hf).")
flags.DEFINE_integer("step", 0, "Step of the written T5X checkpoint (checkpoint_<step>), "
                     ">= 0.")
flags.DEFINE_bool("to_hf", False, "Convert T5X -> HF instead of HF -> T5X.")
flags.DEFINE_string("preset", None, f"With --to_hf: model preset, one of {sorted(t5.PRESETS)}, "
                    "or a bundled model's name.")
flags.DEFINE_string("model", None, "With --to_hf: a bundled model's name (e.g. large_target) as "
                    "the source, instead of --t5x_dir and --preset.")
flags.DEFINE_string("config_json", None, "With --to_hf: an HF config.json giving the model shape.")
flags.DEFINE_string("dtype", None, "Cast parameters on conversion, e.g. 'bfloat16'.")
flags.DEFINE_bool("overwrite", False, "Replace an existing checkpoint_<step> (or, with --to_hf, "
                  "the whole HF directory: no stale files survive).")


def _bundled(name: str):
    """The bundled T5 `name`, refused unless HF's encoder-decoder T5 can hold it."""
    found = loading.bundled(name)
    if found is None or not found.is_t5:
        raise ValueError(f"--model={name!r} is not a bundled T5; bundled: "
                         f"{sorted(loading.bundled_names())}.")
    if found.decoder_only:
        raise ValueError(f"--model={name!r} is a decoder-only model; transformers' "
                         "T5ForConditionalGeneration (what --to_hf writes) is encoder-decoder. "
                         "Use its T5X checkpoint as it is: " + found.checkpoint)
    return found


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.model:
        if not FLAGS.to_hf or FLAGS.t5x_dir or FLAGS.preset or FLAGS.config_json:
            raise app.UsageError(f"--model={FLAGS.model} names the source of a T5X -> HF "
                                 "conversion: use it with --to_hf and --hf_dir only (no "
                                 "--t5x_dir, --preset or --config_json).")
        FLAGS.t5x_dir, FLAGS.preset = _bundled(FLAGS.model).checkpoint, FLAGS.model
    if not FLAGS.hf_dir or not FLAGS.t5x_dir:
        raise app.UsageError("Both --hf_dir and --t5x_dir are required (or, with --to_hf, "
                             "--model=<bundled name> and --hf_dir).")
    if FLAGS.step < 0:
        raise app.UsageError(f"--step={FLAGS.step} is invalid: T5X steps are >= 0 (the "
                             "checkpoint is <t5x_dir>/checkpoint_<step>).")
    if os.path.realpath(FLAGS.hf_dir) == os.path.realpath(FLAGS.t5x_dir):
        raise app.UsageError(
            f"--hf_dir and --t5x_dir are the same directory {FLAGS.hf_dir}: T5X's "
            "checkpoint_<step> and the HF model would share it, which load_params refuses as "
            "ambiguous. Give each its own directory.")
    if not FLAGS.to_hf:
        if os.path.exists(FLAGS.t5x_dir) and not os.path.isdir(FLAGS.t5x_dir):
            raise app.UsageError(f"--t5x_dir={FLAGS.t5x_dir} is a file; give the T5X model "
                                 "directory to write checkpoint_<step>/ into (created if missing).")
        checkpoints.check_t5x_target(FLAGS.t5x_dir, FLAGS.step, FLAGS.overwrite)  # before work
        if not os.path.isfile(os.path.join(FLAGS.hf_dir, "config.json")):
            raise FileNotFoundError(
                f"--hf_dir={FLAGS.hf_dir}: no config.json there; give an HF T5 directory (as "
                "written by save_pretrained), or add --to_hf to convert T5X -> HF into it.")
        config = hf_checkpoints.load_hf_config(FLAGS.hf_dir)
        params = checkpoints.load_params(FLAGS.hf_dir, FLAGS.dtype, config, progress=True)
        step_dir = checkpoints.save_t5x(params, FLAGS.t5x_dir, FLAGS.step,
                                        overwrite=FLAGS.overwrite, progress=True, config=config)
        logging.info("Wrote %s and its config.gin for %s", step_dir, config)
        return
    if bool(FLAGS.preset) == bool(FLAGS.config_json):
        raise app.UsageError("--to_hf needs exactly one of --preset or --config_json.")
    if FLAGS.config_json and not os.path.isfile(FLAGS.config_json):
        raise FileNotFoundError(f"--config_json={FLAGS.config_json} does not exist; give an HF "
                                "T5 config.json for the model's shape (or --preset).")
    hf_checkpoints.check_hf_target(FLAGS.hf_dir, FLAGS.overwrite, FLAGS.t5x_dir)  # before work
    if FLAGS.preset:  # a T5 1.x preset, or a bundled model's name (its card's config)
        config = (_bundled(FLAGS.preset).config if loading.bundled(FLAGS.preset)
                  else t5.preset(FLAGS.preset))
    else:
        with open(FLAGS.config_json) as f:
            config = hf_checkpoints.config_from_hf(json.load(f), checkpoints.load_metadata(
                FLAGS.t5x_dir))
    params = checkpoints.load_params(FLAGS.t5x_dir, FLAGS.dtype, config, progress=True)
    hf_checkpoints.save_hf_t5(params, config, FLAGS.hf_dir, overwrite=FLAGS.overwrite,
                           source=FLAGS.t5x_dir)
    logging.info("Wrote %s for %s", FLAGS.hf_dir, config)


if __name__ == "__main__":
    config_lib.run_app(main)
