"""The package states contracts, not results: no date (YYYY-MM-DD) anywhere in ``entropy_law/**/*.py``. A dated
line goes stale; where a result or its history matters it belongs in docs/results.md, bench/results/ or git."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "entropy_law"
DATE = re.compile(r"(?<!\d)(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?!\d)")


def _shown(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent)) if path.is_relative_to(PACKAGE.parent) else path.name


def dated_lines(paths) -> list[str]:
    """``path:line: text`` of every line of ``paths`` that holds a date."""
    return [f"{_shown(path)}:{number}: {line.strip()}"
            for path in paths for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if DATE.search(line)]


def test_the_date_pattern_finds_dates_and_only_dates(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('x = 1  # replayed on 2026-12-05\nstamp = now.strftime("%Y-%m-%d")\n'
                      'ids = "20261207-123456"\nversion = "2026-13-01"\n"""measured 2025-01-31."""\n')
    assert [line.split(":")[1] for line in dated_lines([sample])] == ["1", "5"]


def test_no_date_in_the_package():
    found = dated_lines(sorted(PACKAGE.rglob("*.py")))
    assert not found, "dates in the package (state the contract; results go to docs/results.md):\n" + "\n".join(found)
