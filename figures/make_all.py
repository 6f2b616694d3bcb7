"""Regenerate every figure (PNG + PDF, deterministic) from the reference traces or any trace path.

    python figures/make_all.py [--traces PATH] [--out DIR] [--n-boot N] [--seed S]

Default traces: ``data/traces/`` (the reference traces, see ``scripts/make_reference_traces.py``); when
absent, simulated traces from a known law are used and the script says so. Default output: ``figures/out/``.
One script per figure sits beside this one; all call ``entropy_law.plots.gallery``, except
``fig13_controllers.py``, drawn from the controllers' tables in ``bench/results/`` (run here too).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from entropy_law.plots.gallery import cli  # noqa: E402
from figures.fig13_controllers import main as controllers_figure  # noqa: E402

if __name__ == "__main__":
    code = cli(None, description=__doc__.splitlines()[0])
    out = sys.argv[sys.argv.index("--out") + 1:][:1] if "--out" in sys.argv else []
    sys.exit(code or controllers_figure(["--out", *out] if out else []))
