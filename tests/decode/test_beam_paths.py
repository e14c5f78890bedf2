"""speculative/decode/beam_paths.py: the paths a drafter proposes for speculative beam search,
pinned on a hand-written bigram draft (next token t + 1 with probability 0.6, t + 2 with 0.3),
and what the drafter keeps of them (the search's exactness: tests/beam/test_search.py)."""

import numpy as np

from speculative.decode import beam_paths, drafters, rounds
from speculative.models import ngram

V = 8


def _bigram():
    probs = np.full((V, V), 0.1 / (V - 2), np.float32)
    for t in range(V):
        probs[t, (t + 1) % V], probs[t, (t + 2) % V] = 0.6, 0.3
    return ngram.BigramDraft({"log_probs": np.log(probs)})


def _start(drafter, batch, beams):
    inputs = np.full((batch, 3), 5, np.int32)
    model = drafter.model
    return drafter.beam_start(rounds.TargetView(model), inputs, 12, beams)[1]


def test_each_beam_gets_its_best_first_tokens_continued_greedily():
    """Two beams, two first tokens each: beam k's paths are rows 2k and 2k + 1; every proposal
    row of the draft holds its root's last token and its path."""
    drafter = drafters.ChainDrafter(_bigram(), 3)
    state = _start(drafter, 1, 2)
    last = np.asarray([[3, 5]], np.int32)
    out = drafter.beam_propose(state, last, np.asarray([[0.0, -1.0]]), 0, 2)
    np.testing.assert_array_equal(out.paths[0], [[4, 5, 6], [5, 6, 7], [6, 7, 0], [7, 0, 1]])
    np.testing.assert_array_equal(out.roots[0], [0, 0, 1, 1])
    np.testing.assert_array_equal(out.model.lengths, [4, 4, 4, 4])
    np.testing.assert_array_equal(out.model.history[:, :4],
                                  [[3, 4, 5, 6], [3, 5, 6, 7], [5, 6, 7, 0], [5, 7, 0, 1]])


def test_the_drafts_beam_search_never_proposes_eos():
    """After BOS the draft's best token is EOS (id 1): the greedy path keeps it, the draft's
    beam search of width 2 continues from its best non-EOS tokens instead."""
    drafter = drafters.ChainDrafter(_bigram(), 2)
    state = _start(drafter, 1, 1)
    out = drafter.beam_propose(state, np.asarray([[0]], np.int32), np.asarray([[0.0]]), 2, 1)
    np.testing.assert_array_equal(out.paths[0], [[1, 2], [2, 3], [2, 4]])
    np.testing.assert_array_equal(out.roots[0], [0, 0, 0])
    np.testing.assert_array_equal(out.model.history[:, :3], [[0, 1, 2], [0, 2, 3], [0, 2, 4]])


def test_a_chain_keeps_the_kept_beams_rows_rewound():
    """`beam_keep`: the kept beams' proposal rows, in beam order, rewound to their lengths."""
    drafter = drafters.ChainDrafter(_bigram(), 2)
    state = _start(drafter, 1, 2)
    out = drafter.beam_propose(state, np.asarray([[3, 5]], np.int32),
                               np.asarray([[0.0, -1.0]]), 0, 1)
    kept = drafter.beam_keep(state, out, np.asarray([1, 1]), np.asarray([2, 1]),
                             np.asarray([2, 2]), None)
    assert isinstance(kept, beam_paths.BeamDraftState) and kept.feature is None
    np.testing.assert_array_equal(kept.model.lengths, [2, 1])
    np.testing.assert_array_equal(kept.model.history[:, :3], [[5, 6, 7], [5, 6, 7]])


def test_draft_calls_per_round():
    chain = drafters.ChainDrafter(_bigram(), 3)
    assert (chain.beam_calls(0), chain.beam_calls(2)) == (4, 7)
    aware = drafters.TargetAwareDrafter(_bigram(), 3)  # one more: the re-read with features
    assert (aware.beam_calls(0), aware.beam_calls(2)) == (5, 8)
