"""The executors' side of a provider batch run: four ``mapInArrow`` functions, so that prompts are rendered and files
written, uploaded and downloaded where the rows live, and the driver holds only batch ids and states. What differs
between providers (OpenAI's Files + Batches, Anthropic's Message Batches) is the provider kind each function is given
(:class:`~lakescore.udfs.remote.batch_kinds.BatchKind`).

* :func:`make_render_function`: each row's request line (:mod:`~lakescore.udfs.remote.batch_files`), its body exactly
  the per-row path's, as the task's :class:`~lakescore.udfs.remote.batch_lines.BatchLines` makes it.
* :func:`make_plan_function`: the files a partition's lines will be cut into, without sending them: each file's part
  digest, line count and first ids, for the intents the ledger records before a provider whose batches keep no
  metadata creates them (:mod:`~lakescore.udfs.remote.batch_intents`).
* :func:`make_submit_function`: a partition's lines (in the stage's order: by prompt where prefixes are grouped,
  then ``custom_id``) cut into files, each uploaded and its batch created, ``metadata`` naming the run and the file
  (:func:`~lakescore.udfs.remote.batch_files.part_digest`); a file whose batch the provider already holds (``known``:
  a rerun after a kill between create and record) is not sent again. One row out per line: which file and batch hold
  it.
* :func:`make_download_function`: the lines of ended batches, one task per batch, matched by ``custom_id`` against
  the batch's output and error files as they stream in: one outcome per line
  (:func:`~lakescore.udfs.remote.batch_files.classify`).
* :func:`make_result_function`: each row and its final outcome made the task's output row, as the per-row path
  makes it (:class:`~lakescore.udfs.scoring_udf.ScoredBatch`): published from its answer (the task's
  :class:`~lakescore.udfs.remote.batch_lines.BatchLines` reads it), or dead-lettered.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import groupby
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from lakescore.udfs.remote.batch_files import (
    DEAD,
    RESULT,
    LineOutcome,
    canonical,
    custom_id,
    cut_grouped,
    cut_sizes,
    part_digest,
)
from lakescore.udfs.remote.batch_intents import CLOCK_SKEW_S, SAMPLE_IDS, Found, Intent, match_intents
from lakescore.udfs.remote.batch_kinds import BatchKind

if TYPE_CHECKING:
    from lakescore.udfs.remote.batch_lines import BatchLines

__all__ = [
    "RENDERED_FIELDS",
    "SUBMITTED_SCHEMA",
    "OUTCOME_SCHEMA",
    "make_render_function",
    "make_plan_function",
    "PLANNED_SCHEMA",
    "make_submit_function",
    "find_again",
    "make_download_function",
    "make_result_function",
    "TOO_LARGE",
    "held_parts",
    "OUTCOME_FIELDS",
    "outcome_column",
]

ArrowFunction = Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]

CUSTOM_ID, LINE = "__lakescore_custom_id", "__lakescore_line"
RENDERED_FIELDS = ((CUSTOM_ID, pa.string()), (LINE, pa.binary()))
"""What :func:`make_render_function` adds to each row: its line id and its line (both null for a null prompt; the line
null too where it is larger than a file may be, :data:`TOO_LARGE`)."""
TOO_LARGE = (
    "the row's request line is larger than a batch file may be (the endpoint's batch.max_bytes_per_file {limit})"
)

SUBMITTED_SCHEMA = pa.schema(
    [
        ("custom_id", pa.string()),
        ("chunk", pa.int32()),
        ("round", pa.int32()),
        ("part", pa.string()),
        ("batch_id", pa.string()),
        ("input_file_id", pa.string()),
    ]
)
"""One row per submitted line (the ledger's lines)."""
OUTCOME_SCHEMA = pa.schema(
    [
        ("custom_id", pa.string()),
        ("batch_id", pa.string()),
        ("round", pa.int32()),
        ("kind", pa.string()),
        ("status", pa.int32()),
        ("body", pa.string()),
        ("message", pa.string()),
    ]
)
"""One row per collected line (the ledger's outcomes)."""
PLANNED_SCHEMA = pa.schema([("part", pa.string()), ("lines", pa.int64()), ("first_ids", pa.list_(pa.string()))])
"""One row per file a submit stage will cut (:func:`make_plan_function`)."""
OUTCOME_ROWS = 4096
"""Outcome rows a download task yields at a time (a result file is read as it streams in)."""
OUTCOME_FIELDS = ("kind", "status", "body", "message", "round")
"""A line's final outcome as :func:`make_result_function` reads it beside the row, each under
:func:`outcome_column`."""


def outcome_column(field: str) -> str:
    """The name outcome ``field`` goes by beside a row's own columns (an input's text column may well be ``body``)."""
    return f"__lakescore_outcome_{field}"


def make_render_function(
    task_lines: BatchLines, kind: BatchKind, prompt_col: str, key_col: str, out_schema: pa.Schema, max_bytes: int
) -> ArrowFunction:
    """Each batch's columns as they came, and each row's :data:`RENDERED_FIELDS` (``out_schema``: the input's fields
    then those two): its line's body is the task's (:meth:`BatchLines.body`), in ``kind``'s wire format."""

    def render(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            prompts = batch.column(prompt_col).to_pylist()
            keys = batch.column(key_col).to_pylist()
            ids: list[str | None] = []
            lines: list[bytes | None] = []
            for prompt, key in zip(prompts, keys):
                if prompt is None:
                    ids.append(None)
                    lines.append(None)
                    continue
                body = task_lines.body(prompt, "" if key is None else str(key))
                line_id = custom_id("" if key is None else str(key), canonical(body))
                line = kind.line(line_id, body)
                ids.append(line_id)
                lines.append(line if len(line) <= max_bytes else None)
            arrays = [*batch.columns, pa.array(ids, pa.string()), pa.array(lines, pa.binary())]
            yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)

    return render


def make_plan_function(run_key: str, round_: int, max_requests: int, max_bytes: int) -> ArrowFunction:
    """The :data:`PLANNED_SCHEMA` row of each file a partition's ``(group, custom_id, size)`` rows (each line's bytes,
    in the submit stage's order) are cut into: the same files :func:`make_submit_function` cuts from the same
    partitions."""

    def plan(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        def sizes() -> Iterator[tuple[int, str, int]]:
            for batch in batches:
                columns = (batch.column(name).to_pylist() for name in ("group", "custom_id", "size"))
                yield from zip(*columns)

        for part in cut_sizes(sizes(), max_requests, max_bytes):
            ids = [line_id for line_id, _ in part]
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([part_digest(run_key, round_, ids)], pa.string()),
                    pa.array([len(ids)], pa.int64()),
                    pa.array([ids[:SAMPLE_IDS]], pa.list_(pa.string())),
                ],
                schema=PLANNED_SCHEMA,
            )

    return plan


