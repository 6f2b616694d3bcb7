"""``entropy-law entropy``: target statistics of an imported engine run, teacher-forced, resumable, in place.

The engine here is made up but honest: a tiny Llama's greedy outputs, written as vLLM ``detailed`` responses
whose per-step counts split each output into rounds (so every output token is the target's argmax, as in
greedy speculative decoding). The statistics must equal a plain teacher-forced forward's
(``decoding.replay.teacher_forced_target_stats``), batched or not; a job killed with SIGKILL must resume to
the same run; and the run must then load and fit like a recorded one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_llama
from entropy_law.cli import main
from entropy_law.importers import import_jsonl, read_import
from entropy_law.importers.writer import METADATA_KEY
from entropy_law.law.atrisk import at_risk_table
from entropy_law.law.fit import fit_law
from entropy_law.traces.reader import load_traces

pytestmark = pytest.mark.usefixtures("single_thread")
TESTS = Path(__file__).resolve().parent
MODEL_SEED = 11
K = 4  # drafts per step


def greedy(model, prompt: list[int], n: int) -> list[int]:
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def steps_for(n_tokens: int, rng) -> tuple[list[int], list[int]]:
    """Per-step accepted / drafted counts that cover n_tokens output tokens: 1 (prefill) + sum(a + 1)."""
    accepted, left = [], n_tokens - 1
    while left > 0:
        a = int(min(rng.integers(0, K + 1), left - 1))
        accepted.append(a)
        left -= a + 1
    return accepted, [K] * len(accepted)


def vllm_line(request_id, prompt, output, rng, *, category, detailed=True):
    metrics = {"num_spec_tokens": K}
    if detailed:
        accepted, drafted = steps_for(len(output), rng)
        hist = [0] * (K + 1)
        for a in accepted:
            hist[a] += 1
        metrics.update(per_step_accepted=accepted, per_step_drafted=drafted, acceptance_histogram=hist,
                       num_spec_steps=len(accepted), num_accepted_draft_tokens=sum(accepted),
                       num_draft_tokens=sum(drafted))
    else:
        metrics.update(acceptance_histogram=[1, 0, 0, 0, 0], num_spec_steps=1, num_accepted_draft_tokens=0,
                       num_draft_tokens=K)
    return {"id": request_id, "object": "chat.completion", "model": "tiny-llama",
            "choices": [{"index": 0, "finish_reason": "length", "token_ids": output}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(output)},
            "prompt_token_ids": prompt, "metrics": {"speculative_decoding": metrics}, "category": category}


@pytest.fixture(scope="module")
def engine_file(tmp_path_factory):
    """vLLM responses: 9 aligned per-step requests of varied lengths, one whose steps miss tokens (flagged),
    one aggregate-only, one with prompt text only (the tiny target has no tokenizer: not scored)."""
    model = tiny_llama(MODEL_SEED)
    rng = np.random.default_rng(0)
    lines, outputs = [], {}
    for i in range(9):
        prompt = rng.integers(3, 128, size=int(rng.integers(4, 40))).tolist()
        output = greedy(model, prompt, int(rng.integers(8, 48)))
        outputs[f"req-{i}"] = (prompt, output)
        lines.append(vllm_line(f"req-{i}", prompt, output, rng, category=("qa", "math")[i % 2]))
    flagged = vllm_line("flagged", [5, 6, 7], greedy(model, [5, 6, 7], 12), rng, category="qa")
    longer = greedy(model, [5, 6, 7], 15)  # three tokens from steps the engine did not list
    flagged["choices"][0]["token_ids"], flagged["usage"]["completion_tokens"] = longer, len(longer)
    lines.append(flagged)
    lines.append(vllm_line("summary-only", [9, 10], greedy(model, [9, 10], 6), rng, category="qa", detailed=False))
    text_only = vllm_line("text-only", [1, 2, 3], greedy(model, [1, 2, 3], 10), rng, category="qa")
    del text_only["prompt_token_ids"]
    text_only["prompt"] = "a prompt given as text"
    lines.append(text_only)
    path = tmp_path_factory.mktemp("engine") / "responses.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path, outputs


def imported(tmp_path, engine_file, name="run") -> Path:
    path, _ = engine_file
    import_jsonl(path, "vllm", tmp_path / name)
    return tmp_path / name


def reference_stats(model, prompt, output):
    from entropy_law.decoding.replay import teacher_forced_target_stats

    return teacher_forced_target_stats(model, prompt, output)


STAT_COLUMNS = ["target_entropy_nats", "target_renyi2_nats", "target_top1_prob", "target_top2_prob", "target_logit_gap"]


def test_statistics_equal_a_plain_forward_and_the_run_fits(tmp_path, engine_file):
    from entropy_law.jobs.entropy import compute_target_stats

    _, outputs = engine_file
    run = imported(tmp_path, engine_file)
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    model = tiny_llama(MODEL_SEED)
    summary = compute_target_stats(run, model, flush_every=4)
    n_tokens = sum(len(output) for _, output in outputs.values())
    assert (summary.scorable, summary.scored_now, summary.tokens_now) == (9, 9, n_tokens)
    assert summary.argmax_agree == summary.tokens_now  # greedy outputs of this target
    assert [u["request_id"] for u in summary.unscored] == ["text-only"]
    assert "no tokenizer" in summary.unscored[0]["reason"]

    # in place: the same run id, no hidden folders left, the statistics said in run.json
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    traces = load_traces(run)
    meta = traces.metadata[run_id]
    assert meta["status"] == "complete"
    assert meta[METADATA_KEY]["target_stats"].startswith("teacher-forced by entropy-law entropy")
    assert meta["entropy"]["device"] == "cpu" and meta["entropy"]["unscored"][0]["request_id"] == "text-only"
    assert meta["entropy"]["dtype"] == "float32"  # the forward's dtype is recorded (--dtype bfloat16 says so)
    assert 0 < summary.cpu_seconds and 0 < summary.seconds
    kept = read_import(run)
    assert {k for k, v in kept.rounds_in_tables.items() if v} == set(outputs)
    assert len(traces.requests) == 12  # every imported request keeps its row

    tokens = traces.tokens
    for request_id, (prompt, output) in outputs.items():
        rows = tokens.loc[tokens["request_id"] == request_id].sort_values("position")
        assert rows["token_id"].tolist() == output
        ref = reference_stats(model, prompt, output)
        np.testing.assert_allclose(rows[STAT_COLUMNS].to_numpy(float), ref[STAT_COLUMNS].to_numpy(float),
                                   rtol=1e-6, atol=1e-6)
    rounds = traces.rounds
    record = {r.request_id: r for r in kept.requests}["req-0"]
    assert rounds.loc[rounds["request_id"] == "req-0", "accepted"].tolist() == [0, *record.steps_accepted]

    table = at_risk_table(traces)
    assert len(table) == int(tokens["role"].isin(["accepted", "correction"]).sum()) > 50
    law = fit_law(traces, "law_exp", cov_type="nonrobust")
    assert np.isfinite(law.result.params).all()

    with pytest.raises(ValueError, match="already holds target statistics"):
        compute_target_stats(run, model)


def test_batched_forwards_equal_one_forward_per_request(tmp_path, engine_file):
    from entropy_law.jobs.entropy import compute_target_stats, plan_batches

    run = imported(tmp_path, engine_file)
    model = tiny_llama(MODEL_SEED)
    compute_target_stats(run, model, out=tmp_path / "single", batch_tokens=0)
    summary = compute_target_stats(run, model, out=tmp_path / "batched", batch_tokens=400)
    assert summary.scored_now == 9 and summary.argmax_agree == summary.tokens_now
    assert json.loads((run / "run.json").read_text())[METADATA_KEY]["target_stats"].startswith("missing")
    single = load_traces(tmp_path / "single").tokens.sort_values(["request_id", "position"], ignore_index=True)
    batched = load_traces(tmp_path / "batched").tokens.sort_values(["request_id", "position"], ignore_index=True)
    assert single["token_id"].tolist() == batched["token_id"].tolist()
    np.testing.assert_allclose(batched[STAT_COLUMNS].to_numpy(float), single[STAT_COLUMNS].to_numpy(float),
                               rtol=1e-5, atol=1e-5)
    # the plan packs similar lengths, never over the budget
    batches = plan_batches([10, 50, 12, 48, 11], [5, 20, 6, 20, 5], 100, vocab=128)
    assert sorted(i for b in batches for i in b) == list(range(5)) and len(batches) < 5
    assert all(len(b) * max([10, 50, 12, 48, 11][i] for i in b) <= 100 for b in batches)


KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from conftest import tiny_llama
    from entropy_law.jobs.entropy import compute_target_stats

    def stop(progress):
        if progress.requests_done == 4:  # four requests scored and written: die as a crash would
            os.kill(os.getpid(), signal.SIGKILL)

    compute_target_stats({run!r}, tiny_llama({seed}), flush_every=1, on_batch=stop)
""")


