"""Mean accepted length per drafting round per category vs mean entropy, with the law's DP prediction.

    python figures/fig4_accepted_length.py [--traces PATH] [--out DIR]

Drawn by ``entropy_law.plots.gallery.FIGURES["fig4_accepted_length"]`` (plot function in ``entropy_law.plots.figures``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from entropy_law.plots.gallery import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli(["fig4_accepted_length"], description=__doc__.splitlines()[0]))