def make_submit_function(
    url: str,
    key_env: str | None,
    kind: BatchKind,
    run_key: str,
    round_: int,
    max_requests: int,
    max_bytes: int,
    known: Mapping[str, Mapping[str, Any]],
    client_factory: Callable[[], Any] | None = None,
    on_created: Callable[[], None] | None = None,
    intents: Mapping[str, Intent] | None = None,
    recorded: frozenset[str] = frozenset(),
) -> ArrowFunction:
    """Submit a partition's ``(group, custom_id, chunk, line)`` rows (in the stage's order, a group's together) as
    files of round ``round_`` (:func:`~lakescore.udfs.remote.batch_files.cut_grouped`), one batch each through
    ``kind``; yield :data:`SUBMITTED_SCHEMA` rows. ``known``: part digest -> ``{"batch_id", "input_file_id"}`` of
    batches the provider already holds for this run (found by their ``metadata``, or adopted for an intent); a retried
    task asks the provider again (:func:`held_parts`, with the round's ``intents`` and the batches the ledger has
    ``recorded``). ``on_created``: called after each batch is created (the test hooks)."""

    def submit(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        client = None
        chunks: dict[str, int] = {}

        def lines() -> Iterator[tuple[int, str, bytes]]:  # streamed: a task holds one file's lines at a time
            for batch in batches:
                ids, their_chunks = batch.column("custom_id").to_pylist(), batch.column("chunk").to_pylist()
                chunks.update(zip(ids, their_chunks))
                yield from zip(batch.column("group").to_pylist(), ids, batch.column("line").to_pylist())

        held_now: Mapping[str, Mapping[str, Any]] | None = None
        try:
            for part in cut_grouped(lines(), max_requests, max_bytes):
                ids = [line_id for line_id, _ in part]
                digest = part_digest(run_key, round_, ids)
                if held_now is None and _retried_task():  # an earlier attempt of this task may have created some
                    client = client or (client_factory() if client_factory else _client(url, key_env, kind))
                    held_now = {**known, **held_parts(client, kind, run_key, round_, intents, recorded)}
                held = (held_now or known).get(digest)
                file_id: str | None
                if held is not None:
                    batch_id, file_id = held["batch_id"], held["input_file_id"]
                else:
                    client = client or (client_factory() if client_factory else _client(url, key_env, kind))
                    with tempfile.TemporaryFile() as spooled:  # a file may be 200 MB: on disk, not in memory
                        for _, line in part:
                            spooled.write(line)
                        spooled.seek(0)
                        batch_id, file_id = kind.submit(
                            client,
                            f"lakescore-{run_key}-{round_}-{digest}",
                            [line for _, line in part],
                            spooled,
                            {"lakescore_run": run_key, "lakescore_part": digest, "lakescore_round": str(round_)},
                        )
                    if on_created is not None:
                        on_created()
                n = len(ids)
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.array(ids, pa.string()),
                        pa.array([chunks.pop(i) for i in ids], pa.int32()),
                        pa.array([round_] * n, pa.int32()),
                        pa.array([digest] * n, pa.string()),
                        pa.array([batch_id] * n, pa.string()),
                        pa.array([file_id] * n, pa.string()),
                    ],
                    schema=SUBMITTED_SCHEMA,
                )
        finally:
            if client is not None:
                client.close()

    return submit


