"""At-risk layout: which rows are at risk, covariate checks, and aggregated fit == row-level fit."""

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from entropy_law.law import atrisk
from entropy_law.law.fit import fit_law
from entropy_law.analysis.simulate import SimulatedTraces, TreeSpec, simulate_traces


@pytest.fixture(scope="module")
def traces():
    return simulate_traces(seed=11, n_requests_per_category=8, categories=["qa", "math_reasoning"],
                           tokens_per_request=(40, 70), block_size=6, tree=TreeSpec(depth=4, nodes=12))


def test_at_risk_rows_follow_the_rounds_table(traces):
    rows = atrisk.at_risk_table(traces)
    # independent count from the rounds table: depths 1..min(tau + 1, tree_depth), cut by the request end
    r = traces.rounds
    expected = np.minimum(np.minimum(r["accepted"] + 1, r["tree_depth"]), r["committed"]).sum()
    assert len(rows) == expected
    per_round = rows.groupby(["run_id", "request_id", "round_index"])["accepted"].agg(["sum", "size"])
    merged = per_round.join(r.set_index(["run_id", "request_id", "round_index"]))
    assert (merged["sum"] == np.minimum(merged["accepted"], merged["committed"])).all()
    # every at-risk round has depths 1..n without gaps, and only the last one can be a rejection
    assert (rows.groupby(["run_id", "request_id", "round_index"])["depth"].max() == per_round["size"]).all()
    last = rows.groupby(["run_id", "request_id", "round_index"]).tail(1)
    assert rows["rejected"].sum() == last["rejected"].sum()
    # bonus tokens are never at risk
    assert set(rows["drafter_id"]) == {"sim-block", "sim-tree"}


def test_cumulative_entropy_is_sum_of_earlier_depths(traces):
    rows = atrisk.at_risk_table(traces)
    one = rows.loc[(rows["run_id"] == "sim-block")].groupby(["request_id", "round_index"]).filter(lambda g: len(g) >= 3)
    g = one.groupby(["request_id", "round_index"]).head(3).iloc[:3]
    h = g["target_entropy_nats"].to_numpy(float)
    np.testing.assert_allclose(g["cum_entropy_nats"].to_numpy(), [0.0, h[0], h[0] + h[1]], rtol=1e-12)
    np.testing.assert_allclose(rows["log_entropy"], np.log(rows["target_entropy_nats"].astype(float) + 1e-3))


def _with_tokens(traces, tokens):
    return SimulatedTraces(tokens=tokens, rounds=traces.rounds, requests=traces.requests, runs=traces.runs)


def test_nan_and_negative_entropies_are_refused_or_dropped(traces):
    tokens = traces.tokens.copy()
    at_risk = tokens.index[tokens["role"] != "bonus"]
    tokens.loc[at_risk[:2], "target_entropy_nats"] = np.nan
    tokens.loc[at_risk[2], "target_entropy_nats"] = -0.5
    tokens.loc[at_risk[3], "target_entropy_nats"] = -1e-7  # fp32 round-off: becomes 0
    bad = _with_tokens(traces, tokens)
    with pytest.raises(ValueError, match="2 NaN/inf and 1 negative.*on_invalid='drop'"):
        atrisk.at_risk_table(bad)
    with pytest.raises(ValueError, match="NaN"):
        fit_law(bad, by="drafter_id")
    dropped = atrisk.at_risk_table(bad, on_invalid="drop")
    assert len(dropped) == len(atrisk.at_risk_table(traces)) - 3
    assert (dropped["target_entropy_nats"] >= 0).all()


def test_missing_run_metadata_is_a_clear_error(traces):
    runs = traces.runs.loc[traces.runs["run_id"] != "sim-tree"]
    with pytest.raises(ValueError, match="sim-tree.*not in traces.runs"):
        atrisk.at_risk_table(SimulatedTraces(tokens=traces.tokens, rounds=traces.rounds, requests=traces.requests,
                                             runs=runs))


