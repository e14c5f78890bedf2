"""What each ingredient of the target-aware draft buys, on the memory-bound EN->DE pair (or,
with `--target=code_target`, the decoder-only code pair).

Rows (same draft width and training steps where they are target-aware): large_draft_kdtv (a
separate small T5); + the target's encoder output only (no features); + the target's
features (depth 1, no training-time test); + training-time test (3 unrolled steps). Columns:

    params, c                 the draft's parameters and its step cost / the target's step
    alpha T=0, T=1 (forced)   Table 3's method (`acceptance`) along 5,000 target-generated
                              test tokens; for a target-aware draft this is the acceptance of
                              the first draft of a round (its later drafts read its own states)
    alpha (loop)              DecodeStats.alpha of the timed decodes: along its chains
    tokens/call, gamma        generated tokens per target call at the chosen gamma (the best
                              of 1..8 by Theorem 3.8 with the measured costs and loop alpha)
    speedup T=0, T=1          batch 1, test sentences, baseline and speculative timed in
                              interleaved rounds; Theorem 3.8 and the decode-loop prediction

Run with nothing else busy on the machine:

    python scripts/feature_ablation.py --output_dir=results/large/target_aware/feature_ablation \
        --drafts=large_draft_kdtv,enc=out/feature/enc,feat=out/feature/feat,ttt=large_feature_draft
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, Sequence

import jax
import numpy as np

from speculative import files, loading
from speculative.data import bundles
from speculative.decode import drafters, validation
from speculative.decode import loops as decoding
from speculative.decode.kernel import SamplingConfig
from speculative.experiments import record
from speculative.measure import acceptance, host
from speculative.measure import costs as costs_lib
from speculative.measure import timing as measure
from speculative.models import feature_draft as fd
from speculative.runs import mini
from speculative.training import evaluation, feature_data, feature_training

GAMMAS = tuple(range(1, 9))


def load_draft(spec: str, decoder_only: bool = False):
    """`name` (bundled, of the target's kind: `decoder_only`) or `label=path` (a feature-draft
    training directory) -> (label, model).
    `label=path@N` restricts that draft's output to the N ids its target emits most often in
    its training cache (`fd.with_hot_vocab`, no retraining): the hot-vocabulary row."""
    if "=" not in spec:
        return spec, loading.build_model(spec, name="draft", decoder_only=decoder_only)
    label, path = spec.split("=", 1)
    hot = None
    if "@" in path:
        path, hot = path.rsplit("@", 1)
        if not hot.isdigit() or int(hot) < 1:
            raise ValueError(f"--drafts {spec!r}: after '@' give the hot vocabulary's size, an "
                             "int >= 1 (e.g. ttt_hot=out/feature/ttt@2500).")
        hot = int(hot)
    if not os.path.exists(os.path.join(path, "params.msgpack")):
        try:
            return label, loading.build_model(path, name="draft", decoder_only=decoder_only)
        except (TypeError, ValueError) as err:
            raise ValueError(f"--drafts {spec!r}: {path} is neither a finished feature-draft "
                             f"training directory (params.msgpack) nor a bundled name.") from err
    with open(os.path.join(path, "train_config.json")) as f:
        settings = json.load(f)
    config = fd.FeatureDraftConfig(**settings["draft"])
    params = feature_training.load_params(path, config)
    train = dict(settings["train"])
    if hot:
        ids, coverage = feature_data.hot_vocabulary(settings["cache_dir"], hot,
                                                    config.vocab_size)
        config, params = fd.with_hot_vocab(config, params, ids)
        train["hot_vocab"], train["hot_coverage"] = hot, coverage
    model = fd.FeatureDraftModel(fd.FeatureDraft(config), params)
    _TRAINING[id(model)] = train
    return label, model


_TRAINING: Dict[int, Dict] = {}  # training settings of the drafts loaded from their run dirs


def _description(model) -> Dict:
    if drafters.as_drafter(model, 1).reads_target:
        cfg = model.module.config
        layers = f"features of layers {list(cfg.feature_layers)}"
        if not cfg.cross_attention:
            what = layers if cfg.feature_layers else "nothing of the target"
        else:
            what = (f"encoder output + {layers}" if cfg.feature_layers
                    else "encoder output only")
        if cfg.num_layers > 1:
            what += f"; {cfg.num_layers} layers"
        train = _TRAINING.get(id(model))
        if cfg.target_head:
            what += "; the target's output layer"
            if train and train.get("state_loss_weight"):
                what += f" + state loss x{train['state_loss_weight']:g}"
        if train:
            what += f"; trained {train['steps']} steps, {train['depth']} unrolled"
        if cfg.hot_ids:
            what += f"; hot vocabulary of {len(cfg.hot_ids)}"
            if train and "hot_coverage" in train:
                what += f" ({train['hot_coverage']:.1%} of the cache's tokens)"
        return {"kind": "target-aware", "reads": what, "training": train}
    return {"kind": "separate T5"}


def run(output_dir: str, drafts: Sequence[str], num_sentences: int = 16,
        num_alpha_tokens: int = 5000, repeats: int = 5, overwrite: bool = False,
        seed: int = 0, target_name: str = mini.LARGE_TARGET) -> Dict:
    """Measures every row against bundled `target_name`; writes `ablation.json` and
    `ablation.md` into `output_dir`."""
    validation.positive_int(num_sentences, "num_sentences", "test sentences timed")
    validation.positive_int(repeats, "repeats", "timed rounds")
    files.check_report(output_dir, "ablation", overwrite)
    os.makedirs(output_dir, exist_ok=True)
    inputs = bundles.bundle(target_name)  # (a ValueError naming the bundled targets)
    target = inputs.load(target_name)
    models = [load_draft(d, inputs.decoder_only) for d in drafts]  # all load before any timing
    batches = inputs.batches(num_sentences, 1)
    calibration = inputs.batches(8, 1, skip=num_sentences)
    load = host.LoadAverage()
    rows = []
    for label, draft in models:
        start = time.time()
        costs = costs_lib.measure_costs(target, draft, batches[0], GAMMAS,
                                        max_decode_len=inputs.max_decode_len, num_steps=16,
                                        repeats=5, seed=seed)
        row = {"draft": label, **_description(draft),
               "params": evaluation.num_params(draft.params), "c": costs.c,
               "verify_cost": costs.verify_cost}
        for temperature in (0.0, 1.0):
            sampling = SamplingConfig(temperature)
            forced = acceptance.bundle_alpha(target, draft, inputs, temperature,
                                             num_alpha_tokens, seed)
            gamma = _best_gamma(target, draft, batches, sampling, costs, inputs.max_decode_len,
                                seed)
            [m] = measure.measure(target, [draft] * len(batches), batches, sampling=sampling,
                                  gammas=[gamma], max_decode_len=inputs.max_decode_len,
                                  repeats=repeats, lenience=1.0, seed=seed, costs=costs,
                                  calibration=calibration,
                                  calibration_lengths=inputs.calibration_lengths(len(calibration)))
            row[f"t{temperature:g}"] = {"alpha_forced": forced, **m.row()}
        row["seconds"] = round(time.time() - start, 1)
        rows.append(row)
        print(_line(row), flush=True)
    result = {"target": target_name, "sentences": num_sentences,
              "alpha_tokens": num_alpha_tokens, "repeats": repeats, "rows": rows,
              "load_average_1m": load.record(),
              "environment": host.environment()}
    variant = os.path.basename(os.path.normpath(output_dir))  # e.g. feature_ablation_48
    record.publish("feature_ablation", f"{target_name}/{variant}", output_dir, "ablation",
                   result, markdown, load=result["load_average_1m"])
    return result


def _best_gamma(target, draft, batches, sampling, costs, max_decode_len, seed) -> int:
    """Theorem 3.8's best gamma in GAMMAS at the alpha of a probe decode (gamma 4)."""
    probe = decoding.speculative_decode(target, draft, np.concatenate(batches),
                                        rng=jax.random.PRNGKey(seed), gamma=4,
                                        sampling=sampling, max_decode_len=max_decode_len)
    return costs_lib.best_gamma(min(float(probe.stats.alpha), 0.999), costs, GAMMAS)


