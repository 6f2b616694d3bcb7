"""The per-round drafting policy: whether to draft, and how many nodes to verify, from the entropy law.

Known here: ``LawPolicy``, which the round consults twice (``round.play_round``):

1. before drafting (``before_draft``): from the target entropy at the last committed position and the mean
   over a short window of them (``H_w``), the fitted law's per-depth acceptance ``a(H_w, d)`` gives the
   best rate any chain of depth ``D`` can reach, ``(1 + sum_{k<=D} prod_{d<=k} a(H_w, d)) / (c(D + 1) +
   c_draft)``; when no depth beats a plain step (rate 1) the drafter is not called at all (its own cost
   ``c_draft`` is saved);
2. after drafting (``plan``): the children of a node get a conditional acceptance ``b = a(H_w, d)^(1 - w) *
   Q^w`` together, a geometric blend of the law's prediction for depth d and the drafter's own probability
   ``Q`` of those children (the sum of their ``q``: its confidence, known before verification; ``w`` =
   ``confidence_weight``), shared among them in proportion to ``q``: ``p = q (a / Q)^(1 - w)``. For a chain
   (one child) that is ``a^(1 - w) q^w``; siblings are mutually exclusive, so their ``p`` sum to ``b <= 1``
   (a blend node by node, ``sqrt(a q)`` each, would give three siblings of q = 0.3 under a law of 0.8 a summed
   acceptance of 1.47 > 1, and wide trees verified for drafts that cannot all be accepted). Path
   probabilities are products along the path. Nodes are ranked by path probability (a child never
   outranks its parent, so every prefix of the ranking is a tree), and the policy verifies the prefix
   of ``k`` nodes with the most expected committed tokens per unit of verify cost, ``(1 + sum_{i<=k}
   P_i) / c(k + 1)``, or nothing when no prefix beats 1. ``k`` is the round's chain depth / tree budget.

3. in-request calibration (``calibration_prior`` = m in the parameters; absent: off): the law is fitted on
   other requests, and a drafter can do much worse (or better) on this one than the law says. Over this
   request's verified rounds so far, with ``A`` accepted drafts and the uncalibrated expectations
   ``E`` of the trees verified, the factor ``s = (A + m) / (E + m)`` (m pseudo-drafts at the law's word:
   ``s = 1`` before any evidence) scales the law's expected accepted drafts (each path probability, capped
   at 1) before the decision; one factor against the law-only expectation (``before_draft``) and one against
   the blended one (``plan``). The law-only expectation of a verified tree is the law's expected accepted depth
   down to the tree's deepest node, ``sum_{k<=D} prod_{d<=k} a(H_w, d)``: the law is fitted on the depth a round
   reached (``a(H, d)``: depth d accepted given depth d - 1 was, whichever node carried it), so it gives siblings
   no acceptance of their own, and a sum over every node's law path probability would count each depth once per
   sibling and deflate the factor). A request where drafts keep failing stops drafting; one where they succeed
   drafts more. Only earlier rounds of the same request are used: what is known before the round. With
   ``calibration_half_life`` (rounds; absent: no forgetting) a round ``k`` rounds back weighs ``2^(-k / half
   life)`` in ``A`` and ``E``: the drafter's fit to the text changes along an output (a copied passage, a code
   block), and a request that stopped drafting gathers no new evidence, so its factor drifts back towards 1
   and it tries again.

4. the context's copyability (optional: parameters with a ``context_match`` table, ``fit_policy(...,
   context_match=...)``): before drafting, the length ``m`` of the longest suffix of the context (prompt and
   committed output, ending with the pending root) that occurred earlier in it, up to ``max_length`` tokens
   (``context_match_length``; the lookup a prompt-lookup drafter makes, known before any drafter runs). The law
   is then fitted per level of ``m`` (text that repeats earlier text can be drafted far more reliably at the same
   entropy) and the round uses the table of its level, before drafting and in ``plan``.

The law's numbers arrive as plain parameters (a JSON-able dict, fitted by ``entropy_law.payoff.policy`` and
stored in the run's metadata): this module never imports the law layer. ``c(n)`` is the measured verify-cost
curve (``gate.VerifyCost``). The policy picks which drafted nodes are verified; the acceptance rule is the
round's, so the output is the greedy output whatever it decides.

Not known here: how the law is fitted (``entropy_law.payoff.policy``), how trees are built (``tree``).
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
    """Raise ``ValueError`` when policy parameters were fitted for another drafter (``drafter_id``) or another
    checkpoint of it (``checkpoint_sha256``, where both sides have one): a law of one drafter's acceptance says
    little about another's. Parameters without these keys (made by hand, or before they were kept) are not
    checked. ``entropy_law.payoff.policy.borrow_policy`` relabels parameters to apply them knowingly."""
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
    """Raise ``ValueError`` when policy parameters were fitted on traces of another target model (``model_id``, the
    list ``fit_policy`` keeps) than ``model_id``: a law maps *this* target's entropies to acceptance, and another
    target's entropies sit on another scale (its vocabulary, its training). Not checked where either side names no
    model (parameters made by hand or before they were kept; a decoder built on a bare module or adapter, whose name
    is only its class). ``entropy_law.payoff.policy.borrow_policy(..., model_id=None)`` applies one knowingly."""
    fitted = params.get("model_id")
    if model_id is None or not isinstance(fitted, list) or not fitted or str(model_id) in fitted:
        return
    raise ValueError(f"the policy was fitted on traces of target {', '.join(fitted)}, this decoder's target is "
                     f"{model_id!r}: fit one on this target's runs (entropy-law policy TRACES --drafter ARM), or apply "
                     "it knowingly with entropy_law.payoff.policy.borrow_policy(params, ..., model_id=None) (entropy-law "
                     "record --policy-borrow)")


class LawPolicy:
    """A per-round policy from plain parameters (``entropy_law.payoff.policy.fit_policy`` makes them).

    ``params``: the dict of ``fit_policy`` (keys ``REQUIRED_KEYS``; ``verify_cost`` optional).
    ``verify_cost``: the measured cost curve of this machine; default: the one stored in ``params``.
    """

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
        """``round.RoundPolicy.bind``: the policy as built (its curve was given or stored with the parameters)."""
        return self

    def begin_request(self, state) -> None:
        """``round.RoundPolicy.begin_request``: nothing to reset (the calibration reads the request's history)."""

    def _context_tables(self, spec) -> tuple[list[int], list[list[list[float]]], int]:
        """The optional per-level tables of the copyability input (``context_match``): ``max_length``, the
        ``levels`` (increasing lengths >= 0) and one ``acceptance`` table [entropies x depths] per level."""
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
    def uses_context(self) -> bool:
        """Whether the decision reads the context's copyability (``context_match`` parameters)."""
        return bool(self.context_levels)

    # --- the law from its table ---------------------------------------------------------------------

    def law_acceptance(self, entropy: float, context_match: int | None = None) -> list[float]:
        """``a(H, d)`` for d = 1..D: linear interpolation in ``log(H + 1e-3)`` on the fitted grid (clamped at
        its ends); with ``context_match`` (a policy that uses it), the table of the largest fitted level not
        above it (the first level's below every level)."""
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
        """The inputs known before the round: the entropy at the last committed position and the window mean
        (the parameters' ``default_entropy`` where none is known, e.g. in a replay without target logits) and,
        for a policy that reads it, the context's ``context_match_length`` (``context``: the prompt and the
        committed output, ending with the pending root; required then)."""
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

    # --- decisions ------------------------------------------------------------------------------------

    def calibration_sums(self, history: Sequence = ()) -> tuple[float, float, float]:
        """``(A, E_law, E_blend)`` over this request's earlier rounds (``Round`` records with their ``policy``
        decisions): the accepted drafts of the rounds that verified drafts and the uncalibrated law-only and
        blended expectations of the trees they verified, the round ``k`` rounds back weighted ``decay^k`` (1
        without a half-life). O(1) per round: each decision keeps the sums it was made from
        (``calibration_sums``), so only the last round is added; a history without them is folded whole."""
        i = len(history) - 1  # the last round whose decision kept the sums it was made from (online: the last)
        while i >= 0 and (getattr(history[i], "policy", None) or {}).get("calibration_sums") is None:
            i -= 1
        accepted, law, blended = (0.0, 0.0, 0.0) if i < 0 else history[i].policy["calibration_sums"]
        decay = self.calibration_decay
        for record in history[max(i, 0):]:  # add that round and any later one, each shrinking what came before
            accepted, law, blended = accepted * decay, law * decay, blended * decay
            decision = getattr(record, "policy", None) or {}
            if decision.get("budget"):
                accepted += record.accepted
                law += decision.get("law_expected_raw", 0.0)
                blended += decision.get("expected_raw", 0.0)
        return accepted, law, blended

    def calibration(self, history: Sequence = ()) -> tuple[float, float]:
        """The in-request factors ``(s_law, s_plan) = ((A + m) / (E_law + m), (A + m) / (E_blend + m))`` of
        ``calibration_sums``; ``(1, 1)`` when calibration is off or before any verified round."""
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
        """The law's expected accepted drafts of a tree whose deepest node is at ``depth``: ``sum_{k<=depth}
        prod_{d<=k} a(d)`` (what a chain of that depth expects; the law is fitted on the depth a round reached,
        so a tree's siblings add nothing to it). The before-draft calibration compares accepted drafts with it."""
        return float(sum(self._reach(acceptance, depth)))

    def best_chain_rate(self, acceptance: list[float], max_depth: int, scale: float = 1.0) -> float:
        """The law's best expected tokens per unit cost of a chain of depth 1..max_depth, drafter cost included;
        ``scale``: the calibration factor on each reach probability (capped at 1)."""
        best, expected = 1.0, 0.0
        for depth, reach in enumerate(self._reach(acceptance, max_depth), start=1):
            expected += min(1.0, scale * reach)
            best = max(best, (1.0 + expected) / (self.verify_cost(depth + 1) + self.draft_cost))
        return best

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> dict:
        """Whether to call the drafter this round (``"draft"``) and the inputs it was decided from.
        ``history``: this request's earlier rounds (for the in-request calibration; empty: none). ``context``:
        the prompt and the committed output (read by a policy with ``context_match`` parameters)."""
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
        """The nodes of ``tree`` to verify (an ancestor-closed subtree, possibly empty) and its expected
        accepted drafts under the blended probabilities. Fills ``decision`` with the drafter's confidence
        (its surrogate expected accepted drafts of the whole drafted tree), the budget and the expectation."""
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
        # rank by path probability; p <= 1, so a parent ranks before its children (ties: creation order); the
        # calibration factor is the same for every node, so it changes where the prefix stops, not the ranking
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
        """Append the entropies of the newly committed positions (only the last ``window`` rows are computed;
        earlier ones are NaN, never read). ``target_logits``: their logit rows (None: unknown, nothing
        appended; a replay gives the entropies up front)."""
        if target_logits is None or len(entropies) >= n_output:
            return
        rows = int(target_logits.shape[0])
        new = n_output - len(entropies)
        if new != rows:
            return  # the rows do not line up with the new positions: leave them unknown
        computed = row_entropies(target_logits[max(0, rows - self.window):])
        entropies.extend([float("nan")] * (rows - len(computed)) + computed)

    def to_config(self) -> dict:
        """The parameters as stored with the run (the verify-cost curve in use included)."""
        return {**self.params, "verify_cost": self.verify_cost.to_config()}


class HybridLawPolicy:
    """Each round, which of the hybrid drafter's two drafters to run (or none), from each one's own law.

    ``params``: ``{"kind": HYBRID_POLICY_KIND, "version": 1, "ngram": ..., "block": ...}``, the law policy
    parameters of the n-gram drafter and of the block drafter, each fitted on that drafter's own traces with its
    own cost (``entropy_law.payoff.policy.hybrid_policy`` makes them). Before drafting, each law gives its best
    chain rate on the same inputs (entropy window and, where it reads it, the context's copyability), its draft
    cost included: the n-gram drafter costs almost nothing, the block drafter a forward. Prompt lookup is cheap
    enough to run first (``HybridDrafter.ngram_proposal``, reused when it drafts), so the n-gram law's chain goes
    no deeper than its proposal (``ngram_depth``; where it finds nothing the route is worth a plain step, rate 1,
    whatever its law says). The round runs the drafter of the
    higher rate (``HybridDrafter.route``: the other's forward is not run), or none when neither beats a plain
    step; the chosen law then plans the tree (``LawPolicy.plan``). Each law keeps its own
    in-request calibration, over the rounds it chose (a drafter's record says nothing about the other's).
    The decision records both rates and the ``route``. Greedy exactness is the round's, as for ``LawPolicy``.
    ``drafter``: the ``HybridDrafter`` it routes (bound by the decoder).
    """

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
    def verify_cost(self) -> VerifyCost:
        """The one verify-cost curve both laws price by."""
        return self.laws["ngram"].verify_cost

    def bind(self, adapter, drafter) -> "HybridLawPolicy":
        """``round.RoundPolicy.bind``: routes ``drafter`` (a ``HybridDrafter``) from now on."""
        if drafter is not None:
            self.drafter = drafter
        return self

    def begin_request(self, state) -> None:
        """``round.RoundPolicy.begin_request``: nothing to reset (each law reads its own rounds of the history)."""

    @staticmethod
    def check(params: dict, drafter, model_id: str | None) -> None:
        """Refuse a drafter that is not a hybrid one (``route``, ``ngram_proposal``, ``ngram``, ``block``), and each
        law fitted for another drafter, checkpoint (``check_policy_drafter``) or target (``check_policy_target``)."""
        if not all(hasattr(drafter, name) for name in ("route", "ngram_proposal", "ngram", "block")):
            raise ValueError(f"a hybrid policy routes a HybridDrafter (entropy_law.drafters.hybrid); the drafter is "
                             f"{type(drafter).__name__}: use a law policy of that drafter (fit_policy) instead")
        for route in HYBRID_ROUTES:
            check_policy_drafter(params[route], getattr(drafter, route))
            check_policy_target(params[route], model_id)

    def before_draft(self, entropies: Sequence[float], n_output: int, max_depth: int, history: Sequence = (),
                     context: Sequence[int] | None = None) -> dict:
        """Each law's ``before_draft`` over the rounds it chose before (its calibration's evidence); the one of
        the higher ``law_rate`` decides, and the drafter is told which to run."""
        if self.drafter is None:
            raise RuntimeError("HybridLawPolicy: no drafter bound (SpeculativeDecoder binds its HybridDrafter)")
        if context is None:
            raise ValueError("a hybrid policy looks at the n-gram proposal before choosing: pass context= (the prompt "
                             "and the committed output)")
        # prompt lookup is known before choosing: no chain deeper than its proposal (none without a match)
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
        """The request's last round of ``route``, or none: all a law's calibration reads of its own rounds (every
        decision of a route keeps the sums it was made from, ``LawPolicy.calibration_sums``; that round adds its own
        evidence), so the history is not filtered whole every round."""
        for record in reversed(history):
            if (getattr(record, "policy", None) or {}).get("route") == route:
                return [record]
        return []

    def plan(self, proposal: DraftProposal, tree: Tree, decision: dict) -> tuple[Tree, float]:
        """The chosen law's ``LawPolicy.plan``."""
        return self.laws[decision["route"]].plan(proposal, tree, decision)

    def observe(self, entropies: list[float], n_output: int, target_logits: torch.Tensor | None) -> None:
        """``LawPolicy.observe`` of the law with the wider window (both read the same entropies)."""
        self._widest.observe(entropies, n_output, target_logits)

    def to_config(self) -> dict:
        """The parameters as stored with the run (each law with the verify-cost curve in use)."""
        return {**self.params, **{route: law.to_config() for route, law in self.laws.items()}}


def make_policy(policy, verify_cost: VerifyCost | None, drafter=None):
    """A ``LawPolicy`` or ``HybridLawPolicy`` from parameters (by their ``kind``); one already built passes
    through (a ``HybridLawPolicy`` is bound to ``drafter``), as does any other ``round.RoundPolicy`` (an object
    with ``before_draft``, ``plan`` and ``observe``: a gate of ``gate``, or ``replay.HindsightPolicy``, the oracle as
    a policy)."""
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
    """``check_policy_drafter`` and ``check_policy_target`` of parameters, a ``LawPolicy`` or a
    ``HybridLawPolicy`` (each of its two laws against its own drafter)."""
    params = policy.params if isinstance(policy, (LawPolicy, HybridLawPolicy)) else policy
    if isinstance(params, dict) and params.get("kind") == HYBRID_POLICY_KIND:
        HybridLawPolicy.check(params, drafter, model_id)
    elif isinstance(params, dict):
        check_policy_drafter(params, drafter)
        check_policy_target(params, model_id)
