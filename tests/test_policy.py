"""The per-round law policy (decoding/policy.py), its fit (payoff/policy.py), its trace columns and the replay oracle.

Exactness: whatever the policy decides, speculative output == our AR output (tiny random Llama targets,
oracle and n-gram drafters, chain and DDTree). Decisions: a law that predicts no acceptance never calls the
drafter; one that predicts full acceptance verifies the drafted tree up to where the cost curve stops paying.
Recording: the policy columns are written and read back; a run without a policy reads them as null.
"""

import json
import math
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import OracleDrafter, tiny_llama
from entropy_law.decoding.decoder import ARDecoder, SpeculativeDecoder
from entropy_law.decoding.gate import RatioGate, VerifyCost
from entropy_law.decoding.interface import DraftProposal
from entropy_law.decoding.observers import RecorderObserver
from entropy_law.decoding.policy import LawPolicy, make_policy, row_entropies
from entropy_law.decoding.replay import HindsightPolicy, oracle_rounds, replay_rounds, round_outcomes, walk_outcomes
from entropy_law.decoding.tree import build_tree
from entropy_law.drafters.ngram import NgramDrafter
from entropy_law.payoff.policy import fit_policy, load_policy, save_policy, window_entropy
from entropy_law.traces.reader import load_traces
from entropy_law.traces.recorder import TraceRecorder
from tests.tiny_models import random_prompt

pytestmark = pytest.mark.usefixtures("single_thread")

COST = VerifyCost((1, 2, 4, 8, 16, 32), (1.0, 1.3, 1.6, 2.2, 3.4, 6.0))


def params(acceptance: float | list, *, depths: int = 8, weight: float = 0.5, draft_cost: float = 0.0,
           slope: bool = False, calibration: float | None = None) -> dict:
    """Policy parameters with a flat (or, with ``slope``, entropy-decreasing) acceptance table; ``calibration``:
    the in-request calibration's pseudo-drafts (None: off, as in parameters written before it existed)."""
    grid = [0.001, 0.01, 0.1, 1.0, 4.0]
    rows = []
    for h in grid:
        a = acceptance if not slope else acceptance * math.exp(-h)
        rows.append([float(a)] * depths)
    return {"kind": "entropy_law_policy", "version": 1, "window": 3, "entropy_grid": grid,
            "depths": list(range(1, depths + 1)), "acceptance": rows, "confidence_weight": weight,
            "draft_cost": draft_cost, "default_entropy": 0.5, "verify_cost": COST.to_config(),
            **({} if calibration is None else {"calibration_prior": calibration})}


@lru_cache(maxsize=None)
def model(seed: int = 0):
    return tiny_llama(seed, vocab=96, layers=2, kv_heads=2)


def greedy(m, prompt, n):
    return ARDecoder(m).generate(prompt, max_new_tokens=n).token_ids


@pytest.mark.parametrize("seed", range(6))
def test_policy_output_equals_greedy(seed):
    m = model(seed % 2)
    g = torch.Generator().manual_seed(seed)
    prompt = random_prompt(g, 96, 5 + seed)
    n = 24
    reference = greedy(m, prompt, n)
    law = params([0.0, 0.3, 0.7, 1.0][seed % 4], slope=seed % 2 == 1, weight=[0.0, 0.5, 1.0][seed % 3])
    for drafter, tree, budget in ((OracleDrafter(reference, block_size=6, k=2, p_correct=0.7, seed=seed, vocab=96), "ddtree", 12),
                                  (OracleDrafter(reference, block_size=5, p_correct=0.6, seed=seed, vocab=96), "chain", None),
                                  (NgramDrafter(block_size=6), "ddtree", 16),
                                  (NgramDrafter(block_size=6), "chain", None)):
        out = SpeculativeDecoder(m, drafter, tree=tree, budget=budget, policy=law).generate(prompt, max_new_tokens=n)
        assert out.token_ids == reference, (type(drafter).__name__, tree, law["acceptance"][0][0])


def test_no_acceptance_never_calls_the_drafter():
    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(1), 96, 8)
    reference = greedy(m, prompt, 16)
    drafter = OracleDrafter(reference, block_size=6)
    out = SpeculativeDecoder(m, drafter, tree="chain", policy=params(0.0)).generate(prompt, max_new_tokens=16)
    assert out.token_ids == reference
    assert drafter.calls == []  # declined before drafting: the drafter's cost is saved
    decode = [r for r in out.rounds if r.round_index > 0]
    assert all(r.tree_nodes == 0 and r.policy["draft"] is False and r.policy["budget"] == 0 for r in decode)


def test_full_acceptance_verifies_up_to_the_cost_curve():
    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(2), 96, 8)
    reference = greedy(m, prompt, 30)
    drafter = OracleDrafter(reference, block_size=9, stated_prob=1.0)  # always right, and says so
    out = SpeculativeDecoder(m, drafter, tree="chain", policy=params(1.0)).generate(prompt, max_new_tokens=30)
    assert out.token_ids == reference
    # with p = 1 at every depth, (1 + k) / c(k + 1) grows up to k = 8 drafts under COST (9 / 2.2 > 8 / 2.05)
    first = out.rounds[1]
    assert first.policy["budget"] == 8 and first.tree_nodes == 8 and first.accepted == 8
    assert first.policy["expected"] == pytest.approx(8.0)


def test_policy_picks_an_ancestor_closed_prefix_by_blended_probability():
    proposal = DraftProposal(tokens=torch.tensor([[5, 6], [7, 8], [9, 10]]),
                             logprobs=torch.log(torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.99, 0.01]])))
    tree = build_tree(proposal, "ddtree", 12)
    policy = LawPolicy(params(0.8, depths=3), VerifyCost((1, 2, 40), (1.0, 1.01, 1.4)))  # nearly free verify
    decision = policy.before_draft([0.5] * 4, 4, 3)
    chosen, expected = policy.plan(proposal, tree, decision)
    assert decision["budget"] == chosen.n_nodes > 0
    for parent, depth in zip(chosen.parents, chosen.depths):  # Tree checks parents come first; depths agree
        assert depth == (1 if parent == 0 else chosen.depths[parent - 1] + 1)
    # the expectation is the sum of blended path probabilities along each path: a node's p = q (a / Q)^(1/2), Q the
    # drafter's probability of it and its siblings in the drafted tree (a chain node: sqrt(a q))
    lookup = [dict(zip(t, p)) for t, p in zip(proposal.tokens.tolist(), proposal.logprobs.exp().tolist())]
    q = [lookup[d - 1][t] for t, d in zip(tree.tokens, tree.depths)]
    mass = {}
    for qi, parent in zip(q, tree.parents):
        mass[parent] = mass.get(parent, 0.0) + qi
    by_path = {}
    for i in range(tree.n_nodes):
        path = tuple(tree.tokens[j - 1] for j in tree.path_to(i + 1))
        by_path[path] = math.prod(q[j - 1] * math.sqrt(0.8 / mass[tree.parents[j - 1]]) for j in tree.path_to(i + 1))
    total = sum(by_path[tuple(chosen.tokens[j - 1] for j in chosen.path_to(i + 1))] for i in range(chosen.n_nodes))
    assert expected == pytest.approx(total)


def test_siblings_share_the_blended_acceptance_of_their_depth():
    # three candidates of q = 0.3 under a law of 0.8 (weight 1/2): together sqrt(0.8 * 0.9), shared by q; a node
    # by node blend, sqrt(0.8 * 0.3) each, would expect 1.47 accepted drafts of one depth
    policy = LawPolicy(params(0.8, depths=2), VerifyCost((1, 2, 40), (1.0, 1.0, 1.0)))  # verifying is free
    wide = DraftProposal(tokens=torch.tensor([[5, 6, 7]]), logprobs=torch.log(torch.tensor([[0.3, 0.3, 0.3]])))
    decision = policy.before_draft([0.5] * 4, 4, 1)
    chosen, expected = policy.plan(wide, build_tree(wide, "ddtree", 3), decision)
    assert chosen.n_nodes == 3 and expected == pytest.approx(math.sqrt(0.8 * 0.9))
    chain = DraftProposal(tokens=torch.tensor([[5], [6]]), logprobs=torch.log(torch.tensor([[0.3], [0.5]])))
    decision = policy.before_draft([0.5] * 4, 4, 2)
    chosen, expected = policy.plan(chain, build_tree(chain, "chain", None), decision)
    one = math.sqrt(0.8 * 0.3)  # a chain node: a^(1/2) q^(1/2), as before siblings were shared
    assert chosen.n_nodes == 2 and expected == pytest.approx(one + one * math.sqrt(0.8 * 0.5))


