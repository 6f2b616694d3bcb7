"""The figure set: one script per figure in figures/, scripts run from the command line, output deterministic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from entropy_law.plots.gallery import FIGURES, cli  # noqa: E402
from tests.report_helpers import small_traces  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_one_script_per_figure_and_make_all():
    scripts = {p.stem for p in (ROOT / "figures").glob("fig*.py")}
    assert scripts == set(FIGURES)
    assert (ROOT / "figures" / "make_all.py").is_file()


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return small_traces(tmp_path_factory.mktemp("gal"), seed=7)


def test_figures_are_deterministic(traces, tmp_path):
    names = ["fig1_entropy_distributions", "fig3_survival_by_depth", "fig9_example_response"]
    for out in ("a", "b"):
        assert cli(names, ["--traces", str(traces), "--out", str(tmp_path / out), "--no-progress", "--n-boot", "2"]) == 0
    for name in names:
        for ext in ("png", "pdf"):
            a, b = (tmp_path / d / f"{name}.{ext}" for d in ("a", "b"))
            assert a.read_bytes() == b.read_bytes(), f"{name}.{ext} differs between two runs"


def test_figure_script_runs_from_a_checkout(traces, tmp_path):
    script = ROOT / "figures" / "fig4_accepted_length.py"
    done = subprocess.run([sys.executable, str(script), "--traces", str(traces), "--out", str(tmp_path), "--no-progress"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fig4_accepted_length.png").is_file() and (tmp_path / "fig4_accepted_length.pdf").is_file()
    bad = subprocess.run([sys.executable, str(script), "--traces", str(tmp_path / "none"), "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert bad.returncode != 0 and "no trace runs" in bad.stderr
