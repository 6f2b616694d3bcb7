"""The one look of every figure: matplotlib rc settings, colours (seaborn's colour-blind palette in sorted order,
so a category keeps its colour across figures), panel grids, and deterministic saving (no time stamps).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

RC = {
    "figure.dpi": 100, "savefig.dpi": 150, "savefig.bbox": "tight",
    "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8, "xtick.labelsize": 8,
    "ytick.labelsize": 8, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3,
    "grid.linewidth": 0.6, "lines.linewidth": 1.6, "legend.frameon": False,
    "pdf.fonttype": 42, "svg.hashsalt": "entropy-law",
}

ENTROPY_LABEL = "target entropy H (nats)"


@contextmanager
def style():
    """Context in which figures get the project's look."""
    with matplotlib.rc_context(RC):
        yield


def palette(names: Sequence[str]) -> dict:
    """A stable colour per name (sorted order, seaborn colour-blind palette)."""
    names = sorted(dict.fromkeys(str(n) for n in names))
    colours = sns.color_palette("colorblind", max(len(names), 1))
    return dict(zip(names, colours))


MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def new_axes(ax=None, *, figsize=(5.0, 3.4)):
    """``ax`` if given, else a new figure's axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def panels(n: int, *, width: float = 4.6, height: float = 3.4, ncols: int | None = None):
    """``(figure, axes)``: a grid of ``n`` panels (at least one), at most three per row, the spare ones hidden."""
    ncols = ncols or min(max(n, 1), 3)
    nrows = int(np.ceil(max(n, 1) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    flat = axes.ravel()
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:max(n, 1)]


def save_figure(fig, out_dir, name: str, *, formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
    """Write ``fig`` as ``<out_dir>/<name>.<fmt>`` for each format, without time stamps (deterministic)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out_dir / f"{name}.{fmt}"
        metadata = {"CreationDate": None, "Producer": None} if fmt == "pdf" else ({"Software": None} if fmt == "png" else None)
        with matplotlib.rc_context(RC):
            fig.savefig(path, format=fmt, metadata=metadata)
        paths.append(path)
    return paths


def unavailable(ax, message: str):
    """Mark ``ax`` as a panel that cannot be drawn, with the reason (no ticks)."""
    ax.text(0.5, 0.5, "not available:\n" + message, ha="center", va="center", fontsize=7, wrap=True,
            transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
    return ax


def short_message(text: str, n: int = 160) -> str:
    """``text`` cut to ``n`` characters (an ellipsis marks the cut), for a panel or a table cell."""
    return text if len(text) <= n else text[: n - 1] + "…"
