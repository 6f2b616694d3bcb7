"""bench/policy.py controllers-gap: the rate-gated law policy (a candidate reading the request's history through the
``RoundPolicy`` protocol) and the AUC it ranks signals by, on hand-made inputs whose answers are known."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from conftest import load_bench

from entropy_law.decoding.gate import VerifyCost
from entropy_law.decoding.policy import LawPolicy

COST = VerifyCost((1, 2, 4, 8, 16, 32), (1.0, 1.3, 1.6, 2.2, 3.4, 6.0))


def law_params(acceptance=(0.95, 0.6, 0.2), draft_cost=0.2):
    grid = [0.001, 0.1, 1.0]
    return {"kind": "entropy_law_policy", "version": 1, "window": 2, "entropy_grid": grid, "depths": [1, 2, 3, 4],
            "acceptance": [[a] * 4 for a in acceptance], "confidence_weight": 0.5, "draft_cost": draft_cost,
            "default_entropy": 0.5, "verify_cost": COST.to_config(), "calibration_prior": 4.0}


def past(committed, nodes, drafted=True, round_index=1):
    return SimpleNamespace(round_index=round_index, committed=committed, tree_nodes=nodes, accepted=max(committed - 1, 0),
                           policy={"draft": drafted, "budget": nodes})


@pytest.mark.parametrize("entropy", [0.001, 0.02, 0.1, 0.3, 1.0, 3.0])
def test_at_rate_one_the_gate_drafts_exactly_where_the_law_policy_does(entropy):
    gated = load_bench("policy").RateGatedLaw(law_params(), COST, 1.0)
    law = LawPolicy(law_params(), COST)
    entropies = [entropy] * 5
    assert gated.before_draft(entropies, 5, 4)["draft"] == law.before_draft(entropies, 5, 4)["draft"]


def test_a_higher_rate_skips_drafts_the_law_policy_makes_and_never_drafts_where_it_skips():
    bench = load_bench("policy")
    law = LawPolicy(law_params(), COST)
    drafted = {h: law.before_draft([h] * 5, 5, 4)["draft"] for h in np.geomspace(0.001, 3.0, 30)}
    strict = {h: bench.RateGatedLaw(law_params(), COST, 1.5).before_draft([h] * 5, 5, 4)["draft"] for h in drafted}
    assert all(drafted[h] for h in drafted if strict[h])
    assert sum(drafted.values()) > sum(strict.values()) > 0


def test_without_a_rate_the_gate_reads_the_request_own_tokens_per_cost_so_far():
    gated = load_bench("policy").RateGatedLaw(law_params(draft_cost=0.2), COST, None, prior=2.0, prior_rate=1.0)
    history = [past(1, 0, round_index=0), past(4, 3), past(1, 0, drafted=False)]
    # prior 2 tokens for 2 cost; 4 tokens for c(4) + 0.2 = 1.8; a plain step 1 for 1 (the prefill not counted)
    assert gated.before_draft([0.5] * 5, 5, 4, history)["opportunity_rate"] == pytest.approx(7 / 4.8)


def test_auc_is_one_for_a_perfect_signal_zero_reversed_and_a_half_for_a_constant():
    auc = load_bench("policy").auc
    label = np.array([0, 0, 1, 1, 1])
    assert auc(label, np.array([0.1, 0.2, 0.5, 0.7, 0.9])) == 1.0
    assert auc(label, -np.array([0.1, 0.2, 0.5, 0.7, 0.9])) == 0.0
    assert auc(label, np.ones(5)) == 0.5
    assert auc(label, np.array([0.1, np.nan, 0.5, 0.7, 0.9])) == 1.0  # unknown signals are left out


def test_replayed_the_gate_decides_the_rounds_itself_and_a_rate_no_round_reaches_drafts_none():
    from entropy_law.decoding.replay import replay_rounds
    from entropy_law.drafters.ngram import NgramDrafter

    bench = load_bench("policy")
    prompt, output = [5, 6, 7, 8] * 6, [5, 6, 7, 8] * 4
    entropies = [0.01] * len(output)

    def drafted(policy):
        result = replay_rounds(prompt, output, NgramDrafter(), "ddtree", 16, policy=policy, verify_cost=COST,
                               entropies=entropies)
        return sum(r.tree_nodes > 0 for r in result.rounds[1:]), len(result.rounds) - 1

    law, never = drafted(LawPolicy(law_params(), COST)), drafted(bench.RateGatedLaw(law_params(), COST, 50.0))
    assert law[0] > 0 and never == (0, len(output) - 1)  # every round a plain step


@pytest.mark.parametrize("depth, same_span, cont", [(3, 0, 0), (1, 1, 1)])
def test_signals_read_the_matched_suffix_and_the_source_span_history_of_a_hand_made_context(depth, same_span, cont):
    bench = load_bench("policy")
    signal = bench.SignalLaw(law_params(), COST, {})
    signal.begin_request(SimpleNamespace(prompt_ids=[1, 2, 3, 4, 5, 6, 7]))
    # the last round drafted ``depth`` tokens from the match ending at position 1 and accepted one: rejected in part
    # (depth 3), or a copy run the match at position 3 = 1 + 2 committed continues (depth 1)
    last = SimpleNamespace(round_index=1, tree_nodes=depth, tree_depth=depth, accepted=1, committed=2,
                           policy={"match_end": 1})
    got = signal.signals([1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4], [last])
    assert (got["match_len"], got["match_end"], got["distance"], got["n_matches"]) == (4, 3, 7.0, 1)
    assert (got["same_span"], got["cont"]) == (same_span, cont)
    assert bench.fit_scales(pd.DataFrame([dict(budget=2, accepted=3, expected=8.0, **got)]))[
        f"n4s{same_span}"] == pytest.approx(8 / 13)
