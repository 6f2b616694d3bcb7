"""Importers: speculative-decoding statistics that serving engines log, turned into trace runs.

Known here, one module each: the engine-neutral request and the alignment rule of per-step data
(``records``: ``ImportedRequest``, ``FieldError``, ``MalformedResponseError``), the engines' documented
response shapes (``vllm``, ``sglang``, ``llamacpp``; AIPerf's engine-neutral acceptance record,
``aiperf``), what an acceptance histogram allows (``histograms``:
``acceptance_by_depth``), and the import itself (``writer``: ``import_jsonl`` = ``parse_jsonl`` +
``write_run``, and ``read_import`` for what an import keeps beside the run), the engines' top-k
log-probabilities (``logprobs``: read and checked per position; ``traces.topk`` turns them into entropy bounds
and an estimate), and Spec-Bench's answer files both ways (``specbench``). ``docs/importers.md`` maps every
field and says what each engine cannot tell.

Not known here: models. No engine records target entropies, so an imported run holds request rows (and
the engines' own numbers in ``engine_import.jsonl``) until target statistics are computed or read from the
responses' top-k log-probabilities; token and round rows are written only with them. Reads JSON, writes through the trace layer's public API, never imports
torch, transformers, decoding, drafters, jobs or plots (``tests/test_layers.py``). The transformers
assisted-generation recorder needs torch and lives in ``entropy_law.decoding.assisted``.
"""

from entropy_law.importers.histograms import DepthAcceptance, acceptance_by_depth
from entropy_law.importers.records import (Alignment, FieldError, ImportedRequest, MalformedResponseError)
from entropy_law.importers.writer import (ImportedRun, ImportSummary, ParsedFile, import_jsonl, parse_jsonl,
                                          read_import, write_run)

ENGINES = ("vllm", "sglang", "llamacpp", "aiperf")

__all__ = ["ENGINES", "Alignment", "DepthAcceptance", "FieldError", "ImportSummary", "ImportedRequest", "ImportedRun",
           "MalformedResponseError", "ParsedFile", "acceptance_by_depth", "import_jsonl", "parse_jsonl", "read_import",
           "write_run"]
