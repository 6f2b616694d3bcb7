"""`--help` of `entropy-law` and of every sub-command, rendered at 100 columns: a description of at most two lines,
each argument's help (and each sub-command's line in the command list) at most two lines; the long explanations
live in docs/cli.md, one section per command."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from entropy_law.cli import build_parser

COLUMNS = 100
MAX_LINES = 2
ROOT = Path(__file__).resolve().parents[1]


def _rendered(monkeypatch) -> dict[str, str]:
    """Every parser's help as argparse prints it at ``COLUMNS`` (argparse reads the width from $COLUMNS)."""
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"entropy-law": parser.format_help(), **{name: p.format_help() for name, p in sub.choices.items()}}


def description_lines(text: str) -> int:
    """Lines between the usage block and the first section heading ("options:", "positional arguments:", ...)."""
    blocks = text.split("\n\n")
    lines = 0
    for block in blocks[1:]:  # blocks[0]: the usage
        if re.match(r"^\S[^\n]*:$", block.splitlines()[0]):
            break
        lines += len(block.splitlines())
    return lines


def entry_help_lines(text: str) -> dict[str, int]:
    """Per entry of the argument sections (an option, a positional, a sub-command in the command list): the lines
    its help takes. An entry starts on a line indented by fewer than 8 spaces; its help is the text after a gap of
    2 or more spaces on that line, and the deeper-indented lines after it."""
    counts: dict[str, int] = {}
    in_section, current = False, None
    for line in text.splitlines():
        if not line.strip():
            in_section, current = False, None
            continue
        if re.match(r"^\S.*:$", line):  # a section heading
            in_section, current = True, None
            continue
        if not in_section:
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent < 8:
            invocation, _, help_text = line.strip().partition("  ")
            current = invocation
            counts[current] = 1 if help_text.strip() else 0
        elif current is not None:
            counts[current] += 1
    return counts


def test_the_parsers_of_this_test_are_found(monkeypatch):
    helps = _rendered(monkeypatch)
    assert {"demo", "record", "predict", "report", "law", "policy", "import", "export", "entropy", "info",
            "train-drafter"} <= set(helps)
    # the parsing above sees a long help: a check that can fail
    long = "usage: x\n\none\ntwo\nthree\n\noptions:\n  --a A   one\n          two\n          three\n  --b  b\n"
    assert description_lines(long) == 3 and entry_help_lines(long) == {"--a A": 3, "--b": 1}


@pytest.mark.parametrize("command", ["entropy-law", "demo", "entropy", "export", "import", "info", "law", "policy",
                                     "predict", "record", "report", "train-drafter"])
def test_help_at_100_columns_keeps_each_text_to_two_lines(monkeypatch, command):
    text = _rendered(monkeypatch)[command]
    assert all(len(line) <= COLUMNS for line in text.splitlines()), "argparse wraps at $COLUMNS"
    assert description_lines(text) <= MAX_LINES, f"{command}: the description takes more than {MAX_LINES} lines"
    long = {entry: n for entry, n in entry_help_lines(text).items() if n > MAX_LINES}
    assert not long, f"{command}: help longer than {MAX_LINES} lines (move the detail to docs/cli.md): {long}"


def test_every_command_has_its_section_in_docs_cli(monkeypatch):
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for command in _rendered(monkeypatch):
        if command != "entropy-law":
            assert f"## `entropy-law {command}`" in text, f"docs/cli.md has no section for {command}"
