"""Write-audit-publish staging with resumable chunks.

A run scores its input in deterministic chunks (``pmod(xxhash64(id), chunks)``)
and appends each chunk, as one Delta commit, to a staging table private to the
run: ``<staging root>/<run key>``. The run key is a digest of everything that
determines the rows (input files, model weights, task, columns, chunk count,
run id), so

* a rerun after a crash finds the chunks already committed and scores only the rest;
* a rerun with other input, model or settings gets a fresh staging table;
* each chunk commit carries ``txnAppId=<run key>``, ``txnVersion=<chunk + 1>``:
  two processes running the same run at once cannot commit a chunk twice (Delta
  skips the second commit, or refuses it when both race).

Only after every chunk is staged, the staged rows are validated and published to
the output in one commit; the staging table is then deleted. A failed run
(validation, error rate, crash) leaves it in place for the rerun.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakescore.jobs.platform.tables import (
    append_delta, column, delete_path, delete_path_if_empty, is_path, table_location_root,
)

__all__ = ["Staging", "run_key", "chunk_count", "chunk_column", "input_fingerprint"]

CHUNK_COLUMN = "_chunk"


def chunk_count(rows: int, chunk_rows: int) -> int:
    """How many chunks ``rows`` rows make at ``chunk_rows`` per chunk (at least one)."""
    return max(1, math.ceil(rows / chunk_rows))


def chunk_column(id_col: str, chunks: int):
    """The chunk of each row: a stable hash of its id, so a rerun cuts the same chunks."""
    return F.pmod(F.xxhash64(column(id_col)), F.lit(chunks)).cast("int")


def input_fingerprint(df: DataFrame) -> str:
    """A digest of the files behind ``df`` (for Delta: the files of the version read)."""
    files = sorted(df.inputFiles())
    return hashlib.sha256("\n".join(files).encode("utf-8")).hexdigest()


def run_key(facts: Mapping[str, Any]) -> str:
    """A short digest of everything that determines a run's rows."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:20]


@dataclass(frozen=True)
class Staging:
    """The staging table of one run key."""

    spark: SparkSession
    location: str
    key: str
    chunks: int
    default_root: bool = False
    """Whether ``location`` is under lakescore's own ``_lakescore_staging/<name>`` folder (not a configured root)."""

    @classmethod
    def for_output(cls, spark: SparkSession, output: str, configured_root: str | None, key: str, chunks: int) -> "Staging":
        """The staging table of ``key`` under ``configured_root``, default beside ``output``."""
        if configured_root:
            return cls(spark, f"{configured_root.rstrip('/')}/{key}", key, chunks)
        name = output.rstrip("/").rsplit("/", 1)[-1] if is_path(output) else output.split(".")[-1]
        root = f"{table_location_root(spark, output).rstrip('/')}/_lakescore_staging/{name}"
        return cls(spark, f"{root}/{key}", key, chunks, default_root=True)

    def committed_chunks(self) -> set[int]:
        """Chunks already committed to this staging table (empty when it does not exist yet)."""
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(self.spark, self.location):
            return set()
        rows = self.spark.read.format("delta").load(self.location).select(CHUNK_COLUMN).distinct().collect()
        return {int(r[0]) for r in rows}

    def commit_chunk(self, scored: DataFrame, chunk: int) -> None:
        """Append one chunk's scored rows in one idempotent commit."""
        append_delta(scored.withColumn(CHUNK_COLUMN, F.lit(chunk)), self.location, txn_app_id=f"lakescore-{self.key}", txn_version=chunk + 1)

    def rows(self) -> DataFrame:
        """Every staged row (without the chunk column)."""
        return self.spark.read.format("delta").load(self.location).drop(CHUNK_COLUMN)

    def drop(self) -> None:
        """Delete the staging table (after a successful publish), and the default staging folders it leaves empty."""
        delete_path(self.spark, self.location)
        if self.default_root:
            name_dir = self.location.rsplit("/", 1)[0]
            if delete_path_if_empty(self.spark, name_dir):
                delete_path_if_empty(self.spark, name_dir.rsplit("/", 1)[0])
