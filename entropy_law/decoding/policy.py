"""The per-round drafting policy: whether to draft, and how many nodes to verify, from the entropy law.

``LawPolicy`` is consulted twice a round (``round.play_round``; docs/architecture.md):

1. ``before_draft``: from the mean target entropy ``H_w`` over a short window, the best rate of any chain of depth
   D, ``(1 + sum_{k<=D} prod_{d<=k} a(H_w, d)) / (c(D + 1) + c_draft)``; none beats a plain step (1): no draft.
2. ``plan``: the children of a node share ``b = a(H_w, d)^(1 - w) Q^w`` (Q the sum of the drafter's
   probabilities ``q`` of those children, ``w`` = ``confidence_weight``) in proportion to ``q``; the prefix of
   nodes by path probability with the most ``(1 + sum_{i<=k} P_i) / c(k + 1)`` is verified, if it beats 1.
3. calibration (``calibration_prior`` m): ``s = (A + m) / (E + m)`` over this request's earlier verified rounds
   (A accepted drafts, E their expectation) scales each path probability; ``calibration_half_life`` fades it.
4. the context's copyability (optional ``context_match``): the law of the level of ``context_match_length``.

The law arrives as JSON-able parameters (``payoff.policy``); this module never imports the law layer.
"""

from __future__ import annotations

import bisect
import math
import numbers
from typing import Sequence

import torch

from entropy_law.decoding.gate import VerifyCost
from entropy_law.decoding.interface import DraftProposal, drafter_run_config
from entropy_law.decoding.observers import row_entropies
from entropy_law.traces.stats import context_match_length
from entropy_law.decoding.tree import Tree

POLICY_KIND = "entropy_law_policy"
POLICY_VERSION = 1
HYBRID_POLICY_KIND = "entropy_law_hybrid_policy"  # two laws, one per drafter of a HybridDrafter (HybridLawPolicy)
HYBRID_ROUTES = ("ngram", "block")
REQUIRED_KEYS = ("kind", "version", "window", "entropy_grid", "depths", "acceptance", "confidence_weight",
                 "draft_cost", "default_entropy")


def _number(params: dict, key: str, *, low: float = -math.inf) -> float:
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < low:
        raise ValueError(f"policy parameter {key!r} must be a finite number >= {low}, got {value!r}")
    return float(value)


def check_policy_drafter(params: dict, drafter) -> None:
    """Raise ``ValueError`` when policy parameters were fitted for another drafter (``drafter_id``) or checkpoint
    (``checkpoint_sha256``), where both sides name one (``payoff.policy.borrow_policy`` relabels them)."""
    fitted_id, fitted_sha = params.get("drafter_id"), params.get("checkpoint_sha256")
    drafter_id = getattr(drafter, "drafter_id", None)
    sha = drafter_run_config(drafter).get("checkpoint_sha256")
    if fitted_id is not None and drafter_id is not None and fitted_id != drafter_id:
        problem = f"fitted for drafter {fitted_id!r}, the decoder's drafter is {drafter_id!r}"
    elif fitted_sha and sha and fitted_sha != sha:
        problem = (f"fitted for drafter {fitted_id!r} loaded from checkpoint sha256:{fitted_sha[:12]}, this one is "
                   f"sha256:{sha[:12]}")
    else:
        return
    raise ValueError(f"the policy was {problem}: fit one on this drafter's runs (entropy-law policy TRACES --drafter "
                     "ARM), or apply it knowingly with entropy_law.payoff.policy.borrow_policy (entropy-law record "
                     "--policy-borrow)")


def check_policy_target(params: dict, model_id: str | None) -> None:
    """Raise ``ValueError`` when policy parameters were fitted on traces of another target model (their
    ``model_id`` list) than ``model_id``; not checked where either side names none."""
    fitted = params.get("model_id")
    if model_id is None or not isinstance(fitted, list) or not fitted or str(model_id) in fitted:
        return
    raise ValueError(f"the policy was fitted on traces of target {', '.join(fitted)}, this decoder's target is "
                     f"{model_id!r}: fit one on this target's runs (entropy-law policy TRACES --drafter ARM), or apply "
                     "it knowingly with entropy_law.payoff.policy.borrow_policy(params, ..., model_id=None) (entropy-law "
                     "record --policy-borrow)")


