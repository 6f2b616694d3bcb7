"""Vision-language targets (Qwen2-VL / Qwen2.5-VL, LLaVA): image prompts, pixels at prefill, M-RoPE tree positions.

Pixels go to the prefill forward only (``attach(prompt)``); afterwards the image lives in the KV cache. Qwen's
tree node at depth ``d`` gets ``start + d + rope_delta`` on all three M-RoPE axes (``rope_delta`` from the model's
``get_rope_index``); LLaVA keeps 1-D positions. ``reference_greedy`` (plain HF ``generate``) is the oracle of
exactness. One image per prompt, batch 1; other families need a subclass.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from PIL import Image
from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

from entropy_law.decoding.adapter import TargetAdapter
from entropy_law.decoding.loading import LoadedTarget
from entropy_law.decoding.tree import Tree

QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
LLAVA_FAMILIES = ("llava",)
VLM_FAMILIES = QWEN_FAMILIES + LLAVA_FAMILIES

# the one-image placeholder each family's prompt format uses before expansion
QWEN_IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
LLAVA_IMAGE_PLACEHOLDER = "<image>"
QWEN_DEFAULT_SYSTEM = "You are a helpful assistant."


def vlm_family(config) -> str:
    """``"qwen2_vl"``, ``"qwen2_5_vl"`` or ``"llava"`` from a model config (or a model)."""
    config = getattr(config, "config", config)
    family = getattr(config, "model_type", None)
    if family not in VLM_FAMILIES:
        raise ValueError(f"unsupported vision-language model type {family!r}; supported: "
                         f"{', '.join(VLM_FAMILIES)} (other families need a VLMTargetAdapter subclass)")
    return family


@dataclass(frozen=True)
class ImagePrompt:
    """One request's prompt with at most one image: token ids with the placeholder expanded to
    ``image_tokens`` copies, and the prefill forward's ``tensors`` (``pixel_values``, Qwen's ``image_grid_thw``
    and ``mm_token_type_ids``), batch dimension included."""

    input_ids: list[int]
    image_tokens: int
    family: str
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    text: str = ""  # the rendered prompt before placeholder expansion (for inspection)

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def has_image(self) -> bool:
        return self.image_tokens > 0


def load_image(path: str | os.PathLike):  # PIL RGB
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    with Image.open(path) as image:
        return image.convert("RGB")


class ImagePromptEncoder:
    """Builds ``ImagePrompt`` objects for one VLM. ``chat_template``: default the tokenizer's, else a built-in Qwen or
    LLaVA-1.5 format; ``num_additional_image_tokens`` (LLaVA): vision tokens beyond one per patch (1 for CLIP)."""

    def __init__(self, tokenizer, image_processor, config, *, chat_template: str | None = None,
                 system_prompt: str | None = None, num_additional_image_tokens: int | None = None):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.config = getattr(config, "config", config)
        self.family = vlm_family(self.config)
        self.chat_template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
        self.system_prompt = QWEN_DEFAULT_SYSTEM if system_prompt is None and self.family in QWEN_FAMILIES \
            else (system_prompt or "")
        self.image_token_id = int(self.config.image_token_id)
        if num_additional_image_tokens is None:
            vision_type = getattr(getattr(self.config, "vision_config", None), "model_type", "")
            num_additional_image_tokens = 1 if "clip" in str(vision_type) else 0
        self.num_additional_image_tokens = int(num_additional_image_tokens)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, *, image_processor_kwargs: Mapping[str, Any] | None = None,
                        **kwargs) -> "ImagePromptEncoder":
        """Tokenizer, image processor, config and chat template from a local model folder (no download);
        ``image_processor_kwargs`` override the saved processor settings (e.g. Qwen's ``max_pixels``)."""
        folder = Path(folder)
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        image_processor = AutoImageProcessor.from_pretrained(folder, local_files_only=True,
                                                             **dict(image_processor_kwargs or {}))
        if "chat_template" not in kwargs and getattr(tokenizer, "chat_template", None) is None:
            kwargs["chat_template"] = _folder_chat_template(folder)
        return cls(tokenizer, image_processor, config, **kwargs)

    def messages(self, turns: Sequence[str], answers: Sequence[str] = (), *, with_image: bool = True) -> list[dict]:
        """Chat messages: user turns interleaved with the given assistant answers; the image (if any)
        comes first in the first user turn. Needs ``len(answers) == len(turns) - 1``."""
        turns = [turns] if isinstance(turns, str) else list(turns)
        if not turns:
            raise ValueError("an image prompt needs at least one user turn")
        if len(answers) != len(turns) - 1:
            raise ValueError(f"{len(turns)} user turns need {len(turns) - 1} assistant answers, got {len(answers)}")
        messages = []
        if self.system_prompt:
            messages.append({"role": "system", "content": [{"type": "text", "text": self.system_prompt}]})
        for i, turn in enumerate(turns):
            content = ([{"type": "image"}] if (i == 0 and with_image) else []) + [{"type": "text", "text": turn}]
            messages.append({"role": "user", "content": content})
            if i < len(answers):
                messages.append({"role": "assistant", "content": [{"type": "text", "text": answers[i]}]})
        return messages

    def render(self, messages: list[dict]) -> str:
        """Prompt text with one image placeholder per image, ending where the assistant's answer starts."""
        if self.chat_template:
            return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                      add_generation_prompt=True)
        if self.family in QWEN_FAMILIES:
            parts = []
            for message in messages:
                body = "".join(QWEN_IMAGE_PLACEHOLDER if item["type"] == "image" else item["text"]
                               for item in message["content"])
                parts.append(f"<|im_start|>{message['role']}\n{body}<|im_end|>\n")
            return "".join(parts) + "<|im_start|>assistant\n"
        # LLaVA-1.5 conversation format
        bos = getattr(self.tokenizer, "bos_token", None) or ""
        eos = getattr(self.tokenizer, "eos_token", None) or ""
        text = bos + (f"{self.system_prompt} " if self.system_prompt else "")
        for message in messages:
            if message["role"] == "system":
                continue
            body = "".join(LLAVA_IMAGE_PLACEHOLDER + "\n" if item["type"] == "image" else item["text"]
                           for item in message["content"])
            text += f"USER: {body} " if message["role"] == "user" else f"ASSISTANT: {body}{eos}"
        return text + "ASSISTANT:"

    def encode(self, image, turns: Sequence[str] | str, answers: Sequence[str] = ()) -> ImagePrompt:
        """An ``ImagePrompt`` for one image (PIL, a path, or ``None``: text only) and the user turn(s)."""
        if image is not None and not hasattr(image, "convert"):
            image = load_image(image)
        text = self.render(self.messages(turns, answers, with_image=image is not None))
        # as HF processors do: the tokenizer's own special tokens (LLaVA's BOS) unless the text has them
        bos = getattr(self.tokenizer, "bos_token", None)
        ids = list(self.tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"])
        slots = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if image is None:
            if slots:
                raise ValueError("a text-only prompt contains the image token; remove it from the text")
            return ImagePrompt(input_ids=ids, image_tokens=0, family=self.family, text=text)
        if len(slots) != 1:
            raise ValueError(f"the rendered prompt holds {len(slots)} image tokens (id {self.image_token_id}) "
                             "where exactly one placeholder was expected; check that the tokenizer and chat "
                             "template belong to this model")
        processed = self.image_processor(images=[image.convert("RGB")], return_tensors="pt")
        tensors = {key: value for key, value in processed.items() if isinstance(value, torch.Tensor)}
        n_image = self.count_image_tokens(tensors)
        ids = ids[: slots[0]] + [self.image_token_id] * n_image + ids[slots[0] + 1:]
        if self.family in QWEN_FAMILIES:
            ids_tensor = torch.tensor([ids], dtype=torch.long)
            tensors["mm_token_type_ids"] = (ids_tensor == self.image_token_id).to(torch.int32)
        return ImagePrompt(input_ids=ids, image_tokens=n_image, family=self.family, tensors=tensors, text=text)

    def count_image_tokens(self, tensors: Mapping[str, torch.Tensor]) -> int:  # placeholders one image fills
        if self.family in QWEN_FAMILIES:
            grid = tensors["image_grid_thw"]
            if grid.shape[0] != 1:
                raise ValueError(f"one image per prompt is supported, the processor returned {grid.shape[0]}")
            merge = int(getattr(self.image_processor, "merge_size", None)
                        or self.config.vision_config.spatial_merge_size)
            return int(grid[0].prod()) // (merge * merge)
        pixels = tensors["pixel_values"]
        patch = int(self.config.vision_config.patch_size)
        n = (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch) + self.num_additional_image_tokens
        if getattr(self.config, "vision_feature_select_strategy", "default") == "default":
            n -= 1
        return n


def _folder_chat_template(folder: Path) -> str | None:
    """The chat template a processor stores beside the model (``chat_template.jinja`` / ``.json``)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    js = folder / "chat_template.json"
    if js.is_file():
        return json.loads(js.read_text(encoding="utf-8")).get("chat_template")
    return None


class VLMTargetAdapter(TargetAdapter):
    """``TargetAdapter`` for a transformers VLM: ``attach(prompt)`` stages an ``ImagePrompt`` whose token ids the
    next ``prefill`` must receive (none: a text-only request); ``image_tokens``: those of the current request."""

    forward_keys: tuple[str, ...] = ("pixel_values",)

    def __init__(self, model: torch.nn.Module, *, feature_layers: Sequence[int] = (), lean_attention: bool = True):
        super().__init__(model, feature_layers=feature_layers, lean_attention=lean_attention)
        self.family = vlm_family(model.config)
        text_config = model.config.get_text_config()
        self.max_context = getattr(text_config, "max_position_embeddings", None)
        self._pending: ImagePrompt | None = None
        self.image_tokens = 0

    def attach(self, prompt: ImagePrompt) -> None:  # consumed by the next prefill
        if prompt.family != self.family:
            raise ValueError(f"prompt was encoded for {prompt.family} but the target is {self.family}")
        self._pending = prompt

    def prefill(self, input_ids: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``TargetAdapter.prefill`` with the attached pixels (image positions have features too)."""
        prompt, self._pending = self._pending, None
        ids = self._prompt_tensor(input_ids, "shorten the prompt or use a smaller image")
        if prompt is not None and ids[0].tolist() != list(prompt.input_ids):
            raise ValueError("prefill got token ids that differ from the attached image prompt; pass "
                             "prompt.input_ids to generate() (or use generate_with_image)")
        image_slots = int((ids == self.model.config.image_token_id).sum())
        expected = prompt.image_tokens if prompt is not None else 0
        if image_slots != expected:
            raise ValueError(f"the prompt holds {image_slots} image tokens but {expected} image features are "
                             "attached; encode the prompt with ImagePromptEncoder and attach() it before prefill")
        self.image_tokens = expected
        positions = self.prefill_position_ids(ids, prompt)
        extra = {}
        if prompt is not None and prompt.has_image:
            extra = {k: v.to(self.device) for k, v in prompt.tensors.items() if k in self.forward_keys}
            if "pixel_values" in extra:
                extra["pixel_values"] = extra["pixel_values"].to(self.dtype)
        return self._prefill_forward(ids, positions, **extra)  # a fresh cache, as a text prefill makes it

    def prefill_position_ids(self, ids: torch.Tensor, prompt: ImagePrompt | None) -> torch.Tensor:  # M-RoPE: override
        return torch.arange(ids.shape[1], device=self.device).unsqueeze(0)


class LlavaTargetAdapter(VLMTargetAdapter):
    """LLaVA: image features scattered into the ``<image>`` placeholder rows, 1-D positions everywhere."""

    forward_keys = ("pixel_values", "image_sizes")


class Qwen2VLTargetAdapter(VLMTargetAdapter):
    """Qwen2-VL / Qwen2.5-VL: 3-D M-RoPE positions, always passed explicitly (the model's cached
    ``rope_deltas`` are never read); ``rope_delta`` is kept per request (0 for text-only prompts)."""

    forward_keys = ("pixel_values", "image_grid_thw")

    def __init__(self, model: torch.nn.Module, *, feature_layers: Sequence[int] = (), lean_attention: bool = True):
        super().__init__(model, feature_layers=feature_layers, lean_attention=lean_attention)
        self.rope_delta = 0

    def _rope_index(self):
        for owner in (self.model, getattr(self.model, "model", None)):
            fn = getattr(owner, "get_rope_index", None)
            if fn is not None:
                return fn
        raise ValueError(f"{type(self.model).__name__} has no get_rope_index; is it a Qwen2-VL model?")

    def prefill_position_ids(self, ids: torch.Tensor, prompt: ImagePrompt | None) -> torch.Tensor:
        n = ids.shape[1]
        if prompt is None or not prompt.has_image:
            self.rope_delta = 0
            return torch.arange(n, device=self.device).view(1, 1, n).expand(3, 1, n)
        positions, deltas = self._rope_index()(
            ids, mm_token_type_ids=prompt.tensors["mm_token_type_ids"].to(self.device),
            image_grid_thw=prompt.tensors["image_grid_thw"].to(self.device),
            attention_mask=torch.ones_like(ids))
        self.rope_delta = int(deltas.reshape(-1)[0])
        if int(positions.max()) + 1 - n != self.rope_delta:  # the definition of the offset
            raise RuntimeError(f"unexpected M-RoPE offset {self.rope_delta} for positions up to {int(positions.max())}")
        return positions.to(self.device)

    def tree_position_ids(self, start: int, tree: Tree) -> torch.Tensor:
        """``[3, 1, N + 1]``: ``start + depth + rope_delta`` on the t, h and w axes (siblings share one)."""
        flat = tree.depth_positions().to(self.device) + start + self.rope_delta
        return flat.view(1, 1, -1).expand(3, 1, -1)


def vlm_adapter(model: torch.nn.Module, *, feature_layers: Sequence[int] = ()) -> VLMTargetAdapter:
    """The adapter for a VLM's family (``Qwen2VLTargetAdapter`` or ``LlavaTargetAdapter``)."""
    family = vlm_family(model.config)
    cls = Qwen2VLTargetAdapter if family in QWEN_FAMILIES else LlavaTargetAdapter
    return cls(model, feature_layers=feature_layers)


def generate_with_image(decoder, prompt: ImagePrompt, *, max_new_tokens: int, **kwargs):
    """``decoder.generate`` for an image prompt, its pixels attached to the decoder's VLM adapter."""
    adapter = decoder.adapter
    if not isinstance(adapter, VLMTargetAdapter):
        raise TypeError("the decoder's target must be a VLMTargetAdapter; build it with vlm_adapter(model) and "
                        "pass the adapter as the decoder's target")
    adapter.attach(prompt)
    return decoder.generate(list(prompt.input_ids), max_new_tokens=max_new_tokens,
                            image_tokens=prompt.image_tokens, **kwargs)


@dataclass
class GreedyReference:
    """Plain HF greedy ``generate``: new token ids and the fp32 logits row that chose each ``[T, V]``."""

    token_ids: list[int]
    logits: torch.Tensor


@torch.inference_mode()
def reference_greedy(model: torch.nn.Module, prompt: ImagePrompt, *, max_new_tokens: int,
                     eos_token_ids: Sequence[int] | None = None) -> GreedyReference:
    """Greedy decoding with ``model.generate`` (the model's own cache and position handling, pixels at
    prefill): the independent oracle that speculative output and recorded entropies must equal."""
    ids = torch.tensor([prompt.input_ids], dtype=torch.long, device=next(model.parameters()).device)
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for key, value in prompt.tensors.items():
        inputs[key] = value.to(ids.device)
    if hasattr(getattr(model, "model", None), "rope_deltas"):
        model.model.rope_deltas = None  # never reuse a previous request's offset (transformers#43952)
    extra = {} if eos_token_ids is None else {"eos_token_id": list(eos_token_ids)}
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                         return_dict_in_generate=True, output_logits=True, **extra)
    new = out.sequences[0, ids.shape[1]:].tolist()
    logits = torch.stack([row[0] for row in out.logits]).float()
    return GreedyReference(token_ids=new, logits=logits[: len(new)])


