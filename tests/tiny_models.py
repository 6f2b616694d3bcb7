"""Helpers for the decoding tests around the tiny targets: seeded prompts, the Hugging Face greedy reference,
a random tree policy, and fakes that collect what a recorder or an observer is given.

The tiny Llama builder, the oracle drafter and the ``single_thread`` fixture live in ``tests/conftest.py``.
"""

from __future__ import annotations

import torch

from entropy_law.decoding.tree import Tree


def random_prompt(generator: torch.Generator, vocab: int, length: int) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """Hugging Face ``generate(do_sample=False)``: the independent greedy reference."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=eos_token_id,
                         pad_token_id=eos_token_id if eos_token_id is not None else 0)
    return out[0, len(prompt):].tolist()


@torch.inference_mode()
def first_divergence_margin(model, prompt: list[int], a: list[int], b: list[int]) -> tuple[int, float] | None:
    """``None`` if equal; else (first differing index, target top-1 minus top-2 logit at that position).

    Sequences that agree but stop at different lengths get an infinite margin (a stopping bug, not
    numerics)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            logits = model(torch.tensor([prompt + a[:i]])).logits[0, -1].float()
            top = logits.topk(2).values
            return i, float(top[0] - top[1])
    if len(a) != len(b):
        return min(len(a), len(b)), float("inf")
    return None


class RandomTreePolicy:
    """A tree policy that hangs proposal candidates at random places (seeded): any ancestor-closed shape."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, proposal, budget):
        tokens, parents, depths, used = [], [], [], {0: set()}
        budget = budget if budget is not None else proposal.depth
        for _ in range(budget):
            open_nodes = [j for j in range(len(tokens) + 1)
                          if (0 if j == 0 else depths[j - 1]) < proposal.depth]
            parent = open_nodes[int(torch.randint(len(open_nodes), (), generator=self.generator))]
            depth = 1 if parent == 0 else depths[parent - 1] + 1
            free = [t for t in proposal.tokens[depth - 1].tolist() if t not in used[parent]]
            if not free:
                continue
            token = free[int(torch.randint(len(free), (), generator=self.generator))]
            used[parent].add(token)
            used[len(tokens) + 1] = set()
            tokens.append(token)
            parents.append(parent)
            depths.append(depth)
        return Tree(tuple(tokens), tuple(parents), tuple(depths))


class FakeRecorder:
    """Collects what a ``TraceRecorder`` would be given."""

    def __init__(self):
        self.requests, self.rounds, self.ends = {}, [], {}

    def begin_request(self, request_id, **info):
        self.requests[request_id] = info

    def log_round(self, request_id, **row):
        self.rounds.append({"request_id": request_id, **row})

    def end_request(self, request_id, **info):
        self.ends[request_id] = info


class ListObserver:
    """A test observer that keeps every Round it receives."""

    def __init__(self):
        self.records = []

    def on_request_start(self, request_id, info):
        pass

    def on_round(self, record):
        self.records.append(record)

    def on_request_end(self, request_id, info):
        pass


def random_tree(generator: torch.Generator, n_nodes: int, vocab: int, max_depth: int = 6) -> Tree:
    """A random tree: each new node hangs under a random earlier node, with a token unused among siblings."""
    tokens, parents, depths = [], [], []
    children: dict[int, set[int]] = {0: set()}
    for i in range(1, n_nodes + 1):
        candidates = [j for j in range(i) if (0 if j == 0 else depths[j - 1]) < max_depth]
        parent = candidates[int(torch.randint(len(candidates), (1,), generator=generator))]
        while True:
            token = int(torch.randint(vocab, (1,), generator=generator))
            if token not in children[parent]:
                break
        children[parent].add(token)
        children[i] = set()
        tokens.append(token)
        parents.append(parent)
        depths.append(1 if parent == 0 else depths[parent - 1] + 1)
    return Tree(tuple(tokens), tuple(parents), tuple(depths))