class LawPolicy:
    """A per-round policy from ``payoff.policy.fit_policy``'s parameters (keys ``REQUIRED_KEYS``); ``verify_cost``:
    this machine's curve (default: the one stored in ``params``)."""

    def __init__(self, params: dict, verify_cost: VerifyCost | None = None):
        if not isinstance(params, dict):
            raise TypeError(f"policy parameters must be a dict (fit_policy's output), got {type(params).__name__}")
        if params.get("kind") == HYBRID_POLICY_KIND:
            raise ValueError("these are a hybrid drafter's policy parameters (two laws): they drive a HybridDrafter "
                             "online (SpeculativeDecoder(target, HybridDrafter(...), policy=params)); a single "
                             "drafter, or a replay, takes one drafter's law (params['ngram'] or params['block'])")
        missing = [key for key in REQUIRED_KEYS if key not in params]
        if missing:
            raise ValueError(f"policy parameters lack {missing}; make them with entropy_law.payoff.policy.fit_policy "
                             "(and save_policy) from traces of this drafter")
        if params["kind"] != POLICY_KIND or params["version"] != POLICY_VERSION:
            raise ValueError(f"not policy parameters of kind {POLICY_KIND!r} version {POLICY_VERSION}: "
                             f"got {params['kind']!r} version {params['version']!r}")
        self.params = dict(params)
        window = params["window"]
        if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
            raise ValueError(f"policy parameter 'window' must be an int >= 1, got {window!r}")
        self.window = int(window)
        self.grid = [float(h) for h in params["entropy_grid"]]
        self.depths = [int(d) for d in params["depths"]]
        self.acceptance = [[float(a) for a in row] for row in params["acceptance"]]
        if len(self.grid) < 2 or any(b <= a for a, b in zip(self.grid, self.grid[1:])):
            raise ValueError("policy parameter 'entropy_grid' must hold >= 2 increasing entropies (nats)")
        if self.depths != list(range(1, len(self.depths) + 1)):
            raise ValueError(f"policy parameter 'depths' must be 1..D, got {self.depths}")
        if len(self.acceptance) != len(self.grid) or any(len(row) != len(self.depths) for row in self.acceptance):
            raise ValueError(f"policy parameter 'acceptance' must be [{len(self.grid)} entropies x "
                             f"{len(self.depths)} depths]")
        if any(not 0.0 <= a <= 1.0 for row in self.acceptance for a in row):
            raise ValueError("policy parameter 'acceptance' must hold probabilities in [0, 1]")
        self.confidence_weight = _number(params, "confidence_weight", low=0.0)
        if self.confidence_weight > 1.0:
            raise ValueError(f"policy parameter 'confidence_weight' must lie in [0, 1], got {self.confidence_weight}")
        self.draft_cost = _number(params, "draft_cost", low=0.0)
        self.default_entropy = _number(params, "default_entropy", low=0.0)
        prior = params.get("calibration_prior")
        if prior is not None and (_number(params, "calibration_prior", low=0.0) <= 0.0):
            raise ValueError(f"policy parameter 'calibration_prior' must be > 0 (pseudo-drafts) or null (off), "
                             f"got {prior!r}")
        self.calibration_prior = None if prior is None else float(prior)
        half_life = params.get("calibration_half_life")
        if half_life is not None and _number(params, "calibration_half_life", low=0.0) <= 0.0:
            raise ValueError(f"policy parameter 'calibration_half_life' must be > 0 (rounds) or null (no forgetting), "
                             f"got {half_life!r}")
        self.calibration_decay = 1.0 if half_life is None else 2.0 ** (-1.0 / float(half_life))
        if verify_cost is None:
            if params.get("verify_cost") is None:
                raise ValueError("the policy needs a verify-cost curve: pass verify_cost (e.g. verify_cost='measure' "
                                 "to the decoder) or store one in the parameters")
            verify_cost = VerifyCost.from_config(params["verify_cost"])
        if not isinstance(verify_cost, VerifyCost):
            raise TypeError(f"verify_cost must be a VerifyCost, got {type(verify_cost).__name__}")
        self.verify_cost = verify_cost
        self._log_grid = [math.log(h + 1e-3) for h in self.grid]
        self.context_levels, self.context_tables, self.context_max = self._context_tables(params.get("context_match"))

    def bind(self, adapter, drafter) -> "LawPolicy":
        return self

    def begin_request(self, state) -> None:
        """Nothing to reset: the calibration reads the request's history."""

    def _context_tables(self, spec) -> tuple[list[int], list[list[list[float]]], int]:
        """``(levels, tables, max_length)`` of the optional ``context_match`` parameters, checked."""
        if spec is None:
            return [], [], 0
        if not isinstance(spec, dict) or any(k not in spec for k in ("max_length", "levels", "acceptance")):
            raise ValueError("policy parameter 'context_match' must be a dict with 'max_length', 'levels' and "
                             "'acceptance' (fit_policy(..., context_match=...) makes it), or null")
        max_length, levels = spec["max_length"], spec["levels"]
        if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length < 1:
            raise ValueError(f"policy parameter 'context_match.max_length' must be an int >= 1, got {max_length!r}")
        if (not isinstance(levels, list) or not levels
                or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in levels)
                or levels[0] < 0 or any(b <= a for a, b in zip(levels, levels[1:])) or levels[-1] > max_length):
            raise ValueError(f"policy parameter 'context_match.levels' must be increasing ints from 0 to at most "
                             f"max_length, got {levels!r}")
        tables = [[[float(a) for a in row] for row in table] for table in spec["acceptance"]]
        if len(tables) != len(levels) or any(len(t) != len(self.grid) or any(len(row) != len(self.depths)
                                                                             for row in t) for t in tables):
            raise ValueError(f"policy parameter 'context_match.acceptance' must be [{len(levels)} levels x "
                             f"{len(self.grid)} entropies x {len(self.depths)} depths]")
        if any(not 0.0 <= a <= 1.0 for t in tables for row in t for a in row):
            raise ValueError("policy parameter 'context_match.acceptance' must hold probabilities in [0, 1]")
        return [int(v) for v in levels], tables, int(max_length)

    @property
    def uses_context(self) -> bool:  # the decision reads the context's copyability
        return bool(self.context_levels)

    def law_acceptance(self, entropy: float, context_match: int | None = None) -> list[float]:
        """``a(H, d)`` for d = 1..D: linear in ``log(H + 1e-3)`` on the fitted grid, clamped; with ``context_match``,
        the table of the largest level not above it."""
        table = self.acceptance
        if context_match is not None and self.context_levels:
            level = max(bisect.bisect_right(self.context_levels, int(context_match)) - 1, 0)
            table = self.context_tables[level]
        x = math.log(max(float(entropy), 0.0) + 1e-3)
        grid = self._log_grid
        if x <= grid[0]:
            return list(table[0])
        if x >= grid[-1]:
            return list(table[-1])
        i = bisect.bisect_right(grid, x)
        t = (x - grid[i - 1]) / (grid[i] - grid[i - 1])
        return [(1 - t) * a + t * b for a, b in zip(table[i - 1], table[i])]

    def _at_depth(self, acceptance: list[float], depth: int) -> float:
        return acceptance[min(depth, len(acceptance)) - 1]  # deeper than fitted: the deepest fitted depth

    def inputs(self, entropies: Sequence[float], n_output: int, context: Sequence[int] | None = None) -> dict:
        """The inputs known before the round: the last committed position's entropy, the window mean
        (``default_entropy`` where none is known) and, where read, ``context_match_length`` of ``context``."""
        known = [h for h in list(entropies[:n_output])[-self.window:] if h == h]
        last = entropies[n_output - 1] if 0 < n_output <= len(entropies) else float("nan")
        window = sum(known) / len(known) if known else self.default_entropy
        out = {"entropy": float(last) if last == last else None, "window_entropy": float(window)}
        if self.context_levels:
            if context is None:
                raise ValueError("this policy reads the context's copyability (context_match parameters): pass "
                                 "context= (the prompt and the committed output)")
            out["context_match"] = context_match_length(context, self.context_max)
        return out

    def calibration_sums(self, history: Sequence = ()) -> tuple[float, float, float]:
        """``(A, E_law, E_blend)`` over this request's earlier rounds: accepted drafts and the uncalibrated law-only
        and blended expectations of the trees verified, k rounds back weighted ``decay^k``. Starts from the sums
        the last decision kept, so a round adds O(1)."""
        i = len(history) - 1
        while i >= 0 and (getattr(history[i], "policy", None) or {}).get("calibration_sums") is None:
            i -= 1
        accepted, law, blended = (0.0, 0.0, 0.0) if i < 0 else history[i].policy["calibration_sums"]
        decay = self.calibration_decay
        for record in history[max(i, 0):]:
            accepted, law, blended = accepted * decay, law * decay, blended * decay
            decision = getattr(record, "policy", None) or {}
            if decision.get("budget"):
                accepted += record.accepted
                law += decision.get("law_expected_raw", 0.0)
                blended += decision.get("expected_raw", 0.0)
        return accepted, law, blended

    def calibration(self, history: Sequence = ()) -> tuple[float, float]:
        """``(s_law, s_plan) = ((A + m) / (E_law + m), (A + m) / (E_blend + m))``; ``(1, 1)`` when off."""
        return (1.0, 1.0) if self.calibration_prior is None else self._factors(self.calibration_sums(history))

    def _factors(self, sums: tuple[float, float, float]) -> tuple[float, float]:
        m, (accepted, law, blended) = self.calibration_prior, sums
        return (accepted + m) / (law + m), (accepted + m) / (blended + m)

    def _reach(self, acceptance: list[float], max_depth: int):
        """``prod_{d<=k} a(d)`` for k = 1..max_depth: the law's probability that a round reaches depth k."""
        reach = 1.0
        for depth in range(1, int(max_depth) + 1):
            reach *= self._at_depth(acceptance, depth)
            yield reach

    def law_expected_depth(self, acceptance: list[float], depth: int) -> float:
        """The law's expected accepted drafts of a tree whose deepest node is at ``depth`` (siblings add nothing)."""
        return float(sum(self._reach(acceptance, depth)))

    def best_chain_rate(self, acceptance: list[float], max_depth: int, scale: float = 1.0) -> float:
        """The law's best expected tokens per unit cost of a chain of depth 1..max_depth, drafter cost included
        (``scale``: the calibration factor)."""
        best, expected = 1.0, 0.0
        for depth, reach in enumerate(self._reach(acceptance, max_depth), start=1):
            expected += min(1.0, scale * reach)
            best = max(best, (1.0 + expected) / (self.verify_cost(depth + 1) + self.draft_cost))
        return best

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> dict:
        """Whether to call the drafter this round (``"draft"``) and the inputs it was decided from."""
        inputs = self.inputs(entropies, n_output, context)
        acceptance = self.law_acceptance(inputs["window_entropy"], inputs.get("context_match"))
        calibrated, s_law = {}, 1.0
        if self.calibration_prior is not None:
            sums = self.calibration_sums(history)
            s_law, s_plan = self._factors(sums)
            calibrated = {"calibration": s_law, "plan_calibration": s_plan, "calibration_sums": sums}
        rate = self.best_chain_rate(acceptance, max(int(max_depth), 0), s_law)
        return {**inputs, "draft": rate > 1.0, "law_rate": rate, "acceptance": acceptance, **calibrated}

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict) -> tuple[Tree, float]:
        """The ancestor-closed subtree of ``tree`` to verify (maybe empty) and its expected accepted drafts; fills
        ``decision`` with the drafter's confidence, the budget and the expectations."""
        if tree.n_nodes == 0:
            decision.update(confidence=0.0, budget=0, expected=0.0)
            return Tree.empty(), 0.0
        lookup = [dict(zip(toks, lps)) for toks, lps in zip(proposal.tokens.tolist(),
                                                             proposal.logprobs.to(torch.float64).tolist())]
        acceptance, w = decision["acceptance"], self.confidence_weight
        scale = decision.get("plan_calibration", 1.0)
        path_prob, surrogate = [], []
        qs = [math.exp(lookup[d - 1].get(t, -math.inf)) if d <= len(lookup) else 0.0
              for t, d in zip(tree.tokens, tree.depths)]
        sibling_mass: dict[int, float] = {}
        for q, parent in zip(qs, tree.parents):
            sibling_mass[parent] = sibling_mass.get(parent, 0.0) + q
        for token, parent, depth, q in zip(tree.tokens, tree.parents, tree.depths, qs):
            a = self._at_depth(acceptance, depth)
            mass = sibling_mass[parent]
            p = q * (a / mass) ** (1.0 - w) if q > 0 else 0.0
            above = 1.0 if parent == 0 else path_prob[parent - 1]
            path_prob.append(above * p)
            surrogate.append((1.0 if parent == 0 else surrogate[parent - 1]) * q)
        # p <= 1, so a parent ranks before its children (ties: creation order)
        order = sorted(range(tree.n_nodes), key=lambda i: (-path_prob[i], i))
        best_k, best_rate, cumulative, expected = 0, 1.0, 0.0, 0.0
        for k, i in enumerate(order, start=1):
            cumulative += min(1.0, scale * path_prob[i])
            rate = (1.0 + cumulative) / self.verify_cost(k + 1)
            if rate > best_rate:
                best_k, best_rate, expected = k, rate, cumulative
        chosen = order[:best_k]
        decision.update(confidence=float(sum(surrogate)), budget=best_k, expected=expected,
                        expected_raw=float(sum(path_prob[i] for i in chosen)),
                        law_expected_raw=self.law_expected_depth(acceptance, max((tree.depths[i] for i in chosen),
                                                                                 default=0)))
        if best_k == 0:
            return Tree.empty(), 0.0
        new_index = {}
        tokens, parents, depths = [], [], []
        for i in sorted(chosen, key=lambda i: (tree.depths[i], order.index(i))):  # parents first
            parent = tree.parents[i]
            new_index[i + 1] = len(tokens) + 1
            tokens.append(tree.tokens[i])
            parents.append(0 if parent == 0 else new_index[parent])
            depths.append(tree.depths[i])
        return Tree(tuple(tokens), tuple(parents), tuple(depths)), expected

    def observe(self, entropies: list[float], n_output: int, target_logits: torch.Tensor | None) -> None:
        """Append the entropies of the newly committed positions from their ``target_logits`` rows (only the last
        ``window`` computed, earlier ones NaN; None: nothing appended)."""
        if target_logits is None or len(entropies) >= n_output:
            return
        rows = int(target_logits.shape[0])
        new = n_output - len(entropies)
        if new != rows:
            return  # the rows do not line up with the new positions: leave them unknown
        computed = row_entropies(target_logits[max(0, rows - self.window):])
        entropies.extend([float("nan")] * (rows - len(computed)) + computed)

    def to_config(self) -> dict:  # the verify-cost curve in use included
        return {**self.params, "verify_cost": self.verify_cost.to_config()}


