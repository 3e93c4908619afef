"""The scoring job, as the data path: read -> check -> prepare -> score (and rank) -> account -> validate -> publish ->
report.

Each step is a function in a module of :mod:`lakescore.jobs.steps` named for it; this module
only names them in order. Before anything is written: the model resolves; the input exists
and has the columns and types the task needs; the output and errors targets can take this
run's schema; the executors' Python workers load the model, hash its weights (which must
match ``--expect-sha256``) and score one sample, while the driver checks the rows for null and
duplicated ids. Then the rows are scored chunk by chunk into a private staging table (a rerun
resumes; with ``rank``, each chunk's keys ranked and only their kept rows staged), the staging table is pinned at its
version then, and that one snapshot is accounted for (every input row in exactly one of output and errors), validated
with Great Expectations, compared with the output's rows at a baseline version (the drift gate), and only then published
in one Delta commit. A run that fails a check publishes nothing to the output: readers keep the previous version.
Whoever runs the job writes its report and metrics row through :func:`run_and_record`.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from lakescore.jobs.config import JobConfig
from lakescore.jobs.platform.spark.console import run_log
from lakescore.jobs.platform.spark.local.own_host import import_late_modules_meanwhile
from lakescore.jobs.report.files import write_report
from lakescore.jobs.report.model import RunReport
from lakescore.jobs.report.text import kept_trace
from lakescore.jobs.steps.account import account_rows
from lakescore.jobs.steps.clock import StepClock
from lakescore.jobs.steps.drift import start_drift
from lakescore.jobs.steps.metrics import record_run, record_stopped_run
from lakescore.jobs.steps.prepare import check_input_ids, compare_early, plan_run
from lakescore.jobs.steps.publish import load_targets, output_rows, publish
from lakescore.jobs.steps.read import check_targets, open_input
from lakescore.jobs.steps.report import assemble_report, failure_report, stopped_status
from lakescore.jobs.steps.report_data import finish_profile, start_run_profile
from lakescore.jobs.steps.score import pin_staging, score_into_staging
from lakescore.jobs.steps.served_model import ServedModel
from lakescore.jobs.steps.validate import validate_rows
from lakescore.jobs.testing_hooks import at_point

__all__ = ["run_scoring", "run_and_record"]


def run_scoring(cfg: JobConfig, spark: SparkSession | None = None, clock: StepClock | None = None) -> RunReport:
    """Run one scoring job described by ``cfg`` and return its :class:`~lakescore.jobs.report.model.RunReport`.

    Raises :class:`~lakescore.jobs.config.ConfigError`, :class:`~lakescore.schemas.contracts.InputContractError`,
    :class:`~lakescore.jobs.platform.tables.TableError` or :class:`~lakescore.udfs.models.model_source.ModelSourceError`
    before any compute when the run cannot succeed, :class:`~lakescore.jobs.platform.tables.WriteConflictError`
    when a concurrent run won the publish. A failed validation, an exceeded error rate or drift past a bound does
    not raise: the report's ``status`` is ``validation_failed`` / ``error_rate_exceeded`` / ``drift_exceeded`` and
    the output is untouched. ``clock`` (default: a new one) times the steps and, when the run raises, says where it
    stopped (:meth:`~lakescore.jobs.steps.clock.StepClock.stop_of`).
    """
    clock = clock if clock is not None else StepClock()
    with clock.step("startup"):  # a refused setting's failure report still says when the run started
        cfg.require_for_scoring()
        run = open_input(cfg, spark)
    _import_late_modules_meanwhile(cfg)
    with ServedModel(run) as model:  # the model on the executors, to its last scored row: its engines stop on exit
        with model.preflight() as preflight:  # the executors load the model while the driver checks
            with clock.step("read_check"):
                targets = check_targets(run)
            with clock.step("prepare"):
                split = check_input_ids(run)
                with preflight.abandoned_if_it_fails():  # incremental: compare while the executors still load the model
                    early = compare_early(run, targets, split)
                identity = preflight.identity()
        with clock.step("prepare"):
            identity = model.identity(targets, identity)  # an endpoint's listing outage: the output's last listing
            plan = plan_run(run, targets, split, identity, early)
            plan = model.probe(plan)  # a model served elsewhere: its paid sample request, only with rows to score
            clock.note(run_id=plan.run_id, staging=plan.staging.location, chunks=plan.chunks)
        with clock.step("score_stage"):
            throughput = score_into_staging(run, plan, clock)
            model.stop()  # every row is sent
            snapshot = pin_staging(run, plan)  # accounting, GX and the publish read this one version
            at_point("staging_pinned")
    with clock.step("validate"):
        targets_loading = load_targets(run, targets)  # for the publish's commits, while the run validates
        accounting = account_rows(plan, snapshot)
        rows = output_rows(run, plan, accounting)
        profiling = start_run_profile(run, plan, accounting, throughput)  # HTML report samples, while GX runs
        drifting = start_drift(run, targets, accounting, rows)  # the drift gate's figures, while GX runs
        at_point("validation_running")
        validation = validate_rows(run, targets, plan, accounting, rows)
        drift = drifting.result()
    with clock.step("report_data"):
        profile = finish_profile(profiling)
    with clock.step("publish"):
        targets_loading.result()
        outcome = publish(run, targets, plan, accounting, rows, validation, drift)
    return assemble_report(run, targets, plan, accounting, validation, outcome, clock, profile, drift)


def run_and_record(cfg: JobConfig, spark: SparkSession | None = None, clock: StepClock | None = None) -> RunReport:
    """:func:`run_scoring`, then the run recorded as every entry point (CLI, API, demo) records it: its report (JSON and
    HTML at ``cfg.report`` when set) and its row in the metrics table. A run that raises is recorded too (``failed``,
    ``interrupted`` or ``pending``, where and why: ``clock``, default a new one, says where it stopped), then the
    exception goes on."""
    clock = clock if clock is not None else StepClock()
    try:
        report = run_scoring(cfg, spark, clock)
    except BaseException as exc:  # a scheduler still finds a report saying where and why
        if cfg.report:
            failed = failure_report(cfg, exc, stopped_status(exc), clock)
            failed.log_file = kept_trace(exc) or _text(run_log())
            write_report(failed, cfg.report)
        record_stopped_run(spark, cfg, exc, clock)
        raise
    report.log_file = _text(run_log())
    record_run(spark, cfg, report)
    return report


def _text(path) -> str | None:
    return str(path) if path is not None else None


def _import_late_modules_meanwhile(cfg: JobConfig) -> None:
    """Import what the run's last steps need while the executors work (on this host's own masters): GX when
    validation is on, then the HTML report's charts when a report is written."""
    modules = (["great_expectations"] if cfg.validation.enabled else []) + (
        ["lakescore.jobs.report.html"] if cfg.report else []
    )
    import_late_modules_meanwhile(modules)
