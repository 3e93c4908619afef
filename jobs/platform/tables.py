"""Reading inputs and writing Delta outputs by reference: a metastore table name or a path.

A reference containing ``/``, ``\\`` or ``:`` outside backtick-quoted name parts is a path (``/data/x``,
``./x``, ``s3a://bucket/x``, ``dbfs:/x``). A bare name (``reviews``, ``reviews.parquet``, ``db.table``)
is a path when a local file or directory of that name exists in the working directory, and a table
identifier (``table``, ``db.table`` or ``catalog.db.table``, parts quoted with backticks where needed:
:mod:`lakescore.jobs.references`) otherwise, handed to Spark quoted: the local path wins, so
``--input reviews.parquet`` reads the file beside you rather than the table `reviews`.`parquet`.

Each reference is read once into a :class:`TableRef` (path or parsed name). One function per operation follows,
each working in classic and Spark Connect sessions: :func:`read_input` / :func:`read_pinned` / :func:`read_files`,
:func:`write_delta`
(overwrite, replaceWhere or append), :func:`merge_delta`, :func:`delta_history` (every Delta fact about commits comes
from its one row parser) and :func:`delta_detail`. Delta's SQL runs everywhere; for a path in a classic session the
same operation runs through Delta's ``DeltaTable`` API instead (:meth:`TableRef.delta_api`), which skips the
metastore lookup SQL makes for ``delta.`<path>```. Filesystem calls go through
:mod:`lakescore.jobs.platform.spark_adapter`.
"""

from __future__ import annotations

import json
import logging
import re
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from lakescore.jobs.platform.background import in_background
from lakescore.jobs.platform import spark_adapter
from lakescore.jobs.references import TableName, is_path, local_ref, parse_table_name, quote_identifier
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
    "TableRef",
    "read_input",
    "read_pinned",
    "read_files",
    "check_output_target",
    "DeltaCommit",
    "WriteConflictError",
    "is_commit_conflict",
    "WRITE_MODES",
    "write_delta",
    "DELETION_VECTORS",
    "MERGE_OP",
    "MergeCommit",
    "merge_delta",
    "HistoryEntry",
    "delta_history",
    "last_commit",
    "own_commit",
    "last_commit_stamp",
    "delta_detail",
    "table_id",
    "load_file_lists",
    "is_delta",
    "delete_path",
    "drop_delta",
    "table_names",
    "run_metadata",
    "staging_metadata",
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


@dataclass(frozen=True)
class TableRef:
    """A reference read once: a filesystem path, or a parsed metastore table name. Every function of this module takes
    a string or a ``TableRef`` and parses a string once, at its top (:meth:`parse`).

    >>> TableRef.parse("/data/x").sql, TableRef.parse("db.`we``ird`").sql
    ('delta.`/data/x`', '`db`.`we``ird`')
    """

    text: str
    """The reference as given, made unambiguous (:func:`local_ref`): what messages quote."""
    name: Optional[TableName] = None
    """The parsed table name; ``None`` for a path."""

    @classmethod
    def parse(cls, ref: "str | TableRef", what: str = "table") -> "TableRef":
        """``ref`` as a path (:func:`is_path`) or a table name (``what`` names it in a bad name's one-line error)."""
        if isinstance(ref, TableRef):
            return ref
        text = local_ref(ref)
        return cls(text, None if is_path(text) else parse_table_name(text, what))

    @property
    def is_path(self) -> bool:
        """True for a filesystem path, false for a metastore table."""
        return self.name is None

    @property
    def sql(self) -> str:
        """The reference as Delta SQL names it: ``delta.`<path>``` or the quoted table name."""
        return f"delta.{quote_identifier(self.text)}" if self.name is None else self.name.quoted

    def __str__(self) -> str:
        return self.text

    def exists(self, spark: SparkSession) -> bool:
        """Whether the path holds a file or directory, or the catalog holds the table."""
        return spark_adapter.path_exists(spark, self.text) if self.name is None else spark.catalog.tableExists(self.name.quoted)

    def delta_api(self, spark: SparkSession):
        """Delta's ``DeltaTable`` for a path in a classic session, else ``None`` (a table, or Spark Connect: run SQL).

        The choice of how to run history, detail and MERGE: SQL's ``delta.`<path>``` is first looked up as a table
        in the metastore, which starts the metastore client that a run on paths needs for nothing else.
        """
        return spark_adapter.delta_path_table(spark, self.text) if self.name is None else None

    def load(self, reader):
        """A DataFrame from ``reader`` (a format set for a path) over this reference."""
        return reader.load(self.text) if self.name is None else reader.table(self.name.quoted)

    def save(self, writer) -> None:
        """Run ``writer`` (a ``DataFrameWriter``) into this reference."""
        if self.name is None:
            writer.save(self.text)
        else:
            writer.saveAsTable(self.name.quoted)


