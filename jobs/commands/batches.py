"""``lakescore batches --conf <yaml> [--cancel]``: the provider batches an output's runs submitted
(``generate.endpoint.batch``), from their ledger (:mod:`~lakescore.jobs.steps.batch_ledger`), each one not recorded
ended asked of the provider for its state now; ``--cancel`` asks the provider to cancel those (their lines done so
far stay in their output files, and the next run collects them and resubmits the rest)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakescore.jobs.config import ConfigError, JobConfig
from lakescore.jobs.steps.batch_ledger import BatchLedger
from lakescore.jobs.steps.provider_batch import driver_client, endpoint_kind

__all__ = ["BatchRow", "list_batches", "format_batches"]


@dataclass(frozen=True)
class BatchRow:
    """One batch: the run key that submitted it, its round, lines, state (``recorded``: from the ledger; else the
    provider's now, or ``unknown``) and, for ``--cancel``, whether it was asked to cancel."""

    run_key: str
    batch_id: str
    round: int
    lines: int
    status: str
    recorded: bool
    cancelled: bool = False


def list_batches(spark: SparkSession, cfg: JobConfig, cancel: bool = False) -> list[BatchRow]:
    """Every batch ``cfg``'s output's ledger holds, its state, and with ``cancel`` each one still running cancelled."""
    endpoint = cfg.endpoint()
    if not cfg.provider_batch:
        raise ConfigError(
            "lakescore batches reads a run with an endpoint's batch (generate.endpoint.batch, embed.endpoint.batch); "
            "this config has none"
        )
    ledger = BatchLedger(spark, cfg.output_ref(), cfg.write.staging, "")
    lines = (
        ledger.lines(every_run=True)
        .groupBy("run_key", "batch_id")
        .agg(F.min("round").alias("round"), F.count(F.lit(1)).alias("lines"))
    )
    ended = ledger.ended(every_run=True).dropDuplicates(["batch_id"]).select("batch_id", "status")
    rows = lines.join(ended, "batch_id", "left").orderBy("run_key", "round", "batch_id").collect()
    client = driver_client(endpoint) if any(r["status"] is None for r in rows) else None
    kind = endpoint_kind(endpoint)
    found = []
    try:
        for r in rows:
            status, recorded, cancelled = r["status"], r["status"] is not None, False
            if client is not None and not recorded:
                polled = kind.poll(client, r["batch_id"])
                status = polled.status
                if cancel and not polled.terminal and status not in ("cancelling", "canceling"):
                    status, cancelled = kind.cancel(client, r["batch_id"]), True
            found.append(
                BatchRow(
                    r["run_key"],
                    r["batch_id"],
                    int(r["round"]),
                    int(r["lines"]),
                    status or "unknown",
                    recorded,
                    cancelled,
                )
            )
    finally:
        if client is not None:
            client.close()
    return found


def format_batches(rows: list[BatchRow], output: str | None = None) -> str:
    """One line per batch, newest run last."""
    if not rows:
        return f"no provider batches recorded for {output}" if output else "no provider batches recorded"
    lines = [f"{'run key':<22}{'batch':<34}{'round':>6}{'lines':>9}  state"]
    for r in rows:
        note = " (cancel asked)" if r.cancelled else "" if r.recorded else " (now)"
        lines.append(f"{r.run_key:<22}{r.batch_id:<34}{r.round:>6}{r.lines:>9}  {r.status}{note}")
    return "\n".join(lines)
