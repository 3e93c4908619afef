"""Reading inputs and writing Delta outputs by reference: a metastore table name or a path.

A reference containing ``/``, ``\\`` or ``:`` outside backtick-quoted name parts is a path (``/data/x``,
``./x``, ``s3a://bucket/x``, ``dbfs:/x``). A bare name (``reviews``, ``reviews.parquet``, ``db.table``)
is a path when a local file or directory of that name exists in the working directory, and a table
identifier (``table``, ``db.table`` or ``catalog.db.table``, parts quoted with backticks where needed:
:mod:`lakescore.jobs.platform.identifiers`) otherwise, handed to Spark quoted: the local path wins, so
``--input reviews.parquet`` reads the file beside you rather than the table `reviews`.`parquet`.

Delta facts (is it Delta, its versions, the rows a commit wrote, its history) come from Delta's SQL
(``DESCRIBE HISTORY``), which classic and Spark Connect sessions both run: the ``DeltaTable``
Python API needs the Delta Connect server plugin over Connect. Filesystem calls go through
:mod:`lakescore.jobs.platform.spark_adapter`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from lakescore.jobs.platform import spark_adapter
from lakescore.jobs.platform.identifiers import has_path_separator, parse_table_name, quote_identifier
from lakescore.schemas.column_names import DELTA_REFUSED_CHARACTERS, refused_by_delta
from lakescore.schemas.output import column_types

__all__ = [
    "TableError",
    "OutputColumnsError",
    "cause_chain",
    "unreadable_input",
    "storage_refusal",
    "failure_reason",
    "check_writable_path",
    "column",
    "is_path",
    "local_ref",
    "read_input",
    "read_pinned",
    "check_output_target",
    "DeltaCommit",
    "WriteConflictError",
    "is_commit_conflict",
    "write_delta_overwrite",
    "overwrite_delta",
    "DELETION_VECTORS",
    "MERGE_OP",
    "MergeCommit",
    "merge_delta",
    "append_delta",
    "last_commit",
    "own_commit",
    "table_id",
    "load_file_lists",
    "delete_path",
    "drop_delta",
    "is_delta",
    "table_names",
    "last_commit_stamp",
    "run_metadata",
    "staging_metadata",
    "delta_history",
    "HistoryEntry",
]

log = logging.getLogger(__name__)


class TableError(ValueError):
    """An input or output reference cannot be read or written as asked."""


class OutputColumnsError(TableError):
    """An existing output's columns differ from those the run writes; ``existing`` holds its schema."""

    def __init__(self, message: str, existing: StructType) -> None:
        super().__init__(message)
        self.existing = existing


_UNREADABLE_FILE = re.compile(
    r"\[(?:FAILED_READ_FILE[A-Z_.]*|CANNOT_READ_FILE_FOOTER)\][^\n]*?(?:reading file|footer for file:?)\s+(\S+?)\.?(?:\s|$)"
)


def cause_chain(exc: BaseException) -> list[str]:
    """What ``exc`` and everything behind it said, outermost first, one line each: Python's chain (``__cause__``,
    else ``__context__``) and, for an error raised in the JVM, its Java causes
    (:func:`~lakescore.jobs.platform.spark_adapter.java_causes`), or where only the error's text came back (Spark
    Connect, a JVM that is gone) that text's first line and the ``Caused by:`` lines of its text and of the stack
    trace it carries (Spark Connect's ``getStackTrace()``, the server's). The last is the root cause."""
    chain: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        java = [cause.strip().splitlines()[0] for cause in spark_adapter.java_causes(exc) if cause.strip()]
        chain += java or _text_causes(exc)  # a Java message's first line: later ones hold plans or a task's trace
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return chain


def _text_causes(exc: BaseException) -> list[str]:
    try:
        text = str(exc)
        stack = exc.getStackTrace() if callable(getattr(exc, "getStackTrace", None)) else None
    except Exception:  # noqa: BLE001 (a py4j error whose JVM is gone cannot even print itself)
        return [type(exc).__name__]
    lines = [line.strip() for line in f"{text}\n{stack or ''}".splitlines() if line.strip()]
    if not lines:
        return [type(exc).__name__]
    caused = [line[len("Caused by:"):].strip() for line in lines[1:] if line.startswith("Caused by:")]
    return [lines[0], *dict.fromkeys(caused)]  # a trace shown in the text and carried beside it: each cause once


