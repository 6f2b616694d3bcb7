"""Law families and ``fit_law``: binomial hazard models of acceptance on the at-risk table.

Each family (formulas in ``docs/law.md``) is a binomial GLM on at-risk counts with request-clustered CR1 errors and t(G
- 1) intervals, G the requests, except ``law_iso`` (isotonic in entropy, per depth). A fitted law gives a summary,
predictions (acceptance, block length, exact tokens per round by DP) and a plot. Inputs that make a fit meaningless
raise; perfect separation is noted (``FittedLaw.separated``). Never imports torch.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import patsy
import statsmodels.api as sm
import statsmodels.formula.api as smf
from scipy import stats
from scipy.optimize import isotonic_regression
from statsmodels.tools.sm_exceptions import DomainWarning, PerfectSeparationWarning, SingularMatrixWarning

from entropy_law.law import atrisk
from entropy_law.law.blocks import (acceptance_matrix_positions, acceptance_tensor_positions, expected_accepted,
                                    expected_rounds)
from entropy_law.law.results import Result
from entropy_law.law.stats import warn_if_few_requests

SPLINE_BOUNDS = (np.log(atrisk.EPS_NATS) - 1e-9, np.log(20.0))  # log(H + eps) range the spline covers
POSITION_COLUMNS = atrisk.POSITION_COLUMNS


@dataclass(frozen=True)
class LawFamily:
    """One law: GLM ``link`` on ``outcome`` ("rejection" or "acceptance") with ``terms`` (patsy)."""

    name: str
    description: str
    link: str  # "cloglog" | "logit" | "log" | "isotonic"
    outcome: str  # "rejection" | "acceptance"
    terms: str
    bin_columns: tuple = ("target_entropy_nats",)
    needs_categories: bool = False
    needs_drafters: bool = False
    slope: str | None = None  # the covariate whose coefficient is the law's exponent / slope
    extra_keys: tuple = ()  # at-risk columns kept as aggregation keys (exact, not binned), e.g. drafted_depth
    means: tuple = ()  # decode-time covariates (atrisk.DECODE_TIME) whose cell means the aggregate keeps
    profile_eps: bool = False  # the offset c of log(H + c) is fitted (profile likelihood over EPS_GRID)

    @property
    def needs_drafted_depth(self) -> bool:
        return "drafted_depth" in self.extra_keys

    @property
    def draft_stats(self) -> tuple:
        """The drafter's own statistics the law reads (``atrisk.DRAFT_STATS``), known only where it drafted."""
        return tuple(c for c in atrisk.DRAFT_STATS if c in self.means)

    @property
    def needs_draft_stats(self) -> bool:
        return bool(self.draft_stats)

    @property
    def needs_context_match(self) -> bool:
        """A law in the context's copyability before each position (tokens column ``context_match``)."""
        return POSITION_COLUMNS["context_match"] in self.means

    @property
    def needs_target_top1(self) -> bool:
        """A law in the target's top-1 probability p at each position (``target_top1_prob``): log(1 - p + 1e-3)."""
        return POSITION_COLUMNS["target_top1_prob"] in self.means

    @property
    def position_columns(self) -> tuple:
        """The tokens columns besides the entropy that the law's DP reads at every output position."""
        return tuple(column for column, mark in POSITION_COLUMNS.items() if mark in self.means)

    @property
    def uses_category(self) -> bool:
        return self.needs_categories or "category" in self.terms


_LAW_EXP_OBS = LawFamily(
    "law_exp_obs", "LAW-E + lagged H + running mean H + log(1 + position) + log D (decode time)", "cloglog",
    "rejection", "log_entropy + log_lag_entropy + log_run_mean_entropy + log1p_position + log_drafted_depth",
    bin_columns=("target_entropy_nats", "lag_entropy_nats", "run_mean_entropy_nats", "position"),
    slope="log_entropy", extra_keys=("drafted_depth",),
    means=("lag_entropy_nats", "log_lag_entropy", "run_mean_entropy_nats", "log_run_mean_entropy", "log1p_position"))


# covariates added to law_exp_obs_ceil: (terms, bin columns, cell means)
_DRAFTTOP = (" + log_draft_miss", ("draft_top1_prob",), ("draft_top1_prob", "log_draft_miss"))
_TOP1 = (" + log_target_miss", ("target_miss_prob",), ("log_target_miss",))
_COPY = (" + log1p_copy + copy_full", ("context_match",), ("context_match", "log1p_copy", "copy_full"))


def _obs_ceil(name: str, description: str, *added: tuple) -> LawFamily:
    """``law_exp_obs`` with its offset c fitted and the ``added`` covariates."""
    base = _LAW_EXP_OBS
    return replace(base, name=name, description=description, profile_eps=True,
                   terms=base.terms + "".join(a[0] for a in added),
                   bin_columns=(*base.bin_columns, *(c for a in added for c in a[1])),
                   means=(*base.means, *(c for a in added for c in a[2])))

FAMILIES: dict[str, LawFamily] = {
    f.name: f
    for f in [
        LawFamily("law0_cat", "category and depth only, no entropy (LAW-0)", "logit", "acceptance", "C(category)",
                  needs_categories=True),
        LawFamily("law_logit", "logit a = delta_d + beta H (LAW-L)", "logit", "acceptance", "target_entropy_nats",
                  slope="target_entropy_nats"),
        LawFamily("law_exp",
                  "a = exp(-lambda_d (H + eps)^k), cloglog on rejection "
                  "(LAW-E; the primary law until law_exp_obs_ceil)",
                  "cloglog", "rejection", "log_entropy", slope="log_entropy"),
        LawFamily("law_exp0", "a = a0_d exp(-lambda H), log link on acceptance (LAW-E0)", "log", "acceptance",
                  "target_entropy_nats", slope="target_entropy_nats"),
        LawFamily("law_power", "a = 1 / (1 + c_d (H + eps)^k), logit on rejection (LAW-P)", "logit", "rejection",
                  "log_entropy", slope="log_entropy"),
        LawFamily("law_renyi2", "LAW-E with Renyi-2 entropy (LAW-R2)", "cloglog", "rejection", "log_renyi2",
                  bin_columns=("target_renyi2_nats",), slope="log_renyi2"),
        LawFamily("law_margin", "logit a = delta_d + beta * logit gap (LAW-M)", "logit", "acceptance",
                  "target_logit_gap", bin_columns=("target_logit_gap",), slope="target_logit_gap"),
        LawFamily("law_spline", "logit a = delta_d + spline(log(H + eps)) (LAW-S, reference)", "logit", "acceptance",
                  f"bs(log_entropy, df=5, lower_bound={SPLINE_BOUNDS[0]!r}, upper_bound={SPLINE_BOUNDS[1]!r})"),
        LawFamily("law_iso", "isotonic, decreasing in H, per depth (reference)", "isotonic", "acceptance", ""),
        LawFamily("law_exp_cat", "LAW-E with category rates and exponents (LAW-E+C)", "cloglog", "rejection",
                  "C(category) * log_entropy", needs_categories=True, slope="log_entropy"),
        LawFamily("law_exp_cum", "LAW-E + log(1 + cumulative entropy of earlier depths) (+cum)", "cloglog",
                  "rejection", "log_entropy + log1p_cum_entropy",
                  bin_columns=("target_entropy_nats", "cum_entropy_nats"), slope="log_entropy"),
        LawFamily("law_exp_drafter", "LAW-E with drafter rates and exponents (drafter x entropy)", "cloglog",
                  "rejection", "C(drafter_id) * log_entropy", needs_drafters=True, slope="log_entropy"),
        LawFamily("law_exp_drafted", "LAW-E x D^gamma, D = the round's drafted depth (drafter confidence)", "cloglog",
                  "rejection", "log_entropy + log_drafted_depth", slope="log_entropy", extra_keys=("drafted_depth",)),
        LawFamily("law_exp_mundlak", "LAW-E split into within- and between-category entropy (Mundlak)", "cloglog",
                  "rejection", "log_entropy_within + log_entropy_category_mean", needs_categories=True,
                  slope="log_entropy_within"),
        # decode-time covariates (docs/law.md, "Covariate laws"), each known before verification
        LawFamily("law_exp_lag", "LAW-E + log(H_prev + eps), H_prev = the previous output position's entropy",
                  "cloglog", "rejection", "log_entropy + log_lag_entropy",
                  bin_columns=("target_entropy_nats", "lag_entropy_nats"), slope="log_entropy",
                  means=("lag_entropy_nats", "log_lag_entropy")),
        LawFamily("law_exp_runmean", "LAW-E + log(mean H of the output so far + eps)", "cloglog", "rejection",
                  "log_entropy + log_run_mean_entropy", bin_columns=("target_entropy_nats", "run_mean_entropy_nats"),
                  slope="log_entropy", means=("run_mean_entropy_nats", "log_run_mean_entropy")),
        LawFamily("law_exp_pos", "LAW-E + log(1 + output position)", "cloglog", "rejection",
                  "log_entropy + log1p_position", bin_columns=("target_entropy_nats", "position"),
                  slope="log_entropy", means=("log1p_position",)),
        LawFamily("law_exp_draftent", "LAW-E + log(drafter entropy at the depth + eps) (drafter confidence)",
                  "cloglog", "rejection", "log_entropy + log_draft_entropy",
                  bin_columns=("target_entropy_nats", "draft_entropy_nats"), slope="log_entropy",
                  means=("draft_entropy_nats", "log_draft_entropy")),
        LawFamily("law_exp_ceil", "a = exp(-lambda_d (H + c)^k), c fitted: ceiling exp(-lambda_1 c^k) < 1 at H = 0",
                  "cloglog", "rejection", "log_entropy", slope="log_entropy", profile_eps=True),
        _LAW_EXP_OBS,
        _obs_ceil("law_exp_obs_ceil", "law_exp_obs with the offset c of log(H + c) fitted (ceiling < 1)"),
        LawFamily("law_exp_drafttop", "LAW-E + log(1 - drafter's top-1 probability at the depth + 1e-3)", "cloglog",
                  "rejection", "log_entropy + log_draft_miss", bin_columns=("target_entropy_nats", "draft_top1_prob"),
                  slope="log_entropy", means=("draft_top1_prob", "log_draft_miss")),
        _obs_ceil("law_exp_obs_ceil_drafttop",
                  "law_exp_obs_ceil + log(1 - drafter's top-1 probability at the depth + 1e-3)", _DRAFTTOP),
        # the context's copyability: log(1 + min(L, 8)) and a step where the suffix match reaches 8
        _obs_ceil("law_exp_obs_ceil_copy",
                  "law_exp_obs_ceil + log(1 + context's suffix-match length, up to 8) + [length >= 8]", _COPY),
        # the target's own top-1 probability p at the position: log(1 - p + 1e-3), its mass off the greedy token
        _obs_ceil("law_exp_obs_ceil_top1", "law_exp_obs_ceil + log(1 - target's top-1 probability + 1e-3)", _TOP1),
        _obs_ceil("law_exp_obs_ceil_top1_copy",
                  "law_exp_obs_ceil_top1 + the context's copyability (law_exp_obs_ceil_copy's terms)", _TOP1, _COPY),
        _obs_ceil("law_exp_obs_ceil_drafttop_top1_copy",
                  "law_exp_obs_ceil_drafttop_copy + the target's top-1 probability (law_exp_obs_ceil_top1's term)",
                  _DRAFTTOP, _TOP1, _COPY),
        _obs_ceil("law_exp_obs_ceil_drafttop_copy",
                  "law_exp_obs_ceil_drafttop + the context's copyability (law_exp_obs_ceil_copy's terms)",
                  _DRAFTTOP, _COPY),
    ]
}