class HybridLawPolicy:
    """Each round, which of a ``HybridDrafter``'s two drafters to run (or none), from each one's own law
    (``params``: ``payoff.policy.hybrid_policy``'s). Each law's best chain rate, its own draft cost included (the
    n-gram chain no deeper than its proposal), decides; the winner's law plans the tree and calibrates on its rounds."""

    def __init__(self, params: dict, verify_cost: VerifyCost | None = None, drafter=None):
        if not isinstance(params, dict) or params.get("kind") != HYBRID_POLICY_KIND or params.get("version") != 1:
            raise ValueError(f"not hybrid policy parameters (kind {HYBRID_POLICY_KIND!r} version 1): make them with "
                             "entropy_law.payoff.policy.hybrid_policy(ngram_params, block_params)")
        missing = [route for route in HYBRID_ROUTES if not isinstance(params.get(route), dict)]
        if missing:
            raise ValueError(f"hybrid policy parameters lack the law policy of {missing} (a dict from fit_policy each)")
        self.params = dict(params)
        self.laws = {route: LawPolicy(params[route], verify_cost) for route in HYBRID_ROUTES}
        self.laws["block"].verify_cost = self.laws["ngram"].verify_cost  # one machine, one curve
        self._widest = max(self.laws.values(), key=lambda law: law.window)  # computes the entropies both read
        self.drafter = drafter  # bound by the decoder, which checks it first (check_policy)

    @property
    def verify_cost(self) -> VerifyCost:  # the one curve both laws price by
        return self.laws["ngram"].verify_cost

    def bind(self, adapter, drafter) -> "HybridLawPolicy":
        if drafter is not None:
            self.drafter = drafter
        return self

    def begin_request(self, state) -> None:
        """Nothing to reset: each law reads its own rounds of the history."""

    @staticmethod
    def check(params: dict, drafter, model_id: str | None) -> None:
        """Refuse a drafter that is not a hybrid one, and each law fitted for another drafter or target."""
        if not all(hasattr(drafter, name) for name in ("route", "ngram_proposal", "ngram", "block")):
            raise ValueError(f"a hybrid policy routes a HybridDrafter (entropy_law.drafters.hybrid); the drafter is "
                             f"{type(drafter).__name__}: use a law policy of that drafter (fit_policy) instead")
        for route in HYBRID_ROUTES:
            check_policy_drafter(params[route], getattr(drafter, route))
            check_policy_target(params[route], model_id)

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> dict:
        """Each law's ``before_draft`` over its own rounds; the higher ``law_rate`` decides and routes the drafter."""
        if self.drafter is None:
            raise RuntimeError("HybridLawPolicy: no drafter bound (SpeculativeDecoder binds its HybridDrafter)")
        if context is None:
            raise ValueError("a hybrid policy looks at the n-gram proposal before choosing: pass context= (the prompt "
                             "and the committed output)")
        depths = {"ngram": min(int(max_depth), self.drafter.ngram_proposal(context).depth), "block": int(max_depth)}
        decisions = {route: law.before_draft(entropies, n_output, depths[route], self._last_round(history, route),
                                             context)
                     for route, law in self.laws.items()}
        route = max(HYBRID_ROUTES, key=lambda r: decisions[r]["law_rate"])  # ties: the n-gram drafter (cheaper)
        decision = {**decisions[route], "route": route, "ngram_depth": depths["ngram"],
                    **{f"{r}_law_rate": decisions[r]["law_rate"] for r in HYBRID_ROUTES}}
        if decision["draft"]:
            self.drafter.route(route)
        return decision

    @staticmethod
    def _last_round(history: Sequence, route: str) -> list:
        """The request's last round of ``route`` (its decision keeps the calibration sums), or none."""
        for record in reversed(history):
            if (getattr(record, "policy", None) or {}).get("route") == route:
                return [record]
        return []

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict) -> tuple[Tree, float]:
        return self.laws[decision["route"]].plan(proposal, tree, decision)

    def observe(self, entropies: list[float], n_output: int, target_logits: torch.Tensor | None) -> None:
        """``LawPolicy.observe`` of the law with the wider window (both read the same entropies)."""
        self._widest.observe(entropies, n_output, target_logits)

    def to_config(self) -> dict:  # each law with its verify-cost curve
        return {**self.params, **{route: law.to_config() for route, law in self.laws.items()}}


