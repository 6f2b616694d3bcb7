"""Where the project's shipped data live: ``$ENTROPY_LAW_DATA`` or the ``data/`` folder of the checkout.

Knows only paths; reads nothing.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """The data folder: ``$ENTROPY_LAW_DATA`` if set, else ``data/`` beside the package."""
    env = os.environ.get("ENTROPY_LAW_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "data"
    if not path.is_dir():
        raise FileNotFoundError(
            f"entropy-law data folder not found at {path}. Install the package from a checkout "
            "(pip install -e .) or set ENTROPY_LAW_DATA to the repository's data/ folder."
        )
    return path