def unreadable_input(exc: BaseException) -> Optional[str]:
    """One line naming the input file Spark could not read (corrupt, truncated, not Parquet, no permission),
    with the reader's own reason (the root cause); ``None`` when ``exc`` is not such a failure."""
    chain = cause_chain(exc)
    found = _UNREADABLE_FILE.search("\n".join(chain))
    if found is None:
        return None
    return f"cannot read input file {found.group(1)}: {chain[-1][:300]}"


_STORAGE_REFUSALS = (
    (re.compile(r"no space left on device", re.I), "no space left on device"),
    (re.compile(r"disk quota exceeded|diskspace quota of \S+ is exceeded", re.I), "disk quota exceeded"),
    (re.compile(r"read-only file system", re.I), "read-only file system"),
)
"""A filesystem's refusals of a write that an operator fixes outside lakescore, as the one line names them."""

_WRITTEN_PATH = re.compile(r"(?:writing rows to|Cannot create|Mkdirs failed to create)\s+(\S+?)\.?(?:\s|$)")
_URI = re.compile(r"\b[a-z][a-z0-9+.-]*:/[^\s'\"(),]+")


def storage_refusal(text: str) -> Optional[str]:
    """The filesystem's refusal ``text`` reports, as :data:`_STORAGE_REFUSALS` names it; ``None`` for anything else.

    >>> storage_refusal("java.io.IOException: No space left on device")
    'no space left on device'
    """
    return next((name for pattern, name in _STORAGE_REFUSALS if pattern.search(text)), None)


def failure_reason(exc: BaseException) -> Optional[str]:
    """One line saying what failed and its root cause, for an error Spark raised: an input file it cannot read
    (:func:`unreadable_input`); a write the filesystem refused (:func:`storage_refusal`), e.g. ``no space left on
    device writing file:/data/out`` (a Python ``OSError`` too; ``during <step>`` where no path is named); any other
    as its outermost message and its root cause. ``None`` for other errors: lakescore's own say it in their message."""
    from_spark = type(exc).__module__.split(".", 1)[0] in ("py4j", "pyspark")
    if not from_spark and not isinstance(exc, OSError):
        return None
    unreadable = unreadable_input(exc) if from_spark else None
    if unreadable is not None:
        return unreadable
    chain = cause_chain(exc)
    root = chain[-1]
    refused = next((r for r in map(storage_refusal, reversed(chain)) if r), None)
    if refused is not None:
        where, step = _written_path(exc, chain), getattr(exc, "lakescore_step", None)
        return f"{refused} writing {where}" if where else f"{refused} during {step}" if step else refused
    if not from_spark:
        return None
    outermost = _JAVA_CLASS.sub("", chain[0], count=1)
    return outermost if len(chain) == 1 or root in chain[0] else f"{outermost}; root cause: {root}"


_JAVA_CLASS = re.compile(r"^(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*: ")
"""The class name a Java exception's ``toString()`` starts with (``org.apache.spark.SparkException: ``)."""


def _written_path(exc: BaseException, chain: list[str]) -> Optional[str]:
    """The path a failed write names: Spark's, the first URI in the chain, or a Python ``OSError``'s file name."""
    text = "\n".join(chain)
    found = _WRITTEN_PATH.search(text) or _URI.search(text)
    if found is not None:
        return found.group(1) if found.re is _WRITTEN_PATH else found.group(0)
    return getattr(exc, "filename", None)


def check_writable_path(spark: SparkSession, ref: str, what: str) -> None:
    """Before any compute: a file can be created where the path ``ref`` will be written (the output, the errors
    table, staging), as the session's Hadoop filesystem sees it
    (:func:`~lakescore.jobs.platform.spark_adapter.probe_write`); :class:`TableError` naming the refusal otherwise.
    Over Spark Connect nothing is probed."""
    try:
        spark_adapter.probe_write(spark, ref)
    except Exception as exc:  # noqa: BLE001 (whatever the filesystem refused, the run would write nothing)
        root = cause_chain(exc)[-1]
        raise TableError(f"cannot write {what} {ref!r}: {storage_refusal(root) or root[:300]}") from exc


def column(name: str):
    """A column by its exact name, even one with dots or backticks in it."""
    from pyspark.sql import functions as F

    return F.col(quote_identifier(name))


def is_path(ref: str) -> bool:
    """True when ``ref`` names a filesystem path rather than a metastore table.

    A reference with ``/``, ``\\`` or ``:`` outside backtick-quoted parts always is one (``db.`a/b``` is
    a table); a bare name is one when it exists locally (relative to the working directory).

    >>> is_path("s3a://bucket/x"), is_path("sales.no_such_local_file"), is_path("db.`a/b`")
    (True, False, False)
    """
    return has_path_separator(ref) or os.path.exists(ref)


