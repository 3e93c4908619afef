"""Step 4b, rank (``rank``): keep the best ``rank.top_k`` scored rows of each key, numbered 1 (best) to ``top_k``,
before they are staged.

Within a key (the values of ``rank.partition_by``) rows are ordered by ``rank.order_by`` (largest first unless
``rank.descending`` is false), equal values by the id column(s) ascending, so a ranking never depends on partitioning
or retries: Spark's ``row_number()`` over that window (or ``rank()``, the same numbers where ids are unique). A
ranked run cuts its chunks by the key (:func:`~lakescore.jobs.steps.staging.chunk_column` of ``rank.partition_by``),
so each key's rows are scored in one chunk, ranked there (:func:`keep_top`) and only the kept rows are staged: the
one shuffle by key ranks them, and a resumed run's staged chunks are already ranked. Rows past ``top_k`` are ranked
out: neither staged, published nor errors, so ``input = kept + output + errors + ranked_out``. Rows that failed to
score are errors, staged as they are, and take no place in a ranking.

How ranked-out rows are counted decides what the shuffle moves (:func:`ranks_with_tallies`). Where nothing needs a
total over a key's rows, the ranking is ``rank() <= top_k`` alone, which Spark keeps in every input partition before
the shuffle (its window group limit), so only each partition's best rows of a key are shuffled; the rows the model
scored are counted by the scoring function instead, on one tally row per Arrow batch (:func:`is_tally`) that also
carries the batch's worker metrics, and ``ranked_out = rows tallied - rows staged``. Otherwise (incremental mode's
key digest, dedup's counts per key) every row is shuffled, and each key's first row carries its ranked-out count
(:data:`RANKED_OUT_COLUMN`) and its rows' worker metrics.

In ``write.mode: incremental`` only keys with a new, changed or deleted row are scored and ranked again, every row
of such a key (:func:`~lakescore.jobs.steps.incremental.find_changes`): the output keeps no score for a row ranked out,
and scoring the key again is simpler and as correct as keeping those scores elsewhere. Each ranked row carries its
key's :func:`key_digest` over the rows scored into it, for the next run to compare,
and the publish's MERGE replaces the key's rows whole.
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window, WindowSpec

from lakescore.jobs.config import JobConfig
from lakescore.jobs.platform.tables import column
from lakescore.jobs.steps.ids import id_columns
from lakescore.schemas.output import (
    DIGEST_COLUMN,
    ERROR_COLUMNS,
    KEY_DIGEST_COLUMN,
    RANK_COLUMN,
    WORKER_COLUMN,
    WORKER_METRICS,
)

__all__ = [
    "RANKED_OUT_COLUMN",
    "PASSES_COLUMN",
    "chunk_columns",
    "ranks_with_tallies",
    "keep_top",
    "is_tally",
    "key_digest",
]

RANKED_OUT_COLUMN = "__lakescore_ranked_out"
"""Without tally rows, on each key's best staged row: how many of the key's scored rows were ranked out (not staged);
null elsewhere."""
PASSES_COLUMN = "__lakescore_passes"
"""With dedup, on each key's best staged row: how many of the key's scored rows were their input's forward pass."""


def chunk_columns(cfg: JobConfig) -> list[str]:
    """What a run's chunks are cut by: the rank key with ``rank`` (a key's rows are ranked together, so they are
    scored in one chunk), else the id column(s)."""
    return list(cfg.rank.partition_by) if cfg.rank.enabled else list(cfg.id_cols)


def ranks_with_tallies(incremental: bool, dedup: bool) -> bool:
    """Whether a ranked chunk is scored with tally rows and ranked by ``rank()`` alone (see the module's docstring):
    unless ``incremental`` (each key's digest) or ``dedup`` (whose tallies count distinct inputs, not rows) needs a
    total over each key's rows."""
    return not (incremental or dedup)


def is_tally() -> Column:
    """True on a ranked staging table's tally rows: a batch's worker metrics (:data:`WORKER_COLUMN`), no input row.
    Every other staged row of a ranked run either has a rank or failed."""
    return F.col(RANK_COLUMN).isNull() & F.col(ERROR_COLUMNS[0]).isNull()


