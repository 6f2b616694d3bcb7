"""The field's draft-length controllers (decoding/controllers.py): each one's decisions on a hand-made trace, known in
advance; each one replayed equals the same controller decoding online, round by round (tiny random Llama targets)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import tiny_llama
from entropy_law.decoding.controllers import (AcceptLengthEMA, ConfidenceThreshold, DrafterEntropyStop, EntropyGate,
                                              LawStopProbability, WorkloadLength, depth_cut, profile_length,
                                              roc_threshold)
from entropy_law.decoding.decoder import SpeculativeDecoder
from entropy_law.decoding.gate import VerifyCost
from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.replay import PrecomputedBlockDrafter, replay_rounds, teacher_forced_target_stats
from entropy_law.decoding.tree import build_tree
from entropy_law.drafters.ngram import NgramDrafter
from tests.tiny_models import random_prompt

COST = VerifyCost((1, 2, 4, 8, 16, 32), (1.0, 1.3, 1.6, 2.2, 3.4, 6.0))


def chain(probs, logits=None) -> DraftProposal:
    """A chain proposal of tokens 10, 11, ... with these drafter probabilities."""
    n = len(probs)
    return DraftProposal(tokens=torch.arange(10, 10 + n).reshape(n, 1),
                         logprobs=torch.tensor(probs, dtype=torch.float32).log().reshape(n, 1), logits=logits)


def verified(policy, proposal, decision):
    tree, _ = policy.plan(proposal, build_tree(proposal, "chain", None), decision)
    return tree.max_depth


def past(decision, *, accepted=0, nodes=1):
    """A round of the history: its outcome and the decision it was made by."""
    return SimpleNamespace(policy=decision, accepted=accepted, tree_nodes=nodes)


def law_params(acceptance=0.9, weight=0.0, depths=8):
    grid = [0.001, 0.01, 0.1, 1.0, 4.0]
    return {"kind": "entropy_law_policy", "version": 1, "window": 3, "entropy_grid": grid,
            "depths": list(range(1, depths + 1)), "acceptance": [[acceptance] * depths for _ in grid],
            "confidence_weight": weight, "draft_cost": 0.0, "default_entropy": 0.5, "verify_cost": COST.to_config()}


# --- hand-made traces ------------------------------------------------------------------------------------------------

def test_confidence_threshold_stops_at_the_first_unsure_draft_and_refits_from_outcomes():
    policy = ConfidenceThreshold()
    policy.begin_request(None)
    first = policy.before_draft([], 1, 10, [past(None, nodes=0)])
    assert first == {"draft": True, "threshold": 0.4, "max_tokens": 20}
    assert verified(policy, chain([0.9, 0.8, 0.3, 0.9]), first) == 3  # 0.3 < 0.4: the judged draft is the last kept
    assert first["probs"] == pytest.approx([0.9, 0.8, 0.3])
    # two accepted, the third rejected: the ROC's least fpr + 3 fnr puts the threshold at 0.8
    second = policy.before_draft([], 4, 10, [past(first, accepted=2, nodes=3)])
    assert second["threshold"] == pytest.approx(0.8)
    assert verified(policy, chain([0.9, 0.75, 0.9]), second) == 2
    assert roc_threshold(np.array([0.9, 0.8, 0.3]), np.array([1, 1, 0])) == pytest.approx(0.8)
    # the heuristic schedule: +2 after a round that accepted every draft, -1 otherwise
    heuristic = ConfidenceThreshold(max_tokens=5, schedule="heuristic")
    heuristic.begin_request(None)
    d = heuristic.before_draft([], 1, 10, [])
    verified(heuristic, chain([0.9, 0.9]), d)
    assert heuristic.before_draft([], 3, 10, [past(d, accepted=2, nodes=2)])["max_tokens"] == 7
    assert heuristic.before_draft([], 3, 10, [past(d, accepted=1, nodes=2)])["max_tokens"] == 4
    with pytest.raises(ValueError, match="schedule"):
        ConfidenceThreshold(schedule="sometimes")


def test_drafter_entropy_stop_cuts_before_the_first_uncertain_depth_and_refuses_the_ngram_drafter():
    two, eight = torch.full((16,), -1e9), torch.full((16,), -1e9)
    two[:2], eight[:8] = 0.0, 0.0  # uniform over 2 tokens (ln 2 nats) and over 8 (ln 8)
    logits = torch.stack([two, two, eight, two])
    policy = DrafterEntropyStop()  # bound 1 - sqrt(0.2 H): 0.63 at ln 2, 0.35 at ln 8, against 0.5
    decision = policy.before_draft([], 1, 10, [])
    assert verified(policy, chain([0.5, 0.5, 0.125, 0.5], logits), decision) == 2
    assert decision["drafter_entropy"] == pytest.approx([math.log(2), math.log(2), math.log(8)], abs=1e-5)
    assert verified(DrafterEntropyStop(lam=0.3), chain([0.5] * 4, logits), {}) == 4
    with pytest.raises(ValueError, match="n-gram drafter"):
        policy.bind(None, NgramDrafter())
    with pytest.raises(ValueError, match="no distribution"):
        policy.plan(chain([0.5, 0.5]), build_tree(chain([0.5, 0.5]), "chain", None), {})


def test_accept_length_ema_moves_between_tiers_with_hysteresis():
    policy, history, steps = AcceptLengthEMA(), [], []
    decision = policy.before_draft([], 1, 10, [past(None, nodes=0)])
    assert decision == {"draft": True, "ema": None, "steps": 3}  # the middle tier until a round verifies drafts
    for accepted in (6, 0, 0, 0, 0, 0):
        history.append(past(decision, accepted=accepted, nodes=decision["steps"]))
        decision = policy.before_draft([], 1, 10, history)
        steps.append(decision["steps"])
    # EMA 6 -> tier of 7; then 4.8, 3.84, 3.07, 2.46 hold it (round(ema + 0.25) + 1 >= 4); 1.97 drops it to 3
    assert steps == [7, 7, 7, 7, 7, 3]
    assert AcceptLengthEMA(down=0.0).before_draft([], 1, 10, [past({"ema": 3.072, "steps": 7}, accepted=0)])[
        "steps"] == 3  # without the hysteresis it drops a round earlier (EMA 2.46)
    plain = policy.before_draft([], 1, 10, history + [past(decision, accepted=0, nodes=0)])
    assert plain["ema"] == decision["ema"]  # a round that verified nothing leaves the average alone
    assert verified(policy, chain([0.9] * 6), decision) == 3


def test_workload_length_from_a_per_position_profile():
    curve = VerifyCost((1, 2, 32), (1.0, 1.2, 7.2))  # c(n) = 1 + 0.2 (n - 1)
    # rates (1 + sum a) / c(k + 1): 1.58, 1.93, 1.75, 1.63: k = 2; a drafter cost of 2 forwards makes none pay
    assert profile_length([0.9, 0.8, 0.1, 0.05], curve) == 2
    assert profile_length([0.9, 0.8, 0.1, 0.05], curve, draft_cost=2.0) == 0
    policy = WorkloadLength({"qa": 2, "math": 0}, default=4)
    for category, draft, depth in (("qa", True, 2), ("math", False, None), ("other", True, 4)):
        policy.begin_request(SimpleNamespace(category=category))
        decision = policy.before_draft([], 1, 10, [])
        assert decision["draft"] is draft
        if draft:
            assert verified(policy, chain([0.9] * 6), decision) == depth


def test_entropy_gate_drafts_k_or_nothing_with_hysteresis():
    policy, history, drafts = EntropyGate(on=1.0, off=2.0), [], []
    entropies = [0.5, 2.5, 1.5, 0.8, 1.9]
    for n in range(1, len(entropies) + 1):
        decision = policy.before_draft(entropies, n, 10, history)
        drafts.append(decision["draft"])
        history.append(past(decision))
    assert drafts == [True, False, False, True, True]  # 1.5 < off keeps it off; 1.9 < off keeps it on
    observed = [0.1]
    policy.observe(observed, 3, torch.zeros(2, 8))  # two new positions: only the last is computed
    assert math.isnan(observed[1]) and observed[2] == pytest.approx(math.log(8), abs=1e-5)
    with pytest.raises(ValueError, match="on <= off"):
        EntropyGate(on=2.0, off=1.0)


def test_law_stop_probability_cuts_where_the_rejection_probability_passes_the_threshold():
    policy = LawStopProbability(law_params(0.9), COST, threshold=0.3)
    decision = policy.before_draft([0.5], 1, 8, [])
    # survival 0.9^d: 1 - 0.9^3 = 0.27 <= 0.3 < 1 - 0.9^4 = 0.34
    assert verified(policy, chain([0.99] * 6), decision) == 3
    assert decision["stop_depth"] == 3 and decision["expected_raw"] == pytest.approx(0.9 + 0.81 + 0.729)


def test_depth_cut_keeps_an_ancestor_closed_subtree():
    proposal = DraftProposal(tokens=torch.tensor([[1, 2], [3, 4], [5, 6]]),
                             logprobs=torch.tensor([[0.6, 0.3], [0.5, 0.4], [0.7, 0.2]]).log())
    tree = build_tree(proposal, "ddtree", 8)
    cut = depth_cut(tree, 2)
    assert cut.max_depth == 2 and cut.n_nodes == sum(d <= 2 for d in tree.depths)
    assert all(p == 0 or cut.depths[p - 1] == d - 1 for p, d in zip(cut.parents, cut.depths))


# --- replay equals online -----------------------------------------------------------------------------------------

NGRAM_CONTROLLERS = {
    "confidence": lambda: ConfidenceThreshold(threshold=0.6),
    "confidence-heuristic": lambda: ConfidenceThreshold(max_tokens=2, schedule="heuristic"),
    "ema": lambda: AcceptLengthEMA(),
    "workload": lambda: WorkloadLength({"qa": 2}, default=5),
    "entropy-gate": lambda: EntropyGate(on=3.80, off=3.81),  # this tiny target: 3.77-3.83 nats, median 3.81
    "law-stop": lambda: LawStopProbability(law_params(0.8, weight=0.5), COST, threshold=0.5),
}


def _same_rounds(replayed, online):
    assert [(r.tree_nodes, r.accepted, r.committed_ids, r.drafted) for r in replayed.rounds] == \
        [(r.tree_nodes, r.accepted, r.committed_ids, r.drafted) for r in online.rounds]
    for offline, live in zip(replayed.rounds, online.rounds):  # the same decisions (entropies: up to float noise)
        assert (offline.policy is None) == (live.policy is None)
        for key, value in (live.policy or {}).items():
            assert offline.policy[key] == (pytest.approx(value, rel=1e-5, nan_ok=True)
                                           if isinstance(value, float) else value), key


@pytest.mark.parametrize("name", sorted(NGRAM_CONTROLLERS))
@pytest.mark.parametrize("tree,budget", [("chain", None), ("ddtree", 8)])
def test_ngram_controller_replayed_equals_online(name, tree, budget):
    model = tiny_llama(3, vocab=48, init_std=0.05)
    prompt = random_prompt(torch.Generator().manual_seed(7), 48, 12)
    drafter = lambda: NgramDrafter(max_ngram=3, block_size=5, max_matches=3)  # noqa: E731
    online = SpeculativeDecoder(model, drafter(), tree=tree, budget=budget, eos_token_ids=[],
                                policy=NGRAM_CONTROLLERS[name]()).generate(prompt, max_new_tokens=48, category="qa")
    entropies = teacher_forced_target_stats(model, prompt, online.token_ids)["target_entropy_nats"].tolist()
    replayed = replay_rounds(prompt, online.token_ids, drafter(), tree, budget, policy=NGRAM_CONTROLLERS[name](),
                             verify_cost=COST, max_new_tokens=48, entropies=entropies, category="qa")
    _same_rounds(replayed, online)
    assert any(r.tree_nodes for r in online.rounds), "the n-gram drafter should get drafts verified"
    if name == "entropy-gate":  # the gate both drafts and declines on this output
        assert {r.policy["draft"] for r in online.rounds[1:]} == {True, False}


def test_drafter_entropy_stop_replayed_equals_online_with_the_block_drafter():
    from entropy_law.decoding.features import capture_features
    from entropy_law.drafters.block import BlockDrafter

    model = tiny_llama(seed=5, layers=4, vocab=64)
    drafter = BlockDrafter(model, seed=0, block_size=5, num_layers=1).eval()
    prompt = [7, 19, 33, 2, 60, 41, 5]
    nodes = []
    for lam in (0.0, 0.35, 1.0):  # the bound never, sometimes, always below lam
        policy = lambda: DrafterEntropyStop(gamma=0.05, lam=lam)  # noqa: E731
        online = SpeculativeDecoder(model, drafter, tree="chain", policy=policy()).generate(prompt, max_new_tokens=24)
        with torch.no_grad(), capture_features(model, drafter.feature_layers) as cap:
            model(torch.tensor([prompt + online.token_ids]))
            features = cap.features()[0]
        replayed = replay_rounds(prompt, online.token_ids, PrecomputedBlockDrafter(drafter, prompt, online.token_ids,
                                                                                   features),
                                 "chain", policy=policy(), max_new_tokens=24)
        assert [r.tree_nodes for r in replayed.rounds] == [r.tree_nodes for r in online.rounds]
        assert [r.committed_ids for r in replayed.rounds] == [r.committed_ids for r in online.rounds]
        nodes.append(sum(r.tree_nodes for r in online.rounds))
    assert nodes[0] > nodes[2] == 0  # the rule acts: everything drafted at lam 0, nothing at lam 1


# --- the harness's pricing -------------------------------------------------------------------------------------------

def test_controller_table_prices_per_category_with_the_oracle_share():
    import pandas as pd

    from entropy_law.payoff.controllers import ORACLE, controller_table, paired_ratio

    rows = pd.DataFrame([  # config, information, category, request, tokens, rounds, cost
        (ORACLE, "hindsight", "a", "w:1", 20, 10, 10.0), (ORACLE, "hindsight", "b", "w:2", 30, 10, 10.0),
        ("x", "before drafting", "a", "w:1", 20, 10, 20.0), ("x", "before drafting", "b", "w:2", 30, 15, 15.0),
    ], columns=["config", "information", "category", "request", "tokens", "rounds", "cost"])
    table = controller_table(rows, n_boot=200).set_index(["config", "category"])
    assert table.loc[("x", "a"), "speedup"] == pytest.approx(1.0)
    assert table.loc[("x", "all"), "speedup"] == pytest.approx(50 / 35)
    assert table.loc[("x", "all"), "of_oracle"] == pytest.approx((50 / 35) / 2.5)
    assert table.loc[("x", "b"), "tokens_per_round"] == pytest.approx(2.0)
    assert table.loc[("x", "a"), "lo"] == table.loc[("x", "a"), "hi"] == pytest.approx(1.0)  # one request: no spread
    assert table.loc[("x", "all"), "lo"] < table.loc[("x", "all"), "hi"]
    ratio, lo, hi = paired_ratio(rows, "x", ORACLE, n_boot=200)
    assert ratio == pytest.approx((50 / 35) / 2.5) and lo <= ratio <= hi
    with pytest.raises(ValueError, match="oracle"):
        controller_table(rows.loc[rows["config"] == "x"])


def test_controllers_command_refuses_bad_input_in_one_line(capsys, tmp_path):
    from entropy_law.cli import main

    assert main(["controllers", str(tmp_path), "--policy", "x.json", "--sample", "0"]) != 0
    assert "--sample must be >= 1" in capsys.readouterr().err
    assert main(["controllers", str(tmp_path), "--policy", "x.json", "--from", str(tmp_path)]) != 0
    assert capsys.readouterr().err.strip()  # no traces there: a one-line error, not a traceback
