"""Out of core: the SQL aggregation (DuckDB over the Parquet shards) equals the pandas path cell by cell.

The pandas path is ``at_risk_table`` + ``aggregate_at_risk`` on ``load_traces``; the SQL path is
``entropy_law.outofcore``. Traces are simulated from a known law and written through ``TraceRecorder``
in several shards per run, and the DuckDB driver is made to run one query per small group of shards, so
the test also covers the per-group split and the merge of cells that share a key.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from entropy_law.law import atrisk
from entropy_law.law import fit as fitmod
from entropy_law.analysis import make_view
from entropy_law.law.fit import EPS_GRID, PRIMARY_FAMILY, fit_law, get_family
from entropy_law.outofcore import (
    acceptance_curve_sql,
    aggregate_at_risk_sql,
    at_risk_sql,
    category_summary_sql,
    fit_law_out_of_core,
    report_summaries_sql,
)
from entropy_law.analysis.simulate import TreeSpec, simulate_traces
from entropy_law.traces.reader import load_traces
from entropy_law.traces.recorder import TraceRecorder

pytest.importorskip("duckdb")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "out-of-core.md"


def write_runs(root: Path, sim, *, shards: int = 3, rename: dict | None = None) -> Path:
    """Every simulated run under ``root/<run_id>``, its requests spread over ``shards`` shards."""
    for run in sim.runs.itertuples():
        run_id = (rename or {}).get(run.run_id, run.run_id)
        with TraceRecorder(root / run_id, run_id=run_id, model_id="simulated", drafter_id=run.drafter_id,
                           drafter_config={"block_size": int(run.block_size)}, tree_policy=run.tree_policy,
                           dtype="float32", device="none", seed=0) as rec:
            ids = sim.requests.loc[sim.requests["run_id"] == run.run_id, "request_id"].to_numpy()
            for part in np.array_split(ids, shards):
                tables = {}
                for name in ("tokens", "rounds", "requests"):
                    frame = getattr(sim, name)
                    rows = frame.loc[(frame["run_id"] == run.run_id) & frame["request_id"].isin(part)]
                    rows = rows.assign(run_id=run_id)
                    tables[name] = {c: rows[c].to_numpy() for c in rows.columns}
                rec.log_columns(**tables)
    return root


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    sim = simulate_traces(seed=3, n_requests_per_category=6, tokens_per_request=(60, 140), block_size=6,
                          tree=TreeSpec(depth=4, nodes=10), block_depths={"probs": [0.1, 0.1, 0.2, 0.2, 0.2, 0.2]},
                          category_effects={"qa": 0.3})
    return write_runs(tmp_path_factory.mktemp("fleet"), sim), sim


def pandas_aggregate(path, family="law_exp", on_invalid="raise", validate=True):
    fam = get_family(family)
    table = atrisk.at_risk_table(load_traces(path, validate=validate), on_invalid=on_invalid)
    return atrisk.aggregate_at_risk(table, bin_columns=fam.bin_columns, keys=(*atrisk.KEY_COLUMNS, *fam.extra_keys),
                                    extra_means=fam.means)


def assert_same_cells(sql: pd.DataFrame, ref: pd.DataFrame, *, atol: float = 1e-9):
    attrs = ref.attrs
    cell = [*attrs["keys"], *[f"bin_{c}" for c in attrs["bin_columns"]]]
    assert list(sql.columns) == list(ref.columns)
    assert sql.attrs == ref.attrs
    ref = ref.sort_values(cell, ignore_index=True)
    pd.testing.assert_frame_equal(sql[cell + ["n_acc", "n", "n_rej"]], ref[cell + ["n_acc", "n", "n_rej"]],
                                  check_dtype=False)
    means = [c for c in ref.columns if c not in cell and c not in ("n_acc", "n", "n_rej")]
    np.testing.assert_allclose(sql[means].to_numpy(float), ref[means].to_numpy(float), rtol=0, atol=atol)


@pytest.mark.parametrize("family", ["law_exp", "law_exp_cum", "law_exp_drafted", "law_renyi2", "law_margin",
                                    "law_exp_obs", "law_exp_lag"])
def test_sql_aggregate_equals_the_pandas_path(fleet, family):
    """Decode-time covariates too (``law_exp_obs``: bins of the previous position's entropy, the output's running
    mean entropy and the position, their cell means): windows over each request's whole output, all roles."""
    path, _ = fleet
    ref = pandas_aggregate(path, family)
    # one query per shard group (a few hundred kB): the groups split runs, the result must not change
    sql = aggregate_at_risk_sql(path, family, chunk_bytes=20_000, threads=1)
    assert_same_cells(sql, ref)
    assert sql["n"].sum() == ref["n"].sum() > 1000