def keep_top(cfg: JobConfig, scored: DataFrame, incremental: bool, representative: str | None = None) -> DataFrame:
    """``scored`` (one chunk's scored rows, every row of each of its keys) with the rows past ``rank.top_k`` per key
    dropped, the kept rows with :data:`RANK_COLUMN`. Rows that failed to score stay as they are (rank null), and so do
    tally rows (a chunk scored with them: :func:`ranks_with_tallies`). Otherwise each key's first row gets
    :data:`RANKED_OUT_COLUMN`, the key's workers' metrics (:data:`WORKER_COLUMN`, which rode on rows that may be ranked
    out) and with ``representative`` (dedup's flag of a row scored for its input) :data:`PASSES_COLUMN`; in
    ``incremental`` mode each kept row gets :data:`KEY_DIGEST_COLUMN`."""
    if ranks_with_tallies(incremental, representative is not None):
        return _keep_top_before_shuffle(cfg, scored)
    failed = F.col(ERROR_COLUMNS[0]).isNotNull()
    order_by, top_k = cfg.rank.ordering()
    by = column(order_by)
    order = [
        by.desc_nulls_last() if cfg.rank.descending else by.asc_nulls_last(),
        *[c.asc() for c in id_columns(cfg.id_cols)],
    ]
    # Failed rows form their own partitions (never ranked); one ordered window with an unbounded frame for the key's
    # totals, so Spark ranks and totals in one sort.
    window = Window.partitionBy(*id_columns(cfg.rank.partition_by), failed).orderBy(*order)
    whole = window.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    rank = F.row_number().over(window)
    first = ~failed & (rank == 1)
    added = {
        RANK_COLUMN: F.when(~failed, rank),
        RANKED_OUT_COLUMN: F.when(first, F.greatest(F.count(F.lit(1)).over(whole) - top_k, F.lit(0))),
        WORKER_COLUMN: F.when(failed, F.col(WORKER_COLUMN)).when(first, _key_metrics(whole)),
    }
    if representative is not None:
        added[PASSES_COLUMN] = F.when(first, F.count(F.when(F.col(representative), True)).over(whole))
    if incremental:
        added[KEY_DIGEST_COLUMN] = F.when(~failed, key_digest(cfg, over=whole))
    ranked = scored.select(
        *[column(c) for c in scored.columns if c not in added and c != representative],
        *[value.alias(name) for name, value in added.items()],
    )
    return ranked.where(failed | (F.col(RANK_COLUMN) <= top_k))


def _keep_top_before_shuffle(cfg: JobConfig, scored: DataFrame) -> DataFrame:
    """:func:`keep_top` of rows scored with tally rows, as ``rank() <= top_k`` over each key: the form Spark ranks in
    every input partition before the shuffle (a total over the key, or an ``OR`` in the filter, would stop it)."""
    unranked = F.col(ERROR_COLUMNS[0]).isNotNull() | F.col(WORKER_COLUMN).isNotNull()  # failed rows, tally rows
    ids = id_columns(cfg.id_cols)
    order_by, top_k = cfg.rank.ordering()
    by = column(order_by)
    # rank(), not row_number(): a failed row is a window of its own (ids are unique), and the tally rows share one
    # (every column of theirs is null), where they all tie at 1; scored rows never tie, their ids being unique. The
    # order columns go to the shuffle as they are (no expression over them).
    window = Window.partitionBy(*id_columns(cfg.rank.partition_by), F.when(unranked, F.struct(*ids))).orderBy(
        by.desc_nulls_last() if cfg.rank.descending else by.asc_nulls_last(), *[c.asc() for c in ids]
    )
    place = "__lakescore_place"
    kept = scored.withColumn(place, F.rank().over(window)).where(F.col(place) <= top_k)
    return kept.withColumn(RANK_COLUMN, F.when(~unranked, F.col(place))).drop(place)


def _key_metrics(whole) -> Column:
    """The workers' per-batch metrics summed over a key's scored rows (each batch's rode on one of them)."""
    return F.struct(
        *[
            F.sum(F.col(f"{WORKER_COLUMN}.{f.name}")).over(whole).cast(f.dataType).alias(f.name)
            for f in WORKER_METRICS.fields
        ]
    )


def key_digest(cfg, over: WindowSpec | None = None) -> Column:
    """An aggregate over one rank key's rows (``over``: as a window function over each key's rows): SHA-256 (hex) of
    the rank settings and the key's rows, each the JSON of its id column(s) and :data:`DIGEST_COLUMN`, sorted (so
    neither row order nor partitioning changes it). The output stores it on each of the key's rows
    (:data:`~lakescore.schemas.output.KEY_DIGEST_COLUMN`), computed over the rows scored into it; the next run
    computes it over the key's input rows."""
    settings = json.dumps(cfg.rank.model_dump(mode="json"), sort_keys=True)
    rows = F.collect_list(F.to_json(F.struct(*id_columns(cfg.id_cols), column(DIGEST_COLUMN))))
    rows = rows.over(over) if over is not None else rows
    return F.sha2(F.concat_ws("\n", F.lit(settings), F.array_sort(rows)), 256)
