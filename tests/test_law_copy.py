"""The context's copyability as a covariate of the law (issue #18 item 3): the tokens column ``context_match``
(recorded from the prompt's token ids, or attached from the prompts afterwards), the at-risk trials' copyability
terms, the families ``law_exp_obs_ceil_copy`` / ``law_exp_obs_ceil_drafttop_copy`` (a known effect recovered, the DP
given the same values as the trials, clear errors where the column is missing)."""

import warnings

import numpy as np
import pandas as pd
import pytest

from entropy_law import TraceRecorder, load_traces
from entropy_law.law import atrisk
from entropy_law.law.compare import compare_laws
from entropy_law.law.fit import fit_law, get_family
from entropy_law.analysis.simulate import simulate_traces
from entropy_law.law.transfer import sequences_of
from entropy_law.traces.stats import CONTEXT_MATCH_MAX, context_match_length, context_matches_of_output
from tests.traces_helpers import log_requests, one_drafter, synthetic_requests


def brute_force(context: list, max_length: int) -> int:
    """The longest k <= max_length such that the last k tokens occur as a block ending before the last token."""
    n = len(context)
    best = 0
    for k in range(1, min(max_length, n - 1) + 1):
        suffix = context[n - k:]
        if any(context[i:i + k] == suffix for i in range(0, n - k)):
            best = k
    return best


@pytest.mark.parametrize("seed", range(5))
def test_context_matches_of_output_equal_a_brute_force_at_every_position(seed):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 4, 30).tolist()
    output = rng.integers(0, 4, 40).tolist()
    got = context_matches_of_output(prompt, output)
    assert got.dtype == np.int16 and got.shape == (40,)
    for p in range(40):
        assert got[p] == brute_force(prompt + output[:p], CONTEXT_MATCH_MAX)
        assert got[p] == context_match_length(prompt + output, CONTEXT_MATCH_MAX, end=len(prompt) + p)
    # before output 0: "9" is new; before 1: "7" occurred; before 2: "7 8" occurred (positions 0-1 of the prompt)
    assert context_matches_of_output([7, 8, 9], [7, 8, 5]).tolist() == [0, 1, 2]
    assert context_matches_of_output([], []).size == 0


@pytest.mark.parametrize("n_prompt, max_length", [(0, 8), (1, 3), (12, 1), (5, 0), (25, 2)])
def test_context_matches_of_output_at_short_prompts_and_caps(n_prompt, max_length):
    """The one-pass k-gram index against the brute force where the prompt is empty or one token long and the cap
    is 0, 1 or short (long repeats in a 2-token vocabulary)."""
    rng = np.random.default_rng(n_prompt * 10 + max_length)
    prompt, output = rng.integers(0, 2, n_prompt).tolist(), rng.integers(0, 2, 30).tolist()
    got = context_matches_of_output(prompt, output, max_length)
    assert got.tolist() == [brute_force(prompt + output[:p], max_length) for p in range(30)]


def _requests_from_zero(seed: int):
    """synthetic_requests whose logged rounds start at output position 0 (no unlogged prefill token)."""
    out = []
    for q in synthetic_requests(seed=seed, n_requests=6):
        if q["rounds"] and q["rounds"][0]["start_position"] == 1:
            for r in q["rounds"]:
                r["start_position"] -= 1
                r["context_len"] -= 1
            q["new_tokens"] = max(q["new_tokens"] - 1, q["rounds"][-1]["start_position"] + len(q["rounds"][-1]["token_ids"]))
        out.append(q)
    return out


