"""GLANCE's decile curve with GLANCE's law and ours (leave-one-category-out).

    python figures/fig11_glance.py [--traces PATH] [--out DIR]

Drawn by ``entropy_law.plots.gallery.FIGURES["fig11_glance"]`` (plot function in ``entropy_law.plots.glance``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from entropy_law.plots.gallery import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli(["fig11_glance"], description=__doc__.splitlines()[0]))
