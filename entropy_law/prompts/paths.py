"""Where the project's shipped data live (``$ENTROPY_LAW_DATA`` or the checkout's ``data/``), and how a JSONL
line is read (errors name ``file:line``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator


def data_dir() -> Path:
    """The data folder: ``$ENTROPY_LAW_DATA`` if set, else ``data/`` beside the package."""
    env = os.environ.get("ENTROPY_LAW_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "data"
    if not path.is_dir():
        raise FileNotFoundError(f"entropy-law data folder not found at {path}. Install the package from a checkout "
                                "(pip install -e .) or set ENTROPY_LAW_DATA to the repository's data/ folder.")
    return path


def read_json_lines(path: Path, what: str = "a JSON object") -> Iterator[tuple[int, dict]]:
    """(line number, object) for every non-blank line of a JSONL file; a line that is not UTF-8, JSON or an object
    (``what``) raises ``ValueError`` naming ``file:line``."""
    with Path(path).open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            line = decode_line(raw, f"{path}:{line_no}")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{line_no}: expected {what}, got {type(record).__name__}")
            yield line_no, record


def decode_line(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8 text, or ``ValueError`` naming ``where`` and the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                         "save the file as UTF-8") from None
