"""Step 5b, rank (``rank``): keep the best ``rank.top_k`` scored rows of each key, numbered 1 (best) to ``top_k``.

Within a key (the values of ``rank.partition_by``) rows are ordered by ``rank.order_by`` (largest first unless
``rank.descending`` is false), equal values by the id column(s) ascending, so a ranking never depends on partitioning
or retries: Spark's ``row_number()`` over that window. Rows past ``top_k`` are ranked out: counted (``ranked_out``),
neither published nor errors, so ``input = kept + output + errors + ranked_out``. Rows that failed to score are
errors and take no place in a ranking.

In ``write.mode: incremental`` only keys with a new, changed or deleted row are scored and ranked again, every row
of such a key (:func:`~lakescore.jobs.steps.incremental.find_changes`): the output keeps no score for a row ranked out,
and scoring the key again is simpler and as correct as keeping those scores elsewhere. Each ranked row carries its
key's :func:`~lakescore.jobs.steps.incremental.key_digest` over the rows scored into it, for the next run to compare,
and the publish's MERGE replaces the key's rows whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from pyspark import StorageLevel
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from lakescore.jobs.platform.tables import column
from lakescore.jobs.steps.account import Accounting
from lakescore.jobs.steps.ids import id_columns
from lakescore.jobs.steps.incremental import key_digest
from lakescore.jobs.steps.prepare import Plan
from lakescore.jobs.steps.read import RunContext
from lakescore.schemas.output import KEY_DIGEST_COLUMN, RANK_COLUMN

__all__ = ["rank_rows", "ranking_held"]


def rank_rows(run: RunContext, plan: Plan, accounting: Accounting) -> Accounting:
    """``accounting`` with its published rows ranked and cut to ``rank.top_k`` per key (with :data:`RANK_COLUMN`, and in
    incremental mode :data:`KEY_DIGEST_COLUMN`), ``output_rows`` the rows kept and ``ranked_out`` the rest; as it is
    without ``rank``. The ranked rows are computed once and held in the executors' storage (memory, spilling to disk)
    until :func:`ranking_held` releases them."""
    cfg = run.cfg
    if not cfg.rank.enabled:
        return accounting
    keys = id_columns(cfg.rank.partition_by)
    by = column(cfg.rank.order_by)
    order = [by.desc_nulls_last() if cfg.rank.descending else by.asc_nulls_last(), *[c.asc() for c in id_columns(cfg.id_cols)]]
    scored = accounting.published
    ranked = scored.withColumn(RANK_COLUMN, F.row_number().over(Window.partitionBy(*keys).orderBy(*order)))
    if plan.changes is not None:
        ranked = ranked.withColumn(KEY_DIGEST_COLUMN, key_digest(cfg, over=Window.partitionBy(*keys)))
    # Held once, counted as it is filled: the GX suite, the report's samples, the drift figures and the publish each
    # read the ranked rows, and without it each would sort every scored row by key again.
    ranked = ranked.where(F.col(RANK_COLUMN) <= cfg.rank.top_k).persist(StorageLevel.MEMORY_AND_DISK)
    kept = ranked.count() if accounting.output_rows else 0
    return dataclasses.replace(accounting, output_rows=kept, ranked_out=accounting.output_rows - kept, ranked=ranked)


@contextlib.contextmanager
def ranking_held(accounting: Accounting) -> Iterator[Accounting]:
    """``accounting`` for the block, its ranked rows (:func:`rank_rows`) released from the executors' storage when
    the block ends, published or not."""
    try:
        yield accounting
    finally:
        if accounting.ranked is not None:
            accounting.ranked.unpersist()
