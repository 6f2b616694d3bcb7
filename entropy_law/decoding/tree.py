"""Candidate trees: the structure every tree policy (chain, best-first DDTree) returns and the verifier consumes.

Node 0 is the root (the pending token); draft node ``i`` (1-based) has ``tokens[i-1]``, ``parents[i-1]`` (an
earlier node) and ``depths[i-1]`` (its parent's + 1). The DDTree surrogate treats a proposal's per-depth
marginals as independent: a node's path probability is the product of its tokens'.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import cached_property

import torch

from entropy_law.decoding.interface import DraftProposal


@dataclass(frozen=True)
class Tree:
    tokens: tuple[int, ...]  # draft node tokens, creation order (parents before children)
    parents: tuple[int, ...]  # parent node index (0 = root) of each draft node
    depths: tuple[int, ...]  # depth of each draft node (root has depth 0)

    def __post_init__(self):
        if not (len(self.tokens) == len(self.parents) == len(self.depths)):
            raise ValueError("tokens, parents and depths must have the same length")
        for i, (parent, depth) in enumerate(zip(self.parents, self.depths), start=1):
            if not 0 <= parent < i:
                raise ValueError(f"node {i}: parent {parent} must be an earlier node (0..{i - 1})")
            parent_depth = 0 if parent == 0 else self.depths[parent - 1]
            if depth != parent_depth + 1:
                raise ValueError(f"node {i}: depth {depth} != parent depth {parent_depth} + 1")

    @staticmethod
    def empty() -> "Tree":
        return Tree((), (), ())

    @property
    def n_nodes(self) -> int:  # draft nodes N, root excluded
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    @cached_property
    def children(self) -> tuple[dict[int, int], ...]:
        """For each node index 0..N: {token id: child node index}."""
        maps: list[dict[int, int]] = [{} for _ in range(self.n_nodes + 1)]
        for i, (token, parent) in enumerate(zip(self.tokens, self.parents), start=1):
            if token in maps[parent]:
                raise ValueError(f"node {i}: token {token} duplicates a sibling under node {parent}")
            maps[parent][token] = i
        return tuple(maps)

    def depth_positions(self) -> torch.LongTensor:
        """Depth of every node, root first: ``[N + 1]`` (add the root's position for RoPE ids)."""
        return torch.tensor((0,) + self.depths, dtype=torch.long)

    def visibility(self) -> torch.BoolTensor:
        """``[N + 1, N + 1]``: row i sees column j iff j is i or an ancestor of i (root sees itself)."""
        n = self.n_nodes + 1
        vis = torch.zeros((n, n), dtype=torch.bool)
        vis[0, 0] = True
        for i, parent in enumerate(self.parents, start=1):
            vis[i] = vis[parent]
            vis[i, i] = True
        return vis

    def prefix(self, n_nodes: int) -> "Tree":
        """The first ``n_nodes`` draft nodes (ancestor-closed: parents come before children)."""
        if not 0 <= n_nodes <= self.n_nodes:
            raise ValueError(f"prefix of {n_nodes} nodes from a tree of {self.n_nodes}")
        return Tree(self.tokens[:n_nodes], self.parents[:n_nodes], self.depths[:n_nodes])

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root (excluded) down to ``node`` (included)."""
        path = []
        while node != 0:
            path.append(node)
            node = self.parents[node - 1]
        return path[::-1]


def chain_tree(proposal: DraftProposal, max_nodes: int | None = None) -> Tree:
    """Top-1 candidate at every depth, one node per depth (vanilla DFlash chain)."""
    depth = proposal.depth if max_nodes is None else min(proposal.depth, max_nodes)
    tokens = tuple(int(t) for t in proposal.tokens[:depth, 0].tolist())
    return Tree(tokens=tokens, parents=tuple(range(depth)), depths=tuple(range(1, depth + 1)))


TREE_POLICIES = ("chain", "ddtree")


def _ranked_candidates(proposal: DraftProposal, max_per_depth: int) -> tuple[list[list[int]], list[list[float]]]:
    """Per depth: finite candidates, best first, at most ``max_per_depth`` (validated)."""
    if proposal.tokens.shape != proposal.logprobs.shape or proposal.tokens.dim() != 2:
        raise ValueError(f"proposal tokens {tuple(proposal.tokens.shape)} and logprobs "
                         f"{tuple(proposal.logprobs.shape)} must both be [depth, K]")
    tokens_rows = proposal.tokens.tolist()
    logprob_rows = proposal.logprobs.to(torch.float64).tolist()
    tokens_out, logprobs_out = [], []
    for depth, (tok_row, lp_row) in enumerate(zip(tokens_rows, logprob_rows), start=1):
        ranked = sorted(
            ((lp, rank, tok) for rank, (tok, lp) in enumerate(zip(tok_row, lp_row)) if lp != -math.inf),
            key=lambda item: (-item[0], item[1]),
        )[:max_per_depth]
        if any(math.isnan(lp) or lp > 1e-6 for lp, _, _ in ranked):
            raise ValueError(f"depth {depth}: log-probabilities must be <= 0 and not NaN, got {lp_row}")
        toks = [tok for _, _, tok in ranked]
        if len(set(toks)) != len(toks):
            raise ValueError(f"depth {depth}: candidate tokens must be distinct, got {toks}")
        tokens_out.append(toks)
        logprobs_out.append([lp for lp, _, _ in ranked])
    return tokens_out, logprobs_out


def ddtree_tree(proposal: DraftProposal, budget: int, *, max_depth: int | None = None, topk_cap: int = 32) -> Tree:
    """DDTree: the ``budget`` most probable prefixes of the per-depth marginals, best first (a max-heap pushes
    each popped prefix's next sibling and first child: non-increasing score, ancestor-closed, ties by creation
    order). At most ``min(topk_cap, budget)`` candidates per depth; depth capped at ``max_depth``."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0 draft nodes, got {budget}")
    if topk_cap < 1:
        raise ValueError(f"topk_cap must be >= 1, got {topk_cap}")
    if max_depth is not None and max_depth < 0:
        raise ValueError(f"max_depth must be >= 0 or None, got {max_depth}")
    depth_limit = proposal.depth if max_depth is None else min(proposal.depth, max_depth)
    if budget == 0 or depth_limit == 0:
        return Tree.empty()
    cand_tokens, cand_logprobs = _ranked_candidates(proposal, min(topk_cap, budget))
    cand_tokens, cand_logprobs = cand_tokens[:depth_limit], cand_logprobs[:depth_limit]

    tokens, parents, depths = [], [], []
    # heap entries: (-score, sequence number, depth, rank, parent node, parent score)
    heap: list[tuple[float, int, int, int, int, float]] = []
    sequence = 0
    if cand_tokens and cand_tokens[0]:
        heap.append((-cand_logprobs[0][0], sequence, 1, 0, 0, 0.0))
    while heap and len(tokens) < budget:
        neg_score, _, depth, rank, parent, parent_score = heapq.heappop(heap)
        score = -neg_score
        tokens.append(cand_tokens[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        node = len(tokens)
        if rank + 1 < len(cand_tokens[depth - 1]):
            sequence += 1
            sibling_score = parent_score + cand_logprobs[depth - 1][rank + 1]
            heapq.heappush(heap, (-sibling_score, sequence, depth, rank + 1, parent, parent_score))
        if depth < depth_limit and cand_tokens[depth]:
            sequence += 1
            child_score = score + cand_logprobs[depth][0]
            heapq.heappush(heap, (-child_score, sequence, depth + 1, 0, node, score))
    return Tree(tokens=tuple(tokens), parents=tuple(parents), depths=tuple(depths))


def build_tree(proposal: DraftProposal, policy: str, budget: int | None) -> Tree:
    """The candidate tree of one round: ``"chain"`` (top-1 per depth, at most ``budget`` nodes) or ``"ddtree"``
    (``budget`` best prefixes); ``budget=None``: as many nodes as the proposal is deep."""
    if budget is not None and budget < 0:
        raise ValueError(f"budget must be >= 0 draft nodes or None, got {budget}")
    if policy == "chain":
        return chain_tree(proposal, max_nodes=budget)
    if policy == "ddtree":
        return ddtree_tree(proposal, proposal.depth if budget is None else budget)
    raise ValueError(f"unknown tree policy {policy!r}; choose one of {', '.join(TREE_POLICIES)}")


def node_logprobs(proposal: DraftProposal, tree: Tree) -> list[float]:
    """Surrogate path log-probability of every draft node (a token absent from its depth's candidates: -inf)."""
    lookup = [dict(zip(toks, lps)) for toks, lps in zip(proposal.tokens.tolist(),
                                                         proposal.logprobs.to(torch.float64).tolist())]
    scores: list[float] = []
    for token, parent, depth in zip(tree.tokens, tree.parents, tree.depths):
        own = lookup[depth - 1].get(token, -math.inf) if depth <= len(lookup) else -math.inf
        scores.append((0.0 if parent == 0 else scores[parent - 1]) + own)
    return scores


def expected_accepted(proposal: DraftProposal, tree: Tree) -> float:
    """Expected accepted drafts under the proposal's surrogate: the sum of the nodes' path probabilities."""
    return float(sum(math.exp(score) for score in node_logprobs(proposal, tree)))