def local_ref(ref: Optional[str]) -> Optional[str]:
    """``ref`` spelled unambiguously: the absolute path of a bare name that exists locally, else ``ref`` as given.

    Absolute, because Spark resolves a relative path against the JVM's working directory,
    which is not this process's once it has changed directory. References derived from
    the result (``<output>_errors``, the staging directory) follow the same reading:
    beside a local output, not in the metastore.

    >>> local_ref("sales.no_such_local_file"), local_ref("/data/x"), local_ref(None)
    ('sales.no_such_local_file', '/data/x', None)
    """
    if ref and not has_path_separator(ref) and os.path.exists(ref):
        return os.path.abspath(ref)
    return ref


def read_input(spark: SparkSession, ref: str, fmt: str = "auto", version: Optional[int] = None) -> DataFrame:
    """A DataFrame over ``ref``: a metastore table, or a Delta / Parquet path.

    ``fmt="auto"`` reads a path as Delta when it holds a Delta log, else as Parquet. ``version``
    reads a Delta table (path or name) at that version (``versionAsOf``, classic and Connect alike).
    Raises :class:`TableError` naming the reference when it does not exist or cannot be read.
    """
    ref = local_ref(ref)
    reader = spark.read if version is None else spark.read.option("versionAsOf", int(version))
    try:
        if not is_path(ref):
            df = reader.table(parse_table_name(ref, "input").quoted)
        else:
            if fmt == "auto":
                fmt = "delta" if is_delta(spark, ref) else "parquet"
            df = reader.format(fmt).load(ref)
        df.schema  # a Spark Connect DataFrame is analysed only when asked: fail here, before compute
        return df
    except AnalysisException as exc:
        if not is_path(ref) and _is_not_found(exc):
            raise TableError(f"cannot read input {ref!r}: {_tried(ref)}") from exc
        raise TableError(f"cannot read input {ref!r}: {_first_line(exc)}") from exc


def read_pinned(spark: SparkSession, ref: str, fmt: str = "auto") -> tuple[DataFrame, Optional[int]]:
    """``ref`` read at one snapshot, so every Spark job of a run sees the same rows: ``(DataFrame, Delta version)``.

    A Delta input (path or table) is read at its latest version, ``versionAsOf`` (returned); a Parquet path
    at the file listing taken now (the files named explicitly, partition columns kept through ``basePath``;
    version ``None``). Either way a commit or a new file upstream while the run goes on changes nothing in it,
    in classic and Spark Connect sessions alike (Connect analyses a plan again for every job). Other tables
    (not Delta) are read as they are. Raises :class:`TableError` as :func:`read_input` does.
    """
    df = read_input(spark, ref, fmt)
    ref = local_ref(ref)
    if fmt != "parquet" and is_delta(spark, ref):
        version = last_commit(spark, ref).version
        return read_input(spark, ref, "delta", version=version), version
    if is_path(ref):
        files = df.inputFiles()
        single_file = len(files) == 1 and files[0].endswith("/" + ref.rstrip("/").rsplit("/", 1)[-1])
        if files and not single_file:  # a directory's listing: name its files
            return spark.read.schema(df.schema).option("basePath", ref).parquet(*files), None
    return df, None


