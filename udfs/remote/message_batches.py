"""Anthropic's Message Batches wire format, as pure functions: the body that submits lines
(``POST <url>/messages/batches``), when a batch has ended, and what each line of its results means. A provider batch
ledger (issue 67) sends Anthropic's batches through these as it sends OpenAI's through its batch files.

A line is ``{"custom_id", "params"}``, its ``params`` exactly the Messages request the per-row path sends for the row
(:func:`~lakescore.udfs.remote.messages.request_body`). A batch is ``in_progress``, ``canceling`` or ``ended``; only
an ended batch has a ``results_url``, a JSONL file of ``{"custom_id", "result"}`` in any order. A result line is one
of three things (:func:`classify`): a **result** (``succeeded``: the Message, published or dead-lettered for what it
holds, never sent again), a **retry** (``canceled``, ``expired``, an ``errored`` line whose error is the provider's
passing failure: ``api_error``, ``overloaded_error``, ``rate_limit_error``, ``timeout_error``; or a line absent from
the results), or **dead** (an ``errored`` line whose error is the request's own fault, ``invalid_request_error`` and
the like: dead-lettered with the provider's message)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RESULT",
    "RETRY",
    "DEAD",
    "BATCHES_PATH",
    "MAX_REQUESTS",
    "MAX_BYTES",
    "RETRYABLE_ERROR_TYPES",
    "LineOutcome",
    "batch_body",
    "ended",
    "parse_results",
    "iter_results",
    "classify",
    "absent",
]

RESULT, RETRY, DEAD = "result", "retry", "dead"
"""What a submitted line ended as (:class:`LineOutcome`); the same words as the OpenAI batch files'."""
BATCHES_PATH = "/messages/batches"
"""The route under the endpoint's ``url``; a batch is ``<url>/messages/batches/<id>``."""
MAX_REQUESTS = 100_000
"""Anthropic's limit of requests in one Message Batch."""
MAX_BYTES = 256 * 1024 * 1024
"""Anthropic's limit of one Message Batch's request body."""
RETRYABLE_ERROR_TYPES = frozenset({"api_error", "overloaded_error", "rate_limit_error", "timeout_error"})
"""The ``errored`` results' error types that are the provider's passing failure, not the request's."""


@dataclass(frozen=True)
class LineOutcome:
    """What one submitted line ended as: ``kind`` (:data:`RESULT`, :data:`RETRY`, :data:`DEAD`), the Message as JSON
    text (a result, for :func:`~lakescore.udfs.remote.messages.parse_message`), and the provider's reason (a retry's
    or a dead line's)."""

    kind: str
    body: str | None = None
    message: str | None = None


def batch_body(lines: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The request that submits ``(custom_id, params)`` lines as one Message Batch."""
    return {"requests": [{"custom_id": line_id, "params": dict(params)} for line_id, params in lines]}


def ended(batch: Mapping[str, Any]) -> bool:
    """Whether a batch (its JSON) has ended: its results are final and at its ``results_url``."""
    return batch.get("processing_status") == "ended"


def iter_results(raw_lines: Iterable[str]) -> Iterator[dict]:
    """A results file's lines as they come (``raw_lines``: streamed); a blank line is skipped, a line that is not a
    JSON object with a ``custom_id`` and a ``result`` is :class:`ValueError` (a file that cannot be read is not guessed
    at)."""
    for number, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        line = json.loads(raw)
        if (
            not isinstance(line, dict)
            or not isinstance(line.get("custom_id"), str)
            or not isinstance(line.get("result"), dict)
        ):
            raise ValueError(f"result line {number} has no custom_id or result: {raw[:200]}")
        yield line


def parse_results(text: str) -> dict[str, dict]:
    """A whole results file's lines by ``custom_id`` (:func:`iter_results`)."""
    return {line["custom_id"]: line for line in iter_results(text.splitlines())}


def classify(line: Mapping[str, Any]) -> LineOutcome:
    """What a results line means (module docstring).

    >>> classify({"custom_id": "a", "result": {"type": "succeeded", "message": {"content": []}}}).kind
    'result'
    >>> classify({"custom_id": "a", "result": {"type": "expired"}}).kind
    'retry'
    >>> error = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    >>> classify({"custom_id": "a", "result": {"type": "errored", "error": error}})
    LineOutcome(kind='dead', body=None, message='invalid_request_error: bad')
    """
    raw_result = line.get("result")
    result: Mapping[str, Any] = raw_result if isinstance(raw_result, Mapping) else {}
    kind = result.get("type")
    if kind == "succeeded" and isinstance(result.get("message"), Mapping):
        return LineOutcome(RESULT, json.dumps(result["message"], ensure_ascii=False))
    if kind in ("canceled", "expired"):
        return LineOutcome(RETRY, None, f"the line was {kind} before it ran")
    raw_error = result.get("error")
    error: Mapping[str, Any] = raw_error if isinstance(raw_error, Mapping) else {}
    raw_inner = error.get("error")
    inner: Mapping[str, Any] = raw_inner if isinstance(raw_inner, Mapping) else {}
    error_type, message = inner.get("type"), inner.get("message")
    reason = (
        " ".join(f"{error_type + ': ' if error_type else ''}{message or ''}".split())[:500]
        or f"a result of type {kind!r} without an error"
    )
    if kind == "errored" and error_type not in RETRYABLE_ERROR_TYPES and error_type is not None:
        return LineOutcome(DEAD, None, reason)
    return LineOutcome(RETRY, None, reason)


def absent() -> LineOutcome:
    """A line found nowhere in an ended batch's results: lost by the provider, retried."""
    return LineOutcome(RETRY, None, "absent from the ended batch's results")