def assert_same_law(out, memory, rtol=1e-6):
    """Coefficients, CR1 standard errors, intervals, derived parameters and predictions within ``rtol``."""
    a, b = memory.result, out.result
    assert list(b.params.index) == list(a.params.index)
    np.testing.assert_allclose(b.params.to_numpy(), a.params.to_numpy(), rtol=rtol, atol=1e-9)
    np.testing.assert_allclose(b.bse.to_numpy(), a.bse.to_numpy(), rtol=rtol, atol=1e-12)
    assert b.cov_type == a.cov_type and b.use_t == a.use_t and out.df_inference == memory.df_inference
    assert (out.n_rows, out.n_requests, out.depths, out.categories) == (memory.n_rows, memory.n_requests,
                                                                        memory.depths, memory.categories)
    assert out.eps == memory.eps  # a profiled offset: the same c chosen from EPS_GRID
    assert out.family.terms == memory.family.terms  # e.g. log D left out where one depth was drafted
    assert b.nobs == a.nobs
    np.testing.assert_allclose(b.llf, a.llf, rtol=1e-9)
    ref, got = memory.summary, out.summary
    assert list(got.index) == list(ref.index) and list(got.columns) == list(ref.columns)
    numeric = ref.select_dtypes("number").columns
    np.testing.assert_allclose(got[numeric].to_numpy(float), ref[numeric].to_numpy(float), rtol=rtol, atol=1e-9)
    h = np.geomspace(1e-3, 5.0, 7)
    category = memory.categories[0] if memory.family.uses_category else None
    extra = {"law_exp_cum": {"cum_entropy_nats": 0.7 * h}, "law_renyi2": {"target_renyi2_nats": 0.8 * h}}
    for d in memory.depths[:3]:
        kwargs = extra.get(memory.family.name, {})
        # decode-time families: their steady state at H (training means of the output's level and position)
        np.testing.assert_allclose(out.predict_acceptance(h, d, category, **kwargs),
                                   memory.predict_acceptance(h, d, category, **kwargs), rtol=rtol)
    if memory.family.means:
        steady = memory.steady_state(h)
        assert set(out.steady_state(h)) == set(steady)
        for name, value in out.steady_state(h).items():
            np.testing.assert_allclose(value, steady[name], rtol=1e-9)
        sequence = np.random.default_rng(0).gamma(0.6, 1.0, size=40)  # the DP over an output
        if memory.family.position_columns:  # a law in p1: the DP's acceptances, given p1 at every position
            top1 = np.random.default_rng(1).uniform(0.2, 1.0, size=40)
            frames = [law.sequence_frame(sequence, 4, target_top1_prob=top1)[0] for law in (out, memory)]
            np.testing.assert_allclose(out.predict_frame(frames[0]), memory.predict_frame(frames[1]), rtol=rtol)
        else:
            np.testing.assert_allclose(out.predict_tokens_per_round(sequence, 5),
                                       memory.predict_tokens_per_round(sequence, 5), rtol=rtol)


@pytest.mark.parametrize("family", ["law_exp", "law_exp_cat", "law_exp0", "law_exp_cum", "law_spline",
                                    "law_exp_mundlak", "law_renyi2", PRIMARY_FAMILY, "law_exp_obs", "law_exp_ceil",
                                    "law_exp_lag", "law_exp_runmean", "law_exp_pos"])
def test_out_of_core_fit_equals_the_in_memory_fit(fleet, family):
    """The streamed IRLS and CR1 sandwich (small batches and shard groups, so that every pass crosses many
    of them) give fit_law's law: the same iterate, standard errors, summary and predictions. The primary law
    (``law_exp_obs_ceil``: decode-time covariates and a profiled offset) included; on this fleet the tree
    drafter always drafts depth 4, so its law leaves log D out, in both paths."""
    path, _ = fleet
    memory = fit_law(load_traces(path), family, by="drafter_id")
    out = fit_law_out_of_core(path, family, by="drafter_id", chunk_bytes=50_000, threads=1, batch_cells=97)
    assert list(out.laws) == list(memory.laws)
    for drafter in memory.laws:
        assert_same_law(out[drafter], memory[drafter])
        assert any("fitted out of core" in note for note in out[drafter].notes)


