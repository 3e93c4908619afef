"""Step 4 through a provider's Batch API (``generate.endpoint.batch``, ``embed.endpoint.batch``): the rows' requests go
out as files (each task's lines: :class:`~lakescore.udfs.remote.batch_lines.BatchLines`, named in the task registry),
every line comes back exactly once, and a killed driver resumes without paying twice.

The driver holds batch ids and states only; the executors render, upload, create and download
(:mod:`lakescore.udfs.batch_udfs`). Every call to the provider goes through its kind
(:class:`~lakescore.udfs.remote.batch_kinds.BatchKind`, chosen once from the endpoint's ``api``: OpenAI's Batches or
Anthropic's Message Batches), so the loop is one for both. One loop, each pass reading the ledger first
(:mod:`~lakescore.jobs.steps.batch_ledger`):

1. **submit** what no batch holds yet: every row's line not in the ledger (round 0), and each line whose last round
   ended without an answer and has resubmissions left (the next round). Before a round is submitted the provider's
   batch list is read for batches of this run (``metadata``): a file whose batch the provider holds but the ledger
   does not (a kill between create and record) is not sent again. A provider whose batches keep no metadata
   (Anthropic's) is found again by intents: the round's files are planned first and each recorded in the ledger
   before its batch is created, and the provider's batches created since an earlier attempt's intents are matched
   to them (:mod:`~lakescore.udfs.remote.batch_intents`). The submit stage's lines are appended to the ledger as it
   commits;
2. **poll** every batch not known ended (``poll_interval_s``), each terminal state recorded the moment it is seen;
   one line of progress per poll. A ``failed`` batch (the provider's validation, no line ran) whose reason names a
   size or count limit is split: its lines go again in files of at most half its lines
   (:func:`~lakescore.udfs.remote.batch_files.split_helps`); any other stops the run in one line quoting the
   provider; ``wait: false`` stops it with :class:`BatchesPending` once everything is submitted and one poll shows a
   batch still running; an interrupt leaves the submitted batches running, and says so;
3. **collect** every ended batch not collected: its lines' outcomes appended to the ledger.

The lines are rendered once, where the rows live, and kept there for the run
(:func:`~lakescore.jobs.platform.spark.adapter.reused`): the round's count, each submit stage and the staging read
them, never render them again. Where prefixes are grouped (``scoring.group_prefixes``), a round's files are ranges
of the prompts in order (:func:`_by_prefix`), so rows sharing a prefix sit together in one file. When no line is
left to send and every batch is collected, each chunk's rows are joined to their lines' last outcomes by ``custom_id``
and staged (:meth:`~lakescore.jobs.steps.staging.Staging.commit_chunk`) as the per-row path stages them: accounting,
validation, publish and report run unchanged.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from lakescore.jobs.platform.spark.adapter import default_parallelism, reused
from lakescore.jobs.platform.spark.interrupts import was_interrupted
from lakescore.jobs.platform.tables import column
from lakescore.jobs.steps.batch_ledger import BatchLedger, BatchState
from lakescore.jobs.steps.ids import row_key
from lakescore.jobs.testing_hooks import at_point
from lakescore.schemas.column_names import resolvable_name
from lakescore.schemas.output import scored_schema
from lakescore.udfs.batch_udfs import (
    CUSTOM_ID,
    LINE,
    OUTCOME_FIELDS,
    OUTCOME_SCHEMA,
    PLANNED_SCHEMA,
    SUBMITTED_SCHEMA,
    find_again,
    held_parts,
    make_download_function,
    make_plan_function,
    make_render_function,
    make_result_function,
    make_submit_function,
    outcome_column,
)
from lakescore.udfs.registry import get_task
from lakescore.udfs.remote.batch_files import (
    ENDED_STATES,
    PREFIX_KEY_CHARS,
    RETRY,
    SAMPLES_PER_GROUP,
    group_bounds,
    group_count,
    split_helps,
    task_count,
)
from lakescore.udfs.remote.batch_intents import Intent, intents_by_part
from lakescore.udfs.remote.batch_kinds import BatchKind, Polled, batch_kind

if TYPE_CHECKING:
    from lakescore.jobs.steps.context import Plan, RunContext
    from lakescore.udfs.remote.batch_client import BatchClient
    from lakescore.udfs.remote.batch_lines import BatchLines

__all__ = ["BatchesPending", "BatchRefused", "EXIT_PENDING", "stage_through_batches", "driver_client", "batch_summary"]

log = logging.getLogger(__name__)

EXIT_PENDING = 75
"""The exit code of a ``batch.wait: false`` run whose batches still run (``EX_TEMPFAIL``: try again later)."""

_CHUNK = "__lakescore_batch_chunk"
_KEY = "__lakescore_row_key"


class BatchesPending(RuntimeError):
    """``batch.wait: false``: every line is submitted and batches still run at the provider; the same command run
    later collects them. Not a failure: the CLI exits :data:`EXIT_PENDING`."""


class BatchRefused(RuntimeError):
    """The provider ended a batch ``failed`` (its validation of the file): one line quoting the provider."""


def endpoint_kind(endpoint: Any) -> BatchKind:
    """The provider kind of a ``generate.endpoint`` with ``batch`` (OpenAI's Batches, or Anthropic's Message Batches
    for ``api: messages``)."""
    return batch_kind(endpoint.url, endpoint.api, endpoint.batch.completion_window)


def driver_client(endpoint: Any) -> BatchClient:
    """The driver's client (it polls, lists and cancels): the key from the driver's own environment."""
    from lakescore.udfs.remote.answers import EndpointRefused

    key = None
    if endpoint.api_key_env:
        key = os.environ.get(endpoint.api_key_env)
        if not key:
            raise EndpointRefused(
                f"a provider batch (the endpoint's batch) polls from the driver: {endpoint.api_key_env} "
                "(api_key_env) is not set in the driver's environment"
            )
    return endpoint_kind(endpoint).client(
        endpoint.url, key, timeout_s=endpoint.timeout_s, max_retries=endpoint.max_retries
    )


def stage_through_batches(
    run: RunContext, plan: Plan, todo: Sequence[int], chunk_rows: Callable[[int], DataFrame]
) -> None:
    """Stage the chunks ``todo`` of ``plan`` through the provider's Batch API (module docstring); ``chunk_rows(c)``
    gives chunk ``c``'s rows to score. Raises :class:`BatchesPending` (``wait: false``) or :class:`BatchRefused`."""
    if not todo:
        return
    cfg = run.cfg
    endpoint, settings = cfg.batch_endpoint()
    ledger = BatchLedger(run.spark, cfg.output_ref(), cfg.write.staging, plan.staging.key)
    keep = plan.kept_columns(cfg.row_cols)
    key_col = _KEY if len(cfg.id_cols) > 1 else keep[0]  # one value per row to seed its draws from, as per row
    read = list(dict.fromkeys([*keep, *run.input_cols, key_col, _CHUNK]))
    passed = {name: resolvable_name(name) for name in read}

    def rows_of(chunks: Sequence[int]) -> DataFrame:
        rows = functools.reduce(DataFrame.unionByName, [chunk_rows(c).withColumn(_CHUNK, F.lit(c)) for c in chunks])
        if key_col == _KEY:
            rows = rows.withColumn(_KEY, row_key(cfg.id_cols))
        return rows.select(*[column(c).alias(passed[c]) for c in read])

    prompt_col = passed[run.input_cols[0]]
    out = T.StructType(
        [
            *rows_of(todo[:1]).schema.fields,
            T.StructField(CUSTOM_ID, T.StringType()),
            T.StructField(LINE, T.BinaryType()),
        ]
    )
    from pyspark.sql.pandas.types import to_arrow_schema

    kind = endpoint_kind(endpoint)
    lines = get_task(plan.spec.task).lines_for(plan.spec)
    render = make_render_function(
        lines,
        kind,
        prompt_col,
        passed[key_col],
        to_arrow_schema(out),
        settings.max_bytes_per_file,
    )

    order = [prompt_col, CUSTOM_ID] if cfg.groups_prefixes else [CUSTOM_ID]  # a file's lines, in the same order always
    client = driver_client(endpoint)
    # rendered once where the rows live, kept there: the count, every round's submit and the staging read them
    with reused(rows_of(todo).mapInArrow(render, out)) as rendered:
        states = ledger.states()
        try:
            while True:
                sent = _submit(run, ledger, rendered, order, client, kind, settings, endpoint, states)
                states = ledger.states()
                collected = ledger.collected_batches()
                if not sent and all(s.batch_id in collected or s.status == "failed" for s in states):
                    _refuse_failed([s for s in states if not split_helps(s.message, s.lines)])
                    break
                states = _poll(ledger, client, kind, states, settings)
                _collect(run, ledger, kind, states, collected, endpoint)
        finally:
            client.close()
        _stage(run, plan, ledger, lines, rendered, todo, keep, passed, prompt_col, settings)


