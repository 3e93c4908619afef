"""The OpenAI-compatible client behind ``generate.endpoint``/``server`` and ``embed.endpoint``/``server``: the
transport every remote API shares, whatever its wire format (:mod:`~lakescore.udfs.remote.completions`,
:mod:`~lakescore.udfs.remote.embeddings`).

Each request is sent by a pool of threads bounded per task (``concurrency``), through a host-wide rate limit
(:class:`~lakescore.udfs.remote.rate_limit.HostRateLimit`), with a timeout per request and retries on what
:func:`~lakescore.udfs.remote.answers.retryable` says (statuses, timeouts and lost connections): exponential backoff
with jitter, or the server's ``Retry-After``. A row that still fails is the row's :class:`EndpointError`
(dead-lettered ``endpoint_error`` with the status and the server's message); past ``max_consecutive_failures``
failed requests in a row the client raises :class:`EndpointDown` for every row in flight, which fails the task and
the run in one line.

HTTP is httpx2, which ``transformers`` already brings (through ``huggingface_hub``): pooled keep-alive connections
shared by threads, timeouts, proxies and system certificates. The retry loop is our own rather than the ``openai``
client's: the run counts what it retried and was rate-limited, the limit is shared with the other processes of the
host, and a dead endpoint must stop the run instead of retrying each row in turn; the ``openai`` package is not a
runtime dependency either. The API key is read from the environment variable the settings name and is sent only in
the ``Authorization`` header: no message, log line or error text here holds it (:meth:`EndpointClient.scrub`).
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from lakescore.schemas.traffic import Traffic
from lakescore.udfs.options.remote import RemoteEndpoint, ServedEngine
from lakescore.udfs.remote.answers import (
    Answer,
    EndpointDown,
    EndpointError,
    EndpointRefused,
    Malformed,
    Unfinished,
    retryable,
)
from lakescore.udfs.remote.rate_limit import HostRateLimit

__all__ = [
    "Reply",
    "ClientStats",
    "EndpointClient",
    "retry_after",
    "backoff",
    "scrub",
    "server_message",
    "ESTIMATED_CHARS_PER_TOKEN",
    "bearer_headers",
]

MAX_RETRY_AFTER_S = 300.0
"""The longest ``Retry-After`` honoured; a server asking for more is waited this long."""
ESTIMATED_CHARS_PER_TOKEN = 4
"""How a prompt's tokens are guessed for the tokens-per-minute limit before the server counts them (OpenAI's rule of
thumb for English; the guess is settled from ``usage`` after)."""


_AUTHORIZATION = re.compile(
    r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?:[A-Za-z][\w-]*\s+)?[^\s\"',}\]]+"
    r"|(bearer\s+)[^\s\"',}\]]+|(x-api-key[\"']?\s*[:=]\s*[\"']?)[^\s\"',}\]]+"
)


def scrub(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` without any of ``secrets`` and without any ``Authorization`` or ``x-api-key`` value or bearer token in
    it: the one scrubber every text from a server passes before it reaches a table, a log or the report (a server or a
    proxy may echo the request's headers in its error)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _AUTHORIZATION.sub(lambda m: (m.group(1) or m.group(2) or m.group(3)) + "***", text)


@dataclass(frozen=True)
class Reply:
    """A successful response's JSON body, and its headers (lower-case names)."""

    body: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def tokens(self) -> int | None:
        """None: a body no API's parser read, whose tokens are unknown."""
        return None


A = TypeVar("A", bound=Answer)


@dataclass
class ClientStats:
    """What one process's client sent (:class:`~lakescore.schemas.traffic.Traffic`), and the rows it failed for
    good; its threads add to it together."""

    traffic: Traffic = field(default_factory=Traffic)
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, traffic: Traffic) -> None:
        with self.lock:
            self.traffic = self.traffic + traffic

    def fail(self) -> None:
        with self.lock:
            self.failed += 1


def bearer_headers(key: str | None) -> dict[str, str]:
    """The OpenAI APIs' key header: ``Authorization: Bearer <key>``, where a key is set."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def backoff(attempt: int, base: float = 0.5, cap: float = 30.0, rng: Callable[[], float] = random.random) -> float:
    """Seconds to wait before retry ``attempt`` (0 first): ``base * 2**attempt`` up to ``cap``, half of it fixed and
    half drawn, so that tasks that failed together do not retry together."""
    delay = min(cap, base * (2**attempt))
    return delay / 2 + rng() * delay / 2


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The seconds a response's ``retry-after-ms`` or ``Retry-After`` (seconds, or an HTTP date) asks to wait, at most
    :data:`MAX_RETRY_AFTER_S`; ``None`` when it names none."""
    lowered = {k.lower(): v for k, v in headers.items()}
    seconds: float | None = None
    if "retry-after-ms" in lowered:
        try:
            seconds = float(lowered["retry-after-ms"]) / 1000
        except ValueError:
            pass
    if seconds is None and "retry-after" in lowered:
        value = lowered["retry-after"].strip()
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                return None
            seconds = when.timestamp() - (time.time() if now is None else now)
    return None if seconds is None else min(MAX_RETRY_AFTER_S, max(0.0, seconds))