def _retried_task() -> bool:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is not None and context.attemptNumber() > 0


def held_parts(
    client: Any,
    kind: BatchKind,
    run_key: str,
    round_: int,
    intents: Mapping[str, Intent] | None = None,
    recorded: frozenset[str] = frozenset(),
) -> dict[str, dict[str, Any]]:
    """The provider's batches of ``run_key``'s round ``round_`` by file (their ``metadata``, where the provider keeps
    it): part digest -> batch and input file; a ``failed`` one left out (it ran nothing: its file is sent again). For a
    provider that keeps no metadata, the batches :func:`find_again` adopts for ``intents`` (none left out:
    ``recorded``)."""
    if not kind.keeps_metadata:
        found = find_again(client, kind, (intents or {}).values(), recorded)
        return {part: {"batch_id": batch_id, "input_file_id": None} for part, batch_id in found.adopted.items()}
    held: dict[str, dict[str, Any]] = {}
    for metadata, batch_id, file_id in kind.held(client, {"lakescore_run": run_key, "lakescore_round": str(round_)}):
        if metadata.get("lakescore_part") not in held:
            held[metadata["lakescore_part"]] = {"batch_id": batch_id, "input_file_id": file_id}
    return held


def find_again(client: Any, kind: BatchKind, intents: Iterable[Intent], recorded: frozenset[str]) -> Found:
    """The provider's batches that are ``intents``' (:func:`~lakescore.udfs.remote.batch_intents.match_intents`),
    listed back to the earliest intent; none recorded already (``recorded``)."""
    intents = list(intents)
    if not intents:
        return Found()
    listed = kind.listed(client, min(i.at for i in intents) - CLOCK_SKEW_S)
    return match_intents(intents, listed, lambda b: kind.result_ids(client, b.results) if b.results else (), recorded)


def make_download_function(
    url: str,
    key_env: str | None,
    kind: BatchKind,
    ended: Mapping[str, Mapping[str, Any]],
    client_factory: Callable[[], Any] | None = None,
) -> ArrowFunction:
    """The :data:`OUTCOME_SCHEMA` row of each ``(custom_id, batch_id, round)`` line of an ended batch (``ended``:
    batch id -> ``{"status", "output_file_id", "error_file_id"}``), from its batch's results (``kind``'s), read once
    per task and batch as they stream in: a task holds its lines' ids and :data:`OUTCOME_ROWS` outcomes, never a
    result file. Every line of a batch must be in one task (the stage partitions by batch)."""

    def download(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        client = None
        rows: list[tuple[str, str, int]] = []
        for batch in batches:
            rows.extend(
                zip(
                    batch.column("custom_id").to_pylist(),
                    batch.column("batch_id").to_pylist(),
                    batch.column("round").to_pylist(),
                )
            )
        try:
            for batch_id, group in groupby(sorted(rows, key=lambda r: r[1]), key=lambda r: r[1]):
                state = ended[batch_id]
                client = client or (client_factory() if client_factory else _client(url, key_env, kind))
                waiting = {line_id: round_ for line_id, _, round_ in group}
                out: list[tuple] = []
                found = kind.outcomes(client, state.get("output_file_id"), state.get("error_file_id"))
                for line_id, outcome in found:
                    round_ = waiting.pop(line_id, None)
                    if round_ is None:  # read already (an output line wins over an error line), or not this run's
                        continue
                    out.append(_outcome_row(client, line_id, batch_id, round_, outcome))
                    if len(out) >= OUTCOME_ROWS:
                        yield _outcome_batch(out)
                        out = []
                absent = kind.absent(state["status"])
                out.extend(
                    _outcome_row(client, line_id, batch_id, round_, absent) for line_id, round_ in waiting.items()
                )
                if out:
                    yield _outcome_batch(out)
        finally:
            if client is not None:
                client.close()

    return download


def _outcome_row(client: Any, line_id: str, batch_id: str, round_: int, outcome: LineOutcome) -> tuple:
    message = outcome.message if outcome.message is None else client.scrub(outcome.message)
    return (line_id, batch_id, round_, outcome.kind, outcome.status, outcome.body, message)


def _outcome_batch(rows: list[tuple]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(list(c), f.type) for c, f in zip(zip(*rows), OUTCOME_SCHEMA)], schema=OUTCOME_SCHEMA
    )


