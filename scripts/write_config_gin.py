r"""Writes a T5X config.gin (the architecture, in the form T5X writes one) into a model dir, so
`speculative.loading.load_model(None, <model dir>)` loads its checkpoints with no other
configuration.

  --bundled: beside every bundled T5 checkpoint (speculative/data/*/models/<name>/), from the
      model card's config (how the bundled config.gin files were made; --check compares instead
      of writing, and fails naming any that differ or are missing).
  --model_dir with --preset (a T5 1.x preset or a bundled model's name): beside a T5X
      checkpoint of yours that has no config.gin; --decoder_only for a decoder-only model.

The text is `speculative.checkpoints.config_gin.t5x_gin_text`; `save_t5x(..., config=...)` and
scripts/convert_checkpoint.py write the same. A config.gin already in a --model_dir is kept
unless --overwrite (T5X's own holds the trainer's settings too). Runs in about a second.

Examples (from the repository root, in the activated venv):

  python scripts/write_config_gin.py --bundled --check
  python scripts/write_config_gin.py --model_dir=/ckpts/t5_1_1_small --preset=t5_1_1_small
"""

import os

from absl import app, flags

from speculative import files, loading
from speculative.checkpoints import config_gin
from speculative.models import t5
from speculative.runs import config as config_lib

FLAGS = flags.FLAGS

flags.DEFINE_bool("bundled", False, "Write (or --check) the config.gin of every bundled T5.")
flags.DEFINE_bool("check", False, "With --bundled: compare instead of writing.")
flags.DEFINE_string("model_dir", None, "A T5X model dir (the one holding checkpoint_<step>/).")
flags.DEFINE_string("preset", None, f"With --model_dir: one of {sorted(t5.PRESETS)}, or a "
                    "bundled model's name.")
flags.DEFINE_bool("decoder_only", False, "With --model_dir: the model is decoder-only.")
flags.DEFINE_bool("overwrite", False, "With --model_dir: replace a config.gin already there.")


def bundled_config_gins():
    """{path of the config.gin beside each bundled T5 checkpoint: its text}."""
    out = {}
    for name in sorted(loading.bundled_names()):
        found = loading.bundled(name)
        if found.is_t5:
            model_dir = os.path.dirname(found.checkpoint)
            out[os.path.join(model_dir, config_gin.CONFIG_GIN)] = config_gin.t5x_gin_text(
                found.config, found.decoder_only, source=f"the model card's {name!r}")
    return out


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if FLAGS.bundled == bool(FLAGS.model_dir):
        raise app.UsageError("Give --bundled, or --model_dir with --preset.")
    if FLAGS.bundled:
        wanted = bundled_config_gins()
        if FLAGS.check:
            stale = [p for p, text in wanted.items()
                     if not os.path.exists(p) or open(p, encoding="utf-8").read() != text]
            if stale:
                raise ValueError(f"config.gin missing or stale: {stale}; write them with "
                                 "python scripts/write_config_gin.py --bundled")
            print(f"{len(wanted)} bundled config.gin files are up to date")
            return
        for path, text in wanted.items():
            files.write_atomic(path, text)
            print("wrote", path)
        return
    if not FLAGS.preset:
        raise app.UsageError("--model_dir needs --preset (a T5 1.x preset or a bundled name).")
    found = loading.bundled(FLAGS.preset)
    config = found.config if found is not None and found.is_t5 else t5.preset(FLAGS.preset)
    if not os.path.isdir(FLAGS.model_dir):
        raise FileNotFoundError(f"--model_dir={FLAGS.model_dir} is not a directory; give the "
                                "T5X model dir that holds checkpoint_<step>/.")
    path = os.path.join(FLAGS.model_dir, config_gin.CONFIG_GIN)
    if os.path.exists(path) and not FLAGS.overwrite:
        raise FileExistsError(f"{path} exists; keep it, or pass --overwrite to replace it.")
    config_gin.write_config_gin(FLAGS.model_dir, config, FLAGS.decoder_only,
                                source=f"--preset={FLAGS.preset}")
    print("wrote", path)


if __name__ == "__main__":
    config_lib.run_app(main)
