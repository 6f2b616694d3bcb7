"""Tiny randomly initialised vision-language targets for tests: Qwen2-VL, Qwen2.5-VL and LLaVA, built
from configs (no download), with a byte-level tokenizer and image processors constructed locally.

Everything is seeded explicitly; fp32, eager attention, CPU. Sizes are chosen so that one image gives a
handful of image tokens (Qwen: 12 for a 48x32 image; LLaVA: 16) and a forward takes milliseconds.
``init_std`` above the HF default gives peaked, prompt-dependent distributions (greedy outputs that are
not one repeated token), as in the decoder tests' ``tiny_llama`` (``tests/conftest.py``).
"""

from __future__ import annotations

import torch

# special tokens after the 256 byte tokens
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>", "<image>")
VOCAB = 256 + len(SPECIALS) + 8  # a few spare rows, as real checkpoints have


def byte_tokenizer():
    """A byte-level ``PreTrainedTokenizerFast``: ids 0..255 are bytes, then ``SPECIALS`` (ids 256..263)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    # a stable byte -> char order: the GPT-2 byte-to-unicode table sorted by code point of the byte
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    assert set(vocab) == set(byte_chars)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    hf.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                           "additional_special_tokens": [s for s in SPECIALS if s not in ("<|im_end|>",
                                                                                          "<|endoftext|>")]})
    ids = hf.convert_tokens_to_ids(list(SPECIALS))
    assert sorted(ids) == list(range(256, 256 + len(SPECIALS))), ids
    return hf


def token_id(tokenizer, token: str) -> int:
    return int(tokenizer.convert_tokens_to_ids(token))


def tiny_qwen2_vl(seed: int = 0, *, tokenizer=None, version: str = "2", hidden: int = 64, layers: int = 2,
                  init_std: float = 0.2):
    """A tiny ``Qwen2VLForConditionalGeneration`` (``version="2"``) or ``Qwen2_5_VLForConditionalGeneration``
    (``"2.5"``): text hidden 64, 2 layers, mrope_section [2, 3, 3]; vision depth 2, patch 4, merge 2."""
    tokenizer = tokenizer or byte_tokenizer()
    ids = {name: token_id(tokenizer, tok) for name, tok in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    eos = token_id(tokenizer, "<|im_end|>")
    text = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
                eos_token_id=eos, bos_token_id=None, pad_token_id=token_id(tokenizer, "<|endoftext|>"),
                initializer_range=init_std, tie_word_embeddings=False)
    if version == "2":
        from transformers import Qwen2VLConfig as Config, Qwen2VLForConditionalGeneration as Model

        vision = dict(depth=2, embed_dim=32, hidden_size=hidden, num_heads=2, patch_size=4, spatial_merge_size=2,
                      temporal_patch_size=2, mlp_ratio=2, in_channels=3, initializer_range=init_std)
    elif version == "2.5":
        from transformers import Qwen2_5_VLConfig as Config, Qwen2_5_VLForConditionalGeneration as Model

        vision = dict(depth=2, hidden_size=32, intermediate_size=64, out_hidden_size=hidden, num_heads=2,
                      patch_size=4, spatial_merge_size=2, temporal_patch_size=2, in_channels=3, window_size=16,
                      fullatt_block_indexes=[1], initializer_range=init_std)
    else:
        raise ValueError(f"version must be '2' or '2.5', got {version!r}")
    config = Config(text_config=text, vision_config=vision, attn_implementation="eager",
                    tie_word_embeddings=False, **ids)
    torch.manual_seed(seed)  # HF initialises weights from the global generator; reseed for determinism
    model = Model(config).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def qwen_image_processor():
    """The PIL Qwen2-VL image processor (no torchvision) at patch 4: a 48x32 image -> grid 1x6x8 -> 12 tokens."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                                    min_pixels=16 * 16, max_pixels=32 * 32)


def tiny_llava(seed: int = 0, *, tokenizer=None, hidden: int = 64, layers: int = 2, init_std: float = 0.2):
    """A tiny ``LlavaForConditionalGeneration``: CLIP vision tower (image 32, patch 8 -> 16 patches + CLS,
    'default' strategy drops CLS -> 16 image tokens) and a Llama text model (hidden 64, 2 layers)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    tokenizer = tokenizer or byte_tokenizer()
    eos = token_id(tokenizer, "<|im_end|>")
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=32, initializer_range=init_std)
    text = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                       initializer_range=init_std, eos_token_id=eos, bos_token_id=None,
                       pad_token_id=token_id(tokenizer, "<|endoftext|>"), tie_word_embeddings=False)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=token_id(tokenizer, "<image>"),
                         vision_feature_layer=-2, vision_feature_select_strategy="default",
                         projector_hidden_act="gelu", attn_implementation="eager", tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = text.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def llava_image_processor():
    """The PIL LLaVA (CLIP) image processor at 32x32 (resize shortest edge, centre crop)."""
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    return LlavaImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


def test_image(seed: int = 0, size: tuple[int, int] = (48, 32)):
    """A seeded random RGB image (PIL)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8), "RGB")


test_image.__test__ = False  # not a pytest test
