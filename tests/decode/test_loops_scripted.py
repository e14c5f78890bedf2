"""The decode loops against hand-written logits (in the manner of t5x's `decoding_test.py`).

Each model here is a `ScriptedModel`: a decoder-only `DecodeModel` whose logits are a lookup in
a small table, `logits[b, i] = table[prev, cur]`, where `cur` is the token fed at that position
and `prev` the token before it *as the model's own cache holds it* (the slot before, or the
parent node in a token tree). The state is KV-like: `history [B, L]` holds the tokens, `extend`
writes at each row's `lengths`, `rewind` only moves `lengths`, and nothing past `lengths` is
ever read. So a wrong rewind, a missing catch-up or a wrong `keep_path` puts a wrong `prev`
under some position and changes what the model says there (`test_the_scripted_model_reads_its
_own_cache` and the negative controls at the end check that the tests below would notice).

The language. V = 8: 0 is BOS (and padding), 1 is EOS, 2..7 form the cycle 2 3 4 5 6 7 2 ...
The target follows the cycle: after (a, a+1) comes a+2 (mod the cycle); every other context is
off-script and the target says EOS there. A draft follows the same script except where a test
gives it a mistake; off-script it repeats the token it was fed. Prompts are two tokens [a, b]:
the cache holds [BOS, a] and b is pending, so every position has a real `prev`.

Every expected value below is worked out by hand from Algorithm 1 (draft G tokens; the target
scores [last, x_1..x_G]; keep the leading matches; emit the correction or the bonus token) and
the loop's documented bookkeeping (the draft lags one token after a round that accepted all G
drafts and then reads [x_G, bonus]), round by round in the comments. At temperature 0 a draft
is the draft's argmax and is kept iff it is the target's argmax.

Stats conventions pinned here (`DecodeStats`): `accepted` counts the drafts the verifier kept
(n per round, also when EOS or max_decode_len cuts the committed tokens shorter); `tested` the
positions the accept test examined, min(n + 1, drafted); `draft_calls` the batched draft calls
of the rounds a row was active in (G per chain round, also after the row's own drafts ended
early); `alpha` = sum beta / tested, beta being 1 for a kept draft and 0 for a rejected one at
temperature 0.
"""

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from speculative import decoding
from speculative.decode import contract
from speculative.sampling import SamplingConfig

V = 8
BOS, EOS = 0, 1
CYCLE = (2, 3, 4, 5, 6, 7)
GREEDY = SamplingConfig(temperature=0.0)
KEY = jax.random.PRNGKey(0)
NAN = float("nan")


def _succ(token: int) -> int:
    return CYCLE[(CYCLE.index(token) + 1) % len(CYCLE)]


# ----------------------------------------------------------------------------------------------
# The scripted model.


@struct.dataclass
class ScriptState:
    """`lengths [B]` tokens held, `pending [B]` the last prefix token (not yet held),
    `history [B, L]` the held tokens (slots past `lengths` are stale and never read)."""

    lengths: jax.Array
    pending: jax.Array
    history: jax.Array


def _write(history, tokens, starts):
    """`history[b, starts[b] : starts[b] + K] = tokens[b]` per row."""
    return jax.vmap(lambda h, t, s: jax.lax.dynamic_update_slice(h, t, (s,)))(
        history, tokens.astype(history.dtype), starts)


def _held_before(state):
    """`[B]` the token in the slot before `lengths` (BOS for an empty cache)."""
    before = jnp.take_along_axis(state.history, jnp.maximum(state.lengths - 1, 0)[:, None], 1)
    return jnp.where(state.lengths > 0, before[:, 0], BOS)


