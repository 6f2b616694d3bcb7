"""run_demo on a tiny random Llama: traces per arm, lossless outputs, report and summary, the block drafter
missing is a message (never a crash), bad input is refused."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from entropy_law.jobs.demo import DemoPlan, demo_limits, run_demo  # noqa: E402
from entropy_law.jobs.plan import Limits  # noqa: E402
from entropy_law.prompts.text import load_tasks  # noqa: E402
from entropy_law.traces.reader import load_traces  # noqa: E402
from tests.report_helpers import FAST  # noqa: E402
from conftest import tiny_llama  # noqa: E402
from tests.tiny_models import hf_greedy  # noqa: E402

VOCAB = 96


def encode(task):
    return [b % VOCAB for b in task.prompt.encode()[:20]]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    import os

    model = tiny_llama(seed=3, vocab=VOCAB)
    tasks = load_tasks("spec_bench", categories=["qa", "math_reasoning", "translation"], limit=1)
    old = os.environ.get("ENTROPY_LAW_BLOCK_DRAFTER")
    os.environ["ENTROPY_LAW_BLOCK_DRAFTER"] = str(tmp_path_factory.mktemp("none") / "missing.safetensors")
    try:
        messages = []
        plan = DemoPlan(tasks, model, demo_limits(24), out=tmp_path_factory.mktemp("runs"), run_id="t1",
                        arms=("ar", "ngram", "block"), encode=encode, report_format="md", figure_formats=("png",),
                        analysis_options={k: v for k, v in FAST.items() if k != "n_boot"}, n_boot=FAST["n_boot"])
        result = run_demo(plan, progress=False, log=messages.append)
    finally:
        if old is None:
            del os.environ["ENTROPY_LAW_BLOCK_DRAFTER"]
        else:
            os.environ["ENTROPY_LAW_BLOCK_DRAFTER"] = old
    return model, tasks, result, messages


def test_block_drafter_missing_is_reported_and_the_demo_carries_on(demo):
    _, _, result, messages = demo
    assert result.arms == ["ar", "ngram"]
    assert any("block drafter unavailable" in m for m in messages)
    assert any("block drafter unavailable" in m for m in result.messages)


def test_traces_per_arm_and_outputs_equal_greedy(demo):
    model, tasks, result, _ = demo
    traces = load_traces(result.trace_dir)
    assert sorted(traces.runs["arm"]) == ["ar", "ngram"]
    assert result.mismatches == []
    tok = traces.tokens.astype({"request_id": str, "run_id": str})
    run_of = dict(zip(traces.runs["arm"], traces.runs["run_id"]))
    for task in tasks:
        reference = hf_greedy(model, encode(task), 24)  # independent greedy decode
        for arm in ("ar", "ngram"):
            got = tok.loc[(tok["run_id"] == run_of[arm]) & (tok["request_id"] == task.request_id)].sort_values("position")
            assert got["token_id"].tolist() == reference


def test_report_summary_and_metadata_written(demo):
    _, tasks, result, _ = demo
    assert result.report_path.is_file() and result.report_path.name == "report.md"
    from entropy_law.plots.gallery import FIGURES

    assert len(list((result.run_dir / "figures").glob("*.png"))) == len(FIGURES)
    assert not list((result.run_dir / "figures").glob("*.pdf"))  # the plan's figure_formats: PNG only
    meta = json.loads((result.run_dir / "demo.json").read_text())
    assert meta["arms"] == ["ar", "ngram"] and meta["prompts"] == len(tasks) and meta["mismatches"] == []
    summary = (result.run_dir / "summary.txt").read_text()
    for task in tasks:
        assert task.category in summary
    assert "speedup vs AR" in summary and "fitted law" in summary
    assert summary.startswith("When drafting pays") and "in these categories it pays for" in summary  # answer first
    table = result.analysis.results_table()
    assert set(table["arm"]) == {"ngram chain", "AR"}
    assert table.loc[table["arm"] == "AR", "speedup_vs_ar"].eq(1.0).all()


def test_run_metadata_per_arm(demo):
    """Each arm's run metadata: what the demo has always written (AR runs say drafter and tree "none")."""
    _, _, result, _ = demo
    runs = {path.name: json.loads((path / "run.json").read_text()) for path in result.trace_dir.iterdir()}
    assert sorted(runs) == ["ar", "ngram"]
    job_keys = ("model_id", "drafter_id", "drafter_config", "tree_policy", "tree_budget", "dtype", "device", "seed",
                "max_new_tokens", "replayed", "demo_run_id", "arm")
    recorder_keys = ("format", "format_version", "run_id", "status", "package_version", "start_time", "end_time",
                     "git_revision")
    for arm, meta in runs.items():
        assert set(meta) == set(job_keys) | set(recorder_keys)
        assert meta["arm"] == arm and meta["demo_run_id"] == "t1" and meta["replayed"] is False
        assert meta["model_id"] == "LlamaForCausalLM" and meta["max_new_tokens"] == 24 and meta["seed"] == 0
    assert (runs["ar"]["drafter_id"], runs["ar"]["tree_policy"], runs["ar"]["drafter_config"]) == ("none", "none", {})
    assert (runs["ngram"]["drafter_id"], runs["ngram"]["tree_policy"]) == ("ngram", "chain")
    assert runs["ar"]["tree_budget"] is None and runs["ngram"]["tree_budget"] is None


