"""The law policy's copyability input: the context's suffix-match length before each round.

``decoding.policy.context_match_length`` against a brute force; ``LawPolicy`` reads the table of the round's level
(and refuses malformed tables); ``payoff.policy.fit_policy(context_match=)`` recovers per-level laws drawn from known
rates, and merges sparse levels; online decoding with such a policy stays greedy, records the length it decided
from, and its rounds replayed over an AR run of the same prompts (``jobs.reference.workload_rounds``) are the rounds
it decoded, with ``jobs.reference.context_matches`` giving the lengths it saw; ``entropy-law policy --context-match``
fits what ``fit_policy`` fits.
"""

import json
import math
import random
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from entropy_law.decoding.gate import VerifyCost
from entropy_law.decoding.policy import LawPolicy, context_match_length
from entropy_law.payoff.policy import context_levels, fit_policy, level_index, save_policy

pytestmark = pytest.mark.usefixtures("single_thread")

COST = VerifyCost((1, 2, 4, 8, 16, 32), (1.0, 1.3, 1.6, 2.2, 3.4, 6.0))
GRID = [0.001, 0.01, 0.1, 1.0, 4.0]


def brute_force(tokens, max_length):
    n, best = len(tokens), 0
    for k in range(1, min(max_length, n - 1) + 1):
        suffix = tokens[n - k:]
        if any(tokens[i - k + 1:i + 1] == suffix for i in range(k - 1, n - 1)):
            best = k
    return best


@pytest.mark.parametrize("seed", range(20))
def test_context_match_length_equals_a_brute_force(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(1 + seed % 4) for _ in range(rng.randrange(0, 40))]
    for max_length in (1, 3, 8):
        for end in range(len(tokens) + 1):
            assert context_match_length(tokens, max_length, end=end) == brute_force(tokens[:end], max_length)
    assert context_match_length([5, 6, 7, 5, 6, 7], 8) == 3  # "5 6 7" occurred before, "7 5 6 7" did not
    assert context_match_length([1, 2, 3], 8) == 0 and context_match_length([4], 8) == 0


def context_params(levels, acceptance, *, depths=4, max_length=8):
    """Policy parameters (flat plain table 0.5) with one flat table per copyability level."""
    flat = [[0.5] * depths for _ in GRID]
    return {"kind": "entropy_law_policy", "version": 1, "window": 3, "entropy_grid": GRID,
            "depths": list(range(1, depths + 1)), "acceptance": flat, "confidence_weight": 0.0, "draft_cost": 0.0,
            "default_entropy": 0.5, "verify_cost": COST.to_config(),
            "context_match": {"max_length": max_length, "levels": list(levels),
                              "acceptance": [[[float(a)] * depths for _ in GRID] for a in acceptance]}}


def test_the_policy_reads_the_table_of_the_rounds_copyability_level():
    policy = LawPolicy(context_params([0, 2], [0.0, 0.95]), COST)
    assert policy.uses_context
    fresh = policy.before_draft([0.5] * 6, 6, 4, context=[1, 2, 3, 4, 5, 6])  # nothing repeats: level 0
    assert fresh["context_match"] == 0 and fresh["draft"] is False
    repeated = policy.before_draft([0.5] * 6, 6, 4, context=[7, 8, 9, 1, 7, 8])  # "7 8" occurred: level 2
    assert repeated["context_match"] == 2 and repeated["draft"] is True
    assert repeated["acceptance"] == pytest.approx([0.95] * 4)
    once = policy.before_draft([0.5] * 6, 6, 4, context=[7, 3, 9, 1, 4, 7])  # length 1: the level below, 0
    assert once["context_match"] == 1 and once["acceptance"] == pytest.approx([0.0] * 4)
    with pytest.raises(ValueError, match="context="):
        policy.before_draft([0.5] * 6, 6, 4)
    lowest = LawPolicy(context_params([2, 5], [0.3, 0.9]), COST)  # a length below every level: the first one's
    assert lowest.law_acceptance(0.5, context_match=0) == pytest.approx([0.3] * 4)
    assert lowest.law_acceptance(0.5, context_match=7) == pytest.approx([0.9] * 4)
    assert lowest.law_acceptance(0.5) == pytest.approx([0.5] * 4)  # no length given: the plain table


