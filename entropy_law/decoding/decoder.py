"""Lossless greedy speculative decoding (GLANCE-style loop) and the lean autoregressive baseline.

Known here: the round (draft -> build tree -> verify -> accept -> commit, plus the bonus token), the
drafting gate (draft only when the expected number of accepted drafts pays for the wider verify),
stopping exactly as plain greedy decoding does (EOS, token budget, context), timers, and the
per-round records handed to observers. Output token ids equal greedy decoding of the target, whatever
the drafter proposes: every committed token is the target's argmax after its committed prefix.

Not known here: how drafters draft (``Drafter``), how trees are shaped (``tree``), how the target
runs (``adapter``), how rounds are written to disk (``observers``, ``entropy_law.traces``).

Conventions. After the prefill the target's argmax is the first new token and becomes the pending
*root*: committed to the output but not yet in the KV cache. The prefill is reported to observers as
round 0 (no draft, ``verify_ms`` 0; its time is ``prefill_ms``), so every output position has exactly one
target logit row in exactly one round. Each later round verifies the root plus the tree in one forward.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from entropy_law.decoding.adapter import TargetAdapter
from entropy_law.decoding.interface import DraftProposal, Drafter, Observer, RoundRecord
from entropy_law.decoding.gate import VerifyCost, measure_verify_cost, plan_verification, truncate_proposal
from entropy_law.decoding.tree import TREE_POLICIES, Tree, build_tree


@dataclass(frozen=True)
class RoundStats:
    """Per-round statistics kept in every result (observers get the full ``RoundRecord``)."""

    round_index: int
    start_position: int
    context_len: int
    tree_nodes: int
    tree_depth: int
    accepted: int
    committed: int
    expected_accepted: float  # the drafting gate's surrogate E (0 when nothing was proposed)
    drafted: bool  # False: the round was a plain one-token step
    draft_ms: float
    verify_ms: float
    overhead_ms: float


@dataclass
class GenerationResult:
    """What ``generate`` returns."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]  # the new tokens only
    text: str
    rounds: list[RoundStats]
    prefill_ms: float
    decode_ms: float  # wall time of all rounds after the prefill (observers included)
    stop_reason: str  # "eos" | "max_new_tokens" | "context_full"
    config: dict

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def target_forwards(self) -> int:
        """Verify passes after the prefill."""
        return sum(1 for r in self.rounds if r.round_index > 0)

    @property
    def mean_committed_per_round(self) -> float:
        """Tokens committed per verify pass (round 0, the prefill, excluded)."""
        decode_rounds = [r for r in self.rounds if r.round_index > 0]
        return sum(r.committed for r in decode_rounds) / len(decode_rounds) if decode_rounds else float("nan")

    @property
    def tokens_per_second(self) -> float:
        total_s = (self.prefill_ms + self.decode_ms) / 1000.0
        return self.new_tokens / total_s if total_s > 0 else float("nan")

    @property
    def summary(self) -> dict:
        return {"request_id": self.request_id, "prompt_tokens": len(self.prompt_ids),
                "new_tokens": self.new_tokens, "rounds": len(self.rounds), "stop_reason": self.stop_reason,
                "mean_committed_per_round": self.mean_committed_per_round,
                "prefill_ms": self.prefill_ms, "decode_ms": self.decode_ms,
                "tokens_per_second": self.tokens_per_second}


def _now_ms() -> float:
    return time.perf_counter() * 1000.0


