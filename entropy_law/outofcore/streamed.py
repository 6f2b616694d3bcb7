"""``fit_law_out_of_core``: a law family fitted without holding the cells in memory.

Each group's cells go to a temporary Parquet file; statsmodels' IRLS and CR1 sandwich run over them a batch at a time,
so memory grows with the number of requests, never with rows or cells. Families it cannot reproduce exactly raise
``OutOfCoreError``, saying what to use instead.
"""

from __future__ import annotations

import re
import tempfile
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import patsy
import statsmodels.api as sm
from patsy.categorical import C
from statsmodels.genmod.generalized_linear_model import GLMResults, GLMResultsWrapper
from statsmodels.tools.sm_exceptions import DomainWarning

from entropy_law.law import atrisk
from entropy_law.law import fit as fitmod
from entropy_law.law.fit import DEPTH_TERMS, LawSet, _family_obj, get_family
from entropy_law.law.stats import warn_if_few_requests
from entropy_law.outofcore.driver import DEFAULT_CHUNK_BYTES, _connect, _shards, _views_per_group
from entropy_law.outofcore.sql import (_KEYS, _MISS_BIN, _MISS_LOG, _MISS_RAW, _RAW_OF_LOG, _SEQUENCE_BINS,
                                       _SEQUENCE_MEANS, _literal, _means_for, _miss_sql, at_risk_sql)


STREAM_BATCH_CELLS = 1 << 18  # cells per batch of the streamed fit (memory: ~ batch x (K + 3) x 8 bytes, a few copies)


class OutOfCoreError(ValueError):
    """A family or option the streamed fit cannot do; the message says what to use instead."""


def _streamable(fam) -> None:
    """Refuse ``law_iso`` and families whose covariates the query does not compute."""
    if fam.link == "isotonic":
        raise OutOfCoreError("law_iso is not a GLM: fit it in memory on the cells, fit_law(aggregate_at_risk_sql(path, "
                             "'law_iso'), 'law_iso') (its cells number about half the token rows)")
    known = {*atrisk.COVARIATES, *atrisk.DERIVED, *_SEQUENCE_MEANS, _MISS_LOG}
    missing = [m for m in getattr(fam, "means", ()) if m not in known]
    bins = [b for b in fam.bin_columns if b not in {*atrisk.COVARIATES, "cum_entropy_nats", *_SEQUENCE_BINS,
                                                    _MISS_BIN}]
    if missing or bins:
        raise OutOfCoreError(f"{fam.name} uses covariates {sorted(set(missing + bins))} that the out-of-core query "
                             "does not compute (the drafter's own statistics at each depth, the context's "
                             f"copyability): fit it in memory, fit_law(load_traces(path), {fam.name!r}), or fit a "
                             "family on the target's entropy "
                             "sequence out of core, such as 'law_exp_obs_ceil' (the primary law) or 'law_exp_obs'")


def _sql_str(value) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _write_cells(con, traces, bins, keys, means, *, width_log10, eps, drafters, chunk_bytes, folder: Path,
                 by_arm: bool = False) -> list:
    """The query's cells of every group of shards written to ``folder`` (one Parquet file per group)."""
    sql = at_risk_sql(bin_columns=bins, width_log10=width_log10, eps=eps, means=means,
                      drafted_depth_key="drafted_depth" in keys)
    shards = _shards(traces, drafters, by_arm)
    if not shards.dirs:
        raise ValueError("no finished shards under the given path: nothing to fit")
    files = []
    for i in _views_per_group(con, shards, chunk_bytes):
        path = folder / f"cells-{i:05d}.parquet"
        con.execute(f"COPY ({sql}) TO {_sql_str(path)} (FORMAT PARQUET)")
        files.append(path)
    return files


