"""Step 4, score: the chunks not yet staged go through the model on the executors into staging.

The scoring stage is a ``mapInArrow`` over the scorable rows (:mod:`lakescore.udfs.scoring_udf`),
on its own resource profile when one is configured (:mod:`lakescore.jobs.platform.spark.profiles`),
one Delta commit per chunk (:mod:`lakescore.jobs.steps.staging`), so a rerun resumes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakescore.jobs.config import JobConfig
from lakescore.jobs.platform.spark.adapter import default_parallelism, partition_count, stage_progress
from lakescore.jobs.platform.spark.progress import ProgressReporter, scoring_tasks
from lakescore.jobs.platform.tables import column
from lakescore.jobs.steps.clock import StepClock
from lakescore.jobs.steps.context import Plan, RunContext, ScoringLayout, scoring_layout
from lakescore.jobs.steps.dedup import score_deduplicated
from lakescore.jobs.steps.ids import row_key
from lakescore.jobs.steps.provider_batch import stage_through_batches
from lakescore.jobs.steps.rank import chunk_columns, keep_top, ranks_with_tallies
from lakescore.jobs.steps.staging import CHUNK_COLUMN, StagedSnapshot, Staging, chunk_column
from lakescore.jobs.testing_hooks import at_point
from lakescore.schemas.column_names import resolvable_name
from lakescore.schemas.output import scored_schema
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.registry import get_task
from lakescore.udfs.scoring_udf import RowCounter, make_scoring_function

__all__ = ["score_dataframe", "scoring_shuffle", "grouped_by_prompt", "score_into_staging", "pin_staging"]

log = logging.getLogger(__name__)

_ROW_KEY = "__lakescore_row_key"
"""A composite id's :func:`~lakescore.jobs.steps.ids.row_key`, read by a runner that seeds per-row draws (not kept)."""
_REPRESENTATIVE = "__lakescore_scored_for_input"
"""A deduplicated ranked chunk's flag of the rows scored for their input (:func:`~lakescore.jobs.steps.rank.keep_top`
counts them per key; not staged)."""
_ARROW_RECORDS_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
_ARROW_BYTES_CONF = "spark.sql.execution.arrow.maxBytesPerBatch"
_UNBOUNDED_BYTES = 2**31 - 1
"""Spark's value of :data:`_ARROW_BYTES_CONF` for no bound, where it skips measuring each batch row by row."""


def score_dataframe(
    df: DataFrame,
    cfg: JobConfig,
    spec: ModelSpec,
    keep_cols: Sequence[str],
    input_cols: tuple[str, ...],
    rows_counter: RowCounter | None = None,
    layout: ScoringLayout | None = None,
    key_col: str | None = None,
    tally_rows: bool = False,
) -> DataFrame:
    """Lazily score ``df``: columns per :func:`lakescore.schemas.output.scored_schema` (``keep_cols`` as
    they are, e.g. the id; predictions; ``model_sha256``; ``_reason``/``_error``/``_input`` for unscored rows).

    The scoring stage runs on ``scoring.partitions`` tasks (default: the cluster's
    parallelism when the input has fewer partitions, or always over Spark Connect, where
    the input's partitions are unknown), so a one-file input still uses every core.
    Prompts sent as requests (:attr:`~lakescore.jobs.config.JobConfig.groups_prefixes`) are spread by range of the
    prompt instead and sorted within each task (:func:`grouped_by_prompt`), so rows sharing a prefix arrive together.
    ``rows_counter`` receives each batch's rows (live progress; classic sessions only). ``key_col``: the column
    identifying each row (kept, or read only for this), for a task whose runner seeds per-row draws from it
    (generation's sampling). ``tally_rows``: each Arrow batch's worker metrics on a row of their own
    (:func:`~lakescore.udfs.scoring_udf.make_scoring_function`), for a caller that drops scored rows.

    With ``resources.scoring`` set and a master that honours resource profiles, the
    scoring stage runs with that profile (:mod:`lakescore.jobs.platform.spark.profiles`) on
    ``resources.scoring.partitions`` (else as above) tasks, always behind a
    repartition: a profile covers a whole stage, and reading and preprocessing
    must keep the default, full-CPU parallelism. Elsewhere (``local[...]``) a
    warning is logged and the stage runs without the profile.
    """
    layout = layout or scoring_layout(df.sparkSession, cfg)
    profile, partitions = layout.profile, layout.partitions
    target = partitions or default_parallelism(df.sparkSession)
    shuffle = scoring_shuffle(partition_count(df), target, partitions is not None or profile is not None)
    if cfg.groups_prefixes:
        df = grouped_by_prompt(df, target, input_cols[-1])
    elif shuffle:
        df = df.repartition(target)
    # the kept columns' own names
    schema = scored_schema(
        cfg.task, *[df.schema[name] for name in keep_cols], asked=cfg.asked_outputs(), chunked=cfg.chunked
    )
    read = list(
        dict.fromkeys([*keep_cols, *input_cols, *([key_col] if key_col else [])])
    )  # an input column may be kept too (transform)
    passed = {name: resolvable_name(name) for name in read}  # mapInArrow resolves its input columns by bare name
    kind = get_task(spec.task).input_kind_of(spec)
    runner_options = {name: getattr(cfg.scoring, name) for name in kind.runner_settings}
    if kind.row_keys and key_col is not None:
        runner_options["key_col"] = passed[key_col]
    scorer = make_scoring_function(
        spec,
        keep_cols=[passed[c] for c in keep_cols],
        input_cols=[passed[c] for c in input_cols],
        schema=schema,
        max_tokens=cfg.scoring.max_batch_tokens,
        max_rows=cfg.scoring.max_batch_rows,
        rows_counter=rows_counter,
        runner_options=runner_options,
        tally_rows=tally_rows,
    )
    return df.select(*[column(c).alias(passed[c]) for c in read]).mapInArrow(scorer, schema, profile=profile)


