"""The block drafter on targets other than SmolLM2: sliding-window and hybrid ones (Gemma 3, Mistral).

``entropy-law train-drafter --model FOLDER`` end to end (self-distilled data, a few training steps, the
saved drafter) on tiny randomly initialised models saved as local Hugging Face folders with a word-level
tokenizer: Gemma 3 (hybrid: sliding, full, sliding, sliding; a base model without a chat template, so
``--no-chat-template``; scaled embeddings, one RoPE base per layer type) and Mistral (every layer sliding;
with a chat template). The window (8) is shorter than the prompts, so every round decodes beyond it.
Oracles: Hugging Face greedy ``generate`` (its own sliding cache and masks) for the decoded tokens, and one
plain forward without a cache for the target features the drafter is given round by round.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from entropy_law.cli import main
from entropy_law.decoding.decoder import SpeculativeDecoder
from entropy_law.decoding.features import capture_features
from entropy_law.decoding.gate import RatioGate
from entropy_law.decoding.loading import load_target
from entropy_law.drafters.block import BlockDrafter, config_for_target, default_feature_layers
from entropy_law.drafters.training.loop import llama_shape_problem
from conftest import tiny_llama
from tests.tiny_models import hf_greedy

pytestmark = pytest.mark.usefixtures("single_thread")

WORDS = ("the cat dog sat on a mat and ran to red blue green house tree big small one two three four five "
         "is was very happy sad day night sun moon what how many write about text").split()
SPECIALS = ["<pad>", "<unk>", "<eos>", "<user>", "<assistant>"]
EOS = 2
CHAT_TEMPLATE = ("{% for m in messages %}<user> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
WINDOW = 8
MAX_NEW = 40


def make_target_folder(folder: Path, family: str) -> Path:
    """A tiny ``family`` model (window ``WINDOW``) and a word-level tokenizer saved as a Hugging Face folder;
    Gemma 3 gets no chat template (a base model), Mistral one."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM,
                              PreTrainedTokenizerFast)

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="<eos>")
    common = dict(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=WINDOW,
                  bos_token_id=None, eos_token_id=EOS, pad_token_id=0)
    if family == "gemma3":
        config = Gemma3TextConfig(**common, num_hidden_layers=4, initializer_range=0.5, tie_word_embeddings=False,
                                  layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                               "sliding_attention"])
        cls = Gemma3ForCausalLM
    elif family == "mistral":
        config = MistralConfig(**common, num_hidden_layers=3, initializer_range=0.2)
        cls = MistralForCausalLM
        tokenizer.chat_template = CHAT_TEMPLATE
    else:
        raise ValueError(family)
    torch.manual_seed(0)  # HF initialises weights from the global generator
    model = cls(config).eval()
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_gsm8k(path: Path, n: int = 12) -> Path:
    """A stand-in for the GSM8K train file: ``n`` questions made of the tokenizer's words."""
    rows = [{"question": f"how many {WORDS[i % 20]} and {WORDS[(3 * i + 1) % 20]} sat on the mat ? one two {i}",
             "answer": "#### 1"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_drafter(folder: Path, out: Path, gsm8k: Path, *extra: str) -> Path:
    argv = ["train-drafter", "--model", str(folder), "--out", str(out), "--gsm8k", str(gsm8k), "--seed", "0",
            "--n-gsm8k", "2", "--n-passages", "2", "--n-open", "2", "--n-translate", "2",
            "--max-new-tokens", "24", "--passage-max-new-tokens", "24", "--soft-topk", "4",
            "--gen-batch-size", "4", "--block-size", "5", "--layers", "1", "--steps", "6", "--batch-seqs", "2",
            "--anchors", "8", "--heldout", "1", "--eval-every", "3", "--save-every", "3", *extra]
    assert main(argv) == 0
    return out / "drafter.safetensors"


class FeatureLog:
    """Delegates to a drafter and keeps the target features the decoder hands it, in order."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.drafter_id, self.feature_layers, self.block_size = (drafter.drafter_id, drafter.feature_layers,
                                                                 drafter.block_size)
        self.rows: list[torch.Tensor] = []

    def begin(self, prompt_ids, prompt_features):
        self.rows = [prompt_features]
        self.drafter.begin(prompt_ids, prompt_features)

    def propose(self, tokens, new_features):
        if new_features is not None:
            self.rows.append(new_features)
        return self.drafter.propose(tokens, new_features)


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    return write_gsm8k(tmp_path_factory.mktemp("gsm8k") / "train.jsonl")


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_train_drafter_on_a_sliding_window_target_then_decode_exactly(family, gsm8k, tmp_path):
    folder = make_target_folder(tmp_path / f"tiny-{family}", family)
    extra = ("--no-chat-template",) if family == "gemma3" else ()
    checkpoint = train_drafter(folder, tmp_path / "run", gsm8k, *extra)

    plan = json.loads((tmp_path / "run" / "data" / "plan.json").read_text())
    target = load_target(folder)
    n_layers = target.config.num_hidden_layers
    assert plan["feature_layers"] == list(default_feature_layers(n_layers))  # chosen from the target's depth
    assert plan["plan"]["chat_template"] is (family == "mistral")
    result = json.loads((tmp_path / "run" / "train_result.json").read_text())
    assert result["steps"] == 6 and result["train_samples"] > 0

    drafter = BlockDrafter.load(checkpoint, target)
    assert drafter.feature_layers == tuple(plan["feature_layers"])
    log = FeatureLog(drafter)
    generator = torch.Generator().manual_seed(3)
    for tree, budget in (("chain", None), ("ddtree", 8)):
        prompt = torch.randint(len(SPECIALS), target.config.vocab_size, (20,), generator=generator).tolist()
        decoder = SpeculativeDecoder(target, log, tree=tree, budget=budget, policy=RatioGate(min_expected_accepted=0.0))
        out = decoder.generate(prompt, max_new_tokens=MAX_NEW)
        reference = hf_greedy(target.model, prompt, MAX_NEW, eos_token_id=EOS)
        assert out.token_ids == reference, (family, tree)  # speculative == greedy across the window
        assert len(out.rounds) > 1 and len(prompt) + len(out.token_ids) > 3 * WINDOW
        # the features the drafter was given, round by round, are those of one plain forward (no cache)
        given = torch.cat(log.rows)
        with torch.inference_mode(), capture_features(target.model, drafter.feature_layers) as cap:
            target.model(torch.tensor([prompt + out.token_ids]))
            expected = cap.features()[0]
        assert given.shape[0] > len(prompt) + WINDOW  # rows well past the window (all but the last round's)
        torch.testing.assert_close(given, expected[: given.shape[0]], atol=1e-4, rtol=1e-4)


def test_a_base_model_without_chat_template_needs_no_chat_template(gsm8k, tmp_path, capsys):
    folder = make_target_folder(tmp_path / "tiny-gemma3", "gemma3")
    code = main(["train-drafter", "--model", str(folder), "--out", str(tmp_path / "run"), "--gsm8k", str(gsm8k),
                 "--only", "data"])
    assert code != 0 and "--no-chat-template" in capsys.readouterr().err


def test_feature_layers_follow_the_target_depth():
    assert default_feature_layers(30) == (1, 14, 27)  # SmolLM2-135M (DFlash's formula)
    assert default_feature_layers(18) == (1, 8, 15)  # Gemma 3 270M
    assert default_feature_layers(28) == (1, 13, 25)  # Qwen3-0.6B
    # shallow targets: distinct layers spread over all of them (DFlash's formula would repeat layers)
    assert [default_feature_layers(n) for n in (1, 2, 3, 4, 5)] == [(0,), (0, 1), (0, 1, 2), (0, 2, 3), (0, 2, 4)]
    for n_layers in range(1, 80):
        for n in (1, 2, 3, 5):
            layers = default_feature_layers(n_layers, n)
            assert len(set(layers)) == len(layers) == min(n, n_layers) or n == 1
            assert all(0 <= i < n_layers for i in layers)


def test_the_drafter_embeds_as_gemma_does_and_reads_its_rope_per_layer_type(tmp_path):
    target = load_target(make_target_folder(tmp_path / "tiny-gemma3", "gemma3"))
    target.config.rope_parameters = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                     "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}}
    assert config_for_target(target).rope_theta == 1_000_000.0  # the full layers': they see the whole context
    drafter = BlockDrafter(target, seed=0, block_size=4)
    ids = torch.tensor([5, 9, 17])
    embedded = drafter._block_embeddings(ids)[:, 0]  # the anchor rows
    torch.testing.assert_close(embedded, target.model.get_input_embeddings()(ids))  # x sqrt(hidden) = 8
    assert not torch.allclose(embedded, target.model.get_input_embeddings().weight[ids])


def test_init_from_target_needs_llama_shaped_layers(tmp_path):
    gemma = load_target(make_target_folder(tmp_path / "g", "gemma3")).model
    mistral = load_target(make_target_folder(tmp_path / "m", "mistral")).model
    assert "gelu" in llama_shape_problem(gemma)
    assert llama_shape_problem(mistral) is None and llama_shape_problem(tiny_llama(0)) is None


def test_features_beyond_fp16_are_stored_in_bf16_not_as_inf(tmp_path):
    from entropy_law.drafters.training.data import load_samples, write_shard

    small = torch.linspace(-3.0, 3.0, 12).reshape(3, 4)
    large = small.clone()
    large[0, 0] = 3.3e4 * 3  # Gemma's residual stream reaches such values; fp16 ends at 65504
    samples = [{"prompt_id": f"p{i}", "source": "test", "text": "", "response": "", "prompt_ids": [5, 6],
                "response_ids": [7, 8], "features": f} for i, f in enumerate((small, large))]
    write_shard(tmp_path, "stage1-0000", samples)
    loaded = load_samples(tmp_path)
    assert [s["features"].dtype for s in loaded] == [torch.float16, torch.bfloat16]
    for sample, original in zip(loaded, (small, large)):
        assert torch.isfinite(sample["features"]).all()
        torch.testing.assert_close(sample["features"].float(), original, rtol=1e-2, atol=1e-2)
