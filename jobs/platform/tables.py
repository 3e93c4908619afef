"""Reading inputs and writing Delta outputs by reference: a metastore table name or a path.

A reference containing ``/``, ``\\`` or ``:`` outside backtick-quoted name parts is a path (``/data/x``, ``./x``,
``s3a://bucket/x``, ``dbfs:/x``); anything else is a table identifier
(``table``, ``db.table`` or ``catalog.db.table``, parts quoted with backticks where needed:
:mod:`lakescore.jobs.platform.identifiers`), handed to Spark quoted.

Delta facts (is it Delta, its versions, the rows a commit wrote) come from Delta's SQL
(``DESCRIBE HISTORY``), which classic and Spark Connect sessions both run: the ``DeltaTable``
Python API needs the Delta Connect server plugin over Connect. Filesystem calls go through
:mod:`lakescore.jobs.platform.spark_adapter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from lakescore.jobs.platform import spark_adapter
from lakescore.jobs.platform.identifiers import has_path_separator, parse_table_name, quote_identifier
from lakescore.schemas.output import column_types

__all__ = [
    "TableError",
    "column",
    "is_path",
    "read_input",
    "check_output_target",
    "DeltaCommit",
    "WriteConflictError",
    "is_commit_conflict",
    "write_delta_overwrite",
    "append_delta",
    "last_commit",
    "delete_path",
    "drop_delta",
    "is_delta",
]


class TableError(ValueError):
    """An input or output reference cannot be read or written as asked."""


def column(name: str):
    """A column by its exact name, even one with dots or backticks in it."""
    from pyspark.sql import functions as F

    return F.col(quote_identifier(name))


def is_path(ref: str) -> bool:
    """True when ``ref`` names a filesystem path rather than a metastore table (``db.`a/b``` is a table)."""
    return has_path_separator(ref)


def read_input(spark: SparkSession, ref: str, fmt: str = "auto") -> DataFrame:
    """A DataFrame over ``ref``: a metastore table, or a Delta / Parquet path.

    ``fmt="auto"`` reads a path as Delta when it holds a Delta log, else as Parquet.
    Raises :class:`TableError` naming the reference when it does not exist or cannot be read.
    """
    try:
        if not is_path(ref):
            df = spark.table(parse_table_name(ref, "input").quoted)
        else:
            if fmt == "auto":
                fmt = "delta" if is_delta(spark, ref) else "parquet"
            df = spark.read.format(fmt).load(ref)
        df.schema  # a Spark Connect DataFrame is analysed only when asked: fail here, before compute
        return df
    except AnalysisException as exc:
        raise TableError(f"cannot read input {ref!r}: {_first_line(exc)}") from exc


def check_output_target(spark: SparkSession, ref: str, schema: StructType) -> Optional[int]:
    """Fail before any compute if ``ref`` cannot take an overwrite with ``schema``.

    Returns the current Delta version of the target, or ``None`` if it does not exist yet.
    Raises :class:`TableError` if the table's database is missing, the target exists but
    is not Delta, or its columns differ from ``schema`` (names and types).
    """
    if is_path(ref):
        if not is_delta(spark, ref):
            if spark_adapter.path_exists(spark, ref):
                raise TableError(f"output path {ref!r} exists and is not a Delta table; refusing to overwrite it")
            return None
        existing = spark.read.format("delta").load(ref).schema
    else:
        table = parse_table_name(ref, "output")
        if table.namespace and not spark.catalog.databaseExists(table.quoted_namespace):
            raise TableError(f"output database {'.'.join(table.namespace)!r} does not exist (output {ref!r})")
        if not spark.catalog.tableExists(table.quoted):
            return None
        if not is_delta(spark, ref):
            raise TableError(f"output table {ref!r} exists and is not a Delta table")
        existing = spark.table(table.quoted).schema
    if column_types(existing) != column_types(schema):
        raise TableError(
            f"output {ref!r} has columns {existing.simpleString()} but this run writes {schema.simpleString()}; "
            "write to a new output or drop the old one"
        )
    return last_commit(spark, ref).version


@dataclass(frozen=True)
class DeltaCommit:
    """The commit a write made: table version and the rows it wrote (Delta's own metric)."""

    version: int
    rows: Optional[int]


class WriteConflictError(RuntimeError):
    """Another writer committed to the same table at the same time; this run's commit was refused."""


def write_delta_overwrite(
    df: DataFrame, ref: str, replace_where: Optional[str] = None, partition_by: Optional[str] = None
) -> DeltaCommit:
    """Overwrite ``ref`` with ``df`` as one Delta commit and return that commit.

    Overwrite makes a rerun replace the previous rows instead of adding to them; readers
    see either the old or the new snapshot, never a mix. With ``replace_where`` (a SQL
    predicate) only the rows matching it are replaced, atomically; Delta refuses the
    write if ``df`` holds a row outside the predicate. ``partition_by`` applies when the
    write creates the table. A concurrent commit that Delta refuses raises
    :class:`WriteConflictError`.
    """
    writer = df.write.format("delta").mode("overwrite")
    if replace_where is not None:
        writer = writer.option("replaceWhere", replace_where)
    if partition_by is not None and not _target_exists(df.sparkSession, ref):
        writer = writer.partitionBy(partition_by)
    try:
        _save(writer, ref)
    except Exception as exc:
        if is_commit_conflict(exc):
            raise WriteConflictError(
                f"another run committed to {ref!r} at the same time and Delta refused this run's commit "
                f"({_first_line(exc)}); the table holds the other run's complete result. Rerun to replace it."
            ) from exc
        raise
    return last_commit(df.sparkSession, ref)


_CONFLICT_MARKERS = ("DELTA_CONCURRENT", "ConcurrentModification", "DELTA_PROTOCOL_CHANGED", "DELTA_METADATA_CHANGED")


def is_commit_conflict(exc: BaseException) -> bool:
    """True when ``exc`` is Delta refusing a commit because another writer committed first.

    Every one of Delta's conflict exceptions counts, not only the ``Concurrent*`` ones: two runs
    creating the same new table lose with ``ProtocolChangedException`` / ``MetadataChangedException``
    (``DELTA_PROTOCOL_CHANGED`` / ``DELTA_METADATA_CHANGED``), whose names say nothing of concurrency.
    """
    kind = type(exc)
    if kind.__module__.startswith("delta.exceptions") or "Concurrent" in kind.__name__:
        return True
    text = str(exc)
    return any(marker in text for marker in _CONFLICT_MARKERS)


def append_delta(df: DataFrame, ref: str, txn_app_id: Optional[str] = None, txn_version: Optional[int] = None) -> None:
    """Append ``df`` to the Delta table at ``ref`` in one commit.

    With ``txn_app_id``/``txn_version`` the commit is idempotent: Delta skips it when
    a commit with that app id and this version or a later one already exists.
    """
    writer = df.write.format("delta").mode("append")
    if txn_app_id is not None:
        writer = writer.option("txnAppId", txn_app_id).option("txnVersion", int(txn_version))
    _save(writer, ref)


def last_commit(spark: SparkSession, ref: str) -> DeltaCommit:
    """The latest commit of the Delta table ``ref``: version and rows written (Delta's own metric)."""
    last = spark.sql(f"DESCRIBE HISTORY {_delta_sql(ref)} LIMIT 1").select("version", "operationMetrics").first()
    rows = (last["operationMetrics"] or {}).get("numOutputRows")
    return DeltaCommit(version=int(last["version"]), rows=int(rows) if rows is not None else None)


def is_delta(spark: SparkSession, ref: str) -> bool:
    """Whether ``ref`` (a path or a table) is a Delta table: Delta answers ``DESCRIBE HISTORY`` for it."""
    try:
        spark.sql(f"DESCRIBE HISTORY {_delta_sql(ref)} LIMIT 1").collect()
    except AnalysisException:
        return False
    return True


def delete_path(spark: SparkSession, ref: str) -> bool:
    """Delete the directory ``ref`` recursively (any Hadoop filesystem); True if something was deleted.

    Classic sessions only (:func:`lakescore.jobs.platform.spark_adapter.can_delete_paths`).
    """
    return spark_adapter.delete_path(spark, ref)


def drop_delta(spark: SparkSession, ref: str) -> None:
    """Remove the Delta table ``ref``: ``DROP TABLE`` for a (managed) table, deleting the directory for a path."""
    if is_path(ref):
        delete_path(spark, ref)
    else:
        spark.sql(f"DROP TABLE IF EXISTS {parse_table_name(ref).quoted}")


def _delta_sql(ref: str) -> str:
    """``ref`` as Delta SQL names it: ``delta.`<path>``` or the quoted table name."""
    return f"delta.{quote_identifier(ref)}" if is_path(ref) else parse_table_name(ref).quoted


def _target_exists(spark: SparkSession, ref: str) -> bool:
    return spark_adapter.path_exists(spark, ref) if is_path(ref) else spark.catalog.tableExists(parse_table_name(ref).quoted)


def _save(writer, ref: str) -> None:
    if is_path(ref):
        writer.save(ref)
    else:
        writer.saveAsTable(parse_table_name(ref).quoted)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