def _cell_source(con, files, bins, keys, means, on_invalid) -> tuple[str, list]:
    """SQL selecting the valid cells of ``files`` (pooled where two groups hold one cell key), and notes."""
    listing = "[" + ", ".join(_sql_str(f) for f in files) + "]"
    con.execute(f"CREATE OR REPLACE VIEW cells_raw AS SELECT * FROM read_parquet({listing}, filename = true)")
    bin_names = [f"bin_{c}" for c in bins]
    notes = []
    if bin_names:
        null = " OR ".join(f"{b} IS NULL" for b in bin_names)
        bad_rows = con.sql(f"SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM cells_raw WHERE {null}").fetchall()[0][0]
        if bad_rows:
            if on_invalid == "raise":
                examples = [r[0] for r in con.sql(f"SELECT DISTINCT request_id FROM cells_raw WHERE {null} "
                                                   "ORDER BY 1 LIMIT 3").fetchall()]
                raise ValueError(f"invalid covariates at at-risk positions: {bad_rows} rows with NaN, infinite or "
                                 f"negative values (e.g. requests {examples}). Fix the traces, or pass "
                                 "on_invalid='drop' to drop those rows (their rounds stay in).")
            notes.append(f"dropped {bad_rows} at-risk rows with invalid covariates")
        where = "WHERE NOT (" + null + ") AND n > 0"
    else:
        where = "WHERE n > 0"
    cell = [*keys, *bin_names]
    cast = {"drafter_id": "VARCHAR", "category": "VARCHAR", "request_id": "VARCHAR"}
    cols = [f"CAST({c} AS {cast.get(c, 'BIGINT')}) AS {c}" for c in cell]
    # one drafter's runs reusing a request id in two groups: their cells are pooled, as in memory
    shared = con.sql("SELECT 1 FROM (SELECT drafter_id, request_id FROM cells_raw GROUP BY drafter_id, request_id "
                     "HAVING COUNT(DISTINCT filename) > 1) LIMIT 1").fetchall()
    if shared:
        cols += [f"CAST(SUM({c}) AS BIGINT) AS {c}" for c in ("n_acc", "n", "n_rej")]
        cols += [f"SUM({m} * n) / SUM(n) AS {m}" for m in means]
        return f"SELECT {', '.join(cols)} FROM cells_raw {where} GROUP BY {', '.join(cell)}", notes
    cols += [f"CAST({c} AS BIGINT) AS {c}" for c in ("n_acc", "n", "n_rej")]
    cols += [f"CAST({m} AS DOUBLE) AS {m}" for m in means]
    return f"SELECT {', '.join(cols)} FROM cells_raw {where}", notes


def _batches(con, sql: str, batch_cells: int):
    """The rows of ``sql`` as frames of at most ``batch_cells`` rows, on a cursor of their own."""
    cursor = con.cursor()
    try:
        for batch in cursor.sql(sql).to_arrow_reader(batch_cells):
            if batch.num_rows:
                yield batch.to_pandas()
    finally:
        cursor.close()


