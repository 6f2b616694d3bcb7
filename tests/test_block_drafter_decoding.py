"""The block drafter inside the real decoder: output == greedy (chain, DDTree); replay == online, round by round."""

from __future__ import annotations

import pytest
import torch

from entropy_law.drafters.block import BlockDrafter
from entropy_law.decoding.decoder import SpeculativeDecoder
from entropy_law.decoding.replay import PrecomputedBlockDrafter
from entropy_law.drafters.training.loop import collate, forward_train
from entropy_law.decoding.features import capture_features
from entropy_law.decoding.gate import RatioGate
from entropy_law.decoding.replay import replay_rounds
from conftest import tiny_llama
from tests.tiny_models import hf_greedy

PROMPTS = ([7, 19, 33, 2, 60, 41, 5], [90, 11, 12, 13, 14], [3, 3, 8, 120, 77, 64, 1, 9, 27])


def _features(model, ids, layers):
    with torch.no_grad(), capture_features(model, layers) as cap:
        model(torch.tensor([ids]))
        return cap.features()[0]


@pytest.fixture(scope="module", params=["full-vocab", "context-vocab", "copy-head"])
def trained(request):
    """A tiny target (6 layers) and a drafter taught its greedy continuations, so drafts get accepted;
    either over the whole vocabulary or over the even ids plus every id already in the context (also with
    the copy head)."""
    model = tiny_llama(seed=5, layers=6, vocab=128)
    if request.param in ("context-vocab", "copy-head"):
        drafter = BlockDrafter(model, seed=0, block_size=5, num_layers=1, draft_vocab=range(0, 128, 2),
                               context_vocab=True, copy_head=request.param == "copy-head")
    else:
        drafter = BlockDrafter(model, seed=0, block_size=5, num_layers=1)
    seqs = [(p, p + hf_greedy(model, p, 40)) for p in PROMPTS]
    samples = [{"input_ids": torch.tensor(s), "features": _features(model, s, drafter.feature_layers)[:-1],
                "prompt_len": len(p)} for p, s in seqs]
    batch = collate(samples)
    opt = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        loss, _ = forward_train(drafter, batch, anchors_per_seq=24, gamma=4.0, generator=gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, drafter.eval()


@pytest.mark.parametrize("tree,budget", [("chain", None), ("ddtree", 8), ("ddtree", 16)])
def test_speculative_output_equals_greedy_and_replay_equals_online(trained, tree, budget):
    model, drafter = trained
    accepted_total = 0
    for prompt in PROMPTS:
        reference = hf_greedy(model, prompt, 30)
        decoder = SpeculativeDecoder(model, drafter, tree=tree, budget=budget,
                                     policy=RatioGate(min_expected_accepted=0.0))
        result = decoder.generate(prompt, max_new_tokens=30)
        assert result.token_ids == reference
        online = [r.accepted for r in result.rounds]
        accepted_total += sum(online)
        # offline: every anchor's marginals from one pass over the greedy sequence and its features
        feats = _features(model, prompt + reference, drafter.feature_layers)
        pre = PrecomputedBlockDrafter(drafter, prompt, reference, feats)
        replay = replay_rounds(prompt, reference, pre, tree, budget, min_expected_accepted=0.0,
                               max_new_tokens=30)
        assert [r.accepted for r in replay.rounds] == online
        assert [r.tree_nodes for r in replay.rounds] == [r.tree_nodes for r in result.rounds]
    assert accepted_total > 10, "the taught drafter should get drafts accepted"


def test_default_gate_and_feature_layers_flow_through_the_decoder(trained):
    model, drafter = trained
    prompt = PROMPTS[0]
    decoder = SpeculativeDecoder(model, drafter, tree="chain")  # default drafting gate
    assert decoder.adapter.feature_layers == drafter.feature_layers
    assert decoder.generate(prompt, max_new_tokens=25).token_ids == hf_greedy(model, prompt, 25)
