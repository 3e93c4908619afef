"""Step 7, publish: the output in one Delta commit when every check passed, then the errors table.

What is published is the staging snapshot pinned after the last chunk, the one accounting counted
and GX validated (:class:`~lakescore.jobs.steps.staging.StagedSnapshot`): its output row count is
known before the commit, and Delta's own metric of the commit is checked against it afterwards. Each
commit is tagged with the run (:attr:`~lakescore.jobs.steps.context.Plan.tag`) and found in the
history by that tag, never taken as "the latest" (another writer's, under concurrency). The output
and errors commits are idempotent per snapshot (:attr:`~lakescore.jobs.steps.staging.StagedSnapshot.publish_txn`):
a rerun after the driver died past a commit does not commit it again.

The output's fate is decided first: published with ``overwrite`` (or ``replaceWhere run_id = ...``
for ``write.mode: replace_run``, or one ``MERGE`` for ``write.mode: incremental``: :func:`apply_changes`)
when the error rate, validation and the drift gate passed, else nothing is
published and readers keep the previous version. Only then is the errors table written, so it
never describes a run whose publish failed or lost to a concurrent run. A run refused by a check
writes no errors table either: the errors table always goes with the output's rows (in every write mode), and the
refused run's dead-lettered rows stay in its staging (kept for a rerun) and its report.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    NumericType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from lakescore.jobs.config import RUN_ID, JobConfig
from lakescore.jobs.platform.files.hadoop_files import FILE_STATUS
from lakescore.jobs.platform.tables import (
    DELETION_VECTORS,
    MERGE_OP,
    STATS_COLUMNS,
    DeltaCommit,
    TableRef,
    column,
    load_file_lists,
    merge_delta,
    own_commit,
    read_input,
    write_delta,
)
from lakescore.jobs.references import quote_identifier
from lakescore.jobs.steps.account import Accounting
from lakescore.jobs.steps.context import Plan, RunContext, Targets
from lakescore.jobs.steps.dead_letter import (
    carried_rows,
    name_null_column,
    name_null_prompt_columns,
    refused_rows,
    unscored_rows,
)
from lakescore.jobs.steps.ids import all_present, id_columns, same_values
from lakescore.jobs.steps.staging import drop_stale_staging
from lakescore.jobs.testing_hooks import at_point
from lakescore.schemas.contracts import FILE_COLUMN
from lakescore.schemas.output import (
    CHUNK_COLUMNS,
    DIGEST_COLUMN,
    ERROR_COLUMNS,
    FILE_COLUMNS,
    IDENTITY_COLUMNS,
    INCREMENTAL_COLUMNS,
    KEY_DIGEST_COLUMN,
    RANK_COLUMN,
)
from lakescore.schemas.reasons import NULL_INPUT
from lakescore.udfs.options.generate import template_columns

__all__ = ["Outcome", "output_rows", "errors_rows", "load_targets", "publish", "apply_changes", "refusal"]


@dataclass(frozen=True)
class Outcome:
    """How the run ended: ``succeeded`` (published at ``delta_version``), ``validation_failed``, ``error_rate_exceeded``
    or ``drift_exceeded`` (the report step words why: :func:`~lakescore.jobs.steps.report.refusal_reason`)."""

    status: str
    delta_version: int | None = None
    errors_delta_version: int | None = None
    rows_deleted: int | None = None
    """Incremental mode: output rows the run's ``MERGE`` deleted (missing ids with ``write.delete_missing``, and ids
    whose input now fails: they are in the errors table); documents for a chunked run (every row of each gone).
    ``None`` in the other modes."""
    chunk_rows_deleted: int | None = None
    """Incremental mode, a chunked run: the output rows its ``MERGE`` deleted, the chunk rows of the documents it
    deleted and of the documents it scored again that have fewer chunks now; ``None`` for other runs."""
    staging_removed: tuple[str, ...] = ()
    """Staging locations of the output's earlier runs that no run can resume any more, removed after the publish."""


