"""Stage 3 of inference (`runs/infer.py`): choose how to decode -> a frozen `DecodePlan`.

    plan = choose(settings, target, draft, all_batches)
    plan.mode, plan.gamma, plan.drafter(draft)

The settings say what was asked; the plan says what runs. It is made once and never changed:

  * mode 'score': the target alone scores the given targets;
  * SPECULATIVE False: the baseline (or the target's own beam search with BEAM_SIZE);
  * a fixed GAMMA: speculative decoding with the draft as given;
  * GAMMA 'auto' (the default): the baseline, the chain at a few gammas, a block draft's block
    and the token-tree chooser's tree are timed on the run's first batches by the one timing
    engine (`speculation.choose_speculation`), and the fastest runs, no speculation included
    (`choose_decoding`); where speculation pays but no candidate can be timed within the
    calibration budget, Theorem 3.8's prior at the draft's card alpha decides, checked on those
    batches (`speculation.speculation_prior`); a choice made before for the same host, models,
    batch size, lengths and sampling is read from disk instead (`calibration_cache`); the log
    line says why and metrics.json records it (`decision`: the run's closing line);
  * BEAM_SIZE with SPECULATIVE: the plain search against the speculative proposals, timed on
    the first inputs (`choose_beam_search`), unless FORCE_SPECULATIVE_BEAM.

A plan is written beside a run's chunks (`to_json`), so a resumed run decodes its remaining
chunks as the interrupted one did, without timing again (`from_json`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional, Tuple

import numpy as np
from absl import logging

from speculative.data import bundles
from speculative.decode import contract, drafters
from speculative.measure import acceptance, speculation
from speculative.measure import costs as costs_lib
from speculative.runs import calibration_cache
from speculative.runs.infer_encode import sharded
from speculative.runs.infer_settings import InferSettings

FORCED_BEAM_GAMMA = 5  # FORCE_SPECULATIVE_BEAM with GAMMA 'auto' (nothing timed): the old default
MIN_BEAM_SPEEDUP = 1.1  # below it (a few inputs' timing noise), the plain search runs
BEAM_CALIBRATION = 4  # inputs on which choose_beam_search times the proposals


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """How the run decodes.

    Attributes:
      mode: 'speculative', 'autoregressive', 'beam_search', 'speculative_beam_search' or
        'score' (metrics.json's `mode`).
      gamma: draft tokens per round (speculative modes).
      kind, tree: the chosen drafter's kind ('chain', 'block', 'tree') and tree under GAMMA
        'auto'; None: the draft as given.
      draft_beam, draft_branch: the speculative beam search's proposals.
      speculation, beam_choice: what was timed and chosen, as metrics.json records it.
      calibration_seconds: the timing's walltime (compiles included).
      decision: what the run decodes with and why (`decision`), set by `choose`.
      reused: the chosen program's results for the calibration batches, each with its
        seconds (the run's first results; not written).
    """

    mode: str
    gamma: Optional[int] = None
    kind: Optional[str] = None
    tree: Optional[Tuple[int, ...]] = None
    draft_beam: Optional[int] = None
    draft_branch: int = 1
    speculation: Optional[Dict[str, Any]] = None
    beam_choice: Optional[Dict[str, Any]] = None
    calibration_seconds: float = 0.0
    decision: Optional[Dict[str, str]] = dataclasses.field(default=None, compare=False)
    reused: Tuple[Tuple[Any, float], ...] = dataclasses.field(default=(), compare=False,
                                                              repr=False)

    @property
    def speculative(self) -> bool:
        return self.mode in ("speculative", "speculative_beam_search")

    @property
    def beams(self) -> bool:
        return self.mode in ("beam_search", "speculative_beam_search")

    def drafter(self, draft):
        """What the decode loop drafts with: the chosen drafter, or the draft as given."""
        if not self.speculative or self.kind is None or self.beams:
            return draft
        return speculation.speculation_drafter(draft, self.kind, self.gamma, self.tree)

    def to_json(self) -> Dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "reused"}
        return dict(out, tree=list(self.tree) if self.tree else None)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "DecodePlan":
        names = {f.name for f in dataclasses.fields(cls)} - {"reused"}
        data = {k: v for k, v in data.items() if k in names}
        return cls(**dict(data, tree=tuple(data["tree"]) if data.get("tree") else None))


def choose(settings: InferSettings, target, draft, all_batches,
           cached: Optional[DecodePlan] = None) -> DecodePlan:
    """The run's `DecodePlan` (module docstring), with its `decision`; times only under GAMMA
    'auto' (unless `cached`, its `cached_choice`, decides) or beams."""
    plan = cached if cached is not None else _choose(settings, target, draft, all_batches)
    return dataclasses.replace(plan, decision=decision(settings, plan))


def _choose(settings: InferSettings, target, draft, all_batches) -> DecodePlan:
    if settings.infer_mode == "score":
        return DecodePlan("score")
    if settings.beam_size is not None:
        if not settings.speculative:
            return DecodePlan("beam_search")
        if not settings.force_speculative_beam:
            return choose_beam_search(settings, target, draft, all_batches)
        return DecodePlan(
            "speculative_beam_search",
            gamma=FORCED_BEAM_GAMMA if settings.auto_gamma else settings.gamma,
            draft_beam=settings.beam_size if settings.draft_beam is None
            else settings.draft_beam, draft_branch=settings.draft_branch)
    if not settings.speculative:
        return DecodePlan("autoregressive")
    if settings.auto_gamma:
        return choose_decoding(settings, target, draft, all_batches)
    return DecodePlan("speculative", gamma=settings.gamma)


def choose_beam_search(settings: InferSettings, target, draft, all_batches) -> DecodePlan:
    """With SPECULATIVE and BEAM_SIZE (and not FORCE_SPECULATIVE_BEAM): times the plain search
    and the speculative proposals (`costs.choose_beam_proposal`) on the first inputs; the plan
    runs the speculative search with the fastest proposal when it beat the plain one by
    MIN_BEAM_SPEEDUP, else the plain search (the same beams either way); the log says which."""
    calibration = [b for b, _ in all_batches[:BEAM_CALIBRATION]]
    kw = dict(beam_size=settings.beam_size, max_decode_len=settings.max_decode_len,
              length_penalty=settings.length_penalty)
    gammas = ([settings.gamma] if not settings.auto_gamma  # GAMMA 'auto': the proposals' own
              else sorted({int(c[1]) for c in costs_lib.BEAM_PROPOSALS}))
    candidates = (costs_lib.BEAM_PROPOSALS if settings.draft_beam is None  # unless fixed
                  else [(settings.draft_beam, g) for g in gammas])
    choice = costs_lib.choose_beam_proposal(target, draft, calibration, candidates=candidates,
                                            repeats=2, **kw)
    best = choice.best
    faster = best.speedup >= MIN_BEAM_SPEEDUP
    logging.warning(
        "BEAM_SIZE=%d with SPECULATIVE: on %d inputs the speculative search with draft beam %d, "
        "gamma %d and draft branch %d ran %.2fx the plain search (%.2f beam steps per round); "
        "%s.", settings.beam_size, len(calibration), best.draft_beam, best.gamma,
        best.draft_branch, best.speedup, best.replayed_per_round,
        "running it" if faster else
        f"below {MIN_BEAM_SPEEDUP}x, so beam_lib.beam_search runs (the same beams; "
        "FORCE_SPECULATIVE_BEAM = True runs the speculative one)")
    return DecodePlan("speculative_beam_search" if faster else "beam_search",
                      gamma=best.gamma, draft_beam=best.draft_beam,
                      draft_branch=best.draft_branch, beam_choice=choice.to_json())


def trees_apply(settings: InferSettings, target, draft) -> bool:
    """Whether the token-tree chooser can price a tree here: exact verification, one device,
    a target with tree verification and a draft model (not a drafter object, n-gram table or
    prompt lookup)."""
    return (settings.lenience == 1.0 and getattr(target, "mesh", None) is None
            and not drafters.is_drafter(draft) and drafters.as_drafter(draft, 1).has_network
            and not contract.missing(target, contract.TreeTarget))


def chosen_tree(settings: InferSettings, target, draft, calibration, best):
    """`acceptance.choose_tree`'s tree for the calibration slice (None: the chain), with the
    step costs it prices trees with timed on the slice's first batch."""
    del best  # the tree is priced against the best chain of its own rates
    batch = np.asarray(calibration[0])
    costs = costs_lib.measure_costs(target, draft, batch, acceptance.TREE_VERIFY_WIDTHS,
                                    max_decode_len=settings.max_decode_len, num_steps=4,
                                    repeats=3, seed=settings.seed)
    row_costs = functools.partial(costs_lib.draft_row_costs, target, draft, batch,
                                  acceptance.TREE_DRAFT_ROWS, c=costs.c,
                                  max_decode_len=settings.max_decode_len, repeats=3)
    choice = acceptance.choose_tree(target, draft, calibration, settings.sampling, costs,
                                    row_costs, max_decode_len=settings.max_decode_len,
                                    max_nodes=acceptance.TREE_MAX_NODES, seed=settings.seed)
    logging.info("gamma auto, token trees: %s", choice.line())
    return choice.tree


def calibration_slice(settings: InferSettings, target, all_batches, *,
                      gate: bool = True) -> Tuple[list, speculation.SpeculationSearch]:
    """The first batches GAMMA 'auto' times (`speculation.calibration_batches`: about 8 rows,
    at most 1/8 of the run), placed on the target's mesh, and the search over them. `gate`
    False times every candidate (Table 2's rows measure speculation whatever it pays)."""
    count = speculation.calibration_batches(len(all_batches), settings.batch_size)
    calibration = [sharded(b, target) for b, _ in all_batches[:count]]
    search = speculation.SpeculationSearch(
        sampling=settings.sampling, max_decode_len=settings.max_decode_len,
        lenience=settings.lenience, seed=settings.seed,
        **({"run_batches": len(all_batches)} if gate else {"gate": False}),
        alpha=bundles.card_alpha(settings.draft_config, settings.sampling.temperature,
                                 settings.draft_checkpoint))
    return calibration, search


def cached_choice(settings: InferSettings, num_batches: int) -> Optional[DecodePlan]:
    """GAMMA 'auto''s choice made before for this run's key (`calibration_cache`: a choice for
    runs of any length, or a short run's for runs of at most `num_batches` batches), or None.
    It needs no model, so a run whose cached choice is the baseline never loads its draft."""
    if (settings.infer_mode == "score" or settings.beam_size is not None
            or not settings.speculative or not settings.auto_gamma):
        return None
    key = calibration_cache.calibration_key(settings)
    cached = calibration_cache.load(key) or calibration_cache.load_short(key, num_batches)
    if cached is None:
        return None
    plan = DecodePlan.from_json(dict(cached, calibration_seconds=0.0, speculation=dict(
        cached.get("speculation") or {}, cache_file=cached["cache_file"])))
    logging.info("gamma auto: %s, as calibrated before on this host (%s; "
                 "SPECULATIVE_CALIBRATION_CACHE=0 calibrates again)",
                 choice_words(plan), cached["cache_file"])
    return plan


def choose_decoding(settings: InferSettings, target, draft, all_batches) -> DecodePlan:
    """GAMMA = 'auto': times the candidates on the run's first batches with
    `speculation.choose_speculation`, which knows the run's length and so spends calibration
    only where it can pay back (a short run keeps the baseline without compiling anything
    speculative), logs the choice and why; the plan runs the fastest, and takes its results
    for the calibration batches as the run's (same inputs, same keys).

    A new choice is stored in `calibration_cache` (this host, the same models, batch size,
    lengths and sampling) when it does not depend on the run's length
    (`calibration_cache.cacheable`), or, made because the run was short, for reruns no longer
    than it (`short_run`); `cached_choice` reads it back before the models load."""
    key = calibration_cache.calibration_key(settings)
    calibration, search = calibration_slice(settings, target, all_batches)
    tree_for = (functools.partial(chosen_tree, settings, target, draft, calibration)
                if trees_apply(settings, target, draft) else None)
    choice = speculation.choose_speculation(target, draft, calibration, search, tree_for=tree_for)
    logging.warning("%s", choice.line())
    best = choice.best
    per_batch = best.seconds / max(1, choice.batches)
    plan = DecodePlan(
        "speculative" if best.speculative else "autoregressive",
        gamma=best.gamma if best.speculative else None,
        kind=best.kind if best.speculative else None, tree=best.tree,
        speculation=dict(choice.to_json(), line=choice.line()),
        calibration_seconds=choice.seconds,
        reused=tuple((result, per_batch) for result in choice.results))
    stored = None
    if calibration_cache.cacheable(choice):
        stored = calibration_cache.store(key, plan.to_json())
    elif calibration_cache.short_run(choice):  # for reruns no longer than this one
        stored = calibration_cache.store_short(key, plan.to_json(), len(all_batches))
    if stored:
        logging.info("gamma auto: choice kept in %s for reruns", stored)
    return plan


def choice_words(plan: DecodePlan) -> str:
    """The plan's choice in words: 'chain gamma 4 (1.62x)', 'tree (2, 1) (1.4x)' or 'the
    baseline (no speculation)'."""
    if not plan.speculative:
        return "the baseline (no speculation)"
    what = (f"tree {tuple(plan.tree)}" if plan.tree is not None
            else f"{plan.kind or 'chain'} gamma {plan.gamma}")
    speedup = (plan.speculation or {}).get("speedup")
    return what + (f" ({speedup:.2f}x)" if speedup else "")


def decision(settings: InferSettings, plan: DecodePlan) -> Dict[str, str]:
    """What the run decoded with and why, for the closing summary and metrics.json's
    `decision`: {'choice': e.g. 'chain gamma 4 (1.62x)' or 'the baseline (no speculation)',
    'reason': the GAMMA 'auto' line (timed, from the prior, or cached) or the setting that
    fixed it}."""
    if plan.mode == "score":
        return {"choice": "score (the target alone)", "reason": "mode 'score'"}
    if plan.beams:
        choice = (f"speculative beam search (draft beam {plan.draft_beam}, gamma {plan.gamma})"
                  if plan.speculative else f"beam search (beam {settings.beam_size})")
        reason = ("FORCE_SPECULATIVE_BEAM" if settings.force_speculative_beam
                  else "SPECULATIVE = False" if not settings.speculative
                  else "timed against the plain search on the first inputs")
        return {"choice": choice, "reason": reason}
    if not settings.speculative:
        return {"choice": choice_words(plan), "reason": "SPECULATIVE = False"}
    if not settings.auto_gamma:
        return {"choice": choice_words(plan), "reason": f"GAMMA = {settings.gamma} given"}
    spec = plan.speculation or {}
    reason = spec.get("line", "GAMMA 'auto'")
    if spec.get("cache_file"):
        reason = f"calibrated before on this host ({spec['cache_file']}): {reason}"
    return {"choice": choice_words(plan), "reason": reason}