def test_policy_columns_recorded_and_null_without_policy(tmp_path):
    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(3), 96, 8)
    reference = greedy(m, prompt, 20)
    for name, policy in (("with", params(0.6, calibration=4.0)), ("uncalibrated", params(0.6)), ("without", None)):
        with TraceRecorder(tmp_path / name, model_id="tiny", drafter_id="ngram", tree_policy="ddtree") as rec:
            drafter = OracleDrafter(reference, block_size=6, k=2, p_correct=0.8, vocab=96, seed=3)
            dec = SpeculativeDecoder(m, drafter, tree="ddtree", budget=8, policy=policy,
                                     observers=[RecorderObserver(rec)])
            out = dec.generate(prompt, max_new_tokens=20, request_id="r0", category="c")
        assert out.token_ids == reference
        if name == "with":
            online = [r.policy for r in out.rounds if r.round_index > 0]
    with_policy = load_traces(tmp_path / "with").rounds
    decode = with_policy.loc[with_policy["round_index"] > 0]
    assert decode["policy_budget"].notna().all() and decode["policy_drafted"].notna().all()
    assert (decode["policy_budget"] == decode["tree_nodes"]).all()
    assert decode["policy_window_entropy_nats"].notna().all()
    assert (decode["committed"] > 1).sum() >= 3  # rounds that commit several tokens: the entropy is the last one's
    # the entropy input is the target entropy at the last committed position before the round
    tokens = load_traces(tmp_path / "with").tokens.set_index("position")["target_entropy_nats"]
    for _, r in decode.iterrows():
        assert r["policy_entropy_nats"] == pytest.approx(tokens[r["start_position"] - 1], abs=1e-4)
    # the calibration factors: 1 before any verified round, then (A + m) / (E + m) of the rounds before
    factors = decode["policy_calibration"].to_numpy(float)
    assert factors[0] == 1.0 and decode["policy_plan_calibration"].iloc[0] == 1.0
    drafted = decode["policy_budget"].to_numpy() > 0
    accepted = np.concatenate([[0], np.cumsum(np.where(drafted, decode["accepted"], 0))[:-1]])
    def before(key):  # the uncalibrated expectations of the rounds before each one
        return np.concatenate([[0], np.cumsum([d[key] if d["budget"] else 0.0 for d in online])[:-1]])
    law, blend = before("law_expected_raw"), before("expected_raw")
    assert accepted[-1] > 0 and law[-1] > 0
    assert factors == pytest.approx((accepted + 4.0) / (law + 4.0), rel=1e-5)
    plan = decode["policy_plan_calibration"].to_numpy(float)
    assert plan == pytest.approx((accepted + 4.0) / (blend + 4.0), rel=1e-5)
    uncalibrated = load_traces(tmp_path / "uncalibrated").rounds
    assert uncalibrated["policy_calibration"].isna().all() and uncalibrated["policy_budget"].notna().any()
    without = load_traces(tmp_path / "without").rounds
    assert without["policy_budget"].isna().all() and without["policy_entropy_nats"].isna().all()
    assert without["policy_calibration"].isna().all()


def test_calibration_factors_by_hand():
    from types import SimpleNamespace as Round
    policy = LawPolicy(params(0.5, calibration=4.0), COST)
    assert policy.calibration([]) == (1.0, 1.0)  # no evidence: the law's word
    history = [Round(accepted=0, policy=None),  # prefill: no decision
               Round(accepted=2, policy={"budget": 3, "law_expected_raw": 1.5, "expected_raw": 1.0}),
               Round(accepted=5, policy={"budget": 0, "law_expected_raw": 0.0, "expected_raw": 0.0}),  # not drafted
               Round(accepted=0, policy={"budget": 4, "law_expected_raw": 2.5, "expected_raw": 3.0})]
    s_law, s_plan = policy.calibration(history)
    assert s_law == pytest.approx((2 + 4) / (1.5 + 2.5 + 4))
    assert s_plan == pytest.approx((2 + 4) / (1.0 + 3.0 + 4))
    assert LawPolicy(params(0.5), COST).calibration(history) == (1.0, 1.0)  # off without the parameter
    # with a half-life of 1 round, the round 2 rounds back weighs 1/4 and the last one 1
    fading = LawPolicy({**params(0.5, calibration=4.0), "calibration_half_life": 1.0}, COST)
    s_law, s_plan = fading.calibration(history)
    assert s_law == pytest.approx((2 / 4 + 4) / (1.5 / 4 + 2.5 + 4))
    assert s_plan == pytest.approx((2 / 4 + 4) / (1.0 / 4 + 3.0 + 4))
    later = history + [Round(accepted=0, policy={"budget": 0})] * 40  # 40 rounds without drafting
    assert fading.calibration(later) == pytest.approx((1.0, 1.0), abs=1e-9)  # the evidence has faded
    with pytest.raises(ValueError, match="calibration_half_life"):
        LawPolicy({**params(0.5, calibration=4.0), "calibration_half_life": 0}, COST)
    # the factor scales each reach probability of the chain, capped at 1
    acceptance = [0.5] * 8
    scaled = policy.best_chain_rate(acceptance, 2, scale=3.0)
    assert scaled == pytest.approx(max(1.0, (1 + 1.0) / COST(2), (1 + 1.0 + 0.75) / COST(3)))
    for bad in (0, -1.0, "4"):
        with pytest.raises(ValueError, match="calibration_prior"):
            LawPolicy(params(0.5, calibration=bad), COST)


def calibrated_and_not(seed: int, n: int, law: float, **drafter) -> dict:
    """Chain decoding of one prompt under a flat law, without (None) and with (4.0) the in-request calibration:
    {prior: (result, drafter)}; both outputs are checked against greedy."""
    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(seed), 96, 8)
    reference = greedy(m, prompt, n)
    runs = {}
    for prior in (None, 4.0):
        oracle = OracleDrafter(reference, vocab=96, seed=seed, **drafter)
        out = SpeculativeDecoder(m, oracle, tree="chain", policy=params(law, calibration=prior)).generate(
            prompt, max_new_tokens=n)
        assert out.token_ids == reference
        runs[prior] = (out, oracle)
    return runs


def test_calibration_stops_drafting_when_drafts_keep_failing():
    # the law and the drafter both say 0.9, and the drafts are always wrong (the true token never proposed)
    runs = calibrated_and_not(5, 40, 0.9, block_size=6, p_correct=0.0, stated_prob=0.9)
    law_only = [r for r in runs[None][0].rounds if r.round_index > 0]
    # the law alone drafts in every round with room for a draft (the last one has none)
    assert all(r.policy["draft"] for r in law_only[:-1]) and "calibration" not in law_only[0].policy
    assert len(runs[None][1].calls) == len(law_only) - 1
    calibrated = [r for r in runs[4.0][0].rounds if r.round_index > 0]
    factors = [r.policy["calibration"] for r in calibrated]
    assert factors[0] == 1.0 and all(b <= a for a, b in zip(factors, factors[1:]))
    assert not any(r.policy["draft"] for r in calibrated[-10:])  # it stopped, and stays stopped
    # the sums each decision keeps (O(1) per round) equal the whole history folded again without them
    policy = LawPolicy(params(0.9, calibration=4.0), COST)
    bare = [SimpleNamespace(accepted=r.accepted, policy=r.policy and {k: v for k, v in r.policy.items()
                                                                     if k != "calibration_sums"})
            for r in runs[4.0][0].rounds]
    assert policy.calibration(bare) == pytest.approx(policy.calibration(runs[4.0][0].rounds))
    assert [policy.calibration(bare[:i])[0] for i in range(1, len(bare))] == pytest.approx(factors)
    assert len(runs[4.0][1].calls) < 12


