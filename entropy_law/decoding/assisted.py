"""Assisted generation in transformers, recorded: a streamer that logs every verify round to a ``TraceRecorder``.

The streamer sees the prompt, then each round's ``n_matches + 1`` committed ids; the target and drafter statistics
come from one teacher-forced pass of each model afterwards. A round's draft length is the assistant's constant
``num_assistant_tokens`` (required, no confidence cut), capped as transformers caps it and shorter where the
assistant's greedy draft is EOS. Assumes greedy decoding of both models, batch 1 and one tokenizer.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch
from transformers.generation.streamers import BaseStreamer

from entropy_law.decoding.replay import teacher_forced_logits


class AssistedRecorder(BaseStreamer):
    """Log one request of transformers assisted generation: pass it as ``streamer=`` to ``generate``::

        assistant.generation_config.num_assistant_tokens = 4
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0
        streamer = AssistedRecorder(recorder, model, assistant, request_id="q1", category="math", max_new_tokens=128)
        model.generate(**inputs, assistant_model=assistant, streamer=streamer, max_new_tokens=128, do_sample=False)

    ``recorder``: a ``TraceRecorder``; ``target``: the model that generates. The request is written at ``end()``;
    one recorder per ``generate`` call."""

    def __init__(self, recorder, target, assistant_model, *, request_id: str, category: str, max_new_tokens: int,
                 dataset: str = "", question_id: str = "", eos_token_id: int | Sequence[int] | None = None):
        self.draft_tokens = _constant_draft_length(assistant_model)
        if int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (the value passed to generate); got {max_new_tokens}")
        self.recorder = recorder
        self.target = target
        self.assistant_model = assistant_model
        self.request_id = request_id
        self.info = {"category": category, "dataset": dataset, "question_id": question_id}
        self.max_new_tokens = int(max_new_tokens)
        if eos_token_id is None:
            model = target if isinstance(target, torch.nn.Module) else getattr(target, "model", None)
            eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos_ids = set() if eos_token_id is None else (
            {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id})
        self.prompt_ids: list[int] | None = None
        self.round_ids: list[list[int]] = []
        self.rounds: list[dict] = []
        self._started = 0.0
        self._ended = False

    def put(self, value) -> None:
        if self._ended:
            raise RuntimeError(f"AssistedRecorder for request {self.request_id!r} has ended; use one recorder per "
                               "generate() call")
        ids = _ids(value)
        if self.prompt_ids is None:  # transformers puts the prompt first
            if not ids:
                raise ValueError("empty prompt: assisted generation needs at least one prompt token")
            self.prompt_ids = ids
            self._started = time.perf_counter()
        elif ids:
            self.round_ids.append(ids)

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        decode_ms = (time.perf_counter() - self._started) * 1e3
        if self.prompt_ids is None:
            raise RuntimeError(f"AssistedRecorder for request {self.request_id!r} saw no tokens; pass it to "
                               "generate() as streamer=")
        output = [t for ids in self.round_ids for t in ids]
        stop_reason = self._stop_reason(output)
        target_logits = teacher_forced_logits(self.target, self.prompt_ids, output)
        assistant_logits = teacher_forced_logits(self.assistant_model, self.prompt_ids, output)
        if max(output) >= assistant_logits.shape[1]:
            raise ValueError(f"request {self.request_id!r}: output token {max(output)} is outside the assistant's "
                             f"vocabulary ({assistant_logits.shape[1]}); AssistedRecorder needs an assistant with the "
                             "target's tokenizer")
        drafted_argmax = assistant_logits.argmax(dim=-1).tolist()
        rounds = self._plan(output, stop_reason, drafted_argmax)

        rec = self.recorder
        rec.begin_request(self.request_id, prompt_tokens=len(self.prompt_ids),
                          prompt_ids=[int(t) for t in self.prompt_ids], **self.info)
        for rnd in rounds:
            start, committed = rnd["start_position"], len(rnd["token_ids"])
            drafted_rows = min(committed, rnd["tree_depth"])
            rec.log_round(self.request_id, round_index=rnd["round_index"], start_position=start,
                          context_len=len(self.prompt_ids) + start - 1, block_size=self.draft_tokens + 1,
                          tree_nodes=rnd["tree_depth"], tree_depth=rnd["tree_depth"], accepted=rnd["accepted"],
                          token_ids=rnd["token_ids"], ends_at_leaf=rnd["ends_at_leaf"],
                          target_logits=target_logits[start:start + committed].numpy(),
                          draft_logits=(assistant_logits[start:start + drafted_rows].numpy()
                                        if drafted_rows else None))
        rec.end_request(self.request_id, new_tokens=len(output), stop_reason=stop_reason, prefill_ms=0.0,
                        decode_ms=decode_ms)
        self.rounds = rounds

    def _stop_reason(self, output: list[int]) -> str:
        if not output:
            raise ValueError(f"request {self.request_id!r}: generate() produced no token")
        if output[-1] in self.eos_ids:
            return "eos"
        if len(output) == self.max_new_tokens:
            return "max_new_tokens"
        raise ValueError(f"request {self.request_id!r}: the output has {len(output)} tokens, does not end at EOS "
                         f"{sorted(self.eos_ids)} and is not max_new_tokens = {self.max_new_tokens} long: pass "
                         "AssistedRecorder the max_new_tokens (and eos_token_id) given to generate(); other stopping "
                         "criteria (stop strings, max_time) have no trace stop reason")

    def _plan(self, output: list[int], stop_reason: str, drafted_argmax: list[int]) -> list[dict]:
        """Each round's tau, draft depth and whether its last token is the target's correction or a bonus."""
        rounds, start = [], 0
        last = len(self.round_ids) - 1
        for index, ids in enumerate(self.round_ids):
            committed = len(ids)
            depth = max(0, min(self.draft_tokens, self.max_new_tokens - start - 1))  # transformers' cap
            if committed - 1 > depth:
                raise ValueError(f"request {self.request_id!r}: round {index} committed {committed} tokens, more than "
                                 f"a draft of {depth} allows; the assistant drafted more than num_assistant_tokens = "
                                 f"{self.draft_tokens}, or max_new_tokens differs from generate()'s")
            accepted = committed - 1
            tail = start + committed - 1  # output position of the round's last token
            drafted_eos_there = committed <= depth and drafted_argmax[tail] in self.eos_ids
            if index == last and stop_reason == "eos" and drafted_eos_there:
                # transformers cut the round after an accepted EOS draft: every committed token was a draft
                accepted = depth = committed
            elif drafted_eos_there:
                depth = committed  # the assistant stopped drafting at its EOS, which the target rejected
            rounds.append({"round_index": index, "start_position": start, "token_ids": list(ids),
                           "tree_depth": depth, "accepted": accepted,
                           "ends_at_leaf": accepted == depth})
            start += committed
        return rounds


def _constant_draft_length(assistant_model) -> int:
    """The assistant's draft length, refused unless every round drafts it (constant schedule, no confidence cut)."""
    config = getattr(assistant_model, "generation_config", None)
    if config is None:
        raise TypeError("assistant_model must be a transformers model with a generation_config (the one passed to "
                        "generate(assistant_model=...))")
    length = config.num_assistant_tokens
    schedule = config.num_assistant_tokens_schedule
    threshold = config.assistant_confidence_threshold
    problems = []
    if isinstance(length, bool) or not isinstance(length, (int, float)) or length < 1 or int(length) != length:
        problems.append(f"num_assistant_tokens = {length!r} (set the draft length, e.g. 4)")
    if schedule != "constant":
        problems.append(f"num_assistant_tokens_schedule = {schedule!r} (set \"constant\": the heuristic schedules "
                        "change the draft length between rounds)")
    if threshold is None or threshold != 0:
        problems.append(f"assistant_confidence_threshold = {threshold!r} (set 0: transformers' default 0.4 ends a "
                        "draft early at a confidence the streamer cannot see)")
    if problems:
        raise ValueError("AssistedRecorder needs the draft length of every round, which a streamer cannot see; set "
                         "on assistant_model.generation_config: " + "; ".join(problems))
    return int(length)


def _ids(value) -> list[int]:
    """Token ids of one ``put``: a tensor or list of shape ``[k]`` or ``[1, k]`` (assisted decoding is batch 1)."""
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if tensor.dim() == 2:
        if tensor.shape[0] != 1:
            raise ValueError(f"AssistedRecorder records one sequence; got a batch of {tensor.shape[0]}")
        tensor = tensor[0]
    if tensor.dim() != 1:
        raise ValueError(f"expected token ids of shape [k] or [1, k]; got {tuple(tensor.shape)}")
    return [int(t) for t in tensor.tolist()]


__all__ = ["AssistedRecorder"]
