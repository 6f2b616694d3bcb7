"""bench/policy.py ceiling: the oracles and the table policies it walks over a table of round outcomes.

Synthetic tables whose best decisions are known: a table policy whose input says exactly when drafting pays reaches
the oracle; one whose input says nothing is no better than the best fixed action; a cross-fitted table never
reads the outcomes of the requests it is scored on; the path oracle is the best walk there is (by brute force)
and at least the replay oracle."""

import numpy as np
import pandas as pd
import pytest

from conftest import load_bench

from entropy_law.decoding.gate import VerifyCost

BUDGETS = [0, 2, 8]
CURVE = VerifyCost((1, 2, 3, 9), (1.0, 1.5, 1.8, 3.0))


def _bench():
    return load_bench("policy")


def table(requests: dict[str, list[int]], n_starts: int = 40) -> pd.DataFrame:
    """Round outcomes where every start of request ``key`` is of a kind: kind 1 accepts 2 drafts at budget 2 and 5
    at budget 8, kind 0 none; the kinds alternate along the request in the pattern given. The window entropy is the
    kind (0.1 for kind 1, 2.0 for kind 0), the copyability 0, the confidence uninformative."""
    rows = []
    for key, pattern in requests.items():
        for s in range(1, n_starts + 1):
            kind = pattern[(s - 1) % len(pattern)]
            accepted = {0: 0, 2: 2 * kind, 8: 5 * kind}
            for b in BUDGETS:
                rows.append({"key": key, "request_id": key, "category": "c", "start_position": s, "budget": b,
                             "tree_nodes": b, "accepted": accepted[b], "committed": accepted[b] + 1,
                             "expected_accepted": 1.0 if b else 0.0, "window_entropy": 0.1 if kind else 2.0,
                             "context_match": 0})
    return pd.DataFrame(rows)


def test_oracles_walk_the_best_rounds_and_the_path_oracle_is_at_least_the_ratio_oracle():
    bench = _bench()
    actions = bench.Actions(table({"a": [1, 0, 0], "b": [0, 1]}), BUDGETS, CURVE, draft_cost=0.2)
    assert actions.names == ["plain step", "draft, verify none", "N=2", "N=8"]
    ratio = bench.ratio_oracle(actions)
    rows, acts = actions.walk(ratio)
    kinds = (actions.starts["window_entropy"].to_numpy()[rows] < 1).astype(int)
    assert (acts[kinds == 0] == 0).all() and (acts[kinds == 1] > 1).all()  # drafts exactly where it pays
    assert actions.rate(bench.path_oracle(actions)) >= actions.rate(ratio) - 1e-12
    # kind 1 at this cost: budget 2 commits 3 for 1.8 + 0.2 (rate 1.5), budget 8 commits 6 for 3.0 + 0.2 (1.875)
    assert set(acts[kinds == 1]) == {3}


def test_a_table_on_an_input_that_tells_the_kinds_apart_reaches_the_oracle_and_one_on_nothing_does_not():
    bench = _bench()
    actions = bench.Actions(table({"a": [1, 0, 0], "b": [0, 1], "c": [1, 1, 0], "d": [0, 0, 1]}), BUDGETS, CURVE,
                            draft_cost=0.2)
    oracle = actions.rate(bench.path_oracle(actions))
    told = bench.table_policy(actions, ("entropy",), bins=2, folds=2)
    assert actions.rate(told["in sample"]) == oracle and actions.rate(told["cross-fitted"]) == oracle
    blind = bench.table_policy(actions, ("copy",), bins=2, folds=2)["in sample"]
    fixed = max(actions.rate(np.full(len(actions.starts), a)) for a in range(4))
    assert actions.rate(blind) == fixed < oracle


def test_a_cross_fitted_table_never_reads_the_outcomes_of_the_requests_it_scores():
    """Two folds whose requests pay in opposite kinds: fitted on its own fold a table would draft where it pays;
    cross-fitted, each fold gets the other fold's decisions, which draft where drafting does not pay."""
    bench = _bench()
    frame = table({"a": [1, 0], "b": [1, 0]})
    other = frame["key"] == "b"  # request b (the second fold): its kinds' entropies swapped
    frame.loc[other, "window_entropy"] = np.where(frame.loc[other, "window_entropy"] < 1, 2.0, 0.1)
    actions = bench.Actions(frame, BUDGETS, CURVE, draft_cost=0.2)
    policies = bench.table_policy(actions, ("entropy",), bins=2, folds=2)
    oracle = actions.rate(bench.path_oracle(actions))
    assert actions.rate(policies["cross-fitted"]) < 1.0 < oracle
    # in sample, the pooled cells mix both requests: no better than its best fixed action, above the cross-fitted
    assert actions.rate(policies["in sample"]) > actions.rate(policies["cross-fitted"])


