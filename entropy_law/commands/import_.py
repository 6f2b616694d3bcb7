"""``entropy-law import vllm|sglang|llamacpp|aiperf FILE.jsonl --out RUN``: a serving engine's speculation
statistics as a trace run (``importers.import_jsonl``; the field mapping: docs/importers.md)."""

from __future__ import annotations

import sys

ENGINES = ("vllm", "sglang", "llamacpp", "aiperf", "glance", "specbench")  # glance: GLANCE's round log (importers.glance);
# specbench: Spec-Bench's answer file (entropy_law.importers.specbench)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "import",
        help="import speculative-decoding statistics logged by vLLM, SGLang, llama.cpp, AIPerf or GLANCE into a trace run",
        description="Read a JSONL of engine responses (GLANCE's round log, a Spec-Bench answer file) and write a "
                    "trace run; a malformed line stops the import unless --skip-bad. Details: docs/importers.md.")
    p.add_argument("engine", choices=ENGINES, help="the engine that wrote the responses")
    p.add_argument("file", help="JSONL of engine responses, one per line")
    p.add_argument("--out", required=True, help="run directory to create")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip malformed lines (each is printed; their count and positions go into run.json)")
    p.add_argument("--category", default="unspecified",
                   help="category of lines without a \"category\" key (default: %(default)s)")
    p.add_argument("--model-id", default=None, help="model id for run.json (default: the responses' model field)")
    p.add_argument("--drafter-id", default=None,
                   help="drafter id for run.json, e.g. eagle3 or ngram (default: ENGINE:FILE-STEM, so runs of two "
                        "files are never one arm)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="the target's vocabulary size V: top-k log-probabilities then give entropy bounds "
                        "and an estimate per token (docs/trace-schema.md)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.set_defaults(func=run)


def run(args) -> int:
    # lazy: `entropy-law --help` imports every command module; pyarrow and pandas load only here
    from entropy_law.importers import import_jsonl
    from entropy_law.traces.recorder import TraceRecorder

    try:
        TraceRecorder.check_path(args.out, overwrite=args.overwrite)
    except (FileExistsError, NotADirectoryError) as err:  # a run there, another writer holding it
        raise ValueError(f"{err} (entropy-law import never resumes: --overwrite replaces the run)") from err
    common = dict(skip_bad=args.skip_bad, model_id=args.model_id, drafter_id=args.drafter_id, overwrite=args.overwrite)
    if args.engine == "specbench":
        from entropy_law.importers.specbench import import_specbench

        summary = import_specbench(args.file, args.out, **common)
    elif args.engine == "glance":  # its module loads the law (scipy, statsmodels): only here
        from entropy_law.importers.glance import import_glance

        summary = import_glance(args.file, args.out, **common)
    else:
        summary = import_jsonl(args.file, args.engine, args.out, category=args.category, vocab_size=args.vocab_size,
                               **common)
    for skipped in summary.skipped:
        print(f"skipped {args.file}:{skipped.line}: {skipped.field}: {skipped.problem}", file=sys.stderr)
    print("\n".join(summary.lines_to_print()))
    return 0