# the offsets c of log(H + c) (nats) a ``profile_eps`` family tries; the most likely one is the estimate
EPS_GRID = (1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0)

# covariates ``FittedLaw.steady_state`` sets as functions of H, and the grid (nats) of the envelope's running minimum
STEADY_H_COLUMNS = ("lag_entropy_nats", "log_target_miss")
# a caller's raw input -> the steady-state term it replaces
_RAW_TERM = {"target_top1_prob": "log_target_miss", "target_miss_prob": "log_target_miss"}
STEADY_GRID_MAX_NATS = 25.0
STEADY_GRID_POINTS = 256

# the primary law (docs/law.md, "Choosing the primary law"); traces without the target's top-1 probability
# (imported logs, GLANCE's round logs) use PRIMARY_FALLBACK. ``primary_family`` chooses.
PRIMARY_FAMILY = "law_exp_obs_ceil_top1"
PRIMARY_FALLBACK = "law_exp_obs_ceil"


def fallback_note(family: str, what: str = "these traces") -> str | None:
    """Why ``family`` (``primary_family``'s choice) is not ``PRIMARY_FAMILY``, with what to do; None where it is."""
    if family == PRIMARY_FAMILY:
        return None
    return (f"law: {family}, not the primary {PRIMARY_FAMILY}: the target's top-1 probability is missing at some "
            f"token of {what} (compute it for imported runs: `entropy-law entropy RUN --model M`)")


def primary_family(tokens=None) -> str:
    """``PRIMARY_FAMILY`` where every token (or no table) holds ``target_top1_prob``, else ``PRIMARY_FALLBACK``."""
    if tokens is None:
        return PRIMARY_FAMILY
    if "target_top1_prob" in tokens and len(tokens) and not tokens["target_top1_prob"].isna().any():
        return PRIMARY_FAMILY
    return PRIMARY_FALLBACK


def without_drafted_depth(family) -> LawFamily:
    """``family`` without its log D term (same name): the law of a drafter that always drafts one depth."""
    fam = get_family(family)
    terms = " + ".join(t.strip() for t in fam.terms.split("+") if t.strip() != "log_drafted_depth")
    return replace(fam, description=fam.description + " (without log D: one drafted depth)", terms=terms, extra_keys=())


def with_category_terms(family) -> LawFamily:
    """``family`` plus category rates and category x log(H + eps) exponents (P1's alternative)."""
    fam = get_family(family)
    if fam.uses_category:
        raise ValueError(f"{fam.name} already has category terms")
    if fam.link == "isotonic":
        raise ValueError("law_iso has no GLM terms to add category terms to")
    terms = "C(category) + C(category):log_entropy" + (f" + {fam.terms}" if fam.terms else "")
    return replace(fam, name=f"{fam.name}+cat", description=f"{fam.name} with category rates and exponents",
                   terms=terms, needs_categories=True)

DEPTH_TERMS = {"factor": "C(depth)", "linear": "depth", "none": ""}


def _family_obj(link: str):
    links = sm.families.links
    make = {"cloglog": links.CLogLog, "logit": links.Logit, "log": links.Log}[link]
    return sm.families.Binomial(link=make())


def get_family(name: str) -> LawFamily:
    if isinstance(name, LawFamily):
        return name
    if name not in FAMILIES:
        raise ValueError(f"unknown law family {name!r}; known: {sorted(FAMILIES)} (GLANCE's round-level law is "
                         "fitted by entropy_law.glance.fit_glance)")
    return FAMILIES[name]


def prepare_counts(traces, family: LawFamily, *, eps=atrisk.EPS_NATS, width_log10=0.05, aggregate=True,
                   on_invalid="raise") -> pd.DataFrame:
    """The count table a family is fitted on, from traces, at-risk rows or an aggregate."""
    table = traces if isinstance(traces, pd.DataFrame) else atrisk.at_risk_table(traces, eps=eps, on_invalid=on_invalid)
    read = (set(family.bin_columns) | set(family.position_columns)) & set(atrisk.COVARIATES)
    unlogged = [c for c in table.attrs.get("unlogged", ()) if c in read]
    if unlogged:
        raise ValueError(f"{family.name} reads {unlogged}, which these traces did not log (null at every at-risk "
                         "position): compute the target's statistics for imported runs (`entropy-law entropy RUN "
                         f"--model M`), or use a family in the entropy alone, such as '{PRIMARY_FALLBACK}'")
    missing = [c for c in family.extra_keys if c not in table.columns]
    if missing:
        raise ValueError(f"{family.name} needs at-risk columns {missing}: pass traces with a .rounds table (the "
                         "round's drafted depth), or an at-risk table / aggregate that has them")
    if family.needs_context_match and ("context_match" not in table or table["context_match"].isna().any()):
        raise ValueError(f"{family.name} uses the context's copyability before each position (tokens column "
                         "context_match), which these traces do not hold at every at-risk trial: record with the "
                         "prompts' token ids, attach it from the prompts (jobs.reference.attach_context_matches; "
                         "entropy-law law --context-match), or use a family without it, such as 'law_exp_obs_ceil'")
    if family.needs_target_top1 and ("target_top1_prob" not in table or table["target_top1_prob"].isna().any()):
        raise ValueError(f"{family.name} uses the target's top-1 probability at each position (tokens column "
                         "target_top1_prob), which these traces do not hold at every at-risk trial: compute it for "
                         "imported runs (`entropy-law entropy RUN --model M`), or use a family without it, such as "
                         "'law_exp_obs_ceil'")
    for column in family.draft_stats:
        if column not in table or table[column].isna().any():
            raise ValueError(f"{family.name} uses the drafter's {column} at each depth, which these traces do not hold "
                             "at every at-risk trial (drafter entropy: the n-gram drafter logs none; draft_top1_prob: "
                             "runs recorded before it existed lack it): use a family without it, such as "
                             "'law_exp_obs'")
    if table.attrs.get("kind") == atrisk.KIND_ROWS and aggregate:
        table = atrisk.aggregate_at_risk(table, bin_columns=family.bin_columns, eps=eps, width_log10=width_log10,
                                         keys=(*atrisk.KEY_COLUMNS, *family.extra_keys), extra_means=family.means)
    return atrisk.as_counts(table)