def test_the_path_oracle_is_the_best_walk_by_brute_force():
    """One request of 8 starts with outcomes drawn at random: every walk enumerated; the path oracle's rate is the
    highest of them all, and at least the replay oracle's."""
    bench = _bench()
    rng = np.random.default_rng(3)
    rows = []
    for s in range(1, 9):
        accepted = {0: 0, 2: int(rng.integers(0, 3)), 8: int(rng.integers(0, 6))}
        accepted[8] = max(accepted[8], accepted[2])
        rows += [{"key": "a", "request_id": "a", "category": "c", "start_position": s, "budget": b,
                  "tree_nodes": b, "accepted": min(accepted[b], 8 - s), "committed": min(accepted[b], 8 - s) + 1,
                  "expected_accepted": 0.0, "window_entropy": 1.0, "context_match": 0} for b in BUDGETS]
    actions = bench.Actions(pd.DataFrame(rows), BUDGETS, CURVE, draft_cost=0.3)

    def walks(s):  # (committed, cost) of every walk from start s to the end
        if ("a", s) not in actions.row_of:
            return [(0.0, 0.0)]
        i = actions.row_of[("a", s)]
        return [(actions.committed[i, a] + c, actions.cost[i, a] + k)
                for a in range(4) for c, k in walks(s + int(actions.committed[i, a]))]

    best = max(c / k for c, k in walks(1))
    assert actions.rate(bench.path_oracle(actions)) == pytest.approx(best, rel=1e-12)
    assert best >= actions.rate(bench.ratio_oracle(actions))


def test_a_cache_of_another_configuration_is_refused_not_mixed_in(tmp_path):
    bench = _bench()
    manifest = {"policy_sha256": "a" * 64, "arm": "/data/traces/block-ddtree16", "budgets": [0, 2], "verify_cost": None}
    bench.open_cache(tmp_path / "cache", manifest)
    bench.open_cache(tmp_path / "cache", manifest)  # the same configuration: reused
    with pytest.raises(SystemExit, match="policy_sha256 differ"):
        bench.open_cache(tmp_path / "cache", {**manifest, "policy_sha256": "b" * 64})
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "traces_open_timed.law.parquet").write_bytes(b"")
    with pytest.raises(SystemExit, match="not empty"):
        bench.open_cache(tmp_path / "old", manifest)


def two_drafters(requests: dict[str, list[int]], n_starts: int = 30) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Round outcomes of two drafters at the same starts: at kind 1 the first drafter accepts 2 / 5 drafts at budget
    2 / 8 and the second none, at kind 2 the reverse, at kind 0 neither; the window entropy tells the kinds apart
    (0.1, 1.0, 2.0 for kinds 1, 2, 0)."""
    frames = []
    for drafter in (1, 2):
        rows = []
        for key, pattern in requests.items():
            for s in range(1, n_starts + 1):
                kind = pattern[(s - 1) % len(pattern)]
                accepted = {0: 0, 2: 2 * (kind == drafter), 8: 5 * (kind == drafter)}
                rows += [{"key": key, "request_id": key, "category": "c", "start_position": s, "budget": b,
                          "tree_nodes": b, "accepted": accepted[b], "committed": accepted[b] + 1,
                          "expected_accepted": 1.0 if b else 0.0, "window_entropy": {0: 2.0, 1: 0.1, 2: 1.0}[kind],
                          "context_match": 0} for b in BUDGETS]
        frames.append(pd.DataFrame(rows))
    return frames[0], frames[1]


def test_the_route_oracle_drafts_each_round_with_the_drafter_that_pays_and_a_route_table_can_learn_it():
    """``either_drafter``: both drafters' actions at the same starts, each priced with its own drafter's cost. The route
    oracle drafts with the first drafter exactly at its kind, with the second at the second's, and beats either
    drafter's own oracle; a route table on an input that tells the kinds apart reaches it (in sample and cross-fitted),
    one on nothing does not; tables of different starts are refused."""
    bench = _bench()
    # one kind per request (a walk stays in its kind), each kind in both folds of the cross-fitted table
    first_table, second_table = two_drafters({"a": [1], "b": [1], "c": [2], "d": [2], "e": [0], "f": [0]})
    first = bench.Actions(first_table, BUDGETS, CURVE, draft_cost=0.2)
    second = bench.Actions(second_table, BUDGETS, CURVE, draft_cost=0.01)
    route = bench.either_drafter([first, second], ["block", "ngram"])
    assert route.names == ["plain step", "block draft, verify none", "block N=2", "block N=8",
                           "ngram draft, verify none", "ngram N=2", "ngram N=8"]
    assert route.groups == [[1, 2, 3], [4, 5, 6]]
    assert route.cost[0, 5] == pytest.approx(CURVE(3) + 0.01) and route.cost[0, 2] == pytest.approx(CURVE(3) + 0.2)
    oracle = bench.ratio_oracle(route)
    rows, acts = route.walk(oracle)
    entropy = route.starts["window_entropy"].to_numpy()[rows]
    assert set(acts[entropy == 0.1]) == {3} and set(acts[entropy == 1.0]) == {6} and set(acts[entropy == 2.0]) == {0}
    best = route.rate(bench.path_oracle(route))
    assert route.rate(oracle) > max(first.rate(bench.ratio_oracle(first)), second.rate(bench.ratio_oracle(second)))
    assert best >= route.rate(oracle) - 1e-12
    told = bench.table_policy(route, ("entropy",), bins=10, folds=2, drafters=[first, second])  # a bin per kind
    for how in ("in sample", "cross-fitted"):  # a table decides per kind, as the route oracle does here
        assert (told[how] == oracle).all()
    blind = bench.table_policy(route, ("copy",), bins=3, folds=2, drafters=[first, second])["in sample"]
    assert route.rate(blind) < route.rate(oracle)
    shorter = bench.Actions(two_drafters({"a": [1]}, n_starts=5)[1], BUDGETS, CURVE, draft_cost=0.01)
    with pytest.raises(ValueError, match="same round starts"):
        bench.either_drafter([first, shorter], ["block", "ngram"])