def _submit(
    run: RunContext,
    ledger: BatchLedger,
    rendered: DataFrame,
    order: Sequence[str],
    client: BatchClient,
    kind: BatchKind,
    settings: Any,
    endpoint: Any,
    states: Sequence[BatchState],
) -> int:
    """Submit every line no live batch holds and every line due a resubmission (``states``: the batches the ledger
    knew when the last pass ended: those a failed batch's split follows), each file's lines in ``order``; the lines
    submitted."""
    lines = ledger.lines()
    failed = ledger.ended().where(F.col("status") == "failed").select("batch_id")
    live = lines.join(failed, "batch_id", "left_anti")  # a failed batch ran none of its lines: they are unsent
    sendable = rendered.where(F.col(LINE).isNotNull()).select(
        F.col(CUSTOM_ID).alias("custom_id"),
        F.col(_CHUNK).cast("int").alias("chunk"),
        F.col(LINE).alias("line"),
        *[F.col(c).alias(f"_order{i}") for i, c in enumerate(order)],
    )
    by = [f"_order{i}" for i in range(len(order))]
    first = sendable.join(live.select("custom_id").distinct(), "custom_id", "left_anti").withColumn("round", F.lit(0))
    due = (
        ledger.outcomes()
        .where((F.col("kind") == RETRY) & (F.col("round") < settings.max_resubmits))
        .select("custom_id", (F.col("round") + 1).alias("round"))
        .join(live.select("custom_id", "round"), ["custom_id", "round"], "left_anti")
    )
    again = sendable.join(due, "custom_id")
    to_send = _with_file_limit(run, ledger, states, first.unionByName(again), settings.max_requests_per_file)
    per_round = (
        to_send.groupBy("round", "per_file")
        .agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("line")).alias("size"))
        .collect()
    )
    sizes = {(int(r["round"]), int(r["per_file"])): (int(r["n"]), int(r["size"])) for r in per_round}
    counts = {part: n for part, (n, _) in sizes.items()}
    for (round_, per_file), (n, size) in sorted(sizes.items()):
        at_point("batch_submit")
        if per_file == settings.max_requests_per_file:
            parts = task_count(n, size, settings.max_requests_per_file, settings.max_bytes_per_file)
        else:  # a split failed batch's lines: two files a partition, so each half is one file
            parts = max(1, math.ceil(n / (2 * per_file)))
        # files cut the same way in every attempt (the same groups, each in the same order), so a rerun finds the same
        # parts; the tasks upload at once as many files as the cluster runs tasks
        chosen = to_send.where((F.col("round") == round_) & (F.col("per_file") == per_file))
        if len(by) > 1 and per_file == settings.max_requests_per_file:
            cut = _by_prefix(chosen, by, n, size, settings)
        else:
            cut = chosen.withColumn("group", F.lit(0)).repartition(parts, "custom_id").sortWithinPartitions(*by)
        intents: dict[str, Intent] = {}
        recorded = frozenset(s.batch_id for s in states)
        if kind.keeps_metadata:
            known = held_parts(client, kind, ledger.run_key, round_)
        else:
            known, intents = _intend(ledger, client, kind, cut, round_, per_file, settings, recorded)
        submit = make_submit_function(
            endpoint.url,
            endpoint.api_key_env,
            kind,
            ledger.run_key,
            round_,
            per_file,
            settings.max_bytes_per_file,
            known,
            on_created=_batch_created,
            intents=intents,
            recorded=recorded,
        )
        submitted = cut.select("group", "custom_id", "chunk", "line").mapInArrow(
            submit, _spark_schema(SUBMITTED_SCHEMA)
        )
        ledger.append_lines(submitted)
        at_point("batches_recorded")
        log.info(
            "provider batch: %d line(s) of round %d submitted%s%s",
            n,
            round_,
            f" in files of at most {per_file} (a failed batch split)"
            if per_file < settings.max_requests_per_file
            else "",
            f" ({len(known)} file(s) found already held by the provider)" if known else "",
        )
    return sum(counts.values())


