"""The law policy against the engines' controllers: modelled speedup per controller per category, the oracle as a line.

    python figures/fig13_controllers.py [--tables CSV ...] [--out DIR]

Reads the per-category tables ``python bench/policy.py controllers --csv`` and ``controllers-loco --csv`` write
(default: ``bench/results/policy-controllers-*.csv``, a panel each) and draws them with
``entropy_law.plots.speed.fig_controllers``.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import matplotlib  # noqa: E402
import pandas as pd  # noqa: E402


def main(argv=None) -> int:
    matplotlib.use("Agg")
    from entropy_law.plots.speed import fig_controllers
    from entropy_law.plots.style import save_figure, style

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    tables = sorted(map(str, (ROOT / "bench/results").glob("policy-controllers-*.csv")))
    p.add_argument("--tables", nargs="+", default=tables, help="controller tables (default: bench/results')")
    p.add_argument("--out", default=str(ROOT / "figures" / "out"))
    args = p.parse_args(argv)
    if not args.tables:
        print("error: no controller tables: run python bench/policy.py controllers --csv FILE first", file=sys.stderr)
        return 2
    tables = {Path(f).stem.removeprefix("policy-controllers-"): pd.read_csv(f) for f in args.tables}
    tables = {name: t for name, t in tables.items() if {"config", "category", "speedup"} <= set(t.columns)}
    if not tables:
        print("error: no controller table (columns config, category, speedup) among --tables", file=sys.stderr)
        return 2
    with style():
        fig = fig_controllers(tables)
        fig.tight_layout()
    print(", ".join(map(str, save_figure(fig, args.out, "fig13_controllers"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