def test_the_law_expectation_of_a_tree_counts_each_depth_once():
    # the law is fitted on the depth a round reached: siblings add nothing to its expectation of a tree
    proposal = DraftProposal(tokens=torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]]),
                             logprobs=torch.log(torch.tensor([[0.4, 0.3, 0.3]] * 3)))
    tree = build_tree(proposal, "ddtree", 12)
    policy = LawPolicy(params(0.8, depths=3), VerifyCost((1, 2, 40), (1.0, 1.01, 1.02)))  # verify all but free
    decision = policy.before_draft([0.5] * 4, 4, 3)
    chosen, _ = policy.plan(proposal, tree, decision)
    assert chosen.n_nodes == tree.n_nodes == 12 and max(chosen.depths) == 2  # 3 at depth 1, 9 at depth 2
    assert decision["law_expected_raw"] == pytest.approx(0.8 + 0.8 ** 2)  # not 3 * 0.8 + 9 * 0.8 ** 2
    assert policy.law_expected_depth([0.8, 0.5, 0.5], 2) == pytest.approx(0.8 + 0.4)
    assert policy.law_expected_depth([0.8, 0.5], 0) == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_calibration_stays_at_the_law_when_the_law_is_right_on_a_wide_tree(seed):
    # a DDTree with three candidates per depth, the true token among them with probability 0.8: the depth
    # acceptance the flat law of 0.8 states. The factor must stay near 1, not fall by the number of siblings.
    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(seed), 96, 8)
    reference = greedy(m, prompt, 60)
    oracle = OracleDrafter(reference, block_size=7, k=3, p_correct=0.8, stated_prob=0.3, vocab=96, seed=seed)
    out = SpeculativeDecoder(m, oracle, tree="ddtree", budget=12, policy=params(0.8, depths=6, calibration=4.0)
                             ).generate(prompt, max_new_tokens=60)
    assert out.token_ids == reference
    decided = [r for r in out.rounds if r.round_index > 0]
    verified = [r for r in decided if r.policy["budget"]]
    assert len(verified) >= 8 and any(r.tree_nodes > max(r.tree_depth, 1) for r in verified)  # wide trees
    assert 0.6 <= decided[-1].policy["calibration"] <= 1.5  # counted per node: 0.3-0.45


def test_calibration_drafts_deeper_when_drafts_beat_the_law():
    # the law says 0.4, the drafter says 0.3, and every draft is right
    runs = calibrated_and_not(6, 60, 0.4, block_size=9, stated_prob=0.3)
    budgets = {prior: [r.policy["budget"] for r in out.rounds if r.round_index > 0] for prior, (out, _) in runs.items()}
    assert max(budgets[None]) == 1  # the law alone: a single draft per round
    assert max(budgets[4.0]) >= 2 and len(budgets[4.0]) < 0.8 * len(budgets[None])  # more drafts, fewer rounds


def test_row_entropies_match_scipy():
    from scipy.stats import entropy
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    expected = [entropy(torch.softmax(row.double(), -1).numpy()) for row in logits]
    assert row_entropies(logits) == pytest.approx(expected, abs=1e-5)


def test_bad_parameters_say_what_to_do():
    with pytest.raises(ValueError, match="fit_policy"):
        LawPolicy({"kind": "entropy_law_policy"}, COST)
    bad = params(0.5)
    bad["acceptance"][0][0] = 1.5
    with pytest.raises(ValueError, match="probabilities"):
        LawPolicy(bad, COST)
    no_cost = params(0.5)
    del no_cost["verify_cost"]
    with pytest.raises(ValueError, match="verify-cost curve"):
        LawPolicy(no_cost)


# --- the law layer --------------------------------------------------------------------------------------------

def test_window_entropy_by_hand():
    tokens = pd.DataFrame({"run_id": "r", "request_id": "q", "position": [0, 1, 2, 3, 4, 5],
                           "depth": [1, 1, 2, 3, 1, 2], "target_entropy_nats": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]})
    got = window_entropy(tokens, 2)
    # rounds start at positions 0 (prefill), 1, 1, 1, 4, 4
    assert np.isnan(got[0])
    assert got[1:4].tolist() == [1.0, 1.0, 1.0]
    assert got[4:].tolist() == [3.5, 3.5]


def simulated_traces(rng, n_requests=40, slope=1.2):
    """Chain rounds whose acceptance falls with the pre-round window entropy: a(H_w) = exp(-0.3 H_w^slope)."""
    tokens, rounds = [], []
    for q in range(n_requests):
        h = rng.gamma(0.6, 1.5, size=400)
        pos, r = 1, 1
        tokens.append(dict(request_id=f"q{q}", round_index=0, position=0, depth=1, role="bonus",
                           target_entropy_nats=h[0]))
        rounds.append(dict(request_id=f"q{q}", round_index=0, tree_depth=0))
        while pos < 300:
            hw = h[max(0, pos - 3):pos].mean()
            a = math.exp(-0.3 * hw ** slope)
            depth = 1
            while depth <= 5 and rng.random() < a:
                tokens.append(dict(request_id=f"q{q}", round_index=r, position=pos, depth=depth, role="accepted",
                                   target_entropy_nats=h[pos]))
                pos, depth = pos + 1, depth + 1
            role = "bonus" if depth > 5 else "correction"
            tokens.append(dict(request_id=f"q{q}", round_index=r, position=pos, depth=depth, role=role,
                               target_entropy_nats=h[pos]))
            rounds.append(dict(request_id=f"q{q}", round_index=r, tree_depth=5))
            pos, r = pos + 1, r + 1
    tokens = pd.DataFrame(tokens).assign(run_id="run", category="c", target_top1_prob=0.5, target_logit_gap=1.0)
    tokens["target_renyi2_nats"] = tokens["target_entropy_nats"]
    rounds = pd.DataFrame(rounds).assign(run_id="run")
    runs = pd.DataFrame({"run_id": ["run"], "drafter_id": ["sim"], "model_id": ["m"], "tree_policy": ["chain"]})
    from types import SimpleNamespace
    return SimpleNamespace(tokens=tokens, rounds=rounds, runs=runs)


def test_fit_policy_recovers_a_falling_law_and_round_trips(tmp_path):
    traces = simulated_traces(np.random.default_rng(0))
    fitted = fit_policy(traces, window=3, draft_cost=0.01)
    assert (fitted["calibration_prior"], fitted["calibration_half_life"]) == (1.0, 16.0)  # the stated defaults
    # it blends the drafter's confidence: it decides before verifying; without it, before drafting
    assert fitted["information_set"] == "before_verifying"
    assert fit_policy(traces, window=3, draft_cost=0.01, confidence_weight=0.0)["information_set"] == "before_drafting"
    with pytest.raises(ValueError, match="drafted_depth"):  # a law in the round's drafted depth: not known before it
        fit_policy(traces, window=3, draft_cost=0.01, family="law_exp_obs_ceil")
    table = np.array(fitted["acceptance"])
    grid = np.array(fitted["entropy_grid"])
    truth = np.exp(-0.3 * grid ** 1.2)
    at = (grid > 0.05) & (grid < 3.0)  # where the simulated window entropies lie
    assert np.abs(table[at, 0] - truth[at]).max() < 0.08
    assert (np.diff(table[:, 0]) <= 1e-9).all()  # acceptance falls with entropy
    path = save_policy(fitted, tmp_path / "policy.json")
    loaded = load_policy(path)
    assert loaded == json.loads(json.dumps(fitted))
    policy = LawPolicy(loaded, COST)
    assert policy.law_acceptance(1.0)[0] == pytest.approx(float(np.interp(np.log(1.001), np.log(grid + 1e-3),
                                                                          table[:, 0])), abs=1e-6)


def test_load_policy_refuses_other_files(tmp_path):
    (tmp_path / "x.json").write_text("{\"a\": 1}")
    with pytest.raises(ValueError, match="fit_policy"):
        load_policy(tmp_path / "x.json")


