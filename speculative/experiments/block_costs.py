"""What a round of drafting costs on a random pair of real size: a chain against a block.

    python scripts/block_cost_benchmark.py --target=t5_1_1_base   # one H200: ~1.5 minutes

The target is a random-weight T5 1.1 of a preset size (`t5.preset`, built by the model factory
`loading.build_model`, as `configs/runs/gpu_benchmark.gin`'s synthetic targets); the draft is a
random block draft reading that target's features (`models/block_draft.py`: the bundled
large_block_draft's shape, one layer of width 192, reading the target decoder layers at a third,
two thirds and the end of its depth, e.g. 4, 8 and 12 of T5 1.1 base's 12). The same draft
drafts two ways: (a) the chain, a `TargetAwareDrafter` making gamma calls per round, and (b) the
block, a `BlockDrafter` making one. Random weights accept nothing meaningful, so this measures
COSTS only, at batch 1, for each gamma: the target's one-token step (seconds), the verify cost
of gamma + 1 tokens (target steps), and each drafter's cost per round c_round (target steps;
`measure.round_costs`: one `propose` with the loop's own state after a round that accepted
every draft, so the catch-up is at its widest, every program timed in the same interleaved
rounds) with its draft calls per round. Theorem 3.8 with the round's cost,
E[tokens](alpha, gamma) / (c_round + verify_cost(gamma)), is reported at an ASSUMED alpha
(`alpha`, default 0.8, not measured) so a reader of the device's numbers sees where a block
would pay: where the chain's gamma calls cost more than the block's one (launch-bound hosts).

`scripts/gpu_benchmark.sh` runs it with XLA's GPU command buffers covering the decode loop's
while and conditional bodies and without them (the XLA flags in effect are in the report).

Writes `<output_dir>/block_costs.json` and `.md` (provenance included) and indexes the run.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative import files, loading
from speculative.decode import drafters
from speculative.experiments import record
from speculative.measure import analysis as theory
from speculative.measure import host
from speculative.measure import round_costs as round_costs_lib
from speculative.models import block_draft as bd
from speculative.models import feature_draft as fd
from speculative.models import layers, t5

KINDS = ("chain", "block")  # the same draft, gamma calls a round and one


@dataclasses.dataclass(frozen=True)
class BlockCostSettings:
    """What `run` measures.

    Attributes:
      target: a T5 1.1 preset (`t5.PRESETS`), built with random weights.
      gammas: drafts per round to time.
      alpha: the ASSUMED acceptance rate Theorem 3.8 is evaluated at (random weights give no
        meaningful one).
      draft_emb_dim: the draft's width (heads of 64 dims, an MLP four times as wide, one layer).
      feature_layers: target decoder layers the draft reads (1-based); () = a third, two thirds
        and all of the target's decoder layers (2, 4, 6 of 6, as the bundled drafts).
      hot_vocab: ids the draft's output layer covers (the first `hot_vocab`); 0 = all.
      input_length: random source tokens (batch 1).
      max_decode_len, round_steps, repeats: the decode length the states are sized for, the
        proposals per timed call, the interleaved timing rounds.
      dtype: compute and parameter dtype of both models.
    """

    target: str = "t5_1_1_base"
    gammas: Tuple[int, ...] = (2, 4, 7)
    alpha: float = 0.8
    draft_emb_dim: int = 192
    feature_layers: Tuple[int, ...] = ()
    hot_vocab: int = 0
    input_length: int = 32
    max_decode_len: int = 48
    round_steps: int = 16
    repeats: int = 3
    dtype: str = "float32"
    output_dir: str = os.path.join(record.REPO, "results", "random", "block_costs")
    seed: int = 0


def draft_layers(num_decoder_layers: int) -> Tuple[int, ...]:
    """The target layers a draft reads by default: a third, two thirds and all of the way."""
    n = num_decoder_layers
    return tuple(sorted({max(1, round(n * k / 3)) for k in (1, 2, 3)}))


def random_pair(s: BlockCostSettings):
    """`(target, block draft)`: the random T5 1.1 target from the model factory and a random
    `BlockDraftModel` reading its features (placeholders for gamma up to max(gammas))."""
    config = t5.preset(s.target, dtype=s.dtype)
    target = loading.build_model(config, name="target", seed=s.seed, param_dtype=s.dtype)
    heads = max(1, s.draft_emb_dim // 64)
    draft_config = fd.FeatureDraftConfig(
        vocab_size=config.vocab_size, target_emb_dim=config.emb_dim,
        feature_layers=s.feature_layers or draft_layers(config.num_decoder_layers),
        emb_dim=s.draft_emb_dim, num_heads=heads, head_dim=64, mlp_dim=4 * s.draft_emb_dim,
        num_layers=1, dtype=s.dtype, hot_ids=tuple(range(s.hot_vocab)))
    module = bd.BlockDraft(draft_config, max_gamma=max(s.gammas))
    # jitted: run eagerly, the initialising forward takes seconds op by op
    params = jax.jit(bd.init_params, static_argnums=0)(module, jax.random.PRNGKey(s.seed + 1))
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, s.dtype), params)
    if layers.resolve_kernel_layout("auto") == "transposed":  # as bundles.load_feature_draft
        params = layers.transpose_kernels(params)
    return target, bd.BlockDraftModel(module, params)


def _drafter_of(target, draft) -> Dict[str, Any]:
    """Per kind, gamma -> its drafter, checked against the target."""
    made = {"chain": drafters.TargetAwareDrafter, "block": drafters.BlockDrafter}

    def checked(kind, gamma):
        drafter = made[kind](draft, int(gamma))
        drafter.check(target)
        return drafter

    return {kind: functools.partial(checked, kind) for kind in KINDS}


def run(s: BlockCostSettings = BlockCostSettings(), overwrite: bool = False) -> Dict[str, Any]:
    """Times both drafters at every gamma (module docstring); returns the report it writes."""
    check(s)
    files.check_report(s.output_dir, "block_costs", overwrite)
    load = host.LoadAverage()
    target, draft = random_pair(s)
    inputs = np.random.default_rng(s.seed).integers(
        2, target.vocab_size, (1, s.input_length)).astype(np.int32)
    spec = round_costs_lib.RoundCostSpec(gammas=tuple(s.gammas), max_decode_len=s.max_decode_len,
                                         round_steps=s.round_steps, repeats=s.repeats,
                                         seed=s.seed)
    costs = round_costs_lib.round_costs(target, _drafter_of(target, draft), inputs, spec)
    rows = []
    for g in s.gammas:
        row = {"gamma": g, "verify_cost": costs["verify_cost"][g]}
        for kind in KINDS:
            c_round = costs["c_round"][kind][g]
            row[kind] = {"c_round": c_round,
                         "draft_calls_per_round": costs["draft_calls_per_round"][kind][g],
                         "theorem_3_8_round_cost": theory.speedup(
                             s.alpha, g, c_round / g, costs["verify_cost"][g])}
        row["block_over_chain"] = (row["block"]["theorem_3_8_round_cost"]
                                   / row["chain"]["theorem_3_8_round_cost"])
        rows.append(row)
    result = {"settings": dataclasses.asdict(s), "alpha_assumed": s.alpha,
              "draft": dataclasses.asdict(draft.module.config) | {"hot_ids": s.hot_vocab},
              "xla_flags": os.environ.get("XLA_FLAGS", ""), "backend": jax.default_backend(),
              "costs": costs, "rows": rows}
    record.publish("block_costs", s.target, s.output_dir, "block_costs", result, markdown,
                   load=load, bandwidth=True)
    return result


def markdown(result: Dict[str, Any]) -> str:
    """The report's table: one row per gamma, the chain's and the block's round side by side."""
    header = ["γ", "verify cost", "chain c_round", "block c_round", "chain calls / round",
              "block calls / round", "Thm 3.8 chain", "Thm 3.8 block", "block / chain"]
    body = [[r["gamma"], f"{r['verify_cost']:.2f}", f"{r['chain']['c_round']:.3f}",
             f"{r['block']['c_round']:.3f}", f"{r['chain']['draft_calls_per_round']:.2f}",
             f"{r['block']['draft_calls_per_round']:.2f}",
             f"{r['chain']['theorem_3_8_round_cost']:.2f}x",
             f"{r['block']['theorem_3_8_round_cost']:.2f}x", f"{r['block_over_chain']:.2f}"]
            for r in result["rows"]]
    prov, s = result["provenance"], result["settings"]
    return "\n".join([
        f"# A chain against a block: round costs on a random {s['target']} pair", "",
        f"`{prov['command']}` at {prov['commit']}, {prov['date']}; backend "
        f"{result['backend']}, XLA_FLAGS `{result['xla_flags'].strip() or '(none)'}`; batch 1; "
        f"target step {result['costs']['target_step_s'] * 1e3:.3f} ms. Random weights: costs "
        "only. c_round: the draft's cost per round in target steps (one `propose` after a round "
        "that accepted every draft: the chain's γ calls, the block's one); verify cost: the "
        "target on γ + 1 tokens, in target steps; "
        f"Thm 3.8: E[tokens] / (c_round + verify cost) at an ASSUMED α = {result['alpha_assumed']}"
        " (not measured).", "",
        files.markdown_table(header, body), ""])


