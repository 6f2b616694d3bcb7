"""When drafting pays: what the fitted law predicts and decides once a round's cost is known.

Known here, one module each: ``cost`` (the cost model from measured round timings, ``when_drafting_pays`` at a
constant target entropy with its break-even, measured paired speedups, their interval and verdict), ``workload``
(when drafting pays on a workload: each request priced on its own entropy sequence, ``workload_breakeven``,
``predict_workload`` for prompts an arm never decoded, ``price_rounds`` for recorded or replayed rounds),
``predict`` (per-request prediction intervals of tokens per round and per-category reliability, leave one
category out) and ``policy`` (the per-round drafting policy's law, fitted from traces and exported as plain
parameters for ``entropy_law.decoding.policy``).

Not known here: the law families, their fits and transfer (``entropy_law.law``, which this room builds on and
which never imports it), out-of-core fits (``entropy_law.outofcore``), one trace set analysed for the figures and
the report (``entropy_law.analysis``). Never imports torch, decoding, drafters, jobs or plotting.
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
