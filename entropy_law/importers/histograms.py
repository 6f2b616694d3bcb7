"""What an acceptance histogram allows: per-depth acceptance, with counts and intervals.

A histogram ``h`` counts verify steps by accepted drafts (bonus excluded). With ``S(d) = sum_{j >= d} h[j]``:
``P(a >= d) = S(d) / S(0)`` for any drafter; ``alpha_d = S(d) / S(d - 1)`` only with a fixed draft length. The
entropy law needs per-step data. Wilson intervals over steps (steps as independent; across requests, resample
requests). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from entropy_law.importers.records import as_histogram


RELIABLE_WIDTH = 0.2  # an interval wider than this is reported as "not measured reliably"


@dataclass
class DepthAcceptance:
    """Per-depth acceptance from one histogram: ``summary`` has per depth ``at_risk`` (S(d - 1)), ``accepted``
    (S(d)), ``alpha`` and ``p_reach``, each with its Wilson interval (``*_lo``, ``*_hi``)."""

    summary: pd.DataFrame
    histogram: list[int]
    n_steps: int
    mean_accepted: float
    num_spec_tokens: int | None
    level: float
    notes: list[str] = field(default_factory=list)

    def print_summary(self) -> None:
        k = self.num_spec_tokens if self.num_spec_tokens is not None else "unknown"
        print(f"Acceptance by depth from a histogram of {self.n_steps} steps (mean accepted drafts per step "
              f"{self.mean_accepted:.3f}; K = {k}; {self.level:.0%} Wilson intervals over steps)")
        print(self.summary.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        for note in self.notes:
            print(f"note: {note}")

    def __repr__(self) -> str:
        return (f"DepthAcceptance({self.n_steps} steps, depths 1..{len(self.summary)}, "
                f"mean accepted {self.mean_accepted:.3f})")


def acceptance_by_depth(histogram, *, num_spec_tokens: int | None = None, level: float = 0.95) -> DepthAcceptance:
    """Per-depth acceptance of one histogram (a dense list, or a sparse map ``{"j": count}``); nothing is pooled.
    ``num_spec_tokens`` (K): depths ``1..K``; without it, depths up to the deepest bucket."""
    from entropy_law.law.stats import wilson_interval  # lazy: statsmodels only when a fit is asked for

    h = np.asarray(as_histogram(histogram, "histogram"), dtype=np.int64)
    if h.sum() == 0:
        raise ValueError("the histogram counts no steps; nothing to estimate (was the request speculated?)")
    notes = []
    if num_spec_tokens is not None:
        k = int(num_spec_tokens)
        if k < 1:
            raise ValueError(f"num_spec_tokens must be >= 1; got {num_spec_tokens}")
        if len(h) > k + 1 and h[k + 1:].any():
            raise ValueError(f"the histogram has steps that accepted {int(np.flatnonzero(h)[-1])} drafts, more than "
                             f"num_spec_tokens = {k}")
        depths = k
    else:
        depths = max(len(h) - 1, 1)
        notes.append("K unknown: depths run to the deepest bucket; alpha there assumes every step drafted that deep")
    counts = np.zeros(depths + 1, dtype=np.int64)
    counts[:min(len(h), depths + 1)] = h[:depths + 1]
    survivors = counts[::-1].cumsum()[::-1]  # S(d) for d = 0..depths
    at_risk, accepted = survivors[:-1], survivors[1:]
    d = np.arange(1, depths + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        alpha = np.where(at_risk > 0, accepted / np.maximum(at_risk, 1), np.nan)
    p_reach = accepted / survivors[0]
    alpha_lo, alpha_hi = wilson_interval(accepted, np.maximum(at_risk, 1), level=level)
    alpha_lo, alpha_hi = np.where(at_risk > 0, alpha_lo, np.nan), np.where(at_risk > 0, alpha_hi, np.nan)
    reach_lo, reach_hi = wilson_interval(accepted, np.full_like(accepted, survivors[0]), level=level)
    wide = d[(at_risk > 0) & (alpha_hi - alpha_lo > RELIABLE_WIDTH)]
    if len(wide):
        notes.append(f"alpha at depth{'s' if len(wide) > 1 else ''} {', '.join(map(str, wide.tolist()))} not measured "
                     f"reliably (interval wider than {RELIABLE_WIDTH}): more steps are needed")
    if (at_risk == 0).any():
        notes.append(f"no step reached depth {int(d[at_risk == 0][0])}: alpha there is not measured")
    summary = pd.DataFrame({"depth": d, "at_risk": at_risk, "accepted": accepted, "alpha": alpha,
                            "alpha_lo": alpha_lo, "alpha_hi": alpha_hi, "p_reach": p_reach,
                            "p_reach_lo": reach_lo, "p_reach_hi": reach_hi})
    n_steps = int(survivors[0])
    return DepthAcceptance(summary=summary, histogram=h.tolist(), n_steps=n_steps,
                           mean_accepted=float((np.arange(len(h)) * h).sum() / n_steps),
                           num_spec_tokens=num_spec_tokens, level=level, notes=notes)


__all__ = ["DepthAcceptance", "acceptance_by_depth"]
