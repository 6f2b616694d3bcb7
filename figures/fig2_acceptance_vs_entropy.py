"""Acceptance vs target entropy: binned data, Wilson 95% intervals, fitted law; per drafter, depth 1 and >= 2.

    python figures/fig2_acceptance_vs_entropy.py [--traces PATH] [--out DIR]

Drawn by ``entropy_law.plots.gallery.FIGURES["fig2_acceptance_vs_entropy"]`` (plot function in ``entropy_law.plots.figures``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from entropy_law.plots.gallery import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli(["fig2_acceptance_vs_entropy"], description=__doc__.splitlines()[0]))
