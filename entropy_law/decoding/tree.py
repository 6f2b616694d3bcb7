"""Candidate trees: the structure every tree policy returns and the verifier consumes.

Known here: a tree of draft nodes hanging below the root (the pending token), its ancestor
visibility mask and child maps, and the chain policy. Node index 0 is the root; draft node ``i``
(1-based) has ``tokens[i-1]``, ``parents[i-1]`` (an index in ``0..i-1``, so parents come first) and
``depths[i-1]`` (= parent's depth + 1). Not known here: how the target verifies (``adapter``).
Best-first DDTree construction lives beside the chain policy (``build_tree``).
"""

from __future__ import annotations

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
    def n_nodes(self) -> int:
        """Number of draft nodes N (root excluded)."""
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
