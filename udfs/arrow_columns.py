"""Arrow columns from numpy outputs, without a Python object per row.

Scoring UDFs hand results back to the JVM as Arrow. Going through pandas costs
a Python list per row for every array column (PySpark converts each cell);
building the ``ListArray`` from the flat numpy buffer and an offsets vector
does not. Rows that were not scored become nulls. Outputs whose rows differ in
shape (a list of entity structs per row) have no flat buffer to start from:
:func:`python_column` converts their Python values, once, straight to Arrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["list_column", "scalar_column", "string_column", "python_column"]


def list_column(matrix: np.ndarray, ok: np.ndarray, value_type: pa.DataType) -> pa.Array:
    """``list<value_type>``: row *i* is ``matrix[i]`` where ``ok[i]``, else null.

    ``matrix`` is ``(n, width)``.
    """
    n = len(ok)
    ok = np.asarray(ok, dtype=bool)
    width = matrix.shape[1] if matrix.ndim == 2 else 0
    values = np.ascontiguousarray(matrix[ok].reshape(-1)) if ok.any() else np.zeros(0)
    offsets = np.zeros(n + 1, dtype=np.int32)
    offsets[1:] = np.cumsum(ok.astype(np.int32) * width)
    return pa.ListArray.from_arrays(
        pa.array(offsets),
        pa.array(values, type=value_type),
        type=pa.list_(pa.field("element", value_type, nullable=False)),
        mask=pa.array(~ok),
    )


def scalar_column(values: np.ndarray, ok: np.ndarray, value_type: pa.DataType) -> pa.Array:
    """One value per row (``len(values) == len(ok)``), null where not ``ok``."""
    ok = np.asarray(ok, dtype=bool)
    return pa.array(np.asarray(values), type=value_type, mask=~ok)


def string_column(values: Sequence[str], ok: np.ndarray) -> pa.Array:
    """Strings per row, null where not ``ok``."""
    return python_column(values, ok, pa.string())


def python_column(values: Sequence[Any], ok: np.ndarray, value_type: pa.DataType) -> pa.Array:
    """Python values per row (strings, lists of dicts, ...) as ``value_type``, null where not ``ok``.

    Dicts map to struct fields by key. Raises ``pyarrow.ArrowInvalid`` / ``ArrowTypeError``
    for a value that does not fit ``value_type``.
    """
    return pa.array([v if good else None for v, good in zip(values, ok)], type=value_type)
