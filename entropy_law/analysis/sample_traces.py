"""Where the figures, notebooks and reports find traces: the reference traces (``data/traces/`` or
``$ENTROPY_LAW_TRACES``), else traces simulated from a known law and written through ``TraceRecorder`` as a
decoder would, labelled ``model_id = "simulated"``. No torch.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

from entropy_law.analysis.simulate import TreeSpec, simulate_traces
from entropy_law.traces.recorder import TraceRecorder

TRACES_ENV = "ENTROPY_LAW_TRACES"


def reference_traces_dir() -> Path:
    """``$ENTROPY_LAW_TRACES`` if set, else ``data/traces/`` beside the package (may not exist)."""
    env = os.environ.get(TRACES_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "data" / "traces"


def has_runs(path: Path) -> bool:
    """True if ``path`` is a run directory or holds one below it (a ``run.json``)."""
    path = Path(path)
    return path.is_dir() and ((path / "run.json").is_file() or any(path.rglob("run.json")))


def write_simulated_traces(path, *, seed: int = 0, n_requests_per_category: int = 8,
                           tokens_per_request: tuple[int, int] = (60, 120), block_size: int = 8,
                           tree_depth: int = 5, tree_nodes: int = 16, categories=None) -> Path:
    """Write ``simulate_traces``' default law on its ``categories`` as runs ``sim-block``, ``sim-tree``, ``sim-ar``."""
    path = Path(path)
    sim = simulate_traces(seed=seed, n_requests_per_category=n_requests_per_category, categories=categories,
                          tokens_per_request=tokens_per_request, block_size=block_size, include_ar=True,
                          tree=TreeSpec(depth=tree_depth, nodes=tree_nodes))
    for run in sim.runs.itertuples():
        tree_budget = tree_nodes if run.tree_policy == "ddtree" else None
        with TraceRecorder(path / run.run_id, run_id=run.run_id, overwrite=True, model_id="simulated",
                           drafter_id=run.drafter_id, drafter_config={"block_size": int(run.block_size)},
                           tree_policy=run.tree_policy, tree_budget=tree_budget, dtype="float32", device="none",
                           seed=seed, simulated=True, replayed=False,
                           truth={"k": float(sim.truth["k"]), "lambda": 1.0}) as rec:
            rec.log_columns(**{name: _columns(getattr(sim, name), run.run_id)
                               for name in ("tokens", "rounds", "requests")})
    return path


def _columns(frame, run_id: str) -> dict:
    part = frame.loc[frame["run_id"] == run_id]
    return {col: part[col].to_numpy() for col in part.columns}


def resolve_traces(path=None, *, fallback_dir=None, seed: int = 0, quiet: bool = False) -> tuple[Path, bool]:
    """(trace path, simulated?): ``path`` if given (must exist), else the reference traces, else simulated
    traces written to ``fallback_dir`` (default: a folder in the system temp dir) with a clear message."""
    if path is not None:
        path = Path(path)
        if not has_runs(path):
            raise FileNotFoundError(f"no trace runs (run.json) under {path}; record some with `entropy-law record` "
                                    "or `entropy-law demo`, or omit the path to use the reference traces")
        return path, False
    ref = reference_traces_dir()
    if has_runs(ref):
        return ref, False
    target = Path(fallback_dir) if fallback_dir is not None else Path(tempfile.gettempdir()) / f"entropy-law-sim-{seed}"
    if not quiet:
        warnings.warn(f"no reference traces at {ref} (make them with scripts/make_reference_traces.py, or set "
                      f"{TRACES_ENV}); using SIMULATED traces (known law, seed {seed}) written to {target}",
                      stacklevel=2)
    if not has_runs(target):
        write_simulated_traces(target, seed=seed)
    return target, True
