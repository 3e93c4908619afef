"""Column names a Delta table without column mapping can store, and a reversible escape for the others.

Delta refuses a column name holding any of :data:`REFUSED_CHARACTERS` unless the table uses column mapping
(``DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES``). Warehouse tables have such names (``review text``, ``price (eur)``):
the model's input columns reach only lakescore's private tables (the changed rows, the prepared rows), which store
them escaped (:func:`escaped_columns`) and read them back under their own names (:func:`restored_columns`). An
output column (the id) cannot be escaped: :func:`refused_name` finds it so the run stops before any compute.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from pyspark.sql import DataFrame

__all__ = ["REFUSED_CHARACTERS", "refused_name", "storable_name", "original_name", "escaped_columns", "restored_columns"]

REFUSED_CHARACTERS = " ,;{}()\n\t="
"""The characters Delta refuses in a column name of a table without column mapping."""

_ESCAPED = "%" + REFUSED_CHARACTERS  # "%" too, so that every "%" in a stored name starts an escape
_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def refused_name(names: Iterable[str]) -> Optional[str]:
    """The first of ``names`` that Delta would refuse without column mapping; ``None`` when it stores them all."""
    return next((name for name in names if any(c in REFUSED_CHARACTERS for c in name)), None)


def storable_name(name: str) -> str:
    """``name`` with each refused character, and ``%``, written as ``%XX`` (its code, two hex digits): a name Delta
    stores. Names without those characters are unchanged.

    >>> storable_name("review text"), storable_name("body"), storable_name("50%")
    ('review%20text', 'body', '50%25')
    """
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in name)


def original_name(stored: str) -> str:
    """The name :func:`storable_name` made ``stored`` from.

    >>> original_name("review%20text"), original_name("50%25")
    ('review text', '50%')
    """
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), stored)


def escaped_columns(df: DataFrame) -> DataFrame:
    """``df`` with every column renamed to its :func:`storable_name` (no-op when every name is storable already)."""
    renamed = {name: storable_name(name) for name in df.columns if storable_name(name) != name}
    return df.withColumnsRenamed(renamed) if renamed else df


def restored_columns(df: DataFrame) -> DataFrame:
    """The inverse of :func:`escaped_columns`: ``df`` read from a table written escaped, under the original names."""
    renamed = {name: original_name(name) for name in df.columns if "%" in name}
    return df.withColumnsRenamed(renamed) if renamed else df
