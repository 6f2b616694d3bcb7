"""The figure set: one script per figure in figures/, scripts run from the command line, output deterministic."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from entropy_law.plots.gallery import FIGURES, cli  # noqa: E402
from entropy_law.plots.speed import fig_controllers  # noqa: E402
from tests.report_helpers import small_traces  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_one_script_per_figure_and_make_all():
    scripts = {p.stem for p in (ROOT / "figures").glob("fig*.py")}
    assert scripts == set(FIGURES) | {"fig13_controllers"}  # fig13: the controllers' tables, not traces
    assert "fig13_controllers" in (ROOT / "figures" / "make_all.py").read_text()


def test_controllers_figure_from_a_table(tmp_path):
    table = pd.DataFrame({"config": ["law policy", "replay oracle", "SGLang EMA", "law policy", "replay oracle",
                                     "SGLang EMA"], "category": ["a", "a", "a", "all", "all", "all"],
                          "speedup": [1.2, 1.4, 1.1, 1.25, 1.5, 1.05]})
    table.to_csv(tmp_path / "policy-controllers-x.csv", index=False)
    # the script's main in this process (a figure script's run from a checkout: the fig4 test below)
    script = runpy.run_path(str(ROOT / "figures" / "fig13_controllers.py"))
    assert script["main"](["--tables", str(tmp_path / "policy-controllers-x.csv"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "fig13_controllers.png").is_file() and (tmp_path / "out" / "fig13_controllers.pdf").is_file()
    fig = fig_controllers({"x": table})
    oracle = [line for line in fig.axes[0].lines if line.get_label() == "replay oracle"]
    assert list(oracle[0].get_ydata()) == [1.4, 1.5]  # the oracle's line, per category in order


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


def test_figure_script_runs_from_a_checkout(traces, tmp_path, capsys):
    script = ROOT / "figures" / "fig4_accepted_length.py"
    done = subprocess.run([sys.executable, str(script), "--traces", str(traces), "--out", str(tmp_path), "--no-progress"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fig4_accepted_length.png").is_file() and (tmp_path / "fig4_accepted_length.pdf").is_file()
    # bad input: the same command line in this process (the script is ``sys.exit(cli([its figure]))``)
    assert cli(["fig4_accepted_length"], ["--traces", str(tmp_path / "none"), "--out", str(tmp_path)]) != 0
    assert "no trace runs" in capsys.readouterr().err
