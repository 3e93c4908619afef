"""What identifies a row, as column names: the one shape every step and contract takes. Plain Python, so the config
reads it without Spark."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["id_names", "CHUNK_INDEX"]


def id_names(id_col: str | Sequence[str] | None) -> tuple[str, ...]:
    """An id as its column names: one name, a composite id's names (in order), or none (``None``). The one place an id
    given as one name becomes the tuple everything past the boundary takes."""
    if id_col is None:
        return ()
    return (id_col,) if isinstance(id_col, str) else tuple(id_col)


CHUNK_INDEX = "chunk_index"
"""The column that, after a document's id columns, identifies each of its rows in a chunked output (``embed.chunk``)."""