def check_counts(counts: pd.DataFrame, family: LawFamily, *, min_requests_per_category: int = 5,
                 drop_small_categories: bool = False, cov_type: str = "cluster") -> tuple[pd.DataFrame, list]:
    """Refuse inputs on which the family's numbers would be meaningless; returns (counts, notes)."""
    notes = []
    n_rej, n_acc = int(counts["n_rej"].sum()), int(counts["n_acc"].sum())
    if n_rej == 0:
        raise ValueError("the traces contain no rejection at any at-risk depth: acceptance is 1 everywhere and the "
                         "law's rate/slope are not identified. Record more (or harder) requests.")
    if n_acc == 0:
        raise ValueError("the traces contain no accepted draft: acceptance is 0 everywhere and no entropy law can be "
                         "fitted. Check the drafter (does it draft at all?).")
    n_requests = counts["request_id"].nunique()
    if cov_type == "cluster" and n_requests < 2:
        raise ValueError("request-clustered errors need at least 2 requests; record more or pass cov_type='nonrobust'")
    drafters = counts["drafter_id"].unique()
    if len(drafters) > 1 and not family.needs_drafters:
        raise ValueError(f"the traces hold {len(drafters)} drafters {sorted(drafters)}: a law for one drafter would "
                         "pool them. Pass by='drafter_id', select one drafter, or use family='law_exp_drafter'.")
    if family.needs_drafters and len(drafters) < 2:
        raise ValueError(f"{family.name} compares drafters but the traces hold only {list(drafters)}")
    if family.needs_drafted_depth and counts["drafted_depth"].nunique() < 2 and not family.means:
        raise ValueError(f"every at-risk round drafted the same depth {sorted(counts['drafted_depth'].unique())}: the "
                         f"drafted-depth term of {family.name} is not identified. Use 'law_exp'.")
    if family.needs_categories:
        per_cat = counts.groupby("category")["request_id"].nunique()
        small = per_cat[per_cat < min_requests_per_category]
        if len(small):
            if not drop_small_categories:
                raise ValueError(
                    f"categories {small.to_dict()} have fewer than {min_requests_per_category} requests, too few for "
                    f"category terms of {family.name}. Record more, pass drop_small_categories=True to drop them, "
                    "or lower min_requests_per_category.")
            counts = counts.loc[~counts["category"].isin(small.index)]
            notes.append(f"dropped categories with < {min_requests_per_category} requests: {small.to_dict()}")
            per_cat = per_cat.drop(small.index)
        if len(per_cat) < 2:
            raise ValueError(f"{family.name} needs at least 2 categories; the traces hold {list(per_cat.index)}. "
                             "Use a category-free family such as 'law_exp'.")
    return counts, notes


def _add_mundlak(counts: pd.DataFrame, category_means: Mapping | None = None) -> tuple[pd.DataFrame, dict]:
    if category_means is None:
        weighted = counts["log_entropy"] * counts["n"]
        sums = weighted.groupby(counts["category"]).sum() / counts["n"].groupby(counts["category"]).sum()
        category_means = sums.to_dict()
    out = counts.copy()
    out["log_entropy_category_mean"] = out["category"].map(category_means).astype(float)
    out["log_entropy_within"] = out["log_entropy"] - out["log_entropy_category_mean"]
    return out, dict(category_means)


