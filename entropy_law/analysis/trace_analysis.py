"""``TraceAnalysis``: one trace set analysed once, for the figures, the report, the demo and the notebooks.

A thin facade: each method calls one function of the rooms, whose docstring states the contract; results are
cached per arm. ``attempt`` turns an error into a readable note instead of a crash.
"""

from __future__ import annotations

import pandas as pd

from entropy_law.analysis import tables
from entropy_law.law import arm_analyses
from entropy_law.law.arms import AR_LABEL
from entropy_law.law.fit import PRIMARY_FAMILY, fallback_note, fit_law, primary_family
from entropy_law.law.hypotheses import universality_test
from entropy_law.law.results import Attempt
from entropy_law.law.transfer import block_prediction
from entropy_law.law.view import TraceView, entropy_tokens, make_view, model_name
from entropy_law.payoff import arm_costs, measured

AR_ARM = AR_LABEL  # label of the autoregressive baseline in tables (one per model where there are several)
DEFAULT_FAMILY = PRIMARY_FAMILY


class TraceAnalysis:
    """Analyses of one trace set (``load_traces`` or ``simulate_traces``), computed on first use and cached.
    ``family``: the law per arm (default ``fit.primary_family``, noted in ``notes`` where it is not the primary).
    ``n_boot``: request-bootstrap replicates; ``seed``: every random choice; ``ar_ms_per_token``: AR cost per token
    where there is no AR run; ``proposals``: replayed proposals (``traces.proposals``), for LOCO "replayed"."""

    def __init__(self, traces, *, family: str | None = None, n_boot: int = 50, seed: int = 0,
                 ar_ms_per_token: float | None = None, compare_families=arm_analyses.COMPARE_FAMILIES,
                 n_folds: int = 5, proposals: pd.DataFrame | None = None):
        self.traces = traces
        self.proposals = proposals
        self.view = make_view(traces)
        self.notes: list[str] = []
        if family is None:  # the primary law these traces support (fit.primary_family)
            family = primary_family(self.view.tokens)
            note = fallback_note(family)
            if note:
                self.notes.append(note)
        self.family = family
        self.n_boot = int(n_boot)
        self.seed = int(seed)
        self.compare_families = tuple(compare_families)
        self.n_folds = int(n_folds)
        self.given_ar_ms = ar_ms_per_token
        self._cache: dict = {}
        if self.view.tokens.empty:
            raise ValueError("the traces hold no tokens: record some requests first")

    runs = property(lambda self: self.view.runs)

    @property
    def arms(self) -> list[str]:
        """Drafting arms (AR excluded), in run order."""
        return list(dict.fromkeys(self.runs.loc[~self.runs["is_ar"], "arm"]))

    @property
    def ar_arms(self) -> list[str]:
        """AR baselines, one per model (``"AR"``, or ``"<model>/AR"`` where the traces hold several models)."""
        return list(dict.fromkeys(self.runs.loc[self.runs["is_ar"], "arm"]))

    @property
    def categories(self) -> list[str]:
        return sorted(self.view.tokens["category"].unique())

    has_ar = property(lambda self: bool(self.runs["is_ar"].any()))

    def arm_view(self, arm: str) -> TraceView:
        ids = self.runs.loc[self.runs["arm"] == arm, "run_id"]
        if ids.empty:
            raise ValueError(f"no run for arm {arm!r}; arms: {self.arms + self.ar_arms}")
        return self.view.select_runs(ids)

    def model_of(self, arm: str) -> str:
        """The target model of ``arm`` (every run of an arm decodes with one model)."""
        return model_name(self.runs.loc[self.runs["arm"] == arm, "arm_key"].iloc[0].model_id)

    def entropy_tokens(self) -> pd.DataFrame:
        return entropy_tokens(self.view)

    def _cached(self, key, compute):
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def attempt(self, name: str, *args) -> Attempt:
        """``getattr(self, name)(*args)`` as an ``Attempt``: a ``ValueError`` becomes ``error``."""
        try:
            return Attempt(value=getattr(self, name)(*args))
        except ValueError as err:  # the law layer's "too little / wrong data" errors
            return Attempt(error=f"{name}({', '.join(map(str, args))}) not available: {err}")
        except Exception as err:  # numerical failures on degenerate data (e.g. as many parameters as cells)
            return Attempt(error=f"{name}({', '.join(map(str, args))}) failed: {type(err).__name__}: {err}")

    def law(self, arm: str):
        """The fitted law (``self.family``) of one arm."""
        return self._cached(("law", arm), lambda: fit_law(self.arm_view(arm), self.family))

    def block(self, arm: str):
        """Observed vs DP-predicted tokens per round per category (in-sample law)."""
        return self._cached(("block", arm), lambda: block_prediction(self.law(arm), self.arm_view(arm), drafter=arm))

    @property
    def loco_depths(self) -> tuple:
        """LOCO's drafted-depth modes: leak-free first, the replayed proposals where given, then the oracle."""
        return arm_analyses.LOCO_REPORTED if self.proposals is None else ("training", "replayed", "oracle")

    def loco(self, arm: str, depths: str = "training"):
        return arm_analyses.loco(self, arm, depths)

    def universality(self, arm: str):
        """P1 for one arm (``hypotheses.universality_test`` with ``cv=True``)."""
        return self._cached(("p1", arm), lambda: universality_test(self.arm_view(arm), drafter=arm, cv=True,
                                                                   n_folds=self.n_folds, seed=self.seed))

    def category_share(self, arm: str) -> dict:
        return arm_analyses.category_share(self, arm)

    def universality_table(self) -> pd.DataFrame:
        return arm_analyses.universality_table(self)

    def loco_accuracy(self) -> pd.DataFrame:
        return arm_analyses.loco_accuracy(self)

    def comparison(self, arm: str):
        return arm_analyses.comparison(self, arm)

    def ar_ms_per_token(self, arm: str | None = None) -> float:
        return arm_costs.ar_ms_per_token(self, arm)

    def cost_view(self, arm: str) -> TraceView:
        return arm_costs.cost_view(self, arm)

    def cost_model(self, arm: str):
        return arm_costs.cost_model(self, arm)

    def ar_requests(self, arm: str) -> pd.DataFrame | None:
        return arm_costs.ar_requests(self, arm)

    def machine_warnings(self, arm: str) -> list[str]:
        return arm_costs.machine_warnings(self, arm)

    def pays(self, arm: str):
        return arm_costs.pays(self, arm)

    def workload(self, arm: str, *, law=None, proposals: pd.DataFrame | None = None):
        return arm_costs.workload(self, arm, law=law, proposals=proposals)

    def cost_error(self, arm: str, rounds_of: str | None = None) -> pd.DataFrame:
        return arm_costs.cost_error(self, arm, rounds_of)

    def same_drafter_arms(self, arm: str) -> list[str]:
        return arm_costs.same_drafter_arms(self, arm)

    def cost_model_error(self, arm: str) -> tuple[float, str]:
        return arm_costs.cost_model_error(self, arm)

    def variant_error(self, arm: str) -> tuple[float, list[str]]:
        return arm_costs.variant_error(self, arm)

    def predict(self, arm: str, workload, **options):
        """Will drafting pay on ``workload``? Options as ``payoff.arm_costs.predict``."""
        return arm_costs.predict(self, arm, workload, **options)

    def paired_requests(self, arm: str) -> pd.DataFrame:
        return measured.paired_requests(self, arm)

    def request_speedups(self, arm: str) -> pd.DataFrame:
        return measured.request_speedups(self, arm)

    def timed_together(self, arm: str) -> tuple[bool | None, str]:
        return measured.timed_together(self, arm)

    def speedup(self, arm: str) -> pd.DataFrame:
        return measured.speedup(self, arm)

    def measured_speedups(self) -> pd.DataFrame:
        return measured.measured_speedups(self)

    def speedup_validation(self) -> pd.DataFrame:
        return measured.speedup_validation(self)

    def speedup_crossing(self, arm: str) -> dict:
        return measured.speedup_crossing(self, arm)

    def crossing_table(self) -> pd.DataFrame:
        return measured.crossing_table(self)

    def results_table(self) -> pd.DataFrame:
        return tables.results_table(self)

    def law_table(self) -> pd.DataFrame:
        return tables.law_table(self)
