"""OpenAI Batch API files, as pure functions: each row's request line, the files a run's lines are cut into, and what
each line of a result file means.

A line is ``{"custom_id", "method": "POST", "url", "body"}``, its ``body`` exactly what the per-row path sends for the
row (:func:`~lakescore.udfs.remote.completions.request_body`). Its ``custom_id`` is a digest of the row's key and of
that body (:func:`custom_id`): a rerun over the same rows with the same settings makes the same ids, and a row whose
request changed gets another. Files are cut in the order the lines come, within both the provider's limits
(:func:`cut_files`); a file is named by the digest of its round and ids (:func:`part_digest`), which its batch carries
in ``metadata`` so a rerun finds a batch created but not recorded.

A result line is one of three things (:func:`classify`): a **result** (the provider answered the request, 200: the
row is published from it, or dead-lettered for what it holds, and never sent again), a **retry** (the provider ended
the line without an answer: an error line with a retryable status, 429 or 5xx; an expired or cancelled batch's
unfinished line; a line absent from both files), or **dead** (the request's own fault, a 4xx: dead-lettered with the
provider's message). :func:`next_step` decides a retry's fate: resent in a new round, or dead past ``max_resubmits``.

A batch the provider ends ``failed`` (its validation of the file: no line ran) is split when its reason names a size
or count limit (:func:`split_helps`): its lines go again in files of at most half its lines; any other reason is the
run's to refuse, quoting the provider.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from lakescore.udfs.remote.answers import RETRY_STATUSES

__all__ = [
    "RESULT",
    "RETRY",
    "DEAD",
    "LineOutcome",
    "custom_id",
    "batch_line",
    "request_path",
    "cut_files",
    "cut_grouped",
    "cut_sizes",
    "group_count",
    "group_bounds",
    "group_of",
    "GROUP_HEADROOM",
    "SAMPLES_PER_GROUP",
    "PREFIX_KEY_CHARS",
    "part_digest",
    "task_count",
    "HEADROOM",
    "parse_jsonl",
    "iter_jsonl",
    "classify",
    "absent",
    "next_step",
    "batch_errors",
    "split_helps",
    "LIMIT_CODES",
    "RETRYABLE_LINE_CODES",
    "TERMINAL_STATES",
    "ENDED_STATES",
]

T = TypeVar("T")

RESULT, RETRY, DEAD = "result", "retry", "dead"
"""What a submitted line ended as (:class:`LineOutcome`)."""

RETRYABLE_LINE_CODES = frozenset(
    {"batch_expired", "batch_cancelled", "rate_limit_exceeded", "server_error", "timeout", "internal_error"}
)
"""Error codes of an error-file line without a status that mean the provider ended the line unanswered."""


LIMIT_CODES = frozenset(
    {"file_too_large", "too_many_requests", "max_requests_exceeded", "token_limit_exceeded", "request_too_large"}
)
"""Error codes of a ``failed`` batch that name a limit of the file's size, its requests or its tokens."""
_LIMIT_WORDS = ("too large", "too many", "too big", "exceed", "at most", "maximum", "limit")


ENDED_STATES = frozenset({"completed", "expired", "cancelled", "ended"})
"""Batch states whose output and error files are final: the lines they hold are collected (``ended``: Anthropic's
Message Batches' one final state)."""
TERMINAL_STATES = ENDED_STATES | {"failed"}
"""Batch states the provider never leaves (``failed``: the file did not pass its validation; no line ran)."""


