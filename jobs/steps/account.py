"""Step 5, account: every input row is in exactly one of the output and the errors table (or, with ``rank``,
ranked out: :mod:`lakescore.jobs.steps.rank` says how those are counted).

The staged rows are counted by reason in one aggregation; with the id check's counts
that gives the output and error rows, the reasons and the error rate. The same aggregation
sums the workers' per-batch metrics (:data:`~lakescore.schemas.output.WORKER_COLUMN`) of the
chunks this attempt scored, for the report: they travel in the rows, so classic and Spark
Connect sessions report the same figures. A staging table holding more or fewer rows than
the run's scorable rows means another run of the same input is writing it: nothing is published.
Everything is read at the staging version pinned after the last chunk
(:meth:`~lakescore.jobs.steps.staging.Staging.pin`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakescore.jobs.platform.tables import column
from lakescore.jobs.steps.context import Plan
from lakescore.jobs.steps.rank import PASSES_COLUMN, RANKED_OUT_COLUMN, is_tally, ranks_with_tallies
from lakescore.jobs.steps.staging import CHUNK_COLUMN, StagedSnapshot
from lakescore.schemas.output import CHUNKS_COLUMN, DIGEST_COLUMN, ERROR_COLUMNS, WORKER_COLUMN, WORKER_METRICS
from lakescore.schemas.reasons import DUPLICATE_ID, NULL_ID
from lakescore.schemas.traffic import Traffic

__all__ = ["Accounting", "account_rows"]


@dataclass(frozen=True)
class Accounting:
    """Where this run's input rows went. ``input_rows == rows_kept + output_rows + error_rows + ranked_out`` always
    (``rows_kept`` is 0 outside ``write.mode: incremental``, ``ranked_out`` without ``rank``; ``error_rows`` counts the
    dead letters carried from an earlier run, ``rows_carried``, with this run's)."""

    staged: DataFrame
    """Every staged row (scored or not) of :attr:`snapshot`, with the scoring function's columns."""
    snapshot: StagedSnapshot
    """The pinned staging version counted here, validated and published."""
    input_rows: int
    output_rows: int
    error_rows: int
    reasons: dict[str, int]
    """Reason code -> rows, for every row in the errors table (carried ones too)."""
    rows_kept: int = 0
    """Incremental mode: input rows whose output row was current and stays as it is (not scored)."""
    rows_carried: int = 0
    """Incremental mode: input rows an earlier run dead-lettered for a reason of their own, with the same input,
    weights and spec: not scored, their dead letter carried (counted in :attr:`error_rows`, not in
    :attr:`new_error_rows`)."""
    rows_missing: int = 0
    """Incremental mode: output rows whose id is not in the input (deleted at publish with ``write.delete_missing``)."""
    forward_passes_saved: int | None = None
    """With ``scoring.dedup`` in use: scored rows that shared another scored row's input in their chunk (``None``: not
    in use)."""
    ranked_out: int | None = None
    """With ``rank``: scored rows past their key's ``top_k`` (:mod:`lakescore.jobs.steps.rank`), neither staged nor
    published; ``None`` without ``rank``."""
    output_chunks: int | None = None
    """A chunked run (``embed.chunk``): the rows its :attr:`output_rows` documents become in the output (their chunks,
    and document vectors); ``None`` for a run whose input rows are its output rows."""
    workers: dict[str, Any] = field(default_factory=dict)
    """What scoring took in this attempt: ``model_loads`` (preflight included), ``arrow_batches``, ``rows_scored``,
    ``model_seconds``, ``budget_halvings``; chunks staged by an earlier attempt are not counted."""

    @property
    def new_error_rows(self) -> int:
        """This run's failures: the error rows less the dead letters carried from an earlier run."""
        return self.error_rows - self.rows_carried

    @property
    def error_rate(self) -> float:
        """The error-rate gate's figure: :attr:`new_error_rows` among every input row, kept and carried ones included
        (the output's scope; 0 for no input). A carried dead letter passed the gate of the run that found it, and
        an unchanged row kept is as much part of what the output holds as a scored one."""
        return self.new_error_rows / self.input_rows if self.input_rows else 0.0

    @property
    def published_rows(self) -> int:
        """The rows the output receives from this run: :attr:`output_chunks` for a chunked run, else
        :attr:`output_rows`."""
        return self.output_rows if self.output_chunks is None else self.output_chunks

    @property
    def published(self) -> DataFrame:
        """The staged rows that were scored (what the output receives, before identity columns); with ``rank``
        those its ranking kept, the only scored rows staged; a chunked run's one row per chunk (each document's
        :data:`~lakescore.schemas.output.CHUNKS_COLUMN` spread over rows of its own, beside the document's columns)."""
        scored = self.staged.where(F.col(ERROR_COLUMNS[0]).isNull())
        if CHUNKS_COLUMN not in scored.columns:
            return scored
        one = "__lakescore_chunk"
        rows = scored.select(
            *[column(c) for c in scored.columns if c != CHUNKS_COLUMN], F.explode(CHUNKS_COLUMN).alias(one)
        )
        return rows.select(*[column(c) for c in rows.columns if c != one], F.col(f"{one}.*"))


def account_rows(plan: Plan, snapshot: StagedSnapshot) -> Accounting:
    """Count the staged rows of ``snapshot`` (the pinned staging version) by reason and check them against the plan.

    :attr:`Accounting.staged` reads that version too, so the rows validated and published are the rows counted.

    Raises ``RuntimeError`` when staging does not hold exactly the plan's rows to score (with ``rank``: with the
    rows ranked out), or when the rows do not add up (input = kept + output + errors + ranked out).
    """
    ids = plan.split.ids
    table = snapshot.table()
    fresh = ~F.col(CHUNK_COLUMN).isin(sorted(plan.done)) if plan.done else F.lit(True)
    with_tallies = plan.ranked and ranks_with_tallies(plan.changes is not None, plan.dedup.used)
    counted = ~is_tally() if with_tallies else F.lit(True)  # a tally row is a batch's metrics, no input row
    metrics = [F.sum(F.when(fresh, F.col(f"{WORKER_COLUMN}.{f.name}"))).alias(f.name) for f in WORKER_METRICS.fields]
    # a ranked chunk stages its kept rows only: the rows it scored are those and the ones ranked out
    if with_tallies:
        tallies = [F.sum(F.col(f"{WORKER_COLUMN}.batch_rows")).alias("tallied")]
    elif plan.ranked:
        tallies = [
            F.sum(RANKED_OUT_COLUMN).alias("ranked_out"),
            F.sum(F.when(fresh, F.col(RANKED_OUT_COLUMN))).alias("ranked_out_scored"),
        ]
        tallies += [F.sum(PASSES_COLUMN).alias("passes")] if plan.dedup.used else []
    else:
        tallies = []
    chunked = CHUNKS_COLUMN in table.columns
    chunks = [F.sum(F.size(CHUNKS_COLUMN)).alias("chunks")] if chunked else []  # a null list (unscored) is not summed
    groups = (
        table.groupBy(ERROR_COLUMNS[0])
        .agg(
            F.count(F.when(counted, True)).alias("rows"),
            F.count(F.when(fresh & counted, True)).alias("rows_scored"),
            *metrics,
            *tallies,
            *chunks,
        )
        .collect()
    )
    by_reason = {r[0]: int(r["rows"]) for r in groups if r["rows"]}
    staged = table.where(counted).drop(CHUNK_COLUMN) if with_tallies else table.drop(CHUNK_COLUMN)
    staged_rows = sum(by_reason.values())
    ranked_out: int | None
    if with_tallies:  # the scoring function counted every row it scored, kept or not
        scored_rows = sum(int(r["tallied"] or 0) for r in groups)
        ranked_out = scored_rows - staged_rows
        rows_scored = sum(int(r["batch_rows"] or 0) for r in groups)
    else:
        ranked_out = sum(int(r["ranked_out"] or 0) for r in groups) if plan.ranked else None
        scored_rows = staged_rows + (ranked_out or 0)
        rows_scored = sum(
            int(r["rows_scored"]) + (int(r["ranked_out_scored"] or 0) if plan.ranked else 0) for r in groups
        )
    if scored_rows != plan.scorable_rows or (ranked_out or 0) < 0:
        raise RuntimeError(
            f"staging {plan.staging.location} holds {staged_rows} rows"
            + (f" and {ranked_out} ranked out" if plan.ranked else "")
            + f" for {plan.scorable_rows} scorable input rows; "
            "another run of the same input is probably writing it at the same time. Nothing was published; rerun."
        )
    reasons = {k: v for k, v in by_reason.items() if k is not None}
    unscored = sum(reasons.values())
    if ids.null_id_rows:
        reasons[NULL_ID] = ids.null_id_rows
    if ids.refused_rows - ids.null_id_rows:
        reasons[DUPLICATE_ID] = ids.refused_rows - ids.null_id_rows
    for reason, rows in (plan.changes.carried_reasons if plan.changes is not None else {}).items():
        reasons[reason] = reasons.get(reason, 0) + rows
    scored = staged_rows - unscored + (ranked_out or 0)
    if not plan.dedup.used:
        saved = None
    elif plan.ranked:  # the rows scored for their input were counted per key before the others were ranked out
        saved = scored - sum(int(r["passes"] or 0) for r in groups if r[0] is None)
    else:
        saved = _passes_saved(table, scored)
    accounting = Accounting(
        staged=staged,
        snapshot=snapshot,
        input_rows=ids.rows,
        output_rows=staged_rows - unscored,
        error_rows=ids.refused_rows + unscored + plan.rows_carried,
        reasons=dict(sorted(reasons.items())),
        rows_kept=plan.rows_kept,
        rows_carried=plan.rows_carried,
        rows_missing=plan.changes.rows_missing if plan.changes is not None else 0,
        forward_passes_saved=saved,
        ranked_out=ranked_out,
        output_chunks=sum(int(r["chunks"] or 0) for r in groups if r[0] is None) if chunked else None,
        workers=_worker_totals(groups, rows_scored, plan.identity.preflight_loads, plan.identity.traffic),
    )
    if accounting.input_rows != accounting.rows_kept + accounting.output_rows + accounting.error_rows + (
        ranked_out or 0
    ):
        raise RuntimeError(
            f"row accounting broken: {accounting.input_rows} in, {accounting.rows_kept} kept, "
            f"{accounting.output_rows} scored, {accounting.error_rows} errors ({accounting.rows_carried} carried), "
            f"{ranked_out or 0} ranked out"
        )
    return accounting


def _passes_saved(table: DataFrame, scored_rows: int) -> int:
    """Scored rows that shared another scored row's input in their chunk: the forward passes dedup saved. Rows that
    were not scored (a null text, a failed forward) saved none, whatever input they shared."""
    scored = table.where(F.col(ERROR_COLUMNS[0]).isNull())
    return scored_rows - scored.select(CHUNK_COLUMN, DIGEST_COLUMN).distinct().count()


def _worker_totals(
    groups: list, rows_scored: int, preflight_loads: int, preflight: dict | None = None
) -> dict[str, Any]:
    """The report's ``workers`` figures from the per-reason sums of :func:`account_rows`'s aggregation, with the
    ``rows_scored`` it counted; ``preflight``: what a head over an endpoint sent for the preflight, counted in (its
    requests are paid for as the rows' are) and named apart as ``preflight``."""
    preflight = preflight or {}
    total = {
        name: sum(r[name] or 0 for r in groups) + int(preflight.get(name) or 0) for name in WORKER_METRICS.fieldNames()
    }
    traffic = Traffic.of(total)
    return {
        "model_loads": int(total["model_loads"]) + preflight_loads,
        "arrow_batches": int(total["arrow_batches"]),
        "rows_scored": rows_scored,
        "model_seconds": round(float(total["model_seconds"]), 3),
        "budget_halvings": int(total["budget_halvings"]),
        # cached (read) and cache-written among tokens_in, 0 (not absent) where the server reports none
        **(
            {
                "tokens_in": traffic.tokens_in,
                "tokens_in_cached": traffic.tokens_in_cached,
                "tokens_in_cache_write": traffic.tokens_in_cache_write,
                "tokens_out": traffic.tokens_out,
            }
            if traffic.tokens_in or traffic.tokens_out
            else {}
        ),
        **(
            {"requests": traffic.requests, "retries": traffic.retries, "rate_limited": traffic.rate_limited}
            if traffic.requests
            else {}
        ),
        **({"unmetered": traffic.unmetered} if traffic.unmetered else {}),
        **({"audio_ms": traffic.audio_ms} if traffic.audio_ms else {}),
        **({"preflight": {name: int(count) for name, count in preflight.items()}} if preflight.get("requests") else {}),
    }