@struct.dataclass
class ScriptedModel:
    """A decoder-only `DecodeModel` with `logits = params['table'][prev, cur]` (module docstring);
    it also verifies token trees (`extend_tree`, `keep_path`), as the T5 adapters do."""

    params: Any
    max_length: Optional[int] = struct.field(pytree_node=False, default=None)

    @property
    def vocab_size(self) -> int:
        return self.params["table"].shape[-1]

    def prefix_length(self, input_length: int) -> int:
        return input_length + 1  # BOS + prompt

    def init(self, params, inputs, max_len):
        del params
        inputs = jnp.asarray(inputs, jnp.int32)
        batch, width = inputs.shape
        seq = jnp.concatenate([jnp.full((batch, 1), BOS, jnp.int32), inputs], axis=1)
        num = 1 + jnp.sum(inputs > 0, axis=1).astype(jnp.int32)  # BOS + prompt tokens
        history = jnp.zeros((batch, max_len), jnp.int32).at[:, :width + 1].set(seq)
        pending = jnp.take_along_axis(seq, (num - 1)[:, None], axis=1)[:, 0]
        return ScriptState(lengths=num - 1, pending=pending, history=history)

    def extend(self, params, state, tokens):
        tokens = jnp.asarray(tokens, jnp.int32)
        k = tokens.shape[1]
        history = _write(state.history, tokens, state.lengths)
        prev = jnp.concatenate([_held_before(state)[:, None], tokens[:, :-1]], axis=1)
        return params["table"][prev, tokens], state.replace(history=history,
                                                            lengths=state.lengths + k)

    def rewind(self, state, lengths):
        return state.replace(lengths=jnp.asarray(lengths, jnp.int32))

    def extend_tree(self, params, state, tokens, tree, feature_layers=()):
        """Nodes `tokens [B, K]` in slots `lengths .. lengths + K - 1`; node k's `prev` is its
        parent's token (the visible node one level up), the root's the held token before it."""
        assert not tuple(feature_layers)
        depths, visible = jnp.asarray(tree[0]), jnp.asarray(tree[1], bool)
        tokens = jnp.asarray(tokens, jnp.int32)
        parent = jnp.argmax(visible & (depths[None, :] == depths[:, None] - 1), axis=1)  # [K]
        prev = jnp.where(depths[None] == 0, _held_before(state)[:, None], tokens[:, parent])
        history = _write(state.history, tokens, state.lengths)
        return (params["table"][prev, tokens], None,
                state.replace(history=history, lengths=state.lengths + tokens.shape[1]))

    def keep_path(self, state, starts, offsets):
        """The tokens in slots `starts + offsets[:, j]` moved to `starts + j`."""
        src = jnp.asarray(starts, jnp.int32)[:, None] + jnp.asarray(offsets, jnp.int32)
        picked = jnp.take_along_axis(state.history, src, axis=1)
        return state.replace(history=_write(state.history, picked, starts))


def _row(spec) -> np.ndarray:
    """A table row: a token or a ranked tuple of tokens (logits 0, -1, -2, ...), a dict
    {token: logit}, or NAN (a broken distribution); unnamed tokens get -inf."""
    row = np.full((V,), -np.inf, np.float32)
    if isinstance(spec, float) and np.isnan(spec):
        row[:] = np.nan
    elif isinstance(spec, dict):
        for token, logit in spec.items():
            row[token] = logit
    else:
        for rank, token in enumerate((spec,) if isinstance(spec, int) else spec):
            row[token] = -float(rank)
    return row


def _model(rules, otherwise) -> ScriptedModel:
    table = np.stack([np.stack([_row(rules.get((prev, cur), otherwise(prev, cur)))
                                for cur in range(V)]) for prev in range(V)])
    return ScriptedModel(params={"table": jnp.asarray(table)})


def target(changes=None) -> ScriptedModel:
    """The cycle; off-script contexts say EOS. `changes` maps (prev, cur) to a row spec."""
    script = {(a, _succ(a)): _succ(_succ(a)) for a in CYCLE}
    return _model({**script, **(changes or {})}, lambda prev, cur: EOS)


def draft(changes=None) -> ScriptedModel:
    """The cycle ranked first and the fed token second; off-script it repeats the fed token."""
    script = {(a, _succ(a)): (_succ(_succ(a)), _succ(a)) for a in CYCLE}
    return _model({**script, **(changes or {})}, lambda prev, cur: cur)


def _tokens(max_decode_len, *rows):
    out = np.zeros((len(rows), max_decode_len), np.int32)
    for b, row in enumerate(rows):
        out[b, :len(row)] = row
    return out


def _stats(out) -> dict:
    """The pinned counters: per-row [B] lists, `accepted_per_position` summed over rows."""
    s = out.stats
    per_row = {name: np.asarray(getattr(s, name)).tolist() for name in
               ("target_calls", "draft_calls", "drafted", "accepted", "tested", "nonfinite")}
    return dict(rounds=int(s.rounds), **per_row,
                accepted_per_position=np.asarray(s.accepted_per_position).sum(0).tolist())


