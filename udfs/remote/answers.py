"""What a server's answer means, in one place, for every remote API (completions and chat, embeddings): which
failures are retried (:func:`retryable`), which are the request's content's fault (:func:`content_refused`: the
embed head splits such a request to find the text it refuses), which answers are malformed or unfinished, and how
the preflight words a failure (:func:`what_happened`). The wire modules (:mod:`~lakescore.udfs.remote.completions`,
:mod:`~lakescore.udfs.remote.embeddings`) raise these errors; the client (:mod:`~lakescore.udfs.remote.client`) and
the heads read them.
"""

from __future__ import annotations

from typing import Protocol

from lakescore.schemas.reasons import ENDPOINT_ERROR, ENDPOINT_UNFINISHED
from lakescore.udfs.models.model_source import ModelSourceError

__all__ = [
    "Answer",
    "EndpointError",
    "EndpointDown",
    "EndpointRefused",
    "Malformed",
    "Unfinished",
    "Unhonoured",
    "RETRY_STATUSES",
    "retryable",
    "content_refused",
    "what_happened",
]

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
"""Statuses a request is retried on: the server's overload or a passing failure, never the request's own fault (529:
Anthropic's ``overloaded_error``).
408 (the server timed out waiting) and 409 (a conflict with the server's state, e.g. a concurrent request) say
nothing of the content, so they are retried and, once retries are spent, failed as the server's, like a 5xx."""


class Answer(Protocol):
    """A parsed answer: the tokens its ``usage`` reported (``None``: it reported none), which settle the host's
    tokens-per-minute limit."""

    @property
    def tokens(self) -> int | None: ...


def retryable(kind: str | None, status: int | None) -> bool:
    """Whether a failed attempt is sent again: a timeout, a lost connection, or a status of :data:`RETRY_STATUSES`."""
    return kind in ("timeout", "connection") or status in RETRY_STATUSES


def content_refused(error: EndpointError) -> bool:
    """Whether the server failed the request for its content: an error status (4xx) that is none of
    :data:`RETRY_STATUSES` (so not 408, 409 or 429). Anything else failed the server, not a text."""
    return (
        error.kind == "status"
        and error.status is not None
        and 400 <= error.status < 500
        and error.status not in RETRY_STATUSES
    )


class EndpointError(RuntimeError):
    """One row's request failed for good: ``status`` (``None`` for a connection error or timeout) and the server's
    message; ``kind`` says what happened (``status``: the server's error status, ``rate_limited``: 429 after every
    retry, ``timeout``, ``connection``, ``malformed``: a 200 whose body is not a whole OpenAI answer). The row is
    dead-lettered ``endpoint_error``."""

    reason = ENDPOINT_ERROR

    def __init__(self, status: int | None, message: str, kind: str | None = None) -> None:
        self.status, self.message = status, message
        self.kind = kind or ("rate_limited" if status == 429 else "status" if status is not None else "connection")
        super().__init__(f"HTTP {status}: {message}" if status is not None else message)


class Malformed(ValueError):
    """A 200 answer that is not a whole, well-formed answer to the request (no text, no or an unknown
    ``finish_reason``, impossible ``usage``): the row's error, and a failure toward ``max_consecutive_failures``."""


class Unfinished(EndpointError):
    """A well-formed answer the server did not finish (``finish_reason`` ``content_filter``, ``abort``, ...): the row
    is dead-lettered ``endpoint_unfinished`` with that reason, never published as ``stop``. The server works: this is
    no failure toward ``max_consecutive_failures``."""

    reason = ENDPOINT_UNFINISHED

    def __init__(self, finish_reason: str) -> None:
        self.finish_reason = finish_reason
        super().__init__(200, f"the server ended the answer with finish_reason {finish_reason!r}", kind="unfinished")


class Unhonoured(EndpointError):
    """A response that shows the server ignored one of the run's settings (``setting``): the row's error, and in the
    preflight the run's refusal."""

    def __init__(self, setting: str, message: str) -> None:
        self.setting = setting
        super().__init__(200, message)


class EndpointDown(RuntimeError):
    """The endpoint failed ``max_consecutive_failures`` requests in a row: the run stops, in one line naming the
    endpoint and the last error. Not a row's failure: it is never dead-lettered."""


class EndpointRefused(ModelSourceError):
    """The preflight found a setting the endpoint cannot honour, or an endpoint that does not answer: one line, before
    any row is sent (a model source that cannot serve the run)."""


def what_happened(error: EndpointError, retries: int) -> str:
    """The preflight's words for a request that failed for good: what happened, not always "refused"."""
    if error.kind == "rate_limited":
        return f"rate limited the preflight's request (429 after {retries} retries): {error.message}"
    if error.kind == "timeout":
        return f"timed out on the preflight's request ({retries} retries): {error.message}"
    if error.kind == "connection":
        return f"could not be reached ({retries} retries): {error.message}"
    if error.kind == "malformed":
        return f"answered the preflight's request with {error.message}"
    if error.kind == "unfinished":
        return f"did not finish the preflight's answer: {error.message}"
    if content_refused(error):
        return f"refused the run's settings: {error}"
    return f"failed the preflight's request: {error}"