@dataclass
class FittedLaw(Result):
    """A fitted acceptance law. ``summary``: one row per parameter (estimate, SE, t or z, p, CI, ``n_requests``),
    then derived parameters (``k``, ``lambda[d=j]``) where the family has them."""

    family: LawFamily
    result: object  # statsmodels GLMResults, or None for law_iso
    depths: tuple
    categories: tuple
    drafters: tuple
    n_rows: int
    n_requests: int
    eps: float
    alpha: float = 0.05
    depth_model: str = "factor"
    iso_curves: dict = field(default_factory=dict)
    category_means: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    counts: object = field(default=None, repr=False, compare=False)  # the fitted count table (P1 in print_summary)
    # an out-of-core fit (no count table): the count-weighted means of the log covariates ``steady_state`` reads
    covariate_means: dict = field(default_factory=dict, repr=False, compare=False)
    # a law in the target's top-1 probability: ``target_miss_curve`` of the fitted trials
    miss_curve: object = field(default=None, repr=False, compare=False)
    _p1: object = field(default=None, repr=False, compare=False)
    # per other inputs: the steady state's envelope on a grid of H, or None where it falls (``_steady_envelope``)
    _envelopes: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def title(self) -> str:
        return (f"{self.family.name}: {self.family.description} ({self.n_rows} at-risk trials, "
                f"{self.n_requests} requests)")

    @property
    def df_inference(self) -> float | None:
        """Degrees of freedom of the t intervals (G - 1 when cluster-robust); ``None`` where they are normal."""
        if self.result is None or not self.result.use_t:
            return None
        return float(getattr(self.result, "df_resid_inference", self.result.df_resid))

    @property
    def critical_value(self) -> float:
        """The two-sided ``1 - alpha`` quantile the intervals use: t(``df_inference``) or the normal."""
        df = self.df_inference
        return float(stats.norm.ppf(1 - self.alpha / 2) if df is None else stats.t.ppf(1 - self.alpha / 2, df))

    def universality(self) -> dict | None:
        """P1: the cluster-robust score (and Wald) test of category terms added to this law; None unless it is
        category-free and fitted on two or more categories of at least 5 requests. Computed once."""
        if self._p1 is not None:
            return self._p1 or None
        self._p1 = {}
        if (self.result is None or self.counts is None or self.family.uses_category or self.family.needs_drafters
                or len(self.categories) < 2):
            return None
        per_cat = self.counts.groupby("category")["request_id"].nunique()
        if (per_cat < 5).any():
            return None
        family, counts = self.family, self.counts
        if family.profile_eps:  # both models at this law's fitted offset c: the score test needs one design
            family = replace(family, profile_eps=False)
            h = np.maximum(counts["target_entropy_nats"].to_numpy(dtype=float), 0.0)
            counts = counts.assign(log_entropy=np.log(h + self.eps))
        full_family = with_category_terms(family)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            full = fit_law(counts, full_family, eps=self.eps, depth=self.depth_model, cov_type="cluster")
            restricted = fit_law(counts, family, eps=self.eps, depth=self.depth_model, cov_type="nonrobust")
        terms = [n for n in full.result.params.index if "C(category)" in n]
        score = cluster_score_test(restricted.result, full.result, terms)
        wald = cluster_wald_test(full.result, terms)
        self._p1 = dict(score_statistic=score[0], df=len(terms), p_value=score[1], wald_statistic=wald[0],
                        p_wald_chi2=wald[1], categories=len(self.categories))
        return self._p1

    def _text(self, decimals: int = 4) -> str:
        text = super()._text(decimals)
        try:
            p1 = self.universality()
        except Exception as err:  # P1 is an addition to the summary, never the reason it cannot be shown
            return text + f"\nP1 (universality across categories): not computed ({err})"
        if p1:
            text += (f"\nP1 (one law across {p1['categories']} categories; category rates and exponents added, "
                     f"cluster-robust score test): chi2({p1['df']}) = {p1['score_statistic']:.1f}, "
                     f"p = {p1['p_value']:.2g} ({'rejected' if p1['p_value'] < 0.05 else 'not rejected'} at 5%); "
                     f"robust Wald chi2 = {p1['wald_statistic']:.1f}, p = {p1['p_wald_chi2']:.2g}")
        return text

    def _notes(self) -> list:
        notes = list(self.notes)
        if self.result is not None:
            dist = "normal" if self.df_inference is None else f"t with {self.df_inference:g} df"
            cov = ("cluster-robust by request (CR1)" if self.result.cov_type == "cluster"
                   else f"{self.result.cov_type} covariance")
            notes.insert(0, f"{1 - self.alpha:.0%} intervals: {cov}, {dist}; they rest on {self.n_requests} requests")
        return notes

    @property
    def separated(self) -> bool:
        """True where the fit separates some cells perfectly: the observed information at the estimate is not
        finite, so some terms are not identified. ``False`` for ``law_iso``."""
        if self.result is None:
            return False
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # the very thing checked for
            information = self.result.model.hessian(np.asarray(self.result.params), observed=True)
        return not bool(np.all(np.isfinite(information)))

    @property
    def coefficients(self) -> pd.DataFrame:
        if self.result is None:
            return pd.DataFrame(columns=["estimate", "std_err", "z", "p_value", "ci_low", "ci_high", "n_requests"])
        r = self.result
        ci = r.conf_int(alpha=self.alpha)
        return pd.DataFrame({"estimate": r.params, "std_err": r.bse, "t" if r.use_t else "z": r.tvalues,
                             "p_value": r.pvalues, "ci_low": ci[0], "ci_high": ci[1], "n_requests": self.n_requests})

    def linear_combination(self, weights: Mapping[str, float]) -> tuple[float, float]:
        """Estimate and cluster-robust SE of sum_j w_j beta_j."""
        params = self.result.params
        vec = np.array([weights.get(name, 0.0) for name in params.index])
        cov = self.result.cov_params().to_numpy()
        return float(vec @ params.to_numpy()), float(np.sqrt(vec @ cov @ vec))

    @property
    def derived(self) -> pd.DataFrame:
        """Exponent ``k`` and rates ``lambda[d=j]`` (cloglog / power laws) with intervals; for a law in the target's
        top-1 probability p1 also ``w``, the exponent of 1 - p1 + 1e-3."""
        if self.result is None or self.family.slope is None:
            return pd.DataFrame()
        q = self.critical_value
        rows = {}
        est, se = self.linear_combination({self.family.slope: 1.0})
        rows["k" if self.family.slope.startswith("log_") else "slope"] = (est, se, est - q * se, est + q * se)
        if "log_target_miss" in self.result.params.index:
            est, se = self.linear_combination({"log_target_miss": 1.0})
            rows["w"] = (est, se, est - q * se, est + q * se)
        if self.family.outcome == "rejection" and "Intercept" in self.result.params.index:
            rate = "lambda" if self.family.link == "cloglog" else "c"
            for d in self.depths:
                weights = {"Intercept": 1.0}
                if self.depth_model == "factor" and d != self.depths[0]:
                    weights[f"C(depth)[T.{d}]"] = 1.0
                elif self.depth_model == "linear":
                    weights["depth"] = float(d)
                e, s = self.linear_combination(weights)
                with np.errstate(over="ignore"):  # a wide t(1) interval of a log rate may end at inf
                    rows[f"{rate}[d={d}]"] = (np.exp(e), np.exp(e) * s, np.exp(e - q * s), np.exp(e + q * s))
                if self.depth_model == "none":
                    break
        out = pd.DataFrame.from_dict(rows, orient="index", columns=["estimate", "std_err", "ci_low", "ci_high"])
        return out.assign(n_requests=self.n_requests)

    @property
    def summary(self) -> pd.DataFrame:
        coef = self.coefficients.assign(kind="coefficient")
        derived = self.derived
        if len(derived):
            derived = derived.assign(kind="derived")
            return pd.concat([coef, derived])
        if self.result is None:
            rows = {f"iso[d={d}] points": (len(c[0]),) for d, c in self.iso_curves.items()}
            return pd.DataFrame.from_dict(rows, orient="index", columns=["estimate"]).assign(kind="nonparametric")
        return coef

    def _frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        out = frame.copy()
        eps = self.eps
        if "target_entropy_nats" in out:
            h = out["target_entropy_nats"].to_numpy(dtype=float)
            if np.any(~np.isfinite(h)) or np.any(h < -atrisk.NEGATIVE_TOLERANCE):
                raise ValueError("entropies must be finite and >= 0 nats")
            out["log_entropy"] = np.log(np.maximum(h, 0.0) + eps)
        if "target_renyi2_nats" in out:
            out["log_renyi2"] = np.log(out["target_renyi2_nats"].to_numpy(dtype=float) + eps)
        if "cum_entropy_nats" in out:
            out["log1p_cum_entropy"] = np.log1p(out["cum_entropy_nats"].to_numpy(dtype=float))
        if self.family.means:
            missing = [c for c in _raw_means(self.family) if c not in out and not _derived_given(c, out)]
            if missing:
                raise ValueError(f"{self.family.name} predicts from {missing}: pass them "
                                 "(see atrisk.sequence_covariates)")
            atrisk.add_log_covariates(out)
        if self.family.needs_drafted_depth:
            if "drafted_depth" not in out:
                raise ValueError(f"{self.family.name} predicts from the round's drafted depth: pass drafted_depth=...")
            drafted = out["drafted_depth"].to_numpy(dtype=float)
            if np.any(drafted < 1):
                raise ValueError("drafted_depth must be >= 1 where a draft is at risk")
            out["log_drafted_depth"] = np.log(drafted)
        if "log_entropy" in out:
            out["log_entropy"] = np.clip(out["log_entropy"].to_numpy(), SPLINE_BOUNDS[0] + 1e-9,
                                         SPLINE_BOUNDS[1] - 1e-9)
        depth = out["depth"].to_numpy(dtype=int) if "depth" in out else np.ones(len(out), dtype=int)
        if np.any(depth < 1):
            raise ValueError("depth is 1-based")
        # depths beyond the deepest fitted depth reuse the deepest depth's effect (documented)
        out["depth"] = np.minimum(depth, max(self.depths))
        if self.depth_model == "factor":
            known = np.array(self.depths)
            idx = np.searchsorted(known, out["depth"].to_numpy(), side="right") - 1
            out["depth"] = known[np.maximum(idx, 0)]
        for col, known, what in (("category", self.categories, "category"), ("drafter_id", self.drafters, "drafter")):
            needed = (self.family.needs_categories if col == "category" else self.family.needs_drafters)
            if not needed:
                continue
            if col not in out or out[col].isna().any():
                raise ValueError(f"{self.family.name} needs a {what}: pass {what}= one of {list(known)}")
            unknown = set(out[col]) - set(known)
            if unknown:
                raise ValueError(f"{what} {sorted(unknown)} not in the fitted law; known: {list(known)}")
        if self.family.name == "law_exp_mundlak":
            out, _ = _add_mundlak(out, self.category_means)
        return out

    def predict_frame(self, frame: pd.DataFrame) -> np.ndarray:
        """Acceptance probability for each row of an at-risk-like frame (covariate columns, depth, ...)."""
        data = self._frame(frame)
        if self.family.link == "isotonic":
            out = np.empty(len(data))
            depth = data["depth"].to_numpy()
            x = data["log_entropy"].to_numpy()
            for d in np.unique(depth):
                xs, ys = self.iso_curves[d]
                sel = depth == d
                out[sel] = np.interp(x[sel], xs, ys)
            return np.clip(out, 1e-9, 1 - 1e-9)
        # far outside the data exp() in the inverse link overflows to inf: the probability is then its exact limit
        with np.errstate(over="ignore"):
            exog = simple_design(data, self.result.model)
            mu = np.asarray(self.result.predict(prediction_frame(data, self.result.model)) if exog is None
                            else self.result.predict(exog, transform=False))
        accept = 1.0 - mu if self.family.outcome == "rejection" else mu
        return np.clip(accept, 1e-12, 1 - 1e-12)

    def predict_acceptance(self, H, depth=1, category=None, *, drafter=None, **covariates) -> np.ndarray:
        """P(accept at ``depth`` | reached, target entropy ``H`` nats[, category, drafter]), broadcast; other
        covariates by name (``target_renyi2_nats=...``, ``target_logit_gap=...``, ``cum_entropy_nats=...``)."""
        arrays = np.broadcast_arrays(np.asarray(H, dtype=float), np.asarray(depth),
                                     *[np.asarray(v) for v in covariates.values()])
        shape = arrays[0].shape
        frame = pd.DataFrame({"target_entropy_nats": arrays[0].ravel(), "depth": arrays[1].ravel().astype(int)})
        for name, arr in zip(covariates, arrays[2:]):
            frame[name] = arr.ravel()
        if self.family.means:  # decode-time covariates not given: the constant-entropy steady state
            for name, value in self.steady_state(arrays[0].ravel()).items():
                if name not in frame:
                    frame[name] = value
        needed = {"law_renyi2": "target_renyi2_nats", "law_margin": "target_logit_gap",
                  "law_exp_cum": "cum_entropy_nats"}.get(self.family.name)
        needed = [needed] if needed else []
        needed += [c for c in (*_raw_means(self.family), *self.family.extra_keys) if c not in needed]
        missing = [c for c in needed if c not in frame and not _derived_given(c, frame)]
        if missing:
            raise ValueError(f"{self.family.name} predicts from {missing}: pass "
                             + ", ".join(f"{c}=..." for c in missing))
        if category is not None:
            frame["category"] = category
        if drafter is not None:
            frame["drafter_id"] = drafter
        accept = self.predict_frame(frame)
        # the envelope applies where H alone was given: none of the inputs that move with H came from the caller
        given = set(covariates) | {_RAW_TERM.get(name, name) for name in covariates}
        filled = [n for n in STEADY_H_COLUMNS if n in frame]
        if filled and not given & set(STEADY_H_COLUMNS) and self.family.link != "isotonic":
            accept = self._steady_envelope(frame, accept, filled)
        return accept.reshape(shape)

    def _steady_envelope(self, frame: pd.DataFrame, accept: np.ndarray, filled: list) -> np.ndarray:
        """Acceptance at H given alone, kept nonincreasing in H: its running minimum over [0, H] on a grid, where
        the steady state sets covariates that move with H (``filled``). Laws that already fall are unchanged."""
        h = frame["target_entropy_nats"].to_numpy(dtype=float)
        keys = [c for c in frame.columns if c not in ("target_entropy_nats", *filled)]
        out = accept.copy()
        groups = frame.groupby(keys, dropna=False, sort=False).indices if keys else {(): np.arange(len(frame))}
        top = float(max(STEADY_GRID_MAX_NATS, np.max(h, initial=0.0)))
        for key, rows in groups.items():
            cache_key = (key if isinstance(key, tuple) else (key,), top)
            if cache_key not in self._envelopes:
                grid = np.concatenate([[0.0], np.geomspace(1e-4, top, STEADY_GRID_POINTS)])
                base = frame.iloc[[rows[0]]].drop(columns=["target_entropy_nats", *filled])
                probe = base.loc[base.index.repeat(len(grid))].reset_index(drop=True)
                probe["target_entropy_nats"] = grid
                for name, value in self.steady_state(grid).items():
                    if name in filled:
                        probe[name] = value
                curve = self.predict_frame(probe)
                self._envelopes[cache_key] = None if np.all(np.diff(curve) <= 0) else (grid, curve)
            envelope = self._envelopes[cache_key]
            if envelope is not None:
                grid, curve = envelope
                x = np.concatenate([grid, h[rows]])
                order = np.argsort(x, kind="stable")
                floor = np.empty(len(x))
                floor[order] = np.minimum.accumulate(np.concatenate([curve, out[rows]])[order])
                out[rows] = floor[len(grid):]
        return out

    def steady_state(self, h) -> dict:
        """Decode-time covariates where a caller gives only H (docs/law.md): the previous position's entropy is H;
        running-mean entropy, position, drafted depth and copyability are their training (geometric) means; the
        target's top-1 miss follows ``miss_curve``."""
        h = np.asarray(h, dtype=float)
        out = {}
        if "lag_entropy_nats" in self.family.means:
            out["lag_entropy_nats"] = h
        if self.counts is None and not self.covariate_means:
            if "run_mean_entropy_nats" in self.family.means:
                out["run_mean_entropy_nats"] = h
            return out
        if self.counts is not None:
            weights = self.counts["n"].to_numpy(dtype=float)
            means = {c: np.average(self.counts[c], weights=weights)
                     for c in ("log_run_mean_entropy", "log1p_position", "log_drafted_depth", "log1p_copy",
                               "copy_full") if c in self.counts}
        else:  # an out-of-core fit: the same means, summed over the cells as they streamed by
            means = self.covariate_means
        if "run_mean_entropy_nats" in self.family.means and "log_run_mean_entropy" in means:
            level = means["log_run_mean_entropy"]
            out["run_mean_entropy_nats"] = float(max(np.exp(level) - atrisk.EPS_NATS, 0.0))
        if "log1p_position" in self.family.means and "log1p_position" in means:
            out["position"] = float(np.expm1(means["log1p_position"]))
        if self.family.needs_drafted_depth and "log_drafted_depth" in means:
            out["drafted_depth"] = float(np.exp(means["log_drafted_depth"]))
        if self.family.needs_target_top1 and self.miss_curve is not None:
            centres, values = self.miss_curve
            out["log_target_miss"] = np.interp(np.log(np.maximum(h, 0.0) + atrisk.EPS_NATS), centres, values)
        if self.family.needs_context_match and {"log1p_copy", "copy_full"} <= set(means):
            out["log1p_copy"] = float(means["log1p_copy"])
            out["copy_full"] = float(means["copy_full"])
        return out

    def predict_block_length(self, entropies, B: int, *, category=None, drafter=None) -> np.ndarray:
        """Expected accepted drafts E[tau] of a block of ``B - 1`` drafts; ``entropies[..., d-1]`` is the
        target entropy at depth d (at least B - 1 values on the last axis)."""
        h = np.asarray(entropies, dtype=float)
        drafts = int(B) - 1
        if drafts < 1 or h.shape[-1] < drafts:
            raise ValueError(f"need B >= 2 and at least B - 1 = {drafts} entropies on the last axis")
        h = h[..., :drafts]
        depth = np.broadcast_to(np.arange(1, drafts + 1), h.shape)
        extra = {"drafted_depth": drafts} if self.family.needs_drafted_depth else {}  # a full block is drafted
        a = self.predict_acceptance(h, depth, category, drafter=drafter, **extra)
        return expected_accepted(a)

    def sequence_frame(self, h: np.ndarray, drafts: int, *, draft_top1: np.ndarray | None = None,
                       context_match: np.ndarray | None = None,
                       target_top1_prob: np.ndarray | None = None) -> tuple[pd.DataFrame, tuple]:
        """Rows to predict for the DP over entropy sequence ``h`` and their shape: ``[T, drafts]`` (depth j + 1 of a
        round at t), or ``[drafts, T, drafts]`` for a law in the drafted depth D (rows for j < D). ``draft_top1`` (``[T,
        drafts]``), ``context_match``, ``target_top1_prob`` (``[T]``): inputs of a law in them."""
        stats = self.family.draft_stats
        if stats and (draft_top1 is None or set(stats) != {"draft_top1_prob"}):
            raise ValueError(f"{self.family.name} needs the drafter's {', '.join(stats)} at every position and "
                             "depth, known only where the drafter drafted: it scores trials but cannot predict "
                             "rounds" + ("" if set(stats) != {"draft_top1_prob"} else
                                         " unless given the replayed proposals' top-1 probabilities (draft_top1="
                                         "transfer.proposal_arrays(...), depths='replayed')"))
        if self.family.needs_drafted_depth:
            position, depth, drafted, flat = acceptance_tensor_positions(h.size, drafts)
            frame = pd.DataFrame({"target_entropy_nats": h[position], "depth": depth, "drafted_depth": drafted})
            shape = ((drafts, h.size, drafts), flat)
            start = np.unravel_index(flat, (drafts, h.size, drafts))[1]
        else:
            position, depth = acceptance_matrix_positions(h.size, drafts)
            frame = pd.DataFrame({"target_entropy_nats": h[position], "depth": depth})
            shape = ((h.size, drafts), None)
            start = np.repeat(np.arange(h.size), drafts)
        if self.family.name == "law_exp_cum":
            csum = np.concatenate([[0.0], np.cumsum(h)])
            frame["cum_entropy_nats"] = csum[position] - csum[np.maximum(position - depth + 1, 0)]
        if self.family.means:  # the decode-time covariates of each (round start, depth)'s output position
            for name, values in atrisk.sequence_covariates(h, position).items():
                frame[name] = values
        if stats:
            top1 = np.asarray(draft_top1, dtype=float)
            if top1.shape != (h.size, drafts):
                raise ValueError(f"draft_top1 must be [T, drafts] = [{h.size}, {drafts}], got {top1.shape}")
            frame["draft_top1_prob"] = np.nan_to_num(top1[start, depth - 1], nan=0.0)  # NaN: never drafted there
        given = {"context_match": context_match, "target_top1_prob": target_top1_prob}
        for column in self.family.position_columns:
            frame[column] = self._position_values(column, given[column], h.size)[position]
        return frame, shape

    def _position_values(self, column: str, values, length: int) -> np.ndarray:
        """``values`` checked as the ``[length]`` per-position ``column`` of one output."""
        what, hint = {
            "context_match": ("lengths >= 0", "the context's copyability before every output position (tokens column "
                              "context_match): record the runs with the prompts' token ids or attach it from the "
                              "prompts (jobs.reference.attach_context_matches)"),
            "target_top1_prob": ("probabilities in [0, 1]", "the target's top-1 probability at every output position "
                                 "(tokens column target_top1_prob): runs our decoder records hold it; for imported "
                                 "runs compute it with `entropy-law entropy RUN --model M`")}[column]
        if values is None:
            raise ValueError(f"{self.family.name} predicts from {hint}")
        out = np.asarray(values, dtype=float)
        bad = out.shape == (length,) and (np.isnan(out).any() or (out < 0).any()
                                          or (column == "target_top1_prob" and (out > 1).any()))
        if out.shape != (length,) or bad:
            raise ValueError(f"{column} must be {length} {what} (one per output position), got shape {out.shape}"
                             + (" with missing or out-of-range values" if bad else ""))
        return out

    @staticmethod
    def shape_acceptance(values: np.ndarray, shape: tuple) -> np.ndarray:
        """Predicted acceptances of ``sequence_frame``'s rows in the DP's array shape."""
        dims, flat = shape
        if flat is None:
            return np.asarray(values, dtype=float).reshape(dims)
        out = np.ones(int(np.prod(dims)))
        out[flat] = values
        return out.reshape(dims)

    def acceptance_for_sequence(self, h, drafts: int, *, category=None, drafter=None, **position) -> np.ndarray:
        """The DP's acceptance array for one entropy sequence (``position``: as ``sequence_frame``)."""
        frame, shape = self.sequence_frame(np.asarray(h, dtype=float), drafts, **position)
        if category is not None:
            frame["category"] = category
        if drafter is not None:
            frame["drafter_id"] = drafter
        return self.shape_acceptance(self.predict_frame(frame), shape)

    def predict_rounds(self, entropy_sequence, B: int, *, category=None, drafter=None, depth_probs=None,
                       **position) -> float:
        """Exact expected rounds of a request with entropies ``entropy_sequence`` (DP); ``depth_probs``: None (B - 1
        drafts), a distribution over D = 0..B-1, or one per position (``[T, B]``)."""
        h = np.asarray(entropy_sequence, dtype=float)
        if h.ndim != 1 or h.size == 0:
            raise ValueError("entropy_sequence must be a non-empty 1-D array (one value per output position)")
        drafts = int(B) - 1
        if drafts < 1:
            raise ValueError("B must be >= 2")
        a = self.acceptance_for_sequence(h, drafts, category=category, drafter=drafter, **position)
        if depth_probs is not None:
            depth_probs = np.asarray(depth_probs, dtype=float)
            if depth_probs.ndim == 1:
                depth_probs = np.broadcast_to(depth_probs, (h.size, depth_probs.size))
        return expected_rounds(a, depth_probs)

    def predict_tokens_per_round(self, entropy_sequence, B: int, *, category=None, drafter=None,
                                 depth_probs=None, **position) -> float:
        """T / E[rounds]: the law-implied committed tokens per round of one request (as ``predict_rounds``)."""
        return len(entropy_sequence) / self.predict_rounds(entropy_sequence, B, category=category, drafter=drafter,
                                                           depth_probs=depth_probs, **position)

    def log_likelihood(self, counts: pd.DataFrame) -> np.ndarray:
        """Bernoulli log-likelihood of each row of a count table (``n_acc``, ``n_rej``)."""
        a = self.predict_frame(counts)
        return counts["n_acc"].to_numpy() * np.log(a) + counts["n_rej"].to_numpy() * np.log1p(-a)

    def plot(self, ax=None, *, depths: Sequence[int] = (1,), category=None, drafter=None, h_max: float = 5.0):
        """Fitted acceptance against target entropy (log x axis), one line per depth; returns ``ax``."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.5))
        h = np.geomspace(1e-3, h_max, 200)
        if category is None and self.family.needs_categories:
            category = self.categories[0]
        if drafter is None and self.family.needs_drafters:
            drafter = self.drafters[0]
        extra = {}
        if self.family.name == "law_renyi2":
            extra["target_renyi2_nats"] = h
        if self.family.name == "law_margin":
            raise ValueError("law_margin is a law in the logit gap, not in H; plot predict_acceptance yourself")
        if self.family.name == "law_exp_cum":
            extra["cum_entropy_nats"] = np.zeros_like(h)
        if self.family.needs_drafted_depth and not self.family.means:
            extra["drafted_depth"] = np.full_like(h, max(self.depths))  # the deepest drafts seen
        if self.family.needs_draft_stats:
            raise ValueError(f"{self.family.name} is a law in H and the drafter's own statistics; plot "
                             f"predict_acceptance yourself with {'=..., '.join(self.family.draft_stats)}=...")
        if self.family.means:  # the constant-entropy steady state (``steady_state``)
            extra.update(self.steady_state(h))
        for d in depths:
            ax.plot(h, self.predict_acceptance(h, d, category, drafter=drafter, **extra), label=f"depth {d}")
        ax.set_xscale("log")
        ax.set_xlabel("target entropy H (nats)")
        ax.set_ylabel("P(accept | reached depth)")
        ax.set_ylim(0, 1)
        ax.set_title(self.family.name)
        ax.legend(frameon=False)
        return ax


def _factor_column(code: str) -> str | None:
    """The column of a formula factor ``C(column)`` (without levels of its own); None for any other factor."""
    match = re.fullmatch(r"C\(\s*(\w+)\s*\)", code.strip())
    return match.group(1) if match else None


def _categorical(data, contrast=None, levels=None):
    """patsy's ``C``, except that a plain pandas Categorical passes as it is (patsy then codes it vectorised, not
    row by row); the design matrix and coefficient names are the same."""
    if contrast is None and levels is None and isinstance(getattr(data, "dtype", None), pd.CategoricalDtype):
        return data
    return patsy.builtins.C(data, contrast, levels)


# the namespace our formulas are evaluated in (np: the spline bounds are written as np.float64)
_FORMULA_ENV = {"C": _categorical, "np": np}


def formula_columns(data: pd.DataFrame, formula: str) -> pd.DataFrame:
    """The columns of ``data`` that ``formula`` names, plus ``request_id`` (the clusters) and ``n``: all a fit
    needs (statsmodels copies and converts the whole frame it is given)."""
    names = set(re.findall(r"[A-Za-z_]\w*", formula)) | {"request_id", "n"}
    return data[[c for c in data.columns if c in names]]


def _with_categoricals(data: pd.DataFrame, levels: dict) -> pd.DataFrame:
    """``data`` (in place) with each column of ``levels`` as a Categorical of those levels (None: observed, sorted).
    A column absent, already Categorical, or with a missing or unknown value is left to patsy."""
    for column, known in levels.items():
        if column not in data.columns or isinstance(data[column].dtype, pd.CategoricalDtype):
            continue
        coded = pd.Categorical(data[column], categories=sorted(data[column].dropna().unique()) if known is None
                               else list(known))
        if not coded.isna().any():
            data[column] = coded
    return data


def observed_categoricals(data: pd.DataFrame, rhs: str) -> pd.DataFrame:
    """A copy of ``data`` with the column of each ``C(column)`` term of ``rhs`` as a Categorical of its levels."""
    return _with_categoricals(data.copy(), dict.fromkeys(re.findall(r"C\(\s*(\w+)\s*\)", rhs)))


def prediction_frame(data: pd.DataFrame, model) -> pd.DataFrame:
    """The columns of ``data`` that ``model``'s formula names, each ``C(column)`` as a Categorical of the fitted
    levels (as ``observed_categoricals`` when it fits); a model without a formula: ``data`` as it is."""
    formula = getattr(model, "formula", None)
    if not isinstance(formula, str):
        return data
    spec = getattr(model, "model_spec", None) or getattr(getattr(model, "data", None), "model_spec", None)
    levels = {_factor_column(getattr(factor, "code", "")): info.categories
              for factor, info in (getattr(spec, "factor_infos", None) or {}).items() if info.type == "categorical"}
    levels.pop(None, None)
    return _with_categoricals(formula_columns(data, formula), levels)


def simple_design(data: pd.DataFrame, model):
    """``model``'s design matrix on ``data`` as patsy builds it (same values, same layout) where each column is the
    intercept, a level of a ``C(column)`` term or a numeric column of ``data`` without missing values; else None."""
    spec = getattr(model, "model_spec", None) or getattr(model.data, "model_spec", None)
    if spec is None:
        return None
    coded = {f"{f.code}[T.{level}]": (_factor_column(f.code), level) for f, info in spec.factor_infos.items()
             if info.type == "categorical" for level in info.categories[1:]}
    columns = []
    for name in model.exog_names:
        column, level = coded.get(name, (None, None))
        if name == "Intercept":
            columns.append(np.ones(len(data)))
        elif column in data:
            columns.append((data[column].to_numpy() == level).astype(float))
        elif name in data and pd.api.types.is_numeric_dtype(data[name]) and not data[name].isna().any():
            columns.append(data[name].to_numpy(dtype=float))
        else:
            return None
    return np.array(columns).T


def _fit_glm(counts: pd.DataFrame, family: LawFamily, depth_model: str, cov_type: str, start_params=None):
    depth_term = DEPTH_TERMS[depth_model]
    rhs = " + ".join(t for t in (depth_term, family.terms) if t) or "1"
    lhs = "n_rej + n_acc" if family.outcome == "rejection" else "n_acc + n_rej"
    data = observed_categoricals(formula_columns(counts.loc[counts["n"] > 0], f"{lhs} ~ {rhs}"), rhs)
    with warnings.catch_warnings():  # the log link is outside the binomial's domain; start values keep mu < 1
        warnings.simplefilter("ignore", DomainWarning)
        try:
            model = smf.glm(f"{lhs} ~ {rhs}", data, family=_family_obj(family.link), eval_env=_FORMULA_ENV)
        except Exception as err:  # patsy's PatsyError wrapping a NameError: a column the formula names is absent
            absent = re.findall(r"name '(\w+)' is not defined", str(err))
            if not absent:
                raise
            raise ValueError(f"{family.name} needs the at-risk column(s) {absent}, which this table lacks: fit the "
                             "traces themselves, or a table made by atrisk.at_risk_table / aggregate_at_risk (they "
                             "add log_entropy = log(H + eps) and the other derived columns)") from None
    return _fit_model(model, model.exog_names, family, cov_type, data, start_params)


def _fit_model(model, names: list, family: LawFamily, cov_type: str, data: pd.DataFrame, start_params=None):
    """``model`` (a GLM on the rows of ``data``, its columns ``names``) fitted as ``_fit_glm`` fits it."""
    kwargs = {}
    if cov_type == "cluster":
        groups = data["request_id"].astype("category").cat.codes.to_numpy()  # CR1 sandwich, t(G - 1) inference
        kwargs = dict(cov_type="cluster", cov_kwds={"groups": groups, "use_correction": True, "df_correction": True},
                      use_t=True)
    if family.link == "log" and start_params is None:
        # log-binomial needs mu < 1 at the start: a0 = 0.9 everywhere, slope -0.5 per nat
        start_params = np.zeros(len(names))
        start_params[names.index("Intercept")] = np.log(0.9)
        start_params[names.index(family.slope)] = -0.5
    # separation's overflow is reported by the notes (``FittedLaw.separated``), and statsmodels' separation and
    # singularity warnings are kept on the result (``perfect_prediction``, ``rank_deficient``), not printed
    kept = (PerfectSeparationWarning, SingularMatrixWarning)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"), warnings.catch_warnings(record=True) as caught:
        for category in kept:
            warnings.simplefilter("always", category)
        result = model.fit(start_params=start_params, maxiter=200, **kwargs)
    for w in caught:  # anything else is shown as it would have been
        if not issubclass(w.category, kept):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    result.perfect_prediction = any(issubclass(w.category, PerfectSeparationWarning) for w in caught)
    result.rank_deficient = any(issubclass(w.category, SingularMatrixWarning) for w in caught)
    return result


def cluster_score_test(restricted, full, terms: Sequence[str]) -> tuple[float, float]:
    """(LM, p): cluster-robust score test of ``terms`` (in ``full``, not in ``restricted``) at the restricted
    estimates, clusters = ``request_id``; chi-square with len(terms) df (as ``hypotheses.robust_score_test``)."""
    model = full.model
    names = list(model.exog_names)
    theta = np.array([restricted.params[n] if n in restricted.params.index else 0.0 for n in names])
    unknown = [n for n in names if n not in restricted.params.index and n not in terms]
    if unknown:
        raise ValueError(f"{unknown} are neither restricted nor tested")
    extra = np.array([n in terms for n in names])
    per_group = pd.DataFrame(model.score_obs(theta)).groupby(model.data.frame["request_id"].to_numpy()).sum().to_numpy()
    info = -model.hessian(theta)
    proj = info[np.ix_(extra, ~extra)] @ np.linalg.inv(info[np.ix_(~extra, ~extra)])
    u = per_group[:, extra] - per_group[:, ~extra] @ proj.T
    total, g = u.sum(axis=0), len(u)
    lm = float(total @ np.linalg.solve(u.T @ u * g / (g - 1), total))
    return lm, float(stats.chi2.sf(lm, int(extra.sum())))


def cluster_wald_test(full, terms: Sequence[str]) -> tuple[float, float]:
    """(W, p): Wald chi-square of ``terms`` = 0 with the fit's (cluster-robust) covariance."""
    beta = full.params[list(terms)].to_numpy()
    v = full.cov_params().loc[list(terms), list(terms)].to_numpy()
    w = float(beta @ np.linalg.solve(v, beta))
    return w, float(stats.chi2.sf(w, len(terms)))


