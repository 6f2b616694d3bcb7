"""What the decoding and drafter tests share: the one tiny Llama builder, the oracle drafter, and the
``single_thread`` fixture.

Test modules import the helpers with ``from conftest import tiny_llama, OracleDrafter`` (pytest's default
``prepend`` import mode puts ``tests/`` on ``sys.path`` when it loads this file). torch and transformers are
imported inside the helpers, so the analysis tests, which never build a model, do not pay for them.
"""

from __future__ import annotations

import math

import pytest

# the slowest files first, so that under `make test` (pytest-xdist, whole files to a worker) they start at
# once and the short files fill the other worker around them, instead of one worker finishing them alone
_SLOW_FILES = ("test_exactness_real.py", "test_second_model_real.py", "test_replay_real.py", "test_report.py",
               "test_block_drafter_real.py", "test_notebooks.py", "test_law_cost.py", "test_loading_cache.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(_SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="module", autouse=False)
def single_thread():
    """Run a module's tiny-model tests on one torch thread (restored afterwards): tiny ops gain nothing
    from a second thread, and on shared cores the threads wait on each other at every op."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def load_bench(name: str):
    """A script of ``bench/`` imported as a module (the scripts are not a package), for tests of its functions."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def tiny_llama(seed: int = 0, *, vocab: int = 128, hidden: int = 64, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, max_positions: int = 512, init_std: float = 0.2, tie_embeddings: bool = False,
               bos_token_id: int | None = None, eos_token_id: int | None = None, pad_token_id: int | None = None):
    """A small ``LlamaForCausalLM`` (fp32, eager attention, CPU) whose weights depend only on its arguments.

    ``init_std`` above the HF default (0.02) gives peaked, prompt-dependent next-token distributions, so
    greedy outputs are not one repeated token. ``pad_token_id`` is the embedding's padding row (zeroed at
    init, so it changes the weights); the generation config pads with it, else with EOS, else with 0.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        initializer_range=init_std, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
        pad_token_id=pad_token_id, tie_word_embeddings=tie_embeddings, attn_implementation="eager",
    )
    torch.manual_seed(seed)  # HF initialises weights from the global generator; reseed for determinism
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = next(
        (token for token in (pad_token_id, eos_token_id) if token is not None), 0)
    return model


class OracleDrafter:
    """Knows the reference continuation ``reference`` of the prompt it is begun with, and proposes it.

    ``p_correct``: probability that the true token is among a depth's ``k`` candidates (at a random rank;
    the other candidates are random tokens). ``stated_prob``: the probability the proposal states for every
    candidate, so the gate's expected acceptance is known; ``None``: random, sorted, best first.
    Records what the decoder passed in (``begun_with``, ``calls``) for tests.
    """

    drafter_id = "oracle"

    def __init__(self, reference: list[int], *, block_size: int = 6, k: int = 1, p_correct: float = 1.0,
                 stated_prob: float | None = None, vocab: int = 128, seed: int = 0,
                 feature_layers: tuple[int, ...] = ()):
        import torch

        self.reference = list(reference)
        self.block_size = block_size
        self.k = k
        self.p_correct = p_correct
        self.stated_prob = stated_prob
        self.vocab = vocab
        self.generator = torch.Generator().manual_seed(seed)
        self.feature_layers = feature_layers
        self.calls: list[tuple[list[int], object]] = []

    def begin(self, prompt_ids, prompt_features):
        self.prompt_len = len(prompt_ids)
        self.begun_with = (list(prompt_ids), prompt_features)

    def propose(self, tokens, new_features):
        import torch

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
            rows.append(row)
            if self.stated_prob is None:
                probs = torch.rand(self.k, generator=self.generator).sort(descending=True).values
                logprob_rows.append((probs / (probs.sum() + 0.1)).log())
            else:
                logprob_rows.append(torch.full((self.k,), math.log(self.stated_prob)))
        if not rows:
            return DraftProposal.empty()
        return DraftProposal(tokens=torch.tensor(rows, dtype=torch.long), logprobs=torch.stack(logprob_rows))


# --- shared fits (speedA) ---


@pytest.fixture(scope="session")
def timed_analysis():
    """``TraceAnalysis(load_traces(data/traces_timed), n_boot=5)``, built once per test process for the tests that
    only read it (its laws, costs and speedups are cached on first use, as for one caller)."""
    import warnings
    from pathlib import Path

    from entropy_law.analysis import TraceAnalysis
    from entropy_law.traces.reader import load_traces

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TraceAnalysis(load_traces(Path(__file__).resolve().parents[1] / "data" / "traces_timed"), n_boot=5)