class SpeculativeDecoder:
    """Greedy lossless speculative decoding with a drafter and a tree policy; ``drafter=None`` is the
    lean autoregressive baseline (same adapter, timers, token counting and observers; each step is a
    round with no tree).

    ``target``: a ``LoadedTarget`` (model + tokenizer), a ``TargetAdapter`` or a bare causal LM.
    ``tree``: ``"chain"``, ``"ddtree"`` (``tree.build_tree``) or a callable ``(proposal, budget) -> Tree``.
    The gate's surrogate is ``tree.expected_accepted`` (sum over nodes of the path's candidate probabilities).
    ``budget``: most draft nodes per tree (``None``: chain = the proposal's depth; ddtree needs one).
    ``verify_cost_ratio``: cost of a verify pass relative to a one-token forward; a round drafts only if
    the surrogate expected accepted drafts ``E >= verify_cost_ratio - 1`` (a round commits ``1 + E`` tokens
    in expectation for that cost, a plain step 1 token for cost 1). ``min_expected_accepted`` overrides the
    threshold directly (0: always verify what was drafted). ``verify_cost``: a measured cost curve
    (``gate.VerifyCost``, or ``"measure"`` to time this machine now with ``gate.measure_verify_cost``);
    then the gate verifies the prefix of the tree with the most expected tokens per unit of verify
    cost, or nothing (``gate.plan_verification``), and ``verify_cost_ratio`` is not used
    (``min_expected_accepted`` defaults to 0 there). Gating changes speed, never the output.
    ``eos_token_ids``: default from the model's generation config (then its config).
    """

    def __init__(self, target, drafter: Drafter | None = None, *, tree: str | Callable = "chain",
                 budget: int | None = None, observers: Sequence[Observer] = (),
                 verify_cost_ratio: float = 2.0, min_expected_accepted: float | None = None,
                 verify_cost: VerifyCost | str | None = None, eos_token_ids: Sequence[int] | int | None = None, tokenizer=None):
        if isinstance(target, TargetAdapter):
            self.adapter = target
        else:
            # a LoadedTarget carries .model and .tokenizer; a bare causal LM is an nn.Module
            model = target if isinstance(target, torch.nn.Module) else target.model
            self.adapter = TargetAdapter(model)
        if tokenizer is None and not isinstance(target, (TargetAdapter, torch.nn.Module)):
            tokenizer = getattr(target, "tokenizer", None)
        self.tokenizer = tokenizer
        self.model_id = getattr(target, "model_id", type(self.adapter.model).__name__)
        self.drafter = drafter
        wanted_layers = tuple(getattr(drafter, "feature_layers", ())) if drafter is not None else ()
        if isinstance(target, TargetAdapter) and wanted_layers and target.feature_layers != wanted_layers:
            raise ValueError(f"the drafter reads target layers {wanted_layers} but the adapter captures "
                             f"{target.feature_layers}; build TargetAdapter(model, feature_layers={wanted_layers})")
        if not isinstance(target, TargetAdapter):
            self.adapter.feature_layers = wanted_layers
        if isinstance(tree, str) and tree not in TREE_POLICIES:
            raise ValueError(f"unknown tree policy {tree!r}; use one of {TREE_POLICIES} or a callable")
        if tree == "ddtree" and budget is None and drafter is not None:
            raise ValueError("tree='ddtree' needs a node budget, e.g. budget=16")
        if budget is not None and budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        self.tree_policy = tree
        self.budget = budget
        self.observers = list(observers)
        self.verify_cost_ratio = float(verify_cost_ratio)
        if isinstance(verify_cost, str):
            if verify_cost != "measure":
                raise ValueError(f"verify_cost must be a VerifyCost, 'measure' or None, got {verify_cost!r}")
            verify_cost = measure_verify_cost(self.adapter) if drafter is not None else None
        if verify_cost is not None and not isinstance(verify_cost, VerifyCost):
            raise TypeError(f"verify_cost must be a VerifyCost, 'measure' or None, got {type(verify_cost).__name__}")
        self.verify_cost = verify_cost
        if min_expected_accepted is not None:
            self.min_expected_accepted = float(min_expected_accepted)
        else:
            self.min_expected_accepted = 0.0 if verify_cost is not None else max(0.0, self.verify_cost_ratio - 1.0)
        self.eos_token_ids = self._eos_ids(eos_token_ids)

    # --- configuration --------------------------------------------------------------------------

    def _eos_ids(self, eos) -> frozenset[int]:
        if eos is None:
            model = self.adapter.model
            gen = getattr(model, "generation_config", None)
            eos = getattr(gen, "eos_token_id", None) if gen is not None else None
            if eos is None:
                eos = getattr(model.config, "eos_token_id", None)
        if eos is None:
            return frozenset()
        return frozenset([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])

    @property
    def config(self) -> dict:
        drafter = self.drafter
        return {
            "model_id": self.model_id,
            "drafter_id": getattr(drafter, "drafter_id", "none") if drafter is not None else "none",
            "block_size": self.block_size,
            "tree_policy": self.tree_policy if isinstance(self.tree_policy, str) else repr(self.tree_policy),
            "budget": self.budget,
            "verify_cost_ratio": self.verify_cost_ratio,
            "min_expected_accepted": self.min_expected_accepted,
            "verify_cost": None if self.verify_cost is None else self.verify_cost.to_config(),
            "eos_token_ids": sorted(self.eos_token_ids),
            "feature_layers": list(self.adapter.feature_layers),
            "dtype": str(self.adapter.dtype).replace("torch.", ""),
            "attention": self.adapter.attention_kernel,
        }

    @property
    def block_size(self) -> int:
        return int(self.drafter.block_size) if self.drafter is not None else 1

    # --- prompt handling ------------------------------------------------------------------------

    def encode_prompt(self, prompt, *, raw_prompt: bool = False) -> list[int]:
        """Token ids for a prompt.

        Token ids (list of ints or a tensor) are used as given. Chat messages (list of dicts) and plain
        strings go through the tokenizer's chat template with ``add_generation_prompt=True`` (a string
        becomes one user message); ``raw_prompt=True`` tokenizes a string as is.
        """
        if isinstance(prompt, torch.Tensor):
            return [int(t) for t in prompt.reshape(-1).tolist()]
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return [int(t) for t in prompt]
        if self.tokenizer is None:
            raise ValueError("this decoder has no tokenizer: give token ids, or a LoadedTarget / tokenizer=")
        if isinstance(prompt, str):
            if raw_prompt:
                return list(self.tokenizer(prompt)["input_ids"])
            prompt = [{"role": "user", "content": prompt}]
        if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) for m in prompt):
            text = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        raise TypeError(f"prompt must be a string, chat messages (list of dicts) or token ids, got {type(prompt)}")

    # --- decoding ---------------------------------------------------------------------------------

    def generate(self, prompt, *, max_new_tokens: int, category: str = "", request_id: str | None = None,
                 raw_prompt: bool = False, dataset: str = "", question_id: str = "",
                 image_tokens: int = 0) -> GenerationResult:
        """Decode greedily up to ``max_new_tokens`` new tokens (fewer at EOS or when the context is full)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        prompt_ids = self.encode_prompt(prompt, raw_prompt=raw_prompt)
        if not prompt_ids:
            raise ValueError("empty prompt")
        max_ctx = self.adapter.max_context
        if max_ctx is not None and len(prompt_ids) >= max_ctx:
            raise ValueError(f"prompt has {len(prompt_ids)} tokens; the model's context is {max_ctx} "
                             "(it needs room for at least one new token): shorten the prompt")
        request_id = request_id if request_id is not None else f"req-{id(prompt_ids):x}-{time.time_ns()}"
        for obs in self.observers:
            obs.on_request_start(request_id, {"category": category, "dataset": dataset,
                                              "question_id": question_id, "prompt_tokens": len(prompt_ids),
                                              "image_tokens": image_tokens, "config": self.config})

        t0 = _now_ms()
        last_logits, prompt_features = self.adapter.prefill(prompt_ids)
        if self.drafter is not None:
            self.drafter.begin(prompt_ids, prompt_features)
        root = int(last_logits.argmax())
        prefill_ms = _now_ms() - t0

        state = _RequestState(request_id=request_id, prompt_ids=prompt_ids, max_new_tokens=max_new_tokens,
                              output=[root], root=root, start=len(prompt_ids), new_features=None)
        t_decode = _now_ms()
        self._emit_prefill_round(state, last_logits)
        stop = self._stop_reason(state)
        while stop is None:
            self._round(state)
            stop = self._stop_reason(state)
        decode_ms = _now_ms() - t_decode

        for obs in self.observers:
            obs.on_request_end(request_id, {"new_tokens": len(state.output), "stop_reason": stop,
                                            "prefill_ms": prefill_ms, "decode_ms": decode_ms})
        text = self.tokenizer.decode(state.output, skip_special_tokens=True) if self.tokenizer is not None else ""
        return GenerationResult(request_id=request_id, prompt_ids=prompt_ids, token_ids=list(state.output),
                                text=text, rounds=state.rounds, prefill_ms=prefill_ms, decode_ms=decode_ms,
                                stop_reason=stop, config=self.config)

    def _stop_reason(self, state: "_RequestState") -> str | None:
        if state.output[-1] in self.eos_token_ids:
            return "eos"
        if len(state.output) >= state.max_new_tokens:
            return "max_new_tokens"
        max_ctx = self.adapter.max_context
        if max_ctx is not None and state.start >= max_ctx:  # the pending root would not fit
            return "context_full"
        return None

    def _round(self, state: "_RequestState") -> None:
        """One speculative round: draft -> build tree -> verify -> accept -> commit (+ bonus token)."""
        t0 = _now_ms()
        remaining = state.max_new_tokens - len(state.output)  # tokens this request may still commit
        proposal = self._propose(state)
        t1 = _now_ms()
        tree, proposal, expected = self._plan_tree(proposal, state, remaining)
        t2 = _now_ms()
        logits, features = self.adapter.verify(state.root, tree, state.start)
        t3 = _now_ms()

        # Acceptance rule (greedy, lossless): start at the root; while the target's argmax after the
        # current node is the token of one of its children, move to that child (an accepted draft).
        # The target's argmax at the last node reached is committed too: the bonus token if that node
        # has no children, the correction otherwise. Every committed token is thus the target's argmax.
        argmax = logits.argmax(dim=-1).tolist()
        path = [0]
        while argmax[path[-1]] in tree.children[path[-1]]:
            path.append(tree.children[path[-1]][argmax[path[-1]]])
        committed = [tree.tokens[node - 1] for node in path[1:]] + [argmax[path[-1]]]
        committed = self._cut_at_stop(committed, remaining)

        # Commit: the root and the accepted nodes whose successors were kept enter the cache; the last
        # committed token becomes the next pending root.
        kept_nodes = path[: len(committed)]
        self.adapter.commit(state.start, kept_nodes)
        state.new_features = None if features is None else features[kept_nodes]
        record_args = dict(round_index=len(state.rounds), start_position=len(state.output),
                           context_len=state.start, tree_nodes=tree.n_nodes, tree_depth=tree.max_depth,
                           accepted=len(path) - 1 if len(committed) == len(path) else len(committed),
                           committed_ids=committed, ends_at_leaf=not tree.children[path[len(committed) - 1]])
        state.output.extend(committed)
        state.start += len(committed)
        state.root = committed[-1]
        t4 = _now_ms()
        timings = dict(draft_ms=t1 - t0, verify_ms=t3 - t2, overhead_ms=(t2 - t1) + (t4 - t3))
        self._finish_round(state, record_args, timings, logits[kept_nodes], proposal, expected)

    # --- the steps of a round ---------------------------------------------------------------------

    def _propose(self, state: "_RequestState") -> DraftProposal | None:
        if self.drafter is None:
            return None
        tokens = state.prompt_ids + state.output  # ends with the pending root
        proposal = self.drafter.propose(tokens, state.new_features)
        state.new_features = None
        return proposal

    def _plan_tree(self, proposal: DraftProposal | None, state: "_RequestState",
                   remaining: int) -> tuple[Tree, DraftProposal | None, float]:
        """Tree for this round, or an empty tree when drafting is not expected to pay."""
        if proposal is None or proposal.depth == 0:
            return Tree.empty(), None, 0.0
        # drafts deeper than the token budget or the context could never be committed
        usable_depth = remaining - 1
        if self.adapter.max_context is not None:
            usable_depth = min(usable_depth, self.adapter.max_context - 1 - state.start)
        proposal = truncate_proposal(proposal, max(usable_depth, 0))
        if proposal.depth == 0:
            return Tree.empty(), None, 0.0
        tree, expected = plan_verification(proposal, self._build_tree(proposal), verify_cost=self.verify_cost,
                                           min_expected_accepted=self.min_expected_accepted)
        if tree.n_nodes == 0:
            return Tree.empty(), None, expected
        return tree, truncate_proposal(proposal, tree.max_depth), expected

    def _build_tree(self, proposal: DraftProposal) -> Tree:
        if callable(self.tree_policy):
            return self.tree_policy(proposal, self.budget)
        return build_tree(proposal, self.tree_policy, self.budget)

    def _cut_at_stop(self, committed: list[int], remaining: int) -> list[int]:
        """Stop exactly where plain greedy decoding would: after the first EOS, at the token budget."""
        committed = committed[:remaining]
        for i, token in enumerate(committed):
            if token in self.eos_token_ids:
                return committed[: i + 1]
        return committed

    def _emit_prefill_round(self, state: "_RequestState", last_logits: torch.Tensor) -> None:
        record_args = dict(round_index=0, start_position=0, context_len=len(state.prompt_ids) - 1,
                           tree_nodes=0, tree_depth=0, accepted=0, committed_ids=[state.root],
                           ends_at_leaf=True)
        timings = dict(draft_ms=0.0, verify_ms=0.0, overhead_ms=0.0)
        self._finish_round(state, record_args, timings, last_logits.unsqueeze(0), None, 0.0, prefill=True)

    def _finish_round(self, state, record_args: dict, timings: dict, path_logits: torch.Tensor,
                      proposal: DraftProposal | None, expected: float, prefill: bool = False) -> None:
        stats = RoundStats(round_index=record_args["round_index"], start_position=record_args["start_position"],
                           context_len=record_args["context_len"], tree_nodes=record_args["tree_nodes"],
                           tree_depth=record_args["tree_depth"], accepted=record_args["accepted"],
                           committed=len(record_args["committed_ids"]), expected_accepted=expected,
                           drafted=proposal is not None, **timings)
        state.rounds.append(stats)
        if not self.observers:
            return
        record = RoundRecord(request_id=state.request_id, block_size=self.block_size, target_logits=path_logits,
                             draft=proposal, extra={"prefill": prefill, "expected_accepted": expected},
                             **record_args, **timings)
        for obs in self.observers:
            obs.on_round(record)


class ARDecoder(SpeculativeDecoder):
    """The lean autoregressive baseline: ``SpeculativeDecoder`` without a drafter (one-token forwards on
    the same adapter, same timers, token counting and observers)."""

    def __init__(self, target, *, observers: Sequence[Observer] = (), eos_token_ids=None, tokenizer=None):
        super().__init__(target, None, observers=observers, eos_token_ids=eos_token_ids, tokenizer=tokenizer)


@dataclass
class _RequestState:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    output: list[int]  # committed new tokens; the last one is the pending root (not yet in the cache)
    root: int
    start: int  # cache length = absolute position of the root
    new_features: torch.Tensor | None  # features of the last accepted path, not yet given to the drafter
    rounds: list[RoundStats] = field(default_factory=list)