# --- replay and the oracle -------------------------------------------------------------------------------------

@pytest.mark.parametrize("law", [params(0.7, slope=True), params(0.9, calibration=4.0)],
                         ids=["falling-law", "flat-law-calibrated"])
def test_replay_with_policy_matches_online(law):
    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(4), 96, 10)
    online = SpeculativeDecoder(m, NgramDrafter(block_size=6), tree="ddtree", budget=12, policy=law)
    result = online.generate(prompt, max_new_tokens=40)
    from entropy_law.decoding.replay import teacher_forced_target_stats
    entropies = teacher_forced_target_stats(m, prompt, result.token_ids)["target_entropy_nats"].tolist()
    replay = replay_rounds(prompt, result.token_ids, NgramDrafter(block_size=6), "ddtree", 12, policy=law,
                           verify_cost=COST, max_new_tokens=40)
    replay_h = replay_rounds(prompt, result.token_ids, NgramDrafter(block_size=6), "ddtree", 12, policy=law,
                             verify_cost=COST, max_new_tokens=40, entropies=entropies)
    assert [r.committed for r in replay_h.rounds] == [r.committed for r in result.rounds]
    assert [r.tree_nodes for r in replay_h.rounds] == [r.tree_nodes for r in result.rounds]
    assert [(r.policy or {}).get("calibration") for r in replay_h.rounds] == pytest.approx(
        [(r.policy or {}).get("calibration") for r in result.rounds])
    if "calibration_prior" in law:  # drafts were verified and moved the calibration
        assert min(r.policy["calibration"] for r in result.rounds[1:]) < 0.9
    assert len(replay.rounds) >= 2  # without entropies: the default entropy, still a complete replay


def test_oracle_with_flat_cost_is_the_largest_tree():
    m = model(1)
    prompt = random_prompt(torch.Generator().manual_seed(5), 96, 12)
    output = greedy(m, prompt, 40)
    flat = VerifyCost((1, 2), (1.0, 1.0))
    oracle = oracle_rounds(prompt, output, NgramDrafter(block_size=6), budgets=(0, 4, 16), verify_cost=flat)
    biggest = replay_rounds(prompt, output, NgramDrafter(block_size=6), "ddtree", 16, min_expected_accepted=0.0)
    assert oracle.committed == [r.committed for r in biggest.rounds[1:]]
    assert sum(oracle.committed) == len(output) - 1


def test_oracle_never_below_a_plain_step_and_at_least_every_fixed_budget_per_round():
    m = model(0)
    prompt = random_prompt(torch.Generator().manual_seed(6), 96, 12)
    output = greedy(m, prompt, 40)
    oracle = oracle_rounds(prompt, output, NgramDrafter(block_size=6), budgets=(0, 2, 8), verify_cost=COST,
                           draft_cost=0.05)
    rates = [c / k for c, k in zip(oracle.committed, oracle.cost)]
    assert min(rates) >= 1.0  # a plain step (1 token for cost 1) is always among the choices
    assert oracle.modelled_speedup >= 1.0
    assert sum(oracle.committed) == len(output) - 1


class LookupDrafter:
    """A context-only drafter for the outcome table's tests: after the last occurrence of the pending root earlier in
    the context, propose the 4 tokens that followed it (2 candidates a depth: those and their successor + 1), with
    probabilities that fall with depth; nothing when the root never occurred before."""

    drafter_id = "lookup"
    block_size = 4
    feature_layers = ()

    def begin(self, prompt_ids, features):
        return None

    def propose(self, tokens, features):
        root = tokens[-1]
        earlier = [i for i in range(len(tokens) - 1) if tokens[i] == root]
        if not earlier:
            return DraftProposal.empty()
        follow = tokens[earlier[-1] + 1:earlier[-1] + 5]
        if not follow:
            return DraftProposal.empty()
        rows = [[t, (t + 1) % 96] for t in follow]
        probs = [[0.6 ** (d + 1), 0.3 ** (d + 1)] for d in range(len(follow))]
        return DraftProposal(tokens=torch.tensor(rows), logprobs=torch.tensor(probs).log())


def test_round_outcomes_walked_by_the_best_rate_is_the_oracle():
    """``walk_outcomes`` over ``round_outcomes`` with the oracle's rule gives ``oracle_rounds``' rounds; every row is
    the round a fixed budget plays from that start (``replay_rounds`` with that budget and no gate: its rounds are
    rows of the table)."""
    m = model(1)
    prompt = random_prompt(torch.Generator().manual_seed(11), 96, 16)
    output = greedy(m, prompt, 48)
    budgets, draft_cost = (0, 1, 2, 4, 8), 0.1
    table = round_outcomes(prompt, output, LookupDrafter(), budgets=budgets)
    assert set(table["budget"]) == set(budgets) and table["start_position"].min() == 1
    assert (table.loc[table["budget"] == 0, ["tree_nodes", "accepted", "committed"]].to_numpy() == [0, 0, 1]).all()
    assert (table["tree_nodes"] <= table["budget"]).all() and (table["committed"] == table["accepted"] + 1).all()
    assert table.loc[table["budget"] > 0, "accepted"].sum() > 0  # the drafter does get drafts accepted here

    def best_rate(rows):
        cost = [COST(int(r.tree_nodes) + 1) + (draft_cost if n > 0 else 0.0) for n, r in rows.iterrows()]
        rates = rows["committed"].to_numpy() / np.array(cost)
        return rows.index[int(np.argmax(rates > rates.max() - 1e-12))]  # the first best, as the oracle keeps it

    walked = walk_outcomes(table, best_rate)
    oracle = oracle_rounds(prompt, output, LookupDrafter(), budgets=budgets, verify_cost=COST, draft_cost=draft_cost)
    assert walked["committed"].tolist() == oracle.committed and walked["tree_nodes"].tolist() == oracle.budgets
    assert walked["committed"].sum() == len(output) - 1 and len(set(oracle.budgets)) > 1  # it chose, not one budget
    for budget in (2, 8):
        fixed = replay_rounds(prompt, output, LookupDrafter(), "ddtree", budget, min_expected_accepted=0.0)
        rows = walk_outcomes(table, lambda rows: budget)
        assert rows["committed"].tolist() == [r.committed for r in fixed.rounds[1:]]
        assert rows["tree_nodes"].tolist() == [r.tree_nodes for r in fixed.rounds[1:]]
        assert rows["expected_accepted"].tolist() == pytest.approx([r.expected_accepted for r in fixed.rounds[1:]])
    with pytest.raises(ValueError, match="not one of the table's"):
        walk_outcomes(table, lambda rows: 3)



def test_the_oracle_as_a_policy_plays_the_replayed_oracle_rounds_on_the_target():
    """``HindsightPolicy`` runs ``oracle_rounds``' rounds live (so a bench can time the oracle): the same budget and
    tokens every round, the drafter skipped exactly where the oracle took a plain step, the output greedy; given
    another request's output it still decodes greedily (it only picks trees)."""
    m = model(1)
    prompt = random_prompt(torch.Generator().manual_seed(11), 96, 16)
    output = greedy(m, prompt, 48)
    budgets, draft_cost = (0, 1, 2, 4, 8), 0.1
    oracle = oracle_rounds(prompt, output, LookupDrafter(), budgets=budgets, verify_cost=COST, draft_cost=draft_cost)
    assert len(set(oracle.budgets)) > 1 and 0 in oracle.budgets  # it chose, plain steps among its choices
    policy = HindsightPolicy(output, oracle, verify_cost=COST, draft_cost=draft_cost, budgets=budgets)
    decoder = SpeculativeDecoder(m, LookupDrafter(), tree="ddtree", budget=8, policy=policy)
    live = decoder.generate(prompt, max_new_tokens=48)
    rounds = [r for r in live.rounds if r.round_index > 0]
    assert live.token_ids == output
    assert [r.committed for r in rounds] == oracle.committed and [r.tree_nodes for r in rounds] == oracle.budgets
    assert [r.policy["draft"] for r in rounds] == [b > 0 for b in oracle.budgets]  # plain steps never draft
    assert all(r.policy["scheduled"] == b for r, b in zip(rounds, oracle.budgets))
    assert live.config["policy"]["kind"] == "hindsight oracle"
    other = greedy(m, random_prompt(torch.Generator().manual_seed(12), 96, 16), 48)
    wrong = HindsightPolicy(other, oracle_rounds(prompt, other, LookupDrafter(), budgets=budgets, verify_cost=COST),
                            verify_cost=COST, budgets=budgets)
    assert SpeculativeDecoder(m, LookupDrafter(), tree="ddtree", budget=8,
                              policy=wrong).generate(prompt, max_new_tokens=48).token_ids == output
    with pytest.raises(ValueError, match="non-empty greedy output"):
        HindsightPolicy([], oracle, verify_cost=COST)
    with pytest.raises(TypeError, match="RoundPolicy"):
        SpeculativeDecoder(m, LookupDrafter(), tree="ddtree", budget=8, policy=object())

