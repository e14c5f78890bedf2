"""Counters of a decode call and their one reduction (`DecodeStats`, `merge_stats`).

Both decode loops fill a `DecodeStats` inside the jitted loop (`DecodeStats.update` is a
speculative round's update); `summary` turns it into JSON-ready totals and ratios, and
`merge_stats` joins the stats of several calls. `speculative.decoding` re-exports both names.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

Array = jax.Array


@struct.dataclass
class DecodeStats:
    """Counters of one decode call. Per-row arrays are `[B]`; totals are properties.

    `target_calls[b]` counts the rounds in which row b was still decoding (one batched target
    forward serves all rows, so `rounds` is the number of target forwards the batch paid for).
    `tested[b]` counts drafted positions that the accept test examined (the accepted ones and
    the first rejected one); `beta_sum[b]` sums beta = sum_x min(p, q) over them, so
    `alpha = beta_sum / tested` estimates the paper's alpha along the generated text.

    `nonfinite[b]` is set when the distribution row b's next token would come from held NaN or
    inf (broken parameters, an overflowing temperature): the row stops there, its tokens are the
    exact prefix decoded before, and nothing computed from the non-finite numbers is emitted.
    Callers that present outputs must check it (`check_finite`).
    """

    rounds: Array  # [] loop iterations
    target_calls: Array  # [B]
    draft_calls: Array  # [B]
    drafted: Array  # [B]
    accepted: Array  # [B]
    generated: Array  # [B] tokens emitted (up to EOS / max_decode_len)
    beta_sum: Array  # [B]
    tested: Array  # [B]
    accepted_per_position: Array  # [B, G] (G = 0 for the baseline)
    nonfinite: Array  # [B] bool: the target's distribution went NaN/inf; the row was stopped

    def update(self, active, accepted, drafted, draft_calls, beta, generated,
               broken) -> "DecodeStats":
        """The counters after one speculative round (traced, inside the loop).

        `active [B]` rows decoding this round; `accepted [B]` n; `drafted [B]` drafts
        proposed; `draft_calls [B]` draft forwards this round; `beta [B, G]`;
        `generated [B]` tokens emitted so far; `broken [B]` rows stopped on NaN/inf. The
        accept test examined min(n + 1, drafted) positions: the accepted ones and the first
        rejected one."""
        a = active.astype(jnp.int32)
        gamma = beta.shape[1]
        tested = jnp.minimum(accepted + 1, drafted)
        tested_mask = jnp.arange(gamma)[None] < tested[:, None]
        return DecodeStats(
            rounds=self.rounds + 1,
            target_calls=self.target_calls + a,
            draft_calls=self.draft_calls + a * draft_calls,
            drafted=self.drafted + a * drafted,
            accepted=self.accepted + a * accepted,
            generated=generated,
            beta_sum=self.beta_sum + jnp.where(active, jnp.sum(beta * tested_mask, axis=1), 0.0),
            tested=self.tested + a * tested,
            accepted_per_position=self.accepted_per_position
            + (active[:, None] & (jnp.arange(gamma)[None] < accepted[:, None])).astype(jnp.int32),
            nonfinite=self.nonfinite | broken)

    @property
    def alpha(self) -> float:
        tested = float(jnp.sum(self.tested))
        return float(jnp.sum(self.beta_sum)) / tested if tested else float("nan")

    @property
    def alpha_per_row(self) -> np.ndarray:
        tested = np.asarray(self.tested, np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(self.beta_sum, np.float64) / tested

    @property
    def tokens_per_target_call(self) -> float:
        calls = float(jnp.sum(self.target_calls))
        return float(jnp.sum(self.generated)) / calls if calls else float("nan")

    @property
    def tokens_per_target_call_per_row(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(self.generated, np.float64) / np.asarray(self.target_calls)

    def __str__(self) -> str:
        """One line that says which counts are per batch and which are summed over rows, e.g.
        at batch 4: `rounds 13 (batched target forwards, all 4 rows in each) | target_calls 23
        (summed over rows: 6 + 5 + 6 + 6, the rounds each row was still decoding) | ...`."""
        calls = np.asarray(self.target_calls).reshape(-1).tolist()
        per_row = " + ".join(str(c) for c in calls[:8]) + (" + ..." if len(calls) > 8 else "")
        return (f"rounds {int(self.rounds)} (batched target forwards, all {len(calls)} rows in "
                f"each) | target_calls {sum(calls)} (summed over rows: {per_row}, the rounds "
                f"each row was still decoding) | generated {int(np.sum(self.generated))} | "
                f"tokens per target call {self.tokens_per_target_call:.2f} | alpha "
                f"{self.alpha:.3f}")

    def summary(self, per_row: bool = False) -> dict:
        """Totals as plain Python numbers (JSON-ready); the one place statistics are reduced.

        `rounds` is per batch: the batched target forwards, each serving every row still
        decoding. `target_calls` is summed over rows: each row's rounds while it was decoding
        (at batch 4, rounds 13 and target_calls 23 are consistent: rows stop at their own
        EOS). `alpha` and `tokens_per_target_call` are ratios of totals. `per_row=True` adds
        the per-row counts; `str(stats)` says the same in one line.
        """
        target_calls = int(np.sum(np.asarray(self.target_calls)))
        per_position = np.asarray(self.accepted_per_position, np.int64).sum(axis=0)
        out = {
            "rounds": int(self.rounds),
            "target_calls": target_calls,
            "draft_calls": int(np.sum(np.asarray(self.draft_calls))),
            "draft_calls_per_round": (int(np.sum(np.asarray(self.draft_calls))) / target_calls
                                      if target_calls else float("nan")),
            "drafted": int(np.sum(np.asarray(self.drafted))),
            "accepted": int(np.sum(np.asarray(self.accepted))),
            "generated": int(np.sum(np.asarray(self.generated))),
            "tested": int(np.sum(np.asarray(self.tested))),
            "alpha": self.alpha,
            "tokens_per_target_call": self.tokens_per_target_call,
            "accepted_per_position": per_position.tolist(),
            "accepted_per_position_rate":
                (per_position / target_calls).tolist() if target_calls else [],
            "nonfinite_rows": int(np.sum(np.asarray(self.nonfinite))),
        }
        if per_row:
            out["per_row"] = {name: np.asarray(getattr(self, name)).tolist() for name in
                              ("target_calls", "generated", "tested", "beta_sum")}
        return out

    def check_finite(self, what: str = "decode") -> None:
        """Raises FloatingPointError naming the rows whose distributions went non-finite."""
        rows = np.nonzero(np.asarray(self.nonfinite))[0]
        if rows.size:
            raise FloatingPointError(
                f"{what}: the target's distribution was NaN or infinite for rows "
                f"{rows.tolist()[:20]} (of {np.size(self.nonfinite)}); their outputs stop before "
                "it. Check the checkpoint for NaN/inf parameters, and use temperature 0 or a "
                "larger temperature if it is tiny.")


def merge_stats(stats: Sequence[DecodeStats],
                rows: Optional[Sequence[int]] = None) -> DecodeStats:
    """One `DecodeStats` for several decode calls (e.g. the batches of a run): per-row arrays
    concatenated (only the first `rows[i]` rows of call i when given, so filler rows that pad a
    last batch are left out), `rounds` summed (target forwards paid for). Host-side numpy."""
    stats = list(stats)
    if not stats:
        raise ValueError("merge_stats needs at least one DecodeStats.")
    rows = [None] * len(stats) if rows is None else list(rows)
    if len(rows) != len(stats):
        raise ValueError(f"rows has {len(rows)} entries for {len(stats)} DecodeStats.")
    host = [jax.device_get(s) for s in stats]
    widths = {np.shape(s.accepted_per_position)[1] for s in host}
    if len(widths) > 1:
        raise ValueError(f"Cannot merge stats of different gammas {sorted(widths)}.")

    def cat(name):
        return np.concatenate([np.asarray(getattr(s, name))[:r] for s, r in zip(host, rows)])

    fields = [f.name for f in dataclasses.fields(DecodeStats) if f.name != "rounds"]
    return DecodeStats(rounds=np.asarray(sum(int(s.rounds) for s in host)),
                       **{name: cat(name) for name in fields})
