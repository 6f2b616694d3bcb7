"""Report and results tables on simulated traces: numbers against independent pandas computations,
self-contained HTML, Markdown with images, the command line (and its errors)."""

from __future__ import annotations

import base64
import re

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from entropy_law.analysis import AR_ARM, TraceAnalysis  # noqa: E402
from entropy_law.cli import main  # noqa: E402
from entropy_law.plots.gallery import FIGURES  # noqa: E402
from entropy_law.jobs.report import results_markdown, terminal_summary, write_report  # noqa: E402
from entropy_law.traces.reader import load_traces  # noqa: E402
from tests.report_helpers import FAST, small_traces  # noqa: E402


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    path = small_traces(tmp_path_factory.mktemp("sim"))
    traces = load_traces(path)
    return path, traces, TraceAnalysis(traces, **FAST)


def test_arms_ar_detection_and_labels(sim):
    _, _, an = sim
    assert an.arms == ["sim-block chain", "sim-tree ddtree16"]
    assert an.has_ar and an.runs.loc[an.runs["is_ar"], "run_id"].tolist() == ["sim-ar"]


def test_results_table_matches_independent_computation(sim):
    _, traces, an = sim
    table = an.results_table().set_index(["arm", "category"])
    rounds = traces.rounds.astype({"run_id": str, "request_id": str})
    req = traces.requests.astype({"run_id": str, "request_id": str, "category": str})
    rounds = rounds.merge(req[["run_id", "request_id", "category"]], on=["run_id", "request_id"])
    tokens = traces.tokens.astype({"run_id": str, "category": str})
    for run_id, arm in (("sim-block", "sim-block chain"), ("sim-tree", "sim-tree ddtree16"), ("sim-ar", AR_ARM)):
        for cat in sorted(req["category"].unique()):
            mine = rounds.loc[(rounds["run_id"] == run_id) & (rounds["category"] == cat) & (rounds["round_index"] > 0)]
            row = table.loc[(arm, cat)]
            assert row["committed_per_round"] == pytest.approx(mine["committed"].sum() / len(mine))
            assert row["requests"] == mine["request_id"].nunique()
            h = tokens.loc[(tokens["run_id"] == "sim-block") & (tokens["category"] == cat), "target_entropy_nats"]
            assert row["mean_entropy_nats"] == pytest.approx(h.mean(), rel=1e-6)
            if arm != AR_ARM:
                drafted = mine.loc[mine["tree_nodes"] > 0, "accepted"]
                assert row["mean_accepted"] == pytest.approx(drafted.mean())
                # measured speedup: AR decode ms per token / arm decode ms per token (tokens after the prefill)
                ar = req.loc[(req["run_id"] == "sim-ar") & (req["category"] == cat)]
                me = req.loc[(req["run_id"] == run_id) & (req["category"] == cat)]
                expected = (ar["decode_ms"].sum() / (ar["new_tokens"] - 1).sum()) / (
                    me["decode_ms"].sum() / (me["new_tokens"] - 1).sum())
                assert row["speedup_vs_ar"] == pytest.approx(expected, rel=1e-5)
                assert row["speedup_vs_ar"] > 1  # the simulated drafters accept plenty
                assert row["speedup_requests"] == len(set(ar["request_id"]) & set(me["request_id"])) > 0
            else:
                assert row["speedup_vs_ar"] == 1.0
                assert row["speedup_requests"] == row["requests"]


def test_law_table_recovers_the_simulated_exponent(sim):
    _, _, an = sim
    law = an.law_table().set_index("arm")
    for arm in an.arms:
        assert law.loc[arm, "k_low"] < 0.8 < law.loc[arm, "k_high"]  # simulate_traces' k
        assert 0 < law.loc[arm, "breakeven_nats"] < np.inf


@pytest.fixture(scope="module")
def command_report(tmp_path_factory):
    """``entropy-law report --format html`` in this process on the block arm's run and the AR run of their own
    simulated traces in three categories (the fewest LOCO runs on) and law_exp, the block run with its replayed
    proposals (a full block at every position, as the simulated drafter drafts): one drafting arm is enough for
    what the command adds (the report of both arms on five categories with the primary law is checked below), and
    the shared traces stay without proposals. (traces, --out, exit code, what it printed)."""
    import contextlib
    import io
    import shutil

    from entropy_law.analysis.sample_traces import write_simulated_traces
    from entropy_law.traces.proposals import write_proposals
    from tests.test_replayed_proposals import _full_proposals

    tmp = tmp_path_factory.mktemp("cli")
    path = write_simulated_traces(tmp / "traces", seed=3, n_requests_per_category=5, tokens_per_request=(40, 60),
                                  categories=["qa", "rag", "math_reasoning"])
    shutil.rmtree(path / "sim-tree")
    write_proposals(path / "sim-block", _full_proposals(load_traces(path / "sim-block")), {"by": "test"})
    out, printed = tmp / "cli", io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["report", str(path), "--out", str(out), "--format", "html", "--n-boot", "2", "--family",
                     "law_exp", "--compare-families", "law_exp", "law_logit", "--results-md", str(out / "results.md"),
                     "--no-progress", "--no-pdf"])
    return path, out, code, printed.getvalue()


