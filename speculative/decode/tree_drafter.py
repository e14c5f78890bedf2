"""`TreeDrafter`: a token tree (decode/trees.py) drafted from any chain drafter's model, one
draft call per level (decode/drafters.py documents the drafter protocol)."""

from __future__ import annotations

from typing import Any, Tuple

import jax.numpy as jnp
import numpy as np
from flax import struct

from speculative.decode import rounds, trees
from speculative.decode.capabilities import Capabilities
from speculative.decode.contract import take_rows


@struct.dataclass
class TreeDrafter(Capabilities):
    """A token tree (decode/trees.py) whose nodes' laws come from `base`'s model: after
    `base`'s catch-up call (batch B) the draft state is repeated once per root-to-leaf path
    (B * M rows) and each path is extended as a chain, one call per level; a node's children
    are drawn from the draft's distribution on its first path (the verifier's `children`: the
    top-b tokens at temperature 0, b drawn without replacement at T > 0). After verification
    the kept path's rows are the draft's state, and `base`'s catch-up rule applies."""

    base: Any
    tree: trees.Tree = struct.field(pytree_node=False)

    @property
    def layout(self):
        return rounds.TreeLayout(self.tree)

    @property
    def gamma(self) -> int:
        return self.tree.depth

    @property
    def model(self):
        return self.base.model

    @property
    def reads_target(self) -> bool:
        return self.base.reads_target

    @property
    def unrolls(self) -> bool:
        return self.base.unrolls

    @property
    def kind(self) -> str:
        return "tree"

    def candidates(self, gammas, max_decode_len: int):
        """A tree has a fixed shape: itself."""
        del gammas, max_decode_len
        return ((self,),)

    def with_tree(self, tree):
        return self.base.with_tree(tree)

    def view(self, target) -> rounds.TargetView:
        return self.base.view(target)

    def check(self, target) -> None:
        if self.base.confidence or self.base.schedule != "constant":
            raise ValueError(f"tree={self.tree.branching} drafts a fixed shape: its base drafter "
                             "needs confidence=0 and schedule='constant'.")
        self.base.check(target)
        self.layout.require(target)

    def start(self, view, inputs, max_decode_len, target_width):
        return self.base.start(view, inputs, max_decode_len, target_width)

    def catch_up_widths(self) -> Tuple[int, ...]:
        return self.base.catch_up_widths()

    def propose(self, state, last, start, keys, verifier):
        tree = self.tree
        logits, dstate = self.base.catch_up(state, last, start)
        batch, paths = logits.shape[0], tree.num_leaves
        tokens, valid, q = verifier.children(logits, tree.branching[0], keys[0])
        levels, valids, qs = [tokens], [valid], [q[:, None]]
        dstate = take_rows(dstate, jnp.repeat(jnp.arange(batch), paths))
        for level in range(1, tree.depth):
            under = tree.leaves_under(level)
            feed = levels[-1][:, np.arange(paths) // under]  # each path's node at this level
            step_logits, dstate = self.base.step(dstate, feed.reshape(batch * paths))
            step_logits = step_logits.reshape(batch, paths, -1)[
                :, np.arange(tree.level_sizes[level]) * under]  # [B, nodes at this level, V]
            tokens, valid, q = verifier.children(step_logits, tree.branching[level], keys[level])
            valid = valid & valids[-1][:, :, None]  # below an invalid node nothing is valid
            levels.append(tokens.reshape(batch, -1))
            valids.append(valid.reshape(batch, -1))
            qs.append(q)
        proposal = rounds.Proposal(
            tokens=jnp.concatenate(levels, 1), q=jnp.concatenate(qs, 1),
            valid=jnp.concatenate(valids, 1),
            num_drafted=jnp.full((batch,), tree.depth, jnp.int32),
            draft_calls=jnp.full((batch,), tree.depth, jnp.int32),
            drafts_read=jnp.asarray(tree.depth - 1, jnp.int32))
        return proposal, state.replace(model=dstate)

    def advance(self, state, outcome, proposal, last, moving):
        """The kept path's draft rows, then `base`'s catch-up rule."""
        batch = outcome.accepted.shape[0]
        rows = jnp.arange(batch) * self.tree.num_leaves + outcome.leaf
        state = state.replace(model=take_rows(state.model, rows))
        return self.base.advance(state, outcome, proposal, last, moving)
