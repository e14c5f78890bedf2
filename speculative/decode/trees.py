"""Token trees: many continuations drafted per round and verified in one target forward.

`speculative_decode(..., tree=(b_1, ..., b_d))` drafts a tree instead of a chain: every node at
depth i - 1 gets b_i children, at temperature 0 the draft's top-b_i tokens, at T > 0 b_i tokens
drawn from the draft's q **without replacement**. The target scores all nodes in one forward
(each node attends to the committed prefix and its ancestors, at the position its depth gives);
the accepted path is then moved into contiguous cache slots, so the cache contract is unchanged.

Layout (`Tree`): node 0 is the root (the last committed token, fed to the target as in a chain);
nodes are numbered level by level, and within a level in the order of their parents, so node
(level i, index k) has parent (i - 1, k // b_i) and is child k % b_i of it. A leaf is one of the
`M = b_1 * ... * b_d` root-to-leaf paths.

Verification walks down from the root (`greedy_walk`, `exact_walk`). At each node it tries the
children in their drawn order; the first one accepted becomes the next node, and the walk stops
at a node none of whose children is accepted, emitting a token from what is left of the target's
distribution there (or, at a leaf, from the target's distribution: the bonus token).

Exactness at T > 0 (recursive rejection sampling with sampling without replacement; SpecInfer,
Jeon et al. 2024, Sequoia). At a node let p be the target's distribution and x_1, x_2, ... the
children, drawn without replacement from the draft's q: x_j is drawn from q_j, which is q with
x_1..x_{j-1} removed and renormalised. Start with r_1 = p. Child j is accepted with probability
min(1, r_j(x_j) / q_j(x_j)); if it is rejected, r_{j+1} = norm(max(r_j - q_j, 0)). When every
child is rejected the token is drawn from the last r. Claim: the emitted token has law p.
Proof, backwards over j: given x_1..x_j and a rejection at j, the rest of the procedure is
speculative sampling of r_{j+1} with a proposal x_{j+1} ~ q_{j+1} drawn independently of that
rejection, so (induction) it emits a token with law r_{j+1}; with the stage-j test this is
exactly Leviathan et al.'s Theorem 3.5 setting - draw x ~ q_j, keep it with probability
min(1, r_j/q_j), else draw from norm(max(r_j - q_j, 0)) - whose output has law r_j. At j = 1
the law is r_1 = p. The children of the accepted token were drawn from the draft given the
prefix and that token only, independently of the tests at its parent, so the same argument
applies at the next depth: every emitted token has the target's law given the tokens before it.
A child drawn after q's support is used up (q_j(x_j) = 0: top-k sampling with k < b) is never
accepted and changes nothing (max(r - 0, 0) = r). Non-finite numbers are never accepted: a child
under a NaN/inf draft distribution is invalid, and a node whose target distribution is
non-finite accepts nothing (the loop stops the row there, as for chains).

At temperature 0 the child equal to the target's argmax is taken (children are distinct, so at
most one matches): the output is the target's greedy output.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative.decode import kernel as sampling_lib

Array = jax.Array

MAX_NODES = 512  # a verify forward over more nodes than this is never worth its cost


@dataclasses.dataclass(frozen=True)
class Tree:
    """The static shape of a token tree (hashable: a static argument of the jitted loop)."""

    branching: Tuple[int, ...]

    def __post_init__(self):
        branching = self.branching
        if isinstance(branching, (int, np.integer)) or not isinstance(branching, Sequence) or \
                not branching or any(isinstance(b, bool) or not isinstance(b, (int, np.integer))
                                     or b < 1 for b in branching):
            raise ValueError(f"tree={branching!r} is invalid: a tuple of positive ints "
                             "(b_1, ..., b_d), the children of each node at each depth, e.g. "
                             "(2, 2) or (3, 1, 1); None drafts a chain.")
        object.__setattr__(self, "branching", tuple(int(b) for b in branching))
        if self.num_nodes - 1 > MAX_NODES:
            raise ValueError(f"tree={self.branching} has {self.num_nodes - 1} nodes; at most "
                             f"{MAX_NODES} are verified per forward. Use fewer children per "
                             "depth (theory.best_tree picks a shape for a cost curve).")

    @property
    def depth(self) -> int:
        return len(self.branching)

    @property
    def level_sizes(self) -> Tuple[int, ...]:
        """Nodes at each level 0..d (level 0 is the root)."""
        return tuple(int(np.prod(self.branching[:i])) for i in range(self.depth + 1))

    @property
    def offsets(self) -> Tuple[int, ...]:
        """Index of each level's first node (level d + 1's is the node count)."""
        return tuple(int(x) for x in np.cumsum((0,) + self.level_sizes))

    @property
    def num_nodes(self) -> int:
        """Nodes including the root: the target's verify width."""
        return self.offsets[-1]

    @property
    def num_leaves(self) -> int:
        return self.level_sizes[-1]

    def leaves_under(self, level: int) -> int:
        """Leaves below one node of `level` (b_{level+1} * ... * b_d)."""
        return int(np.prod(self.branching[level:]))

    @property
    def is_chain(self) -> bool:
        return all(b == 1 for b in self.branching)

    def attention(self) -> Tuple[np.ndarray, np.ndarray]:
        """`(depths [K], visible [K, K])`: each node's depth and the nodes it attends to (itself
        and its ancestors), what the target's `extend_tree` takes."""
        depths, parents = [0], [-1]
        for level in range(1, self.depth + 1):
            b = self.branching[level - 1]
            for k in range(self.level_sizes[level]):
                depths.append(level)
                parents.append(self.offsets[level - 1] + k // b)
        visible = np.zeros((self.num_nodes, self.num_nodes), bool)
        for node in range(self.num_nodes):
            up = node
            while up >= 0:
                visible[node, up] = True
                up = parents[up]
        return np.asarray(depths, np.int32), visible


def as_tree(tree, gamma=None) -> Tree:
    """`tree` (a branching tuple or a `Tree`) as a `Tree`; refuses a `gamma` that disagrees."""
    tree = tree if isinstance(tree, Tree) else Tree(tree)
    if gamma is not None and gamma != tree.depth:
        raise ValueError(f"gamma={gamma} disagrees with tree={tree.branching}: a tree's gamma is "
                         f"its depth, {tree.depth}. Pass gamma={tree.depth}.")
    return tree


# ----------------------------------------------------------------------------------------------
# Drafting children.


def greedy_children(logits: Array, num: int) -> Tuple[Array, Array]:
    """The draft's top-`num` tokens `[..., num]` (distinct) and their validity (finite rows)."""
    _, tokens = jax.lax.top_k(jnp.asarray(logits, jnp.float32), num)
    ok = sampling_lib.finite_rows(logits)[..., None]
    return tokens.astype(jnp.int32), jnp.broadcast_to(ok, tokens.shape)


def sampled_children(q: Array, num: int, rng: Array) -> Tuple[Array, Array]:
    """`num` tokens drawn without replacement from `q [..., V]` (Gumbel top-k: the j-th has
    the law of q renormalised over the tokens not drawn before it). A token drawn after q's
    support is used up, or from a non-finite q, is invalid (never accepted)."""
    q = jnp.asarray(q, jnp.float32)
    finite = sampling_lib.finite_rows(q)[..., None]
    safe = jnp.where(finite, q, 0.0)
    scores = jnp.where(safe > 0, jnp.log(jnp.where(safe > 0, safe, 1.0))
                       + jax.random.gumbel(rng, safe.shape), -jnp.inf)
    _, tokens = jax.lax.top_k(scores, num)
    picked = jnp.take_along_axis(safe, tokens, axis=-1)
    return tokens.astype(jnp.int32), finite & (picked > 0)


# ----------------------------------------------------------------------------------------------
# Verification walks. Shapes: B batch, K = tree.num_nodes, N = K - 1 drafted nodes, V vocab.


@dataclasses.dataclass
class _Walk:
    """The walk's per-row state: where it stands and what it has kept."""

    index: Array  # [B] index within the current level
    alive: Array  # [B] bool: every node so far was accepted
    accepted: Array  # [B] int32 nodes accepted (n)
    path: Array  # [B, d] node ids of the accepted path (0 past n)
    leaf: Array  # [B] first leaf below the last accepted node
    stop: Array  # [B] node the walk ended at (its distribution emits the next token)
    token: Array  # [B] the emitted token


def _start(tree: Tree, batch: int) -> _Walk:
    zeros = jnp.zeros((batch,), jnp.int32)
    return _Walk(index=zeros, alive=jnp.ones((batch,), bool), accepted=zeros,
                 path=jnp.zeros((batch, tree.depth), jnp.int32), leaf=zeros, stop=zeros,
                 token=zeros)


def _children(tree: Tree, level: int, w: _Walk, node_tokens: Array, valid: Array):
    """Node ids `[B, b]`, tokens and validity of the current node's children."""
    b = tree.branching[level]
    ids = tree.offsets[level + 1] + w.index[:, None] * b + jnp.arange(b)[None]
    tokens = jnp.take_along_axis(node_tokens, ids - 1, axis=1)
    return ids, tokens, jnp.take_along_axis(valid, ids - 1, axis=1)


def _step(tree: Tree, level: int, w: _Walk, accept: Array, child: Array, emit: Array) -> _Walk:
    """One level of the walk: rows with `accept` move to their `child` (rank), the others stop
    here and emit `emit`."""
    b = tree.branching[level]
    node = tree.offsets[level] + w.index
    accept = w.alive & accept
    stops = w.alive & ~accept
    index = jnp.where(accept, w.index * b + child, w.index)
    return _Walk(
        index=index, alive=accept, accepted=w.accepted + accept.astype(jnp.int32),
        path=w.path.at[:, level].set(jnp.where(accept, tree.offsets[level + 1] + index, 0)),
        leaf=jnp.where(accept, index * tree.leaves_under(level + 1), w.leaf),
        stop=jnp.where(stops, node, w.stop), token=jnp.where(stops, emit, w.token))


def _node(values: Array, ids: Array) -> Array:
    """`values [B, K, ...]` at node `ids [B]` -> `[B, ...]`."""
    return jnp.take_along_axis(values, ids.reshape(ids.shape + (1,) * (values.ndim - 1)),
                               axis=1)[:, 0]


def greedy_walk(tree: Tree, logits: Array, node_tokens: Array, valid: Array) -> _Walk:
    """Temperature 0: at each node the child equal to the target's argmax is kept."""
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [B, K]
    finite = sampling_lib.finite_rows(logits)  # [B, K]
    w = _start(tree, logits.shape[0])
    for level in range(tree.depth):
        node = tree.offsets[level] + w.index
        a, ok = _node(best, node), _node(finite, node)
        _, tokens, kid_ok = _children(tree, level, w, node_tokens, valid)
        match = kid_ok & (tokens == a[:, None]) & ok[:, None]
        w = _step(tree, level, w, jnp.any(match, axis=1),
                  jnp.argmax(match, axis=1).astype(jnp.int32), a)
    leaf = tree.offsets[tree.depth] + w.index
    return dataclasses.replace(w, stop=jnp.where(w.alive, leaf, w.stop),
                               token=jnp.where(w.alive, _node(best, leaf), w.token))


def _normalise(weights: Array) -> Array:
    total = jnp.sum(weights, axis=-1, keepdims=True)
    return weights / jnp.where(total > 0, total, 1.0)


def residual_after_rejection(r: Array, q: Array) -> Array:
    """What the next sibling is tested against, and finally drawn from, once a child drawn from
    `q` was rejected under `r`: norm(max(r - q, 0))."""
    return _normalise(sampling_lib.residual_weights(r, q))


def exact_walk(tree: Tree, p: Array, q: Array, node_tokens: Array, valid: Array,
               rng: Array) -> _Walk:
    """T > 0: recursive rejection sampling over each node's children (module docstring).

    `p [B, K, V]` the target's adjusted distributions at every node, `q [B, K - M, V]` the
    draft's at every internal node (the ones the children were drawn from)."""
    b_max = max(tree.branching)
    keys = jax.random.split(rng, tree.depth + 1)
    finite_p = sampling_lib.finite_rows(p)
    w = _start(tree, p.shape[0])
    for level in range(tree.depth):
        node = tree.offsets[level] + w.index
        r, qq = _node(p, node), _node(q, node)
        ok = _node(finite_p, node) & sampling_lib.finite_rows(qq)
        qq = jnp.where(ok[:, None], qq, 0.0)
        _, tokens, kid_ok = _children(tree, level, w, node_tokens, valid)
        test_key, draw_key = jax.random.split(keys[level])
        u = jax.random.uniform(test_key, (p.shape[0], b_max), jnp.float32)
        taken = jnp.zeros_like(w.alive)
        child = jnp.zeros_like(w.index)
        for j in range(tree.branching[level]):
            x = tokens[:, j:j + 1]
            r_x = jnp.take_along_axis(r, x, axis=1)[:, 0]
            q_x = jnp.take_along_axis(qq, x, axis=1)[:, 0]
            tried = ok & kid_ok[:, j] & ~taken
            keep = tried & (u[:, j] < sampling_lib.accept_probability(r_x, q_x))
            child = jnp.where(keep, j, child)
            taken = taken | keep
            rejected = (tried & ~keep)[:, None]
            r = jnp.where(rejected, residual_after_rejection(r, qq), r)
            drawn = jnp.arange(qq.shape[-1])[None] == x
            qq = jnp.where(rejected, _normalise(jnp.where(drawn, 0.0, qq)), qq)
        w = _step(tree, level, w, taken, child, sampling_lib.sample(draw_key, r))
    leaf = tree.offsets[tree.depth] + w.index
    bonus = sampling_lib.sample(keys[-1], _node(p, leaf))
    return dataclasses.replace(w, stop=jnp.where(w.alive, leaf, w.stop),
                               token=jnp.where(w.alive, bonus, w.token))