class _CircuitBreaker:
    """Counts failed requests in a row across a process's threads; past the bound every request raises
    :class:`EndpointDown`."""

    def __init__(self, bound: int, where: str) -> None:
        self.bound, self.where = bound, where
        self.failures, self.down, self.last = 0, False, ""
        self.lock = threading.Lock()

    def check(self) -> None:
        if self.down:
            raise EndpointDown(self._line())

    def success(self) -> None:
        with self.lock:
            self.failures = 0

    def failure(self, error: str) -> None:
        with self.lock:
            self.failures += 1
            self.last = error
            if self.failures >= self.bound:
                self.down = True
        self.check()

    def _line(self) -> str:
        return f"endpoint {self.where} failed {self.failures} requests in a row; last: {self.last}"


class EndpointClient:
    """Requests to one OpenAI-compatible server, as ``settings`` (an endpoint's or, for a served engine, its
    settings with its ``url`` and ``model`` given) bound them.

    ``recover``: called after a connection error (a served engine restarts a crashed process through it); True when it
    brought the server back, and the request is then retried without counting as a failure. ``auth``: the headers
    every request carries for the key (the API's wire format says where the key goes; OpenAI's by default).
    """

    def __init__(
        self,
        settings: RemoteEndpoint | ServedEngine,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        recover: Callable[[], bool] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        auth: Callable[[str | None], Mapping[str, str]] | None = None,
    ) -> None:
        import httpx2

        self.settings, self.url, self.model = settings, url.rstrip("/"), model
        self._key = api_key
        self.recover, self.sleep = recover, sleep
        self.stats = ClientStats()
        self.breaker = _CircuitBreaker(settings.max_consecutive_failures, f"{self.url} (model {model})")
        self.limit = HostRateLimit(f"{self.url}\x00{model}", settings.requests_per_minute, settings.tokens_per_minute)
        headers = dict(
            (auth or bearer_headers)(api_key)
        )  # the body's type is each request's: JSON, or a multipart form
        self.http = httpx2.Client(
            headers=headers,
            timeout=httpx2.Timeout(settings.timeout_s, connect=min(10.0, settings.timeout_s)),
            limits=httpx2.Limits(max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency),
        )
        self._transport_errors = (httpx2.TransportError,)
        self._timeouts = (httpx2.TimeoutException,)
        self._received = (httpx2.ReadTimeout,)
        """A transport error after which the server holds the request (and may bill it): it was sent whole and no
        answer came in time."""

    @staticmethod
    def key_from_env(settings: RemoteEndpoint) -> str | None:
        """The API key from the environment variable ``settings.api_key_env`` names; ``EndpointRefused`` when it is
        named but not set (on a cluster: ``spark.executorEnv.<NAME>``)."""
        if settings.api_key_env is None:
            return None
        key = os.environ.get(settings.api_key_env)
        if not key:
            raise EndpointRefused(
                f"the endpoint's api_key_env names {settings.api_key_env}, which is not set on this host "
                f"(on a cluster set spark.executorEnv.{settings.api_key_env})"
            )
        return key

    def scrub(self, text: str) -> str:
        """``text`` without the API key or any ``Authorization`` value (:func:`scrub`)."""
        return scrub(text, (self._key,) if self._key else ())

    def close(self) -> None:
        self.http.close()

    def get(self, path: str) -> Reply | None:
        """``GET <url><path>``; ``None`` when the server does not answer it with JSON. Only a 429 is asked again (up to
        ``max_retries`` times, after what its ``Retry-After`` says): a server's pace, not its answer."""
        for attempt in range(self.settings.max_retries + 1):
            try:
                response = self.http.get(self.url + path)
                if response.status_code == 429 and attempt < self.settings.max_retries:
                    wait = retry_after(response.headers)
                    self.sleep(backoff(attempt) if wait is None else wait)
                    continue
                if response.status_code != 200:
                    return None
                return Reply(response.json(), {k.lower(): v for k, v in response.headers.items()})
            except (*self._transport_errors, ValueError):
                return None
        return None

    @overload
    def post(
        self,
        body: Mapping[str, Any],
        estimated_tokens: int,
        parse: Callable[[Mapping[str, Any]], A],
        path: str = ...,
        files: Mapping[str, tuple[str, bytes, str]] | None = ...,
    ) -> A: ...

    @overload
    def post(
        self,
        body: Mapping[str, Any],
        estimated_tokens: int = ...,
        parse: None = ...,
        path: str = ...,
        files: Mapping[str, tuple[str, bytes, str]] | None = ...,
    ) -> Reply: ...

    def post(
        self,
        body: Mapping[str, Any],
        estimated_tokens: int = 0,
        parse: Callable[[Mapping[str, Any]], Answer] | None = None,
        path: str = "/completions",
        files: Mapping[str, tuple[str, bytes, str]] | None = None,
    ) -> Answer:
        """``POST`` ``body`` to the API's ``path``, retried as the settings say; what ``parse`` makes of the answer's
        JSON (the :class:`Reply` without one). :class:`EndpointError` once it failed for good (a :class:`Malformed`
        answer, or one that is not JSON, is such a failure: not retried, counted toward the bound),
        :class:`EndpointDown` past the bound of failures in a row. The answer's ``tokens`` settle the token limit.
        With ``files`` (``{field: (file name, bytes, media type)}``) the request is a multipart form of ``body``'s
        fields and the files, as OpenAI's audio APIs take it; else ``body`` as JSON."""
        sent: dict[str, Any] = (
            {"data": dict(body), "files": dict(files)}
            if files is not None
            else {"content": json.dumps(body), "headers": {"Content-Type": "application/json"}}
        )
        attempts = self.settings.max_retries + 1
        for attempt in range(attempts):
            self.breaker.check()
            self.limit.acquire(estimated_tokens)
            status: int | None = None
            wait: float | None = None
            kind: str | None = None
            try:
                response = self.http.post(self.url + path, **sent)
            except self._transport_errors as exc:
                message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                kind = "timeout" if isinstance(exc, self._timeouts) else "connection"
                # Counted only where the server has the request (it timed out on the answer): an attempt that never
                # reached it (refused, a kept-alive connection it closed as the request came) is neither a request
                # nor a retry, or the run's figures and cost would exceed what the server received.
                received = isinstance(exc, self._received)
                self.stats.add(Traffic(requests=int(received)))
                if self.recover is not None and self.recover():
                    self.stats.add(Traffic(retries=int(received)))
                    continue
            else:
                received = True
                self.stats.add(Traffic(requests=1))
                status = response.status_code
                if status == 200:
                    kind = "malformed"
                    try:
                        payload = response.json()
                        result = parse(payload) if parse is not None else Reply(payload)
                    except Unfinished as exc:  # the server works; the row's answer is not the model's whole text
                        self.breaker.success()
                        self.stats.fail()
                        raise exc from None
                    except ValueError as exc:  # not JSON (json's error is a ValueError), or Malformed
                        message = (
                            f"a malformed answer: {exc}"
                            if isinstance(exc, Malformed)
                            else f"a response that is not JSON: {response.text[:200]!r}"
                        )
                    else:
                        self.breaker.success()
                        tokens = result.tokens
                        self.limit.settle(estimated_tokens, estimated_tokens if tokens is None else tokens)
                        return result
                else:
                    message = server_message(response)
                    wait = retry_after(response.headers)
            message = self.scrub(message)
            again = retryable(kind, status)
            if status == 429:
                self.stats.add(Traffic(rate_limited=1))
            else:
                self.breaker.failure(f"HTTP {status}: {message}" if status else message)
            if not again or attempt == attempts - 1:
                self.stats.fail()
                raise EndpointError(status, message, kind)
            self.stats.add(Traffic(retries=int(received)))
            self.sleep(backoff(attempt) if wait is None else wait)
        raise AssertionError("unreachable")


def server_message(response: Any) -> str:
    """The error a response carries: OpenAI's ``{"error": {"message": ..}}``, FastAPI's ``{"detail": ..}``, else its
    text, on one line of at most 500 characters."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    message: Any = None
    if isinstance(payload, Mapping):
        error = payload.get("error")
        message = error.get("message") if isinstance(error, Mapping) else error
        message = message or payload.get("detail") or payload.get("message")
    if message is None:
        message = response.text or response.reason_phrase
    if not isinstance(message, str):
        message = json.dumps(message)
    return " ".join(message.split())[:500]
