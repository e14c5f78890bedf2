"""Run functions of the target-aware draft: cache the target's features, train, export.

    python scripts/train.py --run=feature_cache --gin_file=configs/runs/feature_draft.gin \
        --gin.FEATURE_CACHE="'out/feature_cache/greedy'"
    python scripts/train.py --run=feature_draft --gin_file=configs/runs/feature_draft.gin ...

The sources are the bundled training sources and the 29,650 unseen ones (`mono_en.txt`),
interleaved (shard k holds both kinds), so a cache stopped after k shards is a fair sample.
For a decoder-only target (the code pair's `code_target`) the cache is the code corpus' train
split in chunks, read by teacher forcing (`configs/runs/feature_draft_code.gin`; build the split
first with `python scripts/build_code_corpus.py --train_split_only`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import List, Optional, Sequence

import gin
import jax
import numpy as np

from speculative import files
from speculative.checkpoints import t5x as checkpoints
from speculative.data import bundles, code_corpus, text
from speculative.decode import loops as decoding
from speculative.decode import validation
from speculative.decode.kernel import SamplingConfig
from speculative.measure import acceptance
from speculative.models import feature_draft as fd_model
from speculative.runs import mini
from speculative.training import distillation, evaluation, feature_data, feature_training
from speculative.training.data import pad_rows


def distill_sources(length: int = 48) -> np.ndarray:
    """`[n, length]` encoder inputs: training sources and unseen sources, alternating, in file
    order; sources longer than `length` tokens (prefix and EOS included) are left out."""
    vocab = mini.Vocabulary()
    train = [s for s, _ in text.load_pairs(os.path.join(mini.BUNDLE_DIR, "train.tsv"))]
    mono = text.load_sources(os.path.join(mini.BUNDLE_DIR, "mono_en.txt"))
    rows = []
    for group in (train, mono):
        ids = [x for x in vocab.encode_inputs(group) if len(x) <= length]
        rows.append(ids)
    merged = []
    for k in range(max(len(r) for r in rows)):
        merged += [r[k] for r in rows if k < len(r)]
    return pad_rows([np.asarray(x, np.int32) for x in merged], length)


def code_chunks(length: int, seed: int = 0) -> np.ndarray:
    """`[n, length]` language-model chunks of the code corpus' train split (each document's
    ids and EOS, cut as the code models were trained, 0-padded), in a shuffled order so that a
    cache stopped after k shards is a fair sample."""
    tokenizer = text.Tokenizer(os.path.join(code_corpus.CODE_DIR,
                                                     code_corpus.SPM_MODEL))
    path = code_corpus.corpus_file(code_corpus.CODE_DIR, code_corpus.split_file("train"))
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: build the code corpus' train split first "
                                "(python scripts/build_code_corpus.py --train_split_only).")
    chunks = [c for _, c in text.lm_examples(code_corpus.CODE_DIR, "train", tokenizer,
                                                       length)]
    order = np.random.default_rng(seed).permutation(len(chunks))
    return pad_rows([chunks[i] for i in order], length)


@gin.configurable
def feature_cache(cache_dir: str, target: str = mini.LARGE_TARGET,
                  feature_layers: Sequence[int] = (2, 4, 6), temperature: float = 0.0,
                  max_shards: Optional[int] = None, shard_size: int = 2048, seed: int = 0,
                  chunk_length: int = 128):
    """Builds (or resumes) the feature cache of bundled `target` in `cache_dir`: its decodes
    of the distillation sources, or, for a decoder-only target, its teacher-forced read of the
    code corpus' train split in chunks of `chunk_length` tokens."""
    pair = bundles.bundle(target)
    model = pair.load(target)
    if pair.decoder_only:
        validation.positive_int(chunk_length, "chunk_length", "tokens per corpus chunk")
        sources = code_chunks(chunk_length, seed)
    else:
        sources = distill_sources()
    return feature_data.build(cache_dir, model.module, model.params, sources,
                              target_name=target, feature_layers=tuple(feature_layers),
                              temperature=temperature, shard_size=shard_size, seed=seed,
                              max_shards=max_shards)


gin.external_configurable(fd_model.FeatureDraftConfig, module="feature_draft")
gin.external_configurable(feature_training.FeatureTrainConfig, module="feature_draft")


def valid_inputs(num: int = 256, length: int = 48) -> List[np.ndarray]:
    """The first `num` valid sources that fit `length` tokens (the card's alpha sentences)."""
    vocab = mini.Vocabulary()
    ids = [x for x in vocab.encode_inputs([s for s, _ in mini.test_pairs(split="valid")])
           if len(x) <= length]
    return [np.asarray(x, np.int32) for x in ids[:num]]


