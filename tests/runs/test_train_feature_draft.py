"""speculative/runs/train_feature_draft.py: the bundled target-aware draft reproduces its card."""


import pytest


def _feature_drafts():
    """(bundle, name) of every bundled target-aware draft, both pairs."""
    from speculative.data import bundles
    return [(b, n) for b in bundles.BUNDLES if b.available()
            for n, e in b.model_card()["models"].items() if e.get("kind") == "feature_draft"]


@pytest.mark.parametrize("bundle,name", [  # CI: the EN-DE draft; the code pair's (~50 s) slow
    pytest.param(b, n, marks=[pytest.mark.slow] if b.decoder_only else [])
    for b, n in _feature_drafts()], ids=lambda x: x if isinstance(x, str) else x.name)
def test_bundled_target_aware_draft_reproduces_its_card(bundle, name):
    """The stored (bfloat16) target-aware draft: its forced alpha on the card's first valid
    sentences (code: prompts continued for PROMPT_LENGTH tokens) is what the card records."""
    from speculative.data import bundles
    from speculative.runs import train_feature_draft as runs_feature_draft

    entry = bundle.entry(name)
    length = bundles.PROMPT_LENGTH if bundle.decoder_only else 48
    got = runs_feature_draft.valid_subset(
        bundle.load(entry["target"]), bundle.load(name),
        num=entry["valid_subset"]["first_n_valid_sentences"], length=length,
        decoder_only=bundle.decoder_only)
    assert got["positions"] == entry["valid_subset"]["positions"]
    for key in ("forced_alpha_t0", "forced_alpha_t1"):
        assert got[key] == pytest.approx(entry["valid_subset"][key], abs=1e-3)