def test_html_report_is_self_contained(command_report):
    """The command's HTML report: one page, every figure embedded as a PNG."""
    _, out, code, printed = command_report
    assert code == 0 and f"report: {out / 'report.html'}" in printed.splitlines()
    text = (out / "report.html").read_text()
    assert text.count("data:image/png;base64,") == len(FIGURES)
    first = text.split("data:image/png;base64,")[1].split("'")[0]
    assert base64.b64decode(first)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<table" in text and "sim-block chain" in text and "Leave-one-category-out" in text
    assert "src='figures/" not in text and 'src="http' not in text


@pytest.fixture(scope="module")
def md_report(sim, tmp_path_factory):
    """One Markdown report (PNG and PDF figures) of the simulated traces, read by the tests below."""
    _, traces, an = sim
    return write_report(traces, tmp_path_factory.mktemp("md"), fmt="md", analysis=an, figure_formats=("png", "pdf"))


def test_markdown_report_links_existing_pngs_and_results_section(sim, md_report):
    _, _, an = sim
    path = md_report
    text = path.read_text()
    links = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert len(links) == len(FIGURES)
    assert all((path.parent / link).is_file() for link in links)
    assert all((path.parent / link).with_suffix(".pdf").is_file() for link in links)
    md = results_markdown(an, source="data/traces")
    table_rows = [line for line in md.splitlines() if line.startswith("| sim-") or line.startswith("| AR |")]
    # 3 arms x 5 categories + the law table's 2 arms + the LOCO table's 2 arms x 2 depth modes (leak-free, oracle);
    # P1 with CV needs more than 5 requests per category: its reason is printed instead of a table
    assert len(table_rows) == 3 * 5 + 2 + 2 * 2
    assert "Universality (P1)" in md
    assert "Spearman ρ" in md and "Leave-one-category-out accuracy" in md
    summary = terminal_summary(an)
    # the workload verdict first (request mean entropy), the constant-entropy one named as such
    assert "drafting pays on" in summary and "at constant entropy pays below" in summary
    assert "nats (observed" in summary and "sim-tree ddtree16" in summary


def test_the_report_leads_with_the_answer_and_checks_it(sim, md_report):
    """#17: the answer first (per arm: break-even, the categories where drafting pays, measured and predicted side
    by side), then the predicted-vs-measured table and the crossing of measured speedups vs the break-even."""
    _, _, an = sim
    text = md_report.read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## When drafting pays (the answer)"
    answer = text.split("## When drafting pays (the answer)")[1].split("## ")[0]
    for arm in an.arms:
        assert f"- {arm}: drafting " in answer and "in these categories it pays for" in answer
    assert "measured" in answer and "predicted" in answer
    assert "## Predicted vs measured speedup (same requests)" in text
    assert "## Break-even vs where measured per-request speedups cross 1" in text
    for arm in an.arms:
        assert f"## When drafting pays on a workload: {arm}" in text
        assert f"## When drafting pays at constant entropy: {arm}" in text
    summary = terminal_summary(an)
    assert summary.startswith("When drafting pays") and summary.index("in these categories") < summary.index("\nfitted law")


def test_the_verdict_rule_at_its_edges():
    """One rule (``category_verdict``): "pays" / "does not pay" / "unclear" on the interval, or "not measured (N
    requests)" below 5 requests, where the upper end is more than twice the lower, or above the physical bound."""
    from entropy_law.jobs.report import category_verdict

    nan = float("nan")
    assert category_verdict(4, 1.10, 1.20) == "not measured (4 requests)"  # N = 4: too few, whatever the interval
    assert category_verdict(5, 1.10, 1.20) == "pays"  # N = 5: enough
    assert category_verdict(1, 1.10, 1.20) == "not measured (1 request)"
    assert category_verdict(12, 0.50, 1.00) == "unclear"  # upper = 2x lower: still judged (touches 1)
    assert category_verdict(12, 0.50, 1.0001) == "not measured (12 requests)"  # just above 2x lower
    assert category_verdict(12, 1.01, 2.02) == "pays" and category_verdict(12, 1.01, 2.03).startswith("not measured")
    assert category_verdict(12, 0.90, 1.10) == "unclear"  # straddles 1
    assert category_verdict(12, 1.00, 1.10) == "unclear" and category_verdict(12, 0.90, 1.00) == "unclear"  # ends
    assert category_verdict(12, 0.70, 0.95) == "does not pay"  # all below 1
    assert category_verdict(12, 0.00, 18830.97) == "not measured (12 requests)"
    assert category_verdict(12, nan, nan) == "not measured (12 requests)"
    assert category_verdict(12, 1.10, 1.20, above_bound=True) == "not measured (12 requests)"
    assert category_verdict(nan, 1.10, 1.20) == "not measured (0 requests)"


