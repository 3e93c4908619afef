"""Step 3b, prepare: the id check, then the run's plan (run id, chunks, staging, the pinned model spec).

The id check counts the input and its null / duplicated ids in one aggregation while the
executors load the model (:mod:`lakescore.jobs.steps.preflight`). The plan assigns rows to
resumable chunks and finds the staging table of this run's key, with the chunks a crashed
earlier attempt already committed.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from datetime import datetime, timezone
from pathlib import Path

from lakescore.jobs.platform.spark.adapter import default_parallelism
from lakescore.jobs.platform.tables import run_metadata
from lakescore.jobs.steps.context import Changes, IdSplit, ModelIdentity, Plan, RunContext, ScoringSpec, Targets
from lakescore.jobs.steps.dead_letter import check_ids, split_by_id
from lakescore.jobs.steps.dedup import Dedup, decide_dedup
from lakescore.jobs.steps.incremental import CHANGES_LAYOUT, find_changes, input_digest
from lakescore.jobs.steps.staging import (
    Staging,
    changed_rows,
    nearby_chunk_counts,
    planned_chunks,
    prepared_rows,
    run_key,
)
from lakescore.schemas.contracts import InputContractError
from lakescore.schemas.output import DIGEST_COLUMN
from lakescore.udfs.models.model_source import ModelSourceError, model_file_digests, weights_sha256

__all__ = ["new_run_id", "check_input_ids", "compare_early", "plan_run"]

log = logging.getLogger(__name__)

RESCAN_CHUNKS = 8
"""Up to this many chunks, a run whose rows to score are a plain scan of its pinned input reads the input once per chunk
instead of writing a prepared copy: a scan costs a small fraction of writing the rows (BENCHMARKS.md, issue 46)."""

STAGED_LAYOUT = 3
"""What staged rows hold, part of every run's staging key, so that no run resumes chunks a release staged otherwise: 3,
worker metrics with ``batch_rows`` and a ranked run's tally rows (2: a ranked run's kept rows, chunks cut by key; 1:
every scored row)."""


def _run_facts(run: RunContext, targets: Targets, model_sha256: str, scoring: ScoringSpec) -> dict:
    """What the run's staging keys cover: the pinned input, the output, the task, the weights and scoring spec (its
    settings and the model's other files), the ids and inputs, a configured run id; in incremental mode the output
    version compared with (the rows to score depend on it)."""
    cfg = run.cfg
    facts = {
        "input": run.input_files_digest,
        "input_version": run.input_version,
        "output": cfg.output,
        "task": cfg.task,
        "model_sha256": model_sha256,
        "spec": dataclasses.replace(run.spec, device="", expect_sha256=None).identity(),
        "scoring_spec": scoring.digest,
        "id_col": cfg.id_col,
        "inputs": run.input_cols,
        "run_id": cfg.resolved_run_id(),
    }
    if cfg.rank.enabled:  # the staged rows carry its key columns; an incremental comparison is by its keys
        facts["rank"] = cfg.rank.model_dump(mode="json")
    if cfg.write.mode == "incremental":
        facts.update(
            mode="incremental",
            previous_version=targets.previous_version,
            full_rescore=cfg.write.full_rescore,
            retry_failed=cfg.write.retry_failed,
        )
    if targets.file_status:  # the staged rows carry each file's status
        facts["file_status"] = True
    return facts


def _compare_with_output(
    run: RunContext, targets: Targets, split: IdSplit, model_sha256: str, scoring: ScoringSpec
) -> Changes:
    """:func:`~lakescore.jobs.steps.incremental.find_changes` for this run, counting output rows scored by
    ``model_sha256`` with ``scoring`` as current; its changes table is keyed by the run's facts."""
    cfg = run.cfg
    key = run_key({**_run_facts(run, targets, model_sha256, scoring), "changes": CHANGES_LAYOUT})
    changed = changed_rows(run.spark, cfg.output_ref(), cfg.write.staging, key)
    refused = split.refused if split.ids.refused_rows else None
    scorable_rows = split.ids.rows - split.ids.refused_rows
    errors = targets.errors_ref if targets.errors_carried else None
    return find_changes(
        run, split.scorable, scorable_rows, refused, model_sha256, scoring, targets.previous_version, changed, errors
    )