def _by_prefix(chosen: DataFrame, by: Sequence[str], lines: int, size: int, settings: Any) -> DataFrame:
    """``chosen`` (a round's lines, ``by``: their prompt then ``custom_id``) in prefix groups of about one file each, a
    group's lines together in one task in the order of their prompts: rows sharing a prefix sit together across the
    round, not only within a file. The groups' bounds are quantiles of a sample the lines' ids choose (a hash of each
    ``custom_id``), so the same lines make the same groups and files in every attempt."""
    groups = group_count(lines, size, settings.max_requests_per_file, settings.max_bytes_per_file)
    key, line_id = F.substring(F.col(by[0]), 1, PREFIX_KEY_CHARS), F.col("custom_id")
    every = max(1, lines // (groups * SAMPLES_PER_GROUP))
    sample = chosen.where(F.pmod(F.xxhash64("custom_id"), F.lit(every)) == 0).select(key.alias("k"), line_id)
    bounds = group_bounds(((r["k"], r["custom_id"]) for r in sample.collect()), groups)
    if not bounds:
        return chosen.withColumn("group", F.lit(0)).repartition(1).sortWithinPartitions(*by)
    listed = F.array(*[F.struct(F.lit(k).alias("k"), F.lit(i).alias("i")) for k, i in bounds])
    above = F.filter(listed, lambda b: (key > b["k"]) | ((key == b["k"]) & (line_id > b["i"])))  # group_of, in Spark
    # range partitions of whole groups: which groups share a task may change between attempts, their files do not
    grouped = chosen.withColumn("group", F.size(above)).repartitionByRange(len(bounds) + 1, "group")
    return grouped.sortWithinPartitions("group", *by)


def _intend(
    ledger: BatchLedger,
    client: BatchClient,
    kind: BatchKind,
    cut: DataFrame,
    round_: int,
    per_file: int,
    settings: Any,
    recorded: frozenset[str],
) -> tuple[dict[str, dict[str, Any]], dict[str, Intent]]:
    """For a provider whose batches keep no metadata: the round's files planned (``cut``: its lines as the submit stage
    gets them), the provider's batches an earlier attempt created for them found again by its intents, and an intent
    recorded for each file still to send, before any is created. The files adopted (part -> batch), and the intents."""
    plan = make_plan_function(ledger.run_key, round_, per_file, settings.max_bytes_per_file)
    planned = cut.select("group", "custom_id", F.length("line").cast("long").alias("size")).mapInArrow(
        plan, _spark_schema(PLANNED_SCHEMA)
    )
    files = [(r["part"], int(r["lines"]), tuple(r["first_ids"])) for r in planned.collect()]  # one row per file
    earlier = intents_by_part(ledger.intents(round_))
    found = find_again(client, kind, [earlier[part] for part, _, _ in files if part in earlier], recorded)
    for part, batches in sorted(found.ambiguous.items()):
        log.warning(
            "provider batch: file %s of round %d was submitted before but not recorded, and the provider's batches "
            "created since that match its size (%s) cannot be told apart (its batches keep no metadata and none has "
            "ended): the file is sent again",
            part,
            round_,
            ", ".join(batches),
        )
    if found.adopted:
        log.info("provider batch: %d file(s) found already held by the provider (by intent)", len(found.adopted))
    now = time.time()
    intents = {part: Intent(part, lines, first, now) for part, lines, first in files if part not in found.adopted}
    ledger.record_intents(round_, list(intents.values()))
    known = {part: {"batch_id": batch_id, "input_file_id": None} for part, batch_id in found.adopted.items()}
    return known, intents


def _with_file_limit(
    run: RunContext, ledger: BatchLedger, states: Sequence[BatchState], to_send: DataFrame, max_requests: int
) -> DataFrame:
    """``to_send`` with each line's ``per_file``: the lines a file holding it may hold, ``max_requests`` unless a batch
    that held it failed for a limit (:func:`split_helps`), then half that batch's lines (the least such), so each
    refusal halves the files until a batch passes or one line alone is refused."""
    split = {s.batch_id: _half(s.lines) for s in states if s.status == "failed" and split_helps(s.message, s.lines)}
    if not split:
        return to_send.withColumn("per_file", F.lit(max_requests))
    halves = run.spark.createDataFrame(list(split.items()), "batch_id string, half int")
    limits = ledger.lines().join(F.broadcast(halves), "batch_id").groupBy("custom_id").agg(F.min("half").alias("half"))
    per_file = F.least(F.coalesce(F.col("half"), F.lit(max_requests)), F.lit(max_requests)).alias("per_file")
    return to_send.join(limits, "custom_id", "left").select(*to_send.columns, per_file)


def _batch_created() -> None:
    """On the executor, after each batch it creates: the test hook point ``batch_created`` (the task killed between a
    batch's create and its record)."""
    at_point("batch_created")


def _poll(
    ledger: BatchLedger, client: BatchClient, kind: BatchKind, states: list[BatchState], settings: Any
) -> list[BatchState]:
    """Poll every batch not known ended until each is (``wait: false``: :class:`BatchesPending` after one pass that
    finds one running), recording each terminal state the moment it is seen; the states then."""
    running = {s.batch_id: s for s in states if s.status is None}
    ended = {s.batch_id: s for s in states if s.status is not None}
    try:
        while running:
            at_point("batch_polling")
            seen: Counter = Counter()
            done = total = 0
            found: list[tuple[Polled, int]] = []
            for batch_id, state in list(running.items()):
                batch = kind.poll(client, batch_id)
                done += batch.done
                total += batch.total or state.lines
                seen[batch.status] += 1
                if batch.terminal:
                    found.append((batch, state.round))
                    ended[batch_id] = BatchState(
                        batch_id,
                        state.round,
                        state.lines,
                        batch.status,
                        batch.output,
                        batch.error,
                        batch.completed,
                        batch.failed,
                        batch.message,
                    )
                    del running[batch_id]
            ledger.record_ended(found)  # the moment this pass saw them, before anything else can fail
            _refuse_failed([ended[batch.batch_id] for batch, _ in found])
            for state in ended.values():
                seen[state.status] += 0
            states_seen = ", ".join(f"{n} {status}" for status, n in sorted(seen.items()) if n)
            log.info("provider batches: %s; %d of %d running line(s) done", states_seen or "none running", done, total)
            if running:
                if not settings.wait:
                    lines = sum(s.lines for s in running.values())
                    raise BatchesPending(
                        f"{len(running)} provider batch(es) ({lines} lines) still running; run the "
                        "same command again to collect them"
                    )
                time.sleep(settings.poll_interval_s)
    except BaseException as exc:
        if was_interrupted(exc) and running:
            log.warning(
                "interrupted: %d provider batch(es) left running at the provider (submitted, so paid for); "
                "run the same command again to collect them, or `lakescore batches --cancel` to cancel them",
                len(running),
            )
        raise
    return sorted(ended.values(), key=lambda s: (s.round, s.batch_id))


def _refuse_failed(states: Sequence[BatchState]) -> None:
    """:class:`BatchRefused` for the first ``failed`` batch of ``states`` that is not split (:func:`split_helps`); a
    split one is logged: its lines go again in halves."""
    for state in states:
        if state.status != "failed":
            continue
        said = (state.message or "no reason given")[:500]
        if not split_helps(state.message, state.lines):
            raise BatchRefused(
                f"the provider failed batch {state.batch_id} (its validation of the file, no line ran): {said}"
            )
        log.warning(
            "provider batch: the provider failed batch %s of %d lines (%s); its lines go again in files of at most %d",
            state.batch_id,
            state.lines,
            said,
            _half(state.lines),
        )


def _half(lines: int) -> int:
    return (lines + 1) // 2


def _collect(
    run: RunContext,
    ledger: BatchLedger,
    kind: BatchKind,
    states: Sequence[BatchState],
    collected: set[str],
    endpoint: Any,
) -> None:
    """Download every ended, uncollected batch's files and append its lines' outcomes to the ledger."""
    ended = {
        s.batch_id: {"status": s.status, "output_file_id": s.output_file_id, "error_file_id": s.error_file_id}
        for s in states
        if s.status in ENDED_STATES and s.batch_id not in collected
    }
    if not ended:
        return
    at_point("batch_collect")
    download = make_download_function(endpoint.url, endpoint.api_key_env, kind, ended)
    lines = ledger.lines().where(F.col("batch_id").isin(list(ended))).select("custom_id", "batch_id", "round")
    outcomes = lines.repartition(len(ended), "batch_id").mapInArrow(download, _spark_schema(OUTCOME_SCHEMA))
    ledger.append_outcomes(outcomes)
    log.info("provider batch: collected %d ended batch(es)", len(ended))


def _stage(
    run: RunContext,
    plan: Plan,
    ledger: BatchLedger,
    lines: BatchLines,
    rendered: DataFrame,
    todo: Sequence[int],
    keep: Sequence[str],
    passed: dict[str, str],
    prompt_col: str,
    settings: Any,
) -> None:
    """Each chunk's rows (of ``rendered``, the lines kept where they were rendered) joined to their lines' last
    outcomes (computed once, kept for every chunk) and staged, one commit per chunk."""
    cfg = run.cfg
    last = Window.partitionBy("custom_id").orderBy(F.col("round").desc())
    final = (
        ledger.outcomes()
        .withColumn("_n", F.row_number().over(last))
        .where(F.col("_n") == 1)
        .select(F.col("custom_id").alias(CUSTOM_ID), *[F.col(f).alias(outcome_column(f)) for f in OUTCOME_FIELDS])
    )
    spec = plan.spec
    task = get_task(spec.task)
    types = task.output_arrow_types_for(task.options_of(spec))
    fields = rendered.schema
    kept = [T.StructField(c, fields[passed[c]].dataType, fields[passed[c]].nullable) for c in keep]
    # the kept columns under their own names, as the per-row path stages them
    schema = scored_schema(cfg.task, *kept, asked=cfg.asked_outputs(), chunked=cfg.chunked)
    from pyspark.sql.pandas.types import to_arrow_schema

    result = make_result_function(
        lines,
        plan.identity.sha256,
        [passed[c] for c in keep],
        prompt_col,
        types,
        to_arrow_schema(schema),
        settings.max_bytes_per_file,
        settings.max_resubmits,
    )
    # each line's last outcome, computed once (a shuffle of every outcome) for the check and every chunk's join, over
    # the cluster's task slots by line id: a kept frame keeps its partitions, and the window's shuffle partitions
    # (200 by default, not coalesced once kept) would make the staging as many small Python tasks
    spread = final.repartition(default_parallelism(run.spark), CUSTOM_ID)
    with reused(spread) as last_outcomes:
        ended_as, round_ = F.col(outcome_column("kind")), F.col(outcome_column("round"))
        pending = last_outcomes.where((ended_as == RETRY) & (round_ < settings.max_resubmits)).limit(1).count()
        if pending:
            raise RuntimeError("provider batch: a line due a resubmission was left unsent (a bug: nothing is staged)")
        for chunk in todo:
            at_point(f"chunk_commit:{chunk}")
            rows = (
                rendered.where(F.col(_CHUNK) == chunk)
                .drop(LINE)
                .join(last_outcomes, CUSTOM_ID, "left")
                .select(*[passed[c] for c in keep], prompt_col, *[outcome_column(f) for f in OUTCOME_FIELDS])
            )
            plan.staging.commit_chunk(rows.mapInArrow(result, schema), chunk, plan.tag)
            at_point(f"chunk_committed:{chunk}")
            log.info("chunk %d/%d staged from the provider's batches", chunk + 1, plan.chunks)


def _spark_schema(schema: Any) -> T.StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


MAX_REASONS = 20
"""The resubmission reasons a report names, most frequent first; the rest are counted under :data:`OTHER_REASONS` (a
provider's message may name its line, so there may be one reason per line)."""
OTHER_REASONS = "(other reasons)"


def batch_summary(ledger: BatchLedger) -> dict[str, Any]:
    """What the report says of a batch run: its batches (id, round, lines, state), the lines submitted, and the lines
    resubmitted by reason (the message of the outcome each resubmission followed; the :data:`MAX_REASONS` most
    frequent, the rest together)."""
    states = ledger.states()
    retried = ledger.outcomes().where(F.col("kind") == RETRY)
    by_reason = retried.groupBy("message").agg(F.count(F.lit(1)).alias("n"))
    top = by_reason.orderBy(F.col("n").desc(), F.col("message")).limit(MAX_REASONS + 1).collect()
    reasons = {str(r["message"]): int(r["n"]) for r in top[:MAX_REASONS]}
    if len(top) > MAX_REASONS:
        reasons[OTHER_REASONS] = retried.count() - sum(reasons.values())
    return {
        "batches": [{"id": s.batch_id, "round": s.round, "lines": s.lines, "status": s.status} for s in states],
        "lines_submitted": sum(s.lines for s in states if s.status != "failed"),
        "lines_resubmitted": sum(s.lines for s in states if s.round > 0 and s.status != "failed"),
        "retry_reasons": reasons,
    }