def read_input(spark: SparkSession, ref: "str | TableRef", fmt: str = "auto", version: Optional[int] = None) -> DataFrame:
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
        df.schema  # a Spark Connect DataFrame is analysed only when asked: fail here, before compute
        return df
    except AnalysisException as exc:
        if not ref.is_path and _is_not_found(exc):
            raise TableError(f"cannot read input {ref.text!r}: {_tried(ref)}") from exc
        raise TableError(f"cannot read input {ref.text!r}: {_first_line(exc)}") from exc


def read_pinned(spark: SparkSession, ref: "str | TableRef", fmt: str = "auto") -> tuple[DataFrame, Optional[int]]:
    """``ref`` read at one snapshot, so every Spark job of a run sees the same rows: ``(DataFrame, Delta version)``.

    A Delta input (path or table) is read at its latest version, ``versionAsOf`` (returned); a Parquet path
    at the file listing taken now (the files named explicitly, partition columns kept through ``basePath``;
    version ``None``). Either way a commit or a new file upstream while the run goes on changes nothing in it,
    in classic and Spark Connect sessions alike (Connect analyses a plan again for every job). Other tables
    (not Delta) are read as they are. Raises :class:`TableError` as :func:`read_input` does.
    """
    ref = TableRef.parse(ref, "input")
    df = read_input(spark, ref, fmt)
    if fmt != "parquet" and is_delta(spark, ref):
        version = last_commit(spark, ref).version
        return read_input(spark, ref, "delta", version=version), version
    if ref.is_path:
        files = df.inputFiles()
        single_file = len(files) == 1 and files[0].endswith("/" + ref.text.rstrip("/").rsplit("/", 1)[-1])
        if files and not single_file:  # a directory's listing: name its files
            return spark.read.schema(df.schema).option("basePath", ref.text).parquet(*files), None
    return df, None


def read_files(spark: SparkSession, ref: "str | TableRef", extensions: tuple[str, ...]) -> tuple[DataFrame, int]:
    """Every file under the folder ``ref``, recursively, whose name ends in ``.<extension>`` (any case), through
    Spark's ``binaryFile`` source (``path``, ``modificationTime``, ``length``, ``content``), and how many other files
    the folder holds (ignored). Both come from the folder's listing, taken now (a DataFrame keeps its listing in a
    classic session); no file is read. Raises :class:`TableError` for a table name, an unreadable folder, or a
    folder without such a file."""
    ref = TableRef.parse(ref, "input")
    if not ref.is_path:
        raise TableError(f"input_format images reads a folder of files; input {ref.text!r} is a table name")
    # A glob of character classes, so that PNG, Png and png all match: Hadoop's glob filter is case-sensitive
    pattern = "*.{" + ",".join("".join(f"[{c.lower()}{c.upper()}]" for c in ext) for ext in extensions) + "}"
    def files(**options):
        return ref.load(spark.read.format("binaryFile").options(recursiveFileLookup="true", **options))

    try:
        every = len(files().inputFiles())
        df = files(pathGlobFilter=pattern)
        matched = len(df.inputFiles())
    except AnalysisException as exc:
        raise TableError(f"cannot read input folder {ref.text!r}: {_first_line(exc)}") from exc
    if not matched:
        raise TableError(
            f"input folder {ref.text!r} holds no file named *.{{{','.join(extensions)}}} (of {every} file(s), in any case)"
        )
    return df, every - matched