def new_run_id() -> str:
    """A sortable, unique run id: UTC timestamp plus 8 random hex digits."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def check_input_ids(run: RunContext) -> IdSplit:
    """Count the input and split off rows with a null or duplicated id.

    Raises :class:`~lakescore.schemas.contracts.InputContractError` when the input has no rows.
    """
    ids = check_ids(run.source, run.cfg.id_cols)
    if ids.rows == 0:
        raise InputContractError(f"input {run.cfg.input!r} has no rows; nothing to score (nothing was written)")
    scorable, refused = split_by_id(run.source, run.cfg.id_cols, ids)
    return IdSplit(ids, scorable, refused)


def compare_early(run: RunContext, targets: Targets, split: IdSplit) -> Changes | None:
    """In incremental mode, the rows to score against the output, found while the executors still load the model:
    with the digests of the weights and other files in the driver's copy of the model (``run.model_dir``).

    ``None`` in the other modes, or when the driver's copy holds no weight file (the preflight names the error).
    What the executors hashed decides: :func:`plan_run` compares again if their digests differ.
    """
    if run.cfg.write.mode != "incremental" or run.model_dir is None:  # None: served elsewhere, the executors name it
        return None
    try:
        sha256 = weights_sha256(run.model_dir)
    except ModelSourceError:
        return None
    return _compare_with_output(
        run, targets, split, sha256, ScoringSpec.of(run.spec, model_file_digests(run.model_dir))
    )


def _staging(run: RunContext, rows: int, identity: ModelIdentity, facts: dict, dedup: Dedup) -> Staging:
    """The staging table of this run's key, which names its chunk count: ``write.chunk_rows``' count, else the
    :func:`~lakescore.jobs.steps.staging.timed_chunks` count at the speed the preflight measured, or a nearby count
    an earlier attempt of the same run already staged under (it measured another speed)."""
    cfg = run.cfg
    # what the staged rows hold: the digest when deduplicating, and the release's layout (STAGED_LAYOUT)
    layout = {**facts, "dedup": dedup.used, "staged_layout": STAGED_LAYOUT}

    def staging_of(chunks: int) -> Staging:
        return Staging.for_output(
            run.spark, cfg.output_ref(), cfg.write.staging, run_key({**layout, "chunks": chunks}), chunks
        )

    write = cfg.write
    slots = default_parallelism(run.spark) if write.chunk_rows is None else 1
    planned = staging_of(planned_chunks(rows, write.chunk_rows, write.chunk_seconds, identity.row_seconds, slots))
    if write.chunk_rows is not None or planned.exists():
        return planned
    return next((s for s in map(staging_of, nearby_chunk_counts(planned.chunks)) if s.exists()), planned)


def plan_run(
    run: RunContext, targets: Targets, split: IdSplit, identity: ModelIdentity, early: Changes | None = None
) -> Plan:
    """The run's plan: run id, pinned spec, the rows to score (in incremental mode: against the output at
    ``targets.previous_version``, ``early``'s when it compared with the weights the executors hashed), chunk count
    and the staging table of this run's key."""
    cfg = run.cfg
    # Workers must load exactly the weights the preflight hashed, or fail their task.
    spec = dataclasses.replace(run.spec, expect_sha256=identity.sha256)
    scorable_rows = split.ids.rows - split.ids.refused_rows
    scoring = ScoringSpec.of(run.spec, identity.model_files)  # the files as the executors loaded them
    facts = _run_facts(run, targets, identity.sha256, scoring)
    changes = None
    if cfg.write.mode == "incremental":
        changes = early
        if changes is None or (changes.model_sha256, changes.spec.digest) != (identity.sha256, scoring.digest):
            if changes is not None:
                log.warning(
                    "the driver's copy of the model differs from the executors' (weights %s, %s): comparing "
                    "with the output again",
                    changes.model_sha256,
                    identity.sha256,
                )
                if changes.table is not None:
                    changes.table.drop()  # compared for a model no worker loads: no run reads it
            changes = _compare_with_output(run, targets, split, identity.sha256, scoring)
        scorable_rows = changes.rows_to_score
    digested = (
        changes.to_score
        if changes
        else split.scorable.withColumn(
            DIGEST_COLUMN, input_digest(run.input_cols, cfg.column_setting is not None, cfg.text_pair_col is not None)
        )
    )
    # sampled rows draw on their own: never shared; a provider batch sends each row's own line (its custom_id)
    mode = cfg.scoring.dedup if cfg.deterministic and not cfg.provider_batch else "off"
    dedup = decide_dedup(
        mode, digested, cfg.id_cols, scorable_rows, changes.distinct_to_score if changes else None, identity.row_seconds
    )
    staging = _staging(run, scorable_rows, identity, facts, dedup)
    chunks, key = staging.chunks, staging.key
    # Rescanning suits rows that are only read: refused ids (an anti join), digests or an incremental comparison
    # make them a computation that the prepared copy does once.
    rescanned = (
        chunks > 1
        and chunks <= RESCAN_CHUNKS
        and run.rescannable
        and not split.ids.refused_rows
        and changes is None
        and not dedup.used
    )
    prepared = (
        prepared_rows(run.spark, cfg.output_ref(), cfg.write.staging, key, chunks)
        if chunks > 1 and not rescanned
        else None
    )
    done = frozenset(staging.committed_chunks())
    # A rerun that resumes staged chunks goes on as the run that staged them: its publish may already be
    # committed (with that run id in every row), and the errors table and report must name the same run.
    run_id = cfg.resolved_run_id() or (staging.staged_run_id() if done else None) or new_run_id()
    plan = Plan(
        run_id=run_id,
        identity=identity,
        spec=spec,
        split=split,
        chunks=chunks,
        staging=staging,
        done=done,
        changes=changes,
        dedup=dedup,
        digested=digested if dedup.used and changes is None else None,
        prepared=prepared,
        rescanned=rescanned,
        prepared_ready=prepared is not None and prepared.exists(),
        ranked=cfg.rank.enabled,
        file_status=targets.file_status,
        tag=run_metadata(
            run_id,
            str(Path(cfg.report).expanduser().resolve()) if cfg.report else None,
            scoring.parts if changes is not None else None,
        ),
    )
    if plan.scorable_rows:
        log.info(
            "scoring %d of %d rows of %s into %s (run %s, %d chunk(s), %d already staged)",
            plan.scorable_rows,
            split.ids.rows,
            cfg.input,
            cfg.output,
            plan.run_id,
            chunks,
            len(plan.done),
        )
    else:
        log.info(
            "nothing to score: none of the %d rows of %s needs scoring into %s (run %s)",
            split.ids.rows,
            cfg.input,
            cfg.output,
            plan.run_id,
        )
    if changes is not None:
        log.info(
            "incremental: %d row(s) to score, %d kept, %d dead letter(s) carried, %d output id(s) missing from the "
            "input (output version %s)",
            changes.rows_to_score,
            changes.rows_kept,
            changes.rows_carried,
            changes.rows_missing,
            changes.previous_version,
        )
        if changes.spec_changes:
            log.info(
                "incremental: the scoring spec differs from the output's (%s): its rows are scored again",
                "; ".join(changes.spec_changes),
            )
    if dedup.mode == "auto" and dedup.sample_rows is None and identity.row_seconds is not None:
        log.info(
            "dedup auto: off (the model scores a row in %.1f us, faster than deduplicating it)",
            identity.row_seconds * 1e6,
        )
    elif dedup.used or dedup.mode == "auto":
        log.info(
            "dedup %s: %s (%s rows, %s distinct inputs)",
            dedup.mode,
            "on" if dedup.used else "off",
            dedup.sample_rows,
            dedup.sample_distinct,
        )
    if split.ids.refused_rows:
        log.warning("%d row(s) with a null or duplicated id go to %s", split.ids.refused_rows, cfg.errors_ref())
    return plan