def test_a_killed_job_resumes_to_the_same_run(tmp_path, engine_file):
    from entropy_law.jobs.entropy import compute_target_stats

    clean = imported(tmp_path, engine_file, "clean")
    model = tiny_llama(MODEL_SEED)
    compute_target_stats(clean, model)
    run = imported(tmp_path, engine_file, "killed")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", KILLER.format(tests=str(TESTS), run=str(run), seed=MODEL_SEED)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    stage = tmp_path / ".killed.entropy"
    assert (stage / "writer.lock").exists() and (run / "writer.lock").exists()  # both held by the dead job
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # incomplete run, stale lock
        done = set(load_traces(stage).rounds["request_id"].astype(str))
    assert len(done) == 4

    with pytest.raises(ValueError, match="stale"):
        compute_target_stats(run, model)
    with pytest.warns(UserWarning, match="broke the writer lock"):
        summary = compute_target_stats(run, model, break_lock=True)
    assert (summary.scored_before, summary.scored_now) == (4, 5)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "clean") == ["killed"]

    resumed, reference = load_traces(run), load_traces(clean)
    key = ["request_id", "position"]
    a = resumed.tokens.sort_values(key, ignore_index=True)
    b = reference.tokens.sort_values(key, ignore_index=True)
    assert a["token_id"].tolist() == b["token_id"].tolist() and a["role"].tolist() == b["role"].tolist()
    np.testing.assert_array_equal(a[STAT_COLUMNS].to_numpy(), b[STAT_COLUMNS].to_numpy())
    assert len(resumed.rounds) == len(reference.rounds)
    assert resumed.metadata[resumed.runs["run_id"][0]]["resumed_at"]