def _check(out, tokens, lengths, alpha=None, **stats):
    np.testing.assert_array_equal(np.asarray(out.tokens), tokens)
    assert np.asarray(out.lengths).tolist() == lengths
    got = _stats(out)
    assert {name: got[name] for name in stats} == stats
    if alpha is not None:
        assert out.stats.alpha == pytest.approx(alpha, abs=1e-6)


def _spec(target_model, draft_model, inputs, gamma, max_decode_len, **kw):
    return decoding.speculative_decode(
        target_model, draft_model, np.asarray(inputs, np.int32), rng=kw.pop("rng", KEY),
        gamma=gamma, sampling=kw.pop("sampling", GREEDY), max_decode_len=max_decode_len, **kw)


def _ar(model, inputs, max_decode_len):
    return decoding.autoregressive_decode(model, np.asarray(inputs, np.int32), rng=KEY,
                                          sampling=GREEDY, max_decode_len=max_decode_len)


def test_the_scripted_model_reads_its_own_cache():
    """The sensitivity the loop tests rely on: what follows a token depends on the held token
    before it, so a cache that was not rewound (or not caught up) changes the answer."""
    model = target()
    state = model.init(model.params, jnp.asarray([[2, 3]]), 16)
    assert state.lengths.tolist() == [2] and state.pending.tolist() == [3]  # holds BOS 2
    logits, state = model.extend(model.params, state, jnp.asarray([[3, 4, 5]]))
    assert jnp.argmax(logits, -1).tolist() == [[4, 5, 6]]
    rewound = model.rewind(state, jnp.asarray([3]))  # holds BOS 2 3: (3, 4) -> 5
    assert jnp.argmax(model.extend(model.params, rewound, jnp.asarray([[4]]))[0], -1).tolist() \
        == [[5]]
    # Not rewound (holds BOS 2 3 4 5): (5, 4) is off-script -> EOS.
    assert jnp.argmax(model.extend(model.params, state, jnp.asarray([[4]]))[0], -1).tolist() \
        == [[EOS]]


# ----------------------------------------------------------------------------------------------
# Chains at temperature 0.


def test_catch_up_after_all_drafts_were_accepted():
    """Draft = target: every round keeps all 3 drafts, so from round 2 on the draft is one
    token behind and must read [x_3, bonus] before it drafts again.

    Prompt [2, 3], G = 3, N = 10.
      round 1: drafts 4 5 6 (contexts (2,3) (3,4) (4,5)); target agrees; bonus after (5,6): 7.
               S = .. 2 3 | 4 5 6 7; the draft holds BOS 2 3 4 5 (never saw x_3 = 6).
      round 2: the draft is rewound to BOS 2 3 4 5 and reads [6, 7]: q_1 is (6,7) -> 2; drafts
               2 3 4; all kept; bonus 5. Without the catch-up the draft would read 7 after a
               stale slot (never written: 0), (0, 7) is off-script, and x_1 = 7 would be
               rejected.
      round 3: reads [4, 5]: drafts 6 7 2, all kept, bonus 3; 8 tokens + 4 > N: keeps 6 7.
    """
    model = target()
    out = _spec(model, model, [[2, 3]], gamma=3, max_decode_len=10)
    _check(out, _tokens(10, [4, 5, 6, 7, 2, 3, 4, 5, 6, 7]), [10], alpha=1.0, rounds=3,
           target_calls=[3], draft_calls=[9], drafted=[9], accepted=[9], tested=[9],
           accepted_per_position=[3, 3, 3], nonfinite=[False])