def test_the_answer_rests_on_the_measurement_else_on_the_prediction(sim):
    """Per arm and category the verdict rests on the paired measurement where the arm was measured there, else on
    the prediction for its requests priced one by one (``TraceAnalysis.workload``), and says which."""
    import pandas as pd

    from entropy_law.jobs.report import answer_frame, category_verdict, verdict_lines

    _, _, an = sim
    frame = answer_frame(an)
    for arm in frame["arm"].unique():
        cats = an.workload(arm).categories
        part = frame.loc[frame["arm"] == arm]
        assert part["workload_predicted"].to_numpy() == pytest.approx(
            cats.loc[part["category"].astype(str), "predicted_speedup"].to_numpy())
    for r in frame.itertuples():
        assert r.pays == category_verdict(r.verdict_requests, r.verdict_low, r.verdict_high,
                                          above_bound=r.verdict == "above the physical bound")
        if r.pays_from == "measured":
            assert (r.verdict_low, r.verdict_high, r.verdict_requests) == (r.lo, r.hi, r.requests)
        else:
            assert (r.verdict_low, r.verdict_high) == (r.workload_low, r.workload_high)
    assert set(frame["pays_from"]) == {"measured"}  # the simulated set has an AR run timed with every arm
    one = frame.iloc[0]
    measured = pd.DataFrame([dict(arm=one["arm"], category=one["category"], requests=3, speedup=1.5, lo=1.2, hi=1.9,
                                  verdict="not measured reliably")])
    got = answer_frame(an, measured).iloc[0]
    assert (got["pays"], got["pays_from"]) == ("not measured (3 requests)", "measured")
    lines = verdict_lines(an, measured)
    assert lines[0].startswith("When drafting pays") and lines[1] == one["arm"]
    assert lines[2].split() == [one["category"], "not", "measured", "(3", "requests)"]
    judged = [line for line in lines[3:] if line.startswith("  ") and "not measured" not in line]
    assert all(re.search(r"\d\.\d\dx \[\d+\.\d\d, \d+\.\d\d\]  measured, \d+ requests$", line) for line in judged)


def test_a_loaded_machine_gets_no_verdict(sim):
    """The CPU time decoding got over its rounds' wall time (``cpu_share``): a run whose decoding got less than
    ``MIN_CPU_SHARE`` of its threads' time says the machine was loaded and gives no verdict in any category."""
    from types import SimpleNamespace

    import pandas as pd

    from entropy_law.jobs.report import LOADED, MIN_CPU_SHARE, cpu_share, load_note, verdict_lines

    rounds = pd.DataFrame({"run_id": ["r"] * 4, "request_id": ["a", "a", "b", "b"], "draft_ms": [10.0] * 4,
                           "verify_ms": [30.0] * 4, "overhead_ms": [0.0] * 4})
    quiet = SimpleNamespace(rounds=rounds, requests=pd.DataFrame({"run_id": ["r", "r"], "request_id": ["a", "b"],
                                                                    "decode_cpu_ms": [78.0, 80.0]}))
    busy = SimpleNamespace(rounds=rounds, requests=quiet.requests.assign(decode_cpu_ms=[40.0, 44.0]))
    assert cpu_share(quiet) == pytest.approx(0.9875) and cpu_share(busy) == pytest.approx(0.525)
    assert cpu_share(busy, threads=2) == pytest.approx(0.2625)
    assert cpu_share(SimpleNamespace(rounds=rounds, requests=quiet.requests.drop(columns="decode_cpu_ms"))) is None
    assert load_note(cpu_share(quiet)) is None and load_note(None) is None
    note = load_note(cpu_share(busy))
    assert "loaded" in note and "52%" in note and f"{MIN_CPU_SHARE:.0%}" in note
    _, _, an = sim
    lines = verdict_lines(an, loaded=note)
    assert lines[1] == note
    rows = [line for line in lines[2:] if line.startswith("  ")]
    assert rows and all(line.endswith(LOADED) for line in rows)
    assert not any(line.endswith(LOADED) for line in verdict_lines(an))


