"""The main job: speculative decoding with the bundled models, against the baseline.

Translates test-split sentences with the bundled EN->DE target, once autoregressively (the
baseline) and once speculatively with a bundled draft, at batch 1 as in the paper; prints each
source, its translation, and alpha, tokens per target call, c, the measured speedup and Theorem
3.8's prediction. Timings come from `runs.benchmark` (compiled programs, interleaved repeats,
medians). Without the bundle (a partial checkout) it falls back to random tiny models and says so.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import jax
import numpy as np

from speculative import decoding
from speculative.models import t5
from speculative.runs import benchmark, costs as costs_lib, mini, models
from speculative.sampling import SamplingConfig


def _random_pair():
    cfg = t5.T5Config(vocab_size=4000, emb_dim=64, num_heads=2, head_dim=32, mlp_dim=128,
                      num_encoder_layers=2, num_decoder_layers=2,
                      mlp_activations=("gelu", "linear"), dropout_rate=0.0)
    small = t5.T5Config(**{**cfg.__dict__, "emb_dim": 16, "num_decoder_layers": 1})
    return models.load_model(cfg, seed=0), models.load_model(small, seed=1), "random-tiny"


def run(*, num_sentences: int = 8, gamma: Optional[int] = None, temperature: float = 0.0,
        draft_name: Optional[str] = None, repeats: int = 3, input_length: int = 48,
        max_decode_len: int = 48, output_json: Optional[str] = None, seed: int = 0) -> dict:
    """Runs the comparison and prints it; returns the numbers (also written to `output_json`)."""
    if num_sentences < 1 or repeats < 1:
        raise ValueError(f"num_sentences={num_sentences} and repeats={repeats} must be >= 1.")
    if mini.available():
        draft_name = draft_name or mini.best_draft()
        target, draft = mini.load(mini.TARGET), mini.load(draft_name)
    else:
        print("No bundled models found: using random tiny models (outputs are gibberish).")
        target, draft, draft_name = _random_pair()
    vocab = mini.Vocabulary()
    pairs = mini.test_pairs(num_sentences)
    batches = [vocab.encode_sources([src], input_length) for src, _ in pairs]
    # Other test sentences, on which the decode-loop cost model is fitted.
    calibration = mini.source_batches(8, 1, input_length, skip=num_sentences)
    sampling = SamplingConfig(temperature)

    gammas = [gamma] if gamma else list(range(1, 6))
    costs = costs_lib.measure_costs(target, draft, batches[0], gammas,
                                    max_decode_len=max_decode_len, num_steps=16, repeats=3,
                                    seed=seed)
    if not gamma:  # pick gamma by Theorem 3.8 from a quick alpha estimate
        probe = decoding.speculative_decode(target, draft, np.concatenate(batches),
                                            rng=jax.random.PRNGKey(seed), gamma=4,
                                            sampling=sampling, max_decode_len=max_decode_len)
        alpha = min(probe.stats.alpha, 1.0)
        gamma = costs_lib.best_gamma(alpha, costs, gammas)
    result = benchmark.benchmark_setting(
        target, [draft] * len(batches), batches, sampling=sampling, gammas=[gamma],
        max_decode_len=max_decode_len, repeats=repeats, lenience=1.0, seed=seed,
        costs=costs, calibration=calibration)[0]

    identical = True
    print(f"\nTarget {mini.TARGET} | draft {draft_name} | gamma {gamma} | temperature "
          f"{temperature}\n")
    for k, ((source, reference), x) in enumerate(zip(pairs, batches)):
        key = jax.random.fold_in(jax.random.PRNGKey(seed), k)
        spec = decoding.speculative_decode(target, draft, x, rng=key, gamma=gamma,
                                           sampling=sampling, max_decode_len=max_decode_len)
        if temperature == 0:
            base = decoding.autoregressive_decode(target, x, rng=key, sampling=sampling,
                                                  max_decode_len=max_decode_len)
            identical &= bool(np.array_equal(base.tokens, spec.tokens))
        print(f"EN:  {source}\nDE:  {vocab.decode(np.asarray(spec.tokens[0]))}\n"
              f"ref: {reference}\n")
    summary = {
        "target": mini.TARGET, "draft": draft_name, "gamma": gamma, "temperature": temperature,
        "sentences": len(pairs), "alpha": result["alpha"],
        "tokens_per_target_call": result["tokens_per_target_call"], "c": result["c"],
        "verify_cost": result["verify_cost"], "speedup": result["speedup"],
        "speedup_spread": result["speedup_spread"],
        "predicted_speedup": result["predicted_speedup"],
        "predicted_speedup_loop": result["predicted_speedup_loop"],
        "baseline_s": result["timings"]["baseline"]["median_s"],
        "speculative_s": result["timings"]["speculative"]["median_s"],
        "identical_to_baseline": identical if temperature == 0 else None,
    }
    print(f"alpha {summary['alpha']:.3f} | tokens per target call "
          f"{summary['tokens_per_target_call']:.2f} | c {summary['c']:.3f} | verify cost "
          f"{summary['verify_cost']:.2f}")
    print(f"baseline {summary['baseline_s']:.3f} s | speculative {summary['speculative_s']:.3f} s"
          f" | speedup {summary['speedup']:.2f}x")
    print(f"predicted: {summary['predicted_speedup']:.2f}x by Theorem 3.8 (measured c and verify "
          f"cost), {summary['predicted_speedup_loop']:.2f}x by the decode-loop cost model "
          "(speculative/runs/costs.py)")
    if temperature == 0:
        print("speculative output identical to the target's greedy output: "
              + ("yes" if identical else "NO"))
    if output_json:
        os.makedirs(os.path.dirname(os.path.abspath(output_json)), exist_ok=True)
        with open(output_json, "w") as f:
            json.dump(summary, f, indent=1)
    return summary
