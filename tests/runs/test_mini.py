"""The bundled mini models: greedy identity on the test split, and results that match the README.

Speculative greedy output must equal the target's greedy output; where a sentence differs, the
difference must be a numerical tie (`tests.helpers.check_greedy_identity`: the two top logits within
1e-4), counted and reported.
"""

import json
import os

import pytest

from speculative.data import bundles
from speculative.measure import acceptance
from speculative.runs import mini
from tests.helpers import REPO, check_greedy_identity

pytestmark = pytest.mark.skipif(not mini.available(), reason="no bundled models")

RESULTS = os.path.join(REPO, "results", "mini")
TARGETS = mini.targets() if mini.available() else []


def _check(num_sentences, target_name, tree=None, draft=None, gamma=4):
    """Greedy identity of `target_name` with `draft` (default: its best) on the first
    `num_sentences` test sentences (None = all)."""
    draft = draft or mini.best_draft(target_name)
    check_greedy_identity(mini.load(target_name), mini.load(draft),
                          mini.source_batches(num_sentences, 64, bundles.INPUT_LENGTH),
                          bundles.MAX_DECODE_LEN, gamma=gamma, what=f"{draft}, tree {tree}",
                          tree=tree)


@pytest.mark.parametrize("target_name", [  # CI: mini_target (the notebook and the README's
    # snippet check the large pair's greedy identity too); large_target slow
    pytest.param(t, marks=pytest.mark.slow) if t == mini.LARGE_TARGET else t for t in TARGETS])
def test_greedy_identity_first_test_sentences(target_name):
    _check(64, target_name)


@pytest.mark.slow
@pytest.mark.parametrize("target_name", TARGETS)
def test_greedy_identity_whole_test_split(target_name):
    _check(None, target_name)


FEATURE_DRAFTS = sorted(n for n, e in (mini.model_card()["models"].items()
                                        if mini.available() else ())
                        if e.get("kind") == mini.FEATURE_DRAFT)


@pytest.mark.parametrize("draft_name", FEATURE_DRAFTS)  # every bundled target-aware draft
def test_greedy_identity_target_aware_draft_first_test_sentences(draft_name):
    _check(64, mini.target_of(draft_name), draft=draft_name, gamma=5)


@pytest.mark.slow
@pytest.mark.parametrize("draft_name", FEATURE_DRAFTS)
def test_greedy_identity_target_aware_draft_whole_test_split(draft_name):
    _check(None, mini.target_of(draft_name), draft=draft_name, gamma=5)


TREE = (3, 2, 1)  # branching at the first two depths, a chain below


@pytest.mark.parametrize("target_name", [  # CI: the compute-bound pair (cheaper); large slow
    pytest.param(t, marks=pytest.mark.slow) if t == mini.LARGE_TARGET else t for t in TARGETS])
def test_greedy_identity_with_a_token_tree_first_test_sentences(target_name):
    _check(64, target_name, TREE)


@pytest.mark.slow
@pytest.mark.parametrize("target_name", TARGETS)
def test_greedy_identity_with_a_token_tree_whole_test_split(target_name):
    _check(None, target_name, TREE)


def _results():
    with open(os.path.join(RESULTS, "results.json")) as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.join(RESULTS, "results.json")),
                    reason="results/mini not written yet")
def test_alpha_reproduces_to_two_decimals():
    results = _results()
    settings = results["settings"]
    target = mini.load(mini.TARGET)
    for name, row in results["table3"].items():
        got = acceptance.bundle_alpha(target, mini.load(name), bundles.ENDE, 0.0,
                                      settings["num_alpha_tokens"], settings["seed"])
        assert round(got["alpha"], 2) == round(row["0.0"]["alpha"], 2), name


def test_best_draft_is_the_cards_and_best_t5_draft_a_separate_t5():
    """`best_draft` is the main job's default (the card's, here a target-aware draft for the
    large target); `best_t5_draft` is a separate T5 draft of the same target, the card's best
    where that is one."""
    card = mini.model_card()["best_draft"]
    for target in TARGETS:
        assert mini.best_draft(target) == card[target]
        t5_best = mini.best_t5_draft(target)
        assert mini.is_t5(t5_best) and mini.target_of(t5_best) == target
        if mini.is_t5(card[target]):
            assert t5_best == card[target]
    assert not mini.is_t5(mini.best_draft(mini.LARGE_TARGET))


def test_timed_drafts_are_the_t5_and_target_aware_drafts():
    """The reports time (Table 2) every T5 and target-aware draft of a target; the n-gram
    tables get alpha (Table 3) only."""
    for target in TARGETS:
        timed = bundles.ENDE.timed_drafts(target)
        expected = [n for n in bundles.ENDE.drafts(target) if mini.target_of(n) == target]
        assert timed == expected and all(
            mini.is_t5(n) or bundles.ENDE.entry(n)["kind"] in bundles.READS_TARGET for n in timed)
    assert "large_feature_draft" in bundles.ENDE.timed_drafts(mini.LARGE_TARGET)
    assert not any(n.startswith("mini_") and "gram" in n
                   for n in bundles.ENDE.timed_drafts(mini.LARGE_TARGET))
