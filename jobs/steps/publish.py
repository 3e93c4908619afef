"""Step 7, publish: the errors table, then the output in one Delta commit, only when every check passed.

The errors table is written whatever validation decides (it explains a failed run), in a
background thread while GX validates (:func:`write_errors_in_background`): both mostly wait
on the JVM. The output is published with ``overwrite``, or ``replaceWhere run_id = ...`` for
``write.mode: replace_run``; a run that failed a check publishes nothing and readers keep the
previous version.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakescore.jobs.platform.tables import DeltaCommit, column, write_delta_overwrite
from lakescore.jobs.steps.account import Accounting
from lakescore.jobs.steps.dead_letter import refused_rows, unscored_rows
from lakescore.jobs.steps.prepare import Plan
from lakescore.jobs.steps.read import RunContext, Targets
from lakescore.udfs.registry import get_task

__all__ = ["Outcome", "output_rows", "write_errors_in_background", "publish"]


@dataclass(frozen=True)
class Outcome:
    """How the run ended: ``succeeded`` (published at ``delta_version``), ``validation_failed`` or ``error_rate_exceeded``."""

    status: str
    delta_version: Optional[int] = None
    errors_delta_version: Optional[int] = None
    error: Optional[str] = None


def output_rows(run: RunContext, plan: Plan, accounting: Accounting) -> DataFrame:
    """The rows the output receives: id, predictions and the identity columns (model, weights, run)."""
    identity = plan.identity
    return accounting.published.select(
        column(run.cfg.id_col),
        *[F.col(f.name) for f in get_task(run.cfg.task).output_fields],
        F.lit(identity.model_id).alias("model_id"),
        F.lit(identity.revision).cast("string").alias("model_revision"),
        F.col("model_sha256"),
        F.lit(plan.run_id).alias("run_id"),
    )


def write_errors_in_background(run: RunContext, targets: Targets, plan: Plan, accounting: Accounting) -> Future:
    """Start writing the errors table (refused and unscored rows); the future's result is its :class:`DeltaCommit`."""
    cfg = run.cfg
    errors = unscored_rows(accounting.staged, cfg.id_col, plan.run_id)
    if plan.split.ids.refused_rows:
        errors = refused_rows(plan.split.refused, cfg.id_col, _raw_input(run), plan.run_id).unionByName(errors)
    replace_where, partition_by = _write_mode(run, plan)
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakescore-errors")
    written = writer.submit(write_delta_overwrite, errors, targets.errors_ref, replace_where, partition_by)
    writer.shutdown(wait=False)
    return written


def publish(
    run: RunContext, targets: Targets, plan: Plan, accounting: Accounting, rows: DataFrame,
    validation: Optional[dict[str, Any]], errors_written: Future,
) -> Outcome:
    """Publish ``rows`` to the output unless the error rate or validation failed; drop staging on success.

    Waits for the errors table first. Raises ``RuntimeError`` when Delta's own metric says the
    commit wrote another number of rows than were validated, and
    :class:`~lakescore.jobs.platform.tables.WriteConflictError` when a concurrent run won.
    """
    cfg = run.cfg
    errors_version = errors_written.result().version
    if accounting.error_rate > cfg.max_error_rate:
        error = (
            f"{accounting.error_rows} of {accounting.input_rows} rows ({accounting.error_rate:.4%}) could not be "
            f"scored, above max_error_rate {cfg.max_error_rate:.4%}; see {targets.errors_ref}. The output was not published."
        )
        return Outcome("error_rate_exceeded", errors_delta_version=errors_version, error=error)
    if validation is not None and not validation["success"]:
        error = "the output failed validation and was not published"
        return Outcome("validation_failed", errors_delta_version=errors_version, error=error)
    commit: DeltaCommit = write_delta_overwrite(rows, cfg.output, *_write_mode(run, plan))
    if commit.rows is not None and commit.rows != accounting.output_rows:
        raise RuntimeError(f"published {commit.rows} rows to {cfg.output} but validated {accounting.output_rows}")
    plan.staging.drop()
    return Outcome("succeeded", delta_version=commit.version, errors_delta_version=errors_version)


def _write_mode(run: RunContext, plan: Plan) -> tuple[Optional[str], Optional[str]]:
    """``(replaceWhere predicate, partition column)`` of the output and errors writes."""
    if run.cfg.write.mode == "replace_run":
        return f"run_id = '{plan.run_id}'", "run_id"
    return None, None


def _raw_input(run: RunContext):
    """The errors table's ``input`` for rows refused before scoring: the text, or the features as JSON."""
    if run.cfg.reads_text:
        return column(run.input_cols[0])
    return F.to_json(F.struct(*[column(c) for c in run.input_cols]))
