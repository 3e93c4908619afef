"""Reading inputs and checking targets by reference: pinned reads of Delta and Parquet, folders of files, whether an
output can take a run's columns."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from concurrent.futures import Future

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from lakescore.jobs.platform.spark import adapter as spark_adapter
from lakescore.jobs.platform.spark.background import in_background
from lakescore.jobs.platform.tables.failures import (
    OutputColumnsError,
    TableError,
    cause_chain,
    first_line,
    is_not_found,
    storage_refusal,
)
from lakescore.jobs.platform.tables.history import delta_detail, last_commit, latest_commit
from lakescore.jobs.platform.tables.refs import TableRef, tried_as
from lakescore.jobs.references import quote_identifier
from lakescore.schemas.column_names import DELTA_REFUSED_CHARACTERS, refused_by_delta
from lakescore.schemas.output import column_types

log = logging.getLogger(__name__)


def check_writable_path(spark: SparkSession, ref: str, what: str) -> None:
    """Before any compute: a file can be created where the path ``ref`` will be written (the output, the errors
    table, staging), as the session's Hadoop filesystem sees it
    (:func:`~lakescore.jobs.platform.spark.adapter.probe_write`); :class:`TableError` naming the refusal otherwise.
    Over Spark Connect nothing is probed."""
    try:
        spark_adapter.probe_write(spark, ref)
    except Exception as exc:  # noqa: BLE001 (whatever the filesystem refused, the run would write nothing)
        root = cause_chain(exc)[-1]
        raise TableError(f"cannot write {what} {ref!r}: {storage_refusal(root) or root[:300]}") from exc


def read_input(spark: SparkSession, ref: str | TableRef, fmt: str = "auto", version: int | None = None) -> DataFrame:
    """A DataFrame over ``ref``: a metastore table, or a Delta / Parquet path.

    ``fmt="auto"`` reads a path as Delta when it holds a Delta log, else as Parquet. ``version``
    reads a Delta table (path or name) at that version (``versionAsOf``, classic and Connect alike).
    Raises :class:`TableError` naming the reference when it does not exist or cannot be read.
    """
    ref = TableRef.parse(ref, "input")
    reader = spark.read if version is None else spark.read.option("versionAsOf", int(version))
    try:
        if ref.is_path and fmt == "auto":
            fmt = "delta" if is_delta(spark, ref) else "parquet"
        df = ref.load(reader.format(fmt) if ref.is_path else reader)
        df.schema  # noqa: B018 (a Spark Connect DataFrame is analysed only when asked: fail here, before compute)
        return df
    except AnalysisException as exc:
        if not ref.is_path and is_not_found(exc):
            raise TableError(f"cannot read input {ref.text!r}: {tried_as(ref)}") from exc
        raise TableError(f"cannot read input {ref.text!r}: {first_line(exc)}") from exc


def read_pinned(spark: SparkSession, ref: str | TableRef, fmt: str = "auto") -> tuple[DataFrame, int | None]:
    """``ref`` read at one snapshot, so every Spark job of a run sees the same rows: ``(DataFrame, Delta version)``.

    A Delta input (path or table) is read at its latest version, ``versionAsOf`` (returned); a Parquet path
    at the file listing taken now (the files named explicitly, partition columns kept through ``basePath``;
    version ``None``). Either way a commit or a new file upstream while the run goes on changes nothing in it,
    in classic and Spark Connect sessions alike (Connect analyses a plan again for every job). Other tables
    (not Delta) are read as they are. Raises :class:`TableError` as :func:`read_input` does.
    """
    ref = TableRef.parse(ref, "input")
    df = read_input(spark, ref, fmt)
    latest = latest_commit(spark, ref) if fmt != "parquet" else None
    if latest is not None:
        return read_input(spark, ref, "delta", version=latest.version), latest.version
    if ref.is_path:
        files = df.inputFiles()
        single_file = len(files) == 1 and files[0].endswith("/" + ref.text.rstrip("/").rsplit("/", 1)[-1])
        if files and not single_file:  # a directory's listing: name its files
            return spark.read.schema(df.schema).option("basePath", ref.text).parquet(*files), None
    return df, None


def read_files(spark: SparkSession, ref: str | TableRef, extensions: tuple[str, ...]) -> tuple[DataFrame, int]:
    """Every file under the folder ``ref``, recursively, whose name ends in ``.<extension>`` (any case), through
    Spark's ``binaryFile`` source (``path``, ``modificationTime``, ``length``, ``content``), and how many other files
    the folder holds (ignored). Both come from the folder's listing, taken now (a DataFrame keeps its listing in a
    classic session); no file is read. Raises :class:`TableError` for a table name, an unreadable folder, or a
    folder without such a file."""
    ref = TableRef.parse(ref, "input")
    if not ref.is_path:
        raise TableError(f"input_format images / audio reads a folder of files; input {ref.text!r} is a table name")
    # A glob of character classes, so that PNG, Png and png all match: Hadoop's glob filter is case-sensitive
    pattern = "*.{" + ",".join("".join(f"[{c.lower()}{c.upper()}]" for c in ext) for ext in extensions) + "}"

    def files(**options):
        return ref.load(spark.read.format("binaryFile").options(recursiveFileLookup="true", **options))

    try:
        every = len(files().inputFiles())
        df = files(pathGlobFilter=pattern)
        matched = len(df.inputFiles())
    except AnalysisException as exc:
        raise TableError(f"cannot read input folder {ref.text!r}: {first_line(exc)}") from exc
    if not matched:
        raise TableError(
            f"input folder {ref.text!r} holds no file named *.{{{','.join(extensions)}}} (of {every} file(s), in any "
            "case)"
        )
    return df, every - matched


def check_output_target(
    spark: SparkSession, ref: str | TableRef, schema: StructType, version: bool = True
) -> int | None:
    """Fail before any compute if ``ref`` cannot take an overwrite with ``schema``.

    Returns the current Delta version of the target (read from its history: one Spark job, skipped for
    ``version=False``, which returns ``None``), or ``None`` if it does not exist yet.
    Raises :class:`TableError` if a column name of ``schema`` is one Delta refuses (a space, ``,;{}()=``, a tab or a
    newline: :mod:`~lakescore.schemas.column_names`), the table's database is missing, the target exists but
    is not Delta, or (:class:`OutputColumnsError`) its columns differ from ``schema`` (names and types). A directory
    holding only a ``_delta_log`` without a commit (what a first publish that failed mid-commit leaves)
    counts as not existing yet.
    """
    ref = TableRef.parse(ref, "output")
    refused = refused_by_delta(schema.names)
    if refused is not None:
        suggested = "".join("_" if c in DELTA_REFUSED_CHARACTERS else c for c in refused)
        raise TableError(
            f"output {ref.text!r} cannot have a column named {refused!r}: Delta refuses the characters "
            f"{DELTA_REFUSED_CHARACTERS!r} in column names; rename it in the input, e.g. in a view: "
            f"SELECT {quote_identifier(refused)} AS {suggested}, ..."
        )
    if ref.is_path:
        if not is_delta(spark, ref):
            if ref.exists(spark) and not _is_uncommitted_delta_dir(spark, ref.text):
                raise TableError(f"output path {ref.text!r} exists and is not a Delta table; refusing to overwrite it")
            return None
        existing, latest = spark.read.format("delta").load(ref.text).schema, None
    else:
        table = ref.table
        if table.namespace and not spark.catalog.databaseExists(table.quoted_namespace):
            raise TableError(
                f"output database {'.'.join(table.namespace)!r} does not exist (output {ref.text!r}: {tried_as(ref)}; "
                f"name a new local Delta path as ./{ref.text})"
            )
        if not ref.exists(spark):
            return None
        latest = latest_commit(spark, ref)  # whether it is Delta, and its version, from one DESCRIBE HISTORY
        if latest is None:
            raise TableError(f"output table {ref.text!r} exists and is not a Delta table")
        existing = spark.table(table.quoted).schema
    if column_types(existing) != column_types(schema):
        raise OutputColumnsError(
            f"output {ref.text!r} has columns {existing.simpleString()} but this run writes {schema.simpleString()}; "
            "write to a new output or drop the old one",
            existing,
        )
    if not version:
        return None
    return (latest or last_commit(spark, ref)).version


def load_file_lists(spark: SparkSession, refs: Iterable[str | TableRef]) -> Future[None]:
    """Start loading the current file list of each Delta table in ``refs``, in a background thread.

    A Delta write to a table first reconstructs the table's file list at its current version (its snapshot's
    state: a few Spark jobs), which Delta then keeps for that version. Loaded while the run does other work, the
    write finds it ready. The returned future completes when every list is loaded and never raises: a reference
    that is not a Delta table (yet) or cannot be read is skipped, and the write that follows reports its own errors.
    """
    return in_background("file-lists", _load_file_lists, spark, list(refs))


def _load_file_lists(spark: SparkSession, refs: list[str | TableRef]) -> None:
    for ref in refs:
        try:
            # the file count needs the whole file list; asking first whether it is Delta would read its log once more
            delta_detail(spark, ref).select("numFiles").first()
        except Exception:  # noqa: BLE001 (best effort: the write reads the table again and reports what fails)
            log.debug("could not load the file list of %s ahead of its write", ref, exc_info=True)


def is_delta(spark: SparkSession, ref: str | TableRef) -> bool:
    """Whether ``ref`` (a path or a table) is a Delta table: a path has a Delta log with a commit
    (:func:`~lakescore.jobs.platform.spark.adapter.is_delta_path`); otherwise Delta answers ``DESCRIBE HISTORY`` for
    it."""
    ref = TableRef.parse(ref)
    known = spark_adapter.is_delta_path(spark, ref.text) if ref.is_path else None
    if known is not None:
        return known
    try:
        spark.sql(f"DESCRIBE HISTORY {ref.sql} LIMIT 1").collect()
    except AnalysisException:
        return False
    return True


def table_names(spark: SparkSession, namespace: str) -> list[str]:
    """The names of the tables in ``namespace`` (its parts quoted,
    :attr:`~lakescore.jobs.references.TableName.quoted_namespace`; empty: the session's current schema), temporary views
    left out. ``SHOW TABLES``, which Spark Connect runs too."""
    rows = spark.sql("SHOW TABLES" + (f" IN {namespace}" if namespace else "")).collect()
    return [row["tableName"] for row in rows if not row["isTemporary"]]


def _is_uncommitted_delta_dir(spark: SparkSession, ref: str) -> bool:
    """True when ``ref`` is an empty directory (an object store's marker after the write probe) or holds nothing but a
    ``_delta_log`` without a single commit: what a first publish that failed mid-commit leaves. Such a directory is an
    empty table to the next run, not a foreign one. Over Connect (no listing API) it is never taken for one: the run
    refuses to overwrite it."""
    names = spark_adapter.child_names(spark, ref)
    if names == []:
        return True
    if names != ["_delta_log"]:
        return False
    commit = re.compile(r"\d{20}\.(json|checkpoint.*\.parquet)$")
    return not any(
        commit.match(name) for name in spark_adapter.child_names(spark, f"{ref.rstrip('/')}/_delta_log") or ()
    )