def test_report_command_and_its_errors(command_report, tmp_path, capsys):
    """Also: the command finds proposals.parquet beside a run (``traces.proposals``) and adds the LOCO sections
    with the drafter's replayed proposals; ``--no-pdf`` writes the PNGs only."""
    path, out, code, _ = command_report
    assert len(load_traces(path).runs) == 2
    assert code == 0
    figures = out / "figures"
    assert len(list(figures.glob("*.png"))) == len(FIGURES) and not list(figures.glob("*.pdf"))  # --no-pdf
    assert (out / "report.html").is_file() and (out / "results.md").read_text().startswith("## Results")
    assert "Leave-one-category-out transfer, leak-free (the drafter&#x27;s replayed proposals)" in (
        out / "report.html").read_text()
    assert main(["report", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "not found" in capsys.readouterr().err


def test_analysis_that_cannot_run_is_a_note_not_a_crash(sim):
    _, traces, _ = sim
    an = TraceAnalysis(traces.filter(category=["qa", "rag"]), **FAST)
    loco = an.attempt("loco", an.arms[0])
    assert not loco.ok and "at least 3 categories" in loco.error
    assert an.results_table()["loco_tokens_per_round"].isna().all()


def test_loco_accuracy_table_and_column_come_from_the_loco_transfer(sim):
    _, _, an = sim
    acc = an.loco_accuracy()
    table = an.results_table().set_index(["arm", "category"])
    for arm in an.arms:
        loco = an.loco(arm)
        mine = acc.loc[(acc["arm"] == arm) & (acc["depths"] == "training")].set_index("quantity")
        expected = loco.accuracy
        np.testing.assert_allclose(mine.loc[expected.index, "spearman_rho"], expected["spearman_rho"])
        np.testing.assert_allclose(mine.loc[expected.index, "mean_abs_relative_error"],
                                   expected["mean_abs_relative_error"])
        for cat, row in loco.summary.iterrows():
            assert table.loc[(arm, cat), "loco_mean_accepted"] == pytest.approx(row["predicted_mean_accepted"])
        assert loco.depths == "training"  # the leak-free default (issue #18); the oracle rows sit beside it
        assert set(acc.loc[acc["arm"] == arm, "depths"]) == {"training", "oracle"}


def test_several_ar_models_are_listed_and_an_arm_without_speedup_says_why(tmp_path):
    """Two models, each with its own AR run (model A's on another device): the results section lists both
    AR arms by label, the runs table shows the machine, and the Notes say why model A's arm has no speedup
    while model B's has one (law_exp: the family fitted is not what is under test here)."""
    from entropy_law.jobs.report import _sections
    from tests.test_law_arms import MODEL_A, MODEL_B, _simulated, write_run

    sims = {MODEL_A: _simulated(1), MODEL_B: _simulated(2)}
    for run_id, kind, model, meta in (("a-ngram", "ngram", MODEL_A, {}), ("b-ngram", "ngram", MODEL_B, {}),
                                      ("b-ar", "ar", MODEL_B, {}), ("a-ar-gpu", "ar", MODEL_A, {"device": "cuda:0"})):
        write_run(tmp_path, sims, run_id, kind, model, **meta)
    an = TraceAnalysis(load_traces(tmp_path), n_boot=3, compare_families=("law_exp",), n_folds=3, family="law_exp")
    assert sorted(an.ar_arms) == sorted([f"{MODEL_A}/AR", f"{MODEL_B}/AR"]) and AR_ARM not in an.ar_arms
    md = results_markdown(an)
    listed = next(line for line in md.splitlines() if line.startswith("Traces:")).split("arms: ")[1]
    assert listed.rstrip(".").split(", ") == an.arms + an.ar_arms
    sections = dict(_sections(an))
    runs = sections["Runs"].set_index("run_id")
    assert runs.loc["a-ar-gpu", "machine"] == f"model {MODEL_A} on device cuda:0"
    assert runs.loc["a-ngram", "machine"] == f"model {MODEL_A} on device cpu"
    assert set(an.measured_speedups()["arm"]) == {f"{MODEL_B}/ngram chain"}
    assert any(n.startswith(f"arm '{MODEL_A}/ngram chain': no timed AR run of the same model and machine")
               for n in sections["Notes"])


def test_markdown_table_escapes_pipes_inside_cells():
    """The LOCO table's header "mean |rel. error|" split one column into three (36 columns for 20)."""
    import re

    import pandas as pd

    from entropy_law.jobs.report import markdown_table

    table = markdown_table(pd.DataFrame({"arm": ["a|b"], "mean |rel. error|": [0.1234]}))
    for line in table.splitlines():
        assert len(re.split(r"(?<!\\)\|", line)) - 2 == 2  # two cells per row, whatever the cells hold
    assert "mean \\|rel. error\\|" in table and "a\\|b" in table
