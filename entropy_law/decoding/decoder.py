"""Lossless greedy speculative decoding online (the driver of ``round.play_round``), and the lean AR baseline.

The target verifies each round's tree in one forward; the correct token after a node is its argmax there, so the
output is the greedy output whatever the drafter proposes. The prefill's argmax (the pending root) is round 0:
every output position has exactly one target logit row in exactly one round.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from entropy_law.decoding.adapter import TargetAdapter
from entropy_law.decoding.gate import RatioGate, measure_verify_cost, timer_for
from entropy_law.decoding.interface import DraftProposal, Drafter
from entropy_law.decoding.loading import model_of
from entropy_law.decoding.policy import HybridLawPolicy, LawPolicy, check_policy, make_policy
from entropy_law.decoding.round import (Observer, RequestState, Round, RoundPolicy, RoundRules, now_ms, play_round,
                                        policy_config, prefill_round)
from entropy_law.decoding.tree import Tree


@dataclass
class GenerationResult:
    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]  # the new tokens only
    text: str
    rounds: list[Round]  # bare records (no tensors)
    prefill_ms: float
    decode_ms: float  # wall time of all rounds after the prefill (observers included)
    stop_reason: str  # "eos" | "max_new_tokens" | "context_full"
    config: dict

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def target_forwards(self) -> int:  # verify passes after the prefill
        return sum(1 for r in self.rounds if r.round_index > 0)

    @property
    def mean_committed_per_round(self) -> float:  # round 0, the prefill, excluded
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


class SpeculativeDecoder:
    """Greedy lossless speculative decoding; ``drafter=None`` is the lean autoregressive baseline.

    ``target``: a ``LoadedTarget``, a ``TargetAdapter`` or a bare causal LM. ``tree``: ``"chain"``, ``"ddtree"``
    or a callable ``(proposal, budget) -> Tree``; ``budget``: most draft nodes per tree. ``policy``: a
    ``round.RoundPolicy`` (default ``gate.RatioGate()``), or law parameters (``payoff.policy.fit_policy``),
    checked against the drafter and target; the output is the greedy output whatever it decides. ``observers``:
    every request's start and end and every round. ``eos_token_ids`` / ``tokenizer``: default the model's."""

    def __init__(self, target, drafter: Drafter | None = None, *, tree: str | Callable = "chain",
                 budget: int | None = None, policy: RoundPolicy | dict | None = None,
                 observers: Sequence[Observer] = (), eos_token_ids: Sequence[int] | int | None = None,
                 tokenizer=None):
        if isinstance(target, TargetAdapter):
            self.adapter = target
        else:
            self.adapter = TargetAdapter(model_of(target))  # a LoadedTarget (.model, .tokenizer) or a causal LM
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
        RoundRules.check_tree(tree, budget, drafting=drafter is not None)  # before a verify-cost measurement
        self.rules = RoundRules.make(tree, budget, drafting=drafter is not None,
                                     eos_token_ids=self._default_eos(eos_token_ids),
                                     max_context=self.adapter.max_context,
                                     policy=self._bound_policy(policy, target, drafter))
        self.observers = list(observers)

    def _bound_policy(self, policy, target, drafter) -> RoundPolicy:
        """The round policy bound to this adapter and drafter: law parameters become a law policy (checked against
        the drafter and the target first, priced with the curve they store, else this machine's, measured now)."""
        if policy is None:
            return RatioGate()
        is_law = isinstance(policy, (dict, LawPolicy, HybridLawPolicy))
        if is_law and drafter is None:
            return RatioGate()  # nothing is drafted: a law has nothing to decide
        if is_law:  # before measuring costs; a loaded target's short name (a bare module's class name says nothing)
            check_policy(policy, drafter, getattr(target, "model_id", None))
        if isinstance(policy, dict):
            curve = measure_verify_cost(self.adapter) if policy.get("verify_cost") is None else None
            policy = make_policy(policy, curve, drafter)
        return policy.bind(self.adapter, drafter) if callable(getattr(policy, "bind", None)) else policy

    def _default_eos(self, eos):  # given, else the model's generation config's, else its config's
        if eos is None:
            model = self.adapter.model
            gen = getattr(model, "generation_config", None)
            eos = getattr(gen, "eos_token_id", None) if gen is not None else None
            if eos is None:
                eos = getattr(model.config, "eos_token_id", None)
        return eos

    tree_policy = property(lambda self: self.rules.tree)
    budget = property(lambda self: self.rules.budget)
    policy = property(lambda self: self.rules.policy)
    verify_cost = property(lambda self: getattr(self.rules.policy, "verify_cost", None))  # the curve it prices by
    min_expected_accepted = property(lambda self: getattr(self.rules.policy, "min_expected_accepted", None))
    eos_token_ids = property(lambda self: self.rules.eos_token_ids)

    @property
    def config(self) -> dict:
        drafter = self.drafter
        return {
            "model_id": self.model_id,
            "drafter_id": getattr(drafter, "drafter_id", "none") if drafter is not None else "none",
            "block_size": self.block_size,
            "tree_policy": self.tree_policy if isinstance(self.tree_policy, str) else repr(self.tree_policy),
            "budget": self.budget,
            **policy_config(self.policy),  # a gate's settings, or any other policy's under "policy"
            "eos_token_ids": sorted(self.eos_token_ids),
            "feature_layers": list(self.adapter.feature_layers),
            "dtype": str(self.adapter.dtype).replace("torch.", ""),
            "attention": self.adapter.attention_kernel,
        }

    @property
    def block_size(self) -> int:
        return int(self.drafter.block_size) if self.drafter is not None else 1

    def encode_prompt(self, prompt, *, raw_prompt: bool = False) -> list[int]:
        """Token ids for a prompt: ids (ints or a tensor) as given; chat messages or a string (one user message)
        through the chat template with the generation prompt; ``raw_prompt=True``: a string tokenized as is."""
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

    def generate(self, prompt, *, max_new_tokens: int, category: str = "", request_id: str | None = None,
                 raw_prompt: bool = False, dataset: str = "", question_id: str = "",
                 image_tokens: int = 0) -> GenerationResult:
        """Decode greedily up to ``max_new_tokens`` new tokens (fewer at EOS or when the context is full)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
            raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
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
                                              "prompt_ids": [int(t) for t in prompt_ids],
                                              "image_tokens": image_tokens, "config": self.config})

        logged = 0  # new tokens of the rounds every observer has received

        def emit(record: Round) -> None:  # keep the round (bare); hand it, with its tensors, to the observers
            nonlocal logged
            state.rounds.append(record.bare())
            for obs in self.observers:
                obs.on_round(record)
            logged += record.committed

        try:
            t0 = now_ms()
            last_logits, prompt_features = self.adapter.prefill(prompt_ids)
            if self.drafter is not None:
                self.drafter.begin(prompt_ids, prompt_features)
            prefill_ms = now_ms() - t0

            state = RequestState(prompt_ids=prompt_ids, max_new_tokens=max_new_tokens,
                                 output=[int(last_logits.argmax())], start=len(prompt_ids), request_id=request_id,
                                 block_size=self.block_size, category=category, dataset=dataset)
            self.rules.policy.begin_request(state)
            self.rules.policy.observe(state.entropies, 1, last_logits.unsqueeze(0))  # the first new token's entropy
            target = _TargetVerifier(self.adapter)
            propose = target.proposer(self.drafter)
            t_decode, cpu_decode = now_ms(), time.process_time()
            emit(prefill_round(state, last_logits.unsqueeze(0)))
            stop = self.rules.stop_reason(state)
            while stop is None:
                emit(play_round(state, self.rules, propose, target))
                stop = self.rules.stop_reason(state)
            decode_ms = now_ms() - t_decode
            decode_cpu_ms = (time.process_time() - cpu_decode) * 1000.0
        except Exception as err:  # close the request for the observers (a recorder keeps the run consistent)
            self._end_with_error(request_id, logged, err)
            raise

        for obs in self.observers:
            obs.on_request_end(request_id, {"new_tokens": len(state.output), "stop_reason": stop,
                                            "prefill_ms": prefill_ms, "decode_ms": decode_ms,
                                            "decode_cpu_ms": decode_cpu_ms})
        text = self.tokenizer.decode(state.output, skip_special_tokens=True) if self.tokenizer is not None else ""
        return GenerationResult(request_id=request_id, prompt_ids=prompt_ids, token_ids=list(state.output),
                                text=text, rounds=state.rounds, prefill_ms=prefill_ms, decode_ms=decode_ms,
                                stop_reason=stop, config=self.config)

    def _end_with_error(self, request_id: str, logged: int, err: Exception) -> None:
        """End a failed request with stop reason "error" for every observer, keeping the tokens they were given;
        an observer that cannot end it adds a note to ``err`` (re-raised by the caller)."""
        for obs in self.observers:
            try:
                obs.on_request_end(request_id, {"new_tokens": logged, "stop_reason": "error",
                                                "prefill_ms": 0.0, "decode_ms": 0.0})
            except Exception as end_err:
                if hasattr(err, "add_note"):
                    err.add_note(f"{type(obs).__name__} could not end request {request_id!r}: {end_err}")


class _TargetVerifier:
    """The online source of correct tokens (the target's argmax after each node, from one forward over root and
    tree); carries the accepted path's target features to the drafter's next proposal."""

    def __init__(self, adapter: TargetAdapter):
        self.adapter = adapter
        self.logits: torch.Tensor | None = None
        self.features: torch.Tensor | None = None
        self.new_features: torch.Tensor | None = None  # the last accepted path's features, not yet drafted from

    def proposer(self, drafter: Drafter | None) -> Callable[[list[int]], DraftProposal | None]:
        if drafter is None:
            return lambda tokens: None

        def propose(tokens: list[int]) -> DraftProposal:
            features, self.new_features = self.new_features, None
            return drafter.propose(tokens, features)
        return propose

    def verify(self, state: RequestState, tree: Tree):
        self.logits, self.features = self.adapter.verify(state.output[-1], tree, state.start)
        argmax = self.logits.argmax(dim=-1).tolist()
        return lambda node, depth: argmax[node]

    def commit(self, state: RequestState, kept_nodes: list[int]) -> torch.Tensor:
        self.adapter.commit(state.start, kept_nodes)
        if self.features is not None:  # accumulate over rounds that did not draft (a policy may skip the drafter)
            kept = self.features[kept_nodes]
            self.new_features = kept if self.new_features is None else torch.cat([self.new_features, kept])
        return self.logits[kept_nodes]


class ARDecoder(SpeculativeDecoder):
    """The lean autoregressive baseline: ``SpeculativeDecoder`` without a drafter."""

    def __init__(self, target, *, observers: Sequence[Observer] = (), eos_token_ids=None, tokenizer=None):
        super().__init__(target, None, observers=observers, eos_token_ids=eos_token_ids, tokenizer=tokenizer)


class _TimedDrafter:
    """A drafter whose ``propose`` calls are timed by ``now`` (``spent``, seconds); everything else is the drafter's."""

    def __init__(self, drafter: Drafter):
        self._drafter = drafter
        self.now: Callable[[], float] = time.thread_time
        self.spent: list[float] = []

    def __getattr__(self, name):
        return getattr(self._drafter, name)

    def propose(self, tokens: Sequence[int], new_features: torch.Tensor | None) -> DraftProposal:
        t0 = self.now()
        proposal = self._drafter.propose(tokens, new_features)
        self.spent.append(self.now() - t0)
        return proposal


def measure_draft_cost(target, drafter: Drafter, prompt_ids: Sequence[int], *, max_new_tokens: int = 32,
                       repeats: int = 3, clock: str = "auto") -> float:
    """A law policy's ``draft_cost`` on this machine: the median ``propose`` call of a chain decode of
    ``prompt_ids`` over an AR step, both by one clock (``gate.timer_for``), fastest of ``repeats`` warm passes."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if max_new_tokens < 2:
        raise ValueError(f"max_new_tokens must be >= 2 (one step after the prefill at least), got {max_new_tokens}")
    timed = _TimedDrafter(drafter)
    spec = SpeculativeDecoder(target, timed, tree="chain", policy=RatioGate(min_expected_accepted=0.0))
    ar = ARDecoder(target)
    now, _ = timer_for(spec.adapter, clock)
    timed.now = now
    step, draft = math.inf, math.inf
    for rep in range(repeats + 1):  # the first pass warms up
        t0 = now()
        ar.generate(prompt_ids, max_new_tokens=1)  # the prefill alone
        t1 = now()
        steps = len(ar.generate(prompt_ids, max_new_tokens=max_new_tokens).rounds) - 1  # round 0 is the prefill
        t2 = now()
        timed.spent.clear()
        spec.generate(prompt_ids, max_new_tokens=max_new_tokens)
        if steps < 1 or not timed.spent:
            raise ValueError("the prompt's greedy continuation stops at its first token: time the drafter on a prompt "
                             "that the target continues")
        if rep:
            step = min(step, ((t2 - t1) - (t1 - t0)) / steps)
            draft = min(draft, sorted(timed.spent)[len(timed.spent) // 2])
    if not step > 0:
        raise RuntimeError("the target's steps took no measurable time on this clock; pass clock='wall'")
    return draft / step