def check_output_target(spark: SparkSession, ref: "str | TableRef", schema: StructType, version: bool = True) -> Optional[int]:
    """Fail before any compute if ``ref`` cannot take an overwrite with ``schema``.

    Returns the current Delta version of the target (read from its history: one Spark job, skipped for
    ``version=False``, which returns ``None``), or ``None`` if it does not exist yet.
    Raises :class:`TableError` if a column name of ``schema`` is one Delta refuses (a space, ``,;{}()=``, a tab or a
    newline: :mod:`~lakescore.schemas.column_names`), the table's database is missing, the target exists but
    is not Delta, or (:class:`OutputColumnsError`) its columns differ from ``schema`` (names and types). A directory holding
    only a ``_delta_log`` without a commit (what a first publish that failed mid-commit leaves)
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
        existing = spark.read.format("delta").load(ref.text).schema
    else:
        table = ref.name
        if table.namespace and not spark.catalog.databaseExists(table.quoted_namespace):
            raise TableError(
                f"output database {'.'.join(table.namespace)!r} does not exist (output {ref.text!r}: {_tried(ref)}; "
                f"name a new local Delta path as ./{ref.text})"
            )
        if not ref.exists(spark):
            return None
        if not is_delta(spark, ref):
            raise TableError(f"output table {ref.text!r} exists and is not a Delta table")
        existing = spark.table(table.quoted).schema
    if column_types(existing) != column_types(schema):
        raise OutputColumnsError(
            f"output {ref.text!r} has columns {existing.simpleString()} but this run writes {schema.simpleString()}; "
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


@contextmanager
def _conflicts_refused(ref: TableRef, what: str, then: str):
    """A commit conflict (:func:`is_commit_conflict`) raised in the block becomes one :class:`WriteConflictError` line."""
    try:
        yield
    except Exception as exc:
        if is_commit_conflict(exc):
            raise WriteConflictError(
                f"another run committed to {ref.text!r} at the same time and Delta refused this run's {what} "
                f"({_first_line(exc)}); {then}"
            ) from exc
        raise


WRITE_MODES = ("overwrite", "append")


def write_delta(
    df: DataFrame,
    ref: "str | TableRef",
    mode: str = "overwrite",
    *,
    replace_where: Optional[str] = None,
    partition_by: Optional[str] = None,
    table_properties: Optional[Mapping[str, str]] = None,
    overwrite_schema: bool = False,
    user_metadata: Optional[str] = None,
    txn: Optional[tuple[str, int]] = None,
) -> None:
    """Write ``df`` to the Delta table ``ref`` in one commit: ``mode="overwrite"`` replaces its rows, ``"append"``
    adds ``df``'s. Readers see either the old or the new snapshot, never a mix; read the commit back with
    :func:`own_commit`.

    ``replace_where`` (a SQL predicate, overwrite only) replaces only the rows matching it, atomically; Delta refuses
    the write if ``df`` holds a row outside it. ``partition_by`` and ``table_properties`` (Delta table properties,
    e.g. ``delta.enableDeletionVectors``) apply when the write creates the table; an existing table keeps its own.
    ``overwrite_schema``: the table's columns become ``df``'s (Delta's ``overwriteSchema``), where they differ.
    ``user_metadata`` is stored in the commit's ``commitInfo.userMetadata`` (lakescore's is :func:`run_metadata`;
    :func:`delta_history` reads it back). ``txn``: ``(app id, version)`` makes the write idempotent (Delta's
    ``txnAppId`` / ``txnVersion``): Delta skips it when the table holds a commit of that app id at that version or
    later, so a rerun after a driver died between the commit and the rest of the run writes nothing twice.

    A concurrent commit that Delta refuses raises :class:`WriteConflictError`.
    """
    if mode not in WRITE_MODES:
        raise ValueError(f"write mode {mode!r} is not one of {WRITE_MODES}")
    ref = TableRef.parse(ref)
    spark = df.sparkSession
    writer = df.write.format("delta").mode(mode)
    options = {"overwriteSchema": "true" if overwrite_schema else None, "replaceWhere": replace_where,
               "userMetadata": user_metadata}
    if txn is not None:
        options.update(txnAppId=txn[0], txnVersion=str(int(txn[1])))
    if (partition_by is not None or table_properties) and not ref.exists(spark):
        if partition_by is not None:
            writer = writer.partitionBy(partition_by)
        options.update(table_properties or {})  # Delta stores delta.* writer options as properties of a new table
    for key, value in options.items():
        if value is not None:
            writer = writer.option(key, value)
    # A tagged overwrite is recorded even when it changes no file (Delta skips such commits by default), so a run
    # that wrote no rows still leaves the tag its commit is found by (:func:`own_commit`); an empty append changes
    # nothing and stays unrecorded.
    then = ("the table holds the other run's complete result. Rerun to replace it." if mode == "overwrite"
            else "rerun to add this run's rows.")
    with _conflicts_refused(ref, "commit", then), \
            _recording_empty_commits(spark, mode == "overwrite" and user_metadata is not None):
        ref.save(writer)


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


@dataclass(frozen=True)
class _MergeClauses:
    """The one MERGE lakescore runs, target ``t`` and source ``s``: delete on a ``delete`` row, update or insert every
    column on an ``upsert`` row. Built once; run through Delta's builder (:meth:`run`) or as SQL (:meth:`sql`)."""

    on: str
    delete: str
    upsert: str
    assignments: dict[str, str]
    """Target column -> source value, for UPDATE and INSERT alike."""

    @classmethod
    def upsert_or_delete(cls, id_cols: Sequence[str], columns: list[str]) -> "_MergeClauses":
        keys = [quote_identifier(c) for c in id_cols]
        quoted = [quote_identifier(c) for c in columns]
        return cls(" AND ".join(f"t.{key} = s.{key}" for key in keys), f"s.{MERGE_OP} = 'delete'", f"s.{MERGE_OP} = 'upsert'",
                   {c: f"s.{c}" for c in quoted})

    def run(self, target, source: DataFrame) -> None:
        """Run on Delta's ``DeltaTable`` ``target``."""
        (target.alias("t").merge(source.alias("s"), self.on)
         .whenMatchedDelete(condition=self.delete)
         .whenMatchedUpdate(condition=self.upsert, set=self.assignments)
         .whenNotMatchedInsert(condition=self.upsert, values=self.assignments)
         .execute())

    def sql(self, target: str, source: str) -> str:
        """The statement merging the view ``source`` into ``target`` (both as SQL names them)."""
        sets = ", ".join(f"t.{c} = {v}" for c, v in self.assignments.items())
        return (f"MERGE INTO {target} AS t USING {source} AS s ON {self.on} "
                f"WHEN MATCHED AND {self.delete} THEN DELETE "
                f"WHEN MATCHED AND {self.upsert} THEN UPDATE SET {sets} "
                f"WHEN NOT MATCHED AND {self.upsert} THEN INSERT ({', '.join(self.assignments)}) "
                f"VALUES ({', '.join(self.assignments.values())})")


