"""speculative/training/objectives.py: token losses (label smoothing, z-loss) and the
teacher's losses and distributions in closed form."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.decode import contract
from speculative.models import t5
from speculative.training import data as training_data
from speculative.training import objectives
from speculative.training.train_config import TrainConfig
from tests.helpers import tiny_config

EOS = contract.EOS_ID


# -------------------------------------------------------------------------------- loss, steps

def test_token_losses_label_smoothing_and_z_loss_closed_forms():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 5)), jnp.float32)
    targets = jnp.asarray([[1, 2, 3], [4, 0, 1]])
    loss, ce = objectives.token_losses(logits, targets)
    log_p = jax.nn.log_softmax(logits)
    np.testing.assert_allclose(ce, -jnp.take_along_axis(log_p, targets[..., None], -1)[..., 0],
                               rtol=1e-6)
    np.testing.assert_allclose(loss, ce)
    smooth, _ = objectives.token_losses(logits, targets, label_smoothing=0.1)
    soft = jax.nn.one_hot(targets, 5) * 0.9 + (1 - jax.nn.one_hot(targets, 5)) * 0.1 / 4
    entropy = -(0.9 * np.log(0.9) + 4 * (0.1 / 4) * np.log(0.1 / 4))
    np.testing.assert_allclose(smooth, -jnp.sum(soft * log_p, -1) - entropy, rtol=1e-5, atol=1e-6)
    zl, _ = objectives.token_losses(logits, targets, z_loss=1e-2)
    np.testing.assert_allclose(zl - ce, 1e-2 * jax.nn.logsumexp(logits, -1) ** 2, rtol=1e-5)


def test_teacher_losses_are_one_minus_beta_and_cross_entropy():
    """With the teacher's whole vocabulary kept, 'tv' is 1 - beta (the kernel's acceptance
    probability, sampling.acceptance_rate) and 'kl' is the cross-entropy H(p, q), which is
    smallest (= H(p)) at q = p."""
    from speculative.decode import kernel as sampling
    rng = np.random.default_rng(0)
    p_logits, q_logits = rng.normal(size=(2, 3, 7)) * 2, rng.normal(size=(2, 3, 7)) * 2
    p = jax.nn.softmax(jnp.asarray(p_logits), axis=-1)
    probs, ids = jax.lax.top_k(p, 7)
    tv = objectives.teacher_losses(jnp.asarray(q_logits), ids, probs, "tv")
    beta = sampling.acceptance_rate(p, jax.nn.softmax(jnp.asarray(q_logits), axis=-1))
    np.testing.assert_allclose(tv, 1.0 - beta, atol=1e-6)
    kl = objectives.teacher_losses(jnp.asarray(q_logits), ids, probs, "kl")
    log_q = jax.nn.log_softmax(jnp.asarray(q_logits), axis=-1)
    np.testing.assert_allclose(kl, -jnp.sum(p * log_q, axis=-1), rtol=1e-5)
    at_p = objectives.teacher_losses(jnp.asarray(p_logits), ids, probs, "kl")
    np.testing.assert_allclose(at_p, -jnp.sum(p * jnp.log(p), axis=-1), rtol=1e-5)
    assert np.all(np.asarray(at_p) < np.asarray(kl))
    np.testing.assert_allclose(objectives.teacher_losses(jnp.asarray(p_logits), ids, probs, "tv"),
                               0.0, atol=1e-6)
    with pytest.raises(ValueError, match="objective='ce'"):
        objectives.teacher_losses(jnp.asarray(q_logits), ids, probs, "ce")
    with pytest.raises(ValueError, match="objective"):
        TrainConfig(steps=1, objective="js")


def test_teacher_distributions_match_the_forward_pass_and_cache(tmp_path):
    model = tiny_config(vocab_size=40)
    module = t5.Transformer(model)
    params = t5.init_params(module, jax.random.PRNGKey(0))
    rng = np.random.default_rng(1)
    examples = [(np.append(rng.integers(2, 40, n), EOS).astype(np.int32),
                 np.append(rng.integers(2, 40, m), EOS).astype(np.int32))
                for n, m in ((3, 5), (9, 2), (4, 4), (14, 11))]
    config = TrainConfig(steps=1, batch_tokens=32, buckets=(8, 16), teacher_top_k=5)
    cache = str(tmp_path / "teacher.npz")
    got = objectives.teacher_distributions(module, params, examples, config, cache)
    forward = jax.jit(lambda x, y: module.apply({"params": params}, x, objectives.shift_right(y),
                                                y))
    for (x, y), (x2, y2, ids, probs) in zip(examples, got):
        assert x2 is x and y2 is y and ids.shape == probs.shape == (len(y), 5)
        logits = forward(training_data.pad_rows([x], 16),
                         training_data.pad_rows([y], 16))[:, :len(y)]
        want_p, want_ids = jax.lax.top_k(jax.nn.softmax(logits[0], axis=-1), 5)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(probs, want_p, atol=1e-3)  # stored as float16
    again = objectives.teacher_distributions(module, params, examples, config, cache)
    for a, b in zip(got, again):
        np.testing.assert_array_equal(a[2], b[2])
        np.testing.assert_array_equal(a[3], b[3])
    # Batches carry the teacher's arrays beside inputs and targets, padded alike.
    inputs, targets, ids, probs = next(training_data.batches(got, (16,), 64))
    assert ids.shape == probs.shape == targets.shape + (5,)
    assert np.all(probs[targets == 0] == 0)


def test_distill_cache_reads_back_outputs_holding_a_zero_token(tmp_path, monkeypatch):
    """A teacher output may hold id 0 before its EOS (an untrained or odd teacher): the cache
    returns it whole, so its teacher-distribution cache (keyed on the outputs) still matches."""
    outputs = [np.array([5, 0, 7, EOS], np.int32), np.array([9, EOS], np.int32),
               np.array([3] * 8, np.int32)]  # the last hits max_length: EOS replaces its end
    monkeypatch.setattr(objectives, "greedy_decode", lambda *a, **k: [o.copy() for o in outputs])
    examples = [(np.array([4, EOS], np.int32), np.array([EOS], np.int32))] * 3
    cache = str(tmp_path / "d.npz")
    fresh = objectives.distill_targets(None, None, examples, 8, cache)
    monkeypatch.setattr(objectives, "greedy_decode", lambda *a, **k: pytest.fail("decoded again"))
    again = objectives.distill_targets(None, None, examples, 8, cache)
    for (_, a), (_, b) in zip(fresh, again):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(again[0][1], [5, 0, 7, EOS])
    np.testing.assert_array_equal(again[2][1], [3] * 7 + [EOS])
