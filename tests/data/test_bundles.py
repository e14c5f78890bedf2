"""speculative/data/bundles.py: the bundled models load, match their cards and fit the size
budget."""

import json
import os

import numpy as np
import pytest

from speculative.checkpoints import t5x as checkpoints
from speculative.data import bundles, text
from speculative.models import ngram, t5
from speculative.training import data as training_data
from speculative.training import trainer
from speculative.training.train_config import TrainConfig

BUNDLE = os.path.join(text.MINI_DIR, "models")


def _card():
    path = os.path.join(BUNDLE, "model_card.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)["models"]


# ------------------------------------------------------------------------------ bundled models

@pytest.mark.parametrize("name", sorted(n for n, e in _card().items()
                                        if "checkpoint" in e and "kind" not in e))
def test_bundled_model_valid_subset_loss_matches_card(name):
    entry = _card()[name]
    config = t5.T5Config(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in entry["config"].items()})
    params = checkpoints.load_params(os.path.join(BUNDLE, entry["checkpoint"]), dtype="float32",
                                     config=config)
    n = entry["valid_subset"]["first_n_valid_pairs"]
    pairs = text.load_pairs(os.path.join(text.MINI_DIR, "valid.tsv"))[:n]
    tok = text.Tokenizer()
    examples, _ = training_data.make_examples(tok.encode_inputs([s for s, _ in pairs]),
                                         tok.encode_targets([t for _, t in pairs]), 48, True)
    train_config = TrainConfig(steps=1, buckets=(48,), batch_tokens=48 * n)
    loss = trainer.evaluate_loss(trainer.make_eval_step(t5.Transformer(config)), params,
                                  examples, train_config)
    assert loss == pytest.approx(entry["valid_subset"]["loss_bfloat16"], abs=2e-3)


@pytest.mark.parametrize("name", sorted(n for n, e in _card().items()
                                        if e.get("kind") in ("unigram", "bigram")))
def test_bundled_ngram_drafts_load(name):
    entry = _card()[name]
    cls = ngram.UnigramDraft if entry["kind"] == "unigram" else ngram.BigramDraft
    draft = cls.load(os.path.join(BUNDLE, entry["file"]))
    log_probs = np.asarray(draft.params["log_probs"])
    assert draft.vocab_size == 4000
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, rtol=1e-4)


def test_bundle_fits_the_size_budget():
    if not os.path.isdir(BUNDLE):
        pytest.skip("no bundled models")
    def size(top):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(top) for f in fs)

    large = os.path.join(BUNDLE, "large_target")
    large_size = size(large) if os.path.isdir(large) else 0
    assert large_size <= 100e6, large_size  # the memory-bound target, bfloat16
    assert size(BUNDLE) - large_size <= 25e6, size(BUNDLE) - large_size


def test_card_alpha_is_the_cards_rate_at_the_nearest_temperature():
    """What GAMMA='auto's gate assumes for a bundled draft (`SpeculationSearch.alpha`)."""
    rows = bundles.bundled("large_draft_kdtv").entry["alpha"]
    at = {r["temperature"]: r["alpha"] for r in rows}
    assert bundles.card_alpha("large_draft_kdtv", 0.0) == pytest.approx(at[0.0])
    assert bundles.card_alpha("large_draft_kdtv", 0.8) == pytest.approx(at[1.0])
    # a block draft's is the feature draft's it shares (its chain); unknown names have none
    assert bundles.card_alpha("large_block_draft", 0.0) == pytest.approx(
        bundles.card_alpha("large_feature_draft", 0.0))
    assert bundles.card_alpha("not_a_model", 0.0) is None
    # a run resolves a bundled T5's name to its config and checkpoint: found by the checkpoint
    kdtv = bundles.bundled("large_draft_kdtv")
    assert bundles.card_alpha(kdtv.config, 0.0, kdtv.checkpoint) == pytest.approx(at[0.0])
    assert bundles.card_alpha(kdtv.config, 0.0, "/elsewhere/checkpoint_1") is None
    assert bundles.card_alpha(t5.T5Config(vocab_size=16), 0.0) is None


# ------------------------------------------------------------------------- the docstring bundle

def test_docstring_batches_are_the_test_split_in_file_order():
    from speculative.data import docstring_corpus

    examples = docstring_corpus.read_split(docstring_corpus.DOCSTRING_DIR, "test")[:5]
    tok = text.Tokenizer(os.path.join(docstring_corpus.DOCSTRING_DIR, "spm.model"), prefix="")
    want = tok.encode_sources([e.code for e in examples], bundles.DOCSTRING_INPUT_LENGTH)
    got = bundles.DOCSTRINGS.batches(5, batch_size=2)
    assert [b.shape for b in got] == [(2, 384), (2, 384), (1, 384)]
    np.testing.assert_array_equal(np.concatenate(got), want)
    np.testing.assert_array_equal(bundles.DOCSTRINGS.batches(2, 2, skip=3)[0], want[3:5])
    assert bundles.bundle("docstring_target") is bundles.DOCSTRINGS


def test_a_hybrid_card_entry_loads_its_draft_with_prompt_lookup(tmp_path):
    """The card's kind 'hybrid' names a T5 draft; the bundle builds models/hybrid.py around it."""
    import dataclasses

    import jax

    from speculative.models import hybrid

    config = t5.T5Config(vocab_size=32, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=16,
                         num_encoder_layers=1, num_decoder_layers=1,
                         mlp_activations=("gelu", "linear"))
    params = t5.init_params(t5.Transformer(config), jax.random.PRNGKey(0))
    checkpoints.save_t5x(params, str(tmp_path / "tiny_draft"), step=1)
    t5_entry = {"config": dataclasses.asdict(config), "checkpoint": "tiny_draft/checkpoint_1"}
    card = {"models": {
        "tiny_target": t5_entry, "tiny_draft": {**t5_entry, "target": "tiny_target"},
        "tiny_hybrid": {"kind": "hybrid", "draft": "tiny_draft", "min_ngram": 2,
                        "max_ngram": 4}}}
    (tmp_path / "model_card.json").write_text(json.dumps(card))
    bundle = dataclasses.replace(bundles.DOCSTRINGS, models_dir=str(tmp_path),
                                 target_names=("tiny_target",), default_target="tiny_target")
    draft = bundle.load("tiny_hybrid")
    assert isinstance(draft, hybrid.HybridDraft)
    assert (draft.copy.min_ngram, draft.copy.max_ngram, draft.vocab_size) == (2, 4, 32)
    assert bundle.target_of("tiny_hybrid") == "tiny_target"
    assert bundle.drafts() == ["tiny_draft", "tiny_hybrid", "prompt_lookup"]
    assert not bundle.is_t5("tiny_hybrid") and bundle.best_t5_draft() == "tiny_draft"
