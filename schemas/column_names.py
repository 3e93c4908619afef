"""Column names some consumers cannot take, and one reversible escape for them.

* Delta refuses a column name holding any of :data:`DELTA_REFUSED_CHARACTERS` unless the table uses column mapping
  (``DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES``). Warehouse tables have such names (``review text``, ``price (eur)``):
  the model's input columns reach only lakescore's private tables (the changed rows, the prepared rows), which
  store them escaped (:func:`delta_storable_columns`) and read them back under their own names
  (:func:`original_columns`). An output column (the id) cannot be escaped: :func:`refused_by_delta` finds it so
  the run stops in its target check, before anything is written.
* PySpark's ``mapInArrow`` and GX's Spark engine resolve a column by its bare name, which reads ``review.id`` as a
  struct field and refuses a backtick: they get :func:`resolvable_name` names.

The escape writes each such character, and ``%`` itself, as ``%XX`` (its code in two hex digits), so every ``%``
in an escaped name starts an escape and :func:`original_name` inverts any of them. Names without those characters
or ``%`` are unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from pyspark.sql import DataFrame

__all__ = [
    "DELTA_REFUSED_CHARACTERS",
    "refused_by_delta",
    "delta_storable_name",
    "resolvable_name",
    "original_name",
    "renamed_columns",
    "delta_storable_columns",
    "original_columns",
]

DELTA_REFUSED_CHARACTERS = " ,;{}()\n\t="
"""The characters Delta refuses in a column name of a table without column mapping."""

_BARE_NAME_UNSAFE = ".`"
_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def refused_by_delta(names: Iterable[str]) -> str | None:
    """The first of ``names`` that Delta would refuse without column mapping; ``None`` when it stores them all."""
    return next((name for name in names if any(c in DELTA_REFUSED_CHARACTERS for c in name)), None)


def _escaped(name: str, characters: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in characters or c == "%" else c for c in name)


def delta_storable_name(name: str) -> str:
    """``name`` as a Delta table without column mapping stores it.

    >>> delta_storable_name("review text"), delta_storable_name("body"), delta_storable_name("50%")
    ('review%20text', 'body', '50%25')
    """
    return _escaped(name, DELTA_REFUSED_CHARACTERS)


def resolvable_name(name: str) -> str:
    """``name`` as a bare column name Spark resolves to a top-level column.

    >>> resolvable_name("review.id"), resolvable_name("body")
    ('review%2Eid', 'body')
    """
    return _escaped(name, _BARE_NAME_UNSAFE)


def original_name(escaped: str) -> str:
    """The name :func:`delta_storable_name` or :func:`resolvable_name` made ``escaped`` from.

    >>> original_name("review%20text"), original_name("review%2Eid"), original_name("50%25")
    ('review text', 'review.id', '50%')
    """
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), escaped)


def renamed_columns(df: DataFrame, rename: Callable[[str], str]) -> DataFrame:
    """``df`` with every column renamed to ``rename(name)``; ``df`` itself when no name changes."""
    renamed = {name: new for name in df.columns if (new := rename(name)) != name}
    return df.withColumnsRenamed(renamed) if renamed else df


def delta_storable_columns(df: DataFrame) -> DataFrame:
    """``df`` with every column renamed to its :func:`delta_storable_name` (no-op when Delta stores every name)."""
    return renamed_columns(df, delta_storable_name)


def original_columns(df: DataFrame) -> DataFrame:
    """The inverse of :func:`delta_storable_columns`: ``df`` read from a table written so, under the original names."""
    return renamed_columns(df, original_name)