class _Cache:
    """Design, outcomes, trials, cluster codes (and with ``entropy`` H) of every cell in one file, read in batches."""

    def __init__(self, path: Path, k: int, *, entropy: bool = False):
        self.path, self.k, self.entropy, self.sizes = path, k, entropy, []
        self._file = open(path, "wb")

    def write(self, x: np.ndarray, y: np.ndarray, n: np.ndarray, g: np.ndarray, h: np.ndarray | None = None) -> None:
        self.sizes.append(len(y))
        arrays = [(x, np.float64), (y, np.float64), (n, np.float64), (g, np.int32)]
        for a, dtype in arrays + ([(h, np.float64)] if self.entropy else []):
            self._file.write(np.ascontiguousarray(a, dtype=dtype).tobytes())

    def close(self) -> None:
        self._file.close()

    def unlink(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def batches(self):
        """``(x, y, n, g, h)`` per batch (h None without ``entropy``)."""
        with open(self.path, "rb") as f:
            for size in self.sizes:
                x = np.fromfile(f, np.float64, size * self.k).reshape(size, self.k)
                y, n = np.fromfile(f, np.float64, size), np.fromfile(f, np.float64, size)
                g = np.fromfile(f, np.int32, size)
                yield x, y, n, g, (np.fromfile(f, np.float64, size) if self.entropy else None)

    def __iter__(self):
        for x, y, n, g, _ in self.batches():
            yield x, y, n, g


class _OffsetCache:
    """A ``_Cache`` with column ``j`` set to log(max(H, 0) + offset): one design for every offset."""

    def __init__(self, base: _Cache, j: int, offset: float):
        self.base, self.j, self.offset = base, j, float(offset)
        self.k, self.sizes = base.k, base.sizes

    def column(self, h: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(h, 0.0) + self.offset)  # as fit._fit_profile_eps

    def __iter__(self):
        for x, y, n, g, h in self.base.batches():
            x[:, self.j] = self.column(h)
            yield x, y, n, g

    def unlink(self) -> None:  # the base is removed by its owner
        pass


def _plain_column(names: Sequence[str], name: str) -> int | None:
    """The index of design column ``name`` where no other column reads it (a plain main effect), else None."""
    reading = [i for i, column in enumerate(names) if re.search(rf"\b{re.escape(name)}\b", column)]
    return reading[0] if len(reading) == 1 and names[reading[0]] == name else None


def _irls_pass(cache: _Cache, fam_obj, beta):
    """One IRLS pass: the binomial deviance at ``beta`` (None: the start) and X'WX, X'Wz."""
    k = cache.k
    tiny = np.finfo(float).eps
    xtwx, xtwz, dev = np.zeros((k, k)), np.zeros(k), 0.0
    for x, y, n, _ in cache:
        p = y / n
        if beta is None:
            mu = fam_obj.starting_mu(p)
            eta = fam_obj.predict(mu)
        else:
            eta = x @ beta
            mu = fam_obj.fitted(eta)
        ratio = np.clip(p / (mu + 1e-20), tiny, np.inf)
        ratio_rej = np.clip((1.0 - p) / (1.0 - mu + 1e-20), tiny, np.inf)
        dev += float(np.sum(2 * n * (p * np.log(ratio) + (1 - p) * np.log(ratio_rej))))
        deriv = fam_obj.link.deriv(mu)  # once: Family.weights is 1 / (g'(mu)^2 Var(mu)), the same numbers
        w = n * (1.0 / (deriv ** 2 * fam_obj.variance(mu)))
        z = eta + deriv * (p - mu)
        xw = x * w[:, None]
        xtwx += xw.T @ x
        xtwz += xw.T @ z
    return dev, xtwx, xtwz


def _sandwich_pass(cache: _Cache, link: str, beta, n_groups: int):
    """At the estimate, via statsmodels' GLM per batch: the observed Hessian, the scores summed per request, the
    expected information, llf and deviance."""
    k = cache.k
    hessian, information = np.zeros((k, k)), np.zeros((k, k))
    scores = np.zeros((n_groups, k))
    llf = deviance = 0.0
    finite = True
    for x, y, n, g in cache:
        family = _family_obj(link)  # statsmodels keeps the trials on the family instance
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DomainWarning)  # the log link, as in fit._fit_glm
            model = sm.GLM(np.column_stack([y, n - y]), x, family=family)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            score = model.score_obs(beta)
            h = model.hessian(beta, observed=True)
            information += model.hessian(beta, observed=False)
            mu = model.predict(beta)
            llf += float(model.loglike(beta))
            deviance += float(family.deviance(model.endog, mu, model.var_weights, model.freq_weights, 1.0))
        finite = finite and bool(np.all(np.isfinite(h)))
        hessian += h
        for j in range(k):
            scores[:, j] += np.bincount(g, weights=score[:, j], minlength=n_groups)
    return dict(hessian=hessian, information=-information, scores=scores, llf=llf, deviance=deviance, finite=finite)


def _C(data, contrast=None, levels=None):
    """patsy's ``C``, passing a pandas Categorical on as it is (patsy then takes its codes at once)."""
    if contrast is None and levels is None and isinstance(getattr(data, "dtype", None), pd.CategoricalDtype):
        return data
    return C(data, contrast, levels)


