"""Two gates of one drafter, each timed against its own AR on the same prompts: which pays more, by how much?

``A`` and ``B`` are timed recordings (``bench/predict_open_ended.py --record``: AR and one drafting arm, interleaved
per prompt, CPU clock, one thread, per-call times in ``timings.csv``) of the same prompts, the drafting arm run with
a different gate or policy in each (``--gate cost`` in one, ``--policy block=FITTED.json`` in the other). The two
recordings ran one after the other, so the machine may have drifted between them: each arm is therefore taken
against its OWN recording's AR (speedup S = AR time per token / arm time per token, pooled over requests), and the
comparison is the ratio S_B / S_A, with a percentile interval from resampling the prompts (the same resample in both
recordings: the prompts are paired). Per category and overall; every output must equal its AR's (``timings.csv``'s
``matches_reference``), and the two recordings must hold the same prompts and the same drafting arm name.

    OMP_NUM_THREADS=1 python bench/predict_open_ended.py --record /tmp/gate --per-category 4 --seed 31 \
        --arms ar,block-ddtree16 --gate cost
    OMP_NUM_THREADS=1 python bench/predict_open_ended.py --record /tmp/law --per-category 4 --seed 31 \
        --arms ar,block-ddtree16 --policy block=/tmp/block-law-context.json
    python bench/gate_vs_law.py /tmp/gate /tmp/law

Prints a table and ends with ONE JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

N_BOOT = 4000


def per_request(folder: Path, reference: str = "ar") -> tuple[pd.DataFrame, str]:
    """Per request of a timed recording: its category, AR's and the drafting arm's CPU seconds and new tokens, and
    the drafting arm's rounds; and the drafting arm's name. Refuses a recording with other than one drafting arm,
    or an output that differs from AR's."""
    path = folder / "timings.csv"
    if not path.is_file():
        raise SystemExit(f"{folder}: no timings.csv (record it with bench/predict_open_ended.py --record)")
    t = pd.read_csv(path)
    arms = sorted(set(t["arm"]) - {reference})
    if reference not in set(t["arm"]) or len(arms) != 1:
        raise SystemExit(f"{folder}: needs AR ({reference!r}) and exactly one drafting arm, holds "
                         f"{sorted(set(t['arm']))}")
    if not t["matches_reference"].all():
        bad = t.loc[~t["matches_reference"].astype(bool), ["arm", "request_id"]].to_records(index=False).tolist()
        raise SystemExit(f"{folder}: outputs differ from AR's: {bad}")
    t = t.drop_duplicates(["arm", "request_id"], keep="last")  # a resumed recording: the last call of each
    wide = t.pivot(index="request_id", columns="arm", values=["cpu_s", "new_tokens", "rounds"])
    out = pd.DataFrame({"category": t.drop_duplicates("request_id").set_index("request_id")["category"],
                        "ar_s": wide[("cpu_s", reference)], "ar_tokens": wide[("new_tokens", reference)],
                        "s": wide[("cpu_s", arms[0])], "tokens": wide[("new_tokens", arms[0])],
                        "rounds": wide[("rounds", arms[0])]})
    return out.sort_index(), arms[0]


def speedups(frame: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """``law.cost.paired_speedup`` of the requests at ``rows`` (positions; a leading axis of resamples allowed)."""
    from entropy_law.law.cost import paired_speedup

    return paired_speedup(*(frame[c].to_numpy(float)[rows] for c in ("ar_s", "ar_tokens", "s", "tokens")))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", help="the first timed recording (the baseline of the ratio)")
    p.add_argument("b", help="the second, of the same prompts")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    (a, arm_a), (b, arm_b) = per_request(Path(args.a)), per_request(Path(args.b))
    if arm_a != arm_b:
        raise SystemExit(f"the recordings ran different drafting arms ({arm_a!r}, {arm_b!r}): compare one arm's gates")
    if list(a.index) != list(b.index):
        raise SystemExit("the recordings hold different prompts: record both with the same --seed and --per-category")
    if not (a["ar_tokens"].to_numpy() == b["ar_tokens"].to_numpy()).all():
        raise SystemExit("AR decoded different lengths in the two recordings: not the same prompts and settings")
    rng = np.random.default_rng(args.seed)
    rows = []
    groups = list(a.groupby("category").groups.items()) + [("all", a.index)]
    for category, ids in groups:
        at = a.index.get_indexer(ids)
        sa, sb = float(speedups(a, at)), float(speedups(b, at))
        pick = at[rng.integers(0, len(at), size=(N_BOOT, len(at)))]  # the same prompts in both recordings
        lo, hi = np.percentile(speedups(b, pick) / speedups(a, pick), [2.5, 97.5])
        rows.append(dict(category=category, requests=len(ids), a=sa, b=sb, ratio=sb / sa, lo=lo, hi=hi,
                         a_tokens_per_round=float(a.loc[ids, "tokens"].sum() / a.loc[ids, "rounds"].sum()),
                         b_tokens_per_round=float(b.loc[ids, "tokens"].sum() / b.loc[ids, "rounds"].sum()),
                         ar_drift=float(b.loc[ids, "ar_s"].sum() / a.loc[ids, "ar_s"].sum())))
    table = pd.DataFrame(rows).set_index("category")
    print(f"A = {args.a}, B = {args.b}; drafting arm {arm_a}; speedups over each recording's own AR (CPU clock); "
          f"ratio = B / A with a 95% percentile interval over {N_BOOT} resamples of the prompts (few per category: "
          "only the 'all' row is a result); ar_drift = B's AR time / A's")
    with pd.option_context("display.width", 200):
        print(table.round(3).to_string())
    overall = table.loc["all"]
    above = int((table.drop(index="all")["ratio"] >= 1).sum())
    print(f"\nB / A overall {overall['ratio']:.3f}x [{overall['lo']:.3f}, {overall['hi']:.3f}]; B at or above A in "
          f"{above} of {len(table) - 1} categories' points")
    result = {"bench": "gate_vs_law", "a": args.a, "b": args.b, "arm": arm_a, "requests": int(overall["requests"]),
              "a_speedup": float(overall["a"]), "b_speedup": float(overall["b"]), "ratio": float(overall["ratio"]),
              "lo": float(overall["lo"]), "hi": float(overall["hi"]), "categories_b_at_or_above": above,
              "per_category": {c: round(float(r), 4) for c, r in table["ratio"].items() if c != "all"}}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
