"""Run function of the block draft: train it on a feature cache, measure it, export it.

    python -m speculative.runs.train_block_draft --gin_file=configs/runs/block_draft.gin \
        --gin.FEATURE_CACHE="'out/feature_cache/greedy'" --gin.MODEL_DIR="'out/block/run'"

(configs/runs/block_draft.gin has the recipe, its runtime and its result). The draft starts from
the bundled target-aware draft (`init_from`, its parameters and hot vocabulary) with fresh
placeholders; the training resumes from its last state when the command is run again. At the
end the per-depth acceptance of the stored (bfloat16) draft is measured along the target's own
text (Table 3's method, `acceptance.rank_acceptance` with the block's `unrolled_logits`) at
T = 0 and 1, and with `export_dir` it goes there in bfloat16 with its model card entry.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Optional

import gin
import jax
import numpy as np
from absl import app, flags

from speculative import files
from speculative.checkpoints import t5x as checkpoints
from speculative.data import bundles
from speculative.decode.kernel import SamplingConfig
from speculative.measure import acceptance
from speculative.models import block_draft as bd
from speculative.runs import mini
from speculative.runs import train_feature_draft as feature_runs
from speculative.training import block_training, feature_data, feature_training
from speculative.training import distillation as training
from speculative.training.data import pad_rows
from speculative.training.evaluation import num_params

if __name__ == "__main__":
    # `python -m`: run the library module's cli (it exits), so the gin configurables below are
    # registered once, under speculative.runs.train_block_draft (the gin file imports that name).
    from speculative.runs import train_block_draft as _library  # pylint: disable=g-import-not-at-top

    _library.cli()

BLOCK_DRAFT = bundles.BLOCK_DRAFT  # the card's `kind` of a block draft (what it writes)

gin.external_configurable(block_training.BlockTrainConfig, module="block_draft")


def expected_tokens(rates) -> float:
    """Tokens per round of a block whose depth-d draft is kept with probability `rates[d]`
    given the ones before it were: 1 + sum_k prod_{d <= k} rates[d] (the bonus included)."""
    return float(1.0 + np.sum(np.cumprod(np.asarray(rates, np.float64))))


def depth_acceptance(target, draft, gamma: int, num: int, batch: int = 64) -> dict:
    """Per-depth acceptance of the block's drafts along the target's text of the first `num`
    valid sentences (greedy at T = 0, sampled at T = 1), and the tokens per round it implies
    at each gamma."""
    rows = feature_runs.valid_inputs(num, 48)
    batches = [pad_rows(rows[s:s + batch], 48) for s in range(0, len(rows), batch)]
    out = {"sentences": len(rows)}
    for temperature in (0.0, 1.0):
        got = acceptance.rank_acceptance(target, draft, batches, SamplingConfig(temperature),
                                         max_rank=1, max_decode_len=48, max_depth=gamma)
        rates = [r[0] for r in got.depth_rates]
        out[f"t{temperature:g}"] = {
            "depth_rates": rates, "depth_positions": list(got.depth_positions),
            "tokens_per_round": {g: expected_tokens(rates[:g]) for g in range(1, gamma + 1)}}
    return out


@gin.configurable(denylist=["gin_config"])
def train_block_draft(*, model_dir: str, cache_dir: str,
                      config: block_training.BlockTrainConfig, max_gamma: int = 8,
                      init_from: str = "large_feature_draft", target: str = mini.LARGE_TARGET,
                      name: Optional[str] = None, export_dir: Optional[str] = None,
                      measure_sentences: int = 256, stop_at: Optional[int] = None,
                      command: Optional[str] = None, gin_config: Optional[str] = None) -> dict:
    """Trains (or resumes) a block draft of bundled `target`, warm-started from the bundled
    feature draft `init_from`; when finished, measures it (`depth_acceptance`), writes
    `model_dir/card_entry.json` (and `summary.json`), and with `export_dir` stores it there in
    bfloat16 (`<export_dir>/<name>/checkpoint_<steps>`) with its entry in the model card."""
    os.makedirs(model_dir, exist_ok=True)
    if gin_config:
        files.write_atomic(os.path.join(model_dir, "config.gin"), gin_config)
    pair = bundles.bundle(target)
    feature = pair.load(init_from, kernel_layout="t5x")
    drafter = pair.drafter_of(feature)  # the drafter says what the draft is
    if not drafter.reads_target or drafter.proposes_block or pair.target_of(init_from) != target:
        raise ValueError(f"init_from={init_from!r} is not a bundled feature draft of {target}.")
    module = bd.BlockDraft(feature.module.config, max_gamma=max_gamma)

    def init_params():
        return bd.from_feature_draft(module, feature.params, jax.random.PRNGKey(config.seed))

    result = block_training.train(module=module, config=config, cache_dir=cache_dir,
                                  model_dir=model_dir, init_params=init_params, stop_at=stop_at)
    if not result["done"]:
        return result
    started = time.time()
    params = block_training.load_params(model_dir, module)
    name = name or os.path.basename(model_dir.rstrip("/"))
    exported = jax.tree_util.tree_map(lambda x: np.asarray(x, "bfloat16"), params)
    store = export_dir or os.path.join(model_dir, "export")
    path = checkpoints.save_t5x(exported, os.path.join(store, name), step=config.steps,
                                overwrite=True)
    stored = checkpoints.load_params(path, dtype="float32")
    target_model = pair.load(target, kernel_layout="t5x")
    draft = bd.BlockDraftModel(module, stored)
    summary = {
        "kind": BLOCK_DRAFT, "name": name, "target": target, "init_from": init_from,
        "config": dataclasses.asdict(module.config), "max_gamma": max_gamma,
        "train_config": dataclasses.asdict(config), "params": num_params(params),
        "steps": config.steps, "train_wall_s": round(result["seconds"], 1),
        "trained_on": f"{os.cpu_count()} CPU cores" if jax.default_backend() == "cpu"
        else jax.devices()[0].device_kind,
        "final_valid": result["valid"] or feature_training.last_valid(model_dir),
        "feature_cache": feature_data.read_manifest(cache_dir),
        "checkpoint": os.path.relpath(path, store),
        "depth_acceptance": depth_acceptance(target_model, draft, config.gamma,
                                             measure_sentences),
    }
    if command:
        summary["command"] = command
    summary["total_wall_s"] = round(time.time() - started + result["seconds"], 1)
    text = json.dumps(files.json_ready(summary), indent=1, sort_keys=True)
    files.write_atomic(os.path.join(model_dir, "card_entry.json"), text)
    print(json.dumps(summary["depth_acceptance"]), flush=True)
    if export_dir:
        training.update_card(export_dir, name, json.loads(text))
    return summary


def cli() -> None:
    """`python -m speculative.runs.train_block_draft --gin_file=... --gin.NAME=VALUE`."""
    import re  # pylint: disable=g-import-not-at-top

    from speculative.runs import config as config_lib  # pylint: disable=g-import-not-at-top

    flags.DEFINE_multi_string("gin_file", [], "Gin files to parse, in order.")
    flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings, e.g. 'MODEL_DIR = \"/x\"'.")

    def main(argv) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
        gin.add_config_file_search_path(os.path.abspath("."))
        config_lib.check_macros(flags.FLAGS.gin_file, flags.FLAGS.gin_bindings)
        gin.parse_config_files_and_bindings(flags.FLAGS.gin_file, flags.FLAGS.gin_bindings)
        command = " ".join(["python -m speculative.runs.train_block_draft"] + sys.argv[1:])
        gin.get_configurable(train_block_draft)(gin_config=gin.config_str(), command=command)

    args = [re.sub(r"^--gin\.([^=]+)=(.*)$", r"--gin_bindings=\1 = \2", a, flags=re.DOTALL)
            for a in sys.argv]
    app.run(config_lib.user_errors(main), argv=args)

