"""speculative/runs/infer_score.py: mode 'score' gives each target's log-likelihood under the
target, equal to an independent full teacher-forced forward (encoder-decoder and decoder-only),
and infer writes it as T5X's score mode does."""

import json

import jax
import numpy as np
import pytest

from speculative.decode import contract
from speculative.models import adapters, t5
from speculative.runs import config as config_lib
from speculative.runs import infer, infer_score
from tests.helpers import TINY_INPUTS, random_params, tiny_config
from tests.helpers.runs import INFER_GIN, infer_bindings

pytestmark = pytest.mark.usefixtures("clean_gin")
TARGETS = np.asarray([[4, 9, 1, 0, 0], [7, 7, 7, 7, 2]], np.int32)  # ends with EOS; runs full


def _full_forward_sum(logits, targets):
    logp = np.asarray(jax.nn.log_softmax(np.asarray(logits, np.float32), axis=-1))
    out = []
    for row, t in enumerate(targets):
        ends = list(t).index(contract.EOS_ID) + 1 if contract.EOS_ID in t else int(np.sum(t != 0))
        out.append(sum(logp[row, i, t[i]] for i in range(ends)))
    return np.asarray(out)


def test_encoder_decoder_scores_equal_a_full_forward():
    module = t5.Transformer(tiny_config())
    params = random_params(module, 0)
    scores = infer_score.log_likelihoods(adapters.EncoderDecoderModel(module, params),
                                         TINY_INPUTS, TARGETS)
    decoder_inputs = np.concatenate([np.zeros((2, 1), np.int32), TARGETS[:, :-1]], 1)
    logits = module.apply({"params": params}, TINY_INPUTS, decoder_inputs)
    np.testing.assert_allclose(scores, _full_forward_sum(logits, TARGETS), rtol=1e-5)
    assert np.all(np.asarray(scores) < 0)


def test_decoder_only_scores_equal_a_full_forward():
    module = t5.DecoderOnly(tiny_config(num_encoder_layers=0))
    params = random_params(module, 0)
    prompts = np.asarray([[5, 6, 7], [9, 3, 0]], np.int32)  # right-padded
    scores = infer_score.log_likelihoods(adapters.DecoderOnlyModel(module, params), prompts,
                                         TARGETS)
    for row in range(2):  # each row alone: BOS + its prompt + its target, teacher-forced
        prompt = [int(x) for x in prompts[row] if x]
        tokens = np.asarray([[0] + prompt + TARGETS[row].tolist()[:-1]], np.int32)
        logits = np.asarray(module.apply({"params": params}, tokens))[:, len(prompt):]
        np.testing.assert_allclose(scores[row], _full_forward_sum(logits, TARGETS[row:row + 1])[0],
                                   rtol=1e-5)


def test_infer_mode_score_writes_t5x_score_lines(tiny_gin, tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("Hello.\tHallo.\nThe cat sleeps.\tDie Katze schläft.\nYes.\tJa.\n")
    config_lib.parse_gin([INFER_GIN, tiny_gin], infer_bindings(
        tmp_path / "out", INPUT_FILE=repr(str(path)), DRAFT_MODEL="None",
        DRAFT_CHECKPOINT="None", NUM_EXAMPLES="None", MODE="'score'"))
    result = infer.infer()
    lines = [json.loads(x) for x in
             (tmp_path / "out" / "mini_ende-score.jsonl-00000-of-00001").read_text().splitlines()]
    assert [r["inputs"]["targets_pretokenized"] for r in lines] == ["Hallo.", "Die Katze schläft.",
                                                                   "Ja."]
    assert all(set(r) == {"index", "inputs", "score", "target_length"} for r in lines)
    assert all(r["score"] < 0 and r["target_length"] >= 2 for r in lines)
    assert result.metrics["mode"] == "score" and result.metrics["metrics"] == {}
    assert result.metrics["decoding"]["mean_score"] == pytest.approx(
        np.mean([r["score"] for r in lines]))