def _derived_given(column: str, frame) -> bool:
    """Whether ``frame`` gives the derived terms a raw decode-time ``column`` is needed for."""
    if column == "position":
        return "log1p_position" in frame
    if column == "target_top1_prob":
        return "log_target_miss" in frame
    return column == "context_match" and "log1p_copy" in frame and "copy_full" in frame


MISS_CURVE_BINS = 20  # equal-share bins of log(H + eps) of the target-miss curve (``target_miss_curve``)


def entropy_bin_sums(frame: pd.DataFrame) -> pd.DataFrame:
    """Per log-spaced bin of the target entropy (``atrisk.log_bin``) of at-risk rows or cells: the trials ``n`` and
    the sums ``sum_h`` of n x H and ``sum_miss`` of n x log(1 - p1 + 1e-3)."""
    h = np.maximum(frame["target_entropy_nats"].to_numpy(dtype=float), 0.0)
    miss = np.log(np.clip(1.0 - frame["target_top1_prob"].to_numpy(dtype=float), 0.0, 1.0) + atrisk.EPS_PROB)
    n = frame["n"].to_numpy(dtype=float) if "n" in frame else np.ones(len(frame))
    bins = pd.DataFrame({"bin": atrisk.log_bin(h), "n": n, "sum_h": n * h, "sum_miss": n * miss})
    return bins.groupby("bin", sort=True).sum()


