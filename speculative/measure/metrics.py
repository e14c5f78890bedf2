"""Evaluation metrics with T5's definitions: plain functions of (targets, predictions).

They need neither seqio nor TensorFlow (training computes BLEU with them on machines that have
neither); `speculative.tasks` re-exports both and attaches them to its seqio tasks. Scores are
on a 0-100 scale.
"""

from typing import Dict, Sequence


def bleu(targets: Sequence, predictions: Sequence[str]) -> Dict[str, float]:
    """Corpus BLEU as in `t5.evaluation.metrics.bleu` (sacrebleu, intl tokenizer).

    Args:
        targets: one reference string per prediction, or one list of references
            per prediction (all of the same length).
        predictions: the hypotheses.

    Returns:
        {"bleu": score in [0, 100]}.
    """
    import sacrebleu  # pylint: disable=g-import-not-at-top

    targets, predictions = list(targets), list(predictions)
    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
    if targets and isinstance(targets[0], (list, tuple)):
        references = [list(refs) for refs in zip(*targets)]
    else:
        references = [targets]
    score = sacrebleu.corpus_bleu(
        predictions, references, smooth_method="exp", smooth_value=0.0, force=False,
        lowercase=False, tokenize="intl", use_effective_order=False)
    return {"bleu": float(score.score)}


def rouge(
    targets: Sequence[str],
    predictions: Sequence[str],
    score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeLsum"),
    **scorer_kwargs,
) -> Dict[str, float]:
    """Mean ROUGE F-measure x100, as `t5.evaluation.metrics.rouge` (without bootstrap).

    Sentences are split at " . " for rougeLsum, as T5 does; `scorer_kwargs` go to
    `rouge_score.rouge_scorer.RougeScorer` (e.g. use_stemmer=True).
    """
    from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top

    targets, predictions = list(targets), list(predictions)
    if len(targets) != len(predictions):
        raise ValueError(f"{len(targets)} targets but {len(predictions)} predictions")
    if not targets:
        return {key: 0.0 for key in score_keys}
    scorer = rouge_scorer.RougeScorer(rouge_types=list(score_keys), **scorer_kwargs)
    totals = {key: 0.0 for key in score_keys}
    for target, prediction in zip(targets, predictions):
        scores = scorer.score(target=target.replace(" . ", " .\n"),
                              prediction=prediction.replace(" . ", " .\n"))
        for key in score_keys:
            totals[key] += scores[key].fmeasure
    return {key: 100.0 * total / len(targets) for key, total in totals.items()}
