"""What a drafter says about its draft (decode/drafters.py `Capabilities`): everything outside
the decode package asks the drafter, never the draft model (tests/test_layering.py scans for
that), and calibration asks the drafter for its candidate settings."""

import types

import pytest

from speculative.decode import drafters, tree_drafter, trees
from speculative.models import hybrid, ngram

PLAIN = types.SimpleNamespace(vocab_size=8)  # a DecodeModel's stand-in: no capability
AWARE = types.SimpleNamespace(reads_target=True, feature_layers=(1,),
                              unrolled_logits=lambda *a: None)
BLOCK = types.SimpleNamespace(reads_target=True, feature_layers=(1,), max_gamma=4,
                              extend_block=lambda *a, **k: None,
                              unrolled_logits=lambda *a: None)


def _caps(drafter):
    return (type(drafter).__name__, drafter.reads_target, drafter.proposes_block,
            drafter.copies_input, drafter.needs_tree, drafter.unrolls, drafter.kind)


def test_each_drafter_answers_for_its_draft():
    assert _caps(drafters.as_drafter(PLAIN, 3)) == (
        "ChainDrafter", False, False, False, False, False, "chain")
    assert _caps(drafters.as_drafter(AWARE, 3)) == (
        "TargetAwareDrafter", True, False, False, False, True, "chain")
    no_unroll = types.SimpleNamespace(reads_target=True, feature_layers=())
    assert not drafters.as_drafter(no_unroll, 3).unrolls  # no teacher-forced depths offered
    assert _caps(drafters.as_drafter(BLOCK, 3)) == (
        "BlockDrafter", True, True, False, False, True, "block")
    assert _caps(drafters.as_drafter(BLOCK, 2, trees.as_tree((2, 1)))) == (
        "BlockDrafter", True, True, False, True, True, "tree")
    assert _caps(drafters.as_drafter(AWARE, 2, trees.as_tree((2, 1)))) == (
        "TreeDrafter", True, False, False, True, True, "tree")
    lookup = ngram.PromptLookupDraft(vocab_size=8)
    assert drafters.as_drafter(lookup, 3).copies_input
    assert not drafters.as_drafter(lookup, 3).has_network
    mixed = hybrid.HybridDraft(ngram.fit_unigram([[2, 3]], 8), lookup)
    assert drafters.as_drafter(mixed, 3).copies_input


def test_a_block_drafter_is_its_own_class_with_no_chain_settings():
    assert not issubclass(drafters.BlockDrafter, drafters.ChainDrafter)
    with pytest.raises(TypeError):
        drafters.BlockDrafter(BLOCK, 3, schedule="heuristic")
    block, chain = drafters.BlockDrafter(BLOCK, 3), drafters.TargetAwareDrafter(AWARE, 3)
    # the shared part: the same catch-up widths from the same FeatureReread
    assert block.reread.widths() == chain.reread.widths() == (1, 2, 4)
    assert block.catch_up_widths() == chain.catch_up_widths()


def test_calibration_asks_the_drafter_for_its_candidates():
    def shown(families):
        return [[drafters.record(d)[:2] for d in f] for f in families]

    assert shown(drafters.calibration_families(PLAIN, (6, 2, 4, 9), 8)) == [
        [("chain", 2), ("chain", 4), ("chain", 6)]]
    assert shown(drafters.calibration_families(BLOCK, (2, 4, 6), 8)) == [
        [("chain", 2), ("chain", 4), ("chain", 6)], [("block", 2), ("block", 4)]]
    own = drafters.ChainDrafter(PLAIN, 5)
    assert drafters.calibration_families(own, (2, 4), 8) == ((own,),)  # a drafter as given
    tree = drafters.as_drafter(PLAIN, 1).with_tree((2, 1))
    assert isinstance(tree, tree_drafter.TreeDrafter) and tree.tree.branching == (2, 1)
    assert drafters.as_drafter(BLOCK, 1).with_tree((2, 2)).tree.branching == (2, 2)


@pytest.mark.parametrize("model, kind, gamma, tree, cls", [
    (PLAIN, "chain", 3, None, drafters.ChainDrafter),
    (BLOCK, "chain", 2, None, drafters.TargetAwareDrafter),
    (BLOCK, "block", 4, None, drafters.BlockDrafter),
    (PLAIN, "tree", 2, (2, 1), tree_drafter.TreeDrafter),
    (BLOCK, "tree", 2, (2, 1), drafters.BlockDrafter)])
def test_a_record_names_its_drafter_again(model, kind, gamma, tree, cls):
    drafter = drafters.from_record(model, kind, gamma, tree)
    assert type(drafter) is cls and drafters.record(drafter) == (kind, gamma, tree)


def test_a_record_the_draft_cannot_offer_is_refused_by_name():
    with pytest.raises(ValueError, match=r"kind='block'.*\[\('chain', 3\)\]"):
        drafters.from_record(PLAIN, "block", 3)