@pytest.mark.parametrize("change, message", [
    (lambda p: p["context_match"].update(levels=[0, 0]), "levels"),
    (lambda p: p["context_match"].update(levels=[0, 9]), "levels"),
    (lambda p: p["context_match"].update(max_length=0), "max_length"),
    (lambda p: p["context_match"].update(acceptance=[[[0.5] * 4] * 5]), r"2 levels x 5 entropies x 4 depths"),
    (lambda p: p["context_match"].update(acceptance=[[[1.5] * 4] * 5] * 2), "probabilities"),
    (lambda p: p.update(context_match={"levels": [0]}), "max_length"),
])
def test_malformed_copyability_tables_are_refused(change, message):
    params = context_params([0, 2], [0.1, 0.9])
    change(params)
    with pytest.raises(ValueError, match=message):
        LawPolicy(params, COST)


def simulated(rng, rates, n_requests=40):
    """Chain rounds (depth 5) whose acceptance is exp(-rate[m] H_w^1.2), m the copyability level at the round's
    start: 0 or 4 in alternating stretches of 25 positions. Returns (traces, the per-position lengths)."""
    tokens, rounds, lengths = [], [], []
    for q in range(n_requests):
        h = rng.gamma(0.6, 1.5, size=400)
        m = np.where((np.arange(400) // 25 + q) % 2 == 0, 0, 4)
        lengths.append(pd.DataFrame({"run_id": "run", "request_id": f"q{q}", "position": np.arange(400),
                                     "context_match": m}))
        tokens.append(dict(request_id=f"q{q}", round_index=0, position=0, depth=1, role="bonus",
                           target_entropy_nats=h[0]))
        rounds.append(dict(request_id=f"q{q}", round_index=0, tree_depth=0))
        pos, r = 1, 1
        while pos < 300:
            hw = h[max(0, pos - 3):pos].mean()
            a = math.exp(-rates[int(m[pos])] * hw ** 1.2)
            depth = 1
            while depth <= 5 and rng.random() < a:
                tokens.append(dict(request_id=f"q{q}", round_index=r, position=pos, depth=depth, role="accepted",
                                   target_entropy_nats=h[pos]))
                pos, depth = pos + 1, depth + 1
            tokens.append(dict(request_id=f"q{q}", round_index=r, position=pos, depth=depth,
                               role="bonus" if depth > 5 else "correction", target_entropy_nats=h[pos]))
            rounds.append(dict(request_id=f"q{q}", round_index=r, tree_depth=5))
            pos, r = pos + 1, r + 1
    tokens = pd.DataFrame(tokens).assign(run_id="run", category="c", target_top1_prob=0.5, target_logit_gap=1.0)
    tokens["target_renyi2_nats"] = tokens["target_entropy_nats"]
    runs = pd.DataFrame({"run_id": ["run"], "drafter_id": ["sim"], "model_id": ["m"], "tree_policy": ["chain"]})
    traces = SimpleNamespace(tokens=tokens, rounds=pd.DataFrame(rounds).assign(run_id="run"), runs=runs)
    return traces, pd.concat(lengths, ignore_index=True)


def test_fit_policy_recovers_the_law_of_each_copyability_level(tmp_path):
    traces, lengths = simulated(np.random.default_rng(0), {0: 0.8, 4: 0.1})
    fitted = fit_policy(traces, window=3, draft_cost=0.01, context_match=lengths)
    spec = fitted["context_match"]
    assert spec["levels"] == [0, 4] and spec["max_length"] == 8
    assert spec["trials"]["0"] > 1000 and spec["trials"]["4"] > 1000
    grid = np.array(fitted["entropy_grid"])
    at = (grid > 0.05) & (grid < 3.0)  # where the simulated window entropies lie
    for level, rate in ((0, 0.8), (1, 0.1)):
        table = np.array(spec["acceptance"][level])
        assert np.abs(table[at, 0] - np.exp(-rate * grid[at] ** 1.2)).max() < 0.08
    policy = LawPolicy(json.loads(save_policy(fitted, tmp_path / "p.json").read_text()), COST)
    assert policy.law_acceptance(1.0, context_match=6)[0] == pytest.approx(
        float(np.interp(np.log(1.001), np.log(grid + 1e-3), np.array(spec["acceptance"][1])[:, 0])), abs=1e-6)
    with pytest.raises(ValueError, match="lacks the start"):
        fit_policy(traces, window=3, draft_cost=0.01, context_match=lengths.iloc[:100])
    with pytest.raises(ValueError, match="columns"):
        fit_policy(traces, window=3, draft_cost=0.01, context_match=lengths.drop(columns="position"))


def test_sparse_copyability_levels_join_their_neighbours():
    assert context_levels(np.array([0] * 500 + [1] * 10 + [2] * 300), 200) == [0, 2]
    assert context_levels(np.array([0] * 5 + [3] * 400 + [8] * 250), 200) == [3, 8]  # a sparse lowest level
    assert context_levels(np.array([1] * 50), 200) == [1]
    assert level_index([0, 2, 5], [0, 1, 2, 4, 5, 8]).tolist() == [0, 0, 1, 1, 2, 2]
    assert level_index([3, 8], [0, 3, 7, 8]).tolist() == [0, 0, 0, 1]


def test_a_copyability_policy_decodes_greedily_and_replays_its_online_rounds(tmp_path, monkeypatch, capsys):
    """Online with a policy whose level-0 table never drafts and whose level-1 table always does: the output is
    the greedy output, each round records the length it decided from, drafting happens exactly at rounds whose
    context repeats its last token; the rounds replayed over an AR run are the online rounds, and the lengths of
    ``context_matches`` over the AR run are the ones the online rounds recorded. ``entropy-law policy
    --context-match`` then fits the run's arm as ``fit_policy`` does with those lengths."""
    from test_cli_record import FLAT_COST, make_tiny_model_folder

    from entropy_law.cli import main
    from entropy_law.decoding.loading import load_target
    from entropy_law.jobs.reference import context_matches, workload_rounds
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.payoff.workload import round_counts
    from entropy_law.traces.reader import load_traces

    monkeypatch.setattr("entropy_law.jobs.record.measure_verify_cost", lambda adapter: FLAT_COST)
    folder = make_tiny_model_folder(tmp_path / "model")
    tasks = tmp_path / "tasks.jsonl"
    prompts = {1: "the cat sat on the mat the cat sat on the mat", 2: "red blue green red blue green red",
               3: "one two three one two three one two", 4: "sun moon day night sun moon"}
    tasks.write_text("".join(json.dumps({"question_id": q, "category": "alpha" if q < 3 else "beta", "turns": [t]})
                             + "\n" for q, t in prompts.items()))
    law = save_policy({**context_params([0, 1], [0.0, 0.95], depths=3), "drafter_id": "ngram"},
                      tmp_path / "law.json")
    base = ["record", "--model", str(folder), "--tasks", str(tasks), "--max-new-tokens", "12", "--block-size", "4",
            "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "ar"), "--drafter", "ar"]) == 0
    assert main([*base, "--out", str(tmp_path / "law"), "--tree", "ddtree", "--budget", "6", "--policy", "law",
                 "--policy-law", str(law)]) == 0
    target = load_target(str(folder))
    ar, online = load_traces(tmp_path / "ar"), load_traces(tmp_path / "law")
    assert sorted(online.tokens.groupby("request_id")["token_id"].apply(list)) == sorted(
        ar.tokens.groupby("request_id")["token_id"].apply(list))  # lossless
    rounds = online.rounds.loc[online.rounds["round_index"] > 0]
    assert rounds["policy_context_match"].notna().all()
    assert not rounds.loc[rounds["policy_context_match"] == 0, "policy_drafted"].any()  # level 0 never drafts
    assert rounds.loc[rounds["policy_context_match"] >= 1, "policy_drafted"].any()
    assert (rounds["policy_context_match"] == 0).any()
    lengths = context_matches(tmp_path / "ar", target)
    seen = rounds.assign(request_id=rounds["request_id"].astype(str)).merge(
        lengths.rename(columns={"position": "start_position"}), on=["request_id", "start_position"])
    assert len(seen) == len(rounds) and (seen["policy_context_match"] == seen["context_match"]).all()
    meta = json.loads((tmp_path / "law" / "run.json").read_text())
    replayed = workload_rounds(tmp_path / "ar", meta, target)
    analysis = TraceAnalysis(online, n_boot=0)
    counts = round_counts(analysis.view, analysis.arms[0])
    columns = ["request_id", "tokens", "rounds", "drafting_rounds", "nodes", "accepted", "skipped_rounds"]
    pd.testing.assert_frame_equal(replayed[columns].sort_values("request_id").reset_index(drop=True),
                                  counts[columns].sort_values("request_id").reset_index(drop=True), check_dtype=False)

    # the command line: the arm's lengths rebuilt from its prompts, then fit_policy
    ngram = tmp_path / "ngram"
    assert main([*base, "--out", str(ngram), "--tree", "ddtree", "--budget", "6", "--verify-cost-ratio", "1.0"]) == 0
    out = tmp_path / "fitted.json"
    assert main(["policy", str(ngram), "--out", str(out), "--draft-cost", "0.1", "--context-match",
                 "--min-level-trials", "1", "--model", str(folder)]) == 0
    assert "copyability" in capsys.readouterr().out
    direct = fit_policy(load_traces(ngram), draft_cost=0.1, context_match=context_matches(ngram, target),
                        min_level_trials=1)
    assert json.loads(out.read_text())["context_match"] == json.loads(json.dumps(direct["context_match"]))

    # the recorded runs hold the copyability (the recorder's tokens column context_match, from the prompt ids the
    # decoder passes): it equals the lengths rebuilt from the prompts, and the command reads it without --model
    recorded = load_traces(ngram).tokens.astype({"run_id": str, "request_id": str})
    both = recorded.merge(context_matches(ngram, target), on=["run_id", "request_id", "position"])
    assert len(both) == len(recorded) > 0 and (both["context_match_x"] == both["context_match_y"]).all()
    again = tmp_path / "fitted-recorded.json"
    assert main(["policy", str(ngram), "--out", str(again), "--draft-cost", "0.1", "--context-match",
                 "--min-level-trials", "1"]) == 0
    assert "recorded context_match column" in capsys.readouterr().out
    assert json.loads(again.read_text())["context_match"] == json.loads(out.read_text())["context_match"]

    # entropy-law law --context-match: the recorded column is read as is; with --model the lengths are rebuilt from
    # the prompts and must agree with the recorded ones (with_context_match refuses a clash). The copy law itself
    # needs more than these 39 positions (tests/test_law_copy.py fits it); the command runs with law_exp here
    from entropy_law.commands.law import with_context_match

    ngram_traces = load_traces(ngram)
    assert with_context_match(ngram_traces) is ngram_traces
    rebuilt = with_context_match(ngram_traces, str(folder)).tokens
    pd.testing.assert_series_equal(rebuilt["context_match"], ngram_traces.tokens["context_match"])
    for extra, said in (([], "recorded context_match column"), (["--model", str(folder)], "rebuilt from the prompts")):
        assert main(["law", str(ngram), "--family", "law_exp", "--context-match", *extra]) == 0
        assert said in capsys.readouterr().out
    assert main(["law", str(ngram), "--model", str(folder)]) == 2
    assert "--model and --tasks go with --context-match" in capsys.readouterr().err


@pytest.mark.parametrize("models, model, message", [
    (["smollm2-135m", "other-model"], None, r"name targets \['other-model', 'smollm2-135m'\]: pass --model"),
    ([], None, r"name targets none: pass --model"),
    (["smollm2-135m"], "/nonexistent/target-folder", r"cannot load the target '/nonexistent/target-folder'.*pass --model"),
])
def test_the_runs_target_names_what_to_pass_when_it_cannot_be_chosen_or_loaded(models, model, message):
    from entropy_law.jobs.reference import runs_target

    runs = pd.DataFrame({"run_id": [f"r{i}" for i in range(len(models))], "model_id": models})
    with pytest.raises(ValueError, match=message):
        runs_target(runs, model)
