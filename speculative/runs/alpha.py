"""The acceptance rate alpha of a draft, measured along text the target generates (Cor. 3.6).

For each sampling setting, `run`

  1. generates with the target alone (`decoding.autoregressive_decode` under that setting),
     batch after batch of inputs, until `num_tokens` tokens (default 10,000, as in the paper §4);
  2. teacher-forces the target and the draft along it and computes beta at every position
     (`speculative.acceptance`, which says how, and how the standard errors are defined);
  3. reports alpha = mean(beta), its standard errors and i.i.d. diagnostics.

Results go to `<output_dir>/alpha.json` and the resolved gin config to `<output_dir>/config.gin`;
a small table is printed. JSON (NaN written as null):

    schema        "speculative.alpha/1"
    config        target_model, draft_model, checkpoints, decoder_only, lenience, num_tokens,
                  batch_size, max_decode_len, input_length, inputs {source, task, tsv_path, split},
                  samplings, seed
    environment   as in benchmark.json
    settings      one per sampling: {sampling, num_tokens, num_sequences, mean_sequence_length,
                  alpha, se_naive, se_cluster, se_batch_means, batch_length,
                  lag1_autocorrelation, effective_sample_size,
                  histogram {edges [bins + 1], counts [bins]}}

Shape legend: B batch, L length, N max_decode_len, V vocab.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional, Sequence

import gin
import jax

from speculative import files, loading
from speculative.decode import kernel as sampling_lib
from speculative.decode import validation
from speculative.measure import acceptance, host
from speculative.measure import timing as measure
from speculative.runs import benchmark as bench
from speculative.runs.infer_settings import with_overrides

SCHEMA = "speculative.alpha/1"
RESULTS_FILE = "alpha.json"


def format_table(settings: Sequence[Dict[str, Any]]) -> str:
    def f(x, fmt):
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt % x

    lines = [f"{'temp':>5} {'top_k':>5} {'top_p':>5} {'tokens':>7} {'alpha':>7} {'se':>7} "
             f"{'se_seq':>7} {'se_bm':>7} {'lag1':>6}"]
    for s in settings:
        sm = s["sampling"]
        lines.append(
            f"{sm['temperature']:>5g} {sm['top_k']:>5} {sm['top_p']:>5g} {s['num_tokens']:>7} "
            f"{f(s['alpha'], '%.4f'):>7} {f(s['se_naive'], '%.4f'):>7} "
            f"{f(s['se_cluster'], '%.4f'):>7} {f(s['se_batch_means'], '%.4f'):>7} "
            f"{f(s['lag1_autocorrelation'], '%.3f'):>6}")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class AlphaSettings:
    """Everything one alpha measurement needs (configs/runs/measure_alpha.gin binds every field
    from its macros: `alpha.run.settings = @alpha.AlphaSettings()`).

    Attributes:
      target_model, draft_model: as in `benchmark.BenchmarkSettings` (a bundled name; a
        `T5Config` with a checkpoint, or None with one: the architecture from its T5X
        config.gin; a `T5Config` with None = random weights; or a ready `DecodeModel`, e.g.
        `ngram.BigramDraft`).
      target_checkpoint, draft_checkpoint: checkpoint paths, or None (random weights for a
        T5Config: seeds `seed` and `seed + 1`).
      output_dir: where `alpha.json` and `config.gin` are written.
      temperatures: floats >= 0 (0 = argmax) sharing `top_k`/`top_p`, or `SamplingConfig`s.
      lenience: l in (0, 1] (paper A.5); 1 = exact speculative sampling.
      num_tokens: generated tokens per setting (the paper: 10,000).
      batch_size, max_decode_len, input_length: generation batches.
      task / tsv_path (+ spm_path), split: inputs through `speculative.data.tasks`; neither =
        random token ids (an endless source).
      histogram_bins: bins of the beta histogram over [0, 1].
      decoder_only, param_dtype, seed, draft_seed, overwrite: as in `benchmark.BenchmarkSettings`.
    """

    target_model: Any
    draft_model: Any
    output_dir: str
    target_checkpoint: Optional[str] = None
    draft_checkpoint: Optional[str] = None
    temperatures: Sequence[Any] = (0.0, 1.0)
    top_k: int = 0
    top_p: float = 1.0
    lenience: float = 1.0
    num_tokens: int = 10_000
    batch_size: int = 8
    max_decode_len: int = 64
    input_length: int = 64
    task: Optional[str] = None
    split: str = "validation"
    tsv_path: Optional[str] = None
    spm_path: Optional[str] = None
    histogram_bins: int = 20
    decoder_only: bool = False
    param_dtype: Optional[str] = None
    seed: int = 0
    draft_seed: Optional[int] = None
    overwrite: bool = False


def _config_json(s: AlphaSettings, samplings) -> Dict[str, Any]:
    """alpha.json's `config`."""
    return {
        "target_model": loading.describe_model(s.target_model),
        "draft_model": loading.describe_model(s.draft_model),
        "target_checkpoint": s.target_checkpoint,
        "draft_checkpoint": s.draft_checkpoint,
        "decoder_only": s.decoder_only,
        "lenience": s.lenience,
        "num_tokens": s.num_tokens,
        "batch_size": s.batch_size,
        "max_decode_len": s.max_decode_len,
        "input_length": s.input_length,
        "inputs": {"source": "random" if s.task is None and s.tsv_path is None else "task",
                   "task": s.task, "tsv_path": s.tsv_path, "split": s.split},
        "samplings": [measure.sampling_dict(x) for x in samplings],
        "seed": s.seed,
    }


