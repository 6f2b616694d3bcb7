"""Offline replay: target statistics and speculative rounds from a prompt and its greedy output.

Known here: (1) one teacher-forced target pass over prompt + output gives the target's logits at
every output position (fp32; the logit row that produced output token i), hence the entropy the
decoder records there (the exogeneity property of greedy lossless decoding: it does not depend on
the drafter); (2) for drafters whose proposals depend only on the context (the n-gram drafter), the
round sequence of ``SpeculativeDecoder`` can be simulated without the target: the target's argmax
after any prefix of the greedy output is the next output token, so a round accepts the longest tree
path that spells the output, then commits the next output token.

The simulated round mirrors ``entropy_law.decoding.decoder.SpeculativeDecoder`` step by step: round 0
is the prefill (commits output token 0, no draft); each later round asks the drafter for a proposal
after prompt + output so far, cuts it to the depth that can still be committed (token budget,
context), builds the tree, lets the same gate as the decoder decide what to verify
(``entropy_law.decoding.gate.plan_verification``: the surrogate expected accepted count against
``verify_cost_ratio - 1`` / ``min_expected_accepted``, or the best prefix under a ``verify_cost``
curve), walks the tree, and stops at EOS / the
token budget / a full context exactly as the decoder does. Any change there must be mirrored here;
``tests/test_replay.py`` compares both round by round.

Not known here: drafters that read target features (a learned drafter needs its own training-mode
replay), timing (replayed rounds report 0 ms).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import pandas as pd
import torch

from entropy_law.decoding.interface import DraftProposal, Drafter, Observer, RoundRecord, drafter_run_config
from entropy_law.decoding.observers import distribution_stats
from entropy_law.decoding.gate import VerifyCost, plan_verification, truncate_proposal
from entropy_law.decoding.tree import TREE_POLICIES, Tree, build_tree, expected_accepted

TARGET_STAT_COLUMNS = ("target_entropy_nats", "target_renyi2_nats", "target_top1_prob", "target_top2_prob",
                       "target_logit_gap")


# --- teacher-forced target pass ----------------------------------------------------------------------

def _model_of(target) -> torch.nn.Module:
    return target if isinstance(target, torch.nn.Module) else target.model


@torch.no_grad()
def teacher_forced_logits(target, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> torch.Tensor:
    """``[len(output_ids), V]`` fp32: row i is the target's logit row after prompt + output[:i].

    One forward pass over ``prompt + output[:-1]``; only the last ``len(output)`` rows go through the
    LM head. ``target``: a ``LoadedTarget`` or a Hugging Face causal LM.
    """
    prompt_ids, output_ids = [int(t) for t in prompt_ids], [int(t) for t in output_ids]
    if not prompt_ids:
        raise ValueError("empty prompt: the first output token needs at least one prompt token")
    if not output_ids:
        raise ValueError("empty output: nothing to replay")
    model = _model_of(target)
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids + output_ids[:-1]], dtype=torch.long, device=device)
    out = model(input_ids=input_ids, use_cache=False, logits_to_keep=len(output_ids))
    logits = out.logits[0, -len(output_ids):].float()
    if logits.shape[0] != len(output_ids):
        raise RuntimeError(f"expected {len(output_ids)} logit rows, got {logits.shape[0]}")
    return logits.cpu()


def target_stats(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row target statistics under the trace column names (``target_entropy_nats`` ...).

    The same computation the recorder's observer uses (``observers.distribution_stats``: fp32
    log-softmax over the full vocabulary; Shannon and Renyi-2 entropies in nats, the two largest
    probabilities, the gap between the two largest logits).
    """
    stats = distribution_stats(logits)
    return {f"target_{key}": value for key, value in stats.items()}


