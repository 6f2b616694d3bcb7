"""The plan of a recording job: what it decodes, with which arms, into which folders, within which limits.

Frozen plan objects, checked once when built: the command line builds the same objects from its options as a
Python caller does, so both meet one rule and one message naming the field and the option.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

if TYPE_CHECKING:  # the plan stays light: `entropy-law --help` imports it, torch loads only when a job runs
    from entropy_law.jobs.arms import ArmSpec

GATES = ("ratio", "cost")
DEFAULT_VERIFY_COST_RATIO = 2.0  # decoding.gate.DEFAULT_VERIFY_COST_RATIO (tests/test_plan.py checks they agree)


def check_int(value, *, name: str, option: str, minimum: int, why: str = "") -> int:
    """``value`` if it is an int >= ``minimum``, else a ValueError naming the field and its option."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} ({option}) must be an int >= {minimum}{f' ({why})' if why else ''}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Limits:
    """``max_new_tokens`` per prompt (at least ``min_new_tokens``), ``flush_every`` finished requests per shard,
    an unrecorded warm-up of ``warm_up_tokens`` per arm on the first prompt (0: none)."""

    max_new_tokens: int
    flush_every: int = 1
    warm_up_tokens: int = 0
    min_new_tokens: int = 1

    def __post_init__(self):
        why = "one token after the prefill" if self.min_new_tokens > 1 else ""
        check_int(self.max_new_tokens, name="max_new_tokens", option="--max-new-tokens",
                  minimum=self.min_new_tokens, why=why)
        check_int(self.flush_every, name="flush_every", option="--flush-every", minimum=1,
                  why="finished prompts per shard")
        check_int(self.warm_up_tokens, name="warm_up_tokens", option="no option", minimum=0)


@dataclass(frozen=True)
class Output:
    """Where the runs go: ``path`` (one run per arm, ``<path>/<arm name>``) or {arm name: run folder};
    ``resume`` / ``overwrite`` / ``break_lock`` as ``TraceRecorder`` takes them."""

    path: str | Path | Mapping[str, str | Path]
    resume: bool = False
    overwrite: bool = False
    break_lock: bool = False

    def __post_init__(self):
        if self.resume and self.overwrite:
            raise ValueError("resume (--resume) and overwrite (--overwrite) exclude each other: pick one")

    def run_dir(self, arm_name: str) -> Path:
        if isinstance(self.path, Mapping):
            return Path(self.path[arm_name])
        return Path(self.path) / arm_name


@dataclass(frozen=True)
class Drafting:
    """How the drafting arms are built (``jobs.arms.make_drafter``) and gated: ``gate`` ``"ratio"`` or ``"cost"``;
    ``policy``: law policy parameters in place of the gate, or a function of the arm giving them."""

    gate: str = "ratio"
    verify_cost_ratio: float = DEFAULT_VERIFY_COST_RATIO
    policy: dict | Callable | None = None
    ngram_options: dict | None = None
    checkpoint: str | Path | None = None
    drafter_dtype: str = "float32"
    hybrid_options: dict | None = None

    def __post_init__(self):
        if self.gate not in GATES:
            raise ValueError(f"gate (--gate) must be one of {GATES}, got {self.gate!r}")

    def policy_of(self, spec: ArmSpec) -> dict | None:
        """The policy parameters of one arm (None: its gate decides)."""
        return self.policy(spec) if callable(self.policy) else self.policy


@dataclass(frozen=True, eq=False)
class RecordPlan:
    """One recording job for ``jobs.record.record_arms``: decode ``tasks`` with every arm over ``target`` into
    ``output``. ``encode(task, decoder) -> (token ids, extra generate arguments)``: default the chat template;
    ``adapter``: one for every arm (a VLM's); ``run_metadata``: keys added to each run's (a mapping or a function
    of the arm); ``keep_going``: log a failing prompt and go on."""

    tasks: Sequence
    arms: Sequence[ArmSpec]
    target: object
    output: Output
    limits: Limits
    drafting: Drafting = field(default_factory=Drafting)
    encode: Callable | None = None
    adapter: object = None
    run_metadata: Mapping | Callable | None = None
    keep_going: bool = False

    def __post_init__(self):
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "arms", tuple(self.arms))
        if not self.arms:
            raise ValueError("no arms to record")
        names = [spec.name for spec in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must differ (one run folder each), got {names}")
