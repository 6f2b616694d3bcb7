"""Importers: engine responses (vLLM, SGLang, llama.cpp) into trace runs, checked, never repaired.

The fixtures in ``tests/data/engines/`` are shaped as the engines document their responses (vLLM's current
``metrics.speculative_decoding`` and its earlier per-choice ``speculative_decoding_stats``, SGLang's
``meta_info`` with and without the detailed per-step lists, llama.cpp's ``/completion``); the values are made
up and consistent. No model is loaded here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from entropy_law.cli import main
from entropy_law.importers import (MalformedResponseError, acceptance_by_depth, import_jsonl, parse_jsonl,
                                   read_import)
from entropy_law.importers.writer import METADATA_KEY, RECORD_FILE
from entropy_law.law.atrisk import at_risk_table
from entropy_law.traces.reader import load_traces
from entropy_law.traces.stats import TARGET_STAT_KEYS

DATA = Path(__file__).parent / "data" / "engines"

# fixture -> (engine, responses, aligned per-step, flagged per-step, aggregate only)
FIXTURES = {
    "vllm_metrics_detailed.jsonl": ("vllm", 3, 2, 1, 0),
    "vllm_metrics_summary.jsonl": ("vllm", 2, 0, 0, 2),
    "vllm_choice_stats.jsonl": ("vllm", 2, 1, 0, 1),
    "sglang_generate.jsonl": ("sglang", 2, 0, 0, 2),
    "sglang_detailed.jsonl": ("sglang", 2, 1, 1, 0),
    "llamacpp_completion.jsonl": ("llamacpp", 3, 0, 0, 3),
}


def lines_of(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def synthetic_target_stats(record):
    """Made-up but valid target statistics per output position (seeded by the request's line)."""
    rng = np.random.default_rng(record.line)
    entropy = rng.uniform(0.05, 3.0, record.new_tokens)
    top1 = 0.95 - 0.25 * entropy / 3.0
    top2 = (1 - top1) * 0.5
    return {"entropy_nats": entropy, "renyi2_nats": 0.8 * entropy, "top1_prob": top1, "top2_prob": top2,
            "logit_gap": np.log(top1 / top2)}


# -- every fixture imports into a valid run ---------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_each_engine_fixture_imports_into_a_valid_run(tmp_path, name):
    engine, n, aligned, flagged, aggregate = FIXTURES[name]
    summary = import_jsonl(DATA / name, engine, tmp_path / "run")
    assert (summary.imported, summary.per_step, len(summary.flagged), summary.aggregate_only) == \
        (n, aligned, flagged, aggregate)

    traces = load_traces(tmp_path / "run")  # validates every table
    requests = traces.requests
    assert len(requests) == n and len(traces.rounds) == 0 and len(traces.tokens) == 0
    record = read_import(tmp_path / "run")
    by_id = {r.request_id: r for r in record.requests}
    for row in requests.itertuples():
        assert row.new_tokens == len(by_id[row.request_id].output_token_ids)
        assert row.prompt_tokens == by_id[row.request_id].prompt_tokens
    meta = traces.metadata[summary.run_id]
    info = meta[METADATA_KEY]
    assert info["engine"] == engine and info["imported"] == n and info["skipped_bad"] == 0
    assert info["target_stats"].startswith("missing")
    assert meta["drafter_id"] == f"{engine}:{Path(name).stem}" and meta["tree_policy"] == "chain"
    assert (tmp_path / "run" / RECORD_FILE).is_file()
    # per-step data is kept, ready for the target statistics: rounds of aligned requests only
    rounds = record.rounds
    assert rounds["request_id"].nunique() == aligned
    for request_id, part in rounds.groupby("request_id"):
        assert part["committed"].sum() == len(by_id[request_id].output_token_ids)


def test_vllm_rounds_follow_the_steps_prefill_first(tmp_path):
    import_jsonl(DATA / "vllm_metrics_detailed.jsonl", "vllm", tmp_path / "run")
    first = read_import(tmp_path / "run").requests[0]
    rounds = first.rounds()
    assert rounds[0] == dict(round_index=0, start_position=0, context_len=first.prompt_tokens - 1, block_size=1,
                             tree_nodes=0, tree_depth=0, accepted=0, committed=1, ends_at_leaf=True)
    assert [r["accepted"] for r in rounds[1:]] == [2, 3, 1, 4, 2, 0, 3, 3]  # engines.md's example
    assert [r["tree_depth"] for r in rounds[1:]] == [4] * 8
    assert [r["ends_at_leaf"] for r in rounds[1:]] == [a == 4 for a in [2, 3, 1, 4, 2, 0, 3, 3]]
    assert {r["block_size"] for r in rounds[1:]} == {5}  # num_spec_tokens + 1
    starts = [r["start_position"] for r in rounds]
    assert starts == [0] + list(np.cumsum([1] + [a + 1 for a in [2, 3, 1, 4, 2, 0, 3]]))


def test_sglang_detailed_lengths_include_the_bonus_token(tmp_path):
    parsed = parse_jsonl(DATA / "sglang_detailed.jsonl", "sglang")
    first = parsed.records[0]
    assert first.steps_accepted == [2, 0, 3, 1, 3, 0]  # accept_lengths - 1
    assert first.steps_drafted == [3] * 6  # verify_lengths - 1
    assert first.alignment().ok


# -- with target statistics, per-step runs are what the law reads -------------------------------------------
@pytest.mark.parametrize("name", ["vllm_metrics_detailed.jsonl", "vllm_choice_stats.jsonl", "sglang_detailed.jsonl"])
def test_per_step_runs_with_target_stats_fit_the_at_risk_table(tmp_path, name):
    engine = FIXTURES[name][0]
    summary = import_jsonl(DATA / name, engine, tmp_path / "run", target_stats=synthetic_target_stats,
                           target_stats_source="synthetic (test)")
    traces = load_traces(tmp_path / "run")
    records = {r.request_id: r for r in read_import(tmp_path / "run").requests}
    aligned = [r for r in records.values() if r.alignment() is not None and r.alignment().ok]
    assert summary.rounds_in_tables == len(aligned) == FIXTURES[name][2]
    assert traces.metadata[summary.run_id][METADATA_KEY]["target_stats"] == "synthetic (test)"

    tokens = traces.tokens
    for record in aligned:
        mine = tokens[tokens["request_id"] == record.request_id]
        assert mine["token_id"].tolist() == record.output_token_ids  # committed tokens spell the output
        expected = synthetic_target_stats(record)["entropy_nats"].astype(np.float32)
        np.testing.assert_array_equal(mine["target_entropy_nats"].to_numpy(), expected)
    for record in records.values():  # flagged and aggregate-only requests: a request row, no rounds
        if record not in aligned:
            assert record.request_id not in set(tokens["request_id"].astype(str))

    table = at_risk_table(traces)
    steps = [(a, k) for r in aligned for a, k in zip(r.steps_accepted, r.steps_drafted)]
    assert table["accepted"].sum() == sum(a for a, _ in steps)
    assert table["rejected"].sum() == sum(a < k for a, k in steps)  # a full block ends in a bonus, not at risk
    assert len(table) == sum(min(a + 1, k) for a, k in steps)


# -- the alignment check flags, never repairs ----------------------------------------------------------------
def test_alignment_check_flags_omitted_and_cut_steps_and_keeps_them_as_reported(tmp_path):
    rows = lines_of("vllm_metrics_detailed.jsonl")[:1]
    short = json.loads(json.dumps(rows[0]))
    short["id"] = "cut-last-step"
    short["choices"][0]["token_ids"] = short["choices"][0]["token_ids"][:-2]  # the engine cut the last step
    short["usage"]["completion_tokens"] -= 2
    omitted = lines_of("vllm_metrics_detailed.jsonl")[2]  # n-gram: two no-draft steps not listed
    path = write_jsonl(tmp_path / "in.jsonl", [rows[0], short, omitted])
    summary = import_jsonl(path, "vllm", tmp_path / "run", target_stats=synthetic_target_stats,
                           target_stats_source="synthetic (test)")

    flagged = {f["request_id"]: f for f in summary.flagged}
    assert set(flagged) == {"cut-last-step", "chatcmpl-0a9e6c3b58d24f17"}
    assert flagged["cut-last-step"]["from_steps"] == 27 and flagged["cut-last-step"]["completion_tokens"] == 25
    assert "cut after verification" in flagged["cut-last-step"]["reason"]
    assert "did not list" in flagged["chatcmpl-0a9e6c3b58d24f17"]["reason"]
    traces = load_traces(tmp_path / "run")
    meta = traces.metadata[summary.run_id][METADATA_KEY]
    assert {f["request_id"] for f in meta["flagged"]} == set(flagged) and meta["rounds_in_tables"] == 1
    assert set(traces.rounds["request_id"].astype(str)) == {rows[0]["id"]}  # flagged: request rows only
    requests = traces.requests.set_index("request_id")
    assert requests.loc["cut-last-step", "rounds"] == 0 and requests.loc["cut-last-step", "new_tokens"] == 25
    kept = {r.request_id: r for r in read_import(tmp_path / "run").requests}["cut-last-step"]
    assert kept.steps_accepted == [2, 3, 1, 4, 2, 0, 3, 3]  # as the engine reported them
    assert read_import(tmp_path / "run").flagged["cut-last-step"] == flagged["cut-last-step"]["reason"]
    with pytest.raises(ValueError, match="no aligned per-step data"):
        kept.rounds()


# -- malformed lines: file:line and the field; --skip-bad counts -------------------------------------------
def bad_lines() -> list:
    good = lines_of("vllm_metrics_detailed.jsonl")[0]
    no_ids = json.loads(json.dumps(good))
    no_ids["id"] = "no-ids"
    del no_ids["choices"][0]["token_ids"]
    contradicting = json.loads(json.dumps(good))
    contradicting["id"] = "contradicting"
    contradicting["metrics"]["speculative_decoding"]["per_step_accepted"][0] = 1  # sum no longer 18
    return [good, '{"id": "broken", ', no_ids, contradicting]


def test_malformed_line_is_rejected_with_file_line_and_field(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", bad_lines())
    with pytest.raises(MalformedResponseError, match=rf"^{path}:2: \(line\): not JSON") as err:
        import_jsonl(path, "vllm", tmp_path / "run")
    assert err.value.line == 2 and err.value.field == "(line)"
    assert not (tmp_path / "run").exists()  # nothing written

    path = write_jsonl(tmp_path / "in3.jsonl", [bad_lines()[0], bad_lines()[2]])
    with pytest.raises(MalformedResponseError, match=rf"{path}:2: choices\[0\]\.token_ids: missing; request with "
                                                     r"\"return_token_ids\": true"):
        parse_jsonl(path, "vllm")
    path = write_jsonl(tmp_path / "in4.jsonl", [bad_lines()[3]])
    with pytest.raises(MalformedResponseError,
                       match=r":1: metrics\.speculative_decoding\.per_step_accepted: sums to 17"):
        parse_jsonl(path, "vllm")


def test_skip_bad_skips_counts_and_lists_the_lines(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", bad_lines())
    summary = import_jsonl(path, "vllm", tmp_path / "run", skip_bad=True)
    assert summary.imported == 1 and summary.lines == 4
    assert [(s.line, s.field) for s in summary.skipped] == [
        (2, "(line)"), (3, "choices[0].token_ids"), (4, "metrics.speculative_decoding.per_step_accepted")]
    meta = load_traces(tmp_path / "run").metadata[summary.run_id][METADATA_KEY]
    assert meta["skipped_bad"] == 3 and meta["lines_read"] == 4
    assert [s["line"] for s in meta["skipped_lines"]] == [2, 3, 4]


def test_cli_import_reports_bad_lines_and_skips_them_only_when_asked(tmp_path, capsys):
    path = write_jsonl(tmp_path / "in.jsonl", bad_lines())
    assert main(["import", "vllm", str(path), "--out", str(tmp_path / "run")]) == 2
    assert f"{path}:2: (line): not JSON" in capsys.readouterr().err
    assert main(["import", "vllm", str(path), "--out", str(tmp_path / "run"), "--skip-bad"]) == 0
    captured = capsys.readouterr()
    assert f"skipped {path}:3: choices[0].token_ids: missing" in captured.err
    assert "malformed lines skipped:         3" in captured.out
    assert main(["import", "vllm", str(path), "--out", str(tmp_path / "run"), "--skip-bad"]) == 2  # run exists
    assert "--overwrite replaces the run" in capsys.readouterr().err


@pytest.mark.parametrize("edit, field", [
    (lambda r: r.update(choices=r["choices"] * 2), "choices"),
    (lambda r: r.pop("metrics"), "metrics.speculative_decoding"),
    (lambda r: r["choices"][0].update(finish_reason=None), "choices[0].finish_reason"),
    (lambda r: r["usage"].update(completion_tokens=3), "usage.completion_tokens"),
    (lambda r: r["metrics"]["speculative_decoding"].update(num_spec_steps=9),
     "metrics.speculative_decoding.acceptance_histogram"),
    (lambda r: (r.pop("prompt_token_ids"), r["usage"].pop("prompt_tokens")),
     "prompt / prompt_token_ids / choices[0].prompt_token_ids"),
])
def test_vllm_lines_that_contradict_themselves_name_the_field(tmp_path, edit, field):
    row = lines_of("vllm_metrics_detailed.jsonl")[0]
    edit(row)
    with pytest.raises(MalformedResponseError) as err:
        parse_jsonl(write_jsonl(tmp_path / "in.jsonl", [row]), "vllm")
    assert err.value.field == field and err.value.line == 1


def test_a_file_of_two_configurations_is_refused_and_ids_must_be_unique(tmp_path):
    a, b = lines_of("vllm_metrics_detailed.jsonl")[:2]
    b["model"] = "Qwen/Qwen3-32B"
    with pytest.raises(ValueError, match="more than one model.*'Qwen/Qwen3-8B' \\(line 1\\); 'Qwen/Qwen3-32B' "
                                         "\\(line 2\\).*split the file"):
        parse_jsonl(write_jsonl(tmp_path / "two.jsonl", [a, b]), "vllm")
    with pytest.raises(MalformedResponseError, match=":2: request_id: .* repeats line 1"):
        parse_jsonl(write_jsonl(tmp_path / "dup.jsonl", [a, a]), "vllm")


def test_wrong_engine_says_which_response_it_expects(tmp_path):
    with pytest.raises(MalformedResponseError, match=":1: meta_info: missing: this is an OpenAI-endpoint response"):
        parse_jsonl(DATA / "vllm_metrics_detailed.jsonl", "sglang")
    with pytest.raises(MalformedResponseError, match=":1: choices: missing: not a vLLM response"):
        parse_jsonl(DATA / "sglang_generate.jsonl", "vllm")
    row = lines_of("llamacpp_completion.jsonl")[0]
    del row["tokens"]
    with pytest.raises(MalformedResponseError, match=r"tokens: missing; request /completion with \"return_tokens\""):
        parse_jsonl(write_jsonl(tmp_path / "in.jsonl", [row]), "llamacpp")


# -- aggregate-only data keeps its histograms ---------------------------------------------------------------
def test_aggregate_only_requests_keep_their_histograms(tmp_path):
    import_jsonl(DATA / "vllm_metrics_summary.jsonl", "vllm", tmp_path / "vllm")
    kept = read_import(tmp_path / "vllm")
    for row, record in zip(lines_of("vllm_metrics_summary.jsonl"), kept.requests):
        stats = row["metrics"]["speculative_decoding"]
        assert not record.per_step and record.histogram == stats["acceptance_histogram"]
        assert record.histogram_field == "metrics.speculative_decoding.acceptance_histogram"
        assert record.aggregates["metrics.speculative_decoding"] == stats  # verbatim
    hist = kept.histograms
    first = hist[hist["request_id"] == kept.requests[0].request_id]
    assert first["steps"].tolist() == [39, 1, 0, 3]  # the PR #48915 example

    import_jsonl(DATA / "vllm_choice_stats.jsonl", "vllm", tmp_path / "old")  # sparse {"j": count}
    old = read_import(tmp_path / "old").requests[1]
    sparse = lines_of("vllm_choice_stats.jsonl")[1]["choices"][0]["speculative_decoding_stats"]["acceptance_histogram"]
    assert old.histogram == [sparse.get(str(j), 0) for j in range(len(old.histogram))]

    import_jsonl(DATA / "sglang_generate.jsonl", "sglang", tmp_path / "sglang")
    first = read_import(tmp_path / "sglang").requests[0]
    assert first.histogram == [11, 14, 11, 4, 0, 3]
    assert first.histogram_field == "meta_info.spec_correct_drafts_histogram"
    assert first.aggregates["meta_info"]["spec_verify_ct"] == 43

    import_jsonl(DATA / "llamacpp_completion.jsonl", "llamacpp", tmp_path / "llama")
    llama = read_import(tmp_path / "llama").requests
    assert [r.aggregates["timings"] for r in llama] == [
        {"draft_n": 31, "draft_n_accepted": 22}, {"draft_n": None, "draft_n_accepted": None},
        {"draft_n": 44, "draft_n_accepted": 29}]
    assert all(r.histogram is None for r in llama)
    requests = load_traces(tmp_path / "llama").requests
    assert requests["prefill_ms"].tolist() == pytest.approx([41.2] * 3)


# -- what a histogram allows ---------------------------------------------------------------------------------
def wilson(successes, trials, z=1.959963984540054):
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return centre - half, centre + half


def test_acceptance_by_depth_counts_and_wilson_intervals():
    result = acceptance_by_depth([1, 1, 2, 3, 1], num_spec_tokens=4)  # engines.md's example
    table = result.summary
    assert table["at_risk"].tolist() == [8, 7, 6, 4] and table["accepted"].tolist() == [7, 6, 4, 1]
    np.testing.assert_allclose(table["alpha"], [7 / 8, 6 / 7, 4 / 6, 1 / 4])
    np.testing.assert_allclose(table["p_reach"], [7 / 8, 6 / 8, 4 / 8, 1 / 8])
    for row in table.itertuples():  # an independent closed form of the Wilson interval
        np.testing.assert_allclose((row.alpha_lo, row.alpha_hi), wilson(row.accepted, row.at_risk), rtol=1e-9)
        np.testing.assert_allclose((row.p_reach_lo, row.p_reach_hi), wilson(row.accepted, 8), rtol=1e-9)
    assert result.n_steps == 8 and result.mean_accepted == pytest.approx(18 / 8)
    assert acceptance_by_depth({"0": 1, "1": 1, "2": 2, "3": 3, "4": 1}, num_spec_tokens=4).summary.equals(table)
    with pytest.raises(ValueError, match="more than num_spec_tokens = 3"):
        acceptance_by_depth([1, 1, 2, 3, 1], num_spec_tokens=3)
    with pytest.raises(ValueError, match="counts no steps"):
        acceptance_by_depth([0, 0])


def test_acceptance_by_depth_recovers_a_known_per_depth_acceptance():
    alpha = np.array([0.8, 0.7, 0.6, 0.5])  # truth: acceptance at depth d given d - 1 accepted, K = 4
    rng = np.random.default_rng(7)
    draws = rng.random((20000, 4)) < alpha
    accepted = np.where(draws.all(axis=1), 4, np.argmin(draws, axis=1))
    result = acceptance_by_depth(np.bincount(accepted, minlength=5).tolist(), num_spec_tokens=4)
    np.testing.assert_allclose(result.summary["alpha"], alpha, atol=0.02)
    assert ((result.summary["alpha_lo"] <= alpha) & (alpha <= result.summary["alpha_hi"])).all()
    np.testing.assert_allclose(result.summary["p_reach"], np.cumprod(alpha), atol=0.02)


# -- the room's layer --------------------------------------------------------------------------------------
def test_importing_the_importers_loads_no_torch():
    code = ("import sys, entropy_law.importers, entropy_law.importers.writer; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_target_stats_must_cover_every_output_token(tmp_path):
    def short(record):
        return {k: v[:-1] for k, v in synthetic_target_stats(record).items()}

    with pytest.raises(ValueError, match=r"target_stats\('chatcmpl-4c1e0a7d2b9f4e63'\)\['entropy_nats'\] has 26 "
                                         r"values; the output has 27 tokens"):
        import_jsonl(DATA / "vllm_metrics_detailed.jsonl", "vllm", tmp_path / "run", target_stats=short,
                     target_stats_source="synthetic (test)")
    assert set(TARGET_STAT_KEYS) == set(synthetic_target_stats(parse_jsonl(
        DATA / "vllm_metrics_detailed.jsonl", "vllm").records[0]))
