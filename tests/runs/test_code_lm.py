"""The decoder-only (GPT-like) code pair: its prompts, and greedy identity for every draft.

Greedy speculative output must equal the target's greedy output, for the T5-style draft, the
n-gram drafts and prompt lookup alike (a difference must be a numerical tie:
`tests.helpers.check_greedy_identity`).
"""

import os

import numpy as np
import pytest

from speculative.data import bundles, code_corpus, text
from speculative.runs import code_lm
from tests.helpers import check_greedy_identity

needs_bundle = pytest.mark.skipif(not code_lm.available(), reason="no bundled code models")


def test_prompts_are_whole_chunk_heads_taken_round_robin_over_the_files():
    """Every prompt is the first PROMPT_LENGTH tokens of a training-style chunk (no padding, no
    EOS); the first prompts are the first chunk of each file in turn, so one big file cannot
    fill the first batches; `skip` and `num` select from that order."""
    length = 16
    batches = bundles.prompt_batches(None, 64, length)
    rows = np.concatenate(batches)
    assert all(b.shape == (64, length) for b in batches[:-1]) and rows.dtype == np.int32
    assert (rows > 1).all(), "prompts hold no padding (0) and no EOS (1)"
    tok = text.Tokenizer(os.path.join(code_corpus.CODE_DIR, code_corpus.SPM_MODEL))
    docs = code_corpus.read_documents(code_corpus.corpus_file(code_corpus.CODE_DIR,
                                                              "test.jsonl"))
    ids = tok.encode_targets([d.text for d in docs])
    chunks = code_corpus.lm_chunks(ids, bundles.CHUNK_LENGTH)
    assert len(rows) == len(text.lm_prompts([(None, c) for c in chunks], length))
    heads = [d[:length] for d in ids if len(d) > length]
    np.testing.assert_array_equal(rows[:len(heads)], np.stack(heads))
    np.testing.assert_array_equal(np.concatenate(bundles.prompt_batches(3, 2, length, skip=2)),
                                  rows[2:5])
    with pytest.raises(ValueError, match="length=256 must be in"):
        bundles.prompt_batches(1, 1, bundles.CHUNK_LENGTH)


def _check_greedy(num_prompts, batch_size, drafts, tree=None):
    target = code_lm.load(code_lm.TARGET)
    batches = bundles.prompt_batches(num_prompts, batch_size)
    for name in drafts:
        check_greedy_identity(target, code_lm.load(name), batches, code_lm.MAX_DECODE_LEN,
                              what=name, tree=tree)


@needs_bundle
def test_greedy_identity_first_test_prompts():
    """The T5-style draft and the target-aware one in CI (prompt lookup and the n-gram drafts
    in the slow test; their decoder-only greedy identity against a random target is in
    test_ngram.py)."""
    _check_greedy(8, 8, [n for n in code_lm.drafts() if code_lm.target_of(n) == code_lm.TARGET])


@needs_bundle
@pytest.mark.slow
def test_greedy_identity_every_draft_whole_test_split():
    _check_greedy(None, 64, code_lm.drafts())


@needs_bundle
@pytest.mark.slow  # ~14 s (the EN->DE pair's tree identity runs in CI)
def test_greedy_identity_with_a_token_tree_first_test_prompts():
    _check_greedy(8, 8, ["code_draft"], tree=(3, 2, 1))


@needs_bundle
@pytest.mark.slow
def test_greedy_identity_with_a_token_tree_every_draft_whole_test_split():
    _check_greedy(None, 64, code_lm.drafts(), tree=(3, 2, 1))


@needs_bundle
def test_best_draft_is_the_target_aware_one_and_best_t5_draft_the_separate_one():
    """The card names the target-aware draft best (the fastest trained draft in the committed
    Table 2 at both temperatures); what needs a draft with a model of its own gets code_draft."""
    assert code_lm.best_draft(code_lm.TARGET) == code_lm.model_card()["best_draft"][code_lm.TARGET]
    assert not code_lm.is_t5(code_lm.best_draft(code_lm.TARGET))
    assert code_lm.target_of(code_lm.best_draft(code_lm.TARGET)) == code_lm.TARGET
    assert code_lm.best_t5_draft(code_lm.TARGET) == "code_draft"
