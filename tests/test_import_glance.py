"""`entropy-law import glance` / `export --format glance`: GLANCE's round log as a trace run and back (#20)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

from entropy_law.cli import main
from entropy_law.importers.glance import export_glance_rounds, import_glance
from entropy_law.law.fit import fit_law
from entropy_law.glance import fit_glance, read_glance_rounds
from entropy_law.traces.reader import load_traces
from entropy_law.traces.schema import TOKENS_SCHEMA

FIXTURE = Path(__file__).parent / "data" / "glance" / "rounds.jsonl"  # GLANCE-shaped, made by make_rounds.py


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("glance") / "run"
    assert main(["import", "glance", str(FIXTURE), "--out", str(out)]) == 0
    return out, load_traces(out)


def read_like_glance_fit_law(path):
    """What GLANCE's experiments/fit_law.py needs of each line (its reader, restated): a JSON object per
    non-blank line, grouped by row.get("task", "all"), with numeric "entropy" and "accepted"."""
    by_task = collections.defaultdict(list)
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            by_task[row.get("task", "all")].append(row)
    for rows in by_task.values():
        for r in rows:
            assert isinstance(r["entropy"], float) and isinstance(r["accepted"], int) and r["accepted"] >= 0
    return by_task


def test_import_writes_only_what_the_log_holds(imported):
    _, traces = imported
    log = read_glance_rounds(FIXTURE)
    tokens, rounds, requests = traces.tokens, traces.rounds, traces.requests
    assert len(rounds) == len(log) == 120 and len(requests) == log["request_id"].nunique()
    assert sorted(requests["category"].astype(str).unique()) == sorted(log["task"].unique())  # tasks -> categories
    assert tokens["token_id"].isna().all()  # nothing fabricated
    root = tokens["depth"] == 1
    assert tokens.loc[root, "target_entropy_nats"].notna().all()
    assert tokens.loc[~root, "target_entropy_nats"].isna().all()
    for col in ("target_renyi2_nats", "target_top1_prob", "target_top2_prob", "target_logit_gap"):
        assert tokens[col].isna().all()
    merged = rounds.astype({"request_id": str}).merge(
        tokens.loc[root].astype({"request_id": str})[["request_id", "round_index", "target_entropy_nats"]],
        on=["request_id", "round_index"])
    want = log.set_index(["request_id", "round"])
    for rec in merged.itertuples():
        row = want.loc[(rec.request_id, rec.round_index)]
        assert rec.target_entropy_nats == np.float32(row.entropy)
        assert rec.accepted == row.accepted and rec.committed == row.tau
    # positions rebuilt from tau: each round starts where the prompt's earlier rounds ended
    for request_id, part in rounds.astype({"request_id": str}).groupby("request_id"):
        part = part.sort_values("round_index")
        ends = np.cumsum(part["committed"].to_numpy())
        assert part["start_position"].tolist() == [0, *ends[:-1].tolist()]
        assert int(requests.loc[requests["request_id"].astype(str) == request_id, "new_tokens"].iloc[0]) == ends[-1]
    assert (rounds[["draft_ms", "verify_ms", "overhead_ms"]] == 0).all().all()  # no timings: 0, not invented
    assert (requests[["prefill_ms", "decode_ms"]] == 0).all().all()


def test_run_metadata_says_what_is_missing(imported):
    out, traces = imported
    meta = next(iter(traces.metadata.values()))
    assert meta["imported_from"] == "glance" and meta["target_stats_scope"] == "round_root"
    info = meta["glance_import"]
    assert set(info["missing"]) >= {"token_id", "target statistics", "timings"}
    assert info["rounds"] == 120 and info["skipped_bad"] == 0 and len(info["source_sha256"]) == 64
    assert json.loads((out / "run.json").read_text())["imported_from"] == "glance"


def test_tokens_columns_are_nullable_in_the_schema():
    for name in ("token_id", "target_entropy_nats", "target_renyi2_nats", "target_top1_prob", "target_top2_prob",
                 "target_logit_gap"):
        assert TOKENS_SCHEMA.field(name).nullable
    for name in ("position", "depth", "role", "round_index"):
        assert not TOKENS_SCHEMA.field(name).nullable


def test_glance_fit_of_the_run_equals_the_fit_of_the_log(imported):
    _, traces = imported
    log = read_glance_rounds(FIXTURE)
    on_run = fit_glance(traces)
    on_log32 = fit_glance(log.assign(entropy=log["entropy"].astype(np.float32).astype(float)))
    assert (on_run.b0, on_run.b1_fitted) == pytest.approx((on_log32.b0, on_log32.b1_fitted), abs=1e-9)
    on_log = fit_glance(log)  # the trace format stores entropies as float32: a difference of ~1e-8
    assert (on_run.b0, on_run.b1_fitted) == pytest.approx((on_log.b0, on_log.b1_fitted), abs=1e-6)
    assert set(on_run.per_category) == {"caption", "chartqa"}
    assert fit_glance(traces, form="readme").form == "readme"


@pytest.mark.parametrize("family", ["law_exp", "law_exp_obs_ceil", "law_logit"])
def test_laws_of_per_position_entropy_refuse_the_run(imported, family):
    _, traces = imported
    run_id = str(traces.runs["run_id"].iloc[0])
    with pytest.raises(ValueError, match=rf"{run_id}.*round's root only.*fit_glance\(traces\)"):
        fit_law(traces, family=family)


def test_export_import_export_is_identical(imported, tmp_path, capsys):
    out, _ = imported
    assert main(["export", "--format", "glance", str(out)]) == 0
    first = capsys.readouterr().out
    assert len(first.splitlines()) == 120
    exported = tmp_path / "rounds.jsonl"
    exported.write_text(first)
    assert main(["import", "glance", str(exported), "--out", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    assert main(["export", "--format", "glance", str(tmp_path / "again"), "--out", str(tmp_path / "second.jsonl")]) == 0
    assert (tmp_path / "second.jsonl").read_text() == first
    # the rows are the log's rows, up to float32 entropies and the order (task, prompt, round)
    log = read_glance_rounds(FIXTURE).sort_values(["task", "prompt", "round"], ignore_index=True)
    back = read_glance_rounds(exported)
    for col in ("round", "accepted", "tau", "tree_size", "extended", "task", "prompt"):
        assert back[col].tolist() == log[col].tolist(), col
    assert back["entropy"].to_numpy() == pytest.approx(log["entropy"].to_numpy(), abs=1e-6)
    by_task = read_like_glance_fit_law(exported)
    assert sorted(by_task) == ["caption", "chartqa"] and sum(map(len, by_task.values())) == 120


def test_export_of_recorded_traces_reads_in_glance(tmp_path):
    from entropy_law.analysis.simulate import simulate_traces

    traces = simulate_traces(seed=3, n_requests_per_category=4, categories=["qa", "rag"], block_size=5,
                             tokens_per_request=(30, 50))
    path = tmp_path / "sim.jsonl"
    n = export_glance_rounds(traces, path)
    by_task = read_like_glance_fit_law(path)
    assert sum(map(len, by_task.values())) == n > 0 and sorted(by_task) == ["qa", "rag"]
    run = tmp_path / "run"
    import_glance(path, run)
    again = tmp_path / "again.jsonl"
    export_glance_rounds(load_traces(run), again)
    assert again.read_text() == path.read_text()


def test_extended_rounds_and_absent_fields_survive(tmp_path):
    rows = [{"round": r, "entropy": 0.25 * (r + 1), "accepted": r % 3, "tau": r % 3 + 1, "extended": r == 2}
            for r in range(4)]
    path = tmp_path / "bare.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    import_glance(path, tmp_path / "run")
    out = tmp_path / "out.jsonl"
    export_glance_rounds(load_traces(tmp_path / "run"), out)
    back = [json.loads(line) for line in out.read_text().splitlines()]
    assert [b["extended"] for b in back] == [False, False, True, False]
    assert all(b["tree_size"] is None and b["task"] == "all" and b["prompt"] == 0 for b in back)


GOOD = {"round": 0, "entropy": 0.5, "accepted": 2, "tau": 3, "tree_size": 64, "extended": False, "task": "docvqa",
        "prompt": 0}


@pytest.mark.parametrize("change, field", [
    ({"entropy": None}, "entropy"),
    ({"entropy": "high"}, "entropy"),
    ({"entropy": -0.3}, "entropy"),
    ({"accepted": -1, "tau": 0}, "accepted"),
    ({"tau": 7}, "tau"),
    ("drop accepted", "accepted"),
])
def test_bad_lines_name_line_and_field(tmp_path, capsys, change, field):
    bad = {k: v for k, v in GOOD.items() if k != "accepted"} if change == "drop accepted" else {**GOOD, **change}
    rows = [GOOD, {**GOOD, "round": 1}, {**bad, "round": 2}, {**GOOD, "round": 3}]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["import", "glance", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3:" in err and f"'{field}'" in err and "--skip-bad" in err
    assert not (tmp_path / "run").exists()
    assert main(["import", "glance", str(path), "--out", str(tmp_path / "run"), "--skip-bad"]) == 0
    captured = capsys.readouterr()
    assert f"skipped {path}:3: {field}:" in captured.err
    traces = load_traces(tmp_path / "run")
    info = next(iter(traces.metadata.values()))["glance_import"]
    assert info["skipped_bad"] == 1 and info["skipped_lines"][0]["line"] == 3
    assert info["skipped_lines"][0]["field"] == field
    assert sorted(traces.rounds["round_index"].tolist()) == [0, 1, 3]


def test_report_and_figures_accept_the_run(imported, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from entropy_law.jobs.report import write_report
    from entropy_law.analysis import TraceAnalysis
    from entropy_law.plots.gallery import build_figure
    from entropy_law.plots.glance import glance_section

    _, traces = imported
    analysis = TraceAnalysis(traces, n_boot=0)
    title, frame, notes = glance_section(analysis)
    assert frame["law"].str.startswith("glance").all() and len(frame) == 2  # LOCO and in-sample GLANCE rows
    assert any("round's root only" in n for n in notes)  # ours cannot be fitted: said, not dropped silently
    fig = build_figure(analysis, "fig11_glance")
    assert len(fig.axes) == 1 and fig.axes[0].get_lines()
    path = write_report(traces, tmp_path / "report", fmt="md", analysis=analysis, figure_formats=("png",))
    text = path.read_text()
    assert "GLANCE's law beside ours" in text and "no timings" in text
    results = text.split("## Results per category", 1)[1].split("\n## ", 1)[0]
    lines = [line.strip("|").split("|") for line in results.strip().splitlines() if line.startswith("|")]
    header, rows = [c.strip() for c in lines[0]], lines[2:]
    assert len(rows) == 2 and all(row[header.index("speedup vs AR")].strip() == "–" for row in rows)  # no number


def test_an_ar_run_is_refused_by_the_export_and_by_the_law(tmp_path, capsys):
    """An AR run has no drafting round: the export used to write an empty log (exit 0) and `entropy-law law`
    printed nothing (exit 0); both now say why and exit 2, and no file is written."""
    from entropy_law.cli import main

    ar = Path(__file__).resolve().parents[1] / "data" / "traces" / "ar"
    out = tmp_path / "rounds.jsonl"
    assert main(["export", "--format", "glance", str(ar), "--out", str(out)]) == 2
    assert "hold no drafting round" in capsys.readouterr().err and not out.exists()
    assert main(["law", str(ar)]) == 2
    assert "no at-risk draft in these traces" in capsys.readouterr().err