def merge_delta(
    changes: DataFrame, ref: "str | TableRef", id_cols: Sequence[str], columns: list[str], view: str,
    user_metadata: Optional[str] = None, txn: Optional[tuple[str, int]] = None,
) -> MergeCommit:
    """Apply ``changes`` to the Delta table ``ref`` in one ``MERGE`` commit and return it.

    ``changes`` holds at most one row per id (the values of ``id_cols``) and a :data:`MERGE_OP` column: an ``upsert`` row
    updates the output row of its id (every column of ``columns``) or inserts it; a ``delete`` row deletes the
    output row of its id, if any. Run through Delta's API for a path in a classic session
    (:meth:`TableRef.delta_api`), else as SQL with the source registered as the temporary view ``view`` for the
    statement's length. ``user_metadata`` is stored in the commit info, as :func:`write_delta` does, and the
    commit returned is found by it; ``txn`` makes the MERGE idempotent as there (Delta's session settings
    ``spark.databricks.delta.write.txnAppId`` / ``txnVersion``). A concurrent commit that Delta refuses raises
    :class:`WriteConflictError`.
    """
    ref = TableRef.parse(ref)
    spark = changes.sparkSession
    clauses = _MergeClauses.upsert_or_delete(id_cols, columns)
    app_id, txn_version = (txn[0], str(int(txn[1]))) if txn is not None else (None, None)
    # Delta's MERGE reads its source twice (to find the files it touches, then to write). Its "auto" setting leaves
    # a deterministic source of Delta scans unmaterialized, so each pass would plan and list this run's staging,
    # errors and changes tables again; materialized once, they are read once. A session that sets it keeps its own.
    materialize = None if spark.conf.get(_MATERIALIZE_SOURCE, None) is not None else "all"
    target = ref.delta_api(spark)
    if target is None:
        changes.createOrReplaceTempView(view)
    try:
        with _conflicts_refused(ref, "MERGE", "the table holds the other run's result. Rerun to apply this run's changes."), \
                _session_conf(spark, _COMMIT_METADATA, user_metadata), _session_conf(spark, _TXN_APP_ID, app_id), \
                _session_conf(spark, _TXN_VERSION, txn_version), \
                _session_conf(spark, _MATERIALIZE_SOURCE, materialize, refused_ok=True):
            if target is not None:
                clauses.run(target, changes)
            else:
                spark.sql(clauses.sql(ref.sql, quote_identifier(view))).collect()
    finally:
        if target is None:
            spark.catalog.dropTempView(view)
    entry = _own_entry(spark, ref, user_metadata)
    count = lambda name: int(entry.metrics.get(name) or 0)  # noqa: E731
    return MergeCommit(entry.version, count("numTargetRowsInserted"), count("numTargetRowsUpdated"), count("numTargetRowsDeleted"))


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
    scoring spec, which the next run compares with).

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