def load_vlm_target(spec: str | os.PathLike, *, dtype: torch.dtype = torch.float32,
                    attn_implementation: str = "eager", **encoder_kwargs):
    """A local VLM folder (Qwen2-VL, Qwen2.5-VL or LLaVA) -> ``(LoadedTarget, ImagePromptEncoder)``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a Hugging Face model folder (no config.json in it); give the "
                                "local folder of a Qwen2-VL, Qwen2.5-VL or LLaVA checkpoint")
    vlm_family(AutoConfig.from_pretrained(folder, local_files_only=True))
    encoder = ImagePromptEncoder.from_pretrained(folder, **encoder_kwargs)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation,
                                                        local_files_only=True)
    model.eval()
    target = LoadedTarget(model=model, tokenizer=encoder.tokenizer, model_id=folder.name, source=str(folder),
                          dtype=dtype)
    return target, encoder


class ImageRequests:
    """What a recording loop needs to decode image tasks with a VLM: ``target``, ``encoder`` and ``adapter`` (the
    decoder's target); ``prepare(task)`` (right before ``decoder.generate``) -> ``(prompt_ids, generate_kwargs)``."""

    def __init__(self, target, encoder: ImagePromptEncoder, adapter: VLMTargetAdapter):
        self.target = target
        self.encoder = encoder
        self.adapter = adapter

    @classmethod
    def load(cls, spec: str | os.PathLike, *, feature_layers: Sequence[int] = (), dtype: torch.dtype = torch.float32,
             **encoder_kwargs) -> "ImageRequests":
        """Load a local VLM folder and build its adapter."""
        target, encoder = load_vlm_target(spec, dtype=dtype, **encoder_kwargs)
        return cls(target, encoder, vlm_adapter(target.model, feature_layers=feature_layers))

    def prepare(self, task) -> tuple[list[int], dict]:
        prompt = self.encoder.encode(task.image, list(task.turns[:1]))
        self.adapter.attach(prompt)
        return list(prompt.input_ids), {"image_tokens": prompt.image_tokens}