def _line(row: Dict) -> str:
    parts = [f"{row['draft']}: c {row['c']:.3f}"]
    for t in ("t0", "t1"):
        r = row[t]
        parts.append(f"{t.upper()} alpha {r['alpha_forced']['alpha']:.3f} (loop {r['alpha']:.3f})"
                     f", gamma {r['gamma']}, {r['tokens_per_target_call']:.2f} tok/call, "
                     f"{r['speedup']:.2f}x (Thm 3.8 {r['predicted_speedup']:.2f}x, loop "
                     f"{r['predicted_speedup_loop']:.2f}x)")
    return " | ".join(parts)


def markdown(result: Dict) -> str:
    head = ["draft", "reads", "params", "c", "alpha T=0 (forced / loop)",
            "alpha T=1 (forced / loop)", "gamma T=0 / T=1", "tokens/call T=0 / T=1",
            "speedup T=0", "speedup T=1", "Thm 3.8 T=0 / T=1", "loop model T=0 / T=1"]
    rows = []
    for row in result["rows"]:
        t0, t1 = row["t0"], row["t1"]
        rows.append([
            row["draft"], row.get("reads", row["kind"]), f"{row['params']:,}", f"{row['c']:.3f}",
            f"{t0['alpha_forced']['alpha']:.3f} / {t0['alpha']:.3f}",
            f"{t1['alpha_forced']['alpha']:.3f} / {t1['alpha']:.3f}",
            f"{t0['gamma']} / {t1['gamma']}",
            f"{t0['tokens_per_target_call']:.2f} / {t1['tokens_per_target_call']:.2f}",
            f"{t0['speedup']:.2f}x", f"{t1['speedup']:.2f}x",
            f"{t0['predicted_speedup']:.2f}x / {t1['predicted_speedup']:.2f}x",
            f"{t0['predicted_speedup_loop']:.2f}x / {t1['predicted_speedup_loop']:.2f}x"])
    env = result["environment"]["cpu"]
    load = result["load_average_1m"]
    return (f"# Target-aware draft ablation ({result['target']}, batch 1)\n\n"
            "`python scripts/feature_ablation.py` (speculative/experiments/feature_ablation.py"
            f"). {result['sentences']} test sentences timed, {result['repeats']} interleaved "
            f"rounds; forced alpha along {result['alpha_tokens']} target-generated test tokens "
            "(for a target-aware draft: its first draft of a round); loop alpha along the timed "
            f"decodes' chains. Host: {env.get('model')}, load average {load['before']:.2f} "
            f"before, {load['after']:.2f} after.\n\n" + files.markdown_table(head, rows))