def teacher_forced_target_stats(target, prompt_ids: Sequence[int], output_ids: Sequence[int], *,
                                logits: torch.Tensor | None = None) -> pd.DataFrame:
    """One row per output position: the target statistics that produced that token.

    Columns: ``position``, ``token_id``, ``target_argmax`` (equals ``token_id`` along a greedy output;
    ``is_greedy`` says so), ``target_margin`` (top-1 minus top-2 logit, the same as
    ``target_logit_gap``, kept for divergence reports) and the trace columns ``target_entropy_nats``,
    ``target_renyi2_nats``, ``target_top1_prob``, ``target_top2_prob``, ``target_logit_gap``.
    Pass ``logits`` (from ``teacher_forced_logits``) to skip the forward pass.
    """
    if logits is None:
        logits = teacher_forced_logits(target, prompt_ids, output_ids)
    stats = target_stats(logits)
    argmax = logits.argmax(dim=-1)
    frame = pd.DataFrame({
        "position": range(len(output_ids)),
        "token_id": [int(t) for t in output_ids],
        "target_argmax": argmax.tolist(),
    })
    frame["is_greedy"] = frame["token_id"] == frame["target_argmax"]
    for column in TARGET_STAT_COLUMNS:
        frame[column] = stats[column].numpy()
    return frame


# --- round simulation --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplayRound:
    """One simulated round (the fields of ``RoundRecord`` that do not need the target)."""

    round_index: int
    start_position: int  # output position of committed_ids[0]
    context_len: int  # target cache length before the round
    tree_nodes: int
    tree_depth: int
    accepted: int  # tau
    committed_ids: tuple[int, ...]
    ends_at_leaf: bool
    drafted: bool  # False: the gate declined (or no proposal): a plain one-token step
    expected_accepted: float  # the gate's surrogate (0 when nothing was proposed)

    @property
    def committed(self) -> int:
        return len(self.committed_ids)


@dataclass
class ReplayResult:
    """Rounds of one replayed request, with the proposals and trees behind them."""

    prompt_ids: list[int]
    output_ids: list[int]
    rounds: list[ReplayRound]
    proposals: list[DraftProposal | None]  # the proposal each round verified (None: no draft)
    trees: list[Tree]
    stop_reason: str
    config: dict = field(default_factory=dict)

    @property
    def accepted_lengths(self) -> list[int]:
        """tau of every round after the prefill."""
        return [r.accepted for r in self.rounds if r.round_index > 0]

    @property
    def mean_committed_per_round(self) -> float:
        decode_rounds = [r for r in self.rounds if r.round_index > 0]
        return sum(r.committed for r in decode_rounds) / len(decode_rounds) if decode_rounds else float("nan")

    @property
    def summary(self) -> pd.DataFrame:
        """One row per round."""
        rows = []
        for r in self.rounds:
            row = asdict(r)
            row["committed_ids"] = list(r.committed_ids)
            row["committed"] = r.committed
            rows.append(row)
        return pd.DataFrame(rows)


def _eos_set(eos_token_ids) -> frozenset[int]:
    if eos_token_ids is None:
        return frozenset()
    if isinstance(eos_token_ids, int):
        return frozenset([eos_token_ids])
    return frozenset(int(t) for t in eos_token_ids)


