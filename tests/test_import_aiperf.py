"""AIPerf's per-request records (``profile_export.jsonl`` with ``spec_decode_acceptance``) imported as trace runs.

The fixture ``tests/data/engines/aiperf_profile_export.jsonl`` is built from AIPerf's documented fields (the
``SpecDecodeAcceptanceRecord`` and the per-request record's ``metadata`` / ``metrics`` / ``error``): a vLLM
request with per-step data (AIPerf's own documented example), an aggregate-only request with no fixed draft
length, and a variable-length per-step request.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from entropy_law.cli import main
from entropy_law.importers import MalformedResponseError, acceptance_by_depth, import_jsonl, parse_jsonl, read_import
from entropy_law.importers.writer import METADATA_KEY

FIXTURE = Path(__file__).parent / "data" / "engines" / "aiperf_profile_export.jsonl"


def rows() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def test_fixture_imports_per_step_and_histogram_only_requests(tmp_path):
    summary = import_jsonl(FIXTURE, "aiperf", tmp_path / "run")
    assert (summary.imported, summary.per_step, summary.aggregate_only, summary.flagged) == (3, 2, 1, [])
    imported = read_import(tmp_path / "run")
    by_id = {r.request_id: r for r in imported.requests}
    assert sorted(by_id) == ["req-0", "req-1", "req-2"]  # metadata.x_request_id
    first = by_id["req-0"]
    assert (first.prompt_tokens, first.new_tokens, first.num_spec_tokens) == (550, 27, 4)
    assert first.histogram == [1, 1, 2, 3, 1]
    assert [r["accepted"] for r in first.rounds()[1:]] == [2, 3, 1, 4, 2, 0, 3, 3]
    adaptive = by_id["req-1"]  # no fixed k: the histogram as reported, no per-step data
    assert adaptive.num_spec_tokens is None and not adaptive.per_step
    assert adaptive.histogram == [3, 0, 1, 0, 0, 2]
    variable = by_id["req-2"]
    assert [r["tree_nodes"] for r in variable.rounds()[1:]] == [2, 3, 3]
    info = imported.metadata[METADATA_KEY]
    assert info["engine"] == "aiperf" and info["rounds_in_tables"] == 0  # no target entropy: no law rows
    assert "stop reason not logged" in next(iter(info["shapes"]))


def test_pooled_histogram_gives_acceptance_by_depth():
    parsed = parse_jsonl(FIXTURE, "aiperf")
    pooled = [0] * 6
    for record in parsed.records:
        for j, count in enumerate(record.histogram):
            pooled[j] += count
    result = acceptance_by_depth(pooled)
    assert result.n_steps == 8 + 6 + 3
    assert result.mean_accepted == pytest.approx((18 + 12 + 4) / 17)
    # P(a >= 1): steps that accepted at least one draft, over all steps
    assert result.summary["p_reach"].iloc[0] == pytest.approx((17 - 1 - 3 - 1) / 17)


def test_cli_import_aiperf(tmp_path, capsys):
    assert main(["import", "aiperf", str(FIXTURE), "--out", str(tmp_path / "run")]) == 0
    assert "imported 3 of 3 aiperf" in capsys.readouterr().out


def bad(mutate):
    lines = rows()
    mutate(lines[1])
    return lines


BAD = {
    "derived number contradicts the counts": (
        lambda r: r["spec_decode_acceptance"].update(mean_acceptance_length=2.5),
        "spec_decode_acceptance.mean_acceptance_length"),
    "histogram counts other steps": (
        lambda r: r["spec_decode_acceptance"].update(num_spec_steps=7), "spec_decode_acceptance.acceptance_histogram"),
    "a failed request": (lambda r: r.update(error={"code": 499, "type": "RequestCancellationError"}), "error"),
    "no acceptance record": (lambda r: r.pop("spec_decode_acceptance"), "spec_decode_acceptance"),
    "output lengths disagree": (
        lambda r: r["metrics"]["output_sequence_length"].update(value=41), "spec_decode_acceptance.completion_tokens"),
    "no prompt length": (lambda r: r["metrics"].pop("input_sequence_length"), "metrics.input_sequence_length.value"),
    "not an AIPerf record": (lambda r: r.pop("metadata"), "metadata"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_line_names_file_line_and_field(tmp_path, case):
    mutate, field = BAD[case]
    path = write(tmp_path / "bad.jsonl", bad(mutate))
    with pytest.raises(MalformedResponseError) as err:
        parse_jsonl(path, "aiperf")
    assert err.value.line == 2 and err.value.field == field
    assert str(err.value).startswith(f"{path}:2: {field}: ")


def test_skip_bad_keeps_the_good_lines(tmp_path):
    lines = rows()
    broken = copy.deepcopy(lines[0])
    broken["metadata"]["x_request_id"] = "broken"
    broken["spec_decode_acceptance"]["per_step_accepted"] = [2, 3, 1, 4, 2, 0, 3, 2]
    path = write(tmp_path / "mixed.jsonl", lines + [broken])
    summary = import_jsonl(path, "aiperf", tmp_path / "run", skip_bad=True)
    assert summary.imported == 3 and [s.line for s in summary.skipped] == [4]
    assert read_import(tmp_path / "run").metadata[METADATA_KEY]["skipped_bad"] == 1
