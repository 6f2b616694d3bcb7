"""Importers: speculative-decoding statistics that serving engines log, turned into trace runs.

One module each: the engine-neutral request and the alignment rule of per-step data (``records``), the engines'
documented response shapes (``vllm``, ``sglang``, ``llamacpp``, AIPerf's acceptance record ``aiperf``), what an
acceptance histogram allows (``histograms``), top-k log-probabilities (``logprobs``), the import itself
(``writer``: ``import_jsonl`` = ``parse_jsonl`` + ``write_run``; ``read_import``), and Spec-Bench's answer files
both ways (``specbench``). ``docs/importers.md`` maps every field. Token and round rows are written only once
target statistics exist (computed later, or from the responses' top-k). Reads JSON, writes through the trace
layer; never imports torch, transformers, decoding, drafters, jobs or plots (``tests/test_layers.py``).
"""

from entropy_law.importers.histograms import DepthAcceptance, acceptance_by_depth
from entropy_law.importers.records import (Alignment, FieldError, ImportedRequest, MalformedResponseError)
from entropy_law.importers.writer import (ImportedRun, ImportSummary, ParsedFile, import_jsonl, parse_jsonl,
                                          read_import, write_run)

ENGINES = ("vllm", "sglang", "llamacpp", "aiperf")

__all__ = ["ENGINES", "Alignment", "DepthAcceptance", "FieldError", "ImportSummary", "ImportedRequest", "ImportedRun",
           "MalformedResponseError", "ParsedFile", "acceptance_by_depth", "import_jsonl", "parse_jsonl", "read_import",
           "write_run"]