def scoring_shuffle(planned: int | None, target: int, configured: bool) -> bool:
    """Whether the scoring stage spreads its input over ``target`` tasks: when the tasks (or a resource profile,
    which covers a whole stage) are ``configured``, when the input's ``planned`` partitions are unknown (Spark
    Connect) or fewer than ``target``.

    >>> scoring_shuffle(1, 8, False), scoring_shuffle(16, 8, False), scoring_shuffle(16, 8, True)
    (True, False, True)
    """
    return configured or planned is None or planned < target


def grouped_by_prompt(df: DataFrame, tasks: int, prompt_col: str) -> DataFrame:
    """``df`` over ``tasks`` tasks by range of ``prompt_col`` (the rendered prompt), each task's rows sorted by it:
    rows whose prompts share a prefix are neighbours in one task, in sequence (a task boundary splits one group at
    most), so an engine's prefix cache sees a prefix's rows together. Always a shuffle: the input's own order, even in
    one partition, would scatter them."""
    prompt = column(prompt_col)
    return df.repartitionByRange(tasks, prompt).sortWithinPartitions(prompt)


def score_into_staging(run: RunContext, plan: Plan, clock: StepClock) -> list[tuple[float, int]]:
    """Score every chunk of ``plan`` not yet committed to its staging table, one commit per chunk; with nothing to
    score, commit nothing (no staging table: :func:`pin_staging`). Stopped, it tells ``clock`` how many chunks it
    staged.

    Returns the progress samples ``(seconds, rows scored)`` for the report's throughput chart.
    """
    cfg, spark = run.cfg, run.spark
    todo = [c for c in range(plan.chunks) if c not in plan.done] if plan.scorable_rows else []
    todo_rows = plan.scorable_rows if len(todo) == plan.chunks else round(plan.scorable_rows * len(todo) / plan.chunks)
    layout = _layout_for_progress(run, plan)
    staged = len(plan.done)
    rows = run.rows_counter
    row_bytes = fixed_row_bytes(plan.scorable.schema, [*plan.kept_columns(cfg.row_cols), *run.input_cols])
    with (
        _arrow_settings(spark, cfg, row_bytes),
        stage_progress(spark) as tasks,
        ProgressReporter(
            tasks,
            (lambda: rows.value) if rows is not None else None,
            todo_rows,
            cfg.progress_seconds,
            chunks=plan.chunks,
        ) as progress,
    ):
        try:
            if plan.prepared is not None and todo and not plan.prepared_ready:
                _write_chunked_rows(run, plan, plan.prepared)
            if cfg.provider_batch:  # the provider's Batch API: the rows go out as files
                stage_through_batches(run, plan, todo, lambda chunk: _chunk_rows(run, plan, chunk))
                staged += len(todo)
                todo = []
            for chunk in todo:
                progress.chunk(chunk)
                at_point(f"chunk_commit:{chunk}")
                plan.staging.commit_chunk(_score_chunk(run, plan, chunk, layout), chunk, plan.tag)
                at_point(f"chunk_committed:{chunk}")
                staged += 1
                log.info("chunk %d/%d staged", chunk + 1, plan.chunks)
        except BaseException:
            clock.stopped_while_scoring(staged, plan.chunks)  # "k of n chunks staged": what a rerun resumes from
            raise
    return progress.samples()