def check_output_target(spark: SparkSession, ref: str, schema: StructType, version: bool = True) -> Optional[int]:
    """Fail before any compute if ``ref`` cannot take an overwrite with ``schema``.

    Returns the current Delta version of the target (read from its history: one Spark job, skipped for
    ``version=False``, which returns ``None``), or ``None`` if it does not exist yet.
    Raises :class:`TableError` if a column name of ``schema`` is one Delta refuses (a space, ``,;{}()=``, a tab or a
    newline: :mod:`~lakescore.schemas.column_names`), the table's database is missing, the target exists but
    is not Delta, or (:class:`OutputColumnsError`) its columns differ from ``schema`` (names and types). A directory holding
    only a ``_delta_log`` without a commit (what a first publish that failed mid-commit leaves)
    counts as not existing yet.
    """
    ref = local_ref(ref)
    refused = refused_by_delta(schema.names)
    if refused is not None:
        suggested = "".join("_" if c in DELTA_REFUSED_CHARACTERS else c for c in refused)
        raise TableError(
            f"output {ref!r} cannot have a column named {refused!r}: Delta refuses the characters "
            f"{DELTA_REFUSED_CHARACTERS!r} in column names; rename it in the input, e.g. in a view: "
            f"SELECT {quote_identifier(refused)} AS {suggested}, ..."
        )
    if is_path(ref):
        if not is_delta(spark, ref):
            if spark_adapter.path_exists(spark, ref) and not _is_uncommitted_delta_dir(spark, ref):
                raise TableError(f"output path {ref!r} exists and is not a Delta table; refusing to overwrite it")
            return None
        existing = spark.read.format("delta").load(ref).schema
    else:
        table = parse_table_name(ref, "output")
        if table.namespace and not spark.catalog.databaseExists(table.quoted_namespace):
            raise TableError(
                f"output database {'.'.join(table.namespace)!r} does not exist (output {ref!r}: {_tried(ref)}; "
                f"name a new local Delta path as ./{ref})"
            )
        if not spark.catalog.tableExists(table.quoted):
            return None
        if not is_delta(spark, ref):
            raise TableError(f"output table {ref!r} exists and is not a Delta table")
        existing = spark.table(table.quoted).schema
    if column_types(existing) != column_types(schema):
        raise OutputColumnsError(
            f"output {ref!r} has columns {existing.simpleString()} but this run writes {schema.simpleString()}; "
            "write to a new output or drop the old one", existing
        )
    return last_commit(spark, ref).version if version else None


@dataclass(frozen=True)
class DeltaCommit:
    """The commit a write made: table version and the rows it wrote (Delta's own metric)."""

    version: int
    rows: Optional[int]


class WriteConflictError(RuntimeError):
    """Another writer committed to the same table at the same time; this run's commit was refused."""


def write_delta_overwrite(
    df: DataFrame,
    ref: str,
    replace_where: Optional[str] = None,
    partition_by: Optional[str] = None,
    user_metadata: Optional[str] = None,
    txn: Optional[tuple[str, int]] = None,
    table_properties: Optional[Mapping[str, str]] = None,
    overwrite_schema: bool = False,
) -> DeltaCommit:
    """Overwrite ``ref`` with ``df`` as one Delta commit and return that commit.

    Overwrite makes a rerun replace the previous rows instead of adding to them; readers
    see either the old or the new snapshot, never a mix. With ``replace_where`` (a SQL
    predicate) only the rows matching it are replaced, atomically; Delta refuses the
    write if ``df`` holds a row outside the predicate. ``partition_by`` and ``table_properties``
    (Delta table properties, e.g. ``delta.enableDeletionVectors``) apply when the write creates the
    table; an existing table keeps its own. ``user_metadata`` is stored in the commit's ``commitInfo.userMetadata``
    (lakescore's is :func:`run_metadata`; :func:`delta_history` reads it back), and the commit
    is recorded even when it changes no file (Delta skips such commits by default), so a run that
    wrote no rows still leaves its tag, and the commit returned is found by that tag (:func:`own_commit`),
    not taken as the latest: under concurrency the latest may be another writer's.

    ``txn``: ``(app id, version)`` makes the write idempotent (Delta's ``txnAppId`` / ``txnVersion``):
    Delta skips it when the table already holds a commit of that app id at that version or later, and
    the commit returned is then the earlier one (found by its tag). A rerun after a driver died between
    the commit and the rest of the run publishes nothing twice.

    ``overwrite_schema``: the table's columns become ``df``'s (Delta's ``overwriteSchema``), where they differ.

    A concurrent commit that Delta refuses raises :class:`WriteConflictError`.
    """
    ref = local_ref(ref)
    _overwrite(df, ref, replace_where, partition_by, user_metadata, txn, table_properties, overwrite_schema)
    return own_commit(df.sparkSession, ref, user_metadata)


def overwrite_delta(df: DataFrame, ref: str, partition_by: Optional[str] = None, user_metadata: Optional[str] = None) -> None:
    """Overwrite ``ref`` with ``df`` in one Delta commit, as :func:`write_delta_overwrite` does, but without reading
    the commit back from the history (one Spark job fewer): for a private table whose commit nobody checks, such as a
    run's staging tables. ``partition_by`` applies when the write creates the table; ``user_metadata`` is stored in
    the commit info.

    A concurrent commit that Delta refuses raises :class:`WriteConflictError`.
    """
    _overwrite(df, local_ref(ref), None, partition_by, user_metadata, None, None)