def test_a_swap_cut_between_its_renames_is_finished_by_the_next_run(tmp_path, engine_file, monkeypatch):
    import entropy_law.jobs.entropy as job

    run = imported(tmp_path, engine_file)
    model = tiny_llama(MODEL_SEED)
    real_rename = os.rename

    def cut(src, dst):  # os.rename is the recorder's too: cut only the second rename of the swap
        if Path(dst) == run and Path(src) == tmp_path / ".run.entropy":
            raise KeyboardInterrupt("killed between the two renames")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", cut)
    with pytest.raises(KeyboardInterrupt):
        job.compute_target_stats(run, model)
    monkeypatch.setattr(os, "rename", real_rename)
    assert not run.exists() and (tmp_path / ".run.imported").is_dir() and (tmp_path / ".run.entropy").is_dir()
    summary = job.compute_target_stats(run, model)
    assert "finished the swap" in summary.note and summary.scored_before == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert len(load_traces(run).rounds) > 9


def test_cli_refuses_what_is_not_an_imported_run_before_loading_a_model(tmp_path, engine_file, capsys):
    assert main(["entropy", str(tmp_path / "nothing")]) == 2
    assert "no imported run" in capsys.readouterr().err
    run = imported(tmp_path, engine_file)
    assert main(["entropy", str(run), "--out", str(run)]) == 2
    assert "omit --out" in capsys.readouterr().err
    assert main(["entropy", str(run), "--flush-every", "0"]) == 2
    summary_only = tmp_path / "summary.jsonl"
    summary_only.write_text("".join(line for line in engine_file[0].read_text().splitlines(keepends=True)
                                    if "summary-only" in line))
    import_jsonl(summary_only, "vllm", tmp_path / "aggregates")
    assert main(["entropy", str(tmp_path / "aggregates")]) == 2
    assert "no request has aligned per-step data" in capsys.readouterr().err