@dataclass(frozen=True)
class LineOutcome:
    """What one submitted line ended as: ``kind`` (:data:`RESULT`, :data:`RETRY`, :data:`DEAD`), the status the
    provider gave it (``None``: none), the response's body as JSON text (a result), and the provider's message (a
    retry's or a dead line's reason)."""

    kind: str
    status: int | None = None
    body: str | None = None
    message: str | None = None


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def canonical(body: Mapping[str, Any]) -> str:
    """``body`` as one stable JSON text (keys sorted, no blanks): what a line's digest and the file hold."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def custom_id(row_key: str, body: str) -> str:
    """The line id of the row keyed ``row_key`` whose request is ``body`` (:func:`canonical`): the same for the same
    row and request in every run, 44 characters (providers take 64).

    >>> custom_id("42", '{"prompt":"hi"}') == custom_id("42", '{"prompt":"hi"}')
    True
    >>> custom_id("42", "{}") == custom_id("43", "{}")
    False
    """
    return f"ls-{_digest(row_key)[:20]}-{_digest(body)[:20]}"


def request_path(base_url: str, api: str) -> str:
    """The ``url`` of a line (and the batch's ``endpoint``): the base URL's path and the API's route, e.g.
    ``/v1/chat/completions``."""
    route = {"chat": "/chat/completions", "completions": "/completions", "embeddings": "/embeddings"}[api]
    return urlsplit(base_url).path.rstrip("/") + route


def batch_line(line_id: str, path: str, body: str) -> bytes:
    """One request line of a batch file (UTF-8, ending in a newline); ``body`` is :func:`canonical` JSON text."""
    return (
        '{"custom_id":' + json.dumps(line_id) + ',"method":"POST","url":' + json.dumps(path) + ',"body":' + body + "}\n"
    ).encode("utf-8")


def cut_files(
    lines: Iterable[tuple[str, bytes]], max_requests: int, max_bytes: int
) -> Iterator[list[tuple[str, bytes]]]:
    """``(custom_id, line)`` pairs cut, in their order, into files of at most ``max_requests`` lines and
    ``max_bytes`` bytes; a line longer than ``max_bytes`` alone cannot go in any: :class:`ValueError` (the caller
    dead-letters such a row before cutting).

    >>> [len(f) for f in cut_files([(str(i), b"x" * 10) for i in range(7)], 3, 25)]
    [2, 2, 2, 1]
    """
    return _cut(((0, line_id, line) for line_id, line in lines), max_requests, max_bytes, len)


def cut_grouped(
    lines: Iterable[tuple[int, str, bytes]], max_requests: int, max_bytes: int
) -> Iterator[list[tuple[str, bytes]]]:
    """``(group, custom_id, line)`` triples cut as :func:`cut_files` cuts, a file never holding two groups' lines (a
    group's lines come together): the files of a group are the same whatever other groups share its task.

    >>> [len(f) for f in cut_grouped([(g, str(i), b"x") for i, g in enumerate([0, 0, 0, 1, 1, 1, 1])], 3, 99)]
    [3, 3, 1]
    """
    return _cut(lines, max_requests, max_bytes, len)


def cut_sizes(
    sizes: Iterable[tuple[int, str, int]], max_requests: int, max_bytes: int
) -> Iterator[list[tuple[str, int]]]:
    """``(group, custom_id, bytes)`` triples cut as :func:`cut_grouped` cuts the lines of those sizes: the same files,
    planned without the lines.

    >>> [len(f) for f in cut_sizes([(0, str(i), 10) for i in range(7)], 3, 25)]
    [2, 2, 2, 1]
    """
    return _cut(sizes, max_requests, max_bytes, int)


def _cut(
    items: Iterable[tuple[int, str, T]], max_requests: int, max_bytes: int, size: Callable[[T], int]
) -> Iterator[list[tuple[str, T]]]:
    part: list[tuple[str, T]] = []
    total = 0
    current: int | None = None
    for group, line_id, item in items:
        length = size(item)
        if length > max_bytes:
            raise ValueError(f"line {line_id} is {length} bytes, more than a file's {max_bytes}")
        if part and (group != current or len(part) >= max_requests or total + length > max_bytes):
            yield part
            part, total = [], 0
        current = group
        part.append((line_id, item))
        total += length
    if part:
        yield part


HEADROOM = 1.05
"""How far over its even share a task's lines may come (hash partitions are uneven by about the square root of their
size: 0.5% at 50,000 lines) and still fit one file."""


def task_count(lines: int, size: int, max_requests: int, max_bytes: int) -> int:
    """How many tasks a round's ``lines`` lines (``size`` bytes in all) are submitted by: enough that each task's even
    share, with :data:`HEADROOM`, fits one file, so a task holds about one file's lines at a time and the files are
    uploaded as many at once as the cluster runs tasks.

    >>> task_count(1_000_000, 290_000_000, 50_000, 200 * 1024**2), task_count(10, 10**9, 50_000, 200 * 1024**2)
    (21, 6)
    """
    return max(1, math.ceil(lines * HEADROOM / max_requests), math.ceil(size * HEADROOM / max_bytes))


GROUP_HEADROOM = 1.2
"""How far over its even share a prefix group's lines may come and still fit one file: its bounds are quantiles of a
sample of a few hundred lines per group (:data:`SAMPLES_PER_GROUP`), a few percent off."""
SAMPLES_PER_GROUP = 400
"""Lines sampled per prefix group to place its bounds (their prompts' first :data:`PREFIX_KEY_CHARS` characters reach
the driver)."""
PREFIX_KEY_CHARS = 256
"""The characters of a prompt that place its line in a prefix group (rows sharing more stay in order within it)."""


def group_count(lines: int, size: int, max_requests: int, max_bytes: int) -> int:
    """How many prefix groups a round's ``lines`` lines (``size`` bytes) are cut into: enough that each group's even
    share, with :data:`GROUP_HEADROOM`, fits one file.

    >>> group_count(1_000_000, 290_000_000, 50_000, 200 * 1024**2), group_count(9, 900, 3, 10**6)
    (24, 4)
    """
    return max(1, math.ceil(lines * GROUP_HEADROOM / max_requests), math.ceil(size * GROUP_HEADROOM / max_bytes))


def group_bounds(sample: Iterable[tuple[str, str]], groups: int) -> list[tuple[str, str]]:
    """The ``groups - 1`` bounds, ``(prompt key, custom_id)`` in their order, that cut a sample of the lines (each its
    prompt's key and its id) into ``groups`` groups of about equal size; fewer where the sample repeats itself. A line
    goes in the group of the bounds it is above (:func:`group_of`).

    >>> group_bounds([("b", "1"), ("a", "2"), ("c", "3"), ("a", "1")], 2)
    [('b', '1')]
    >>> group_bounds([("a", "1")], 3)
    [('a', '1')]
    """
    ordered = sorted(sample)
    bounds = sorted({ordered[len(ordered) * i // groups] for i in range(1, groups)} if ordered else set())
    return bounds


def group_of(key: str, line_id: str, bounds: Sequence[tuple[str, str]]) -> int:
    """The group of the line ``(key, line_id)``: how many ``bounds`` it is above (what the submit stage computes in
    Spark for each line).

    >>> [group_of(k, "1", [("b", "1")]) for k in ("a", "b", "c")]
    [0, 0, 1]
    """
    return sum(1 for b in bounds if (key, line_id) > b)


def part_digest(run_key: str, round_: int, line_ids: Sequence[str]) -> str:
    """The name of one file of round ``round_`` of run ``run_key`` holding ``line_ids`` (in file order): what its
    batch's ``metadata`` carries, 32 hex digits."""
    return _digest(f"{run_key}\x00{round_}\x00" + "\n".join(line_ids))[:32]


def iter_jsonl(raw_lines: Iterable[str]) -> Iterator[dict]:
    """The lines of a result (output or error) file as they come (``raw_lines``: the file's lines, streamed); a blank
    line is skipped, a line that is not a JSON object with a ``custom_id`` is :class:`ValueError` (a provider's file
    that cannot be read is not guessed at).

    >>> [line["custom_id"] for line in iter_jsonl(['{"custom_id": "a"}', "", '{"custom_id": "b"}'])]
    ['a', 'b']
    """
    for number, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        line = json.loads(raw)
        if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
            raise ValueError(f"result line {number} has no custom_id: {raw[:200]}")
        yield line


def parse_jsonl(text: str) -> dict[str, dict]:
    """The lines of a whole result file's ``text`` by ``custom_id`` (:func:`iter_jsonl`)."""
    return {line["custom_id"]: line for line in iter_jsonl(text.splitlines())}


def _message(error: Any, body: Any) -> str | None:
    """The provider's words for a line's failure: its ``error.message`` (with the code), or the body's."""
    for holder in (error, body.get("error") if isinstance(body, Mapping) else None):
        if isinstance(holder, Mapping):
            code, message = holder.get("code"), holder.get("message")
            if message or code:
                return " ".join(f"{code + ': ' if code else ''}{message or ''}".split())[:500]
        elif isinstance(holder, str) and holder:
            return holder[:500]
    return None


def classify(line: Mapping[str, Any]) -> LineOutcome:
    """What a line of a result file means (module docstring): a 200 response is a :data:`RESULT` with its body; an
    error with a retryable status or code a :data:`RETRY`; any other a :data:`DEAD` with the provider's message.

    >>> classify({"custom_id": "a", "response": {"status_code": 200, "body": {"choices": []}}}).kind
    'result'
    >>> classify({"custom_id": "a", "response": {"status_code": 429, "body": {}}, "error": None}).kind
    'retry'
    >>> classify({"custom_id": "a", "response": None, "error": {"code": "batch_expired", "message": "expired"}}).kind
    'retry'
    >>> classify({"custom_id": "a", "response": {"status_code": 400, "body": {"error": {"message": "bad"}}}}).message
    'bad'
    """
    response = line.get("response")
    error = line.get("error")
    status = response.get("status_code") if isinstance(response, Mapping) else None
    status = status if isinstance(status, int) and not isinstance(status, bool) else None
    body = response.get("body") if isinstance(response, Mapping) else None
    if status == 200 and isinstance(body, Mapping) and not error:
        return LineOutcome(RESULT, 200, json.dumps(body, ensure_ascii=False))
    message = _message(error, body) or (f"HTTP {status}" if status is not None else "an error line without a message")
    code = error.get("code") if isinstance(error, Mapping) else None
    if (status is not None and (status in RETRY_STATUSES or status >= 500)) or (
        status is None and (code in RETRYABLE_LINE_CODES or code is None)
    ):
        return LineOutcome(RETRY, status, None, message)
    return LineOutcome(DEAD, status, None, message)


def absent(batch_status: str) -> LineOutcome:
    """A line found in neither file of a batch that ended ``batch_status``: unfinished (an expired or cancelled batch's
    rest), or lost by the provider (a completed batch's): retried."""
    if batch_status == "completed":
        return LineOutcome(RETRY, None, None, "absent from the completed batch's output and error files")
    return LineOutcome(RETRY, None, None, f"not done when the batch ended {batch_status}")


def next_step(outcome_kind: str, round_: int, max_resubmits: int) -> str:
    """What becomes of a line that ended ``outcome_kind`` in round ``round_`` (0: first sent): ``"done"`` (a result or
    a dead line: staged as it is), ``"resend"`` (a retry with resubmissions left) or ``"dead"`` (a retry past
    ``max_resubmits``).

    >>> next_step("retry", 0, 3), next_step("retry", 3, 3), next_step("result", 0, 3)
    ('resend', 'dead', 'done')
    """
    if outcome_kind != RETRY:
        return "done"
    return "resend" if round_ < max_resubmits else "dead"


def batch_errors(batch: Mapping[str, Any]) -> str | None:
    """A ``failed`` batch's reasons as one text (``code: message; ...``, the batch's ``errors.data``), ``None`` when it
    gives none: what the ledger records and the refusal quotes."""
    errors = (batch.get("errors") or {}).get("data") or []
    said = [_message(e, None) for e in errors if isinstance(e, Mapping)]
    return "; ".join(s for s in said if s)[:2000] or None


def split_helps(reasons: str | None, lines: int) -> bool:
    """Whether a batch of ``lines`` lines the provider failed for ``reasons`` (:func:`batch_errors`) is split and its
    halves sent: more than one line, and a reason that names a limit of the file's size, requests or tokens.

    >>> split_helps("too_many_requests: The input file holds 5 requests; at most 2 are allowed.", 5)
    True
    >>> split_helps("file_too_large: The input file is 300 bytes", 1), split_helps("mismatched_model: one model", 4)
    (False, False)
    """
    if lines < 2 or not reasons:
        return False
    text = reasons.lower()
    return any(code in text for code in LIMIT_CODES) or any(word in text for word in _LIMIT_WORDS)