def test_a_law_in_the_targets_top1_probability_fits_out_of_core_as_in_memory(tmp_path):
    """law_exp_obs_ceil_top1: 1 - p1 binned and its log taken of the cells' mean p1 by the query, as atrisk does; the
    steady state's target-miss curve from the same per-entropy-bin sums. p1 is perturbed per position (in the
    simulator it follows H), so that its term is identified."""
    sim = simulate_traces(seed=5, n_requests_per_category=5, tokens_per_request=(60, 120), block_size=6,
                          block_depths={"probs": [0.1, 0.1, 0.2, 0.2, 0.2, 0.2]})
    rng = np.random.default_rng(2)
    p1 = sim.tokens["target_top1_prob"].to_numpy(dtype=float)  # moved towards 1: still >= p2 and <= 1
    tokens = sim.tokens.assign(target_top1_prob=(p1 + (1.0 - p1) * rng.uniform(0.0, 0.6, len(p1))).astype(np.float32))
    sim = type(sim)(tokens=tokens, rounds=sim.rounds, requests=sim.requests, runs=sim.runs)
    path = write_runs(tmp_path, sim, shards=2) / "sim-block"
    family = "law_exp_obs_ceil_top1"
    assert_same_cells(aggregate_at_risk_sql(path, family, chunk_bytes=30_000, threads=1), pandas_aggregate(path, family))
    memory = fit_law(load_traces(path), family)
    out = fit_law_out_of_core(path, family, chunk_bytes=30_000, batch_cells=211)
    assert_same_law(out, memory)
    assert memory.miss_curve is not None and len(memory.miss_curve[0]) > 5
    np.testing.assert_allclose(out.miss_curve, memory.miss_curve, rtol=1e-12)


def test_out_of_core_fit_of_one_arm_prints_like_fit_law(fleet, capsys):
    path, _ = fleet
    memory = fit_law(load_traces(path / "sim-block"), "law_exp", depth="linear")
    out = fit_law_out_of_core(path / "sim-block", "law_exp", depth="linear", batch_cells=1000)
    assert_same_law(out, memory)
    out.print_summary()
    text = capsys.readouterr().out
    assert "cluster-robust by request (CR1)" in text and "lambda[d=1]" in text


def test_out_of_core_nonrobust_and_refused_families(fleet):
    path, _ = fleet
    memory = fit_law(load_traces(path / "sim-block"), "law_exp", cov_type="nonrobust")
    out = fit_law_out_of_core(path / "sim-block", "law_exp", cov_type="nonrobust", batch_cells=500)
    np.testing.assert_allclose(out.result.params, memory.result.params, rtol=1e-6)
    np.testing.assert_allclose(out.result.bse, memory.result.bse, rtol=1e-6)
    for family, hint in (("law_iso", "not a GLM"), ("law_exp_draftent", "draft_entropy_nats.*law_exp_obs_ceil")):
        with pytest.raises(ValueError, match=hint):
            fit_law_out_of_core(path, family)
    with pytest.raises(ValueError, match="drafters"):  # two drafters pooled: refused as fit_law refuses
        fit_law_out_of_core(path, "law_exp")


@pytest.fixture(scope="module")
def ceiling_run(tmp_path_factory):
    """One chain drafter whose acceptance follows exp(-lambda (H + 0.3)^k): a ceiling below 1 at H = 0, so the
    profile likelihood picks an offset well inside EPS_GRID, not its first value."""
    sim = simulate_traces(seed=11, n_requests_per_category=5, tokens_per_request=(60, 120), block_size=6,
                          eps=0.3, k=1.2, block_depths={"probs": [0.1, 0.1, 0.2, 0.2, 0.2, 0.2]})
    return write_runs(tmp_path_factory.mktemp("ceiling"), sim, shards=2) / "sim-block"


@pytest.mark.parametrize("family", ["law_exp_ceil", PRIMARY_FAMILY])
def test_the_profiled_offset_is_the_in_memory_choice(ceiling_run, family):
    memory = fit_law(load_traces(ceiling_run), family)
    out = fit_law_out_of_core(ceiling_run, family, chunk_bytes=30_000, batch_cells=211)
    assert memory.eps in EPS_GRID and memory.eps > EPS_GRID[1]  # the fixture's point: not the grid's start
    assert out.eps == memory.eps
    assert_same_law(out, memory)
    note = f"c = {memory.eps:g}"
    assert any(note in n for n in memory.notes) and any(note in n for n in out.notes)