def target_miss_curve(sums: pd.DataFrame, n_bins: int = MISS_CURVE_BINS) -> tuple:
    """(centres, values) from ``entropy_bin_sums``: ``n_bins`` groups of bins with about equal trials, per group the
    mean log(H + eps) and mean log(1 - p1 + 1e-3), made nondecreasing in H (isotonic)."""
    sums = sums.loc[sums["n"] > 0].sort_index()
    if sums.empty:
        raise ValueError("no trials to build the target-miss curve from")
    n = sums["n"].to_numpy(dtype=float)
    x = np.log(sums["sum_h"].to_numpy(dtype=float) / n + atrisk.EPS_NATS)
    y = sums["sum_miss"].to_numpy(dtype=float) / n
    group = np.minimum((np.cumsum(n) / n.sum() * n_bins - 1e-12).astype(int), n_bins - 1)
    centres, values, weights = [], [], []
    for g in np.unique(group):
        m = group == g
        centres.append(float(np.average(x[m], weights=n[m])))
        values.append(float(np.average(y[m], weights=n[m])))
        weights.append(float(n[m].sum()))
    values = isotonic_regression(np.array(values), weights=np.array(weights), increasing=True).x
    return np.array(centres), np.asarray(values, dtype=float)


def _raw_means(family: LawFamily) -> list[str]:
    """The raw decode-time columns a family's predictions need (their logs are derived)."""
    derived = {"log_lag_entropy", "log_run_mean_entropy", "log_draft_entropy", "log_draft_miss", "log1p_copy",
               "copy_full"}
    raw = [c for c in family.means if c not in derived]
    return [{"log1p_position": "position", "log_target_miss": "target_top1_prob"}.get(c, c) for c in raw]