# --- the command line ------------------------------------------------------------------------------------------

def test_record_with_the_law_policy(tmp_path, capsys):
    from test_cli_record import greedy_reference, make_tiny_model_folder, read_table
    from entropy_law.cli import main

    folder = make_tiny_model_folder(tmp_path / "model")
    tasks = tmp_path / "tasks.jsonl"
    prompts = {1: "the cat sat on the mat the cat sat on the mat", 2: "red blue green red blue green red"}
    tasks.write_text("".join(json.dumps({"question_id": q, "category": "alpha", "turns": [t]}) + "\n"
                             for q, t in prompts.items()))
    law = save_policy(params(0.8, slope=True), tmp_path / "law.json")
    out = tmp_path / "run"
    args = ["record", "--model", str(folder), "--tasks", str(tasks), "--out", str(out), "--max-new-tokens", "12",
            "--block-size", "4", "--no-progress", "--tree", "ddtree", "--budget", "6"]
    assert main(args + ["--policy", "law", "--policy-law", str(law)]) == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["policy"]["acceptance"] == params(0.8, slope=True)["acceptance"] and meta["gate"] == "cost"
    tokens, rounds = read_table(out, "tokens"), read_table(out, "rounds")
    for request_id, group in tokens.groupby("request_id"):
        expected = greedy_reference(folder, prompts[int(request_id.split(":")[1])], 12)
        assert group.sort_values("position")["token_id"].tolist() == expected
    decode = rounds.loc[rounds["round_index"] > 0]
    assert decode["policy_budget"].notna().all() and (decode["policy_budget"] == decode["tree_nodes"]).all()
    # --policy law without its parameters: refused, with what to do, before the model is loaded
    bad = ["record", "--model", str(tmp_path / "nowhere"), "--tasks", str(tasks), "--out", str(tmp_path / "x")]
    assert main(bad + ["--policy", "law"]) == 2
    assert "--policy-law" in capsys.readouterr().err
    assert main(bad + ["--policy", "law", "--policy-law", str(tasks)]) == 2  # not a policy file
    assert "fit_policy" in capsys.readouterr().err
    # a policy fitted for another drafter: refused (before the verify cost is measured); --policy-borrow applies it
    block_law = save_policy({**params(0.8), "drafter_id": "block-drafter-b8-l2-copy"}, tmp_path / "block.json")
    borrowed = tmp_path / "borrowed"
    args = [a if a != str(out) else str(borrowed) for a in args]
    assert main(args + ["--policy", "law", "--policy-law", str(block_law)]) == 2
    assert "fitted for drafter 'block-drafter-b8-l2-copy', the decoder's drafter is 'ngram'" in capsys.readouterr().err
    assert main(args + ["--policy", "law", "--policy-law", str(block_law), "--policy-borrow", "--overwrite"]) == 0
    meta = json.loads((borrowed / "run.json").read_text())
    assert meta["policy"]["borrowed_from"]["drafter_id"] == "block-drafter-b8-l2-copy"
    assert meta["policy"]["drafter_id"] is None
    assert main(bad + ["--policy-borrow"]) == 2
    assert "use it with --policy law" in capsys.readouterr().err


def test_oracle_with_a_prohibitive_cost_never_drafts():
    m = model(1)
    prompt = random_prompt(torch.Generator().manual_seed(7), 96, 12)
    output = greedy(m, prompt, 30)
    steep = VerifyCost((1, 2), (1.0, 12.0))  # a round commits at most 6 tokens (block size 6): never pays
    oracle = oracle_rounds(prompt, output, NgramDrafter(block_size=6), budgets=(0, 4, 16), verify_cost=steep)
    assert set(oracle.budgets) == {0} and set(oracle.committed) == {1}
    assert oracle.modelled_speedup == pytest.approx(1.0)


# --- the hybrid drafter ----------------------------------------------------------------------------------------

def test_merge_deduplicates_and_mixes():
    from entropy_law.drafters.hybrid import merge_proposals
    ngram = DraftProposal(tokens=torch.tensor([[5, 6], [7, 1]]), logprobs=torch.log(torch.tensor([[0.8, 0.1],
                                                                                              [0.6, 0.0]])))
    block = DraftProposal(tokens=torch.tensor([[6, 5, 9], [2, 3, 4], [8, 0, 1]]),
                          logprobs=torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.4, 0.3, 0.3], [0.9, 0.05, 0.05]])))
    merged = merge_proposals(ngram, block, weight=0.5, top_k=8)
    assert merged.depth == 3
    first = dict(zip(merged.tokens[0].tolist(), merged.logprobs[0].exp().tolist()))
    assert first[5] == pytest.approx(0.55) and first[6] == pytest.approx(0.3) and first[9] == pytest.approx(0.1)
    assert merged.tokens[0, 0] == 5 and len(set(merged.tokens[0].tolist())) == merged.tokens.shape[1]
    second = dict(zip(merged.tokens[1].tolist(), merged.logprobs[1].exp().tolist()))
    assert second[7] == pytest.approx(0.3) and second[2] == pytest.approx(0.2) and 1 not in second or second[1] == 0
    third = dict(zip(merged.tokens[2].tolist(), merged.logprobs[2].exp().tolist()))
    assert third[8] == pytest.approx(0.45)  # the n-gram drafter proposes nothing this deep: it contributes 0


@pytest.mark.parametrize("skip_at", [0.0, 1.5, math.inf])
def test_hybrid_output_equals_greedy_and_skips_the_block_forward_when_confident(skip_at):
    from entropy_law.drafters.block import BlockDrafter
    from entropy_law.drafters.hybrid import HybridDrafter
    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(8), 96, 6) * 3  # repeats: the n-gram drafter matches
    reference = greedy(m, prompt, 30)
    for tree, budget, policy in (("ddtree", 12, None), ("chain", None, params(0.7)), ("ddtree", 16, params(0.9))):
        block = BlockDrafter(m, seed=0, block_size=5, num_layers=1)
        hybrid = HybridDrafter(NgramDrafter(block_size=6), block, skip_block_at=skip_at)
        dec = SpeculativeDecoder(m, hybrid, tree=tree, budget=budget,
                                 policy=policy or RatioGate(min_expected_accepted=0.0))
        assert dec.generate(prompt, max_new_tokens=30).token_ids == reference, (skip_at, tree)
        if skip_at == math.inf:
            assert hybrid.block_skips == 0 and hybrid.block_calls > 0
        if skip_at == 0.0:  # any n-gram proposal is "confident": the block drafter runs only without one
            assert hybrid.block_skips > 0


class CountingBlock:
    """A feature-reading drafter that proposes nothing and checks it has seen every committed position."""

    drafter_id = "counting"
    block_size = 5

    def __init__(self):
        self.feature_layers = (0,)
        self.calls = 0

    def begin(self, prompt_ids, prompt_features):
        self.rows = int(prompt_features.shape[0])

    def propose(self, tokens, new_features):
        self.rows += 0 if new_features is None else int(new_features.shape[0])
        assert self.rows == len(tokens) - 1, (self.rows, len(tokens))  # features of every position before the root
        self.calls += 1
        return DraftProposal.empty()