@gin.configurable(denylist=["gin_config"])
def train_feature_draft(*, model_dir: str, cache_dir: str, draft: fd_model.FeatureDraftConfig,
                        config: feature_training.FeatureTrainConfig,
                        target: str = mini.LARGE_TARGET, name: Optional[str] = None,
                        export_dir: Optional[str] = None, alpha_gamma: int = 4,
                        alpha_sentences: int = 256, hot_vocab: Optional[int] = None,
                        gin_config: Optional[str] = None) -> dict:
    """Trains a target-aware draft of bundled `target` on `cache_dir` (resumable), measures its
    alpha as the card does (in-loop `DecodeStats.alpha`, gamma 4, the first `alpha_sentences`
    valid sentences, T = 0 and 1), and with `export_dir` stores it in bfloat16 with its card
    entry. `hot_vocab` N restricts the trained draft's output to the N ids the target emits
    most often in the cache (`fd.with_hot_vocab`, no retraining) before it is measured and
    stored; its summary goes to `summary_hot<N>.json` beside the full draft's `summary.json`
    (run again on a finished `model_dir` to add it: training resumes at its end)."""
    validation.positive_int(alpha_sentences, "alpha_sentences",
                            "valid sentences the in-loop alpha is measured on")
    if hot_vocab is not None:
        validation.positive_int(hot_vocab, "hot_vocab", "ids of the hot output vocabulary")
        if hot_vocab > draft.vocab_size:
            raise ValueError(f"hot_vocab={hot_vocab} exceeds the vocabulary "
                             f"({draft.vocab_size}); give fewer ids or None.")
    os.makedirs(model_dir, exist_ok=True)
    if gin_config:
        files.write_atomic(os.path.join(model_dir, "config.gin"), gin_config)
    pair = bundles.bundle(target)
    target_model = pair.load(target)
    result = feature_training.train(draft_config=draft, config=config, cache_dir=cache_dir,
                                    model_dir=model_dir, target=target_model)
    trained = time.time()  # what follows (alpha, export) adds to the training's own seconds
    params = feature_training.load_params(model_dir, draft)
    hot = None
    if hot_vocab:
        ids, coverage = feature_data.hot_vocabulary(cache_dir, hot_vocab, draft.vocab_size)
        draft, params = fd_model.with_hot_vocab(draft, params, ids)
        hot = {"size": hot_vocab, "coverage": coverage}
    module = fd_model.FeatureDraft(draft)
    valid = result["valid"] or feature_training.last_valid(model_dir)  # a finished run's
    summary = {
        "kind": mini.FEATURE_DRAFT, "name": name or os.path.basename(model_dir.rstrip("/")),
        "config": dataclasses.asdict(draft), "train_config": dataclasses.asdict(config),
        "params": evaluation.num_params(params), "target": target, "steps": config.steps,
        "train_wall_s": round(result["seconds"], 1), "trained_on": _machine(),
        "final_valid": valid, "feature_cache": feature_data.read_manifest(cache_dir),
    }
    if config.extra_caches:
        summary["extra_feature_caches"] = [feature_data.read_manifest(d)
                                           for d in config.extra_caches]
    if hot:
        summary["hot_vocab"] = hot
    stored = params
    if export_dir:
        exported = jax.tree_util.tree_map(lambda x: np.asarray(x, "bfloat16"), params)
        path = checkpoints.save_t5x(exported, os.path.join(export_dir, summary["name"]),
                                    step=config.steps, overwrite=True)
        stored = checkpoints.load_params(path, dtype="float32")
        summary["checkpoint"] = os.path.relpath(path, export_dir)
    decoder_only = pair.decoder_only
    length = bundles.PROMPT_LENGTH if decoder_only else 48
    summary["valid_subset"] = valid_subset(target_model,
                                           fd_model.FeatureDraftModel(module, stored),
                                           num=min(64, alpha_sentences), length=length,
                                           decoder_only=decoder_only)
    summary["alpha"] = evaluation.draft_alpha(
        target_model, fd_model.FeatureDraftModel(module, stored),
        _valid_rows(alpha_sentences, length, decoder_only), rng=jax.random.PRNGKey(0),
        gamma=alpha_gamma, max_length=length)
    summary["total_wall_s"] = round(time.time() - trained + result["seconds"], 1)
    print(json.dumps(summary["alpha"]), flush=True)
    files.write_atomic(os.path.join(model_dir, f"summary_hot{hot_vocab}.json" if hot
                                    else "summary.json"),
                       json.dumps(files.json_ready(summary), indent=1, sort_keys=True))
    if export_dir:
        distillation.update_card(export_dir, summary["name"], summary)
    return summary


def _valid_rows(num: int, length: int, decoder_only: bool) -> List[np.ndarray]:
    """The card's alpha inputs: the first `num` valid sources that fit `length` tokens, or,
    for the code pair, `num` valid prompts of `length` tokens (`bundles.prompt_batches`)."""
    if not decoder_only:
        return valid_inputs(num, length)
    return [row for b in bundles.prompt_batches(num, 1, length, split="valid") for row in b]


def valid_subset(target, draft, num: int = 64, length: int = 48,
                 decoder_only: bool = False) -> dict:
    """Forced alpha (Table 3's method, `acceptance`) of `draft` along the target's greedy
    outputs of the first `num` valid sentences (code: prompts, continued for `length` tokens),
    at T = 0 and 1: what the card records for the stored (bfloat16) draft, and what a test
    recomputes from the bundle alone."""
    inputs = pad_rows(_valid_rows(num, length, decoder_only), length)
    out = decoding.autoregressive_decode(target, inputs, rng=jax.random.PRNGKey(0),
                                         sampling=SamplingConfig(0.0), max_decode_len=length)
    mask = np.arange(length)[None] < np.asarray(out.lengths)[:, None]
    result = {"first_n_valid_sentences": num, "positions": int(mask.sum())}
    for temperature in (0.0, 1.0):
        betas = np.asarray(acceptance.forced_betas(target, draft, inputs, out.tokens,
                                                  sampling=SamplingConfig(temperature)))
        result[f"forced_alpha_t{temperature:g}"] = float(betas[mask].mean())
    return result


def _machine() -> str:
    return f"{os.cpu_count()} CPU cores" if jax.default_backend() == "cpu" else \
        jax.devices()[0].device_kind