def output_rows(run: RunContext, plan: Plan, accounting: Accounting) -> DataFrame:
    """The rows the output receives from this run: the id column(s) (and a ranked run's key columns), predictions, a
    ranked run's rank, the identity columns (model, weights, run), and in incremental mode the input's digest and the
    scoring spec's (and a ranked run's key digest; with ``plan.file_status`` each file's path, length and time)."""
    cfg, identity = run.cfg, plan.identity
    incremental = (
        [F.col(DIGEST_COLUMN), F.lit(plan.changes.spec.digest).alias(INCREMENTAL_COLUMNS[1])] if plan.changes else []
    )
    if plan.changes and cfg.rank.enabled:
        incremental.append(F.col(KEY_DIGEST_COLUMN))
    if plan.file_status:
        file = F.col(FILE_COLUMN)
        incremental += [file[field].alias(name) for field, name in zip(("path", *FILE_STATUS.names), FILE_COLUMNS)]
    return accounting.published.select(
        *id_columns(cfg.row_cols),
        *([F.col(f.name) for f in CHUNK_COLUMNS] if cfg.chunked else []),
        *[F.col(f.name) for f in cfg.output_fields()],
        *([F.col(RANK_COLUMN)] if cfg.rank.enabled else []),
        F.lit(identity.model_id).alias("model_id"),
        F.lit(identity.revision).cast("string").alias("model_revision"),
        F.col("model_sha256"),
        F.lit(plan.run_id).alias("run_id"),
        *incremental,
    )


def load_targets(run: RunContext, targets: Targets) -> Future[None]:
    """Start loading the file lists of the output and the errors table in the background (for the run to wait on
    before :func:`publish`): each commit of the publish needs its table's, so loading them while the run validates,
    on otherwise idle CPU, lets the commits find them ready
    (:func:`~lakescore.jobs.platform.tables.load_file_lists`). In incremental mode the comparison already loaded
    the output's, and this finds it cached."""
    return load_file_lists(run.spark, (run.cfg.output, targets.errors_ref))


def publish(
    run: RunContext,
    targets: Targets,
    plan: Plan,
    accounting: Accounting,
    rows: DataFrame,
    validation: dict[str, Any] | None,
    drift: dict[str, Any] | None = None,
) -> Outcome:
    """Publish ``rows`` and then the errors table unless the error rate, validation or the drift gate (``drift``: the
    report's, from :func:`~lakescore.jobs.steps.drift.check_drift`) failed; then drop this run's staging and the
    output's stale staging (:func:`~lakescore.jobs.steps.staging.drop_stale_staging`). A refused run writes
    neither table and keeps its staging.

    Raises ``RuntimeError`` when Delta's own metric says the commit wrote another number of rows
    than were validated, and :class:`~lakescore.jobs.platform.tables.WriteConflictError` when a
    concurrent run won (the errors table is then left as it was).
    """
    cfg = run.cfg
    refused = refusal(cfg, accounting, validation, drift)
    if refused is not None:  # the errors table stays with the output it describes
        return Outcome(refused)
    tag, txn = plan.tag, accounting.snapshot.publish_txn
    at_point("publish_commit")
    merging = plan.changes is not None and targets.previous_version is not None and not cfg.write.full_rescore
    chunk_rows_deleted = None
    if merging:
        delta_version, deleted, chunk_rows_deleted = apply_changes(run, plan, accounting, rows, tag)
    else:
        properties = _new_output_properties(cfg, rows.schema, _write_mode(run, plan)[1])
        commit = _overwrite(
            run, plan, rows, cfg.output, txn, table_properties=properties, overwrite_schema=targets.replaces_layout
        )
        if commit.rows is not None and commit.rows != accounting.published_rows:
            raise RuntimeError(
                f"published {commit.rows} rows to {cfg.output} but validated {accounting.published_rows}"
            )
        delta_version, deleted = commit.version, (0 if plan.changes is not None else None)
        chunk_rows_deleted = deleted if cfg.chunked else None
    at_point("publish_committed")
    errors_version = _overwrite(
        run,
        plan,
        errors_rows(run, plan, accounting),
        targets.errors_ref,
        txn,
        overwrite_schema=targets.errors_layout_replaced,
    ).version
    at_point("errors_committed")
    own = [table for table in (plan.prepared, plan.changed, plan.staging) if table is not None]
    stale = drop_stale_staging(run.spark, cfg.output, cfg.write.staging, run.started, {t.location for t in own})
    for table in own:
        table.drop()
    return Outcome(
        "succeeded",
        delta_version=delta_version,
        errors_delta_version=errors_version,
        rows_deleted=deleted,
        chunk_rows_deleted=chunk_rows_deleted,
        staging_removed=tuple(stale),
    )