def test_bad_input_is_refused(tmp_path):
    model = tiny_llama(seed=3, vocab=VOCAB)
    tasks = load_tasks("spec_bench", categories=["qa"], limit=1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        DemoPlan(tasks, model, demo_limits(1), out=tmp_path, encode=encode)
    with pytest.raises(ValueError, match="max_new_tokens"):  # the demo's rule holds for limits made elsewhere too
        DemoPlan(tasks, model, Limits(1), out=tmp_path, encode=encode)
    with pytest.raises(ValueError, match="no prompts"):
        DemoPlan([], model, out=tmp_path, encode=encode)
    with pytest.raises(ValueError, match="no drafting arm"):
        run_demo(DemoPlan(tasks, model, out=tmp_path, arms=("ar",), encode=encode), progress=False)
    with pytest.raises(ValueError, match="unknown arm"):
        run_demo(DemoPlan(tasks, model, out=tmp_path, arms=("ar", "eagle"), encode=encode), progress=False)


def test_the_demo_command_refuses_bad_numbers_before_loading_the_model(monkeypatch, capsys):
    """`entropy-law demo --max-new-tokens 1` loaded the model (seconds to minutes) and only then refused."""
    from entropy_law.cli import main
    from entropy_law.decoding import loading

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(loading, "load_target", no_load)
    assert main(["demo", "--max-new-tokens", "1"]) == 2
    assert "max_new_tokens (--max-new-tokens) must be an int >= 2" in capsys.readouterr().err
    assert main(["demo", "--limit", "0"]) == 2
    assert "--limit must be >= 1" in capsys.readouterr().err


def test_a_block_drafter_made_for_another_target_is_left_out_with_the_reason(monkeypatch):
    """`entropy-law demo --model gemma3-270m` stopped with the shipped (SmolLM2) drafter's mismatch error; the
    block arms are now left out with the reason and the other arms run, as when the checkpoint is missing."""
    from entropy_law.jobs.arms import BLOCK_DRAFTER_ENV, available_arms, block_drafter_checkpoint

    monkeypatch.delenv(BLOCK_DRAFTER_ENV, raising=False)
    if block_drafter_checkpoint() is None:
        pytest.skip("no shipped block drafter checkpoint in data/drafters")
    model = tiny_llama(seed=3, vocab=VOCAB)
    specs, messages = available_arms(["ar", "ngram", "block-ddtree16"], model)
    assert [s.name for s in specs] == ["ar", "ngram"]
    assert len(messages) == 1 and messages[0].startswith("block drafter unavailable for this target: ")
    assert "vocabulary" in messages[0] and "train-drafter" in messages[0]
    specs, messages = available_arms(["ar", "ngram", "block-ddtree16"])  # without a target: not checked
    assert [s.name for s in specs] == ["ar", "ngram", "block-ddtree16"] and not messages


def test_the_demo_command_on_a_base_model_without_a_chat_template(monkeypatch, capsys):
    """`entropy-law demo --model gemma3-270m` (a base model) failed inside the tokenizer's apply_chat_template;
    it now says to pass --no-chat-template, which decodes the prompt text as is (as `record` does) and records
    chat_template: false in run.json."""
    from types import SimpleNamespace

    import entropy_law.commands.demo as demo_command
    from entropy_law.cli import main
    from entropy_law.decoding import loading

    def tokenizer(text):  # a tokenizer without a chat template (its attribute None, as transformers has it)
        return {"input_ids": [len(text), 7]}

    tokenizer.chat_template = None
    calls, target = [], SimpleNamespace(tokenizer=tokenizer)
    monkeypatch.setattr(loading, "load_target", lambda model: target)

    def fake_run_demo(plan, **kwargs):
        calls.append(plan)
        raise ValueError("stop here")  # the decode itself is tested above

    monkeypatch.setattr(demo_command, "run_demo", fake_run_demo)
    assert main(["demo", "--model", "base", "--limit", "1"]) == 2
    assert "has no chat template (a base model); pass --no-chat-template" in capsys.readouterr().err and not calls
    assert main(["demo", "--model", "base", "--limit", "1", "--no-chat-template"]) == 2
    plan = calls[0]
    assert plan.run_metadata == {"chat_template": False, "torch_threads": 1}
    assert plan.encode(plan.tasks[0]) == [len(plan.tasks[0].prompt), 7]  # the text as is, not the chat messages


def test_the_demos_next_steps_name_its_target_and_encoding():
    """The demo's last line says how to ask the same question of one's own prompts. For another target than the
    reference traces' it must name that target and its prompt encoding (a default-target AR run would be refused
    by `predict --from` the demo's traces), and it must not point at data/traces' law (decoded by SmolLM2)."""
    from entropy_law.commands.demo import next_steps

    default = next_steps("smollm2-135m", "runs/x/traces")
    assert "entropy-law record --drafter ar --tasks FILE --out RUN" in default
    assert "--from runs/x/traces --replay-rounds" in default
    assert "--law-from data/traces --law-tasks spec_bench:" in default and "--law-borrow" not in default
    other = next_steps("gemma3-270m", "runs/g/traces", chat_template=False)
    assert "entropy-law record --model gemma3-270m --no-chat-template --drafter ar" in other
    assert "data/traces" not in other


def test_the_reference_traces_block_arms_ran_the_default_checkpoint():
    """The demo's last line points at data/traces' law for its block arms without --law-borrow: that holds only
    while the reference traces' block arms were decoded by the checkpoint a run loads today. Replacing the default
    means replaying them again (scripts/make_reference_traces.py --from-run data/traces/ngram ...)."""
    from pathlib import Path

    from entropy_law.drafters.block import default_drafter_path
    from entropy_law.traces.layout import file_sha256

    runs = sorted((Path(__file__).resolve().parents[1] / "data" / "traces").glob("block*/run.json"))
    if not runs:
        pytest.skip("no reference traces in data/traces")
    default = file_sha256(default_drafter_path())
    for run in runs:
        config = json.loads(run.read_text())["drafter_config"]
        assert config["checkpoint_sha256"] == default, f"{run.parent.name} ran {config['checkpoint']}"


SCREEN_LINES = 30


def test_the_printed_answer_fits_one_screen(demo, monkeypatch, capsys):
    """What `entropy-law demo` prints when it is done: at most 30 lines of at most 100 columns, per drafting arm and
    category the verdict (one prompt per category here: "not measured (1 request)"); the detail in summary.txt."""
    from types import SimpleNamespace

    import entropy_law.commands.demo as demo_command
    from entropy_law.cli import main
    from entropy_law.commands.demo import SCREEN_COLUMNS
    from entropy_law.decoding import loading

    _, tasks, result, _ = demo

    def tokenizer(text):
        return {"input_ids": [len(text), 7]}

    tokenizer.chat_template = None
    monkeypatch.setattr(loading, "load_target", lambda model: SimpleNamespace(tokenizer=tokenizer))
    monkeypatch.setattr(demo_command, "run_demo", lambda plan, **kwargs: result)  # decoded above
    assert main(["demo", "--limit", "1", "--no-chat-template", "--no-progress"]) == 0
    out = capsys.readouterr().out
    answer = out.split("\n\n", 1)[1].rstrip("\n").splitlines()  # after the loading lines and a blank line
    assert len(answer) <= SCREEN_LINES and max(map(len, answer)) <= SCREEN_COLUMNS, "\n".join(answer)
    loaded = answer[1].startswith("Machine loaded")  # a busy machine: said under the title, no verdict
    assert answer[0].startswith("When drafting pays") and answer[1 + loaded] == "ngram chain"
    rows = answer[2 + loaded:2 + loaded + len(tasks)]
    assert sorted(row.split()[0] for row in rows) == sorted(task.category for task in tasks)
    why = ["(machine", "loaded)"] if loaded else ["(1", "request)"]
    assert all(row.split()[1:] == ["not", "measured", *why] for row in rows)
    assert any(line.startswith("note: block drafter unavailable") for line in answer)
    commands = "\n".join(answer).replace(" \\\n    ", " ").splitlines()  # a long path: a shell continuation line
    assert commands[-2:] == ["  entropy-law record --no-chat-template --drafter ar --tasks FILE --out RUN",
                           f"  entropy-law predict RUN --from {result.trace_dir} --replay-rounds"]
    detail = (result.run_dir / "summary.txt").read_text()
    assert "\n".join(result.answer_lines) in detail and "fitted law" in detail and "speedup vs AR" in detail
    assert "total " in detail and "entropy-law record --no-chat-template --drafter ar" in detail  # the full next step
    print("\n".join(answer))


def test_the_answer_of_every_drafting_arm_on_every_category_fits_one_screen(monkeypatch):
    """The widest case the demo decodes: all four drafting arms on Spec-Bench's five categories, with a note."""
    from pathlib import Path

    import pandas as pd

    from entropy_law.commands.demo import SCREEN_COLUMNS, screen_lines
    from entropy_law.jobs import report
    from entropy_law.jobs.demo import DemoResult

    arms = ["ngram chain", "ngram ddtree16", "block-drafter-b8-l2-copy chain", "block-drafter-b8-l2-copy ddtree16"]
    categories = ["math_reasoning", "qa", "rag", "summarization", "translation"]
    rows = [dict(arm=a, category=c, pays_from="measured", verdict="measured", verdict_requests=n,
                 verdict_speedup=1.1, verdict_low=lo, verdict_high=hi, lo=lo, hi=hi, requests=n)
            for a in arms for c, (n, lo, hi) in zip(categories, [(4, 1.0, 1.2), (5, 1.05, 1.2), (40, 0.8, 0.95),
                                                                  (40, 0.95, 1.3), (40, 0.2, 3.0)])]
    frame = pd.DataFrame(rows)
    frame["pays"] = [report.category_verdict(r.verdict_requests, r.verdict_low, r.verdict_high)
                     for r in frame.itertuples()]
    monkeypatch.setattr(report, "answer_frame", lambda analysis, measured=None: frame)
    run = Path("runs") / "20261207-123456"  # as the demo names it: --out runs, the UTC time
    result = DemoResult(run_dir=run, trace_dir=run / "traces", report_path=run / "report.html", arms=["ar", *arms],
                        messages=["WARNING: 2 outputs differ between arms (lossless decoding broken?): " + "x" * 200],
                        timings_s={"decode_s": 147.0, "analysis_s": 31.0},
                        answer_lines=report.verdict_lines(None))
    lines = screen_lines(result, model="smollm2-135m", chat_template=True, total_s=190.0)
    assert len(lines) <= SCREEN_LINES and max(map(len, lines)) <= SCREEN_COLUMNS, "\n".join(lines)
    text = "\n".join(lines)
    assert text.count("not measured (4 requests)") == 4 and text.count("not measured (40 requests)") == 4
    assert text.count("pays          1.10x [1.05, 1.20]  measured, 5 requests") == 4
    assert text.count("does not pay  1.10x [0.80, 0.95]") == 4 and text.count("unclear       1.10x [0.95, 1.30]") == 4


def test_a_long_trace_path_goes_on_a_continuation_line_within_the_screen():
    """The next-step predict command with a trace path too long for one 100-column line: the path on a shell
    continuation line, the command unchanged once the continuation is joined."""
    from types import SimpleNamespace

    from entropy_law.commands.demo import SCREEN_COLUMNS, screen_lines

    trace_dir = "runs/" + "a-long-folder-name/" * 3 + "traces"  # 117 columns on one line
    result = SimpleNamespace(answer_lines=["When drafting pays"], messages=[], timings_s={"decode_s": 1.0},
                             report_path=None, run_dir="runs/demo", trace_dir=trace_dir)
    lines = screen_lines(result, model="smollm2-135m", chat_template=True, total_s=2.0)
    assert max(map(len, lines)) <= SCREEN_COLUMNS
    assert lines[-2:] == ["  entropy-law predict RUN --from \\", f"    {trace_dir} --replay-rounds"]
    joined = "\n".join(lines).replace(" \\\n    ", " ").splitlines()[-1]
    assert joined == f"  entropy-law predict RUN --from {trace_dir} --replay-rounds"