def make_policy(policy, verify_cost: VerifyCost | None, drafter=None):
    """A ``LawPolicy`` or ``HybridLawPolicy`` from parameters (by their ``kind``); a policy already built, or any
    other ``round.RoundPolicy``, passes through (a ``HybridLawPolicy`` bound to ``drafter``)."""
    if policy is None or isinstance(policy, LawPolicy):
        return policy
    if isinstance(policy, HybridLawPolicy):
        return policy.bind(None, drafter)
    if all(callable(getattr(policy, name, None)) for name in ("before_draft", "plan", "observe")):
        return policy
    if isinstance(policy, dict):
        if policy.get("kind") == HYBRID_POLICY_KIND:
            return HybridLawPolicy(policy, verify_cost, drafter)
        return LawPolicy(policy, verify_cost)
    raise TypeError(f"policy must be policy parameters (a dict from fit_policy or hybrid_policy), a LawPolicy, a "
                    f"HybridLawPolicy or a RoundPolicy (before_draft, plan, observe), got {type(policy).__name__}")


def check_policy(policy, drafter, model_id: str | None) -> None:
    """``check_policy_drafter`` and ``check_policy_target`` of parameters or a built law policy."""
    params = policy.params if isinstance(policy, (LawPolicy, HybridLawPolicy)) else policy
    if isinstance(params, dict) and params.get("kind") == HYBRID_POLICY_KIND:
        HybridLawPolicy.check(params, drafter, model_id)
    elif isinstance(params, dict):
        check_policy_drafter(params, drafter)
        check_policy_target(params, model_id)