def _llf_pass(cache: _Cache, link: str, beta) -> float:
    """The log-likelihood at ``beta`` as ``GLM.loglike`` computes it, without building a GLM per batch."""
    llf = 0.0
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for x, y, n, _ in cache:
            family = _family_obj(link)
            family.n = n
            llf += float(family.loglike(y / n, family.link.inverse(x @ beta)))
    return llf


def _needed_columns(rhs: str, fam, available) -> list:
    """The cell columns the design of ``rhs`` reads (raw means for logs; H for a profiled offset)."""
    used = [c for c in available if re.search(rf"\b{re.escape(c)}\b", rhs)]
    if fam.name == "law_exp_mundlak":
        used += [c for c in ("log_entropy", "category") if c not in used]
    if fam.means:
        raw_of = {**_RAW_OF_LOG, _MISS_LOG: _MISS_RAW}
        used += [raw for log, raw in raw_of.items() if re.search(rf"\b{log}\b", rhs) and raw not in used]
    if fam.profile_eps:
        used = [c for c in used if c != "log_entropy"] + ["target_entropy_nats"]
    missing = [c for c in used if c not in available]
    if missing:
        raise RuntimeError(f"the cells lack {missing} for {fam.name}: report this as a bug")
    return list(dict.fromkeys(used))


# the log covariates whose count-weighted means over the fitted cells ``FittedLaw.steady_state`` reads
_STEADY_STATE = ("log_run_mean_entropy", "log1p_position", "log_drafted_depth")


def _fit_streamed(con, source: str, fam, *, depth: str, cov_type: str, alpha: float, eps: float,
                  min_requests_per_category: int, drop_small_categories: bool, batch_cells: int, tol: float,
                  max_iter: int, folder: Path, notes: list, start_params=None):
    """``fit_law`` on the cells of ``source``, in passes over them."""
    cells = _checked_cells(con, source, fam, depth=depth, cov_type=cov_type, alpha=alpha, eps=eps,
                           min_requests_per_category=min_requests_per_category,
                           drop_small_categories=drop_small_categories, notes=notes, batch_cells=batch_cells,
                           folder=folder)
    fam, source, common, notes = cells.fam, cells.source, cells.common, cells.common["notes"]
    offsets = fitmod.EPS_GRID if fam.profile_eps else (None,)
    best = _best_offset_fit(cells, offsets, fam, start_params=start_params, max_iter=max_iter, tol=tol,
                            n_requests=cells.n_requests, common=common)
    sums = best["sums"]
    covariate_means = {c: sums[c] / sums["n"] for c in _STEADY_STATE if c in sums} if fam.means else {}
    if fam.needs_target_top1:  # the steady state's target-miss curve
        bin_sums = con.sql(
            f"SELECT bin_target_entropy_nats AS bin, SUM(n) AS n, SUM(n * GREATEST(target_entropy_nats, 0.0E0)) AS "
            f"sum_h, SUM(n * LN({_miss_sql(_MISS_RAW)} + {_literal(atrisk.EPS_PROB)})) AS sum_miss "
            f"FROM ({source}) GROUP BY 1").df().set_index("bin")
        common["miss_curve"] = fitmod.target_miss_curve(bin_sums)
    result = _streamed_result(best, fam, cells, cov_type=cov_type, n_requests=cells.n_requests)
    n_cells = int(result.nobs)
    fits = f"{len(offsets)} fits (one per offset c), " if fam.profile_eps else ""
    notes.append(f"fitted out of core: {n_cells:,} cells streamed, {fits}{best['iteration']} IRLS passes "
                 "(statsmodels' IRLS and CR1 sandwich on the same cells; the cells themselves are not kept)")
    if not best["parts"]["finite"]:
        notes.append("perfect separation: a fitted probability is exactly 0 or 1, so some terms are not identified "
                     "(their estimates run off towards infinity, cluster-robust errors are NaN); record more "
                     "requests or fit a simpler family")
    return fitmod.FittedLaw(result=result, counts=None, covariate_means=covariate_means, **common)


