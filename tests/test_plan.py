"""The plan of a job (``entropy_law.jobs.plan``): no function of ``jobs/`` or ``commands/`` takes more than 10
parameters (the plan is passed whole), and a bad value is refused by one rule, with one message, whether it comes
from the command line or from Python."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from entropy_law.jobs.demo import demo_limits
from entropy_law.jobs.plan import DEFAULT_VERIFY_COST_RATIO, Drafting, Limits, Output, RecordPlan

PACKAGE = Path(__file__).resolve().parents[1] / "entropy_law"
MAX_PARAMETERS = 10


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Positional + keyword-only parameters, ``*args`` and ``**kwargs`` each one; ``self`` / ``cls`` excluded."""
    a = node.args
    names = [arg.arg for arg in a.posonlyargs + a.args + a.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")]) + (a.vararg is not None) + (a.kwarg is not None)


def test_no_function_of_jobs_or_commands_takes_more_than_ten_parameters():
    files = sorted((PACKAGE / "jobs").glob("*.py")) + sorted((PACKAGE / "commands").glob("*.py"))
    assert len(files) > 10
    wide = [f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({parameter_count(node)})"
            for path in files for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameter_count(node) > MAX_PARAMETERS]
    assert not wide, f"pass a plan (entropy_law.jobs.plan) instead of more than {MAX_PARAMETERS} parameters: {wide}"


def test_the_counter_counts_every_kind_of_parameter():
    node = ast.parse("def f(self, a, /, b, *args, c, **kwargs): pass").body[0]
    assert parameter_count(node) == 5


@pytest.mark.parametrize("argv, make, message", [
    (["record", "--max-new-tokens", "0"], lambda: Limits(0),
     "max_new_tokens (--max-new-tokens) must be an int >= 1, got 0"),
    (["record", "--flush-every", "0"], lambda: Limits(8, flush_every=0),
     "flush_every (--flush-every) must be an int >= 1 (finished prompts per shard), got 0"),
    (["demo", "--max-new-tokens", "1"], lambda: demo_limits(1),
     "max_new_tokens (--max-new-tokens) must be an int >= 2 (one token after the prefill), got 1"),
])
def test_a_bad_value_gets_the_same_message_from_the_command_line_and_from_python(argv, make, message, tmp_path,
                                                                                 monkeypatch, capsys):
    from entropy_law.cli import main
    from entropy_law.decoding import loading

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the plan was checked")

    monkeypatch.setattr(loading, "load_target", no_load)
    if argv[0] == "record":
        argv = [*argv, "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value) == message
    assert not (tmp_path / "run").exists()


def test_the_plan_refuses_what_no_job_can_run():
    with pytest.raises(ValueError, match="no arms to record"):
        RecordPlan([], [], None, Output("out"), Limits(4))
    with pytest.raises(ValueError, match=r"gate \(--gate\) must be one of"):
        Drafting(gate="sometimes")
    with pytest.raises(ValueError, match="exclude each other"):
        Output("out", resume=True, overwrite=True)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Limits(True)  # a bool is not a count
    with pytest.raises(ValueError, match="warm_up_tokens"):
        Limits(4, warm_up_tokens=-1)
    limits = Limits(4)
    with pytest.raises(AttributeError):  # frozen: built and checked once, then passed whole
        limits.max_new_tokens = 0


def test_the_plans_default_gate_ratio_is_the_decoders():
    from entropy_law.decoding.gate import DEFAULT_VERIFY_COST_RATIO as decoders

    assert DEFAULT_VERIFY_COST_RATIO == decoders
    assert Output({"ngram": "a/b"}).run_dir("ngram") == Path("a/b") and Output("a").run_dir("ar") == Path("a/ar")
