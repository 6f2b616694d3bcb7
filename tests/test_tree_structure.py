"""Tree structure: validation, child maps, ancestor visibility, chain policy."""

import pytest
import torch

from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.tree import Tree, chain_tree


def test_visibility_is_ancestor_only():
    # root -> 1 (a) -> 3 (c);  root -> 2 (b)
    tree = Tree(tokens=(10, 11, 12), parents=(0, 0, 1), depths=(1, 1, 2))
    vis = tree.visibility()
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(vis, expected)
    assert tree.children == ({10: 1, 11: 2}, {12: 3}, {}, {})
    assert tree.path_to(3) == [1, 3]
    assert tree.depth_positions().tolist() == [0, 1, 1, 2]


def test_invalid_trees_are_refused():
    with pytest.raises(ValueError, match="earlier node"):
        Tree(tokens=(1, 2), parents=(0, 2), depths=(1, 2))
    with pytest.raises(ValueError, match="depth"):
        Tree(tokens=(1, 2), parents=(0, 1), depths=(1, 3))
    with pytest.raises(ValueError, match="duplicates a sibling"):
        Tree(tokens=(1, 1), parents=(0, 0), depths=(1, 1)).children


def test_chain_takes_top1_per_depth():
    proposal = DraftProposal(tokens=torch.tensor([[5, 6], [7, 8], [9, 1]]),
                             logprobs=torch.log(torch.tensor([[0.6, 0.4], [0.9, 0.1], [0.5, 0.5]])))
    tree = chain_tree(proposal)
    assert tree.tokens == (5, 7, 9) and tree.parents == (0, 1, 2) and tree.depths == (1, 2, 3)
    assert chain_tree(proposal, max_nodes=2).tokens == (5, 7)
    assert chain_tree(DraftProposal.empty()).n_nodes == 0
