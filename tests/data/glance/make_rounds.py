"""Writes ``rounds.jsonl`` beside this file: a small round log in GLANCE's shape (``experiments/main_table.py
--round-log``: ``round, entropy, accepted, tau, tree_size, extended, task, prompt``), made up, not measured.

Two tasks (``chartqa``, ``caption``) of 6 prompts x 10 rounds: 60 rounds per task, 120 pooled. Entropies are
distinct (uniform on [0, 3) nats, six decimals), so that with 60 and 120 rounds no entropy quantile numpy
interpolates falls on a data value ((n - 1) q is never whole for the 10 and 50 (6 below 100 rounds) bins of
GLANCE's diagnostics): a round's bin then follows from its rank alone, which the tests use to compute
r2_curve and r2_ceiling independently. Accepted drafts follow a geometric run with acceptance
p = expit(b0 - b1 H), cut at 7 drafts (a block of 8). Deterministic (seed 20).

    python tests/data/glance/make_rounds.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.special import expit

TASKS = {"chartqa": (2.0, 1.1), "caption": (1.2, 0.9)}  # task -> (b0, b1) of the simulated acceptance
PROMPTS, ROUNDS, DRAFTS = 6, 10, 7


def main() -> None:
    rng = np.random.default_rng(20)
    n = len(TASKS) * PROMPTS * ROUNDS
    entropy = np.round(rng.uniform(0.0, 3.0, size=n), 6)
    while len(np.unique(entropy)) < n:  # distinct values (redraw the repeats)
        _, first = np.unique(entropy, return_index=True)
        repeat = np.setdiff1d(np.arange(n), first)
        entropy[repeat] = np.round(rng.uniform(0.0, 3.0, size=repeat.size), 6)
    lines, i = [], 0
    for task, (b0, b1) in TASKS.items():
        for prompt in range(PROMPTS):
            for rnd in range(ROUNDS):
                p = expit(b0 - b1 * entropy[i])
                accepted = int(min(rng.geometric(1.0 - p) - 1, DRAFTS))
                lines.append(json.dumps({"round": rnd, "entropy": float(entropy[i]), "accepted": accepted,
                                         "tau": accepted + 1, "tree_size": 64, "extended": bool(rnd % 7 == 3),
                                         "task": task, "prompt": prompt}))
                i += 1
    (Path(__file__).parent / "rounds.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