def test_rejection_rewinds_and_the_cut_at_max_decode_len_mid_round():
    """A draft that is wrong once per cycle: after (5, 6) it says 3 (the target: 7).

    Prompt [2, 3], G = 3, N = 12.
      round 1: drafts 4 5 6 kept; bonus 7.                    S += 4 5 6 7      (n = 3)
      round 2: catch-up [6, 7]; drafts 2 3 4 kept; bonus 5.   S += 2 3 4 5      (n = 3)
      round 3: catch-up [4, 5]: x_1 = 6 kept; x_2 = 3 after (5, 6), the target says 7:
               n = 1, correction 7. The target is rewound to hold .. 5 6 (x_3 = 3 and the
               verify tokens after x_1 dropped); the draft drafted x_1 x_2 and is rewound to
               the same length.                               S += 6 7          (n = 1)
      round 4: no lag: the draft reads [7, junk]; 7 after 6 -> 2; drafts 2 3 4 kept; bonus 5;
               10 tokens so far, N = 12: only 2 3 are kept (the cut inside a round).
    accepted counts n = 3 in round 4 although only 2 tokens were committed.
    """
    out = _spec(target(), draft({(5, 6): 3}), [[2, 3]], gamma=3, max_decode_len=12)
    expected = _tokens(12, [4, 5, 6, 7, 2, 3, 4, 5, 6, 7, 2, 3])
    _check(out, expected, [12], alpha=10 / 11, rounds=4, target_calls=[4], draft_calls=[12],
           drafted=[12], accepted=[10], tested=[11], accepted_per_position=[4, 3, 3],
           nonfinite=[False])
    ar = _ar(target(), [[2, 3]], 12)  # one target call per token, the same tokens
    _check(ar, expected, [12], rounds=12, target_calls=[12], accepted=[0])


def test_eos_inside_the_accepted_drafts():
    """EOS drafted and kept in the middle of a round: the output ends at it, and the drafts
    kept after it and the bonus are dropped (0 after EOS).

    Script changes (target and draft alike): (7, 2) -> EOS, then (2, 1) -> 5, (1, 5) -> 6.
    G = 3, N = 8.
      row 0, prompt [6, 7]: round 1 drafts 2 EOS 5, all kept; bonus 6. Commits [2, EOS].
      row 1, prompt [2, 3]: round 1 drafts 4 5 6, bonus 7; round 2 (catch-up [6, 7]) drafts
               2 EOS 5, all kept; bonus 6. Commits [4 5 6 7] then [2, EOS]; done in round 2.
    """
    changes = {(7, 2): EOS, (2, 1): 5, (1, 5): 6}
    out = _spec(target(changes), target(changes), [[6, 7], [2, 3]], gamma=3, max_decode_len=8)
    _check(out, _tokens(8, [2, EOS], [4, 5, 6, 7, 2, EOS]), [2, 6], alpha=1.0, rounds=2,
           target_calls=[1, 2], draft_calls=[3, 6], drafted=[3, 6], accepted=[3, 6],
           tested=[3, 6], accepted_per_position=[3, 3, 3], nonfinite=[False, False])


def test_eos_as_the_bonus_token_and_as_the_correction():
    """The target says EOS after (5, 6); the draft does not know it and says 7 there.

    G = 3, N = 8, one round for both rows.
      row 0, prompt [2, 3]: drafts 4 5 6 (the draft never scores (5, 6)), all kept; the bonus
               after (5, 6) is EOS: [4, 5, 6, EOS].
      row 1, prompt [4, 5]: x_1 = 6 kept; x_2 = 7 after (5, 6), the target says EOS: n = 1,
               correction EOS: [6, EOS].
    """
    t, d = target({(5, 6): EOS}), draft({(5, 6): 7})
    inputs = [[2, 3], [4, 5]]
    expected = _tokens(8, [4, 5, 6, EOS], [6, EOS])
    out = _spec(t, d, inputs, gamma=3, max_decode_len=8)
    _check(out, expected, [4, 2], alpha=4 / 5, rounds=1, target_calls=[1, 1],
           draft_calls=[3, 3], drafted=[3, 3], accepted=[3, 1], tested=[3, 2],
           accepted_per_position=[2, 1, 1], nonfinite=[False, False])
    _check(_ar(t, inputs, 8), expected, [4, 2], rounds=4, target_calls=[4, 2])