def _checked_cells(con, source: str, fam, *, depth: str, cov_type: str, alpha: float, eps: float,
                   min_requests_per_category: int, drop_small_categories: bool, notes: list, batch_cells: int,
                   folder: Path) -> _CellDesign:
    """The cells as ``fit_law``'s checks leave them: ``fit.check_counts`` on one row per request (and drafted
    depth), the few-requests warning and ``law_exp_mundlak``'s category means."""
    extra = [c for c in ("drafted_depth",) if c in con.sql(f"SELECT * FROM ({source}) LIMIT 0").columns]
    keys = ["drafter_id", "category", "request_id", *extra]
    summary = con.sql(f"SELECT {', '.join(keys)}, CAST(SUM(n_acc) AS BIGINT) AS n_acc, CAST(SUM(n_rej) AS BIGINT) "
                      f"AS n_rej, CAST(SUM(n) AS BIGINT) AS n FROM ({source}) GROUP BY {', '.join(keys)}").df()
    summary, check_notes = fitmod.check_counts(summary, fam, min_requests_per_category=min_requests_per_category,
                                              drop_small_categories=drop_small_categories, cov_type=cov_type)
    notes = [*notes, *check_notes]
    if fam.means and fam.needs_drafted_depth and summary["drafted_depth"].nunique() < 2:
        notes.append(f"every at-risk round drafted depth {int(summary['drafted_depth'].iloc[0])}: the log D term is "
                     "not identified and is left out")
        fam = fitmod.without_drafted_depth(fam)
    categories = sorted(summary["category"].unique())
    if check_notes and fam.needs_categories:
        source = f"SELECT * FROM ({source}) WHERE category IN ({', '.join(_sql_str(c) for c in categories)})"
    request_ids = np.sort(summary["request_id"].unique().astype(str))
    depths = [int(r[0]) for r in con.sql(f"SELECT DISTINCT depth FROM ({source}) ORDER BY 1").fetchall()]
    n_requests = len(request_ids)
    common = dict(family=fam, depths=tuple(depths), categories=tuple(categories),
                  drafters=tuple(sorted(summary["drafter_id"].unique())), n_rows=int(summary["n"].sum()),
                  n_requests=n_requests, eps=float(eps), alpha=alpha, depth_model=depth, notes=notes)
    if cov_type == "cluster":
        few = warn_if_few_requests(n_requests, f"the cluster-robust intervals of {fam.name} (widened: t with "
                                   f"{n_requests - 1} df)")
        if few:
            notes.append(few)
    category_means = {}
    if fam.name == "law_exp_mundlak":
        rows = con.sql(f"SELECT category, SUM(log_entropy * n) / SUM(n) FROM ({source}) GROUP BY category").fetchall()
        category_means = {c: float(m) for c, m in sorted(rows)}
    common["category_means"] = category_means
    levels = {"depth": depths, "category": categories, "drafter_id": list(common["drafters"])}
    return _CellDesign(con, source, fam, depth=depth, levels=levels, request_ids=request_ids, common=common,
                       batch_cells=batch_cells, folder=folder)