def apply_changes(
    run: RunContext, plan: Plan, accounting: Accounting, rows: DataFrame, tag: str
) -> tuple[int | None, int, int | None]:
    """Incremental mode on an existing output: one ``MERGE`` that upserts ``rows`` (this run's scored rows) and deletes
    the ids whose input now fails (errors table) and, with ``write.delete_missing``, the ids missing from the input.

    Returns ``(version, rows deleted, chunk rows deleted)``: a chunked run's rows deleted are documents (every row of
    each gone), its chunk rows Delta's count (``None`` for other runs); ``(None, 0, 0 or None)`` when there is
    nothing to apply (nothing scored, no new error, no deletion; a carried dead letter has no output row): no commit,
    so readers and downstream consumers of the output's versions see no change.
    Raises ``RuntimeError`` when Delta's own counts say the merge wrote another number of rows than were validated.
    """
    cfg, changes = run.cfg, plan.incremental_changes()
    deleting_missing = cfg.write.delete_missing and changes.rows_missing > 0
    if accounting.output_rows == 0 and accounting.new_error_rows == 0 and not deleting_missing:
        return None, 0, (0 if cfg.chunked else None)
    removed = _ids_to_remove(run, plan, accounting, rows)
    documents = removed
    if cfg.chunked:  # a document's rows are replaced whole: its chunks this run wrote none of go too
        removed = _stale_chunks(run, plan, removed, rows)
    keys = cfg.output_key_cols
    source = rows.withColumn(MERGE_OP, F.lit("upsert")).unionByName(
        removed.withColumn(MERGE_OP, F.lit("delete")), allowMissingColumns=True
    )
    commit = merge_delta(
        source,
        cfg.output,
        keys,
        rows.columns,
        f"lakescore_changes_{plan.staging.key}",
        tag,
        accounting.snapshot.publish_txn,
    )
    if commit.inserted + commit.updated != accounting.published_rows:
        raise RuntimeError(
            f"merged {commit.inserted} new and {commit.updated} updated rows into {cfg.output} "
            f"but validated {accounting.published_rows}"
        )
    if not cfg.chunked:
        return commit.version, commit.deleted, None
    # Delta counts chunk rows; the guarantees count documents: those of the ids removed that the output held
    gone = 0
    if commit.deleted:
        held = read_input(run.spark, cfg.output_ref(), "delta", version=changes.previous_version)
        held = held.select(*id_columns(cfg.id_cols))
        gone = documents.distinct().join(held, on=list(cfg.id_cols), how="left_semi").count()
    return commit.version, gone, commit.deleted