def _overwrite(df: DataFrame, ref: str, replace_where: Optional[str], partition_by: Optional[str], user_metadata: Optional[str],
               txn: Optional[tuple[str, int]], table_properties: Optional[Mapping[str, str]],
               overwrite_schema: bool = False) -> None:
    writer = df.write.format("delta").mode("overwrite")
    if overwrite_schema:
        writer = writer.option("overwriteSchema", "true")
    if txn is not None:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", int(txn[1]))
    if replace_where is not None:
        writer = writer.option("replaceWhere", replace_where)
    if (partition_by is not None or table_properties) and not _target_exists(df.sparkSession, ref):
        if partition_by is not None:
            writer = writer.partitionBy(partition_by)
        for key, value in (table_properties or {}).items():
            writer = writer.option(key, value)  # Delta stores delta.* writer options as properties of a new table
    if user_metadata is not None:
        writer = writer.option("userMetadata", user_metadata)
    try:
        with _recording_empty_commits(df.sparkSession, user_metadata is not None):
            _save(writer, ref)
    except Exception as exc:
        if is_commit_conflict(exc):
            raise WriteConflictError(
                f"another run committed to {ref!r} at the same time and Delta refused this run's commit "
                f"({_first_line(exc)}); the table holds the other run's complete result. Rerun to replace it."
            ) from exc
        raise


DELETION_VECTORS = "delta.enableDeletionVectors"
"""The Delta table property that lets ``MERGE``, ``UPDATE`` and ``DELETE`` mark rows deleted instead of rewriting files."""

MERGE_OP = "_lakescore_op"
"""The column of a :func:`merge_delta` source saying what each row does: ``upsert`` or ``delete``."""


@dataclass(frozen=True)
class MergeCommit:
    """The commit a :func:`merge_delta` made, with Delta's own counts of the rows it touched."""

    version: int
    inserted: int
    updated: int
    deleted: int


def merge_delta(
    changes: DataFrame, ref: str, id_col: str, columns: list[str], view: str, user_metadata: Optional[str] = None,
    txn: Optional[tuple[str, int]] = None,
) -> MergeCommit:
    """Apply ``changes`` to the Delta table ``ref`` in one ``MERGE`` commit and return it: Delta's API for a path in a
    classic session, SQL otherwise (a table, or over Connect, where the API needs the server's Delta Connect plugin).

    ``changes`` holds at most one row per ``id_col`` value and a :data:`MERGE_OP` column: an ``upsert`` row
    updates the output row of its id (every column of ``columns``) or inserts it; a ``delete`` row deletes the
    output row of its id, if any. For SQL, the source is registered as the temporary view ``view`` for the
    statement's length. ``user_metadata`` is stored in the commit info, as :func:`write_delta_overwrite` does, and the
    commit returned is found by it; ``txn`` makes the MERGE idempotent as there (Delta's session settings
    ``spark.databricks.delta.write.txnAppId`` / ``txnVersion``). A concurrent commit that Delta refuses raises
    :class:`WriteConflictError`.
    """
    ref = local_ref(ref)
    spark = changes.sparkSession
    quoted = [quote_identifier(c) for c in columns]
    key = quote_identifier(id_col)
    on, delete, upsert = f"t.{key} = s.{key}", f"s.{MERGE_OP} = 'delete'", f"s.{MERGE_OP} = 'upsert'"
    assignments = {c: f"s.{c}" for c in quoted}  # target column -> source value, for UPDATE and INSERT alike
    app_id, txn_version = (txn[0], str(int(txn[1]))) if txn is not None else (None, None)
    # Delta's MERGE reads its source twice (to find the files it touches, then to write). Its "auto" setting leaves
    # a deterministic source of Delta scans unmaterialized, so each pass plans and lists this run's staging, errors
    # and changes tables again; materialized once, a W3 incremental run's publish step took 3.0 s instead of 3.75
    # (medians of 7 alternating runs, 2-core AMD EPYC). A session that sets it keeps its own value.
    materialize = None if spark.conf.get(_MATERIALIZE_SOURCE, None) is not None else "all"
    # A path in a classic session merges through Delta's API: SQL's delta.`<path>` is first looked up as a
    # table in the metastore, which starts the Derby client (~3 s of a W3 incremental run's MERGE, measured here).
    target = spark_adapter.delta_path_table(spark, ref) if is_path(ref) else None
    if target is None:
        changes.createOrReplaceTempView(view)
    try:
        with _session_conf(spark, _COMMIT_METADATA, user_metadata), _session_conf(spark, _TXN_APP_ID, app_id), \
                _session_conf(spark, _TXN_VERSION, txn_version), \
                _session_conf(spark, _MATERIALIZE_SOURCE, materialize, refused_ok=True):
            if target is not None:
                (target.alias("t").merge(changes.alias("s"), on)
                 .whenMatchedDelete(condition=delete)
                 .whenMatchedUpdate(condition=upsert, set=assignments)
                 .whenNotMatchedInsert(condition=upsert, values=assignments)
                 .execute())
            else:
                spark.sql(
                    f"MERGE INTO {_delta_sql(ref)} AS t USING {quote_identifier(view)} AS s ON {on} "
                    f"WHEN MATCHED AND {delete} THEN DELETE "
                    f"WHEN MATCHED AND {upsert} THEN UPDATE SET {', '.join(f't.{c} = {v}' for c, v in assignments.items())} "
                    f"WHEN NOT MATCHED AND {upsert} THEN INSERT ({', '.join(assignments)}) VALUES ({', '.join(assignments.values())})"
                ).collect()
    except Exception as exc:
        if is_commit_conflict(exc):
            raise WriteConflictError(
                f"another run committed to {ref!r} at the same time and Delta refused this run's MERGE "
                f"({_first_line(exc)}); the table holds the other run's result. Rerun to apply this run's changes."
            ) from exc
        raise
    finally:
        if target is None:
            spark.catalog.dropTempView(view)
    last = _own_history_row(spark, ref, user_metadata)
    metrics = last["operationMetrics"] or {}
    count = lambda name: int(metrics.get(name) or 0)  # noqa: E731
    return MergeCommit(int(last["version"]), count("numTargetRowsInserted"), count("numTargetRowsUpdated"), count("numTargetRowsDeleted"))


