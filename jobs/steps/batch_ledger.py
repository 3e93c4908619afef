"""The ledger of a provider batch run: what was submitted, what the provider said of it, what came back, durable beside
the run's staging so a rerun reads it before it sends anything.

Four append-only Delta tables per output, beside its staging tables
(:func:`~lakescore.jobs.steps.staging.staging_location` with the suffixes ``batch_lines``, ``batches``,
``batch_outcomes``, ``batch_intents``), each row naming its run key:

* **lines**: one row per submitted line: its ``custom_id``, chunk, round (0: first sent), file (``part`` digest),
  batch and input file; appended by the stage that uploads the files and creates the batches, as that stage commits
  (a kill before that commit is recovered from the provider's batch list by ``metadata``:
  :mod:`~lakescore.jobs.steps.provider_batch`);
* **batches**: a batch's terminal state (``completed``, ``expired``, ``cancelled``, ``failed``; Anthropic's ``ended``),
  its files (Anthropic's results URL as the output file) and counts,
  appended the moment a poll finds it;
* **outcomes**: one row per collected line: a result (the response body), a retry or a dead line, with the provider's
  message (:func:`~lakescore.udfs.remote.batch_files.classify`);
* **intents**: for a provider whose batches keep no ``metadata`` (Anthropic's), one row per file about to be
  submitted, appended before its batch is created: its part digest, line count, first ids and the time, so a batch
  created but not recorded is found again in the provider's list (:mod:`~lakescore.udfs.remote.batch_intents`).

The tables are never rewritten and outlive the publish (staging is dropped, the ledger stays): they are the audit
of what was paid for, line by line, which ``lakescore batches`` lists.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakescore.jobs.platform.tables import is_delta, read_input, write_delta
from lakescore.jobs.steps.staging import staging_location
from lakescore.udfs.remote.batch_intents import Intent
from lakescore.udfs.remote.batch_kinds import Polled

__all__ = ["BatchLedger", "BatchState", "LINES_SCHEMA", "BATCHES_SCHEMA", "OUTCOMES_SCHEMA", "INTENTS_SCHEMA"]

LINES_SCHEMA = T.StructType(
    [
        T.StructField("run_key", T.StringType()),
        T.StructField("custom_id", T.StringType()),
        T.StructField("chunk", T.IntegerType()),
        T.StructField("round", T.IntegerType()),
        T.StructField("part", T.StringType()),
        T.StructField("batch_id", T.StringType()),
        T.StructField("input_file_id", T.StringType()),
    ]
)
BATCHES_SCHEMA = T.StructType(
    [
        T.StructField("run_key", T.StringType()),
        T.StructField("batch_id", T.StringType()),
        T.StructField("round", T.IntegerType()),
        T.StructField("status", T.StringType()),
        T.StructField("output_file_id", T.StringType()),
        T.StructField("error_file_id", T.StringType()),
        T.StructField("total", T.LongType()),
        T.StructField("completed", T.LongType()),
        T.StructField("failed", T.LongType()),
        T.StructField("message", T.StringType()),
        T.StructField("recorded_at", T.TimestampType()),
    ]
)
OUTCOMES_SCHEMA = T.StructType(
    [
        T.StructField("run_key", T.StringType()),
        T.StructField("custom_id", T.StringType()),
        T.StructField("batch_id", T.StringType()),
        T.StructField("round", T.IntegerType()),
        T.StructField("kind", T.StringType()),
        T.StructField("status", T.IntegerType()),
        T.StructField("body", T.StringType()),
        T.StructField("message", T.StringType()),
    ]
)

INTENTS_SCHEMA = T.StructType(
    [
        T.StructField("run_key", T.StringType()),
        T.StructField("round", T.IntegerType()),
        T.StructField("part", T.StringType()),
        T.StructField("lines", T.LongType()),
        T.StructField("first_ids", T.ArrayType(T.StringType())),
        T.StructField("intended_at_s", T.DoubleType()),
    ]
)


@dataclass(frozen=True)
class BatchState:
    """A batch of the run as the ledger knows it: its round, the lines it holds, and its terminal state once polled
    to one (``status`` ``None``: still running when last seen); ``message``: a ``failed`` batch's reasons
    (:func:`~lakescore.udfs.remote.batch_files.batch_errors`)."""

    batch_id: str
    round: int
    lines: int
    status: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    completed: int | None = None
    failed: int | None = None
    message: str | None = None


@dataclass(frozen=True)
class BatchLedger:
    """The ledger tables of ``output`` (``configured``: its ``write.staging``), read and written for run ``run_key``."""

    spark: SparkSession
    output: str
    configured: str | None
    run_key: str

    def location(self, table: str) -> str:
        """Where ledger ``table`` (``batch_lines``, ``batches``, ``batch_outcomes``) lives."""
        return staging_location(self.output, self.configured, table)

    def _read(self, table: str, schema: T.StructType, every_run: bool = False) -> DataFrame:
        location = self.location(table)
        if not is_delta(self.spark, location):
            return self.spark.createDataFrame([], schema)
        df = read_input(self.spark, location, "delta")
        return df if every_run else df.where(F.col("run_key") == self.run_key)

    def lines(self, every_run: bool = False) -> DataFrame:
        """The submitted lines of this run (or of every run of the output)."""
        return self._read("batch_lines", LINES_SCHEMA, every_run)

    def outcomes(self) -> DataFrame:
        """The collected lines of this run."""
        return self._read("batch_outcomes", OUTCOMES_SCHEMA)

    def ended(self, every_run: bool = False) -> DataFrame:
        """The terminal states recorded (one row per batch)."""
        return self._read("batches", BATCHES_SCHEMA, every_run)

    def append_lines(self, submitted: DataFrame) -> None:
        """Append what the submit stage yields (its lines, each in its file and batch), in one commit."""
        self._append(
            "batch_lines", submitted.select(F.lit(self.run_key).alias("run_key"), *submitted.columns), LINES_SCHEMA
        )

    def append_outcomes(self, collected: DataFrame) -> None:
        """Append what the download stage yields (one outcome per line), in one commit."""
        self._append(
            "batch_outcomes",
            collected.select(F.lit(self.run_key).alias("run_key"), *collected.columns),
            OUTCOMES_SCHEMA,
        )

    def record_ended(self, ended: list[tuple[Polled, int]]) -> None:
        """Append the terminal states of ``ended`` (batches as a poll found them, each with its round) in one commit, as
        soon as a poll finds them."""
        rows = []
        for batch, round_ in ended:
            rows.append(
                (
                    self.run_key,
                    batch.batch_id,
                    round_,
                    batch.status,
                    batch.output,
                    batch.error,
                    batch.total,
                    batch.completed,
                    batch.failed,
                    batch.message,
                )
            )
        if rows:
            df = self.spark.createDataFrame(rows, T.StructType(BATCHES_SCHEMA.fields[:-1]))
            self._append("batches", df.withColumn("recorded_at", F.current_timestamp()), BATCHES_SCHEMA)

    def record_intents(self, round_: int, intents: list[Intent]) -> None:
        """Append ``intents`` (files of round ``round_`` about to be submitted) in one commit, before any is created."""
        if intents:
            rows = [(self.run_key, round_, i.part, i.lines, list(i.first_ids), i.at) for i in intents]
            self._append("batch_intents", self.spark.createDataFrame(rows, INTENTS_SCHEMA), INTENTS_SCHEMA)

    def intents(self, round_: int) -> list[Intent]:
        """The intents recorded for this run's round ``round_`` (a handful of rows per file)."""
        rows = self._read("batch_intents", INTENTS_SCHEMA).where(F.col("round") == round_).collect()
        return [Intent(r["part"], int(r["lines"]), tuple(r["first_ids"]), float(r["intended_at_s"])) for r in rows]

    def _append(self, table: str, df: DataFrame, schema: T.StructType) -> None:
        write_delta(df.select(*[F.col(f.name).cast(f.dataType) for f in schema.fields]), self.location(table), "append")

    def states(self) -> list[BatchState]:
        """Every batch of this run: its lines, round and terminal state when recorded (a handful of rows per batch
        reach the driver, never a line)."""
        batches = self.lines().groupBy("batch_id").agg(F.min("round").alias("round"), F.count(F.lit(1)).alias("lines"))
        ended = (
            self.ended()
            .dropDuplicates(["batch_id"])
            .select("batch_id", "status", "output_file_id", "error_file_id", "completed", "failed", "message")
        )
        rows = batches.join(ended, "batch_id", "left").collect()
        return sorted(
            (
                BatchState(
                    r["batch_id"],
                    int(r["round"]),
                    int(r["lines"]),
                    r["status"],
                    r["output_file_id"],
                    r["error_file_id"],
                    r["completed"],
                    r["failed"],
                    r["message"],
                )
                for r in rows
            ),
            key=lambda s: (s.round, s.batch_id),
        )

    def collected_batches(self) -> set[str]:
        """Batches whose lines' outcomes are recorded."""
        return {r[0] for r in self.outcomes().select("batch_id").distinct().collect()}