def test_rows_finish_in_different_rounds():
    """Three rows, each accepting its own n and stopping at its own EOS.

    Target and draft: EOS after (7, 2). The draft's mistake: 7 after (3, 4) (the target: 5).
    Off-script after EOS both say EOS. G = 2, N = 12.
      row 0 [2, 3]: r1 drafts 4 7: n = 1, correction 5         -> 4 5
                    r2 (no lag) reads [5, junk]: 6 after (4, 5); drafts 6 7, kept; bonus 2
                                                                -> 6 7 2
                    r3 catch-up [7, 2]: drafts EOS EOS, kept; bonus EOS -> EOS (done)
      row 1 [4, 5]: r1 drafts 6 7, kept; bonus 2                -> 6 7 2
                    r2 catch-up [7, 2]: drafts EOS EOS; bonus EOS -> EOS (done)
      row 2 [6, 7]: r1 drafts 2 EOS, kept; bonus EOS            -> 2 EOS (done)
    Finished rows are driven along (one batched call serves all) but not counted.
    """
    t, d = target({(7, 2): EOS}), draft({(7, 2): EOS, (3, 4): 7})
    inputs = [[2, 3], [4, 5], [6, 7]]
    expected = _tokens(12, [4, 5, 6, 7, 2, EOS], [6, 7, 2, EOS], [2, EOS])
    out = _spec(t, d, inputs, gamma=2, max_decode_len=12)
    _check(out, expected, [6, 4, 2], alpha=11 / 12, rounds=3, target_calls=[3, 2, 1],
           draft_calls=[6, 4, 2], drafted=[6, 4, 2], accepted=[5, 4, 2], tested=[6, 4, 2],
           accepted_per_position=[6, 5], nonfinite=[False, False, False])
    _check(_ar(t, inputs, 12), expected, [6, 4, 2], rounds=6, target_calls=[6, 4, 2])


# ----------------------------------------------------------------------------------------------
# Non-finite distributions.


def test_a_broken_draft_ends_its_row_drafts_before_the_nan():
    """The draft's distribution after (4, 5) is NaN; the target is fine. A row's drafts end
    before that position (0 drafts when it is the first), the target verifies what was drafted
    and emits the next token from its own distribution, so the output is the target's.

    G = 3, N = 8 (every row runs into N). In each round the batched draft runs all 3 calls as
    long as some row is still drafting, and `draft_calls` counts them for every active row.
      row 0 [2, 3]: r1 drafts 4 5, then (4, 5) is NaN: 2 drafts, kept; bonus 6   -> 4 5 6
                    r2 no lag (n = 2 = the draft steps run after the first): reads [6, junk];
                       drafts 7 2 3, kept; bonus 4                               -> 7 2 3 4
                    r3 catch-up [3, 4]: drafts 5 (then NaN), kept; bonus 6; N cuts -> 5
      row 1 [5, 6]: r1 drafts 7 2 3, kept; bonus 4                               -> 7 2 3 4
                    r2 catch-up [3, 4]: drafts 5 (then NaN), kept; bonus 6       -> 5 6
                    r3 reads [6, junk]: drafts 7 2 3, kept; bonus 4; N cuts      -> 7 2
      row 2 [4, 5]: r1 q_1 is NaN: no drafts; the target's 6                     -> 6
                    r2 drafts 7 2 3, kept; bonus 4                               -> 7 2 3 4
                    r3 drafts 5 (then NaN), kept; bonus 6                        -> 5 6
                    r4 drafts 7 2 3, kept; bonus 4; N cuts                       -> 7
    """
    t, d = target(), draft({(4, 5): NAN})
    inputs = [[2, 3], [5, 6], [4, 5]]
    expected = _tokens(8, [4, 5, 6, 7, 2, 3, 4, 5], [7, 2, 3, 4, 5, 6, 7, 2],
                       [6, 7, 2, 3, 4, 5, 6, 7])
    out = _spec(t, d, inputs, gamma=3, max_decode_len=8)
    _check(out, expected, [8, 8, 8], alpha=1.0, rounds=4, target_calls=[3, 3, 4],
           draft_calls=[9, 9, 12], drafted=[6, 7, 7], accepted=[6, 7, 7], tested=[6, 7, 7],
           accepted_per_position=[9, 6, 5], nonfinite=[False, False, False])
    np.testing.assert_array_equal(np.asarray(_ar(t, inputs, 8).tokens), expected)


def _broken_target_case():
    """The target's distribution after (6, 7) is NaN; the draft is the clean cycle. G = 3.
      row 0 [2, 3]: r1 drafts 4 5 6, kept; bonus after (5, 6): 7 -> 4 5 6 7
                    r2 catch-up [6, 7]: p_1 (after (6, 7)) is NaN: nothing is kept or emitted;
                       the row stops, flagged.
      row 1 [3, 4]: r1 drafts 5 6 7, each kept at a finite position; the bonus position
                       (after (6, 7)) is NaN: the row stops, flagged.
    The autoregressive baseline emits 4 5 6 7 and 5 6 7, then stops at the NaN.
    """
    inputs = [[2, 3], [3, 4]]
    t, d = target({(6, 7): NAN}), draft()
    return t, d, inputs, _spec(t, d, inputs, gamma=3, max_decode_len=8), _ar(t, inputs, 8)


