"""Decoding-based evaluation of a trained model: its greedy outputs (`greedy_decode`), greedy
corpus BLEU (`bleu`), its alpha as a draft of a target (`draft_alpha`), and its size and cost
(`num_params`, `decoder_flops_per_token`).

Cost (`decoder_flops_per_token`): multiply-adds per generated token are `L_dec * (6 E I + 3 E F
+ 2 I (l_self + l_enc)) + E V` (self-attention q/k/v/o and cross-attention q/o projections, gated
MLP, attention over l_self cached and l_enc encoder positions, output layer); FLOPs are twice
that. Cross-attention keys/values are projected once per sentence, so they are not counted. A
decoder-only model has no cross-attention: `L_dec * (4 E I + 3 E F + 2 I l_self) + E V`.

Shape legend: B batch, V vocab, E embed, I = heads * head_dim, F mlp_dim.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import jax
import numpy as np

from speculative.data.text import Tokenizer
from speculative.decode import contract
from speculative.decode import kernel as sampling_lib
from speculative.decode import loops as decoding
from speculative.decode import stats as stats_lib
from speculative.measure import metrics as metrics_lib
from speculative.models import adapters, t5
from speculative.training.data import pad_rows

Array = jax.Array


def _decode_batches(inputs: Sequence[np.ndarray], batch_size: int, length: int):
    """Sorted by length (rows of similar length finish together); yields (indices, [B, length])."""
    order = np.argsort([len(x) for x in inputs], kind="stable")
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        rows = [inputs[i] for i in idx]
        # The last batch is filled with copies of its last row (not empty rows, which would
        # decode to max_decode_len and keep the loop running); callers drop rows >= len(idx).
        yield idx, pad_rows(rows + [rows[-1]] * (batch_size - len(rows)), length)


def greedy_decode(module: t5.Transformer, params, inputs: Sequence[np.ndarray], *,
                  max_decode_len: int, input_length: int,
                  batch_size: int = 256, progress: bool = False) -> List[np.ndarray]:
    """Greedy (temperature 0) outputs for each input, ids up to and including EOS.

    Inputs are padded to `input_length` and batched to `batch_size` rows, so the decode loop
    compiles once. `progress` shows a tqdm bar over the batches (minutes for tens of
    thousands of sentences).
    """
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top

    model = adapters.EncoderDecoderModel(module, params)
    outputs: List[Optional[np.ndarray]] = [None] * len(inputs)
    for idx, batch in tqdm(_decode_batches(inputs, batch_size, input_length),
                           total=-(-len(inputs) // batch_size), desc="greedy decoding",
                           unit="batch", disable=not progress):
        result = decoding.autoregressive_decode(
            model, batch, rng=jax.random.PRNGKey(0),  # unused: argmax needs no randomness
            sampling=sampling_lib.SamplingConfig(0.0),
            max_decode_len=max_decode_len)
        tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
        for row, i in enumerate(idx):
            outputs[i] = tokens[row, :lengths[row]]
    return outputs


def greedy_score(module, params, pairs, tokenizer: Tokenizer, input_length: int,
                 max_decode_len: int, metric: str = "bleu",
                 truncate: bool = False) -> Tuple[dict, List[str]]:
    """Greedy outputs for `(source, reference)` pairs scored by `metric`: 'bleu' (corpus
    BLEU, `metrics.bleu`: sacrebleu, intl tokenizer) or 'rouge' (mean ROUGE-1/2/L F x100,
    `metrics.rouge`) -> (scores, hypotheses). A source longer than `input_length` raises, or
    with `truncate` is cut to it keeping EOS last (the EN->DE card's BLEU: its valid split has
    a few sentences over the trained length)."""
    inputs = [np.asarray(x, np.int32) for x in tokenizer.encode_inputs([s for s, _ in pairs])]
    if truncate:
        inputs = [np.append(x[:input_length - 1], contract.EOS_ID).astype(np.int32)
                  if len(x) > input_length else x for x in inputs]
    too_long = [i for i, x in enumerate(inputs) if len(x) > input_length]
    if too_long:
        raise ValueError(f"Sources {too_long[:5]} have more than input_length={input_length} "
                         "tokens; raise it or drop them (nothing is cut).")
    outputs = greedy_decode(module, params, inputs, max_decode_len=max_decode_len,
                            input_length=input_length)
    hyps = [tokenizer.decode(o) for o in outputs]
    refs = [t for _, t in pairs]
    if metric == "bleu":
        return {"bleu": metrics_lib.bleu(refs, hyps)["bleu"]}, hyps
    if metric == "rouge":
        return metrics_lib.rouge(refs, hyps, score_keys=("rouge1", "rouge2", "rougeL")), hyps
    raise ValueError(f"metric={metric!r}: use 'bleu' or 'rouge'.")


def draft_alpha(target: contract.DecodeModel, draft: contract.DecodeModel,
                inputs: Sequence[np.ndarray], *, rng: Array, gamma: int, max_length: int,
                temperatures=(0.0, 1.0), batch_size: int = 256,
                input_length: Optional[int] = None) -> List[dict]:
    """Alpha (mean beta, Leviathan et al. §3.1) of `draft` against `target` at each temperature,
    from `speculative_decode` stats on `inputs` (padded to `input_length`, default
    `max_length`, the decode limit); plus generated tokens per target call."""
    results = []
    for t, temperature in enumerate(temperatures):
        stats, rows = [], []
        for k, (idx, batch) in enumerate(_decode_batches(inputs, batch_size,
                                                         input_length or max_length)):
            stats.append(decoding.speculative_decode(
                target, draft, batch, rng=jax.random.fold_in(jax.random.fold_in(rng, t), k),
                gamma=gamma, sampling=sampling_lib.SamplingConfig(temperature),
                max_decode_len=max_length).stats)
            rows.append(len(idx))  # the filler rows (copies) are left out of the counts
        total = stats_lib.merge_stats(stats, rows).summary()
        results.append({"alpha": total["alpha"], "temperature": temperature,
                        "tokens_per_target_call": total["tokens_per_target_call"],
                        "gamma": gamma, "sentences": len(inputs)})
    return results


def decoder_flops_per_token(config: t5.T5Config, self_len: int = 16, enc_len: int = 20, *,
                            decoder_only: bool = False) -> dict:
    """Decoder FLOPs per generated token (see the module docstring); 2 FLOPs per multiply-add.

    `self_len` and `enc_len` are the cached and encoder positions attended to; a decoder-only
    model has no cross-attention (`enc_len` unused)."""
    e, i, f, v = config.emb_dim, config.inner_dim, config.mlp_dim, config.vocab_size
    mlp = (len(config.mlp_activations) + 1) * e * f
    cross = 0 if decoder_only else 2 * e * i + 2 * i * enc_len  # query/out projections, scores
    attention = 4 * e * i + 2 * i * self_len + cross
    layers = config.num_decoder_layers * (attention + mlp)
    return {"decoder_layers": 2 * layers, "output_layer": 2 * e * v, "total": 2 * (layers + e * v)}


def num_params(params) -> int:
    return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))