def pin_staging(run: RunContext, plan: Plan) -> StagedSnapshot:
    """The staging snapshot that accounting counts, GX validates and the publish writes: the staging table at its
    version now, or with nothing to score (an unchanged incremental input) no rows, in the staged schema."""
    if plan.scorable_rows:
        return plan.staging.pin()
    staged = _score_chunk(run, plan, 0, run.layout).withColumn(CHUNK_COLUMN, F.lit(0))
    # limit(0): Spark plans it as an empty relation, so no Python worker starts (an empty list given to
    # createDataFrame is a Python RDD, whose every read does start one)
    return plan.staging.nothing(staged.limit(0))


def _write_chunked_rows(run: RunContext, plan: Plan, prepared: Staging) -> None:
    """The one scan of the input for scoring: the rows to score (id, model input, digest) written once, partitioned
    by chunk (:func:`~lakescore.jobs.steps.rank.chunk_columns`), to ``plan.prepared``; each chunk then reads its own
    partition."""
    needed = dict.fromkeys([*plan.kept_columns(run.cfg.row_cols), *run.input_cols])
    prepared.write_chunked(plan.scorable.select(*[column(c) for c in needed]), chunk_columns(run.cfg))


def _score_chunk(run: RunContext, plan: Plan, chunk: int, layout: ScoringLayout) -> DataFrame:
    """The rows of ``chunk`` to stage (lazy): its rows scored, once per distinct input when deduplicating; with
    ``rank`` only each key's kept rows, the rows that failed and any tally rows
    (:func:`~lakescore.jobs.steps.rank.keep_top`)."""
    cfg = run.cfg
    part = _chunk_rows(run, plan, chunk)
    incremental = plan.changes is not None
    tallied = plan.ranked and ranks_with_tallies(incremental, plan.dedup.used)

    def score(df: DataFrame, keep: list[str], key: str | None = None) -> DataFrame:  # key: the row's (default keep[0])
        return score_dataframe(
            df,
            cfg,
            plan.spec,
            keep,
            run.input_cols,
            run.rows_counter,
            layout,
            key_col=key or keep[0],
            tally_rows=tallied,
        )

    mark = _REPRESENTATIVE if plan.dedup.used and plan.ranked else None
    if plan.dedup.used:
        scored = score_deduplicated(part, score, cfg.id_cols, plan.row_columns(cfg.row_cols), run.input_cols, mark)
    elif len(cfg.id_cols) > 1 and cfg.input_kind.row_keys:  # one value per row to seed its draws from
        scored = score(part.withColumn(_ROW_KEY, row_key(cfg.id_cols)), plan.kept_columns(cfg.row_cols), _ROW_KEY)
    else:
        scored = score(part, plan.kept_columns(cfg.row_cols))
    return keep_top(cfg, scored, incremental, mark) if plan.ranked else scored


def _chunk_rows(run: RunContext, plan: Plan, chunk: int) -> DataFrame:
    """The rows of ``chunk`` to score (lazy): its partition of the prepared rows, its share of a rescanned input, or
    every scorable row of a one-chunk run."""
    if plan.prepared is not None:
        return plan.prepared.chunk(chunk)
    if plan.rescanned:
        return plan.scorable.where(chunk_column(chunk_columns(run.cfg), plan.chunks) == chunk)
    return plan.scorable


