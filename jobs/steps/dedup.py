"""Step 3d/4, dedup (``scoring.dedup``): identical inputs are scored once per chunk and fanned out to every row.

Two rows are identical when their :data:`~lakescore.schemas.output.DIGEST_COLUMN` (the SHA-256 of what the
model sees, :func:`lakescore.jobs.steps.incremental.input_digest`) is equal. A deduplicated chunk groups
its rows by digest, scores one row per digest and joins the outputs back on the digest, so each input row still gets
its own output or error row. A row whose digest is null (every input null) is never grouped with another: it is
scored on its own, so a dead letter always shows its own row's input.
The workers' per-batch metrics stay on one row per scored input, so the report counts them once.

``auto`` decides once per run, before scoring, from a deterministic sample (rows whose id hashes into
the sample; about :data:`SAMPLE_ROWS` of them): deduplication pays for its two shuffles when at least
:data:`MIN_REPEAT` of the sampled rows repeat an input. An incremental run decides from all its rows to
score instead, whose distinct inputs it estimated while counting them (no job of its own). The decision is
part of the run key, and the sample (or the estimate over the same pinned rows) is the same on a rerun of the
same pinned input, so a resumed run decides the same way. A model the preflight timed under
:data:`MIN_ROW_SECONDS` a row is neither sampled nor deduplicated: its forward passes cost less than
deduplicating them, however often inputs repeat (a model timed near that bound may decide otherwise on a
rerun, which then scores afresh rather than resuming).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakescore.jobs.platform.spark.adapter import one_row
from lakescore.jobs.platform.tables import column
from lakescore.jobs.steps.ids import id_hash, row_key
from lakescore.schemas.output import DIGEST_COLUMN, WORKER_COLUMN

__all__ = ["SAMPLE_ROWS", "MIN_REPEAT", "MIN_ROW_SECONDS", "Dedup", "decide_dedup", "score_deduplicated"]

SAMPLE_ROWS = 2000
MIN_REPEAT = 0.10
"""``auto`` deduplicates when at least this fraction of the sampled rows repeat an input already in the sample."""
MIN_ROW_SECONDS = 10e-6
"""``auto`` never deduplicates a model faster than this a row (the preflight's timing): deduplicating costs a task
slot several times that a row (its digests and two shuffles of every row; BENCHMARKS.md, issue 46), so no repetition
pays for it, and its sample is a job on the run's critical path."""

_REPRESENTATIVE = "__lakescore_representative_id"
_ROW_DIGEST = "__lakescore_row_digest"
_GROUP = "__lakescore_dedup_group"
_ROW_GROUP = "__lakescore_row_dedup_group"


@dataclass(frozen=True)
class Dedup:
    """What ``scoring.dedup`` decided for this run, and on what evidence (``auto`` only)."""

    mode: str
    used: bool
    sample_rows: int | None = None
    sample_distinct: int | None = None

    def as_report(self, forward_passes_saved: int | None) -> dict[str, Any]:
        """The report's ``dedup`` entry."""
        return {
            "mode": self.mode,
            "used": self.used,
            "sample_rows": self.sample_rows,
            "sample_distinct": self.sample_distinct,
            "forward_passes_saved": forward_passes_saved,
        }


def decide_dedup(
    mode: str,
    digested: DataFrame,
    id_cols: Sequence[str],
    rows: int,
    distinct: int | None = None,
    row_seconds: float | None = None,
) -> Dedup:
    """``on`` / ``off`` as configured; ``auto``: deduplicate when the repetition among ``digested``'s ``rows`` rows
    (with a :data:`DIGEST_COLUMN`) reaches :data:`MIN_REPEAT`. The repetition is ``distinct`` inputs among all
    ``rows`` when the caller counted them (an incremental run counts its rows to score in one job and estimates
    their distinct inputs there), else that of a deterministic sample, counted in one aggregation. A model timed at
    ``row_seconds`` under :data:`MIN_ROW_SECONDS` a row is never deduplicated, and nothing is sampled."""
    if mode != "auto":
        return Dedup(mode, mode == "on")
    if row_seconds is not None and row_seconds < MIN_ROW_SECONDS:
        return Dedup(mode, False)
    if rows < 2:
        return Dedup(mode, False, rows, rows)
    if distinct is not None:
        distinct = min(distinct, rows)  # an estimate may exceed the rows it counted
        return Dedup(mode, (rows - distinct) / rows >= MIN_REPEAT, rows, distinct)
    every = max(1, math.ceil(rows / SAMPLE_ROWS))
    sample = digested.where(F.pmod(id_hash(id_cols), F.lit(every)) == 0)
    found = one_row(
        sample.agg(
            F.count(F.lit(1)).alias("rows"),
            (F.countDistinct(column(DIGEST_COLUMN)) + F.max(column(DIGEST_COLUMN).isNull().cast("int"))).alias(
                "distinct"
            ),
        )
    )
    sampled, distinct = int(found["rows"]), int(found["distinct"] or 0)
    return Dedup(mode, sampled > 0 and (sampled - distinct) / sampled >= MIN_REPEAT, sampled, distinct)


def score_deduplicated(
    part: DataFrame,
    score: Callable[[DataFrame, list[str]], DataFrame],
    id_cols: Sequence[str],
    row_cols: Sequence[str],
    input_cols: tuple[str, ...],
    mark: str | None = None,
) -> DataFrame:
    """Score each distinct input of ``part`` once and fan the outputs out to its rows.

    ``part`` holds ``row_cols`` (the id column(s) ``id_cols`` first, then a ranked run's key columns), the input
    columns and :data:`DIGEST_COLUMN`; ``score(df, keep_cols)`` is the scoring function
    (:func:`lakescore.jobs.steps.score.score_dataframe`), ``keep_cols[0]`` the row's key (here the smallest
    :func:`~lakescore.jobs.steps.ids.row_key` of each distinct input). Returns the columns
    ``score(part, [*row_cols, DIGEST_COLUMN])`` would, one row per row of ``part``; with ``mark``, also a boolean column
    of that name, true on the one row per distinct input that was scored for it (a ranked run counts them per key).
    """
    # The group: the digest, or for a null digest the row's own key (a digest is hex, so never "row ...").
    group = F.coalesce(column(DIGEST_COLUMN), F.concat(F.lit("row "), row_key(id_cols).cast("string")))
    distinct = part.groupBy(group.alias(_GROUP)).agg(
        *[F.first(column(c)).alias(c) for c in input_cols],
        F.min(row_key(id_cols)).alias(_REPRESENTATIVE),
        F.first(column(DIGEST_COLUMN)).alias(DIGEST_COLUMN),
    )
    scored = score(distinct, [_REPRESENTATIVE, DIGEST_COLUMN, _GROUP])
    rows = part.select(
        *[column(c) for c in row_cols], column(DIGEST_COLUMN).alias(_ROW_DIGEST), group.alias(_ROW_GROUP)
    )
    joined = rows.join(scored, F.col(_ROW_GROUP) == F.col(_GROUP), "inner")
    outputs = [c for c in scored.columns if c not in (DIGEST_COLUMN, _REPRESENTATIVE, WORKER_COLUMN, _GROUP)]
    worker = F.when(row_key(id_cols) == F.col(_REPRESENTATIVE), F.col(WORKER_COLUMN)).alias(WORKER_COLUMN)
    marked = [(row_key(id_cols) == F.col(_REPRESENTATIVE)).alias(mark)] if mark else []
    return joined.select(
        *[column(c) for c in row_cols],
        F.col(_ROW_DIGEST).alias(DIGEST_COLUMN),
        *[column(c) for c in outputs],
        worker,
        *marked,
    )