def test_the_profile_likelihood_agrees_at_every_offset(ceiling_run, monkeypatch):
    """Each offset's fit alone (a one-point grid, in both paths): the same law, hence the same log-likelihood
    profile over EPS_GRID, so the maximum is the same offset for the same reason."""
    profile = {}
    for c in EPS_GRID[::2]:
        monkeypatch.setattr(fitmod, "EPS_GRID", (c,))
        memory = fit_law(load_traces(ceiling_run), "law_exp_ceil")
        out = fit_law_out_of_core(ceiling_run, "law_exp_ceil", batch_cells=500)
        assert out.eps == memory.eps == c
        assert_same_law(out, memory)
        profile[c] = memory.result.llf
    assert len(set(profile.values())) == len(profile)  # the offsets do give different fits


def test_a_profiled_offset_inside_an_interaction_builds_each_offsets_design(ceiling_run):
    """log(H + c) read by more than one design column (category rates and exponents added): no column to swap,
    so each offset builds its own design; the same law as in memory either way."""
    from entropy_law.law.fit import with_category_terms
    from entropy_law.outofcore.streamed import _plain_column

    family = with_category_terms("law_exp_ceil")
    memory = fit_law(load_traces(ceiling_run), family)
    out = fit_law_out_of_core(ceiling_run, family, batch_cells=300)
    assert _plain_column(list(out.result.params.index), "log_entropy") is None
    assert out.eps == memory.eps
    assert_same_law(out, memory)
    plain = fit_law_out_of_core(ceiling_run, "law_exp_ceil", batch_cells=300)
    assert _plain_column(list(plain.result.params.index), "log_entropy") is not None


def test_runs_of_one_arm_sharing_request_ids_are_pooled_as_in_memory(tmp_path):
    """Two runs of one arm that decode the same prompts: the pandas path pools their cells by request id
    (one cluster per prompt), and so do the merged groups of the SQL path."""
    sim = simulate_traces(seed=5, n_requests_per_category=3, tokens_per_request=(40, 80), block_size=5,
                          include_block=True)
    write_runs(tmp_path / "fleet", sim, shards=2, rename={"sim-block": "sim-block-a"})
    write_runs(tmp_path / "fleet", sim, shards=1, rename={"sim-block": "sim-block-b"})
    ref = pandas_aggregate(tmp_path / "fleet")
    sql = aggregate_at_risk_sql(tmp_path / "fleet", chunk_bytes=1, threads=1)  # one query per shard
    assert_same_cells(sql, ref)
    assert ref["n"].sum() == 2 * sim.tokens["role"].isin(["accepted", "correction"]).sum()
    # the streamed fit pools the shared cells too (a GROUP BY over the groups' cell files): fit_law's law
    memory = fit_law(load_traces(tmp_path / "fleet"), "law_exp", by="drafter_id")
    out = fit_law_out_of_core(tmp_path / "fleet", "law_exp", by="drafter_id", chunk_bytes=1, batch_cells=50)
    for drafter in memory.laws:
        assert_same_law(out[drafter], memory[drafter])


def two_arms_of_one_drafter_id(root: Path, *, requests: int, tokens: tuple, shards: int) -> Path:
    """The simulated sim-block run under ``root/fleet``, and its requests again as a run of another model under the
    same drafter id: two arms, one drafter id."""
    sim = simulate_traces(seed=6, n_requests_per_category=requests, tokens_per_request=tokens, block_size=5)
    write_runs(root / "fleet", sim, shards=shards)
    with TraceRecorder(root / "fleet" / "sim-block-other", run_id="other", model_id="another-model",
                       drafter_id="sim-block", drafter_config={"block_size": 5}, tree_policy="chain", dtype="float32",
                       device="none") as rec:
        part = {name: getattr(sim, name).loc[getattr(sim, name)["run_id"] == "sim-block"].assign(run_id="other")
                for name in ("tokens", "rounds", "requests")}
        rec.log_columns(**{name: {c: f[c].to_numpy() for c in f.columns} for name, f in part.items()})
    return root / "fleet"


