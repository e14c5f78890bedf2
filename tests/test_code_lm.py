"""The decoder-only (GPT-like) code pair: its prompts, and greedy identity for every draft.

Greedy speculative output must equal the target's greedy output, for the T5-style draft, the
n-gram drafts and prompt lookup alike. Where a continuation differs, the difference must be a
numerical tie (the two top target logits within 1e-4 at the first differing position), as in
test_mini.py: verification scores gamma + 1 tokens in one call, whose float32 rounding can
differ from one-token steps.
"""

import os

import jax
import numpy as np
import pytest

from speculative import code_corpus, decoding, training
from speculative.runs import alpha as alpha_lib
from speculative.runs import code_lm
from speculative.sampling import SamplingConfig

GREEDY = SamplingConfig(0.0)
needs_bundle = pytest.mark.skipif(not code_lm.available(), reason="no bundled code models")


def test_prompts_are_whole_chunk_heads_taken_round_robin_over_the_files():
    """Every prompt is the first PROMPT_LENGTH tokens of a training-style chunk (no padding, no
    EOS); the first prompts are the first chunk of each file in turn, so one big file cannot
    fill the first batches; `skip` and `num` select from that order."""
    length = 16
    batches = code_lm.prompt_batches(None, 64, length)
    rows = np.concatenate(batches)
    assert all(b.shape == (64, length) for b in batches[:-1]) and rows.dtype == np.int32
    assert (rows > 1).all(), "prompts hold no padding (0) and no EOS (1)"
    tok = training.Tokenizer(os.path.join(code_corpus.CODE_DIR, code_corpus.SPM_MODEL))
    docs = code_corpus.read_documents(code_corpus.corpus_file(code_corpus.CODE_DIR,
                                                              "test.jsonl"))
    ids = tok.encode_targets([d.text for d in docs])
    chunks = code_corpus.lm_chunks(ids, code_lm.CHUNK_LENGTH)
    assert len(rows) == len(training.lm_prompts([(None, c) for c in chunks], length))
    heads = [d[:length] for d in ids if len(d) > length]
    np.testing.assert_array_equal(rows[:len(heads)], np.stack(heads))
    np.testing.assert_array_equal(np.concatenate(code_lm.prompt_batches(3, 2, length, skip=2)),
                                  rows[2:5])
    with pytest.raises(ValueError, match="length=256 must be in"):
        code_lm.prompt_batches(1, 1, code_lm.CHUNK_LENGTH)


def _check_greedy(num_prompts, batch_size, gamma=4):
    target = code_lm.load(code_lm.TARGET)
    batches = code_lm.prompt_batches(num_prompts, batch_size)
    forced = jax.jit(alpha_lib._forced_logits)
    for name in code_lm.drafts():
        draft = code_lm.load(name)
        same, ties, total = 0, [], 0
        for b, inputs in enumerate(batches):
            kw = dict(rng=jax.random.PRNGKey(b), sampling=GREEDY,
                      max_decode_len=code_lm.MAX_DECODE_LEN)
            base = np.asarray(decoding.autoregressive_decode(target, inputs, **kw).tokens)
            spec = np.asarray(decoding.speculative_decode(target, draft, inputs, gamma=gamma,
                                                          **kw).tokens)
            logits = np.asarray(forced(target, inputs, base))
            for row in range(len(base)):
                total += 1
                diff = np.nonzero(base[row] != spec[row])[0]
                if not diff.size:
                    same += 1
                    continue
                top2 = np.sort(logits[row, diff[0]])[-2:]
                ties.append((total - 1, int(diff[0]), float(top2[1] - top2[0])))
        print(f"{name}: {same}/{total} identical; numerical ties: {ties}")
        assert same + len(ties) == total and same > 0
        for prompt, position, gap in ties:
            assert gap <= 1e-4, f"{name}: prompt {prompt} differs at {position}, logit gap {gap}"


@needs_bundle
def test_greedy_identity_every_draft_first_test_prompts():
    _check_greedy(16, 16)


@needs_bundle
@pytest.mark.slow
def test_greedy_identity_every_draft_whole_test_split():
    _check_greedy(None, 64)
