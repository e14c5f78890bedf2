"""One training run's optimisation and batching settings (`TrainConfig`; the model is a separate
`T5Config`) and the objectives a run can minimise (`OBJECTIVES`, speculative/training/objectives.py
defines their losses). The trainer, the data, the objectives and the runs all read it, so it sits
below them."""

from __future__ import annotations

import dataclasses
from typing import Tuple

OBJECTIVES = ("ce", "kl", "tv")  # TrainConfig.objective: tokens, the teacher's KL, or its TV


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation and batching settings of one run (the model is a separate `T5Config`).

    Attributes:
      steps: optimizer updates.
      batch_tokens: rows per batch are `batch_tokens // L` for bucket length L (per side).
      buckets: padded lengths, ascending; the last is the maximum input and target length
        (the maximum input length alone where `target_buckets` is given).
      target_buckets: the targets' own padded lengths, ascending (empty: `buckets`). For tasks
        whose inputs are much longer than their outputs (code -> docstring), so the decoder
        is not run over the input's padded length; a batch is then `[batch_tokens //
        max(Li, Lt), Li]` inputs and `[.., Lt]` targets for each pair of buckets.
      truncate: cut over-long pairs to the last bucket (keeping EOS) instead of dropping them.
      optimizer: 'adafactor' (T5X's: relative updates, decay_rate 0.8) or 'adamw' (b1 0.9,
        b2 0.98). With T5's N(0, 1) embedding init, AdamW at 1e-3 learns the (tied) embedding
        slowly; Adafactor at 1e-2..3e-2 reached a much lower loss in the same steps.
      learning_rate: peak learning rate, reached linearly after `warmup_steps`.
      decay: after warmup, 'cosine' (to `final_lr_fraction` of the peak at `steps`), 'rsqrt'
        (`peak * sqrt(warmup / step)`) or 'constant'.
      weight_decay: AdamW decoupled weight decay on matrices (not on norms or biases tables).
      grad_clip: global-norm clipping (0 = off).
      label_smoothing: T5X-style label smoothing of the training loss (0 = off).
      z_loss: coefficient of `log(Z)^2` (T5X uses 1e-4).
      objective: what the model learns from each target position. 'ce': the token (references,
        or the teacher's greedy tokens with distillation). 'kl': the teacher's distribution at
        temperature 1 (cross-entropy against its top-`teacher_top_k` probabilities, renormalised:
        KL up to a constant). 'tv': acceptance itself, `1 - sum_x min(p(x), q(x))` over the
        teacher's top-k (the paper's beta: minimising it maximises alpha at temperature 1).
        'kl' and 'tv' need a teacher (`TrainRun(distill=True, ...)`).
      teacher_top_k: how many of the teacher's most likely tokens per position 'kl' and 'tv'
        keep (the rest of its mass, usually < 1e-3 for a trained target, is left out).
    """

    steps: int
    batch_tokens: int = 1024
    buckets: Tuple[int, ...] = (12, 16, 20, 24, 32, 48)
    target_buckets: Tuple[int, ...] = ()
    truncate: bool = False
    optimizer: str = "adafactor"
    learning_rate: float = 2e-2
    warmup_steps: int = 100
    decay: str = "cosine"
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    label_smoothing: float = 0.0
    z_loss: float = 1e-4
    objective: str = "ce"
    teacher_top_k: int = 32

    def __post_init__(self):
        b = tuple(int(x) for x in self.buckets)
        object.__setattr__(self, "buckets", b)
        tb = tuple(int(x) for x in self.target_buckets)
        object.__setattr__(self, "target_buckets", tb)
        for field, ok, fix in (
                ("buckets", b and list(b) == sorted(set(b)) and b[0] >= 2, "ascending, >= 2"),
                ("target_buckets", not tb or (list(tb) == sorted(set(tb)) and tb[0] >= 2),
                 "empty or ascending, >= 2"),
                ("batch_tokens", b and self.batch_tokens >= max(b[-1:] + tb[-1:]),
                 "at least the last bucket"),
                ("optimizer", self.optimizer in ("adamw", "adafactor"), "'adafactor' or 'adamw'"),
                ("decay", self.decay in ("cosine", "rsqrt", "constant"),
                 "'cosine', 'rsqrt' or 'constant'"),
                ("label_smoothing", 0.0 <= self.label_smoothing < 1.0, "in [0, 1)"),
                ("objective", self.objective in OBJECTIVES, f"one of {OBJECTIVES}"),
                ("teacher_top_k", self.teacher_top_k >= 1, "a positive int")):
            if not ok:
                raise ValueError(f"TrainConfig.{field}={getattr(self, field)!r} is invalid: use "
                                 f"{fix}.")

    @property
    def input_length(self) -> int:
        """The longest input."""
        return self.buckets[-1]

    @property
    def target_length(self) -> int:
        """The longest target (and decode)."""
        return (self.target_buckets or self.buckets)[-1]

    @property
    def max_length(self) -> int:
        """The longest input or target (both, where there are no `target_buckets`)."""
        return max(self.input_length, self.target_length)