def test_two_arms_under_one_drafter_id_are_refused(tmp_path):
    two_arms_of_one_drafter_id(tmp_path, requests=2, tokens=(30, 50), shards=1)
    with pytest.raises(ValueError, match="mix arms"):
        aggregate_at_risk_sql(tmp_path / "fleet")
    # one arm's runs alone are fine
    assert aggregate_at_risk_sql(tmp_path / "fleet" / "sim-block")["n"].sum() > 0


def test_invalid_covariates_are_refused_or_dropped_as_in_memory(tmp_path):
    sim = simulate_traces(seed=7, n_requests_per_category=3, tokens_per_request=(40, 60), block_size=5)
    root = write_runs(tmp_path / "fleet", sim, shards=2)
    shard = sorted((root / "sim-block" / "shards").iterdir())[0] / "tokens.parquet"
    table = pq.read_table(shard)
    at_risk = np.flatnonzero(np.isin(table.column("role").to_numpy(zero_copy_only=False), ["accepted", "correction"]))
    entropy = table.column("target_entropy_nats").to_numpy().copy()
    entropy[at_risk[3]] = np.nan  # NaN, not null: the file keeps its schema
    gap = table.column("target_logit_gap").to_numpy().copy()
    gap[at_risk[7]] = np.inf
    for name, values in (("target_entropy_nats", entropy), ("target_logit_gap", gap)):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.schema.field(i), pa.array(values, type=pa.float32(), from_pandas=False))
    pq.write_table(table, shard)
    with pytest.raises(ValueError, match="invalid covariates at at-risk positions: 2 rows"):
        aggregate_at_risk_sql(root / "sim-block")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = pandas_aggregate(root / "sim-block", on_invalid="drop", validate=False)
    assert_same_cells(aggregate_at_risk_sql(root / "sim-block", on_invalid="drop"), ref)


def test_a_nan_entropy_off_the_risk_set_enters_the_sequence_covariates_as_in_memory(tmp_path):
    """A bonus token (never at risk) with a NaN entropy: the in-memory path skips it in the running sum (still
    counting the position) and the next position takes its own H as the previous one; so does the query."""
    sim = simulate_traces(seed=8, n_requests_per_category=3, tokens_per_request=(40, 60), block_size=5)
    root = write_runs(tmp_path / "fleet", sim, shards=2)
    shard = sorted((root / "sim-block" / "shards").iterdir())[0] / "tokens.parquet"
    table = pq.read_table(shard)
    roles = table.column("role").to_numpy(zero_copy_only=False)
    bonus = np.flatnonzero(roles == "bonus")
    entropy = table.column("target_entropy_nats").to_numpy().copy()
    entropy[bonus[[1, 4]]] = np.nan
    i = table.schema.get_field_index("target_entropy_nats")
    table = table.set_column(i, table.schema.field(i), pa.array(entropy, type=pa.float32(), from_pandas=False))
    pq.write_table(table, shard)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for family in ("law_exp_lag", "law_exp_runmean"):
            ref = pandas_aggregate(root / "sim-block", family, validate=False)
            assert_same_cells(aggregate_at_risk_sql(root / "sim-block", family), ref)


def test_the_documented_query_is_the_one_the_driver_runs():
    """docs/out-of-core.md shows the query for law_exp with every covariate mean: the same text as
    at_risk_sql() returns, so the page cannot drift from the code."""
    text = DOCS.read_text()
    blocks = re.findall(r"```sql\n(.*?)```", text, flags=re.S)
    assert blocks, "docs/out-of-core.md has no ```sql block"
    assert blocks[0].strip() == at_risk_sql().strip()


@pytest.mark.parametrize("family", ["law_exp_cum", "law_exp_obs"])
def test_the_query_over_all_files_at_once_gives_the_same_cells(fleet, family):
    """As a cluster engine would run it: one query over every shard file (no groups), its raw rows made
    into the aggregate by finish_cells."""
    import duckdb

    from entropy_law.outofcore import finish_cells

    path, _ = fleet
    traces = load_traces(path)
    con = duckdb.connect()
    con.read_parquet(traces.dataset("tokens").files).create_view("tokens")
    con.read_parquet(traces.dataset("rounds").files).create_view("rounds")
    con.register("runs", traces.runs[["run_id", "drafter_id"]].astype(str))
    fam = get_family(family)
    means = [*atrisk.COVARIATES, *atrisk.DERIVED, *fam.means]
    query = at_risk_sql(bin_columns=fam.bin_columns, means=means, drafted_depth_key=bool(fam.extra_keys))
    cells = finish_cells(con.sql(query).df(), family)
    assert_same_cells(cells, pandas_aggregate(path, family))


