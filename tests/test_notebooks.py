"""Execute the three notebooks with nbclient on small simulated traces written through TraceRecorder (notebook
01 uses a tiny random model). The reference traces (data/traces/, 400 requests) would take notebook 02 more
than 5 min of CPU even with ENTROPY_LAW_QUICK; the same analysis code runs on them in the report and law
tests, and the notebooks' cells are what is under test here."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from entropy_law.analysis.sample_traces import write_simulated_traces

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ("01_logging_traces.ipynb", "02_fitting_the_law.ipynb", "03_when_drafting_pays.ipynb")


@pytest.fixture(scope="module")
def trace_env(tmp_path_factory):
    # 12 requests per category: 3-fold CV with category terms needs at least 5 per category in each fold; three
    # categories, the fewest leave-one-category-out (and its nested overdispersion) runs on
    path = write_simulated_traces(tmp_path_factory.mktemp("nb-traces"), seed=5, n_requests_per_category=12,
                                  tokens_per_request=(40, 60), categories=["qa", "rag", "math_reasoning"])
    env = {"ENTROPY_LAW_TRACES": str(path), "ENTROPY_LAW_QUICK": "1", "ENTROPY_LAW_NOTEBOOK_TINY": "1",
           "MPLBACKEND": "Agg"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield path
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_notebooks_are_committed_without_outputs():
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code, name
        assert all(not c.outputs and c.execution_count is None for c in code), f"{name} has outputs"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes(name, trace_env):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
    assert not errors
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if name.startswith("01"):
        assert "tokens per round" in text  # the decoder cell ran and printed per request
    if name.startswith("02"):
        assert "law_exp" in text
    if name.startswith("03"):
        assert "drafting pays below H" in text
