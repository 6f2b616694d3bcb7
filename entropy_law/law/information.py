"""What a predictor may read: the four information sets, and the inputs each law reads.

A comparison gives both sides the same set. The sets are not nested:

- ``workload``: what an AR run of the prompts gives before any drafting (greedy output does not depend on the
  drafter): the target's entropy at every output position, the context's copyability, a drafted-depth model fitted
  on other categories' rounds, the drafter replayed over the greedy output; no drafter outcome. ``predict`` reads
  this set.
- ``before_drafting`` (a per-round decision): what is committed so far (the root's entropy, the copyability), the
  request's own earlier rounds and their outcomes; not the positions ahead.
- ``before_verifying``: the above plus this round's proposal, its confidences and the drafted depth or tree.
- ``after_verifying``: everything, the target's entropies along the drafted path and the outcome included; for
  analysis, never for a decision or a prediction.
"""

from __future__ import annotations

from enum import Enum


class InfoSet(str, Enum):
    WORKLOAD = "workload"
    BEFORE_DRAFTING = "before_drafting"
    BEFORE_VERIFYING = "before_verifying"
    AFTER_VERIFYING = "after_verifying"

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")


INPUTS = {
    "entropy_root": "the target's entropy (top-1 probability, ...) at the round's first position",
    "entropy_ahead": "the target's entropy at output positions past the round's first",
    "copyability": "the context's copyability before the round's first position",
    "copyability_ahead": "the context's copyability at output positions past the round's first",
    "position": "the output position and the depth within the round",
    "category": "the request's category label",
    "drafter_id": "which drafter drafts",
    "depth_model": "a drafted-depth model fitted on other categories' rounds",
    "replayed_proposals": "the drafter replayed over the greedy output (its depth and confidence at every position)",
    "request_history": "the request's own earlier rounds and their outcomes",
    "drafted_depth": "this round's drafted depth or tree",
    "drafter_confidence": "the drafter's confidences in this round's proposal",
    "outcome": "this round's accepted length",
}

_COMMON = frozenset({"entropy_root", "copyability", "position", "category", "drafter_id", "depth_model"})
ALLOWS = {
    InfoSet.WORKLOAD: _COMMON | {"entropy_ahead", "copyability_ahead", "replayed_proposals"},
    InfoSet.BEFORE_DRAFTING: _COMMON | {"request_history"},
    InfoSet.BEFORE_VERIFYING: _COMMON | {"request_history", "drafted_depth", "drafter_confidence"},
    InfoSet.AFTER_VERIFYING: frozenset(INPUTS),
}

# how a prediction caps a round's drafted depth (``law.transfer`` depth models) -> what that reads
DEPTH_INPUTS = {
    "full": frozenset(),
    "training": frozenset({"depth_model"}),
    "replayed": frozenset({"replayed_proposals"}),
    "observed": frozenset({"drafted_depth"}),
    "oracle": frozenset({"drafted_depth"}),
    "category": frozenset({"drafted_depth"}),
}


def info_set(value) -> InfoSet:
    """``value`` (an ``InfoSet`` or its name, spaces or underscores) as an ``InfoSet``; a clear error otherwise."""
    if isinstance(value, InfoSet):
        return value
    name = str(value).strip().lower().replace(" ", "_").replace("-", "_")
    try:
        return InfoSet(name)
    except ValueError:
        raise ValueError(f"unknown information set {value!r}; use one of "
                         f"{[s.value for s in InfoSet]}") from None


def family_inputs(family, *, root_only: bool = False) -> frozenset:
    """The inputs a law family (``law.fit.LawFamily``) reads when it predicts a round. ``root_only``: evaluated
    with the root's entropy and copyability at every depth (``glance.law_round_expectations(root_only=True)``)."""
    inputs = {"position"}
    if family.terms or family.link == "isotonic":
        inputs |= {"entropy_root"} if root_only else {"entropy_root", "entropy_ahead"}
    if family.terms.strip() == "C(category)":  # no entropy at all: category and depth only
        inputs -= {"entropy_root", "entropy_ahead"}
    if family.needs_context_match:
        inputs |= {"copyability"} if root_only else {"copyability", "copyability_ahead"}
    if family.uses_category:
        inputs.add("category")
    if family.needs_drafters:
        inputs.add("drafter_id")
    if family.needs_drafted_depth:
        inputs.add("drafted_depth")
    if family.needs_draft_stats:
        inputs.add("drafter_confidence")
    return frozenset(inputs)


def predictor_inputs(family, depths: str = "full", *, root_only: bool = False) -> frozenset:
    """What a prediction with ``family`` reads when a round's drafted depth (the cap of its sum, and the covariate
    of a family in D) comes from ``depths`` (``DEPTH_INPUTS``: ``"training"`` a depth model of other categories,
    ``"replayed"`` the drafter replayed over the greedy output, which then also gives a law in the drafter's
    confidence its input; ``"observed"`` the round's own depth)."""
    if depths not in DEPTH_INPUTS:
        raise ValueError(f"depths must be one of {sorted(DEPTH_INPUTS)}, got {depths!r}")
    inputs = family_inputs(family, root_only=root_only) - {"drafted_depth"}  # "full": every round drafts all
    if depths == "replayed":  # the confidence then comes from the same replay
        inputs -= {"drafter_confidence"}
    return frozenset(inputs | DEPTH_INPUTS[depths])


def sets_label(sets) -> str:
    """``"information: workload / after verifying"``: ``sets`` (``sets_allowing``'s answer) for a printed result."""
    return "information: " + " / ".join(info_set(s).label for s in sets)


def sets_allowing(inputs) -> list[InfoSet]:
    """The information sets that hold every one of ``inputs``."""
    return [s for s in InfoSet if set(inputs) <= ALLOWS[s]]


def check_information(info, inputs, *, what: str) -> InfoSet:
    """Refuse ``what`` (a family's or a predictor's name) if it reads an input the set ``info`` does not hold;
    return the set. The error names the inputs and the sets that would allow them."""
    info = info_set(info)
    unknown = set(inputs) - set(INPUTS)
    if unknown:
        raise ValueError(f"{what}: unknown inputs {sorted(unknown)}; known: {sorted(INPUTS)}")
    extra = sorted(set(inputs) - ALLOWS[info])
    if extra:
        allowed = [s.value for s in sets_allowing(inputs)]
        raise ValueError(f"{what} reads {', '.join(INPUTS[i] + f' ({i})' for i in extra)}, which the "
                         f"{info.label} set does not hold; use a law that reads less, or a set that holds it: "
                         f"{allowed}")
    return info
