"""Step 8, report: the :class:`~lakescore.jobs.report.model.RunReport` of a finished run (:func:`assemble_report`), or
of one that raised (:func:`failure_report`, from where the step clock says it stopped)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from lakescore.jobs.config import JobConfig
from lakescore.jobs.cost import run_cost, session_resources
from lakescore.jobs.platform.spark.adapter import session_facts
from lakescore.jobs.platform.spark.interrupts import was_interrupted
from lakescore.jobs.report.model import RunReport, software_versions
from lakescore.jobs.report.text import drift_text, one_line
from lakescore.jobs.steps.account import Accounting
from lakescore.jobs.steps.batch_ledger import BatchLedger
from lakescore.jobs.steps.clock import RunStop, StepClock
from lakescore.jobs.steps.context import Plan, RunContext, Targets
from lakescore.jobs.steps.provider_batch import BatchesPending, batch_summary
from lakescore.jobs.steps.publish import Outcome
from lakescore.schemas.traffic import Traffic
from lakescore.udfs.options.remote import MODELS_LISTING, AudioPrice, InputPrice

__all__ = ["assemble_report", "failure_report", "stopped_status", "refusal_reason", "gate_text"]


def assemble_report(
    run: RunContext,
    targets: Targets,
    plan: Plan,
    accounting: Accounting,
    validation: dict[str, Any] | None,
    outcome: Outcome,
    clock: StepClock,
    profile: dict[str, Any] | None = None,
    drift: dict[str, Any] | None = None,
) -> RunReport:
    """The report of a run that reached its publish decision (whatever the decision was); ``profile``:
    the samples the HTML report draws (:mod:`lakescore.jobs.steps.report_data`); ``drift``: the drift gate's figures
    (:mod:`lakescore.jobs.steps.drift`)."""
    cfg, identity = run.cfg, plan.identity
    seconds = round(clock.elapsed(), 3)
    return RunReport(
        run_id=plan.run_id,
        status=outcome.status,
        task=cfg.task,
        input=cfg.input_ref(),
        output=cfg.output_ref(),
        model_id=identity.model_id,
        model_revision=identity.revision,
        model_sha256=identity.sha256,
        model_listing=json.loads(identity.model_files[MODELS_LISTING])
        if MODELS_LISTING in identity.model_files
        else None,
        input_version=run.input_version,
        input_rows=accounting.input_rows,
        ignored_files=run.ignored_files,
        output_rows=accounting.output_rows,
        output_chunks=accounting.output_chunks,
        error_rows=accounting.error_rows,
        rows_kept=accounting.rows_kept,
        rows_scored=accounting.output_rows + (accounting.ranked_out or 0),
        ranked_out=accounting.ranked_out,
        rows_missing=accounting.rows_missing if plan.changes is not None else None,
        rows_deleted=outcome.rows_deleted,
        chunk_rows_deleted=outcome.chunk_rows_deleted,
        rows_carried=accounting.rows_carried if plan.changes is not None else None,
        spec_changes=plan.changes.spec_changes if plan.changes is not None else None,
        dedup=plan.dedup.as_report(accounting.forward_passes_saved),
        input_scans=plan.input_scans,
        precision_check=identity.precision_check,
        cpu_path=path.as_report() if (path := cfg.model_on_cpu()[1]) is not None else None,
        staging_removed=list(outcome.staging_removed) or None,
        errors_table=targets.errors_ref,
        error_reasons=accounting.reasons,
        errors_delta_version=outcome.errors_delta_version,
        chunks={"total": plan.chunks, "skipped": len(plan.done), "staging": plan.staging.location},
        seconds=seconds,
        rows_per_second=round(accounting.input_rows / seconds, 2) if seconds and accounting.output_rows else None,
        delta_version=outcome.delta_version,
        previous_delta_version=targets.previous_version,
        validation=validation,
        drift=drift,
        provider_batch=_provider_batch(run, plan, accounting.workers),
        step_seconds={k: round(v, 3) for k, v in clock.seconds.items()},
        workers=_with_token_rate(accounting.workers, clock.seconds.get("score_stage")),
        cost=run_cost(
            seconds=seconds,
            stage_seconds=clock.seconds.get("score_stage") or 0.0,
            worker_seconds=accounting.workers.get("model_seconds") or 0.0,
            rows_scored=accounting.output_rows,
            resources=session_resources(run.spark, cfg, run.layout.profile is not None),
            gpus=identity.gpus,
            price_per_core_hour=cfg.resources.price_per_core_hour,
            price_per_gpu_hour=cfg.resources.price_per_gpu_hour,
            token_cost=_token_cost(cfg, accounting.workers),
            token_cost_unmetered=accounting.workers.get("unmetered") or 0,
        ),
        spark=session_facts(run.spark),
        started_at=clock.started_at,
        finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        error=refusal_reason(outcome.status, cfg, targets, accounting, drift),
        versions=software_versions(run.spark.version),
        profile=profile,
    )


def refusal_reason(
    status: str, cfg: JobConfig, targets: Targets | None, accounting: Accounting, drift: dict[str, Any] | None = None
) -> str | None:
    """Why a run with ``status`` (:func:`~lakescore.jobs.steps.publish.refusal`'s) was not published, in one line;
    ``None`` for a run that published."""
    if status == "error_rate_exceeded":
        assert targets is not None  # the error-rate gate runs on a run whose targets were resolved
        return (
            f"{gate_text(accounting)}, above max_error_rate {cfg.max_error_rate:.4%}; their reasons are in the run's "
            f"report and its staging {accounting.snapshot.staging.location}, not in {targets.errors_ref}. The output "
            "was not published."
        )
    if status == "validation_failed":
        return "the output failed validation and was not published"
    if status == "drift_exceeded":
        assert drift is not None  # only the drift gate's figures set this status
        return f"drift past its bounds {drift_text(drift)}. The output was not published."
    return None


def gate_text(accounting: Accounting) -> str:
    """What the error-rate gate measured, its numerator and denominator
    (:attr:`~lakescore.jobs.steps.account.Accounting.error_rate`), e.g. ``3 new failures of 1,203 rows in the output's
    scope (0.2494%; 1,195 kept unchanged, 5 dead letters carried from earlier runs, not new)``, or ``1 of 30 rows
    (3.3333%)`` when every row was scored this run."""
    new = accounting.new_error_rows
    aside = [f"{accounting.rows_kept:,} kept unchanged"] if accounting.rows_kept else []
    if accounting.rows_carried:
        aside.append(f"{accounting.rows_carried:,} dead letters carried from earlier runs, not new")
    if not aside:  # every row was scored this run (an overwrite, a first incremental run): no scope to explain
        return f"{new:,} of {accounting.input_rows:,} rows ({accounting.error_rate:.4%})"
    return (
        f"{new:,} new failure{'' if new == 1 else 's'} of {accounting.input_rows:,} rows in the output's scope "
        f"({accounting.error_rate:.4%}{'; ' + ', '.join(aside) if aside else ''})"
    )


def _token_cost(cfg: JobConfig, workers: dict[str, Any]) -> float | None:
    """What an endpoint with a price (``generate.endpoint.price``, ``embed.endpoint.price``,
    ``transcribe.endpoint.price``) charged for the run's requests (its responses' ``usage``, or the audio they
    carried); ``None`` without a price."""
    endpoint = cfg.endpoint()  # every task's endpoint declares its price
    price = endpoint.price if endpoint is not None else None
    if price is None:
        return None
    cost = _tokens_priced(price, workers)
    if not cfg.provider_batch or not isinstance(price, InputPrice):
        return cost
    # a provider batch's lines at its batch price; the preflight's one request per executor went per row
    per_row = _tokens_priced(price, workers.get("preflight") or {})
    return per_row + (cost - per_row) * price.batch


def _tokens_priced(price: InputPrice | AudioPrice, counts: dict[str, Any]) -> float:
    """What ``price`` charges for what ``counts`` counts (the report's ``workers``, or their ``preflight``)."""
    return price.charge(Traffic.of(counts))


def _provider_batch(run: RunContext, plan: Plan, workers: dict[str, Any]) -> dict[str, Any] | None:
    """A provider batch run's batches, lines and resubmissions from its ledger, and what the batch price saved."""
    cfg = run.cfg
    if not cfg.provider_batch:
        return None
    summary = batch_summary(BatchLedger(run.spark, cfg.output_ref(), cfg.write.staging, plan.staging.key))
    price = cfg.batch_endpoint()[0].price
    if price is not None:
        per_row = _tokens_priced(price, workers)
        summary.update(
            token_cost_per_row=round(per_row, 6), saving=round(per_row - (_token_cost(cfg, workers) or 0), 6)
        )
    return summary


def _with_token_rate(workers: dict[str, Any], stage_seconds: float | None) -> dict[str, Any]:
    """``workers`` plus, for a run that generated tokens, ``tokens_per_second``: generated tokens over the scoring
    stage's wall seconds (what a run's cost per token follows)."""
    if not workers.get("tokens_out") or not stage_seconds:
        return workers
    return {**workers, "tokens_per_second": round(workers["tokens_out"] / stage_seconds, 1)}


def stopped_status(exc: BaseException) -> str:
    """The status of a run that raised ``exc``: ``pending`` (``batch.wait: false`` left batches running at the
    provider: the same command collects them), ``interrupted``, else ``failed``."""
    if isinstance(exc, BatchesPending):
        return "pending"
    return "interrupted" if was_interrupted(exc) else "failed"


def failure_report(
    cfg: JobConfig, exc: BaseException, status: str = "failed", clock: StepClock | None = None
) -> RunReport:
    """The report of a run that raised ``exc``: what it was asked to do and the one-line reason; when ``exc`` stopped
    it in a step of ``clock`` (:meth:`~lakescore.jobs.steps.clock.StepClock.stop_of`), also when it started, how long
    it ran and its steps' times so far, the step it stopped in and what is staged; no row counts (none were
    determined)."""
    stop = clock.stop_of(exc) if clock is not None else None
    facts = stop.facts if stop is not None else {}
    clock = clock if stop is not None else None
    return RunReport(
        run_id=facts.get("run_id") or cfg.resolved_run_id() or "",
        status=status,
        task=cfg.task,
        input=cfg.input,
        output=cfg.output,
        model_id=cfg.model.source or (endpoint.model if (endpoint := cfg.endpoint()) is not None else None),
        model_revision=cfg.model.revision,
        model_sha256=None,
        failed_step=stop.step if stop is not None else None,
        chunks=_chunks(stop) if stop is not None else None,
        seconds=round(clock.elapsed(), 3) if clock else None,
        step_seconds={k: round(v, 3) for k, v in clock.seconds.items()} if clock else {},
        started_at=clock.started_at if clock else None,
        finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        error=one_line(exc, stop.step if stop is not None else None),
    )


def _chunks(stop: RunStop) -> dict[str, Any] | None:
    """What is staged for a rerun to resume from: the staging table, and chunks staged of the total when known."""
    if "staging" not in stop.facts:
        return None
    chunks = {"total": stop.facts.get("chunks"), "staging": stop.facts["staging"]}
    if stop.chunks_staged is not None:
        chunks["staged"] = stop.chunks_staged[0]
    return chunks