def test_hybrid_hands_the_block_drafter_every_position_it_skipped():
    from entropy_law.drafters.hybrid import HybridDrafter
    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(9), 96, 5) * 4
    reference = greedy(m, prompt, 30)
    block = CountingBlock()
    hybrid = HybridDrafter(NgramDrafter(block_size=6), block, skip_block_at=0.5)
    out = SpeculativeDecoder(m, hybrid, tree="ddtree", budget=8,
                             policy=RatioGate(min_expected_accepted=0.0)).generate(
        prompt, max_new_tokens=30)
    assert out.token_ids == reference
    assert hybrid.block_skips > 0 and block.calls > 0
    # and a law policy that declines to draft: the decoder keeps the features for the next drafting round
    seen = SpeculativeDecoder(m, CountingBlock(), tree="chain", policy=params(1.0)).generate(prompt, max_new_tokens=30)
    middle = float(np.median([r.policy["window_entropy"] for r in seen.rounds[1:]]))
    policy = params(1.0, depths=4)  # drafting pays below the median window entropy, never above it
    policy["entropy_grid"] = [0.0, middle, middle * 1.0001 + 1e-6, 50.0]
    policy["acceptance"] = [[1.0] * 4, [1.0] * 4, [0.0] * 4, [0.0] * 4]
    block = CountingBlock()
    out = SpeculativeDecoder(m, block, tree="chain", policy=policy).generate(prompt, max_new_tokens=30)
    assert out.token_ids == reference
    drafted = [r.policy["draft"] for r in out.rounds[1:]]
    assert block.calls == sum(drafted) and 0 < sum(drafted) < len(drafted), drafted


def test_merge_leaves_a_lone_proposal_unscaled():
    from entropy_law.drafters.hybrid import merge_proposals
    block = DraftProposal(tokens=torch.tensor([[6, 5], [2, 3]]), logprobs=torch.log(torch.tensor([[0.5, 0.3],
                                                                                               [0.4, 0.3]])))
    for merged in (merge_proposals(DraftProposal.empty(), block, weight=0.5, top_k=8),
                   merge_proposals(block, DraftProposal.empty(), weight=0.5, top_k=8)):
        assert torch.equal(merged.tokens, block.tokens) and torch.equal(merged.logprobs, block.logprobs)


def hybrid_params(ngram: dict, block: dict) -> dict:
    from entropy_law.payoff.policy import hybrid_policy
    return hybrid_policy(ngram, block)


def split_law(middle: float, low: float, high: float, **kwargs) -> dict:
    """A law of acceptance ``low`` below the window entropy ``middle`` and ``high`` above it."""
    law = params(1.0, depths=4, **kwargs)
    law["entropy_grid"] = [0.0, middle, middle * 1.0001 + 1e-6, 50.0]
    law["acceptance"] = [[low] * 4, [low] * 4, [high] * 4, [high] * 4]
    return law


@pytest.mark.parametrize("tree,budget", [("chain", None), ("ddtree", 12)])
def test_hybrid_policy_runs_the_drafter_whose_law_pays_more(tmp_path, tree, budget):
    """Each round runs the drafter whose law gives the higher rate before drafting: the block forward only on
    its rounds, the n-gram proposal alone on the others, none where neither pays; output equal to greedy; the
    route is recorded; each law's calibration counts only the rounds it chose."""
    from entropy_law.drafters.block import BlockDrafter
    from entropy_law.drafters.hybrid import HybridDrafter
    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(9), 96, 5) * 4  # repeats: the n-gram drafter matches
    reference = greedy(m, prompt, 30)

    def run(policy, name):
        block = BlockDrafter(m, seed=0, block_size=5, num_layers=1)
        hybrid = HybridDrafter(NgramDrafter(block_size=6), block, skip_block_at=0.0)
        with TraceRecorder(tmp_path / name, model_id="tiny", drafter_id="hybrid", tree_policy=tree) as rec:
            out = SpeculativeDecoder(m, hybrid, tree=tree, budget=budget, policy=make_policy(policy, COST),
                                     observers=[RecorderObserver(rec)]).generate(prompt, max_new_tokens=30,
                                                                                 request_id="r0", category="c")
        assert out.token_ids == reference, name
        decode = [r for r in out.rounds if r.round_index > 0]
        return hybrid, decode, load_traces(tmp_path / name).rounds

    # the block law promises everything, the n-gram law nothing: every round runs the block forward
    hybrid, decode, _ = run(hybrid_params(params(0.0), params(1.0)), "block")
    decode = [r for r in decode if r.policy["block_law_rate"] > 1]  # not the last round: no room to draft there
    assert {r.policy["route"] for r in decode} == {"block"} and all(r.policy["draft"] for r in decode)
    assert hybrid.block_calls == len(decode) >= 3 and hybrid.block_skips == 0
    # the reverse (the hybrid's own rule, skip_block_at = 0, would run the block drafter where prompt lookup
    # finds nothing): the block forward never runs
    hybrid, decode, _ = run(hybrid_params(params(1.0), params(0.0)), "ngram")
    assert {r.policy["route"] for r in decode} == {"ngram"} and hybrid.block_calls == 0
    # equal laws: the drafter's own cost decides (the block forward costs ten one-token forwards here: it never
    # pays, not even where prompt lookup finds nothing)
    hybrid, decode, _ = run(hybrid_params(params(0.9), params(0.9, draft_cost=10.0)), "cost")
    assert {r.policy["route"] for r in decode} == {"ngram"} and hybrid.block_calls == 0
    paying = [r for r in decode if r.policy["ngram_law_rate"] > 1]
    assert len(paying) >= 3 and all(r.policy["block_law_rate"] < r.policy["ngram_law_rate"] for r in paying)
    # the n-gram law's chain goes no deeper than prompt lookup's proposal, known before choosing
    for r in decode:
        d = r.policy["ngram_depth"]
        best = max([1.0] + [(1 + sum(0.9 ** j for j in range(1, k + 1))) / COST(k + 1) for k in range(1, d + 1)])
        assert r.policy["ngram_law_rate"] == pytest.approx(best), d
    assert {r.policy["ngram_depth"] for r in decode} >= {1, 5}  # shallow matches and full ones
    # prompt lookup finds nothing (4-grams of a prompt without repeats): the block drafter runs although the
    # n-gram law promises more, and no round "drafts" an empty n-gram proposal
    block = BlockDrafter(m, seed=0, block_size=5, num_layers=1)
    lone = HybridDrafter(NgramDrafter(block_size=6, min_ngram=4), block, skip_block_at=0.0)
    novel = list(range(3, 40))
    out = SpeculativeDecoder(m, lone, tree=tree, budget=budget,
                             policy=make_policy(hybrid_params(params(1.0), params(0.9)), COST)).generate(
        novel, max_new_tokens=20)
    assert out.token_ids == greedy(m, novel, 20)
    decode = [r for r in out.rounds if r.round_index > 0 and r.policy["draft"]]
    assert lone.block_calls >= 1 and all(r.tree_nodes > 0 for r in decode if r.policy["route"] == "ngram")
    # neither pays: no drafter runs
    hybrid, decode, _ = run(hybrid_params(params(0.0), params(0.0)), "none")
    assert not any(r.policy["draft"] for r in decode) and hybrid.block_calls == hybrid.block_skips == 0
    # the n-gram law pays below the median window entropy, the block law above it: both routes, each law
    # calibrated on its own rounds only
    seen = SpeculativeDecoder(m, NgramDrafter(block_size=6), tree="chain",
                              policy=make_policy(params(1.0), COST)).generate(prompt, max_new_tokens=30)
    middle = float(np.median([r.policy["window_entropy"] for r in seen.rounds[1:]]))
    policy = hybrid_params(split_law(middle, 1.0, 0.0, calibration=1.0), split_law(middle, 0.0, 1.0, calibration=1.0))
    hybrid, decode, rounds = run(policy, "split")
    routes = [r.policy["route"] for r in decode]
    assert {"ngram", "block"} <= set(routes), routes
    assert hybrid.block_calls == sum(r.policy["draft"] and route == "block" for r, route in zip(decode, routes))
    for i, r in enumerate(decode):
        own = [e for e in decode[:i] if e.policy["route"] == r.policy["route"] and e.policy["budget"]]
        assert r.policy["calibration_sums"][0] == pytest.approx(sum(e.accepted for e in own))
    recorded = rounds.loc[rounds["round_index"] > 0, "policy_route"].tolist()
    assert recorded == routes


