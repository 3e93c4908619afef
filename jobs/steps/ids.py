"""What identifies a row: the id column(s), one or several (a composite id, ``id_col: [user_id, item_id]``).

Every step that reads ids goes through these, so one column and several behave alike. Where one value per row is
needed (a per-row sampling seed) it is :func:`row_key`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F

from lakescore.jobs.platform.tables import column
from lakescore.schemas.id_columns import id_names

__all__ = ["id_columns", "any_null", "all_present", "row_key", "id_hash", "same_values"]


def id_columns(names: Sequence[str]) -> list[Column]:
    """The columns ``names`` (the id column(s), :attr:`~lakescore.jobs.config.JobConfig.id_cols`; one name is taken as
    :func:`~lakescore.schemas.id_columns.id_names` takes it), each by its own name."""
    return [column(name) for name in id_names(names)]


def any_null(names: Sequence[str]) -> Column:
    """True where any of the columns is null: such a row has no id (``null_id``)."""
    return reduce(lambda a, b: a | b, [c.isNull() for c in id_columns(names)])


def all_present(names: Sequence[str]) -> Column:
    return ~any_null(names)


def row_key(names: Sequence[str]) -> Column:
    """One value per row identifying it: the id column itself, or for a composite id the JSON of the struct of its
    columns, in the configured order (``{"user_id":7,"item_id":"b"}``: Spark's ``to_json``, which writes each value
    in its own JSON form, so distinct ids never give the same text)."""
    columns = id_columns(names)
    return columns[0] if len(columns) == 1 else F.to_json(F.struct(*columns))


def id_hash(names: Sequence[str]) -> Column:
    """A stable 64-bit hash of the id (Spark's ``xxhash64`` over its columns; one column hashes as before)."""
    return F.xxhash64(*id_columns(names))


def same_values(names: Sequence[str], other: Mapping[str, str], null_safe: bool = False) -> Column:
    """A join condition: each column of ``names`` equals its counterpart ``other[name]`` (null-safe: null matches
    null)."""
    pairs = [(column(name), F.col(other[name])) for name in names]
    return reduce(lambda a, b: a & b, [a.eqNullSafe(b) if null_safe else a == b for a, b in pairs])