def _client(url: str, key_env: str | None, kind: BatchKind) -> Any:
    key = os.environ.get(key_env) if key_env else None
    if key_env and not key:
        raise RuntimeError(
            f"the endpoint's api_key_env names {key_env}, which is not set on this host "
            f"(on a cluster set spark.executorEnv.{key_env})"
        )
    return kind.client(url, key)


def make_result_function(
    task_lines: BatchLines,
    sha256: str,
    keep_cols: Sequence[str],
    prompt_col: str,
    output_types: Sequence[pa.DataType],
    out_schema: pa.Schema,
    max_bytes: int,
    max_resubmits: int,
) -> ArrowFunction:
    """Each row (``keep_cols``, its prompt, and its final outcome: :data:`OUTCOME_FIELDS` under
    :func:`outcome_column`, null where it was never sent) as the task's output row (``out_schema``,
    :func:`~lakescore.schemas.output.scored_schema`): published from a result the task's checks pass
    (:meth:`BatchLines.answer`), else
    dead-lettered as the per-row path would (``endpoint_error`` / ``endpoint_unfinished``), a line past
    ``max_resubmits`` ``endpoint_error`` naming its last reason, a null prompt ``null_input``. Each Arrow batch's
    first row carries its worker metrics: tokens from the answers' ``usage`` (cached prompt tokens apart), each line
    sent counted a request."""
    from lakescore.schemas.reasons import ENDPOINT_ERROR, NULL_INPUT
    from lakescore.schemas.traffic import Traffic
    from lakescore.udfs.remote.answers import EndpointError, Malformed
    from lakescore.udfs.scoring_udf import ScoredBatch

    def result(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            prompts = batch.column(prompt_col).to_pylist()
            kinds, bodies, messages, rounds = (
                batch.column(outcome_column(f)).to_pylist() for f in ("kind", "body", "message", "round")
            )
            outputs = np.empty(n, dtype=object)
            reasons: list[str | None] = [None] * n
            errors: list[str | None] = [None] * n
            tokens_in = tokens_cached = tokens_cache_write = tokens_out = unmetered = requests = 0
            for i in range(n):
                if prompts[i] is None:
                    reasons[i] = NULL_INPUT
                    continue
                requests += 0 if rounds[i] is None else rounds[i] + 1
                ended_as = kinds[i]
                if ended_as is None:  # never sent: its line cannot go in a file
                    reasons[i], errors[i] = ENDPOINT_ERROR, TOO_LARGE.format(limit=max_bytes)
                elif ended_as == RESULT:
                    try:
                        answer = task_lines.answer(json.loads(bodies[i]))
                    except (EndpointError, ValueError) as exc:  # what the per-row path dead-letters, as it words it
                        reasons[i] = exc.reason if isinstance(exc, EndpointError) else ENDPOINT_ERROR
                        errors[i] = (f"a malformed answer: {exc}" if isinstance(exc, Malformed) else str(exc))[:2000]
                        continue
                    outputs[i] = answer.output
                    if answer.failure is not None:
                        reasons[i], errors[i] = answer.failure
                    if answer.tokens_in is None:
                        unmetered += 1
                    else:
                        tokens_in += answer.tokens_in
                        tokens_cached += answer.tokens_cached
                        tokens_cache_write += answer.tokens_cache_write
                        tokens_out += answer.tokens_out
                elif ended_as == DEAD:
                    reasons[i], errors[i] = ENDPOINT_ERROR, f"the provider's batch refused the line: {messages[i]}"
                else:
                    reasons[i] = ENDPOINT_ERROR
                    errors[i] = (
                        f"the provider's batch ended the line without an answer {max_resubmits + 1} times; "
                        f"last: {messages[i]}"
                    )
            ok = np.fromiter((r is None for r in reasons), dtype=bool, count=n)
            predictions = list(task_lines.columns(outputs, ok)) if ok.any() else [pa.nulls(n, t) for t in output_types]
            raw = [None if reasons[i] is None else prompts[i] for i in range(n)]
            resent = sum(r or 0 for r, p in zip(rounds, prompts) if p is not None)
            scored = ScoredBatch(
                predictions,
                sha256,
                reasons,
                errors,
                raw,
                traffic=Traffic(
                    tokens_in=tokens_in,
                    tokens_in_cached=tokens_cached,
                    tokens_in_cache_write=tokens_cache_write,
                    tokens_out=tokens_out,
                    requests=requests,
                    retries=resent,
                    unmetered=unmetered,
                ),
            )
            yield scored.record_batch([batch.column(name) for name in keep_cols], out_schema)

    return result
