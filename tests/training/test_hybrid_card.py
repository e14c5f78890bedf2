"""speculative/training/hybrid_card.py: the hybrid's card entry names its draft, loads as a
HybridDraft and carries alpha measured as a T5 draft's is; bad names are refused first."""

import dataclasses
import json

import jax
import pytest

from speculative.checkpoints import t5x as checkpoints
from speculative.data import bundles
from speculative.models import hybrid, t5
from speculative.training import hybrid_card

CONFIG = t5.T5Config(vocab_size=8000, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                     num_encoder_layers=1, num_decoder_layers=1,
                     mlp_activations=("gelu", "linear"))


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory):
    """The docstring bundle's inputs with a tiny random target and draft of its vocabulary."""
    root = tmp_path_factory.mktemp("models")
    entries = {}
    for seed, name in enumerate(("tiny_target", "tiny_draft")):
        params = t5.init_params(t5.Transformer(CONFIG), jax.random.PRNGKey(seed))
        checkpoints.save_t5x(params, str(root / name), step=1)
        entries[name] = {"config": dataclasses.asdict(CONFIG),
                         "checkpoint": f"{name}/checkpoint_1"}
    entries["tiny_draft"]["target"] = "tiny_target"
    (root / "model_card.json").write_text(json.dumps({"models": entries}))
    return dataclasses.replace(bundles.DOCSTRINGS, models_dir=str(root),
                               target_names=("tiny_target",), default_target="tiny_target",
                               max_decode_len=8)


def test_the_entry_loads_as_a_hybrid_with_card_alpha(tiny_bundle):
    entry = hybrid_card.add_hybrid_draft(tiny_bundle, "tiny_draft", name="tiny_hybrid",
                                         min_ngram=1, alpha_sentences=3)
    card = tiny_bundle.model_card()["models"]["tiny_hybrid"]
    assert card == json.loads(json.dumps(entry))
    assert (card["kind"], card["draft"], card["target"]) == ("hybrid", "tiny_draft",
                                                             "tiny_target")
    assert [r["temperature"] for r in card["alpha"]] == [0.0, 1.0]
    assert all(0.0 <= r["alpha"] <= 1.0 and r["sentences"] == 3 for r in card["alpha"])
    draft = tiny_bundle.load("tiny_hybrid")
    assert isinstance(draft, hybrid.HybridDraft) and draft.copy.min_ngram == 1
    assert "tiny_hybrid" in tiny_bundle.drafts()


def test_refuses_a_draft_that_is_not_a_t5_and_bad_ngram_lengths(tiny_bundle):
    with pytest.raises(ValueError, match=r"the hybrid wraps one of \['tiny_draft'"):
        hybrid_card.add_hybrid_draft(tiny_bundle, "prompt_lookup", name="x")
    with pytest.raises(ValueError, match="min_ngram=3, max_ngram=2"):
        hybrid_card.add_hybrid_draft(tiny_bundle, "tiny_draft", name="x", min_ngram=3,
                                     max_ngram=2)
    assert "x" not in tiny_bundle.model_card()["models"]