def check(s: BlockCostSettings) -> None:
    """Refuses bad settings, naming the value, before any model is built."""
    bad = [g for g in s.gammas if isinstance(g, bool) or not isinstance(g, int) or g < 1]
    if bad or not s.gammas:
        raise ValueError(f"gammas={tuple(s.gammas)!r}: give ints >= 1.")
    if not s.target.startswith("t5_1_1_") or s.target not in t5.PRESETS:
        raise ValueError(f"target={s.target!r}: choose a T5 1.1 preset, one of "
                         f"{sorted(p for p in t5.PRESETS if p.startswith('t5_1_1_'))}.")
    if isinstance(s.alpha, bool) or not (isinstance(s.alpha, (int, float))
                                         and math.isfinite(s.alpha) and 0 <= s.alpha < 1):
        raise ValueError(f"alpha={s.alpha!r}: the assumed acceptance rate is in [0, 1).")
    for name in ("draft_emb_dim", "input_length", "max_decode_len", "round_steps", "repeats"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: give an int >= 1.")
    vocab, depth = t5.PRESETS[s.target]["vocab_size"], t5.PRESETS[s.target]["num_decoder_layers"]
    if isinstance(s.hot_vocab, bool) or not isinstance(s.hot_vocab, int) or \
            not 0 <= s.hot_vocab <= vocab:
        raise ValueError(f"hot_vocab={s.hot_vocab!r}: give an int in [0, {vocab}] (0 = all).")
    if any(not 1 <= int(i) <= depth for i in s.feature_layers):
        raise ValueError(f"feature_layers={tuple(s.feature_layers)!r}: {s.target} has decoder "
                         f"layers 1..{depth}.")