class _CellDesign:
    """The cells of ``source`` as ``fit_law``'s design sees them, in batches, and their design on disk;
    ``common``: ``FittedLaw``'s fields."""

    def __init__(self, con, source: str, fam, *, depth: str, levels: dict, request_ids, common: dict,
                 batch_cells: int, folder: Path):
        self.con, self.source, self.fam, self.levels, self.common = con, source, fam, levels, common
        self.request_ids, self.category_means = request_ids, common["category_means"]
        self.n_requests = len(request_ids)
        self.batch_cells, self.folder = batch_cells, folder
        depth_term = fitmod.DEPTH_TERMS[depth]
        self.rhs = " + ".join(t for t in (depth_term, fam.terms) if t) or "1"
        self.lhs = "n_rej + n_acc" if fam.outcome == "rejection" else "n_acc + n_rej"
        available = con.sql(f"SELECT * FROM ({source}) LIMIT 0").columns
        self.columns = _needed_columns(self.rhs, fam, available)
        self.factors = set(re.findall(r"C\((\w+)\)", self.rhs))

    def frames(self, with_counts: bool, offset):
        cols = [*self.columns, *(["n_acc", "n_rej", "n", "request_id"] if with_counts else [])]
        for frame in _batches(self.con, f"SELECT {', '.join(dict.fromkeys(cols))} FROM ({self.source})",
                              self.batch_cells):
            for name in self.factors & set(frame.columns):  # every level known up front: patsy needs no pass
                frame[name] = pd.Categorical(frame[name], categories=self.levels[name])
            if self.fam.means:
                atrisk.add_log_covariates(frame)
            if offset is not None:
                frame["log_entropy"] = np.log(np.maximum(frame["target_entropy_nats"].to_numpy(dtype=float), 0.0)
                                              + offset)
            if self.category_means:
                frame, _ = fitmod._add_mundlak(frame, self.category_means)
            yield frame

    def build(self, offset, index: int):
        """The design info, its matrix on disk, the first cells and the steady-state covariates' sums."""
        fam = self.fam
        design = patsy.incr_dbuilder(self.rhs, lambda: self.frames(False, offset),
                                     eval_env=patsy.EvalEnvironment([{"C": _C}, vars(fitmod)]), NA_action="raise")
        cache = _Cache(self.folder / f"design-{id(design)}-{index}.bin", len(design.column_names),
                       entropy=offset is not None)
        skeleton, sums = None, {}
        try:
            for frame in self.frames(True, offset):
                x = np.asarray(patsy.build_design_matrices([design], frame, NA_action="raise")[0], dtype=np.float64)
                if not np.all(np.isfinite(x)):
                    raise ValueError("a cell's covariates are not finite: check the traces (validate_traces)")
                outcome = frame["n_rej" if fam.outcome == "rejection" else "n_acc"].to_numpy(np.float64)
                codes = pd.Categorical(frame["request_id"].astype(str), categories=self.request_ids).codes
                if (codes < 0).any():
                    raise RuntimeError("a cell's request is not among the requests counted: report this as a bug")
                trials = frame["n"].to_numpy(np.float64)
                cache.write(x, outcome, trials, codes,
                            None if offset is None else frame["target_entropy_nats"].to_numpy(np.float64))
                sums["n"] = sums.get("n", 0.0) + float(np.sum(trials))
                for name in [c for c in _STEADY_STATE if c in frame.columns]:
                    sums[name] = sums.get(name, 0.0) + float(np.sum(frame[name].to_numpy(np.float64) * trials))
                if skeleton is None:
                    h = None if offset is None else frame["target_entropy_nats"].to_numpy(np.float64)[:200]
                    skeleton = (x[:200], outcome[:200], trials[:200], h)
        except BaseException:
            cache.unlink()
            raise
        cache.close()
        return design, cache, skeleton, sums


def _irls(cache: _Cache, names: list, fam, *, start_params, max_iter: int, tol: float):
    """statsmodels' IRLS in passes over the cells on disk: ``(beta, converged, iterations, deviance history)``."""
    fam_obj = fitmod._family_obj(fam.link)
    beta = None
    if start_params is not None:
        beta = np.asarray(start_params, dtype=float)
    elif fam.link == "log":  # as _fit_glm: log-binomial starts with mu < 1 (a0 = 0.9, slope -0.5 per nat)
        beta = np.zeros(len(names))
        beta[names.index("Intercept")] = np.log(0.9)
        beta[names.index(fam.slope)] = -0.5
    # statsmodels' rule (deviance change 1e-8), or a relative step below ``tol`` (the deviance's round-off)
    history, converged, iteration, step = [], False, 0, np.inf
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for iteration in range(max_iter + 1):
            dev, xtwx, xtwz = _irls_pass(cache, fam_obj, beta)
            history.append(dev)
            if iteration and (abs(history[-1] - history[-2]) <= 1e-8 or step <= tol):
                converged = True
                break
            if iteration == max_iter:
                break
            try:
                new = np.linalg.solve(xtwx, xtwz)
            except np.linalg.LinAlgError:
                raise ValueError(f"{fam.name}: the design is singular on these cells (a term without variation, "
                                 "e.g. one drafted depth or one category); fit a simpler family") from None
            step = np.inf if beta is None else float(np.max(np.abs(new - beta) / (1.0 + np.abs(beta))))
            beta = new
    return beta, converged, iteration, history


