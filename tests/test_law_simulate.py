"""The simulator: trace-format columns, consistent token statistics, bursty entropy, the law it claims."""

import subprocess
import sys

import numpy as np
import pytest

from entropy_law.law import atrisk
from entropy_law.analysis.simulate import TreeSpec, distribution_summary, simulate_traces
from entropy_law.traces.schema import REQUESTS_SCHEMA, ROUNDS_SCHEMA, TOKENS_SCHEMA


@pytest.fixture(scope="module")
def traces():
    return simulate_traces(seed=61, n_requests_per_category=25, categories=["qa", "math_reasoning"], k=0.8,
                           lambda_d=1.2, block_size=6, tree=TreeSpec(depth=4, nodes=12), include_ar=True,
                           tokens_per_request=(80, 120))


def test_tables_have_the_schema_columns(traces):
    for frame, schema in ((traces.tokens, TOKENS_SCHEMA), (traces.rounds, ROUNDS_SCHEMA),
                          (traces.requests, REQUESTS_SCHEMA)):
        assert set(schema.names) <= set(frame.columns), set(schema.names) - set(frame.columns)
    assert {"run_id", "drafter_id", "tree_policy"} <= set(traces.runs.columns)


def test_rounds_tokens_and_requests_agree(traces):
    t, r, q = traces.tokens, traces.rounds, traces.requests
    committed = r.groupby(["run_id", "request_id"])["committed"].sum()
    assert (committed == q.set_index(["run_id", "request_id"])["new_tokens"].reindex(committed.index)).all()
    # positions are 0..T-1 per request and run, and every drafter sees the same entropy sequence
    for _, g in t.groupby(["run_id", "request_id"]):
        assert np.array_equal(g["position"].to_numpy(), np.arange(len(g)))
    h = t.pivot_table(index=["request_id", "position"], columns="run_id", values="target_entropy_nats")
    assert np.allclose(h["sim-block"], h["sim-tree"]) and np.allclose(h["sim-block"], h["sim-ar"])
    assert (r["accepted"] <= r["tree_depth"]).all() and (r["committed"] <= r["accepted"] + 1).all()
    assert (r.loc[r["run_id"] == "sim-ar", "tree_nodes"] == 0).all()


def test_token_statistics_are_consistent_with_entropy():
    rng = np.random.default_rng(0)
    h = np.concatenate([rng.uniform(1e-4, 0.05, 500), rng.uniform(0.05, 9.0, 500)])
    s = distribution_summary(h, rng)
    h2, p1, p2 = s["target_renyi2_nats"].to_numpy(), s["target_top1_prob"].to_numpy(), s["target_top2_prob"].to_numpy()
    assert np.all(h2 <= h + 1e-9) and np.all(h2 >= 0)
    assert np.all(p1 >= np.exp(-h2) - 1e-9) and np.all(p1 >= np.exp(-h) - 1e-9)  # Renyi ordering
    assert np.all(p2 <= p1) and np.all(p1 + p2 <= 1 + 1e-9) and np.all(s["target_logit_gap"] >= 0)
    # a Zipf distribution over V tokens with the reported gap has the reported entropy for some V
    gap = s["target_logit_gap"].to_numpy()
    i = 700
    found = False
    for vocab in (8, 32, 128, 512, 2048, 8192, 49152):
        logits = -gap[i] / np.log(2) * np.log(np.arange(1, vocab + 1))
        p = np.exp(logits - np.logaddexp.reduce(logits))
        found |= abs(-(p * np.log(p)).sum() - h[i]) < 1e-2 * max(h[i], 0.1)
    assert found


def test_entropy_is_bursty(traces):
    t = traces.tokens.loc[traces.tokens["run_id"] == "sim-block"]
    logh = np.log(t["target_entropy_nats"].to_numpy(float))
    same = t["request_id"].to_numpy()[1:] == t["request_id"].to_numpy()[:-1]
    lag1 = np.corrcoef(logh[:-1][same], logh[1:][same])[0, 1]
    assert lag1 > 0.4


def test_acceptance_follows_the_stated_law(traces):
    rows = atrisk.at_risk_table(traces, drafters=["sim-block"])
    d1 = rows.loc[rows["depth"] == 1]
    truth = traces.true_acceptance(d1["target_entropy_nats"].to_numpy(float), 1, "qa")
    bins = np.digitize(d1["target_entropy_nats"], [0.01, 0.1, 0.5, 1.5])
    for b in np.unique(bins):
        sel = bins == b
        observed, expected = d1["accepted"].to_numpy()[sel].mean(), truth[sel].mean()
        se = np.sqrt(expected * (1 - expected) / sel.sum())
        assert abs(observed - expected) < 4 * se + 1e-3, (b, observed, expected)


def test_seeds_and_argument_errors():
    a = simulate_traces(seed=5, n_requests_per_category=3, categories=["qa"], tokens_per_request=(20, 30))
    b = simulate_traces(seed=5, n_requests_per_category=3, categories=["qa"], tokens_per_request=(20, 30))
    c = simulate_traces(seed=6, n_requests_per_category=3, categories=["qa"], tokens_per_request=(20, 30))
    assert a.tokens.equals(b.tokens) and not a.tokens.equals(c.tokens)
    with pytest.raises(ValueError, match="lambda_d has 2 values"):
        simulate_traces(seed=1, lambda_d=[1.0, 1.1], block_size=6)
    with pytest.raises(ValueError, match="unknown categories"):
        simulate_traces(seed=1, categories=["qa"], category_effects={"rag": 0.2})


def test_analysis_layer_never_imports_torch():
    code = ("import sys, entropy_law\n"
            "from entropy_law import fit_law, simulate_traces, compare_laws, when_drafting_pays\n"
            "from entropy_law.law.hypotheses import preregistered_tests\n"
            "import entropy_law.law.bootstrap, entropy_law.law.transfer\n"
            "assert 'torch' not in sys.modules and 'sklearn' not in sys.modules, 'heavy import'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))


def test_law_command_on_simulated_traces(capsys):
    from entropy_law.cli import main

    assert main(["law", "--simulate", "3", "--drafter", "sim-block"]) == 0
    out = capsys.readouterr().out
    assert "lambda[d=1]" in out and "dp_tokens_per_round" in out
    assert main(["law"]) == 2
    assert "--simulate" in capsys.readouterr().err


def test_law_command_fits_one_law_per_arm_of_a_trace_folder(tmp_path, capsys):
    """On recorded traces the command fits each arm (drafter + tree policy) apart, AR left out."""
    from entropy_law.cli import main
    from entropy_law.analysis.sample_traces import write_simulated_traces

    path = write_simulated_traces(tmp_path / "traces", seed=4, n_requests_per_category=4, tokens_per_request=(40, 60))
    assert main(["law", str(path), "--drafter", "sim-tree ddtree16"]) == 0
    out = capsys.readouterr().out
    assert "=== sim-tree ddtree16 ===" in out and "lambda[d=1]" in out
    assert main(["law", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("=== ") == 2 and "=== sim-block chain ===" in out