@gin.configurable
def run(settings: Optional[AlphaSettings] = None, **overrides) -> Dict[str, Any]:
    """Measures alpha for each sampling setting; writes `alpha.json` + `config.gin`.

    Args:
      settings: the run's `AlphaSettings` (gin: `alpha.run.settings = @alpha.AlphaSettings()`,
        bound from the macros in configs/runs/measure_alpha.gin).
      **overrides: `AlphaSettings` fields by name, replacing the bound ones (or making the
        settings when there are none): `--gin.alpha.run.draft_seed=0` and
        `run(target_model=..., draft_model=..., output_dir=...)` work as before.
    """
    s = with_overrides(AlphaSettings, settings, overrides, "alpha.run")
    output_dir = files.check_output_dir(s.output_dir, RESULTS_FILE, s.overwrite)
    samplings = sampling_lib.sampling_configs(s.temperatures, s.top_k, s.top_p)
    for name in ("num_tokens", "batch_size", "max_decode_len", "input_length",
                 "histogram_bins"):
        validation.positive_ints([getattr(s, name)], name, "an int >= 1")
    sampling_lib.validate_lenience(s.lenience)
    target = loading.build_model(s.target_model, s.target_checkpoint, name="target",
                                 decoder_only=s.decoder_only, seed=s.seed,
                                 param_dtype=s.param_dtype)
    draft = loading.build_draft(s.draft_model, s.draft_checkpoint, target,
                                decoder_only=s.decoder_only, seed=s.seed,
                                draft_seed=s.draft_seed, param_dtype=s.param_dtype)

    source = dict(vocab_size=target.vocab_size, input_length=s.input_length, seed=s.seed,
                  task=s.task, split=s.split, tsv_path=s.tsv_path, spm_path=s.spm_path)
    per_sampling = []
    for index, sampling in enumerate(samplings):
        sequences = acceptance.collect_betas(
            target, draft, bench.input_batches(s.batch_size, **source), sampling=sampling,
            num_tokens=s.num_tokens, max_decode_len=s.max_decode_len, lenience=s.lenience,
            rng=jax.random.fold_in(jax.random.PRNGKey(s.seed), index))
        stats = acceptance.beta_statistics(sequences, s.histogram_bins)
        if stats["num_tokens"] < s.num_tokens:
            print(f"warning: the inputs ran out after {stats['num_tokens']} of {s.num_tokens} "
                  "tokens", flush=True)
        per_sampling.append({"sampling": measure.sampling_dict(sampling), **stats})

    results = {"schema": SCHEMA, "config": _config_json(s, samplings),
               "environment": host.environment(), "settings": per_sampling}
    print(format_table(per_sampling), flush=True)
    path = bench.write_json(results, output_dir, RESULTS_FILE)
    print(f"wrote {path}", flush=True)
    return results
