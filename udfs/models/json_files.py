"""A model directory's JSON files as the driver's checks read them (no model library): a leaf module, so the
settings (:mod:`lakescore.udfs.options`) can read them without importing the registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_json", "NO_TOKENIZER_LIMIT"]

NO_TOKENIZER_LIMIT = 1_000_000
"""A ``tokenizer.model_max_length`` at or above this records no limit (transformers' placeholder is 1e30)."""


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; ``None`` when it is absent or not a JSON object (the executors' load reports
    why)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