def _best_offset_fit(cells: _CellDesign, offsets, fam, *, start_params, max_iter: int, tol: float,
                     n_requests: int, common: dict) -> dict:
    """One fit, or one per offset c of a profiled log(H + c) keeping the most likely converged one, with its sandwich
    sums (``parts``); every design file is removed."""
    best, base, made = None, None, []
    notes = common["notes"]

    def drop(cache) -> None:  # a design no longer needed (the base design stays until the end)
        if base is None or cache is not base[1]:
            cache.unlink()

    try:
        for index, offset in enumerate(offsets):
            if base is None:
                design, cache, skeleton, sums = cells.build(offset, index)
                j = _plain_column(design.column_names, "log_entropy") if fam.profile_eps else None
                if j is not None:
                    base = (design, cache, skeleton, sums, j)
            else:
                design, root, (x0, y0, n0, h0), sums, j = base
                cache = _OffsetCache(root, j, offset)
                x0 = x0.copy()
                x0[:, j] = cache.column(h0)
                skeleton = (x0, y0, n0, h0)
            made.append(cache)
            beta, converged, iteration, history = _irls(cache, design.column_names, fam, start_params=start_params,
                                                        max_iter=max_iter, tol=tol)
            rank = None
            if fam.profile_eps:
                llf = _llf_pass(cache, fam.link, beta)
                rank = (converged and bool(np.isfinite(llf)), llf if np.isfinite(llf) else -np.inf)
            if best is None or rank > best["rank"]:
                if best is not None:
                    drop(best["cache"])
                best = dict(rank=rank, offset=offset, design=design, cache=cache, skeleton=skeleton, sums=sums,
                            beta=beta, converged=converged, iteration=iteration, history=history)
            else:
                drop(cache)
        best["n_cells"] = int(sum(best["cache"].sizes))
        if fam.profile_eps:
            common["eps"] = float(best["offset"])
            notes.append(f"offset c of log(H + c) fitted over {fitmod.EPS_GRID} by profile likelihood: "
                         f"c = {common['eps']:g} (its uncertainty is not in the intervals)")
        if not best["converged"]:
            notes.append("the GLM did not converge; treat the estimates with suspicion")
        best["parts"] = _sandwich_pass(best["cache"], fam.link, best["beta"], n_requests)
    finally:
        for cache in made:
            cache.unlink()
    return best


def _streamed_result(best: dict, fam, cells: _CellDesign, *, cov_type: str, n_requests: int):
    """The statsmodels result of the best fit: its estimate, the CR1 sandwich and a model over the first cells whose
    design info lets ``predict(frame)`` build any frame's design."""
    design, parts, beta = best["design"], best["parts"], best["beta"]
    names, k, n_cells = design.column_names, len(design.column_names), best["n_cells"]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        try:
            bread = np.linalg.inv(parts["hessian"])
            normalized = np.linalg.inv(parts["information"])
        except np.linalg.LinAlgError:
            bread = normalized = np.full((k, k), np.nan)
        meat = parts["scores"].T @ parts["scores"]
        cluster = bread @ meat @ bread * (n_requests / (n_requests - 1.0)) * ((n_cells - 1.0) / (n_cells - k))
    x0, y0, n0, _ = best["skeleton"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DomainWarning)
        model = sm.GLM(np.column_stack([y0, n0 - y0]), pd.DataFrame(x0, columns=names),
                       family=fitmod._family_obj(fam.link))
    model.formula = f"{cells.lhs} ~ {cells.rhs}"  # predict(frame) builds the design from the full data's design info
    model.data.model_spec = design
    result = GLMResults(model, beta, normalized_cov_params=normalized, scale=1.0)
    result.nobs, result.df_model, result.df_resid = n_cells, k - 1, n_cells - k
    result.converged, result.fit_history = best["converged"], {"iteration": best["iteration"],
                                                               "deviance": best["history"]}
    result._cache.update(llf=parts["llf"], deviance=parts["deviance"])
    if cov_type == "cluster":
        result.cov_type = "cluster"
        result.cov_kwds = {"groups": "request_id", "use_correction": True, "df_correction": True,
                           "description": "CR1 by request, streamed out of core"}
        result.cov_params_default = cluster
        result.use_t = True
        result.df_resid_inference = n_requests - 1
    return GLMResultsWrapper(result)