def replay_rounds(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    drafter: Drafter,
    tree: str | Callable[[DraftProposal, int | None], Tree] = "chain",
    budget: int | None = None,
    *,
    eos_token_ids: Sequence[int] | int | None = None,
    max_new_tokens: int | None = None,
    max_context: int | None = None,
    verify_cost_ratio: float = 2.0,
    min_expected_accepted: float | None = None,
    verify_cost: VerifyCost | None = None,
    should_draft: Callable[[DraftProposal, Tree], bool] | None = None,
) -> ReplayResult:
    """Simulate the decoder's rounds on a known greedy output.

    ``output_ids``: the greedy continuation of ``prompt_ids`` as the decoder produced it (new tokens
    only, ending with EOS or at the token budget). ``drafter``: a context-only drafter (its features
    are ``None`` here); it is restarted with ``begin``. ``tree`` / ``budget`` / ``verify_cost_ratio`` /
    ``min_expected_accepted`` / ``verify_cost`` / ``eos_token_ids`` have the decoder's meaning (a measured
    ``verify_cost`` is not re-measured: pass the curve the online run used, ``VerifyCost.from_config``); ``max_new_tokens``
    defaults to ``len(output_ids)``; ``max_context`` is the target's context length (``None``: no limit).
    ``should_draft(proposal, tree)`` replaces the expected-accepted gate when given.
    """
    prompt_ids, output_ids = [int(t) for t in prompt_ids], [int(t) for t in output_ids]
    if not prompt_ids:
        raise ValueError("empty prompt")
    if not output_ids:
        raise ValueError("empty output: the prefill always commits one token")
    if isinstance(tree, str) and tree not in TREE_POLICIES:
        raise ValueError(f"unknown tree policy {tree!r}; use one of {TREE_POLICIES} or a callable")
    if tree == "ddtree" and budget is None:
        raise ValueError("tree='ddtree' needs a node budget, e.g. budget=16")
    eos = _eos_set(eos_token_ids)
    max_new = len(output_ids) if max_new_tokens is None else int(max_new_tokens)
    if len(output_ids) > max_new:
        raise ValueError(f"output has {len(output_ids)} tokens, more than max_new_tokens={max_new}")
    early_eos = [i for i, t in enumerate(output_ids[:-1]) if t in eos]
    if early_eos:
        raise ValueError(f"output has EOS at position {early_eos[0]} before its end; greedy decoding stops there")
    if min_expected_accepted is not None:
        gate = float(min_expected_accepted)
    else:
        gate = 0.0 if verify_cost is not None else max(0.0, verify_cost_ratio - 1.0)

    def stop_reason(n_out: int, start: int) -> str | None:
        if output_ids[n_out - 1] in eos:
            return "eos"
        if n_out >= max_new:
            return "max_new_tokens"
        if max_context is not None and start >= max_context:
            return "context_full"
        return None

    drafter.begin(prompt_ids, None)
    n_out, start = 1, len(prompt_ids)  # committed output tokens; cache length (position of the root)
    rounds = [ReplayRound(round_index=0, start_position=0, context_len=len(prompt_ids) - 1, tree_nodes=0,
                          tree_depth=0, accepted=0, committed_ids=(output_ids[0],), ends_at_leaf=True,
                          drafted=False, expected_accepted=0.0)]
    proposals: list[DraftProposal | None] = [None]
    trees: list[Tree] = [Tree.empty()]
    stop = stop_reason(n_out, start)
    while stop is None:
        if n_out >= len(output_ids):
            raise ValueError(f"the output ends after {len(output_ids)} tokens without EOS, before "
                             f"max_new_tokens={max_new} and a full context: it is not a complete greedy output")
        remaining = max_new - n_out
        proposal = drafter.propose(prompt_ids + output_ids[:n_out], None)
        round_tree, used_proposal, expected = Tree.empty(), None, 0.0
        if proposal is not None and proposal.depth > 0:
            usable_depth = remaining - 1
            if max_context is not None:
                usable_depth = min(usable_depth, max_context - 1 - start)
            proposal = truncate_proposal(proposal, max(usable_depth, 0))
            if proposal.depth > 0:
                candidate = tree(proposal, budget) if callable(tree) else build_tree(proposal, tree, budget)
                if should_draft is not None:
                    expected = expected_accepted(proposal, candidate)
                    verified = candidate if candidate.n_nodes > 0 and should_draft(proposal, candidate) else None
                else:
                    verified, expected = plan_verification(proposal, candidate, verify_cost=verify_cost,
                                                           min_expected_accepted=gate)
                if verified is not None and verified.n_nodes > 0:
                    round_tree, used_proposal = verified, truncate_proposal(proposal, verified.max_depth)

        # walk: the target's argmax after the path so far is the next output token
        path = [0]
        while n_out + len(path) - 1 < len(output_ids):
            child = round_tree.children[path[-1]].get(output_ids[n_out + len(path) - 1])
            if child is None:
                break
            path.append(child)
        committed = output_ids[n_out:n_out + len(path)][:remaining]
        for i, token in enumerate(committed):
            if token in eos:
                committed = committed[:i + 1]
                break
        accepted = len(path) - 1 if len(committed) == len(path) else len(committed)
        rounds.append(ReplayRound(
            round_index=len(rounds), start_position=n_out, context_len=start, tree_nodes=round_tree.n_nodes,
            tree_depth=round_tree.max_depth, accepted=accepted, committed_ids=tuple(committed),
            ends_at_leaf=not round_tree.children[path[len(committed) - 1]], drafted=used_proposal is not None,
            expected_accepted=expected))
        proposals.append(used_proposal)
        trees.append(round_tree)
        n_out += len(committed)
        start += len(committed)
        stop = stop_reason(n_out, start)
    if n_out != len(output_ids):
        raise ValueError(f"decoding would stop ({stop}) after {n_out} tokens but the output has "
                         f"{len(output_ids)}: pass the eos_token_ids / max_new_tokens it was decoded with")
    config = {"drafter_id": getattr(drafter, "drafter_id", type(drafter).__name__),
              "drafter_config": drafter_run_config(drafter),
              "tree_policy": tree if isinstance(tree, str) else repr(tree), "budget": budget,
              "verify_cost_ratio": verify_cost_ratio, "min_expected_accepted": gate,
              "verify_cost": None if verify_cost is None else verify_cost.to_config(),
              "eos_token_ids": sorted(eos), "max_new_tokens": max_new, "max_context": max_context,
              "replayed": True}
    return ReplayResult(prompt_ids=prompt_ids, output_ids=output_ids, rounds=rounds, proposals=proposals,
                        trees=trees, stop_reason=stop, config=config)


