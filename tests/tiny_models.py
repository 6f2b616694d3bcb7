"""Tiny randomly initialised Llama targets for decoding tests (seeded, CPU, fp32, eager attention)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=False)
def single_thread():
    """Run a module's tiny-model tests on one torch thread (restored afterwards): tiny ops gain nothing
    from a second thread, and on shared cores the threads wait on each other at every op."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_llama(seed: int = 0, *, vocab: int = 128, hidden: int = 64, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, max_positions: int = 512, eos_token_id: int | None = None,
               init_std: float = 0.2):
    """A small ``LlamaForCausalLM`` with explicit seed. ``init_std`` above the HF default (0.02) gives
    peaked, prompt-dependent next-token distributions, so greedy outputs are not one repeated token."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        initializer_range=init_std, eos_token_id=eos_token_id, bos_token_id=None, pad_token_id=None,
        tie_word_embeddings=False, attn_implementation="eager",
    )
    torch.manual_seed(seed)  # HF initialises weights from the global generator; reseed for determinism
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = eos_token_id if eos_token_id is not None else 0
    return model


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


class OracleDrafter:
    """Knows a reference continuation ``reference`` of ``prompt`` and proposes it (optionally noisy).

    ``p_correct``: probability that the true token is among a depth's ``k`` candidates (at a random rank;
    the other candidates are random tokens). Log-probabilities are random but sorted, best first.
    Records what the decoder passed in (``begun_with``, ``calls``) for tests.
    """

    drafter_id = "oracle"

    def __init__(self, reference: list[int], *, block_size: int = 6, k: int = 1, p_correct: float = 1.0,
                 vocab: int = 128, seed: int = 0, feature_layers: tuple[int, ...] = ()):
        self.reference = list(reference)
        self.block_size = block_size
        self.k = k
        self.p_correct = p_correct
        self.vocab = vocab
        self.generator = torch.Generator().manual_seed(seed)
        self.feature_layers = feature_layers
        self.calls: list[tuple[list[int], object]] = []

    def begin(self, prompt_ids, prompt_features):
        self.prompt_len = len(prompt_ids)
        self.begun_with = (list(prompt_ids), prompt_features)

    def propose(self, tokens, new_features):
        from entropy_law.decoding.interface import DraftProposal

        self.calls.append((list(tokens), new_features))
        done = len(tokens) - self.prompt_len  # output tokens so far, the pending root included
        truth = self.reference[done: done + self.block_size - 1]
        rows, logprob_rows = [], []
        for true_token in truth:
            row = torch.randperm(self.vocab, generator=self.generator)[: self.k + 1].tolist()
            row = [t for t in row if t != true_token][: self.k]
            if float(torch.rand((), generator=self.generator)) < self.p_correct:
                row[int(torch.randint(self.k, (), generator=self.generator))] = true_token
            probs = torch.rand(self.k, generator=self.generator).sort(descending=True).values
            rows.append(row)
            logprob_rows.append((probs / (probs.sum() + 0.1)).log())
        if not rows:
            return DraftProposal.empty()
        return DraftProposal(tokens=torch.tensor(rows, dtype=torch.long), logprobs=torch.stack(logprob_rows))


class RandomTreePolicy:
    """A tree policy that hangs proposal candidates at random places (seeded): any ancestor-closed shape."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, proposal, budget):
        from entropy_law.decoding.tree import Tree

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
    """A test observer that keeps every RoundRecord."""

    def __init__(self):
        self.records = []

    def on_request_start(self, request_id, info):
        pass

    def on_round(self, record):
        self.records.append(record)

    def on_request_end(self, request_id, info):
        pass