def _fit_profile_eps(counts: pd.DataFrame, family: LawFamily, depth_model: str, cov_type: str, start_params=None):
    """(GLM result, c): the fit of log(H + c) with the largest log-likelihood over ``EPS_GRID``."""
    h = np.maximum(counts["target_entropy_nats"].to_numpy(dtype=float), 0.0)
    first = _fit_glm(counts.assign(log_entropy=np.log(h + EPS_GRID[0])), family, depth_model, cov_type, start_params)
    swap = _swapped_design(first, counts, h, EPS_GRID[0], family, cov_type, start_params)
    fits = []
    for i, c in enumerate(EPS_GRID):
        if i == 0:
            result = first
        elif swap:
            result = swap(c)
        else:
            result = _fit_glm(counts.assign(log_entropy=np.log(h + c)), family, depth_model, cov_type, start_params)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # a runaway fit's llf: -inf / NaN
            llf = float(result.llf)
        fits.append((bool(result.converged) and np.isfinite(llf), llf if np.isfinite(llf) else -np.inf, result,
                     float(c)))
    # the most likely converged fit; none converged: the most likely of all (fit_law notes it)
    _, _, result, c = max(fits, key=lambda f: (f[0], f[1]))
    if result is not fits[0][2]:  # a search fit on the swapped design: the chosen c fitted from its formula
        result = _fit_glm(counts.assign(log_entropy=np.log(h + c)), family, depth_model, cov_type, start_params)
    return result, c


def _swapped_design(first, counts: pd.DataFrame, h: np.ndarray, c0: float, family: LawFamily, cov_type: str,
                    start_params=None):
    """c -> the GLM of ``first`` (fitted at offset ``c0``) with its log(H + c) column recomputed at c, fitted as
    ``_fit_glm`` fits it without rebuilding the formula's design; ``False`` where the column is not log(H + c0)
    itself (the search then fits every c from the formula)."""
    model = first.model
    names = list(model.exog_names)
    if names.count("log_entropy") != 1 or not counts.index.is_unique:
        return False
    column = names.index("log_entropy")
    rows = pd.Series(h, index=counts.index).reindex(model.data.row_labels).to_numpy()
    if rows.shape != model.exog.shape[:1] or not np.array_equal(model.exog[:, column], np.log(rows + c0)):
        return False

    def fit(c):
        exog = model.exog.copy()
        exog[:, column] = np.log(rows + c)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DomainWarning)
            glm = sm.GLM(model.data.endog, exog, family=model.family)
        return _fit_model(glm, names, family, cov_type, model.data.frame, start_params)
    return fit