def test_log_bins_are_log_spaced():
    x = np.array([0.0, 1e-3, 0.01, 0.1, 1.0, 10.0])
    b = atrisk.log_bin(x, eps=1e-3, width_log10=0.05)
    np.testing.assert_array_equal(b, np.floor((np.log10(x + 1e-3) + 3) / 0.05).astype(int))
    assert b[0] == 0 and np.all(np.diff(b) > 0)


@pytest.mark.parametrize("family", ["law_exp", "law_logit", "law_exp_cat"])
def test_aggregated_fit_equals_row_level_fit_on_binned_covariates(traces, family):
    rows = atrisk.at_risk_table(traces, drafters=["sim-block"])
    agg = atrisk.aggregate_at_risk(rows, bin_columns=("target_entropy_nats",), width_log10=0.25)
    assert agg["n"].sum() == len(rows) and len(agg) < 0.8 * len(rows)
    binned = atrisk.binned_rows(rows, agg)
    law_agg = fit_law(agg, family, min_requests_per_category=2)
    law_rows = fit_law(binned, family, aggregate=False, min_requests_per_category=2)
    np.testing.assert_allclose(law_agg.result.params, law_rows.result.params, rtol=0, atol=1e-6)  # IRLS tolerance
    # statsmodels' small-sample factor (N - 1) / (N - K) counts GLM rows; undo it on both sides
    def raw_se(law):
        n, k = law.result.nobs, len(law.result.params)
        return law.result.bse * np.sqrt((n - k) / (n - 1))
    np.testing.assert_allclose(raw_se(law_agg), raw_se(law_rows), rtol=1e-5)
    # and an independent row-level statsmodels fit with 0/1 endog agrees too
    if family == "law_exp":
        x = pd.get_dummies(binned["depth"], prefix="d", drop_first=True, dtype=float)
        x.insert(0, "const", 1.0)
        x["log_entropy"] = binned["log_entropy"]
        fam = sm.families.Binomial(link=sm.families.links.CLogLog())
        ref = sm.GLM(binned["rejected"].astype(float), x, family=fam).fit()
        np.testing.assert_allclose(ref.params.to_numpy(), law_agg.result.params.to_numpy(), rtol=0, atol=1e-6)


def test_combined_chunk_aggregates_equal_the_whole(traces):
    rows = atrisk.at_risk_table(traces)
    whole = atrisk.aggregate_at_risk(rows)
    parts = [atrisk.aggregate_at_risk(rows.iloc[i::3]) for i in range(3)]
    combined = atrisk.combine_aggregates(parts)
    key = ["drafter_id", "category", "request_id", "depth", "bin_target_entropy_nats"]
    a = whole.sort_values(key, ignore_index=True)
    b = combined.sort_values(key, ignore_index=True)
    pd.testing.assert_frame_equal(a[key + ["n_acc", "n_rej", "n"]], b[key + ["n_acc", "n_rej", "n"]], check_dtype=False)
    np.testing.assert_allclose(a["log_entropy"], b["log_entropy"], rtol=1e-12)


def test_dictionary_encoded_string_columns_give_the_same_fit(traces):
    """The trace reader may hand over categorical (dictionary-encoded) key columns."""
    def categorical(frame):
        out = frame.copy()
        for col in ("run_id", "request_id", "category", "role", "drafter_id", "tree_policy"):
            if col in out:
                out[col] = out[col].astype("category")
        return out

    cat = SimulatedTraces(tokens=categorical(traces.tokens), rounds=categorical(traces.rounds),
                          requests=categorical(traces.requests), runs=categorical(traces.runs))
    a = fit_law(traces, "law_exp_cat", by="drafter_id", min_requests_per_category=2)["sim-block"]
    b = fit_law(cat, "law_exp_cat", by="drafter_id", min_requests_per_category=2)["sim-block"]
    np.testing.assert_allclose(a.result.params.to_numpy(), b.result.params.to_numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.result.bse.to_numpy(), b.result.bse.to_numpy(), rtol=1e-9)