def _ids_to_remove(run: RunContext, plan: Plan, accounting: Accounting, rows: DataFrame) -> DataFrame:
    """Ids whose output row must go: this run could not score their input (unscored, or a null / duplicated id),
    with ``write.delete_missing`` the output ids missing from the input, and with ``rank`` the output rows of every
    re-ranked key that ``rows`` (this run's upserts) do not replace: a re-ranked key's rows are replaced whole. Each
    id once; the id column(s)."""
    cfg = run.cfg
    ids = list(cfg.id_cols)
    removed = accounting.staged.where(F.col(ERROR_COLUMNS[0]).isNotNull()).select(*id_columns(ids))
    if plan.split.ids.refused_rows:
        refused = plan.split.refused.where(all_present(ids)).select(*id_columns(ids)).distinct()
        removed = removed.unionByName(refused)
    if cfg.write.delete_missing:
        removed = removed.unionByName(plan.incremental_changes().missing_ids)
    if not cfg.rank.enabled:
        return removed
    keys = list(cfg.rank.partition_by)
    theirs = {k: f"__lakescore_key_{i}" for i, k in enumerate(keys)}
    changes = plan.incremental_changes()
    reranked = changes.to_score.select(*[column(k).alias(theirs[k]) for k in keys]).distinct()
    output = read_input(run.spark, cfg.output_ref(), "delta", version=changes.previous_version)
    stale = output.join(reranked, same_values(keys, theirs, null_safe=True), "left_semi").select(*id_columns(ids))
    return removed.unionByName(stale).distinct().join(rows.select(*id_columns(ids)), on=ids, how="left_anti")


def _stale_chunks(run: RunContext, plan: Plan, removed: DataFrame, rows: DataFrame) -> DataFrame:
    """A chunked output's rows to delete, as ids and ``chunk_index``: every row of the documents in ``removed`` (ids
    whose input failed or left) and of the documents this run scored again that ``rows`` (its upserts) do not replace,
    e.g. the last chunks of a shortened document."""
    ids, keyed = list(run.cfg.id_cols), list(run.cfg.output_key_cols)
    documents = removed.unionByName(rows.select(*id_columns(ids))).distinct()
    output = read_input(run.spark, run.cfg.output_ref(), "delta", version=plan.incremental_changes().previous_version)
    return (
        output.select(*id_columns(keyed))
        .join(documents, on=ids, how="left_semi")
        .join(rows.select(*id_columns(keyed)), on=keyed, how="left_anti")
    )


def refusal(
    cfg, accounting: Accounting, validation: dict[str, Any] | None, drift: dict[str, Any] | None = None
) -> str | None:
    """The status of a run that must not publish (error rate, then validation, then drift); ``None`` when it may."""
    if accounting.error_rate > cfg.max_error_rate:
        return "error_rate_exceeded"
    if validation is not None and not validation["success"]:
        return "validation_failed"
    if drift is not None and drift["exceeded"]:
        return "drift_exceeded"
    return None


def errors_rows(run: RunContext, plan: Plan, accounting: Accounting) -> DataFrame:
    """This run's rows for the errors table: rows refused for their id, rows the workers could not score (a null
    prompt's naming its template's null column), and in incremental mode the dead letters carried from an earlier run,
    each with the :data:`~lakescore.schemas.output.CARRY_COLUMNS` (the next run's comparison)."""
    cfg, changes = run.cfg, plan.changes
    if changes is None:
        carry, digest = (), None
    else:
        carry = (
            F.lit(changes.model_sha256).alias("model_sha256"),
            F.lit(changes.spec.digest).alias("spec_digest"),
            F.lit(plan.run_id).alias("first_run_id"),
            F.lit(False).alias("carried"),
        )
        digest = F.col(DIGEST_COLUMN).alias("input_digest")
    errors = unscored_rows(accounting.staged, cfg.id_cols, plan.run_id, *([digest, *carry] if carry else []))
    named = template_columns(cfg.prompt_template) if cfg.prompt_template else ()
    if named and accounting.reasons.get(NULL_INPUT):  # a null prompt's dead letter names its template's null column
        errors = name_null_prompt_columns(errors, run.source, cfg.id_cols, named)
    elif cfg.column_setting and not cfg.text_pair_col and accounting.reasons.get(NULL_INPUT):
        errors = name_null_column(errors, cfg.column_setting, cfg.input_col)
    if plan.split.ids.refused_rows:
        no_digest = F.lit(None).cast("string").alias("input_digest")
        errors = refused_rows(
            plan.split.refused, cfg.id_cols, _raw_input(run), plan.run_id, *([no_digest, *carry] if carry else [])
        ).unionByName(errors)
    carried = changes.carried() if changes is not None else None
    if changes is not None and carried is not None:
        errors = errors.unionByName(
            carried_rows(carried, cfg.id_cols, plan.run_id, changes.model_sha256, changes.spec.digest)
        )
    return errors