_COMMIT_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
_TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"


@contextmanager
def _session_conf(spark: SparkSession, key: str, value: Optional[str], refused_ok: bool = False):
    """While the block runs, the session setting ``key`` is ``value`` (``None``: left as it is); restored afterwards.

    ``refused_ok``: where the platform refuses the setting (serverless compute allows only some), the block
    runs with the platform's value instead of raising.
    """
    if value is None:
        yield
        return
    try:
        previous = spark.conf.get(key, None)
        spark.conf.set(key, value)
    except Exception:
        if not refused_ok:
            raise
        yield
        return
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


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


def append_delta(
    df: DataFrame, ref: str, txn_app_id: Optional[str] = None, txn_version: Optional[int] = None,
    user_metadata: Optional[str] = None,
) -> None:
    """Append ``df`` to the Delta table at ``ref`` in one commit, tagged with ``user_metadata`` when given.

    With ``txn_app_id``/``txn_version`` the commit is idempotent: Delta skips it when
    a commit with that app id and this version or a later one already exists.
    """
    writer = df.write.format("delta").mode("append")
    if user_metadata is not None:
        writer = writer.option("userMetadata", user_metadata)
    if txn_app_id is not None:
        writer = writer.option("txnAppId", txn_app_id).option("txnVersion", int(txn_version))
    _save(writer, ref)


def last_commit(spark: SparkSession, ref: str) -> DeltaCommit:
    """The latest commit of the Delta table ``ref``: version and rows written (Delta's own metric)."""
    ref = local_ref(ref)
    last = _history(spark, ref, 1).select("version", "operationMetrics").first()
    rows = (last["operationMetrics"] or {}).get("numOutputRows")
    return DeltaCommit(version=int(last["version"]), rows=int(rows) if rows is not None else None)


def own_commit(spark: SparkSession, ref: str, user_metadata: Optional[str]) -> DeltaCommit:
    """The newest commit of ``ref`` tagged exactly ``user_metadata`` (:func:`run_metadata`): this run's own
    commit, whatever other writers committed after it. Without a tag: the latest commit (:func:`last_commit`).

    A write that changed nothing where the platform refuses to record empty commits (see
    :func:`write_delta_overwrite`) leaves no tagged commit: then the latest commit is returned.
    """
    last = _own_history_row(spark, local_ref(ref), user_metadata)
    rows = (last["operationMetrics"] or {}).get("numOutputRows")
    return DeltaCommit(version=int(last["version"]), rows=int(rows) if rows is not None else None)