def test_the_recorder_writes_context_match_from_the_prompt_ids(tmp_path):
    requests = [q for q in _requests_from_zero(2) if q["rounds"]]
    prompts = {q["request_id"]: list(range(5)) + [1, 2] for q in requests}
    no_ids = requests[0]["request_id"]
    with TraceRecorder(tmp_path / "run", model_id="m") as rec:
        for q in requests:
            ids = None if q["request_id"] == no_ids else prompts[q["request_id"]]
            rec.begin_request(q["request_id"], category=q["category"], prompt_tokens=7, prompt_ids=ids)
            for r in q["rounds"]:
                rec.log_round(q["request_id"], **r)
            rec.end_request(q["request_id"], new_tokens=q["new_tokens"], stop_reason="eos")
    tokens = load_traces(tmp_path / "run").tokens.sort_values(["request_id", "position"])
    for q in requests:
        mine = tokens.loc[tokens["request_id"] == q["request_id"]]
        if q["request_id"] == no_ids:
            assert mine["context_match"].isna().all()  # no prompt ids: unknown, not 0
            continue
        output = [t for r in q["rounds"] for t in r["token_ids"]]
        expected = context_matches_of_output(prompts[q["request_id"]], output)
        np.testing.assert_array_equal(mine["context_match"].to_numpy(dtype=int), expected)


def test_the_recorder_leaves_context_match_null_after_a_gap_and_refuses_bad_prompt_ids(tmp_path):
    gap = next(q for q in synthetic_requests(seed=6, n_requests=10) if q["rounds"]
               and q["rounds"][0]["start_position"] == 1)  # position 0 was never logged: the output is not known
    with TraceRecorder(tmp_path / "run", model_id="m") as rec:
        rec.begin_request(gap["request_id"], category="c", prompt_ids=[1, 2, 3])
        for r in gap["rounds"]:
            rec.log_round(gap["request_id"], **r)
        rec.end_request(gap["request_id"], new_tokens=gap["new_tokens"], stop_reason="eos")
        for bad in ([1, -2], [[1, 2]], [0.5, 1.0]):
            with pytest.raises(ValueError, match="prompt_ids"):
                rec.begin_request("bad", category="c", prompt_ids=bad)
    assert load_traces(tmp_path / "run").tokens["context_match"].isna().all()


def test_with_context_match_fills_the_column_and_refuses_conflicts(tmp_path):
    with TraceRecorder(tmp_path / "run", model_id="m") as rec:
        log_requests(rec, synthetic_requests(seed=4, n_requests=3))
    traces = load_traces(tmp_path / "run")
    assert traces.tokens["context_match"].isna().all()  # recorded without prompt ids
    keys = traces.tokens[["run_id", "request_id", "position"]].astype({"run_id": str, "request_id": str})
    lengths = keys.assign(context_match=np.arange(len(keys)) % 9)
    filled = traces.with_context_match(lengths.iloc[1:])
    got = filled.tokens.merge(lengths.rename(columns={"context_match": "given"}), on=["run_id", "request_id",
                                                                                      "position"])
    assert got["context_match"].iloc[1:].astype(int).tolist() == got["given"].iloc[1:].tolist()
    assert filled.tokens["context_match"].isna().sum() == 1  # the one position not given stays unknown
    assert traces.tokens["context_match"].isna().all()  # the original TraceSet is unchanged
    assert filled.filter(category="math").tokens["context_match"].notna().any()
    with pytest.raises(ValueError, match="differ from the recorded"):
        filled.with_context_match(lengths.assign(context_match=lengths["context_match"] + 1))
    with pytest.raises(ValueError, match="does not hold"):
        traces.with_context_match(lengths.assign(run_id="elsewhere"))
    with pytest.raises(ValueError, match="negative"):
        traces.with_context_match(lengths.assign(context_match=-1))
    with pytest.raises(ValueError, match="several rows"):
        traces.with_context_match(pd.concat([lengths, lengths.iloc[:1]]))