def test_hybrid_policy_refuses_another_drafter_and_a_law_of_another_drafter():
    from entropy_law.drafters.block import BlockDrafter
    from entropy_law.drafters.hybrid import HybridDrafter
    m = model()
    block = BlockDrafter(m, seed=0, block_size=5, num_layers=1)
    with pytest.raises(ValueError, match="routes a HybridDrafter"):
        SpeculativeDecoder(m, NgramDrafter(), tree="chain",
                           policy=make_policy(hybrid_params(params(0.5), params(0.5)), COST))
    wrong = {**params(0.5), "drafter_id": "block-drafter-b9-l3"}  # another block drafter's law
    with pytest.raises(ValueError, match="fitted for drafter 'block-drafter-b9-l3'"):
        SpeculativeDecoder(m, HybridDrafter(NgramDrafter(), block), tree="chain",
                           policy=make_policy(hybrid_params(params(0.5), wrong), COST))
    with pytest.raises(ValueError, match="not a law policy"):
        hybrid_params(params(0.5), {"kind": "something else"})
    with pytest.raises(ValueError, match="a hybrid drafter's policy parameters"):  # replays take one drafter's law
        LawPolicy(hybrid_params(params(0.5), params(0.5)), COST)
    # what a run stores: both laws, priced by the one curve in use
    dec = SpeculativeDecoder(m, HybridDrafter(NgramDrafter(), block), tree="chain",
                             policy=make_policy(hybrid_params(params(0.5), params(0.4, draft_cost=0.3)), COST))
    stored = json.loads(json.dumps(dec.config["policy"]))
    assert stored["kind"] == "entropy_law_hybrid_policy"
    assert stored["block"]["draft_cost"] == 0.3 and stored["ngram"]["acceptance"][0][0] == 0.5
    assert stored["ngram"]["verify_cost"] == stored["block"]["verify_cost"] == COST.to_config()


def test_hybrid_parameters_are_saved_loaded_and_borrowed_side_by_side(tmp_path):
    """A hybrid policy file loads only where a hybrid decoder is meant (``load_policy(hybrid=True)``: record --drafter
    hybrid); borrowing relabels both laws (any drafter, the given checkpoint on the block side, any target) and keeps
    what each was fitted for; another drafter's id is refused."""
    from entropy_law.payoff.policy import borrow_policy, load_policy, save_policy

    ngram = {**params(0.5), "drafter_id": "ngram", "model_id": ["smollm2-135m"]}
    block = {**params(0.4), "drafter_id": "block-drafter-b8-l2", "checkpoint_sha256": "ab" * 32,
             "model_id": ["smollm2-135m"]}
    path = save_policy(hybrid_params(ngram, block), tmp_path / "hybrid.json")
    with pytest.raises(ValueError, match="only a decoder of the hybrid drafter runs it"):
        load_policy(path)
    assert load_policy(path, hybrid=True) == hybrid_params(ngram, block)
    broken = save_policy({**hybrid_params(ngram, block), "block": {"kind": "other"}}, tmp_path / "broken.json")
    with pytest.raises(ValueError, match="block drafter's parameters are not a law policy"):
        load_policy(broken, hybrid=True)
    borrowed = borrow_policy(load_policy(path, hybrid=True), None, "cd" * 32, model_id=None)
    assert borrowed["kind"] == "entropy_law_hybrid_policy"
    assert borrowed["ngram"]["drafter_id"] is None and borrowed["block"]["drafter_id"] is None
    assert borrowed["block"]["checkpoint_sha256"] == "cd" * 32 and borrowed["ngram"]["model_id"] is None
    assert borrowed["block"]["borrowed_from"] == {"drafter_id": "block-drafter-b8-l2", "checkpoint_sha256": "ab" * 32,
                                                  "model_id": ["smollm2-135m"]}
    with pytest.raises(ValueError, match="drives the hybrid drafter"):
        borrow_policy(hybrid_params(ngram, block), "ngram")