def test_the_law_command_fits_out_of_core(fleet, capsys):
    from entropy_law.cli import main

    path, _ = fleet
    assert main(["law", str(path), "--out-of-core"]) == 0  # the primary law by default, as without --out-of-core
    text = capsys.readouterr().out
    memory = fit_law(make_view(load_traces(path)), PRIMARY_FAMILY, by="drafter_id")  # one law per arm label
    assert len(memory.laws) == 2 and "fitted out of core" in text and PRIMARY_FAMILY in text
    for arm, law in memory.laws.items():
        assert f"=== {arm} ===" in text
        assert f"{law.result.params['log_entropy']:.4f}" in text  # the printed estimate is fit_law's
    assert main(["law", str(path), "--out-of-core", "--family", "law_exp"]) == 0
    slope = fit_law(load_traces(path), "law_exp", by="drafter_id")["sim-block"].result.params["log_entropy"]
    assert f"{slope:.4f}" in capsys.readouterr().out
    assert main(["law", str(path), "--out-of-core", "--loco"]) != 0
    assert "drop --loco / --tests" in capsys.readouterr().err


# --- the out-of-core report: its summaries against the pandas path, the arms kept apart, the command


def test_category_summary_equals_the_pandas_numbers(fleet):
    path, _ = fleet
    sql = category_summary_sql(path, chunk_bytes=1, threads=1).set_index(["drafter_id", "category"])  # per shard
    traces = load_traces(path)
    req = traces.requests.merge(traces.runs[["run_id", "drafter_id"]], on="run_id")[
        ["run_id", "request_id", "category", "drafter_id"]]
    rounds = traces.rounds.merge(req, on=["run_id", "request_id"])
    rounds = rounds.loc[rounds["round_index"] > 0]
    tokens = traces.tokens.drop(columns="category").merge(req, on=["run_id", "request_id"])
    for (drafter, cat), part in rounds.groupby(["drafter_id", "category"]):
        row = sql.loc[(drafter, cat)]
        drafting = part.loc[part["tree_nodes"] > 0]
        mine = tokens.loc[(tokens["drafter_id"] == drafter) & (tokens["category"] == cat)]
        first = mine.loc[(mine["depth"] == 1) & mine["role"].isin(["accepted", "correction"])]
        assert row["requests"] == len(req.loc[(req["drafter_id"] == drafter) & (req["category"] == cat)])
        assert (row["rounds"], row["tokens"], row["drafting_rounds"]) == (len(part), part["committed"].sum(),
                                                                           len(drafting))
        assert row["tokens_per_round"] == pytest.approx(part["committed"].sum() / len(part))
        assert row["mean_accepted"] == pytest.approx(drafting["accepted"].mean())
        assert row["mean_entropy_nats"] == pytest.approx(mine["target_entropy_nats"].mean())
        assert row["d1_trials"] == len(first)
        assert row["d1_acceptance"] == pytest.approx((first["role"] == "accepted").mean())
    assert len(sql) == rounds.groupby(["drafter_id", "category"]).ngroups


def test_acceptance_curve_equals_the_binned_at_risk_rows(fleet):
    path, _ = fleet
    width, eps = 0.25, atrisk.EPS_NATS
    curve = acceptance_curve_sql(path, width_log10=width, chunk_bytes=1, threads=1)
    rows = atrisk.at_risk_table(load_traces(path))
    rows = rows.loc[rows["depth"] == 1]
    h = rows["target_entropy_nats"].to_numpy(float)
    rows = rows.assign(bin=np.floor((np.log10(h + eps) - np.log10(eps)) / width).astype(int))
    ref = rows.groupby(["drafter_id", "category", "bin"]).agg(n=("accepted", "size"), accepted=("accepted", "sum"),
                                                               entropy_nats=("target_entropy_nats", "mean"))
    got = curve.set_index(["drafter_id", "category", "bin"]).loc[ref.index]
    assert len(curve) == len(ref)
    np.testing.assert_array_equal(got["n"].to_numpy(), ref["n"].to_numpy())
    np.testing.assert_array_equal(got["accepted"].to_numpy(), ref["accepted"].to_numpy())
    np.testing.assert_allclose(got["entropy_nats"].to_numpy(), ref["entropy_nats"].to_numpy(), rtol=1e-12)
    assert ((got["ci_low"] <= got["rate"] + 1e-12) & (got["rate"] <= got["ci_high"] + 1e-12)).all()
    with pytest.raises(ValueError, match="width_log10"):
        acceptance_curve_sql(path, width_log10=0)