def _tag(user_metadata: Optional[str]) -> dict[str, Any]:
    try:
        tag = json.loads(user_metadata or "{}").get(_METADATA_KEY)
    except (ValueError, AttributeError):  # someone else's metadata: not JSON, or not an object
        return {}
    return tag if isinstance(tag, dict) else {}


@dataclass(frozen=True)
class HistoryEntry:
    """One commit of a Delta table's history (:func:`delta_history`), with lakescore's tag when it has one."""

    version: int
    timestamp: str
    """When it was committed, in the session's time zone, to the second."""
    operation: str
    rows: Optional[int]
    """The rows it wrote (Delta's ``numOutputRows``), where the operation reports them."""
    run_id: Optional[str]
    report: Optional[str]
    spec: Optional[dict] = None
    """The scoring spec's parts an incremental run recorded (:func:`run_metadata`)."""
    staging_for: Optional[str] = None
    """The output a staging table's commit stages for (:func:`staging_metadata`)."""
    committed_at: float = 0.0
    """When it was committed, in seconds since the epoch (whatever the session's time zone)."""
    metrics: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Delta's ``operationMetrics`` of the commit."""
    user_metadata: Optional[str] = field(default=None, compare=False, repr=False)

    @property
    def commit(self) -> DeltaCommit:
        """The commit as a write's result: version and rows written."""
        return DeltaCommit(self.version, self.rows)