def test_a_broken_target_stops_and_flags_the_row():
    _, _, _, spec, ar = _broken_target_case()
    _check(ar, _tokens(8, [4, 5, 6, 7], [5, 6, 7]), [4, 3], rounds=5, target_calls=[5, 4],
           nonfinite=[True, True])
    assert _stats(spec)["nonfinite"] == [True, True]
    assert spec.stats.summary()["nonfinite_rows"] == 2
    with pytest.raises(FloatingPointError, match=r"rows \[0, 1\]"):
        spec.stats.check_finite()
    tokens, lengths = np.asarray(spec.tokens), np.asarray(spec.lengths)
    # Row 0's tokens before the broken round are committed; nothing after them.
    np.testing.assert_array_equal(tokens[0], _tokens(8, [4, 5, 6, 7])[0])
    assert lengths[0] == 4
    # Row 1: whatever it keeps is a prefix of the baseline's text, and nothing past it.
    assert lengths[1] <= 3
    np.testing.assert_array_equal(tokens[1, :lengths[1]], [5, 6, 7][:lengths[1]])
    assert not tokens[1, lengths[1]:].any()
    assert int(spec.stats.rounds) == 2


def test_a_broken_target_keeps_the_drafts_verified_before_the_nan():
    _, _, _, spec, ar = _broken_target_case()
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(ar.tokens))
    assert np.asarray(spec.lengths).tolist() == [4, 3]


# ----------------------------------------------------------------------------------------------
# Token trees.


def test_tree_keeps_the_accepted_path():
    """tree=(2, 1): the root's two children are the draft's top-2 tokens, each with one child
    (its top-1). Nodes: 0 root (last), 1 and 2 (ranks 0 and 1 at the root), 3 under 1, 4
    under 2. The draft ranks 7 first and 4 second after (2, 3), and says 5 (target: 2) after
    (6, 7). Prompt [2, 3], gamma = depth = 2, N = 8.
      r1: root 3; children 7, 4; grandchildren 7 (under 7: off-script, repeat), 5 (under 4).
          The target's 4 after (2, 3) is node 2; its 5 after (3, 4) is node 4; bonus after
          (4, 5): 6. Path [0, 2, 4]: keep_path moves slots T, T+2, T+4 to T, T+1, T+2.
          -> 4 5 6 (n = 2; the draft's kept row is the second path's: it lags one token)
      r2: catch-up [5, 6]: children 7, 6; grandchildren 5 (under 7), 6 (off-script).
          Node 1 (7) kept; under it 5, the target says 2: correction 2.  -> 7 2 (n = 1)
      r3: reads [2, junk]; after (7, 2) children 3, 2; grandchildren 7 (after (2, 3)), 2.
          Node 1 (3) kept; under it 7, the target says 4: correction 4.  -> 3 4 (n = 1)
      r4: after (3, 4) children 5, 4; grandchildren 6 (after (4, 5)), 4. Nodes 1 and 3 kept;
          bonus 7; 7 tokens so far, N = 8 keeps 5.                      -> 5 (n = 2)
    Had keep_path not moved node 2's and node 4's entries, the target would read 6 after 4
    in round 2 (off-script: EOS).
    """
    t, d = target(), draft({(2, 3): (7, 4), (6, 7): (5, 2)})
    out = _spec(t, d, [[2, 3]], gamma=2, max_decode_len=8, tree=(2, 1))
    _check(out, _tokens(8, [4, 5, 6, 7, 2, 3, 4, 5]), [8], alpha=6 / 8, rounds=4,
           target_calls=[4], draft_calls=[8], drafted=[8], accepted=[6], tested=[8],
           accepted_per_position=[4, 2], nonfinite=[False])


# ----------------------------------------------------------------------------------------------
# Temperature 1 with a draft equal to the target: every draft is accepted.


