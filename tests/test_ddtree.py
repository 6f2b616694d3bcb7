"""DDTree: the N best prefixes of per-depth marginals, checked against brute-force enumeration."""

import itertools
import math

import numpy as np
import pytest
import torch

from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.tree import (Tree, build_tree, chain_tree, ddtree_tree, expected_accepted,
                                       node_logprobs)


def random_proposal(rng: np.random.Generator, depth: int, k: int, vocab: int, *, ties: bool, pad: bool):
    tokens = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(depth)])
    if ties:  # few distinct values -> many equal scores
        probs = rng.choice([0.5, 0.25, 0.125], size=(depth, k))
    else:
        probs = rng.dirichlet(np.ones(k + 1), size=depth)[:, :k]
    logprobs = np.log(probs)
    logprobs = -np.sort(-logprobs, axis=1)  # best first
    if pad:  # -inf pads unused slots at the end of some rows
        for row in range(depth):
            n_used = rng.integers(1, k + 1)
            logprobs[row, n_used:] = -np.inf
    return DraftProposal(tokens=torch.tensor(tokens, dtype=torch.long),
                         logprobs=torch.tensor(logprobs, dtype=torch.float32))


def brute_force_scores(proposal: DraftProposal, max_depth: int) -> dict[tuple[int, ...], float]:
    """Every prefix (token path) of depth 1..max_depth with its float64 score, by enumeration."""
    toks = proposal.tokens.tolist()
    lps = proposal.logprobs.double().tolist()
    scores = {}
    for depth in range(1, max_depth + 1):
        for ranks in itertools.product(*(range(len(toks[d])) for d in range(depth))):
            score = sum(lps[d][r] for d, r in enumerate(ranks))
            if score != -math.inf:
                scores[tuple(toks[d][r] for d, r in enumerate(ranks))] = score
    return scores


def tree_paths(tree: Tree) -> list[tuple[int, ...]]:
    return [tuple(tree.tokens[j - 1] for j in tree.path_to(i)) for i in range(1, tree.n_nodes + 1)]


@pytest.mark.parametrize("seed", range(40))
def test_ddtree_equals_brute_force_top_n(seed):
    rng = np.random.default_rng(seed)
    depth, k = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    proposal = random_proposal(rng, depth, k, vocab=12, ties=seed % 3 == 0, pad=seed % 4 == 1)
    max_depth = None if seed % 2 else int(rng.integers(1, depth + 1))
    budget = int(rng.integers(0, 30))
    tree = ddtree_tree(proposal, budget, max_depth=max_depth)

    all_prefixes = brute_force_scores(proposal, depth if max_depth is None else max_depth)
    best = sorted(all_prefixes.values(), reverse=True)[:budget]
    paths = tree_paths(tree)
    assert tree.n_nodes == len(best) == min(budget, len(all_prefixes))
    assert len(set(paths)) == len(paths)  # distinct prefixes
    assert all(path in all_prefixes for path in paths)
    got = sorted((all_prefixes[path] for path in paths), reverse=True)
    np.testing.assert_allclose(got, best, rtol=0, atol=1e-9)  # same score multiset (ties allowed)
    # ancestor-closed: every proper prefix of a node is a node; parents come first
    path_set = set(paths)
    assert all(path[:-1] in path_set for path in paths if len(path) > 1)
    assert all(parent < i for i, parent in enumerate(tree.parents, start=1))
    if max_depth is not None:
        assert tree.max_depth <= max_depth
    # emitted best first
    emitted = [all_prefixes[path] for path in paths]
    assert all(a >= b - 1e-9 for a, b in zip(emitted, emitted[1:]))
    # node_logprobs agrees with the enumeration
    np.testing.assert_allclose(node_logprobs(proposal, tree), emitted, atol=1e-5)


def test_ddtree_hand_example():
    # depth 1: a=0.6, b=0.4 ; depth 2: c=0.9, d=0.1
    proposal = DraftProposal(tokens=torch.tensor([[1, 2], [3, 4]]),
                             logprobs=torch.log(torch.tensor([[0.6, 0.4], [0.9, 0.1]])))
    tree = ddtree_tree(proposal, 3)
    # scores: a .6, ac .54, b .4, bc .36, ad .06 -> top 3 = a, ac, b
    assert tree_paths(tree) == [(1,), (1, 3), (2,)]
    assert expected_accepted(proposal, tree) == pytest.approx(0.6 + 0.54 + 0.4, abs=1e-6)
    assert tree_paths(ddtree_tree(proposal, 10)) == [(1,), (1, 3), (2,), (2, 3), (1, 4), (2, 4)]
    assert tree_paths(ddtree_tree(proposal, 10, topk_cap=1)) == [(1,), (1, 3)]
    assert tree_paths(ddtree_tree(proposal, 10, max_depth=1)) == [(1,), (2,)]


def test_build_tree_dispatch_and_chain_equivalence():
    rng = np.random.default_rng(7)
    proposal = random_proposal(rng, 5, 3, vocab=20, ties=False, pad=False)
    assert build_tree(proposal, "chain", None) == chain_tree(proposal)
    assert build_tree(proposal, "chain", 2) == chain_tree(proposal, max_nodes=2)
    # ddtree with one candidate per depth is the chain
    assert ddtree_tree(proposal, 5, topk_cap=1) == chain_tree(proposal)
    assert build_tree(proposal, "ddtree", 7) == ddtree_tree(proposal, 7)
    assert build_tree(proposal, "ddtree", None).n_nodes == proposal.depth
    for policy in ("chain", "ddtree"):
        assert build_tree(DraftProposal.empty(), policy, 8).n_nodes == 0
    with pytest.raises(ValueError, match="unknown tree policy 'beam'.*chain, ddtree"):
        build_tree(proposal, "beam", 4)


def test_ddtree_refuses_bad_proposals():
    with pytest.raises(ValueError, match="distinct"):
        ddtree_tree(DraftProposal(tokens=torch.tensor([[1, 1]]), logprobs=torch.tensor([[-0.1, -0.2]])), 4)
    with pytest.raises(ValueError, match="<= 0"):
        ddtree_tree(DraftProposal(tokens=torch.tensor([[1, 2]]), logprobs=torch.tensor([[0.5, -0.2]])), 4)
    with pytest.raises(ValueError, match="budget"):
        ddtree_tree(DraftProposal(tokens=torch.tensor([[1]]), logprobs=torch.tensor([[-0.1]])), -1)
