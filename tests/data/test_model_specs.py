"""speculative/data/model_specs.py (the factory behind `speculative.loading`): every spec a run
accepts becomes a `DecodeModel`, and each wrong combination is refused in one line naming the
value and the fix, before anything loads. (Checkpoint-backed specs are tested with the
checkpoint readers: tests/checkpoints/test_factory.py.)"""

import numpy as np
import pytest

from speculative import loading
from speculative.data import bundles, model_specs
from speculative.models import ngram, t5
from tests.helpers import tiny_config


def test_the_facade_names_the_factorys_functions():
    for name in ("build_model", "build_draft", "check_same_vocab", "describe_model", "source",
                 "is_decode_model"):
        assert getattr(loading, name) is getattr(model_specs, name)


def test_a_config_alone_builds_random_weights_seeded():
    cfg = tiny_config(vocab_size=16)
    a, b = (model_specs.build_model(cfg, seed=s) for s in (0, 1))
    again = model_specs.build_model(cfg, seed=0)
    assert model_specs.is_decode_model(a) and a.vocab_size == 16
    def leaf(model):  # every parameter, flat (layer norms start at 1: not enough alone)
        import jax  # pylint: disable=g-import-not-at-top
        return np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(model.params)])

    np.testing.assert_array_equal(leaf(a), leaf(again))
    assert not np.array_equal(leaf(a), leaf(b))
    assert model_specs.source(cfg, None) == "(random weights)"
    assert model_specs.source(cfg, "/ckpt") == "/ckpt"
    shown = model_specs.describe_model(cfg)
    assert shown["type"] == "T5Config" and shown["vocab_size"] == 16
    assert isinstance(shown["mlp_activations"], list)  # JSON-ready
    assert model_specs.describe_model(None) is None


def test_an_ngram_file_loads_and_refuses_a_checkpoint(tmp_path):
    path = str(tmp_path / "bigram.npz")
    ngram.fit_bigram([[2, 3, 4, 1]], 16).save(path)
    model = model_specs.build_model(path, name="draft")
    assert isinstance(model, ngram.BigramDraft) and model.vocab_size == 16
    assert model_specs.describe_model(path) == {"type": "ngram", "path": path}
    with pytest.raises(ValueError, match="draft_checkpoint='/c' was given but draft_model is "
                                         "the n-gram file.*give only the file"):
        model_specs.build_model(path, "/c", name="draft")


def test_a_ready_model_passes_through_and_bad_specs_name_the_choices():
    lookup = ngram.PromptLookupDraft(vocab_size=16)
    assert model_specs.build_model(lookup, name="draft") is lookup
    with pytest.raises(ValueError, match="is a ready PromptLookupDraft; checkpoints only"):
        model_specs.build_model(lookup, "/c", name="draft")
    with pytest.raises(TypeError, match=r"target_model=42 is invalid.*bundled model's name "
                                        r"\(one of \["):
        model_specs.build_model(42)
    name = sorted(bundles.bundled_names())[0]
    with pytest.raises(ValueError, match=f"bundled model '{name}'; give only the name"):
        model_specs.build_model(name, "/c")


def test_a_draft_shares_the_targets_vocabulary_and_prompt_lookup_takes_it():
    target = model_specs.build_model(tiny_config(vocab_size=16))
    lookup = model_specs.build_draft(bundles.PROMPT_LOOKUP, None, target)
    assert isinstance(lookup, ngram.PromptLookupDraft) and lookup.vocab_size == 16
    draft = model_specs.build_draft(tiny_config(vocab_size=16), None, target)
    assert draft.vocab_size == 16
    with pytest.raises(ValueError, match="vocab_size=16 and draft vocab_size=32 differ"):
        model_specs.build_draft(tiny_config(vocab_size=32), None, target)
    assert isinstance(tiny_config(vocab_size=16), t5.T5Config)