def _own_history_row(spark: SparkSession, ref: str, user_metadata: Optional[str]):
    """``version`` and ``operationMetrics`` of the newest commit tagged ``user_metadata`` (else the latest).

    The latest entry is read first: it is the run's own commit unless another writer committed since, so the
    whole history (long on an old table) is read only then.
    """
    from pyspark.sql import functions as F

    columns = ("version", "operationMetrics", "userMetadata")
    latest = _history(spark, ref, 1).select(*columns).first()
    if user_metadata is None or latest["userMetadata"] == user_metadata:
        return latest
    history = _history(spark, ref).select(*columns)
    row = history.where(F.col("userMetadata") == F.lit(user_metadata)).orderBy(F.col("version").desc()).first()
    return row if row is not None else latest  # none tagged: an empty write the platform did not record


def table_id(spark: SparkSession, ref: str) -> str:
    """The Delta table's unique id (``DESCRIBE DETAIL``): a new one for each table created, even at the same path."""
    return str(_detail(spark, local_ref(ref)).select("id").first()[0])


def load_file_lists(spark: SparkSession, refs: Iterable[str]) -> "Future[None]":
    """Start loading the current file list of each Delta table in ``refs``, in a background thread.

    A Delta write to a table first reconstructs the table's file list at its current version (its snapshot's
    state: a few Spark jobs, ~0.5 s for a small table here), which Delta then keeps for that version. Loaded while
    the run does other work, the write finds it ready. The returned future completes when every list is loaded and
    never raises: a reference that is not a Delta table (yet) or cannot be read is skipped, and the write that
    follows reports its own errors.
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakescore-file-lists")
    future = pool.submit(_load_file_lists, spark, [local_ref(ref) for ref in refs])
    pool.shutdown(wait=False)
    return future


def _load_file_lists(spark: SparkSession, refs: list[str]) -> None:
    for ref in refs:
        try:
            if is_delta(spark, ref):
                _detail(spark, ref).select("numFiles").first()  # the file count needs the whole file list
        except Exception:  # noqa: BLE001 (best effort: the write reads the table again and reports what fails)
            log.debug("could not load the file list of %s ahead of its write", ref, exc_info=True)


def _detail(spark: SparkSession, ref: str) -> DataFrame:
    """``DESCRIBE DETAIL`` of the Delta table ``ref``: Delta's API for a path in a classic session (SQL's
    delta.`<path>` would start the metastore client, see :func:`merge_delta`), SQL otherwise."""
    table = spark_adapter.delta_path_table(spark, ref) if is_path(ref) else None
    return table.detail() if table is not None else spark.sql(f"DESCRIBE DETAIL {_delta_sql(ref)}")


def is_delta(spark: SparkSession, ref: str) -> bool:
    """Whether ``ref`` (a path or a table) is a Delta table: a path has a Delta log with a commit
    (:func:`~lakescore.jobs.platform.spark_adapter.is_delta_path`); otherwise Delta answers ``DESCRIBE HISTORY`` for it."""
    known = spark_adapter.is_delta_path(spark, ref) if is_path(ref) else None
    if known is not None:
        return known
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


def table_names(spark: SparkSession, namespace: str) -> list[str]:
    """The names of the tables in ``namespace`` (its parts quoted, :attr:`~lakescore.jobs.platform.identifiers.TableName.quoted_namespace`;
    empty: the session's current schema), temporary views left out. ``SHOW TABLES``, which Spark Connect runs too."""
    rows = spark.sql("SHOW TABLES" + (f" IN {namespace}" if namespace else "")).collect()
    return [row["tableName"] for row in rows if not row["isTemporary"]]


def last_commit_stamp(spark: SparkSession, ref: str) -> tuple[float, Optional[str]]:
    """When the latest commit of the Delta table ``ref`` was made, in seconds since the epoch (whatever the session's
    time zone), and the output its lakescore tag says the table stages for (:func:`staging_metadata`; ``None``)."""
    from pyspark.sql import functions as F

    row = _history(spark, local_ref(ref), 1).select(F.unix_micros("timestamp").alias("micros"), "userMetadata").first()
    return row["micros"] / 1e6, _tag(row["userMetadata"]).get("staging_for")


def _history(spark: SparkSession, ref: str, limit: Optional[int] = None) -> DataFrame:
    """``DESCRIBE HISTORY`` of the Delta table ``ref``, newest first, at most ``limit`` commits: through Delta's API
    for a path in a classic session (no metastore lookup, :func:`~lakescore.jobs.platform.spark_adapter.is_delta_path`),
    else in SQL."""
    table = spark_adapter.delta_path_table(spark, ref) if is_path(ref) else None
    if table is None:
        return spark.sql(f"DESCRIBE HISTORY {_delta_sql(ref)}" + (f" LIMIT {int(limit)}" if limit else ""))
    return table.history(limit) if limit else table.history()


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


_SKIP_EMPTY_COMMITS = "spark.databricks.delta.skipRecordingEmptyCommits"


def _recording_empty_commits(spark: SparkSession, wanted: bool):
    """While the block runs, Delta records a write that adds and removes no file (its default skips it).

    A session setting, restored afterwards; only Delta writes read it, and lakescore makes its
    tagged writes one at a time. Where the platform refuses the setting, the write goes ahead with
    the platform's behaviour: a refused setting costs a history entry, never the write.
    """
    return _session_conf(spark, _SKIP_EMPTY_COMMITS, "false" if wanted else None, refused_ok=True)


_METADATA_KEY = "lakescore"


def run_metadata(run_id: str, report: Optional[str], spec: Optional[Mapping[str, Any]] = None) -> str:
    """The ``userMetadata`` lakescore tags its commits with: ``{"lakescore": {"run_id", "report"}}`` as JSON
    (``report``: the JSON report's absolute path, or ``None``), with ``"spec"`` when given (an incremental run's
    scoring spec, which the next run compares with). A few dozen bytes in the commit info; about a kilobyte with a spec.

    >>> run_metadata("2026-11-21", None)
    '{"lakescore": {"run_id": "2026-11-21", "report": null}}'
    """
    tag: dict[str, Any] = {"run_id": run_id, "report": report}
    if spec is not None:
        tag["spec"] = spec
    return json.dumps({_METADATA_KEY: tag}, sort_keys=False)


def staging_metadata(output: str, tag: Optional[str] = None) -> str:
    """The ``userMetadata`` of a staging table's commits: the run's ``tag`` (:func:`run_metadata`, if any) and the
    output the table stages for, by which a later run of that output tells its own stale staging in a shared
    ``write.staging`` location (:func:`last_commit_stamp`).

    >>> staging_metadata("db.scores", run_metadata("r1", None))
    '{"lakescore": {"run_id": "r1", "report": null, "staging_for": "db.scores"}}'
    """
    return json.dumps({_METADATA_KEY: {**_tag(tag), "staging_for": output}})


@dataclass(frozen=True)
class HistoryEntry:
    """One commit of a Delta table's history, with lakescore's tag when it has one."""

    version: int
    timestamp: str
    operation: str
    rows: Optional[int]
    run_id: Optional[str]
    report: Optional[str]
    spec: Optional[dict] = None
    """The scoring spec's parts an incremental run recorded (:func:`run_metadata`)."""


def delta_history(spark: SparkSession, ref: str, limit: Optional[int] = None) -> list[HistoryEntry]:
    """The commits of the Delta table ``ref``, newest first (at most ``limit``); ``[]`` when it does not exist.

    ``run_id`` and ``report`` come from :func:`run_metadata` tags; other commits have ``None`` there.
    """
    ref = local_ref(ref)
    if not _target_exists(spark, ref):
        return []
    rows = _history(spark, ref, limit).select("version", "timestamp", "operation", "operationMetrics", "userMetadata").collect()
    entries = []
    for row in rows:
        tag = _tag(row["userMetadata"])
        output_rows = (row["operationMetrics"] or {}).get("numOutputRows")
        entries.append(HistoryEntry(
            version=int(row["version"]), timestamp=row["timestamp"].isoformat(sep=" ", timespec="seconds"),
            operation=row["operation"], rows=int(output_rows) if output_rows is not None else None,
            run_id=tag.get("run_id"), report=tag.get("report"), spec=tag.get("spec"),
        ))
    return sorted(entries, key=lambda e: -e.version)


def _tag(user_metadata: Optional[str]) -> dict[str, Any]:
    try:
        tag = json.loads(user_metadata or "{}").get(_METADATA_KEY)
    except (ValueError, AttributeError):  # someone else's metadata: not JSON, or not an object
        return {}
    return tag if isinstance(tag, dict) else {}


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
    return not any(commit.match(name) for name in spark_adapter.child_names(spark, f"{ref.rstrip('/')}/_delta_log") or ())


def _is_not_found(exc: AnalysisException) -> bool:
    condition = exc.getCondition() if hasattr(exc, "getCondition") else exc.getErrorClass()
    return (condition or "").startswith(("TABLE_OR_VIEW_NOT_FOUND", "SCHEMA_NOT_FOUND")) or "not found" in str(exc).lower()


def _tried(ref: str) -> str:
    """What a bare name was looked up as, for not-found messages."""
    return f"no table {parse_table_name(ref).quoted}, and no file ./{ref}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
