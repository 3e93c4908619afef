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

import dataclasses

from pyspark.sql import functions as F
from pyspark.sql.window import Window

from lakescore.jobs.platform.tables import column
from lakescore.jobs.steps.account import Accounting
from lakescore.jobs.steps.ids import id_columns
from lakescore.jobs.steps.incremental import key_digest
from lakescore.jobs.steps.prepare import Plan
from lakescore.jobs.steps.read import RunContext
from lakescore.schemas.output import KEY_DIGEST_COLUMN, RANK_COLUMN

__all__ = ["rank_rows"]


def rank_rows(run: RunContext, plan: Plan, accounting: Accounting) -> Accounting:
    """``accounting`` with its published rows ranked and cut to ``rank.top_k`` per key (with :data:`RANK_COLUMN`, and in
    incremental mode :data:`KEY_DIGEST_COLUMN`), ``output_rows`` the rows kept and ``ranked_out`` the rest; as it is
    without ``rank``. Counting the kept rows is one aggregation over the keys (a key keeps ``min(rows, top_k)``)."""
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
    ranked = ranked.where(F.col(RANK_COLUMN) <= cfg.rank.top_k)
    kept = 0
    if accounting.output_rows:
        per_key = scored.groupBy(*keys).count()
        kept = int(per_key.agg(F.sum(F.least(F.col("count"), F.lit(cfg.rank.top_k)))).first()[0] or 0)
    return dataclasses.replace(accounting, output_rows=kept, ranked_out=accounting.output_rows - kept, ranked=ranked)