def _history(spark: SparkSession, ref: TableRef, limit: Optional[int] = None) -> DataFrame:
    """``DESCRIBE HISTORY`` of the Delta table ``ref``, newest first, at most ``limit`` commits, in the columns
    :func:`_entry` reads (Delta's API or SQL: :meth:`TableRef.delta_api`)."""
    from pyspark.sql import functions as F

    api = ref.delta_api(spark)
    if api is not None:
        history = api.history(limit) if limit else api.history()
    else:
        history = spark.sql(f"DESCRIBE HISTORY {ref.sql}" + (f" LIMIT {int(limit)}" if limit else ""))
    return history.select("version", "timestamp", F.unix_micros("timestamp").alias("micros"), "operation",
                          "operationMetrics", "userMetadata")


def _entry(row) -> HistoryEntry:
    """One row of :func:`_history`, read: the only place Delta's history columns and lakescore's tag are parsed."""
    tag, metrics = _tag(row["userMetadata"]), dict(row["operationMetrics"] or {})
    rows = metrics.get("numOutputRows")
    return HistoryEntry(
        version=int(row["version"]), timestamp=row["timestamp"].isoformat(sep=" ", timespec="seconds"),
        operation=row["operation"], rows=int(rows) if rows is not None else None, run_id=tag.get("run_id"),
        report=tag.get("report"), spec=tag.get("spec"), staging_for=tag.get("staging_for"),
        committed_at=row["micros"] / 1e6, metrics=metrics, user_metadata=row["userMetadata"],
    )


def delta_history(spark: SparkSession, ref: "str | TableRef", limit: Optional[int] = None) -> list[HistoryEntry]:
    """The commits of the Delta table ``ref``, newest first (at most ``limit``); ``[]`` when it does not exist.

    ``run_id`` and ``report`` come from :func:`run_metadata` tags; other commits have ``None`` there.
    """
    ref = TableRef.parse(ref)
    if not ref.exists(spark):
        return []
    return sorted(map(_entry, _history(spark, ref, limit).collect()), key=lambda e: -e.version)


def last_commit(spark: SparkSession, ref: "str | TableRef") -> DeltaCommit:
    """The latest commit of the Delta table ``ref``: version and rows written (Delta's own metric)."""
    return _entry(_history(spark, TableRef.parse(ref), 1).first()).commit


def own_commit(spark: SparkSession, ref: "str | TableRef", user_metadata: Optional[str]) -> DeltaCommit:
    """The newest commit of ``ref`` tagged exactly ``user_metadata`` (:func:`run_metadata`): this run's own
    commit, whatever other writers committed after it. Without a tag: the latest commit (:func:`last_commit`).

    A write that changed nothing where the platform refuses to record empty commits (see
    :func:`write_delta`) leaves no tagged commit: then the latest commit is returned.
    """
    return _own_entry(spark, TableRef.parse(ref), user_metadata).commit


def _own_entry(spark: SparkSession, ref: TableRef, user_metadata: Optional[str]) -> HistoryEntry:
    """The newest commit tagged ``user_metadata`` (else the latest).

    The latest entry is read first: it is the run's own commit unless another writer committed since, so the
    whole history (long on an old table) is read only then.
    """
    from pyspark.sql import functions as F

    latest = _entry(_history(spark, ref, 1).first())
    if user_metadata is None or latest.user_metadata == user_metadata:
        return latest
    row = _history(spark, ref).where(F.col("userMetadata") == F.lit(user_metadata)).orderBy(F.col("version").desc()).first()
    return _entry(row) if row is not None else latest  # none tagged: an empty write the platform did not record


def last_commit_stamp(spark: SparkSession, ref: "str | TableRef") -> tuple[float, Optional[str]]:
    """When the latest commit of the Delta table ``ref`` was made, in seconds since the epoch (whatever the session's
    time zone), and the output its lakescore tag says the table stages for (:func:`staging_metadata`; ``None``)."""
    latest = _entry(_history(spark, TableRef.parse(ref), 1).first())
    return latest.committed_at, latest.staging_for


