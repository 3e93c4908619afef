"""The seed of each row's sampling, one rule for every generation engine (in-process and over an endpoint)."""

from __future__ import annotations

import hashlib

__all__ = ["row_seed"]


def row_seed(seed: int, key: str) -> int:
    """The seed of a row's sampling: a 63-bit digest of (``seed``, ``key``), the same in every process; the in-process
    head seeds the row's generator with it, an endpoint gets it as the request's ``seed``."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
