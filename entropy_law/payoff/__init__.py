"""When drafting pays: what the fitted law predicts and decides once a round's cost is known.

One module each: ``cost`` (cost model, ``when_drafting_pays``, paired speedups and their verdict), ``workload``
(each request priced on its own entropy sequence, ``workload_breakeven``, ``predict_workload``, ``price_rounds``),
``predict`` (per-request intervals, leave one category out) and ``policy`` (the per-round drafting policy's law).
Builds on ``entropy_law.law``; never imports torch, decoding, drafters, jobs or plotting.
"""

from entropy_law.payoff.cost import CostModel, DraftingPays, fit_cost_model, speed_verdict, when_drafting_pays
from entropy_law.payoff.policy import borrow_policy, fit_policy, hybrid_policy, load_policy, save_policy
from entropy_law.payoff.predict import RequestPredictions, loco_predictions
from entropy_law.payoff.workload import (WorkloadBreakeven, WorkloadPrediction, predict_workload, price_rounds,
                                         workload_breakeven)

__all__ = [
    "CostModel",
    "DraftingPays",
    "RequestPredictions",
    "WorkloadBreakeven",
    "WorkloadPrediction",
    "borrow_policy",
    "fit_cost_model",
    "fit_policy",
    "hybrid_policy",
    "load_policy",
    "loco_predictions",
    "predict_workload",
    "price_rounds",
    "save_policy",
    "speed_verdict",
    "when_drafting_pays",
    "workload_breakeven",
]