def replay_request(
    target,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    drafter: Drafter,
    tree: str | Callable = "chain",
    budget: int | None = None,
    *,
    observers: Sequence[Observer] = (),
    request_id: str = "replay",
    category: str = "",
    dataset: str = "",
    question_id: str = "",
    image_tokens: int = 0,
    logits: torch.Tensor | None = None,
    **round_options,
) -> ReplayResult:
    """Replay one request and hand its rounds to observers as the decoder would (e.g. a recorder).

    One teacher-forced target pass supplies each round's ``target_logits`` (unless ``logits`` is
    given). Timings are 0 and every record carries ``extra={"replayed": True, ...}``; mark the run as
    replayed in the recorder's run metadata too (``replay_run_metadata``). ``round_options`` go to
    ``replay_rounds``.
    """
    result = replay_rounds(prompt_ids, output_ids, drafter, tree, budget, **round_options)
    if logits is None:
        logits = teacher_forced_logits(target, prompt_ids, output_ids)
    if logits.shape[0] != len(result.output_ids):
        raise ValueError(f"logits have {logits.shape[0]} rows for {len(result.output_ids)} output tokens")
    block_size = int(getattr(drafter, "block_size", 1))
    info = {"category": category, "dataset": dataset, "question_id": question_id,
            "prompt_tokens": len(result.prompt_ids), "image_tokens": image_tokens, "config": result.config}
    for obs in observers:
        obs.on_request_start(request_id, info)
    for r, proposal in zip(result.rounds, result.proposals):
        record = RoundRecord(
            request_id=request_id, round_index=r.round_index, start_position=r.start_position,
            context_len=r.context_len, block_size=block_size, tree_nodes=r.tree_nodes,
            tree_depth=r.tree_depth, accepted=r.accepted, committed_ids=list(r.committed_ids),
            ends_at_leaf=r.ends_at_leaf,
            target_logits=logits[r.start_position:r.start_position + r.committed],
            draft=proposal, draft_ms=0.0, verify_ms=0.0, overhead_ms=0.0,
            extra={"prefill": r.round_index == 0, "expected_accepted": r.expected_accepted, "replayed": True})
        for obs in observers:
            obs.on_round(record)
    end_info = {"new_tokens": len(result.output_ids), "stop_reason": result.stop_reason,
                "prefill_ms": 0.0, "decode_ms": 0.0}
    for obs in observers:
        obs.on_request_end(request_id, end_info)
    return result


def replay_run_metadata(drafter: Drafter, tree: str, budget: int | None, **extra) -> dict:
    """Run metadata for a ``TraceRecorder`` that receives replayed rounds (``replayed=True``)."""
    return {"drafter_id": getattr(drafter, "drafter_id", type(drafter).__name__),
            "drafter_config": drafter_run_config(drafter),
            "tree_policy": tree if isinstance(tree, str) else repr(tree),
            "tree_budget": budget, "replayed": True, **extra}
