"""GLANCE's law and ours given the same drafted depth D of a round: the observed one, or a distribution of it.

Known here: GLANCE's README form with a per-round L (E[a | H] = sum_k P(L >= k) p^k) and its least-squares fit
(``fit_glance_reach``), a drafted-depth model of rounds and our law's expectation over it
(``law_expected_over_depths``). Not known here: which side gets which depth (``bench/glance.py matched``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import special

from entropy_law.glance.compare import law_round_expectations
from entropy_law.glance.law import B1_MAX, nls_fit
from entropy_law.law.transfer import TrainingDepthModel, entropy_bin


def observed_reach(depth, drafts: int) -> np.ndarray:
    """``[n, drafts]``: 1 where k <= D (k = 1..``drafts``), the round's drafted depth D (``tree_depth``)."""
    d = np.asarray(depth, dtype=np.int64)
    if np.any(d < 1) or np.any(d > drafts):
        raise ValueError(f"drafted depths must lie in 1..{drafts}")
    return (np.arange(1, drafts + 1)[None, :] <= d[:, None]).astype(float)


def model_reach(depth_probs) -> np.ndarray:
    """``[n, drafts]``: P(D >= k), k = 1..drafts, from ``[n, drafts + 1]`` probabilities of D = 0..drafts."""
    p = np.asarray(depth_probs, dtype=float)
    return np.cumsum(p[:, ::-1], axis=1)[:, ::-1][:, 1:]


def glance_reach_expected(entropy, b0: float, b1: float, reach) -> np.ndarray:
    """GLANCE's README form with a per-round L: sum_k ``reach[:, k-1]`` p^k, logit p = b0 - min(b1, 25) H."""
    p = special.expit(b0 - min(b1, B1_MAX) * np.asarray(entropy, dtype=float))
    reach = np.asarray(reach, dtype=float)
    return (reach * p[:, None] ** np.arange(1, reach.shape[1] + 1)).sum(axis=1)


def fit_glance_reach(entropy, accepted, reach) -> tuple[float, float]:
    """(b0, b1): least squares of ``glance_reach_expected`` from GLANCE's start (``nls_fit``)."""
    h = np.asarray(entropy, dtype=float)
    a = np.asarray(accepted, dtype=float)
    if len(a) < 2 or np.ptp(h) == 0:
        raise ValueError("GLANCE's law needs rounds that vary in entropy")
    fit = nls_fit(h, a, "readme", None, reach=np.asarray(reach, dtype=float))
    return float(fit.x[0]), float(fit.x[1])


def round_depth_model(rounds: pd.DataFrame, drafts: int) -> TrainingDepthModel:
    """``TrainingDepthModel`` of the rounds' ``tree_depth`` by root entropy, first round apart."""
    depths = pd.DataFrame({"start_position": rounds["start_position"].to_numpy(dtype=np.int64),
                           "start_entropy": rounds["entropy"].to_numpy(dtype=float),
                           "drafted_depth": rounds["tree_depth"].to_numpy(dtype=np.int64)})
    return TrainingDepthModel.fit(depths, drafts, copy_edges=())


def round_depth_probabilities(model: TrainingDepthModel, rounds: pd.DataFrame) -> np.ndarray:
    """``[n, drafts + 1]``: ``model``'s P(D = d) for each round, from its root entropy (``first`` at position 0)."""
    e = np.minimum(entropy_bin(rounds["entropy"].to_numpy(dtype=float), model.edges), model.later.shape[0] - 1)
    first = rounds["start_position"].to_numpy() == 0
    return np.where(first[:, None], model.first[np.minimum(e, model.first.shape[0] - 1)], model.later[e])


def law_expected_over_depths(law, traces, rounds: pd.DataFrame, depth_probs, *, root_only: bool,
                             sequences: tuple | None = None) -> np.ndarray:
    """sum_d P(D = d) ``law_round_expectations`` (given ``sequences``) with D = d, per round; ``depth_probs``:
    ``[n, drafts + 1]``."""
    probs = np.asarray(depth_probs, dtype=float)
    depths = [d for d in range(1, probs.shape[1]) if np.any(probs[:, d] > 0)]
    if not depths:
        return np.zeros(len(rounds))
    stacked = pd.concat([rounds.assign(tree_depth=d) for d in depths], ignore_index=True)  # one call: one lookup
    expected = law_round_expectations(law, traces, stacked, root_only=root_only, sequences=sequences)
    expected = expected.reshape(len(depths), len(rounds))
    return (probs[:, depths].T * expected).sum(axis=0)