@pytest.fixture(scope="module")
def copy_sim():
    """Simulated traces with a context_match column: per request a random walk of suffix-match lengths (a repeat
    grows by one per position, breaks to 0 or 1), so that long repeats (>= 8) occur."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = simulate_traces(seed=5, n_requests_per_category=8, tokens_per_request=(60, 90))
    tokens = sim.tokens.sort_values(["run_id", "request_id", "position"]).reset_index(drop=True)
    rng = np.random.default_rng(0)
    lengths = np.zeros(len(tokens), dtype=np.int64)
    for _, index in tokens.groupby(["run_id", "request_id"]).indices.items():
        length = 0
        for i in index:
            length = length + 1 if rng.random() < 0.8 else int(rng.integers(0, 2))
            lengths[i] = min(length, 12)
    tokens["context_match"] = pd.array(lengths, dtype="Int16")
    return type(sim)(tokens=tokens, rounds=sim.rounds, requests=sim.requests, runs=sim.runs)


def test_copy_terms_reach_the_trials_and_a_known_effect_is_recovered(copy_sim):
    table = one_drafter(atrisk.at_risk_table(copy_sim))
    look = copy_sim.tokens.set_index(["run_id", "request_id", "position"])["context_match"].astype(float)
    expected = look.loc[list(zip(table["run_id"], table["request_id"], table["position"]))].to_numpy()
    np.testing.assert_array_equal(table["context_match"], expected)
    np.testing.assert_allclose(table["log1p_copy"], np.log1p(np.minimum(expected, 8)))
    np.testing.assert_array_equal(table["copy_full"], (expected >= 8).astype(float))

    rng = np.random.default_rng(1)
    u, v = -0.5, -0.8  # rejection hazard falls with the copyability, and again at a long repeat
    hazard = (0.8 * (table["target_entropy_nats"] + 1e-3) ** 0.7
              * np.exp(u * table["log1p_copy"] + v * table["copy_full"]))
    accepted = (rng.random(len(table)) < np.exp(-hazard)).astype(np.int8)
    redrawn = table.assign(accepted=accepted, rejected=1 - accepted)
    redrawn.attrs.update(table.attrs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(redrawn, "law_exp_obs_ceil_copy")
        comp = compare_laws(redrawn, ("law_exp_obs_ceil", "law_exp_obs_ceil_copy"), n_folds=4)
    for name, truth in (("log1p_copy", u), ("copy_full", v)):
        coef = law.coefficients.loc[name]
        assert coef["ci_low"] < truth < coef["ci_high"], name
    assert comp.best == "law_exp_obs_ceil_copy"
    # without the copyability: the training means of both terms (the steady state), finite and in (0, 1)
    a = law.predict_acceptance(np.array([0.1, 1.0]), depth=1)
    assert np.all((a > 0) & (a < 1))
    assert law.predict_acceptance(0.1, depth=1, context_match=8) > law.predict_acceptance(0.1, depth=1,
                                                                                         context_match=0)


def test_the_dp_reads_the_same_copyability_as_the_trials(copy_sim):
    table = one_drafter(atrisk.at_risk_table(copy_sim))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(table, "law_exp_obs_ceil_copy", cov_type="nonrobust")
    seqs = sequences_of(copy_sim.tokens.loc[copy_sim.tokens["run_id"] == table["run_id"].iloc[0]])
    rec = seqs.iloc[0]
    frame, _ = law.sequence_frame(rec["entropy"], 3, context_match=rec["context_match"])
    mine = table.loc[table["request_id"] == rec["request_id"]]
    for r in mine.itertuples():
        if r.depth > 3:
            continue
        i = (int(r.position) - int(r.depth) + 1) * 3 + int(r.depth) - 1  # (round start, depth) row of the DP
        assert frame["context_match"].iloc[i] == r.context_match
    with pytest.raises(ValueError, match="copyability"):
        law.sequence_frame(rec["entropy"], 3)
    with pytest.raises(ValueError, match="lengths >= 0"):
        law.sequence_frame(rec["entropy"], 3, context_match=rec["context_match"][:-1])
    with pytest.raises(ValueError, match="copyability"):
        law.predict_rounds(rec["entropy"], 4)


def test_copy_families_refuse_traces_without_the_column():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = simulate_traces(seed=3, n_requests_per_category=4, tokens_per_request=(30, 40))
    rows = one_drafter(atrisk.at_risk_table(sim))
    assert rows["context_match"].isna().all()  # simulated / older traces: the added column reads as null
    for family in ("law_exp_obs_ceil_copy", "law_exp_obs_ceil_drafttop_copy"):
        assert get_family(family).needs_context_match
        with pytest.raises(ValueError, match="attach_context_matches"):
            fit_law(rows, family)
    assert not get_family("law_exp_obs_ceil").needs_context_match