_UNFILTERED = (*[c for c in IDENTITY_COLUMNS if c != "run_id"], *INCREMENTAL_COLUMNS, KEY_DIGEST_COLUMN)
"""Output columns Delta keeps no statistics on: the model's identity, the same on every row of a run, and the
digests, hex text no reader filters by. Delta collects a string column's minimum and maximum row by row as it writes,
which cost as much as the rest of writing a cheap model's output (BENCHMARKS.md, issue 46)."""
_STATS_TYPES = (NumericType, StringType, BooleanType, DateType, TimestampType, TimestampNTZType)


def _new_output_properties(cfg: JobConfig, schema: StructType, partition_by: str | None) -> dict[str, str]:
    """Delta properties of an output this run creates with ``schema`` (partitioned by ``partition_by``): statistics
    on the columns readers filter by (``delta.dataSkippingStatsColumns``: the ids and key columns, the predictions
    Delta keeps statistics for, rank and run id, unless it is the partition column; none of :data:`_UNFILTERED`), and
    deletion vectors for incremental outputs (``write.deletion_vectors``), so later MERGEs write what changed, not
    every file it touches."""
    skipped = {
        *_UNFILTERED,
        partition_by,
    }  # a partition column has no statistics, and Delta refuses to be asked for any
    filtered = [f.name for f in schema if f.name not in skipped and isinstance(f.dataType, _STATS_TYPES)]
    properties = {STATS_COLUMNS: ",".join(map(quote_identifier, filtered))}
    if cfg.write.mode == "incremental" and cfg.write.deletion_vectors:
        properties[DELETION_VECTORS] = "true"
    return properties


def _overwrite(
    run: RunContext, plan: Plan, rows: DataFrame, ref: str, txn: tuple[str, int] | None, **options
) -> DeltaCommit:
    """Overwrite ``ref`` with ``rows`` as the write mode says (:func:`_write_mode`), tagged with the run's tag, and
    return the run's own commit: found by that tag, since under concurrency the latest may be another writer's."""
    ref = TableRef.parse(ref)
    replace_where, partition_by = _write_mode(run, plan)
    write_delta(
        rows, ref, replace_where=replace_where, partition_by=partition_by, user_metadata=plan.tag, txn=txn, **options
    )
    return own_commit(run.spark, ref, plan.tag)


def _write_mode(run: RunContext, plan: Plan) -> tuple[str | None, str | None]:
    """``(replaceWhere predicate, partition column)`` of the output and errors writes."""
    if run.cfg.write.mode != "replace_run":
        return None, None
    if not RUN_ID.fullmatch(plan.run_id):  # config refuses such ids; the predicate must never be built from one
        raise ValueError(f"run id {plan.run_id!r} cannot be written into a replaceWhere predicate")
    return f"run_id = '{plan.run_id}'", "run_id"


def _raw_input(run: RunContext):
    """The errors table's ``input`` for rows refused before scoring: the text, an image's path or its size and SHA-256
    (as :func:`~lakescore.udfs.images.describe_image` shows it without its header, never the bytes), or the features
    (or a text pair's two sides) as JSON."""
    if not run.cfg.column_setting or run.cfg.text_pair_col:
        return F.to_json(F.struct(*[column(c) for c in run.input_cols]))
    shown = run.input_cols[-1]  # an image read from a path: the path (the file is not read for it)
    value = column(shown)
    if not isinstance(run.source.schema[shown].dataType, BinaryType):
        return value
    size = F.length(value)
    return F.when(size == 0, F.lit("0 bytes")).otherwise(
        F.concat(size.cast("string"), F.lit(" bytes, sha256 "), F.sha2(value, 256))
    )
