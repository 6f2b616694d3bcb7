"""Pricing the controllers' replayed rounds: tokens per round, modelled speedup with a request bootstrap interval, and
the share of the replay oracle's speedup, per category (``jobs.controllers`` replays them).

Input: one row per (configuration, request) with ``config``, ``information``, ``category``, ``request`` (a key unique
over the pooled workloads), ``tokens`` (committed after the prefill), ``rounds`` and ``cost`` (in one-token
forwards: ``c(nodes + 1)``, plus the drafter's cost in each round that called it). Speedup = tokens / cost, the rate
over autoregressive decoding (one token per one-token forward), pooled over a group's requests.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

ORACLE = "replay oracle"
ROW_COLUMNS = ("config", "information", "category", "request", "tokens", "rounds", "cost")


def _check(rows: pd.DataFrame) -> None:
    missing = [c for c in ROW_COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"controller rows lack {missing}: make them with jobs.controllers.replay_controllers")
    if ORACLE not in set(rows["config"]):
        raise ValueError(f"controller rows hold no {ORACLE!r} configuration: the share of the oracle needs it")


def _resampled(rows: pd.DataFrame, requests: np.ndarray, picks: np.ndarray) -> dict[str, np.ndarray]:
    """Per configuration, the pooled speedup of each resample of ``requests`` (``picks``: [n_boot, n] positions)."""
    out = {}
    for config, part in rows.groupby("config", sort=False):
        part = part.set_index("request").reindex(requests)
        tokens, cost = part["tokens"].to_numpy(float), part["cost"].to_numpy(float)
        out[config] = tokens[picks].sum(axis=1) / cost[picks].sum(axis=1)
    return out


def controller_table(rows: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per configuration and category (and ``"all"``): ``requests``, ``tokens_per_round``, ``speedup`` with its 95%
    percentile interval (``lo``, ``hi``) over resamples of the requests, and ``of_oracle`` (speedup / the oracle's
    on the same requests)."""
    _check(rows)
    rng, out = np.random.default_rng(seed), []
    groups = [(c, rows.loc[rows["category"] == c]) for c in sorted(rows["category"].unique())] + [("all", rows)]
    for category, group in groups:
        requests = np.array(sorted(group["request"].unique()))
        picks = rng.integers(0, len(requests), size=(n_boot, len(requests)))
        boots = _resampled(group, requests, picks)
        sums = group.groupby("config", sort=False)[["tokens", "rounds", "cost"]].sum()
        info = group.groupby("config", sort=False)["information"].first()
        oracle = sums.loc[ORACLE, "tokens"] / sums.loc[ORACLE, "cost"]
        for config, s in sums.iterrows():
            lo, hi = np.percentile(boots[config], [2.5, 97.5])
            out.append(dict(config=config, information=info[config], category=category, requests=len(requests),
                            tokens_per_round=s["tokens"] / s["rounds"], speedup=s["tokens"] / s["cost"], lo=lo, hi=hi,
                            of_oracle=s["tokens"] / s["cost"] / oracle))
    return pd.DataFrame(out)


def paired_ratio(rows: pd.DataFrame, a: str, b: str, *, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Speedup of configuration ``a`` over ``b`` on all requests, and its 95% interval over paired resamples of the
    requests (the same requests in both)."""
    requests = np.array(sorted(rows["request"].unique()))
    picks = np.random.default_rng(seed).integers(0, len(requests), size=(n_boot, len(requests)))
    boots = _resampled(rows.loc[rows["config"].isin([a, b])], requests, picks)
    sums = rows.groupby("config")[["tokens", "cost"]].sum()
    ratio = (sums.loc[a, "tokens"] / sums.loc[a, "cost"]) / (sums.loc[b, "tokens"] / sums.loc[b, "cost"])
    lo, hi = np.percentile(boots[a] / boots[b], [2.5, 97.5])
    return float(ratio), float(lo), float(hi)
