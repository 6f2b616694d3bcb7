"""Replay equals online decoding round by round (n-gram drafter; chain and DDTree; gate; EOS; full context).

Also: the teacher-forced target statistics equal the ones recorded online at every output position
(exogeneity: within 1e-4 nats, whichever tree policy ran).
"""

import numpy as np
import pytest
import torch

from entropy_law.decoding.decoder import SpeculativeDecoder
from entropy_law.decoding.gate import CostGate, VerifyCost, make_gate
from entropy_law.drafters.ngram import NgramDrafter
from entropy_law.decoding.observers import distribution_stats
from entropy_law.decoding.replay import replay_rounds, teacher_forced_target_stats
from conftest import tiny_llama
from tests.tiny_models import ListObserver, random_prompt

ROUND_FIELDS = ("round_index", "start_position", "context_len", "tree_nodes", "tree_depth", "accepted",
                "ends_at_leaf")


# a steep verify-cost curve, so that the cost gate often verifies a strict prefix of the drafted tree
STEEP = VerifyCost((1, 2, 4, 8), (1.0, 1.15, 1.5, 2.4))

# (seed, init_std, tree, budget, min_expected_accepted, eos: position of the output token used as EOS,
#  max_positions, verify_cost)
CASES = [
    (0, 0.02, "chain", None, None, None, 512, None),
    (1, 0.05, "ddtree", 6, None, None, 512, None),
    (2, 0.1, "ddtree", 4, None, None, 512, None),
    (3, 0.02, "chain", 3, 0.0, 20, 512, None),  # always verify; stop at an EOS inside the output
    (4, 0.05, "ddtree", 8, 0.0, None, 40, None),  # the context fills before the token budget
    (5, 0.1, "chain", None, None, 30, 512, None),
    (6, 0.05, "chain", None, None, None, 512, STEEP),  # cost gate: best prefix of the chain
    (7, 0.05, "ddtree", 8, None, 25, 512, STEEP),  # cost gate: best prefix of the DDTree; EOS
]


@pytest.mark.parametrize("case", CASES, ids=[f"seed{c[0]}-{c[2]}" for c in CASES])
def test_replay_equals_online_rounds(case):
    seed, std, policy, budget, gate, eos_position, max_positions, cost = case
    vocab, max_new = 48, 50
    model = tiny_llama(seed, vocab=vocab, init_std=std, max_positions=max_positions)
    prompt = random_prompt(torch.Generator().manual_seed(100 + seed), vocab, 12)
    eos_ids = None
    if eos_position is not None:  # pick an output token as EOS: decoding must stop at its first occurrence
        plain = SpeculativeDecoder(model, None, eos_token_ids=[]).generate(prompt, max_new_tokens=max_new)
        eos_ids = [plain.token_ids[eos_position]]
    make_drafter = lambda: NgramDrafter(max_ngram=3, block_size=5, max_matches=3)  # noqa: E731
    observer = ListObserver()
    decoder = SpeculativeDecoder(model, make_drafter(), tree=policy, budget=budget, observers=[observer],
                                 eos_token_ids=eos_ids if eos_ids else [],
                                 policy=make_gate(min_expected_accepted=gate, verify_cost=cost))
    online = decoder.generate(prompt, max_new_tokens=max_new)
    replayed = replay_rounds(prompt, online.token_ids, make_drafter(), policy, budget, max_new_tokens=max_new,
                             eos_token_ids=eos_ids, max_context=max_positions, min_expected_accepted=gate,
                             verify_cost=cost)
    assert replayed.stop_reason == online.stop_reason
    if eos_ids:
        assert online.stop_reason == "eos"
    if max_positions == 40:
        assert online.stop_reason == "context_full"
    assert len(replayed.rounds) == len(observer.records) == len(online.rounds)
    for offline, record, stats in zip(replayed.rounds, observer.records, online.rounds):
        assert {f: getattr(offline, f) for f in ROUND_FIELDS} == {f: getattr(record, f) for f in ROUND_FIELDS}
        assert list(offline.committed_ids) == record.committed_ids
        assert offline.drafted == stats.drafted
        assert offline.expected_accepted == pytest.approx(stats.expected_accepted, rel=1e-6, abs=1e-9)
        # the logged draft goes exactly as deep as the verified tree
        assert (0 if record.draft is None else record.draft.depth) == record.tree_depth
    assert replayed.accepted_lengths == [r.accepted for r in online.rounds[1:]]

    # exogeneity: teacher-forced statistics equal the online ones at every output position
    online_rows = torch.cat([r.target_logits for r in observer.records])
    online_stats = distribution_stats(online_rows)
    frame = teacher_forced_target_stats(model, prompt, online.token_ids)
    assert frame["is_greedy"].all()
    for key, values in online_stats.items():
        np.testing.assert_allclose(frame[f"target_{key}"].to_numpy(), values.numpy(), atol=1e-4, rtol=0)


def test_cases_exercise_drafting():
    """Guard against a vacuous equality test: the tiny targets must accept drafts under these settings."""
    seed, std = 1, 0.05
    model = tiny_llama(seed, vocab=48, init_std=std)
    prompt = random_prompt(torch.Generator().manual_seed(100 + seed), 48, 12)
    result = SpeculativeDecoder(model, NgramDrafter(max_ngram=3, block_size=5, max_matches=3), tree="ddtree",
                                budget=6).generate(prompt, max_new_tokens=50)
    assert sum(r.accepted for r in result.rounds) >= 10


def test_cost_gate_cases_verify_strict_prefixes():
    """Guard for the cost-gate cases: they must verify strict prefixes of longer proposals, and draft."""
    seed, std = 6, 0.05
    model = tiny_llama(seed, vocab=48, init_std=std)
    prompt = random_prompt(torch.Generator().manual_seed(100 + seed), 48, 12)
    observer = ListObserver()
    drafter = NgramDrafter(max_ngram=3, block_size=5, max_matches=3)  # as in the cases above
    proposed_depths = []
    original = drafter.propose
    drafter.propose = lambda tokens, features=None: proposed_depths.append(p := original(tokens, features)) or p
    SpeculativeDecoder(model, drafter, observers=[observer], policy=CostGate(STEEP)).generate(prompt, max_new_tokens=50)
    drafted = [r for r in observer.records if r.draft is not None]
    assert drafted, "the cost gate never drafted"
    shorter = sum(1 for r, p in zip(observer.records[1:], proposed_depths) if 0 < r.tree_depth < p.depth)
    assert shorter >= 1