def _fit_iso(counts: pd.DataFrame) -> dict:
    curves = {}
    if "log_entropy" not in counts:
        raise ValueError("law_iso needs target_entropy_nats in the at-risk table")
    binned = counts.assign(_x=counts["log_entropy"] * counts["n"])
    bin_col = "bin_target_entropy_nats" if "bin_target_entropy_nats" in counts else "log_entropy"
    cells = binned.groupby(["depth", bin_col])[["_x", "n_acc", "n"]].sum().reset_index()
    for d, group in cells.groupby("depth"):
        x = (group["_x"] / group["n"]).to_numpy()
        order = np.argsort(x, kind="stable")
        x, w = x[order], group["n"].to_numpy(dtype=float)[order]
        y = (group["n_acc"].to_numpy(dtype=float) / group["n"].to_numpy())[order]
        fitted = isotonic_regression(y, weights=w, increasing=False).x
        curves[int(d)] = (x, fitted)
    return curves


def fit_law(traces, family: str = "law_exp", by: str | None = None, *, depth: str = "factor",
            eps: float = atrisk.EPS_NATS, aggregate: bool = True, width_log10: float = 0.05, cov_type: str = "cluster",
            alpha: float = 0.05, min_requests_per_category: int = 5, drop_small_categories: bool = False,
            on_invalid: str = "raise", start_params=None):
    """Fit an acceptance law to traces (or to an at-risk table / aggregate of them). ``family``: one of ``FAMILIES``.
    ``by``: a column (``"drafter_id"``, ``"category"``, ...) to fit one law per value (a ``LawSet``). ``depth``:
    ``"factor"``, ``"linear"`` or ``"none"``. ``aggregate``: fit on log-spaced bins of ``width_log10``, else the rows.
    ``cov_type``: ``"cluster"`` (CR1 by request, t(G - 1)) or ``"nonrobust"``."""
    if isinstance(family, str) and family in ("glance", "glance_readme"):
        form = "readme" if family == "glance_readme" else "code"
        raise ValueError(f"GLANCE's round-level law is no law family of fit_law: call "
                         f"entropy_law.glance.fit_glance(traces, form={form!r}) instead of fit_law(family={family!r})")
    fam = get_family(family)
    if depth not in DEPTH_TERMS:
        raise ValueError(f"depth must be one of {list(DEPTH_TERMS)}")
    if cov_type not in ("cluster", "nonrobust"):
        raise ValueError("cov_type must be 'cluster' or 'nonrobust'")
    counts = prepare_counts(traces, fam, eps=eps, width_log10=width_log10, aggregate=aggregate, on_invalid=on_invalid)
    if counts.empty:
        raise ValueError("no at-risk draft in these traces: they hold no drafting round (AR runs only, or a drafter "
                         "that never drafted), so there is no acceptance to fit; pass the runs of a drafting arm")
    if by is not None:
        by = {"drafter": "drafter_id", "request": "request_id"}.get(by, by)
        if by not in counts:
            raise ValueError(f"by={by!r} is not a column of the at-risk table; try 'drafter_id' or 'category'")
        laws = {}
        for value, part in counts.groupby(by, sort=True):
            laws[value] = fit_law(part, fam, depth=depth, eps=eps, aggregate=aggregate, width_log10=width_log10,
                                  cov_type=cov_type, alpha=alpha, min_requests_per_category=min_requests_per_category,
                                  drop_small_categories=drop_small_categories)
        return LawSet(by=by, laws=laws)
    counts, notes = check_counts(counts, fam, min_requests_per_category=min_requests_per_category,
                                 drop_small_categories=drop_small_categories, cov_type=cov_type)
    if fam.means and fam.needs_drafted_depth and counts["drafted_depth"].nunique() < 2:  # log D is the intercept
        notes.append(f"every at-risk round drafted depth {int(counts['drafted_depth'].iloc[0])}: the log D term is "
                     "not identified and is left out")
        fam = without_drafted_depth(fam)
    category_means = {}
    if fam.name == "law_exp_mundlak":
        counts, category_means = _add_mundlak(counts)
    common = dict(family=fam, depths=tuple(int(d) for d in np.sort(counts["depth"].unique())),
                  categories=tuple(sorted(counts["category"].unique())),
                  drafters=tuple(sorted(counts["drafter_id"].unique())), n_rows=int(counts["n"].sum()),
                  n_requests=int(counts["request_id"].nunique()), eps=float(counts.attrs.get("eps", eps)),
                  alpha=alpha, depth_model=depth, notes=notes, category_means=category_means)
    if fam.link == "isotonic":
        return FittedLaw(result=None, iso_curves=_fit_iso(counts), **common)
    counts, result = _fit_glm_with_notes(counts, fam, depth, cov_type, start_params, common)
    law = FittedLaw(result=result, counts=counts, **common)
    _diagnostic_notes(notes, law, result)
    return law


def _fit_glm_with_notes(counts, fam, depth: str, cov_type: str, start_params, common: dict):
    """The GLM fit (with a profiled offset where the family asks) and its notes on few requests and convergence."""
    notes = common["notes"]
    if cov_type == "cluster":
        few = warn_if_few_requests(common["n_requests"], f"the cluster-robust intervals of {fam.name} (widened: "
                                   f"t with {common['n_requests'] - 1} df)")
        if few:
            notes.append(few)
    if fam.means:  # fit on the same function of the cells' covariate means that predictions use
        counts = atrisk.add_log_covariates(counts.copy())
    if fam.profile_eps:
        result, common["eps"] = _fit_profile_eps(counts, fam, depth, cov_type, start_params=start_params)
        notes.append(f"offset c of log(H + c) fitted over {EPS_GRID} by profile likelihood: c = {common['eps']:g} "
                     "(its uncertainty is not in the intervals)")
    else:
        result = _fit_glm(counts, fam, depth, cov_type, start_params=start_params)
    if not result.converged:
        notes.append("the GLM did not converge; treat the estimates with suspicion")
    if fam.needs_target_top1:
        common["miss_curve"] = target_miss_curve(entropy_bin_sums(counts))
    return counts, result


def _diagnostic_notes(notes: list, law: FittedLaw, result) -> None:
    """Notes on separation, perfect prediction and a rank-deficient design."""
    if law.separated:
        notes.append("perfect separation: a fitted probability is exactly 0 or 1, so some terms are not identified "
                     "(their estimates run off towards infinity, cluster-robust errors are NaN); record more "
                     "requests or fit a simpler family")
    elif getattr(result, "perfect_prediction", False):
        notes.append("statsmodels warned of perfect separation or prediction during the fit (PerfectSeparationWarning: "
                     "at some IRLS iteration the fitted acceptance matched every cell), as happens with few requests; "
                     "some terms may not be identified; record more requests or fit a simpler family")
    if getattr(result, "rank_deficient", False):
        notes.append("the design matrix is rank-deficient (statsmodels' SingularMatrixWarning): a term is constant or "
                     "collinear in these requests, so its estimate is not unique (predictions are); fit a family "
                     "without it or record requests where it varies")


@dataclass
class LawSet(Result):
    """One fitted law per value of ``by``; ``summary`` stacks theirs with a ``by`` column."""

    by: str
    laws: dict

    @property
    def title(self) -> str:
        first = next(iter(self.laws.values()))
        return f"{first.family.name} by {self.by}: {list(self.laws)}"

    @property
    def summary(self) -> pd.DataFrame:
        return pd.concat({k: v.summary for k, v in self.laws.items()}, names=[self.by, "parameter"])

    def __getitem__(self, key) -> FittedLaw:
        if key not in self.laws:
            raise KeyError(f"no law for {self.by}={key!r}; have {list(self.laws)}")
        return self.laws[key]

    def predict_acceptance(self, H, depth=1, category=None, *, drafter=None, **covariates):
        key = {"drafter_id": drafter, "category": category}.get(self.by)
        if key is None:
            raise ValueError(f"laws are split by {self.by}: pass the {self.by} value")
        return self[key].predict_acceptance(H, depth, category, drafter=drafter, **covariates)

    def plot(self, ax=None, **kwargs):
        for key, law in self.laws.items():
            ax = law.plot(ax=ax, **kwargs)
            ax.lines[-1].set_label(f"{self.by}={key}")
        ax.legend(frameon=False)
        return ax
LAW_FAMILIES = FAMILIES  # public alias