def delta_detail(spark: SparkSession, ref: "str | TableRef") -> DataFrame:
    """``DESCRIBE DETAIL`` of the Delta table ``ref``: its id, location, file count and size, properties, one row
    (Delta's API or SQL: :meth:`TableRef.delta_api`)."""
    ref = TableRef.parse(ref)
    api = ref.delta_api(spark)
    return api.detail() if api is not None else spark.sql(f"DESCRIBE DETAIL {ref.sql}")


def table_id(spark: SparkSession, ref: "str | TableRef") -> str:
    """The Delta table's unique id (``DESCRIBE DETAIL``): a new one for each table created, even at the same path."""
    return str(delta_detail(spark, ref).select("id").first()[0])


def load_file_lists(spark: SparkSession, refs: Iterable["str | TableRef"]) -> "Future[None]":
    """Start loading the current file list of each Delta table in ``refs``, in a background thread.

    A Delta write to a table first reconstructs the table's file list at its current version (its snapshot's
    state: a few Spark jobs), which Delta then keeps for that version. Loaded while the run does other work, the
    write finds it ready. The returned future completes when every list is loaded and never raises: a reference
    that is not a Delta table (yet) or cannot be read is skipped, and the write that follows reports its own errors.
    """
    return in_background("file-lists", _load_file_lists, spark, list(refs))


def _load_file_lists(spark: SparkSession, refs: list["str | TableRef"]) -> None:
    for ref in refs:
        try:
            ref = TableRef.parse(ref)
            if is_delta(spark, ref):
                delta_detail(spark, ref).select("numFiles").first()  # the file count needs the whole file list
        except Exception:  # noqa: BLE001 (best effort: the write reads the table again and reports what fails)
            log.debug("could not load the file list of %s ahead of its write", ref, exc_info=True)


def is_delta(spark: SparkSession, ref: "str | TableRef") -> bool:
    """Whether ``ref`` (a path or a table) is a Delta table: a path has a Delta log with a commit
    (:func:`~lakescore.jobs.platform.spark_adapter.is_delta_path`); otherwise Delta answers ``DESCRIBE HISTORY`` for it."""
    ref = TableRef.parse(ref)
    known = spark_adapter.is_delta_path(spark, ref.text) if ref.is_path else None
    if known is not None:
        return known
    try:
        spark.sql(f"DESCRIBE HISTORY {ref.sql} LIMIT 1").collect()
    except AnalysisException:
        return False
    return True


def delete_path(spark: SparkSession, ref: str) -> bool:
    """Delete the directory ``ref`` recursively (any Hadoop filesystem); True if something was deleted.

    Classic sessions only (:func:`lakescore.jobs.platform.spark_adapter.can_delete_paths`).
    """
    return spark_adapter.delete_path(spark, ref)


def drop_delta(spark: SparkSession, ref: "str | TableRef") -> None:
    """Remove the Delta table ``ref``: ``DROP TABLE`` for a (managed) table, deleting the directory for a path."""
    ref = TableRef.parse(ref)
    if ref.is_path:
        delete_path(spark, ref.text)
    else:
        spark.sql(f"DROP TABLE IF EXISTS {ref.sql}")


def table_names(spark: SparkSession, namespace: str) -> list[str]:
    """The names of the tables in ``namespace`` (its parts quoted, :attr:`~lakescore.jobs.references.TableName.quoted_namespace`;
    empty: the session's current schema), temporary views left out. ``SHOW TABLES``, which Spark Connect runs too."""
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
    return not any(commit.match(name) for name in spark_adapter.child_names(spark, f"{ref.rstrip('/')}/_delta_log") or ())


def _is_not_found(exc: AnalysisException) -> bool:
    condition = exc.getCondition() if hasattr(exc, "getCondition") else exc.getErrorClass()
    return (condition or "").startswith(("TABLE_OR_VIEW_NOT_FOUND", "SCHEMA_NOT_FOUND")) or "not found" in str(exc).lower()


def _tried(ref: TableRef) -> str:
    """What a bare name was looked up as, for not-found messages."""
    return f"no table {ref.name.quoted}, and no file ./{ref.text}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
