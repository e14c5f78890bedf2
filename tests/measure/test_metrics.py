"""speculative/measure/metrics.py: BLEU and ROUGE with T5's definitions (the tasks attach
them to their seqio tasks: tests/data/test_tasks.py)."""

import pytest

from speculative.measure import metrics


def test_bleu():
    refs = ["the cat sat on the mat today", "a quick brown fox jumps over the dog"]
    assert metrics.bleu(refs, refs)["bleu"] == pytest.approx(100.0)
    assert metrics.bleu(refs, ["completely different words here now", "nothing alike"])[
        "bleu"] == pytest.approx(0.0)
    partial = metrics.bleu(refs, ["the cat sat on the mat", refs[1]])["bleu"]
    assert 0 < partial < 100
    # One list of references per prediction: the second reference matches.
    multi = [["wrong words entirely here", refs[0]], ["nope nope nope nope", refs[1]]]
    assert metrics.bleu(multi, refs)["bleu"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="targets"):
        metrics.bleu(refs, refs[:1])


def test_rouge():
    refs = ["the cat sat on the mat . it was happy", "summaries are short"]
    scores = metrics.rouge(refs, refs)
    assert scores == pytest.approx({"rouge1": 100.0, "rouge2": 100.0, "rougeLsum": 100.0})
    # "a b" vs "a c": one unigram of two matches -> F1 = 0.5; no bigram matches.
    half = metrics.rouge(["a b"], ["a c"])
    assert half["rouge1"] == pytest.approx(50.0) and half["rouge2"] == pytest.approx(0.0)
    # Averaged over examples: one perfect, one disjoint.
    assert metrics.rouge(["x y", "p q"], ["x y", "r s"])["rouge1"] == pytest.approx(50.0)
