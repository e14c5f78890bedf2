"""GAMMA 'auto''s prior: the choice where there is no time to time one.

    c = draft_step_cost(target, draft, batch, seed=0, max_decode_len=48, step_s=0.014)
    verify = verify_costs(1.3, (2, 4, 6))          # {gamma: steps}, from the verify at gamma 6
    predicted = predicted_speedups(alpha=0.78, c=c, verify_cost=verify, steps=300,
                                   lengths=[[40], [38]], gammas=(2, 4, 6))   # {gamma: speedup}
    SpeculationPrior(...).verdict()                                          # the log's words

`speculation.choose_speculation` asks for it where the gate says speculation pays (the run can
repay a compile, the bound reaches `min_speedup`) but no probe fits the calibration budget:
Theorem 3.8's model, per batch (`theory.expected_batch_rounds` at the slice's lengths: a batch
runs until its slowest row is done), at the draft's card alpha, its timed single-call cost c
and the target's verify (timed at the deepest gamma, `verify_costs`), picks the chain's gamma;
`speculation.speculation_prior` then decodes the slice once with it (its results are the run's)
and keeps the baseline only where it was measured slower by more than `PRIOR_NOISE`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import numpy as np

from speculative.decode import drafters
from speculative.measure import analysis as theory
from speculative.measure import costs as costs_lib

# The prior's check is one decode of the slice against one of the baseline's: it switches to the
# baseline only when measured slower by more than such a pair of decodes varies (a few percent).
PRIOR_NOISE = 0.03
TIMING_S = 0.1  # the draft's extend is timed for about this long (>= 2 steps)


@dataclasses.dataclass(frozen=True)
class SpeculationPrior:
    """The choice where there is no time to time one: the gate says speculation pays (the run
    can repay a compile, the bound is above `min_speedup`) but no probe fits the calibration
    budget. Theorem 3.8's model, per batch (`theory.expected_batch_rounds` at the slice's
    lengths), at the draft's card alpha and measured single-call costs, picks the chain's gamma;
    that one program then decodes the slice once (its compile and one decode: the decode is the
    run's), and the baseline runs only if it was measured slower
    (`speculation.speculation_prior`).

    Attributes:
      alpha: the draft's acceptance rate (`SpeculationSearch.alpha`: its model card's).
      c: the draft's extend of one token in baseline decode steps (timed; 0.0 for a drafter
        object or a draft without a model, whose cost was not timed).
      verify_cost: the target's verify of gamma + 1 tokens in baseline steps (`verify_costs`).
      gamma: the chain's gamma the model favours among `SpeculationSearch.gammas`.
      predicted: its predicted speedup on the slice: steps / (rounds * (verify_cost + gamma c)).
      measured: its measured speedup on the slice (the baseline's ms/token over its, compiles
        excluded); None where `predicted` was under `min_speedup` and nothing ran.
      kept: whether it runs (`measured` >= `min_speedup` less `PRIOR_NOISE`: the baseline only
        where the prior was measured slower).
      seconds: the prior's walltime (timing the draft, compiling and decoding the slice).
    """

    alpha: float
    c: float
    verify_cost: float
    gamma: int
    predicted: float
    measured: Optional[float]
    kept: bool
    seconds: float

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def verdict(self) -> str:
        model = (f"Theorem 3.8 at the card's alpha {self.alpha:.2f}, c {self.c:.2f} and a "
                 f"verify of {self.verify_cost:.2f} steps predicts {self.predicted:.2f}x")
        if self.measured is None:
            return f"no speculation: no time to time candidates, and {model} at best"
        if self.kept:
            return (f"chain gamma {self.gamma} from the prior, as there is no time to time "
                    f"candidates: {model}, measured {self.measured:.2f}x on the first batches")
        return (f"no speculation: no time to time candidates; {model} for chain gamma "
                f"{self.gamma}, but it measured {self.measured:.2f}x on the first batches")


def draft_step_cost(target, draft, x, *, seed: int, max_decode_len: int,
                    step_s: float) -> float:
    """c: the draft's extend of one token at the batch size of `x` (a cache of zeros, about
    `TIMING_S`, compilation subtracted) in baseline decode steps of `step_s` seconds; 0.0 for
    a drafter object or a draft without a model (n-gram, prompt lookup), not timed."""
    if drafters.is_drafter(draft) or not drafters.as_drafter(draft, 1).has_network:
        return 0.0
    num = int(np.clip(np.ceil(TIMING_S / max(step_s, 1e-9)), 2, 64))
    x = np.asarray(x)
    program = costs_lib.extend_program(
        draft, x, 1, num_steps=num, seed=seed, zeros=True, target=target,
        cache_len=draft.prefix_length(x.shape[1]) + max_decode_len + 2)
    return costs_lib.first_call(program)[0] / num / step_s if step_s > 0 else float("inf")


def verify_costs(top_cost: float, gammas: Sequence[int]) -> Dict[int, float]:
    """{gamma: the target's verify of gamma + 1 tokens in baseline steps}, from its cost at the
    deepest gamma (`top_cost`, timed) by a line through 1 step at gamma 0: at a batch where the
    verify is memory-bound the line is flat, where it is compute-bound it grows with gamma."""
    top = max(gammas)
    return {int(g): 1.0 + (float(top_cost) - 1.0) * g / top for g in gammas}


def predicted_speedups(*, alpha: float, c: float, verify_cost: Union[float, Mapping[int, float]],
                       steps: int, lengths: Sequence[Any],
                       gammas: Sequence[int]) -> Dict[int, float]:
    """{gamma: the baseline's `steps` over the expected rounds of the batches whose rows need
    `lengths` tokens, each round priced at `verify_cost + gamma c` baseline steps}: Theorem 3.8
    per batch. `verify_cost`: one cost for every gamma, or {gamma: cost} (`verify_costs`)."""
    def verify(g):
        return verify_cost[g] if isinstance(verify_cost, Mapping) else verify_cost

    return {int(g): steps / max(sum(theory.expected_batch_rounds(alpha, g, np.asarray(n))
                                     for n in lengths) * (verify(g) + g * c), 1e-12)
            for g in gammas}
