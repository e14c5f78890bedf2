"""speculative/training/trainer.py: a few steps lower the loss, the schedule, init checkpoints,
and the TV objective raising acceptance."""


import jax
import numpy as np
import pytest

from speculative.checkpoints import t5x as checkpoints
from speculative.decode import contract
from speculative.models import t5
from speculative.training import data as training_data
from speculative.training import objectives, trainer
from speculative.training.train_config import TrainConfig
from tests.helpers import tiny_config

EOS = contract.EOS_ID


def test_a_few_steps_lower_the_loss_on_a_tiny_batch():
    module = t5.Transformer(tiny_config(vocab_size=32))
    config = TrainConfig(steps=30, batch_tokens=32, buckets=(8,), learning_rate=1e-2,
                                  warmup_steps=5)
    rng = np.random.default_rng(0)
    examples = [(np.append(rng.integers(2, 32, 6), EOS).astype(np.int32),
                 np.append(rng.integers(2, 32, 5), EOS).astype(np.int32)) for _ in range(4)]
    inputs, targets = next(training_data.batches(examples, config.buckets, config.batch_tokens))
    optimizer = trainer.make_optimizer(config)
    state = trainer.init_state(module, optimizer, jax.random.PRNGKey(0))
    step, eval_step = trainer.make_train_step(module, optimizer, config), \
        trainer.make_eval_step(module)
    before = trainer.evaluate_loss(eval_step, state.params, examples, config)
    for _ in range(config.steps):
        state, metrics = step(state, inputs, targets, jax.random.PRNGKey(1))
    after = trainer.evaluate_loss(eval_step, state.params, examples, config)
    assert int(state.step) == config.steps and float(metrics["tokens"]) == 24
    assert after < 0.5 * before, (before, after)


def test_schedule_warmup_then_cosine_to_final_fraction():
    config = TrainConfig(steps=100, warmup_steps=10, learning_rate=1.0,
                                  final_lr_fraction=0.1)
    lr = trainer.learning_rate_schedule(config)
    np.testing.assert_allclose([lr(0), lr(4), lr(9), lr(99)], [0.1, 0.5, 1.0, 0.1], rtol=1e-5)
    rsqrt = trainer.learning_rate_schedule(config.__class__(steps=100, warmup_steps=10,
                                                             learning_rate=1.0, decay="rsqrt"))
    np.testing.assert_allclose(rsqrt(39), 0.5, rtol=1e-5)


@pytest.mark.slow  # ~13 s
def test_tv_objective_raises_acceptance_against_the_teacher():
    """A few steps of 'tv' training move a random draft's beta against a fixed teacher up."""
    teacher_cfg, draft_cfg = tiny_config(vocab_size=24), tiny_config(vocab_size=24, emb_dim=8)
    teacher = t5.Transformer(teacher_cfg)
    t_params = t5.init_params(teacher, jax.random.PRNGKey(0))
    rng = np.random.default_rng(2)
    examples = [(np.append(rng.integers(2, 24, 6), EOS).astype(np.int32),
                 np.append(rng.integers(2, 24, 6), EOS).astype(np.int32)) for _ in range(8)]
    config = TrainConfig(steps=30, batch_tokens=64, buckets=(8,), objective="tv",
                                  teacher_top_k=24, learning_rate=0.05, warmup_steps=1)
    batch = next(training_data.batches(
        objectives.teacher_distributions(teacher, t_params, examples, config), (8,), 64))
    module = t5.Transformer(draft_cfg)
    optimizer = trainer.make_optimizer(config)
    state = trainer.init_state(module, optimizer, jax.random.PRNGKey(1))
    step = trainer.make_train_step(module, optimizer, config)
    losses = []
    for _ in range(30):
        state, metrics = step(state, batch[0], batch[1], jax.random.PRNGKey(0), *batch[2:])
        losses.append(float(metrics["loss"] / metrics["tokens"]))
    assert losses[-1] < losses[0] - 0.05, losses
    with pytest.raises(ValueError, match="teacher distributions"):
        step(state, batch[0], batch[1], jax.random.PRNGKey(0))


def test_init_checkpoint_starts_from_its_parameters_and_refuses_another_shape(tmp_path):
    model = tiny_config(vocab_size=40)
    module = t5.Transformer(model)
    params = t5.init_params(module, jax.random.PRNGKey(3))
    path = checkpoints.save_t5x(jax.device_get(params), str(tmp_path / "ckpt"), step=5)
    optimizer = trainer.make_optimizer(TrainConfig(steps=1))
    state = trainer.init_state(module, optimizer, jax.random.PRNGKey(0), path)
    for a, b in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(a, b)
    assert int(state.step) == 0
    other = t5.Transformer(tiny_config(vocab_size=40, emb_dim=24))
    with pytest.raises(ValueError, match="shape"):
        trainer.init_state(other, optimizer, jax.random.PRNGKey(0), path)