@pytest.mark.parametrize("tree", [None, (2, 1)], ids=["chain", "tree"])
def test_temperature_one_with_the_target_as_draft_accepts_everything(tree):
    """Point masses everywhere (logit 0, -inf elsewhere) except after (3, 4), where 5 and 6
    have probability 1/2 each; (4, 6) -> 7 continues the second branch. With q = p every test
    u < min(1, p / q) = 1 passes (in a tree the first child always is kept), so the counters
    are fixed while the tokens are one of the four texts the two coin flips allow.
    Prompt [2, 3] on three rows, N = 8. Chain, G = 3: two rounds of 3 drafts + bonus. Tree
    (2, 1), depth 2: three rounds of 2 kept depths + bonus (3 + 3 + 2 tokens)."""
    rules = {(a, _succ(a)): {_succ(_succ(a)): 0.0} for a in CYCLE}
    rules.update({(3, 4): {5: 0.0, 6: 0.0}, (4, 6): {7: 0.0}})
    model = _model(rules, lambda prev, cur: {EOS: 0.0})
    gamma = 3 if tree is None else 2
    out = _spec(model, model, [[2, 3]] * 3, gamma=gamma, max_decode_len=8,
                sampling=SamplingConfig(temperature=1.0), rng=jax.random.PRNGKey(7), tree=tree)
    texts = {(4, 5, 6, 7, 2, 3, 4, 5), (4, 5, 6, 7, 2, 3, 4, 6), (4, 6, 7, 2, 3, 4, 5, 6),
             (4, 6, 7, 2, 3, 4, 6, 7)}
    assert {tuple(row) for row in np.asarray(out.tokens).tolist()} <= texts
    assert np.asarray(out.lengths).tolist() == [8, 8, 8]
    rounds = 2 if tree is None else 3
    per_row = rounds * gamma
    assert _stats(out) == dict(
        rounds=rounds, target_calls=[rounds] * 3, draft_calls=[per_row] * 3,
        drafted=[per_row] * 3, accepted=[per_row] * 3, tested=[per_row] * 3,
        nonfinite=[False] * 3, accepted_per_position=[3 * rounds] * gamma)
    assert out.stats.alpha == pytest.approx(1.0, abs=1e-6)


# ----------------------------------------------------------------------------------------------
# Negative controls: the scripted models notice a loop that mishandles their caches.


@struct.dataclass
class NoRewind(ScriptedModel):
    """Ignores `rewind`: its cache keeps rejected tokens."""

    def rewind(self, state, lengths):
        return state


@struct.dataclass
class NoKeepPath(ScriptedModel):
    """Leaves a verified tree where it was: the kept path is not made contiguous."""

    def keep_path(self, state, starts, offsets):
        return state


def _as(cls, model):
    return cls(params=model.params)


@pytest.mark.parametrize("fault", ["target_rewind", "draft_rewind", "keep_path"])
def test_negative_control_a_cache_fault_changes_the_result(fault):
    """The cases above with one model's cache handling broken: the pinned answer changes (a
    target that keeps rejected tokens reads a wrong `prev` and says EOS; a draft that does
    proposes off-script tokens that are rejected, so the counters change)."""
    if fault == "keep_path":
        t, d = target(), draft({(2, 3): (7, 4), (6, 7): (5, 2)})
        good = _spec(t, d, [[2, 3]], gamma=2, max_decode_len=8, tree=(2, 1))
        bad = _spec(_as(NoKeepPath, t), d, [[2, 3]], gamma=2, max_decode_len=8, tree=(2, 1))
    else:
        t, d = target(), draft({(5, 6): 3})
        if fault == "target_rewind":
            t_bad, d_bad = _as(NoRewind, t), d
        else:
            t_bad, d_bad = t, _as(NoRewind, d)
        good = _spec(t, d, [[2, 3]], gamma=3, max_decode_len=12)
        bad = _spec(t_bad, d_bad, [[2, 3]], gamma=3, max_decode_len=12)
    changed = (not np.array_equal(np.asarray(good.tokens), np.asarray(bad.tokens))
               or _stats(good) != _stats(bad))
    assert changed
    if fault != "draft_rewind":  # the target decides the tokens: they change
        assert EOS in np.asarray(bad.tokens).tolist()[0]


def test_a_subclass_never_runs_its_parents_program():
    """jax compares the tree structures of two flax struct classes with the same fields as equal
    (their hashes differ), so a jit cache could hand `NoRewind` the program traced for
    `ScriptedModel`: the draft_rewind control above then failed now and then, as the cache's
    contents allowed. The loops key their programs on the classes as well."""
    t = target()
    assert contract.class_key(t) != contract.class_key(_as(NoRewind, t))
    assert contract.class_key(t, t) != contract.class_key(t, _as(NoRewind, t))
    assert contract.class_key(t) == contract.class_key(target({(2, 3): 4}))  # one class
