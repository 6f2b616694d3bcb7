"""TargetAdapter: tree mask and positions, one-pass verification, KV compaction, errors.

Oracles are independent plain forwards of the Hugging Face model (no cache, no custom mask).
"""

import pytest
import torch

from entropy_law.decoding.adapter import TargetAdapter
from entropy_law.decoding.tree import Tree
from conftest import tiny_llama
from tests.tiny_models import random_prompt, random_tree

VOCAB = 128

pytestmark = pytest.mark.usefixtures("single_thread")


@torch.inference_mode()
def plain_forward(model, ids: list[int], layers=()):
    """Logits of the last position and, per layer, the last position's output hidden state."""
    out = model(torch.tensor([ids]), output_hidden_states=True)
    feats = [out.hidden_states[i + 1][0, -1] for i in layers]  # index 0 = embeddings
    return out.logits[0, -1].float(), (torch.cat(feats) if feats else None)


def test_mask_and_positions_of_a_hand_built_tree():
    model = tiny_llama(0)
    adapter = TargetAdapter(model)
    # root -> 1 -> 3 ; root -> 2
    tree = Tree(tokens=(10, 11, 12), parents=(0, 0, 1), depths=(1, 1, 2))
    assert adapter.tree_position_ids(5, tree).tolist() == [[5, 6, 6, 7]]
    mask = adapter.tree_attention_mask(5, tree)
    assert mask.shape == (1, 1, 4, 9) and mask.dtype == torch.float32
    visible = (mask[0, 0] == 0)
    assert visible[:, :5].all()  # the whole prefix
    expected_tree_part = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(visible[:, 5:], expected_tree_part)
    assert (mask[0, 0][~visible] == torch.finfo(torch.float32).min).all()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_each_tree_node_matches_a_plain_forward_over_its_path(seed):
    generator = torch.Generator().manual_seed(100 + seed)
    model = tiny_llama(seed, layers=3)
    layers = (1, 0)  # not the last layer: HF5 replaces its hidden_states entry by the post-norm state
    adapter = TargetAdapter(model, feature_layers=layers)
    prompt = random_prompt(generator, VOCAB, 5 + 3 * seed)
    _, prompt_feats = adapter.prefill(prompt)
    assert prompt_feats.shape == (len(prompt), 2 * model.config.hidden_size)
    root = int(torch.randint(VOCAB, (1,), generator=generator))
    tree = random_tree(generator, n_nodes=4 + 3 * seed, vocab=VOCAB)
    logits, feats = adapter.verify(root, tree, len(prompt))
    assert logits.shape == (tree.n_nodes + 1, VOCAB) and feats.shape[0] == tree.n_nodes + 1
    for node in range(tree.n_nodes + 1):
        path = [root] + [tree.tokens[i - 1] for i in tree.path_to(node)]
        ref_logits, ref_feats = plain_forward(model, prompt + path, layers)
        torch.testing.assert_close(logits[node], ref_logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(feats[node], ref_feats, atol=1e-4, rtol=0)


def _assert_cache_equal(cache, reference, atol=1e-5):
    assert len(cache.layers) == len(reference.layers)
    for layer, ref in zip(cache.layers, reference.layers):
        assert layer.keys.shape == ref.keys.shape
        torch.testing.assert_close(layer.keys, ref.keys, atol=atol, rtol=0)
        torch.testing.assert_close(layer.values, ref.values, atol=atol, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_commit_equals_a_fresh_prefill(seed):
    generator = torch.Generator().manual_seed(200 + seed)
    model = tiny_llama(seed)
    adapter = TargetAdapter(model)
    prompt = random_prompt(generator, VOCAB, 7)
    adapter.prefill(prompt)
    start = len(prompt)
    committed = list(prompt)
    for round_ in range(3):  # several rounds: compaction must compose
        root = int(torch.randint(VOCAB, (1,), generator=generator))
        tree = random_tree(generator, n_nodes=8, vocab=VOCAB)
        adapter.verify(root, tree, start)
        deepest = max(range(tree.n_nodes + 1), key=lambda n: (len(tree.path_to(n)), -n))
        path_nodes = [0] + tree.path_to(deepest)
        keep = path_nodes[: 1 + round_ % len(path_nodes)] if round_ == 1 else path_nodes
        adapter.commit(start, keep)
        committed += [root] + [tree.tokens[n - 1] for n in keep[1:]]
        start += len(keep)
        assert adapter.cache_len == start == len(committed)
        fresh = TargetAdapter(model)
        fresh.prefill(committed)
        _assert_cache_equal(adapter.cache, fresh.cache)
    # and the next step after compaction gives the same logits as a plain forward
    logits, _ = adapter.verify(5, Tree.empty(), start)
    torch.testing.assert_close(logits[0], plain_forward(model, committed + [5])[0], atol=1e-4, rtol=0)


def test_commit_of_a_chain_prefix_is_a_truncation():
    generator = torch.Generator().manual_seed(7)
    model = tiny_llama(4)
    adapter = TargetAdapter(model)
    prompt = random_prompt(generator, VOCAB, 6)
    adapter.prefill(prompt)
    chain = Tree(tokens=(3, 4, 5, 6), parents=(0, 1, 2, 3), depths=(1, 2, 3, 4))
    adapter.verify(9, chain, len(prompt))
    adapter.commit(len(prompt), [0, 1, 2])
    fresh = TargetAdapter(model)
    fresh.prefill(prompt + [9, 3, 4])
    _assert_cache_equal(adapter.cache, fresh.cache)


def test_bad_calls_get_clear_errors():
    model = tiny_llama(0, max_positions=16)
    adapter = TargetAdapter(model)
    with pytest.raises(ValueError, match="empty prompt"):
        adapter.prefill([])
    with pytest.raises(ValueError, match="context"):
        adapter.prefill(list(range(17)))
    adapter.prefill([1, 2, 3])
    with pytest.raises(RuntimeError, match="commit"):
        adapter.verify(1, Tree.empty(), 2)
    adapter.verify(1, Tree(tokens=(4, 5), parents=(0, 0), depths=(1, 1)), 3)
    with pytest.raises(ValueError, match="root"):
        adapter.commit(3, [1])
    with pytest.raises(ValueError, match="not in the cache"):
        adapter.commit(3, [0, 7])
