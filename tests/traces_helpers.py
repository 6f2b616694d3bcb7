"""Synthetic rounds for the trace tests: logged through TraceRecorder and, independently, expected rows.

The expected rows are built here with plain Python loops from the documented conventions
(positions start_position + 0..committed-1, depths 1..committed, roles), not with the recorder's code.
"""

from __future__ import annotations

import numpy as np

from entropy_law.traces.stats import TARGET_STAT_KEYS

BLOCK = 6


def synthetic_requests(seed: int, n_requests: int = 5, max_rounds: int = 6):
    """A list of request dicts, each with its rounds (all values explicit, seeded)."""
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(n_requests):
        rounds = []
        position = int(rng.integers(0, 2))  # 1: the prefill's token was not logged as a round
        for r in range(int(rng.integers(0, max_rounds + 1))):
            tree_depth = int(rng.integers(0, BLOCK))
            accepted = int(rng.integers(0, tree_depth + 1))
            committed = accepted + 1 if rng.random() > 0.15 else max(1, accepted)  # sometimes stopped early
            leaf = accepted == tree_depth or bool(rng.random() < 0.3)
            h = rng.exponential(1.0, committed).astype(np.float32)
            p1 = np.exp(-h).astype(np.float32)
            stats = {"entropy_nats": h, "renyi2_nats": (h * np.float32(0.7)).astype(np.float32),
                     "top1_prob": p1, "top2_prob": (p1 * (1 - p1)).astype(np.float32),
                     "logit_gap": rng.exponential(2.0, committed).astype(np.float32)}
            draft_depth = int(rng.integers(0, committed + 1))
            prob = np.full(committed, np.nan)
            rank = np.full(committed, np.nan)
            ent = np.full(committed, np.nan)
            prob[:draft_depth] = rng.random(draft_depth)
            rank[:draft_depth] = rng.integers(-1, 20, draft_depth)
            if rng.random() < 0.5:
                ent[:draft_depth] = rng.exponential(1.0, draft_depth)
            rounds.append({
                "round_index": r, "start_position": position, "context_len": 20 + position,
                "block_size": BLOCK, "tree_nodes": tree_depth + int(rng.integers(0, 5)),
                "tree_depth": tree_depth, "accepted": accepted,
                "token_ids": rng.integers(0, 300, committed).tolist(), "ends_at_leaf": leaf,
                "target_stats": stats,
                "draft_stats": {"prob": prob, "rank": rank, "entropy_nats": ent},
                "draft_ms": float(rng.random()), "verify_ms": float(rng.random()),
                "overhead_ms": float(rng.random()),
            })
            position += committed
        requests.append({
            "request_id": f"req-{seed}-{i}", "category": ["math", "coding", "writing"][i % 3],
            "dataset": "spec_bench", "question_id": str(100 + i), "prompt_tokens": 20, "image_tokens": 0,
            "rounds": rounds, "new_tokens": position + int(rng.integers(0, 2)),
            "stop_reason": ["eos", "max_new_tokens"][i % 2], "prefill_ms": float(rng.random()),
            "decode_ms": float(rng.random()),
        })
    return requests


def log_requests(rec, requests) -> None:
    for q in requests:
        rec.begin_request(q["request_id"], category=q["category"], dataset=q["dataset"],
                          question_id=q["question_id"], prompt_tokens=q["prompt_tokens"],
                          image_tokens=q["image_tokens"])
        for r in q["rounds"]:
            rec.log_round(q["request_id"], **r)
        rec.end_request(q["request_id"], new_tokens=q["new_tokens"], stop_reason=q["stop_reason"],
                        prefill_ms=q["prefill_ms"], decode_ms=q["decode_ms"])


def expected_tokens(requests) -> list[dict]:
    rows = []
    for q in requests:
        for r in q["rounds"]:
            committed = len(r["token_ids"])
            for j in range(committed):
                if j < r["accepted"]:
                    role = "accepted"
                else:  # only reached when committed == accepted + 1, for the last token
                    role = "bonus" if r["ends_at_leaf"] else "correction"
                row = {"request_id": q["request_id"], "category": q["category"],
                       "round_index": r["round_index"], "position": r["start_position"] + j,
                       "depth": j + 1, "token_id": r["token_ids"][j], "role": role}
                for key in TARGET_STAT_KEYS:
                    name = "target_entropy_nats" if key == "entropy_nats" else f"target_{key}"
                    row[name] = float(r["target_stats"][key][j])
                d = r["draft_stats"]
                row["draft_prob"] = None if np.isnan(d["prob"][j]) else float(np.float32(d["prob"][j]))
                row["draft_rank"] = None if np.isnan(d["rank"][j]) else int(d["rank"][j])
                row["draft_entropy_nats"] = (None if np.isnan(d["entropy_nats"][j])
                                             else float(np.float32(d["entropy_nats"][j])))
                rows.append(row)
    return rows


def one_drafter(rows):
    """The at-risk ``rows`` of their first drafter id (sorted), index reset, the table's attrs kept."""
    out = rows.loc[rows["drafter_id"] == sorted(rows["drafter_id"].unique())[0]].reset_index(drop=True)
    out.attrs.update(rows.attrs)
    return out


def redrawn(rows, hazard, rng):
    """``rows`` with outcomes redrawn from a cloglog law of the given hazard (acceptance exp(-hazard))."""
    accepted = (rng.random(len(rows)) < np.exp(-hazard)).astype(np.int8)
    out = rows.assign(accepted=accepted, rejected=1 - accepted)
    out.attrs.update(rows.attrs)
    return out


def quiet_simulation(**kwargs):
    """``analysis.simulate.simulate_traces(**kwargs)`` with its warnings (few requests, small-sample notes) silenced:
    the module fixtures of the law tests."""
    import warnings

    from entropy_law.analysis.simulate import simulate_traces

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate_traces(**kwargs)


def assert_recovered(rows, baseline: str, family: str, term: str, truth: float):
    """``family`` fitted on ``rows`` (outcomes redrawn with coefficient ``truth`` on ``term``): the term's 95%
    interval holds the truth and ``family`` beats ``baseline`` in 4-fold CV; returns the fitted law."""
    import warnings

    from entropy_law.law.compare import compare_laws
    from entropy_law.law.fit import fit_law

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        law = fit_law(rows, family)
        comp = compare_laws(rows, (baseline, family), n_folds=4)
    coef = law.coefficients.loc[term]
    assert coef["ci_low"] < truth < coef["ci_high"]
    assert comp.best == family
    return law
