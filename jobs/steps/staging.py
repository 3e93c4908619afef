"""Write-audit-publish staging with resumable chunks.

A run scores its input in deterministic chunks (``pmod(xxhash64(id), chunks)``)
and appends each chunk, as one Delta commit, to a staging table private to the
run, named by the run key (:func:`staging_location`): a table beside a table output
(``<output>__lakescore_staging_<key>``, or ``<prefix>_<key>`` for ``write.staging:
catalog.schema.prefix``), so nothing writes paths into a catalog's managed storage; a
directory beside a path output (``<output dir>/_lakescore_staging/<name>/<key>``, or
``<write.staging path>/<key>``). The run key is a digest of everything that
determines the rows (input files and Delta version, model weights, task, columns,
chunk count, run id; in incremental mode the output version compared with), so

* a rerun after a crash finds the chunks already committed and scores only the rest;
* a rerun with other input, model or settings gets a fresh staging table;
* each chunk commit carries ``txnAppId=<run key>``, ``txnVersion=<chunk + 1>``:
  two processes running the same run at once cannot commit a chunk twice (Delta
  skips the second commit, or refuses it when both race).

A run of more than one chunk first writes the rows to score, once, to a second private table
beside the staging table (``..._rows``, partitioned by chunk: :func:`prepared_rows`), and each chunk
reads its partition there: the input is scanned once, not once per chunk. A rerun finds it and
reads the input not at all for the chunks left. An incremental run on an existing output first writes
its new and changed rows to a third (``..._changes``, :func:`changed_rows`), keyed by the comparison rather
than the chunks: the join over the input runs once, and the chunks, the dedup sample and a rerun read that table.

Every chunk commit is tagged with the run's ``userMetadata`` (:func:`~lakescore.jobs.platform.tables.run_metadata`).
Once every chunk is staged, the table is pinned (:meth:`Staging.pin`): accounting, validation
and the publish all read that one version, so a commit to staging after the pin (another
process of the same run key) changes nothing in what was validated and published. The staged
rows are published to the output in one commit; the staging table is then deleted. A failed
run (validation, error rate, crash) leaves it in place for the rerun. A run that publishes also removes what
the output's other run keys left and no run can resume any more (:func:`drop_stale_staging`): every staging
commit names the output it stages for (:func:`~lakescore.jobs.platform.tables.staging_metadata`), so a shared
``write.staging`` location keeps the other outputs' staging.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakescore.jobs.platform.spark import adapter as spark_adapter
from lakescore.jobs.platform.tables import (
    delta_history,
    drop_delta,
    is_delta,
    is_path,
    last_commit_stamp,
    latest_version_and_id,
    read_input,
    staging_metadata,
    table_names,
    write_delta,
)
from lakescore.jobs.references import parse_table_name
from lakescore.jobs.steps.ids import id_hash
from lakescore.schemas.column_names import delta_storable_columns, original_columns

__all__ = [
    "Staging",
    "StagedSnapshot",
    "prepared_rows",
    "changed_rows",
    "drop_stale_staging",
    "CHUNK_COLUMN",
    "staging_location",
    "run_key",
    "chunk_count",
    "timed_chunks",
    "planned_chunks",
    "nearby_chunk_counts",
    "chunk_column",
    "input_fingerprint",
]

log = logging.getLogger(__name__)

CHUNK_COLUMN = "_chunk"

_UNINDEXED = {"delta.dataSkippingNumIndexedCols": "0"}
"""Properties of a staging table: no per-column statistics. Every read of staging is whole (or by chunk, a column
Delta's statistics would not skip by for a hash-cut chunk), and collecting minimum, maximum and null count of each of
the staged columns, row by row, was the largest part of staging a cheap model's rows (BENCHMARKS.md, issue 46)."""

_STAGED_NAME = re.compile(r"[0-9a-f]{20}(?:_rows|_changes)?")
"""What follows the staging location's prefix (:func:`staging_location`) in a run key's tables: the key
(:func:`run_key`), alone or with the suffix of its rows to score or of its changed rows."""


def chunk_count(rows: int, chunk_rows: int) -> int:
    """How many chunks ``rows`` rows make at ``chunk_rows`` per chunk (at least one)."""
    return max(1, math.ceil(rows / chunk_rows))


ROW_FLOOR_SECONDS = 1e-5
"""What a row costs a run besides its model (reading, the hand-over to Python, staging, validation, publishing), in
task-seconds: the order of magnitude of W7's overhead (BENCHMARKS.md), so that a model that costs next to nothing
still gets chunks of bounded size."""

UNTIMED_CHUNK_ROWS = 2_000_000
"""Rows per chunk when neither ``write.chunk_rows`` nor a measured speed says (the preflight does not time
generation)."""

NEARBY_CHUNK_COUNTS = 8
"""How far (a factor) a rerun looks, from the chunk count it plans, for chunks an earlier attempt staged under
another."""


def timed_chunks(rows: int, chunk_seconds: float, row_seconds: float | None, slots: int) -> int:
    """How many chunks ``rows`` rows make when each chunk should score in about ``chunk_seconds`` on ``slots`` task
    slots at ``row_seconds`` a row (plus :data:`ROW_FLOOR_SECONDS`): a power of two, so that a rerun measuring a
    somewhat different speed plans the same count or one of few others (:func:`nearby_chunk_counts`).

    >>> timed_chunks(10_000_000, 600, 1e-6, 2)  # a cheap model: one chunk
    1
    >>> timed_chunks(1_000_000, 600, 3e-3, 2)  # 3 chunks' worth, rounded up to 4
    4
    >>> timed_chunks(5_000_000, 600, None, 2)  # not timed: 2,000,000 rows a chunk, 3 rounded up to 4
    4
    """
    per_chunk = (
        UNTIMED_CHUNK_ROWS if row_seconds is None else chunk_seconds * max(1, slots) / (row_seconds + ROW_FLOOR_SECONDS)
    )
    needed = chunk_count(rows, max(1, int(per_chunk)))
    return 1 << (needed - 1).bit_length()


def planned_chunks(
    rows: int, chunk_rows: int | None, chunk_seconds: float, row_seconds: float | None, slots: int
) -> int:
    """A run's chunk count as ``write`` configures it: by ``chunk_rows`` when set, else :func:`timed_chunks`."""
    if chunk_rows is not None:
        return chunk_count(rows, chunk_rows)
    return timed_chunks(rows, chunk_seconds, row_seconds, slots)


def nearby_chunk_counts(chunks: int) -> list[int]:
    """The other powers of two within a factor :data:`NEARBY_CHUNK_COUNTS` of ``chunks``, nearest first: where a
    rerun of a :func:`timed_chunks` run looks for the chunks an attempt that measured another speed staged.

    >>> nearby_chunk_counts(4)
    [2, 8, 1, 16, 32]
    """
    lower = [chunks >> i for i in range(1, NEARBY_CHUNK_COUNTS.bit_length()) if chunks >> i >= 1]
    higher = [chunks << i for i in range(1, NEARBY_CHUNK_COUNTS.bit_length())]
    return sorted(lower + higher, key=lambda n: (abs(math.log2(n / chunks)), n))


def chunk_column(cols: Sequence[str], chunks: int):
    """The chunk of each row: a stable hash of ``cols`` (its id, or a ranked run's key:
    :func:`~lakescore.jobs.steps.ids.id_hash`), so a rerun cuts the same chunks."""
    return F.pmod(id_hash(cols), F.lit(chunks)).cast("int")


def input_fingerprint(df: DataFrame, file_stats: bool = False) -> str:
    """A digest of the files behind ``df`` (for Delta: the files of the version read); with ``file_stats`` (``df`` is
    a ``binaryFile`` listing), of each file's modification time and length too, read from the listing (no file is
    read), because a file replaced in a folder keeps its name."""
    if file_stats:
        files = sorted(f"{r[0]}\t{r[1]}\t{r[2]}" for r in df.select("path", "modificationTime", "length").collect())
    else:
        files = sorted(df.inputFiles())
    return hashlib.sha256("\n".join(files).encode("utf-8")).hexdigest()


def run_key(facts: Mapping[str, Any]) -> str:
    """A short digest of everything that determines a run's rows."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:20]


def staging_location(output: str, configured: str | None, key: str) -> str:
    """Where the staging table of run ``key`` lives: a table name or a path (see the module docstring).

    Table names are derived from the parsed output or prefix (``TableNameError`` for an illegal one).
    """
    if configured and is_path(configured):
        return f"{configured.rstrip('/')}/{key}"
    if configured:
        return str(parse_table_name(configured, "write.staging").with_suffix(f"_{key}"))
    if not is_path(output):
        return str(parse_table_name(output, "output").with_suffix(f"__lakescore_staging_{key}"))
    parent, _, name = output.rstrip("/").rpartition("/")
    return f"{parent or '.'}/_lakescore_staging/{name}/{key}"


@dataclass(frozen=True)
class Staging:
    """The staging table of one run key.

    Its writes store column names Delta would refuse (an input column ``review text``) escaped, and its reads
    restore them (:mod:`lakescore.schemas.column_names`): callers see the input's own names."""

    spark: SparkSession
    location: str
    """A table name or a path (:func:`staging_location`)."""
    key: str
    chunks: int
    default_root: bool = False
    """Whether ``location`` is under lakescore's own ``_lakescore_staging/<name>`` folder (a path output, no
    ``write.staging``)."""
    output: str = ""
    """The output this table stages for, named in every commit's ``userMetadata``."""

    @classmethod
    def for_output(cls, spark: SparkSession, output: str, configured: str | None, key: str, chunks: int) -> Staging:
        """The staging table of ``key`` for ``output``: as ``write.staging`` (``configured``) says, else beside the
        output."""
        return cls(
            spark,
            staging_location(output, configured, key),
            key,
            chunks,
            default_root=not configured and is_path(output),
            output=output,
        )

    def committed_chunks(self) -> set[int]:
        """Chunks already committed to this staging table (empty when it does not exist yet)."""
        if not is_delta(self.spark, self.location):
            return set()
        return {int(r[0]) for r in self.table().select(CHUNK_COLUMN).distinct().collect()}

    def staged_run_id(self) -> str | None:
        """The run id the oldest tagged chunk commit carries (:func:`~lakescore.jobs.platform.tables.run_metadata`):
        the run that staged here first, which a resumed run of the same key goes on as. ``None`` when nothing is
        staged or no commit is tagged."""
        tagged = [entry for entry in delta_history(self.spark, self.location) if entry.run_id]
        return tagged[-1].run_id if tagged else None

    def commit_chunk(self, scored: DataFrame, chunk: int, tag: str | None = None) -> None:
        """Append one chunk's scored rows in one idempotent commit, tagged ``tag`` (the run's ``userMetadata``)."""
        write_delta(
            delta_storable_columns(scored.withColumn(CHUNK_COLUMN, F.lit(chunk))),
            self.location,
            "append",
            txn=(f"lakescore-{self.key}", chunk + 1),
            user_metadata=staging_metadata(self.output, tag),
            table_properties=_UNINDEXED,
        )

    def table(self) -> DataFrame:
        """Every staged row, with the chunk it was committed in (:data:`CHUNK_COLUMN`)."""
        return original_columns(read_input(self.spark, self.location, "delta"))

    def pin(self) -> StagedSnapshot:
        """This table at its version now (taken once, after every chunk is staged), with the table's Delta id."""
        return StagedSnapshot(self, *latest_version_and_id(self.spark, self.location))

    def nothing(self, empty: DataFrame) -> StagedSnapshot:
        """What a run with nothing to score counts, validates and publishes instead of a pinned version: ``empty``
        (no rows, in the staged rows' schema), no table written."""
        return StagedSnapshot(self, 0, f"nothing-{uuid.uuid4().hex}", empty)

    def exists(self) -> bool:
        """Whether this table has at least one commit."""
        return is_delta(self.spark, self.location)

    def write(self, rows: DataFrame) -> None:
        """Write ``rows`` here in one commit, replacing what is here."""
        write_delta(delta_storable_columns(rows), self.location, user_metadata=staging_metadata(self.output))

    def write_chunked(self, rows: DataFrame, chunk_cols: Sequence[str]) -> None:
        """Write ``rows`` here in one commit, partitioned by their chunk (:func:`chunk_column` of ``chunk_cols``),
        replacing what is here."""
        chunked = rows.withColumn(CHUNK_COLUMN, chunk_column(chunk_cols, self.chunks))
        write_delta(
            delta_storable_columns(chunked),
            self.location,
            partition_by=CHUNK_COLUMN,
            user_metadata=staging_metadata(self.output),
        )

    def chunk(self, chunk: int) -> DataFrame:
        """The rows of ``chunk`` written by :meth:`write_chunked` (its partition only)."""
        return self.table().where(F.col(CHUNK_COLUMN) == chunk).drop(CHUNK_COLUMN)

    def drop(self) -> None:
        """Delete the staging table (after a successful publish), and the default staging folders it leaves empty."""
        drop_delta(self.spark, self.location)
        if self.default_root:
            name_dir = self.location.rsplit("/", 1)[0]
            if spark_adapter.delete_path_if_empty(self.spark, name_dir):
                spark_adapter.delete_path_if_empty(self.spark, name_dir.rsplit("/", 1)[0])


@dataclass(frozen=True)
class StagedSnapshot:
    """One version of a staging table: what accounting counts, GX validates and the publish writes.

    ``table_id`` is Delta's id of the staging table (new for each table created), so ``publish_txn`` names
    this one snapshot of this one table: a rerun that finds the same snapshot (the driver died after the
    publish commit) makes Delta skip a second publish; a fresh staging table publishes anew.
    """

    staging: Staging
    version: int
    table_id: str
    empty: DataFrame | None = None
    """Nothing was staged (:meth:`Staging.nothing`): the rows, none, that :meth:`table` gives. Its ``table_id`` is new
    for each run, so its publish is not deduplicated: there is nothing in it to commit twice."""

    def table(self) -> DataFrame:
        """Every row staged at :attr:`version`, with its chunk (:data:`CHUNK_COLUMN`)."""
        if self.empty is not None:
            return self.empty
        return original_columns(read_input(self.staging.spark, self.staging.location, "delta", version=self.version))

    @property
    def publish_txn(self) -> tuple[str, int]:
        """``(txnAppId, txnVersion)`` of the commits that publish this snapshot (output and errors tables)."""
        return f"lakescore-publish-{self.table_id}", self.version + 1


def prepared_rows(spark: SparkSession, output: str, configured: str | None, key: str, chunks: int) -> Staging:
    """The table of run ``key``'s rows to score, partitioned by chunk, beside its staging table (``<staging>_rows``)."""
    return Staging.for_output(spark, output, configured, f"{key}_rows", chunks)


def changed_rows(spark: SparkSession, output: str, configured: str | None, key: str) -> Staging:
    """The table of an incremental run's rows to score (new and changed), found once against the output, beside its
    staging table (``<staging>_changes``; ``key`` names the comparison, not the chunks, which follow from its count)."""
    return Staging.for_output(spark, output, configured, f"{key}_changes", 1)


def drop_stale_staging(
    spark: SparkSession, output: str, configured: str | None, started: float, keep: Collection[str]
) -> list[str]:
    """Remove what other run keys of ``output`` staged (``<key>``, ``<key>_rows``, ``<key>_changes``) and last committed
    before ``started`` (this run's start, seconds since the epoch), leaving the locations in ``keep`` (this run's own);
    return the locations removed. Called after a successful publish: a rerun of those keys is not expected any more.

    A run that committed after ``started`` may still be running beside this one: its staging stays. In a configured
    ``write.staging`` location, shared by outputs perhaps, only tables whose commits name ``output`` go. Over Spark
    Connect a staging directory cannot be listed or deleted: nothing is removed there. Removing is best effort: a
    location that cannot be read or deleted is logged and left."""
    removed = []
    try:
        names = _staged_names(spark, staging_location(output, configured, ""))
    except Exception as exc:  # noqa: BLE001 (as below)
        log.warning("could not look for stale staging of %s: %s", output, exc)
        names = []
    for suffix in names:
        location = staging_location(output, configured, suffix)
        if location in keep:
            continue
        try:
            if not is_delta(spark, location):
                continue  # no commit: nothing says when or for whom it was written
            committed, staged_for = last_commit_stamp(spark, location)
            if committed >= started or (configured and staged_for != output):
                continue
            drop_delta(spark, location)
        except Exception as exc:  # noqa: BLE001 (the run succeeded; stale staging left behind costs storage only)
            log.warning("could not remove the stale staging %s: %s", location, exc)
            continue
        log.info("removed staging %s of an earlier run of %s that no run resumes any more", location, output)
        removed.append(location)
    return removed


def _staged_names(spark: SparkSession, prefix: str) -> list[str]:
    """What follows ``prefix`` (:func:`staging_location` of an empty key: a folder ending in ``/``, or a table name
    prefix) in the names of the run keys' tables there (:data:`_STAGED_NAME`)."""
    if is_path(prefix):
        folder = prefix.rstrip("/")
        if not spark_adapter.can_delete_paths(spark):
            log.debug("over Spark Connect staging folder %s cannot be listed or deleted: stale staging is left", folder)
            return []
        names = spark_adapter.child_names(spark, folder) if spark_adapter.path_exists(spark, folder) else []
        return [name for name in names or () if _STAGED_NAME.fullmatch(name)]
    table = parse_table_name(prefix)
    start = len(table.name)
    return [
        name[start:]
        for name in table_names(spark, table.quoted_namespace)
        if name.lower().startswith(table.name.lower()) and _STAGED_NAME.fullmatch(name[start:])
    ]