def test_a_law_policy_arm_replayed_over_an_ar_run_decodes_its_online_rounds(tmp_path, monkeypatch):
    """``jobs.reference.workload_rounds`` with a law-policy arm: its stored parameters and cost curve, and the AR
    run's target entropies, reproduce the rounds the policy decoded online, request by request. The recording's
    verify-cost curve is fixed (the tiny model's, ``FLAT_COST``), not timed: on a loaded machine a
    timed curve can make every draft look too dear, and then the policy never drafts and there is nothing to compare."""
    from test_cli_record import FLAT_COST

    monkeypatch.setattr("entropy_law.jobs.record.measure_verify_cost", lambda adapter: FLAT_COST)
    import pandas as pd
    from test_cli_record import make_tiny_model_folder

    from entropy_law.cli import main
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import workload_rounds
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.payoff.workload import round_counts
    from entropy_law.traces.reader import load_traces

    folder = make_tiny_model_folder(tmp_path / "model")
    tasks = tmp_path / "tasks.jsonl"
    prompts = {1: "the cat sat on the mat the cat sat on the mat", 2: "red blue green red blue green red",
               3: "one two three one two three one two"}
    tasks.write_text("".join(json.dumps({"question_id": q, "category": "alpha", "turns": [t]}) + "\n"
                             for q, t in prompts.items()))
    law = save_policy(params(0.8, slope=True), tmp_path / "law.json")
    base = ["record", "--model", str(folder), "--tasks", str(tasks), "--max-new-tokens", "12", "--block-size", "4",
            "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "ar"), "--drafter", "ar"]) == 0
    assert main([*base, "--out", str(tmp_path / "law"), "--tree", "ddtree", "--budget", "6", "--policy", "law",
                 "--policy-law", str(law)]) == 0
    meta = json.loads((tmp_path / "law" / "run.json").read_text())
    replayed = workload_rounds(tmp_path / "ar", meta, load_target(str(folder)))
    analysis = TraceAnalysis(load_traces(tmp_path / "law"), n_boot=0)
    online = round_counts(analysis.view, analysis.arms[0])
    assert replayed.attrs["gate"].startswith("the arm's law policy")
    columns = ["request_id", "tokens", "rounds", "drafting_rounds", "nodes", "accepted", "skipped_rounds"]
    assert len(online) == 3 and online["drafting_rounds"].sum() > 0
    assert online["skipped_rounds"].sum() > 0  # rounds where the policy did not call the drafter, counted alike
    pd.testing.assert_frame_equal(replayed[columns].sort_values("request_id").reset_index(drop=True),
                                  online[columns].sort_values("request_id").reset_index(drop=True), check_dtype=False)


def test_the_policy_command_fits_and_saves_an_arms_law_policy(tmp_path, capsys, timed_analysis):
    """``entropy-law policy TRACES --drafter ARM --out FITTED.json``: the arm's runs (with the AR run beside them)
    give the same parameters as ``fit_policy`` on them, its draft cost timed against the AR run's rounds (t_AR from
    the AR run, not from the drafter's own rounds without a draft); the file loads with ``load_policy``. Bad input:
    an existing --out without --overwrite, several arms without --drafter, an unknown arm, a negative cost."""
    import shutil
    from pathlib import Path

    from entropy_law.cli import main

    timed = Path(__file__).resolve().parents[1] / "data" / "traces_timed"
    out = tmp_path / "law.json"
    assert main(["policy", str(timed), "--drafter", "ngram ddtree16", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    got = load_policy(out)
    an = timed_analysis  # TraceAnalysis(load_traces(timed)): its runs and t_AR do not depend on n_boot
    ids = list(an.runs.loc[(an.runs["arm"] == "ngram ddtree16") | an.runs["is_ar"], "run_id"])
    direct = fit_policy(an.traces.filter(run_id=ids), drafter="ngram")
    assert got["acceptance"] == direct["acceptance"] and got["draft_cost"] == pytest.approx(direct["draft_cost"])
    assert got["fitted_on"]["requests"] == 40 and got["drafter_id"] == "ngram"
    import re

    printed_t_ar = float(re.search(r"draft_ms / ar_ms_per_token = [\d.]+ / ([\d.]+) \(estimated from (\d+) auto",
                                   printed).group(1))
    assert printed_t_ar == pytest.approx(an.ar_ms_per_token(), rel=0.03)  # the AR run's decode ms per token
    # the block drafter's rounds without a draft still run its forward (13 ms): not AR steps
    assert main(["policy", str(timed), "--drafter", "block-drafter-b8-l2-copy ddtree16", "--out",
                 str(tmp_path / "block.json")]) == 0
    block_t_ar = float(re.search(r"ar_ms_per_token = [\d.]+ / ([\d.]+) \(", capsys.readouterr().out).group(1))
    block_runs = an.runs.loc[an.runs["arm"] == "block-drafter-b8-l2-copy ddtree16", "drafter_config"]
    assert load_policy(tmp_path / "block.json")["checkpoint_sha256"] == block_runs.iloc[0]["checkpoint_sha256"]
    assert got["checkpoint_sha256"] is None  # the n-gram drafter has no checkpoint
    assert block_t_ar == pytest.approx(an.ar_ms_per_token(), rel=0.03)
    assert f"written to {out}" in printed and f"--policy {out}" in printed
    assert main(["policy", str(timed), "--drafter", "ngram ddtree16", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    two_arms = tmp_path / "two-arms"  # the arm errors need several arms, not the whole timed set
    for run in ("ngram", "ngram-ddtree16"):
        shutil.copytree(timed / run, two_arms / run)
    assert main(["policy", str(two_arms), "--out", str(tmp_path / "b.json")]) == 2
    assert "pass --drafter" in capsys.readouterr().err
    assert main(["policy", str(two_arms), "--drafter", "nope", "--out", str(tmp_path / "c.json")]) == 2
    assert "no drafting arm 'nope'" in capsys.readouterr().err
    assert main(["policy", str(timed), "--drafter", "ngram chain", "--draft-cost", "-1",
                 "--out", str(tmp_path / "d.json")]) == 2
    assert "--draft-cost must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "d.json").exists()


class NamedDrafter(NgramDrafter):
    """An n-gram drafter under another id, as if loaded from a checkpoint with SHA-256 ``sha``."""

    def __init__(self, drafter_id, sha=None):
        super().__init__(block_size=6)
        self.drafter_id = drafter_id
        self.provenance = {"checkpoint_sha256": sha} if sha else {}


def test_a_policy_fitted_for_another_drafter_or_checkpoint_is_refused_unless_borrowed():
    """`record --policy law --policy-law ngram.json --drafter block` applied the n-gram drafter's law to the block
    drafter without a word, and a policy fitted on one block checkpoint to another; both are refused now, before
    anything is measured, online and in a replay, and ``borrow_policy`` applies one knowingly (kept in the run)."""
    from entropy_law.payoff.policy import borrow_policy

    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(4), 96, 8)
    reference = greedy(m, prompt, 12)
    law = {**params(0.8), "drafter_id": "block-a", "checkpoint_sha256": "a" * 64}
    for drafter, match in ((NamedDrafter("ngram"), "fitted for drafter 'block-a', the decoder's drafter is 'ngram'"),
                           (NamedDrafter("block-a", "b" * 64), r"checkpoint sha256:aaaaaaaaaaaa, this one is "
                                                              r"sha256:bbbbbbbbbbbb")):
        with pytest.raises(ValueError, match=match):
            SpeculativeDecoder(m, drafter, tree="chain", policy=law)
        with pytest.raises(ValueError, match="borrow_policy"):
            replay_rounds(prompt, reference, drafter, "chain", None, policy=law)
        borrowed = borrow_policy(law, drafter.drafter_id, drafter.provenance.get("checkpoint_sha256"))
        assert borrowed["borrowed_from"] == {"drafter_id": "block-a", "checkpoint_sha256": "a" * 64}
        out = SpeculativeDecoder(m, drafter, tree="chain", policy=borrowed).generate(prompt, max_new_tokens=12)
        assert out.token_ids == reference
        assert out.config["policy"]["borrowed_from"]["drafter_id"] == "block-a"
    # the same drafter and checkpoint, or parameters that name neither (made by hand, or older ones): accepted
    SpeculativeDecoder(m, NamedDrafter("block-a", "a" * 64), tree="chain", policy=law)
    SpeculativeDecoder(m, NamedDrafter("ngram"), tree="chain", policy=params(0.8))
    SpeculativeDecoder(m, NamedDrafter("ngram"), tree="chain", policy=borrow_policy(law, None))


def test_a_policy_fitted_on_another_target_is_refused_unless_borrowed():
    """A law maps one target's entropies to acceptance; `bench/policy.py policy --model other` and `record --policy law
    --model other` applied the reference traces' law (smollm2-135m) to another target without a word. A decoder on
    a loaded target now refuses parameters fitted on other targets' traces; ``borrow_policy(model_id=None)`` (or
    the target's id) applies them knowingly and the run keeps where they came from."""
    from entropy_law.decoding.loading import LoadedTarget
    from entropy_law.payoff.policy import borrow_policy

    m = model()
    prompt = random_prompt(torch.Generator().manual_seed(5), 96, 8)
    reference = greedy(m, prompt, 12)
    law = {**params(0.8), "drafter_id": "ngram", "model_id": ["model-a"]}

    def loaded(name):
        return LoadedTarget(model=m, tokenizer=None, model_id=name, source="test", dtype=torch.float32)

    with pytest.raises(ValueError, match=r"fitted on traces of target model-a, this decoder's target is 'model-b'.*"
                                         r"model_id=None"):
        SpeculativeDecoder(loaded("model-b"), NamedDrafter("ngram"), tree="chain", policy=law)
    with pytest.raises(ValueError, match="model-a"):  # a borrow for another drafter keeps the target check
        SpeculativeDecoder(loaded("model-b"), NamedDrafter("ngram"), tree="chain", policy=borrow_policy(law, None))
    for borrowed in (borrow_policy(law, None, model_id=None), borrow_policy(law, "ngram", model_id="model-b")):
        out = SpeculativeDecoder(loaded("model-b"), NamedDrafter("ngram"), tree="chain",
                                 policy=borrowed).generate(prompt, max_new_tokens=12)
        assert out.token_ids == reference
        assert out.config["policy"]["borrowed_from"]["model_id"] == ["model-a"]
    # its own target, a bare module (whose name is only its class) and parameters naming no target: accepted
    SpeculativeDecoder(loaded("model-a"), NamedDrafter("ngram"), tree="chain", policy=law)
    SpeculativeDecoder(m, NamedDrafter("ngram"), tree="chain", policy=law)
    SpeculativeDecoder(loaded("model-b"), NamedDrafter("ngram"), tree="chain", policy=params(0.8))


def test_fit_policy_keeps_the_checkpoint_and_refuses_runs_of_several():
    """A policy names the checkpoint its runs were decoded with; runs of one drafter id with two checkpoints (the
    default and the broad block drafter share an architecture and an id) are not pooled into one law."""
    reference = load_traces(Path(__file__).resolve().parents[1] / "data" / "traces")  # block chain and DDTree16
    runs = reference.runs
    block = runs.loc[runs["drafter_id"].str.startswith("block")]
    assert len(block) >= 2 and block["drafter_config"].map(lambda c: c["checkpoint_sha256"]).nunique() == 1
    other = runs.copy()
    first = other.index[other["drafter_id"].str.startswith("block")][0]
    other.at[first, "drafter_config"] = {**other.at[first, "drafter_config"], "checkpoint_sha256": "f" * 64}
    mixed = SimpleNamespace(tokens=reference.tokens, rounds=reference.rounds, runs=other)
    with pytest.raises(ValueError, match=r"hold 2 checkpoints \(sha256 .*ffffffffffff\): a policy is for one"):
        fit_policy(mixed, drafter=block["drafter_id"].iloc[0], draft_cost=0.2)