def fit_law_out_of_core(traces, family: str = "law_exp", by: str | None = None, *, depth: str = "factor",
                        width_log10: float = 0.05, eps: float = atrisk.EPS_NATS, cov_type: str = "cluster",
                        alpha: float = 0.05, min_requests_per_category: int = 5, drop_small_categories: bool = False,
                        drafters: Sequence[str] | None = None, by_arm: bool = False, on_invalid: str = "raise",
                        chunk_bytes: int = DEFAULT_CHUNK_BYTES, threads: int | None = None,
                        memory_limit: str | None = None, temp_directory: str | None = None,
                        batch_cells: int = STREAM_BATCH_CELLS, tol: float = 1e-10, max_iter: int = 100,
                        start_params=None):
    """``fit_law(load_traces(traces), family, by)`` for runs larger than memory: memory is bounded by a batch of cells
    and the number of requests.

    Estimates and standard errors equal ``fit_law``'s within 1e-6; ``model`` holds the first cells only and ``counts``
    is None. ``batch_cells``: cells per batch; ``chunk_bytes``, ``threads``, ``memory_limit``, ``temp_directory``:
    DuckDB. ``by_arm``: ``drafter_id`` is the run's arm label.
    """
    fam, by = _checked_options(family, by, depth=depth, cov_type=cov_type, on_invalid=on_invalid)
    bins = tuple(fam.bin_columns)
    keys = (*_KEYS, *fam.extra_keys)
    means = _means_for(fam, "family", with_rounds=True)  # law_exp_mundlak's log_entropy included
    options = dict(depth=depth, cov_type=cov_type, alpha=alpha, eps=eps,
                   min_requests_per_category=min_requests_per_category, drop_small_categories=drop_small_categories,
                   batch_cells=batch_cells, tol=tol, max_iter=max_iter, start_params=start_params)
    with tempfile.TemporaryDirectory(prefix="entropy-law-cells-", dir=temp_directory) as tmp:
        folder = Path(tmp)
        con = _connect(threads, memory_limit, temp_directory)
        try:
            files = _write_cells(con, traces, bins, keys, means, width_log10=width_log10, eps=eps, drafters=drafters,
                                 chunk_bytes=chunk_bytes, folder=folder, by_arm=by_arm)
            source, notes = _cell_source(con, files, bins, keys, means, on_invalid)
            if by is None:
                return _fit_streamed(con, source, fam, folder=folder, notes=notes, **options)
            values = [r[0] for r in con.sql(f"SELECT DISTINCT {by} FROM ({source}) ORDER BY 1").fetchall()]
            laws = {v: _fit_streamed(con, f"SELECT * FROM ({source}) WHERE {by} = {_sql_str(v)}", fam, folder=folder,
                                     notes=list(notes), **options) for v in values}
            return LawSet(by=by, laws=laws)
        finally:
            con.close()


def _checked_options(family: str, by: str | None, *, depth: str, cov_type: str, on_invalid: str):
    """``(family, by)`` of ``fit_law_out_of_core``, its options checked."""
    fam = get_family(family)
    _streamable(fam)
    if on_invalid not in ("raise", "drop"):
        raise ValueError("on_invalid must be 'raise' or 'drop'")
    if depth not in DEPTH_TERMS:
        raise ValueError(f"depth must be one of {list(DEPTH_TERMS)}")
    if cov_type not in ("cluster", "nonrobust"):
        raise ValueError("cov_type must be 'cluster' or 'nonrobust'")
    if by is not None:
        by = {"drafter": "drafter_id"}.get(by, by)
        if by not in ("drafter_id", "category"):
            raise ValueError(f"by={by!r}: out of core a law is fitted per 'drafter_id' or per 'category'")
    return fam, by