def _layout_for_progress(run: RunContext, plan: Plan) -> ScoringLayout:
    """A few scoring tasks per slot unless configured, so progress moves before the first wave of tasks ends
    (accumulators merge when a task ends), but never so many that task overhead dominates
    (:func:`~lakescore.jobs.platform.spark.progress.progress_partitions`). Over Spark Connect,
    where the planned partitions are unknown without a job, the layout stays as configured. A cheap model scores
    the input's own partitions (:func:`~lakescore.jobs.platform.spark.progress.scoring_tasks`, at the speed the
    preflight measured: :attr:`~lakescore.jobs.steps.context.ModelIdentity.row_seconds`)."""
    if run.layout.partitions is not None:
        return run.layout
    planned = partition_count(plan.scorable)
    if planned is None:
        return run.layout
    rows_per_chunk = math.ceil(plan.scorable_rows / plan.chunks)
    tasks = scoring_tasks(
        planned, default_parallelism(run.spark), rows_per_chunk, plan.identity.row_seconds, run.cfg.progress_seconds
    )
    if tasks is not None:
        return dataclasses.replace(run.layout, partitions=tasks)
    return run.layout


_FIXED_WIDTH = {
    T.ByteType: 1,
    T.ShortType: 2,
    T.IntegerType: 4,
    T.LongType: 8,
    T.FloatType: 4,
    T.DoubleType: 8,
    T.DecimalType: 16,
    T.BooleanType: 1,
    T.DateType: 4,
    T.TimestampType: 8,
    T.TimestampNTZType: 8,
}
"""Bytes a value of each fixed-width Spark type takes in Arrow (a boolean's bit rounded up to a byte)."""


def fixed_row_bytes(schema: T.StructType, names: Sequence[str]) -> int | None:
    """The most bytes the columns ``names`` of ``schema`` can hold in one row, when each is a number, boolean, date or
    timestamp (or a struct of those); ``None`` when any can grow with its value (strings, binary, arrays, maps).

    >>> schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("f", T.FloatType()),
    ...                        T.StructField("text", T.StringType())])
    >>> fixed_row_bytes(schema, ["id", "f"]), fixed_row_bytes(schema, ["id", "text"])
    (12, None)
    """

    def width(kind: T.DataType) -> int | None:
        if isinstance(kind, T.StructType):
            widths = [width(f.dataType) for f in kind.fields]
            return None if None in widths else sum(widths)
        return _FIXED_WIDTH.get(type(kind))

    if any(name not in schema.fieldNames() for name in names):
        return None
    widths = [width(schema[name].dataType) for name in dict.fromkeys(names)]
    return None if None in widths else sum(widths)


class _arrow_settings:
    """Set the Arrow batch bounds for the scoring stage; a taken session (Databricks) gets its own back.

    The bytes bound is handed to Spark only where a batch could pass it: Spark then measures its Arrow buffers after
    every row it adds, which for a cheap model over narrow numeric rows cost more than the model (BENCHMARKS.md,
    issue 46). Rows of ``row_bytes`` at most (:func:`fixed_row_bytes`) that fit the bound at the records limit run
    unmeasured (the bound set to Spark's "none", ``Int.MaxValue``)."""

    def __init__(self, spark: SparkSession, cfg: JobConfig, row_bytes: int | None = None) -> None:
        self._spark = spark
        records, max_bytes = cfg.scoring.arrow_max_records_per_batch, cfg.scoring.arrow_max_bytes_per_batch
        bounded = row_bytes is not None and row_bytes * records <= max_bytes
        self._confs = {
            _ARROW_RECORDS_CONF: str(records),
            _ARROW_BYTES_CONF: str(_UNBOUNDED_BYTES if bounded else max_bytes),
        }

    def __enter__(self):
        self._previous = {key: self._spark.conf.get(key, None) for key in self._confs}
        for key, value in self._confs.items():
            self._spark.conf.set(key, value)
        return self

    def __exit__(self, *exc) -> None:
        for key, value in self._previous.items():
            if value is None:
                self._spark.conf.unset(key)
            else:
                self._spark.conf.set(key, value)