def test_report_summaries_in_one_read_equal_the_two_queries(fleet):
    path, _ = fleet
    summary, curve = report_summaries_sql(path, width_log10=0.2, chunk_bytes=1, threads=1)
    pd.testing.assert_frame_equal(summary, category_summary_sql(path, chunk_bytes=1, threads=1))
    pd.testing.assert_frame_equal(curve, acceptance_curve_sql(path, width_log10=0.2, chunk_bytes=1, threads=1))
    assert len(summary) and len(curve)
    with pytest.raises(ValueError, match="width_log10"):
        report_summaries_sql(path, width_log10=-1)


def test_by_arm_keeps_two_arms_of_one_drafter_id_apart_as_make_view(tmp_path):
    two_arms_of_one_drafter_id(tmp_path, requests=5, tokens=(40, 70), shards=2)
    with pytest.raises(ValueError, match="mix arms"):
        category_summary_sql(tmp_path / "fleet")
    view = make_view(load_traces(tmp_path / "fleet"))
    labels = set(view.runs["arm"])
    summary = category_summary_sql(tmp_path / "fleet", by_arm=True)
    assert set(summary["drafter_id"]) == labels and len(labels) == 2  # the two sim-block arms stay apart
    memory = fit_law(view, "law_exp", by="drafter_id")
    out = fit_law_out_of_core(tmp_path / "fleet", "law_exp", by="drafter_id", by_arm=True)
    assert set(out.laws) == set(memory.laws)
    for arm in memory.laws:
        assert_same_law(out[arm], memory[arm])


def test_the_report_command_out_of_core(fleet, tmp_path, capsys):
    from entropy_law.cli import main

    path, _ = fleet
    out = tmp_path / "report"
    assert main(["report", str(path), "--out", str(out), "--out-of-core", "--format", "md", "--family", "law_exp"]) == 0
    text = (out / "report.md").read_text()
    assert "Results per category (out of core)" in text and "Fitted law per arm (out of core, law_exp)" in text
    assert "## Runs" in text and all(run_id in text for run_id in load_traces(path).runs["run_id"])
    assert (out / "figures" / "acceptance_out_of_core.png").exists()
    memory = fit_law(make_view(load_traces(path)), "law_exp", by="drafter_id")  # keyed by arm, as the report
    assert len(memory.laws) == 2
    for arm, law in memory.laws.items():
        k = law.derived.loc["k"]
        assert f"| {arm} | law_exp | {k['estimate']:.3g} [{k['ci_low']:.3g}, {k['ci_high']:.3g}]" in text
    assert "need the rows in memory" in text
    capsys.readouterr()
    assert main(["report", str(path), "--out", str(out), "--out-of-core", "--results-md", "x.md"]) != 0
    assert "--results-md: not with --out-of-core" in capsys.readouterr().err
    assert main(["report", str(path), "--out", str(out), "--memory-limit", "1GB"]) != 0
    assert "add --out-of-core" in capsys.readouterr().err


def test_an_in_memory_analysis_too_large_for_memory_is_refused_before_reading(fleet, tmp_path, monkeypatch, capsys):
    from entropy_law.cli import main
    from entropy_law.outofcore import memory as outofcore

    path, _ = fleet
    rows = outofcore.check_fits_in_memory(path, "the law", available=10**15)
    assert rows == len(load_traces(path).tokens)
    with pytest.raises(ValueError, match="--out-of-core"):
        outofcore.check_fits_in_memory(path, "the law", available=rows * outofcore.IN_MEMORY_BYTES_PER_TOKEN_ROW - 1)
    monkeypatch.setattr(outofcore, "available_memory", lambda: 1024)  # 1 KiB free: nothing fits
    assert main(["report", str(path), "--out", str(tmp_path / "r")]) != 0
    assert "the report in memory" in capsys.readouterr().err and not (tmp_path / "r").exists()
    assert main(["law", str(path)]) != 0
    assert "--no-memory-check runs it anyway" in capsys.readouterr().err
    assert main(["law", str(path), "--no-memory-check", "--family", "law_exp"]) == 0
    assert main(["report", str(path), "--out", str(tmp_path / "r"), "--out-of-core", "--format", "md"]) == 0
