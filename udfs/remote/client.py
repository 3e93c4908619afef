"""The OpenAI-compatible client behind ``generate.endpoint`` and ``generate.server``: one request per row.

Each row's request is built from the generate settings (:func:`request_body`), sent by a pool of threads bounded per
task (``concurrency``), through a host-wide rate limit (:class:`~lakescore.udfs.remote.rate_limit.HostRateLimit`), with a
timeout per request and retries on the statuses of :data:`RETRY_STATUSES`, timeouts and lost connections: exponential backoff with jitter, or the
server's ``Retry-After``. A row that still fails is the row's :class:`EndpointError` (dead-lettered ``endpoint_error``
with the status and the server's message); past ``max_consecutive_failures`` failed requests in a row the client
raises :class:`EndpointDown` for every row in flight, which fails the task and the run in one line.

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
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from lakescore.udfs.options.remote import EndpointOptions, ServerOptions
from lakescore.udfs.models.model_source import ModelSourceError
from lakescore.udfs.remote.rate_limit import HostRateLimit

__all__ = [
    "EndpointError", "EndpointDown", "EndpointRefused", "Reply", "Completion", "ClientStats", "EndpointClient",
    "request_body", "parse_completion", "token_logprobs", "retry_after", "backoff", "Unhonoured", "Malformed",
    "Unfinished", "scrub", "FINISHED",
]

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
"""Statuses a request is retried on: the server's overload or a passing failure, never the request's own fault."""
MAX_RETRY_AFTER_S = 300.0
"""The longest ``Retry-After`` honoured; a server asking for more is waited this long."""
ESTIMATED_CHARS_PER_TOKEN = 4
"""How a prompt's tokens are guessed for the tokens-per-minute limit before the server counts them (OpenAI's rule of
thumb for English; the guess is settled from ``usage`` after)."""


FINISHED = ("stop", "length")
"""The ``finish_reason`` of a whole answer: the model stopped, or reached ``max_tokens``. Any other (``content_filter``,
``abort``, ``tool_calls``) is an answer that is not the model's whole text: dead-lettered ``endpoint_unfinished``."""

_AUTHORIZATION = re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?:[A-Za-z][\w-]*\s+)?[^\s\"',}\]]+|(bearer\s+)[^\s\"',}\]]+")


def scrub(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` without any of ``secrets`` and without any ``Authorization`` value or bearer token in it: the one
    scrubber every text from a server passes before it reaches a table, a log or the report (a server or a proxy may
    echo the request's headers in its error)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _AUTHORIZATION.sub(lambda m: (m.group(1) or m.group(2)) + "***", text)


class EndpointError(RuntimeError):
    """One row's request failed for good: ``status`` (``None`` for a connection error or timeout) and the server's
    message; ``kind`` says what happened (``status``: the server's error status, ``rate_limited``: 429 after every retry,
    ``timeout``, ``connection``, ``malformed``: a 200 whose body is not a whole OpenAI answer). The row is dead-lettered
    ``endpoint_error``."""

    reason = "endpoint_error"

    def __init__(self, status: Optional[int], message: str, kind: Optional[str] = None) -> None:
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

    reason = "endpoint_unfinished"

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


@dataclass(frozen=True)
class Reply:
    """A successful response's JSON body, and its headers (lower-case names)."""

    body: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Completion:
    """One row's answer: the text (cut before the first stop string), ``stop`` or ``length``, the tokens ``usage``
    reports (``None`` for both when the answer has no ``usage``: unknown, not 0) and, where the response holds them,
    each generated token's log-probability."""

    text: str
    finish_reason: str
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    token_logprobs: Optional[tuple[float, ...]] = None

    @property
    def tokens(self) -> Optional[int]:
        """Prompt and completion tokens together, as ``usage`` said; ``None`` when it said nothing."""
        return None if self.prompt_tokens is None else self.prompt_tokens + self.completion_tokens


@dataclass
class ClientStats:
    """What one process's client sent: requests, retries, of which answered 429, rows failed for good, and the
    tokens ``usage`` reported."""

    requests: int = 0
    retries: int = 0
    rate_limited: int = 0
    failed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    unmetered: int = 0
    """Answers published without ``usage``: their tokens are unknown, so a cost from ``usage`` is incomplete."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


def backoff(attempt: int, base: float = 0.5, cap: float = 30.0, rng: Callable[[], float] = random.random) -> float:
    """Seconds to wait before retry ``attempt`` (0 first): ``base * 2**attempt`` up to ``cap``, half of it fixed and
    half drawn, so that tasks that failed together do not retry together."""
    delay = min(cap, base * (2 ** attempt))
    return delay / 2 + rng() * delay / 2


def retry_after(headers: Mapping[str, str], now: Optional[float] = None) -> Optional[float]:
    """The seconds a response's ``retry-after-ms`` or ``Retry-After`` (seconds, or an HTTP date) asks to wait, at most
    :data:`MAX_RETRY_AFTER_S`; ``None`` when it names none."""
    lowered = {k.lower(): v for k, v in headers.items()}
    seconds: Optional[float] = None
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


def request_body(options: Any, endpoint_model: str, api: str, prompt: str, seed: Optional[int] = None,
                 image: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The request for one prompt under the generate settings ``options``: every setting mapped to its request
    field, none dropped (a server that cannot honour one refuses it, and the preflight says so). ``image``: a content
    part (``{"type": "image_url", ...}``) the user message holds before the prompt's text part (chat only)."""
    body: dict[str, Any] = {"model": endpoint_model, "max_tokens": options.max_new_tokens, "temperature": options.temperature}
    system = options.system_prompt
    if image is not None and api != "chat":
        raise ValueError("an image is sent through the chat API only")
    if api == "chat":
        user = prompt if image is None else [dict(image), {"type": "text", "text": prompt}]
        body["messages"] = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": user}]
    else:
        body["prompt"] = prompt if system is None else f"{system}\n\n{prompt}"
    if options.top_p < 1:
        body["top_p"] = options.top_p
    if seed is not None and not options.greedy:
        body["seed"] = seed
    if options.stop:
        body["stop"] = list(options.stop)
    if getattr(options, "logprobs", False):  # the chosen tokens' log-probabilities: a flag in chat, a count in completions
        body["logprobs"] = True if api == "chat" else 1
    if options.json_schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "row", "schema": json.loads(options.json_schema), "strict": True}}
    # vLLM's and SGLang's names for the sampling settings the OpenAI API lacks
    for setting, name, neutral in (("top_k", "top_k", 0), ("repetition_penalty", "repetition_penalty", 1.0),
                                   ("min_new_tokens", "min_tokens", 0), ("stop_token_ids", "stop_token_ids", ())):
        value = getattr(options, setting, None)
        if value is not None and value != neutral:
            body[name] = list(value) if isinstance(value, tuple) else value
    return body


def parse_completion(body: Mapping[str, Any], api: str, stop: Sequence[str] = (),
                     max_tokens: Optional[int] = None) -> Completion:
    """One response's :class:`Completion`, only when it is a whole, well-formed answer to the request:
    :class:`Malformed` naming what it lacks (no text, no ``finish_reason``, ``usage`` that is not two whole numbers of
    at least 0, or more completion tokens than the request's ``max_tokens``), :class:`Unfinished` for a
    ``finish_reason`` other than :data:`FINISHED`. The text is cut before the first ``stop`` string the server left in it
    (some servers keep it). An answer without ``usage`` has unknown (``None``) tokens."""
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"] if api == "chat" else choice["text"]
    except (KeyError, IndexError, TypeError):
        raise Malformed(f"the response holds no {'message' if api == 'chat' else 'text'}: {json.dumps(body)[:300]}") from None
    if text is not None and not isinstance(text, str):
        raise Malformed(f"the response's text is not a string: {json.dumps(text)[:100]}")
    finish = choice.get("finish_reason") if isinstance(choice, Mapping) else None
    if not isinstance(finish, str) or not finish:
        raise Malformed(f"the response has no finish_reason: {json.dumps(body)[:300]}")
    if finish not in FINISHED:
        raise Unfinished(finish)
    text = text or ""  # a model that stops at once: an empty text, finished, as in-process
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    if cut >= 0:
        text = text[:cut]
    prompt_tokens, completion_tokens = _usage(body.get("usage"), max_tokens)
    return Completion(text, finish, prompt_tokens, completion_tokens, token_logprobs(choice, api))


def _usage(usage: Any, max_tokens: Optional[int]) -> tuple[Optional[int], Optional[int]]:
    """``usage``'s prompt and completion tokens; ``(None, None)`` when the answer has none; :class:`Malformed` when
    they cannot be true (not whole numbers, below 0, more completion tokens than were allowed)."""
    if usage is None:
        return None, None
    counts = []
    for name in ("prompt_tokens", "completion_tokens"):
        value = usage.get(name) if isinstance(usage, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise Malformed(f"the response's usage is impossible ({name} {json.dumps(value)}): {json.dumps(usage)[:200]}")
        counts.append(value)
    if max_tokens is not None and counts[1] > max_tokens:
        raise Malformed(f"the response's usage is impossible ({counts[1]} completion tokens, {max_tokens} allowed)")
    return counts[0], counts[1]


def token_logprobs(choice: Mapping[str, Any], api: str) -> Optional[tuple[float, ...]]:
    """The generated tokens' log-probabilities in a response's ``choice``: the chat API's ``logprobs.content[].logprob``,
    the completions API's ``logprobs.token_logprobs``; ``None`` when it holds none (a server that ignored the
    request's ``logprobs``)."""
    found = choice.get("logprobs")
    if not isinstance(found, Mapping):
        return None
    try:
        if api == "chat":
            content = found.get("content")
            return None if content is None else tuple(float(token["logprob"]) for token in content)
        values = found.get("token_logprobs")
        return None if values is None else tuple(float(v) for v in values)
    except (KeyError, TypeError, ValueError):
        return None


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
    """Requests to one OpenAI-compatible server, as ``settings`` (:class:`EndpointOptions` or, for a served engine,
    :class:`ServerOptions` with its ``url`` and ``model`` given) bound them.

    ``recover``: called after a connection error (a served engine restarts a crashed process through it); True when it
    brought the server back, and the request is then retried without counting as a failure.
    """

    def __init__(self, settings: EndpointOptions | ServerOptions, url: str, model: str, *, api_key: Optional[str] = None,
                 recover: Optional[Callable[[], bool]] = None, sleep: Callable[[float], None] = time.sleep) -> None:
        import httpx2

        self.settings, self.url, self.model = settings, url.rstrip("/"), model
        self.api = getattr(settings, "api", None)  # generate's: which route prompts go to (an embed head names its own)
        self._key = api_key
        self.recover, self.sleep = recover, sleep
        self.stats = ClientStats()
        self.breaker = _CircuitBreaker(settings.max_consecutive_failures, f"{self.url} (model {model})")
        self.limit = HostRateLimit(f"{self.url}\x00{model}", settings.requests_per_minute, settings.tokens_per_minute)
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.http = httpx2.Client(
            headers=headers, timeout=httpx2.Timeout(settings.timeout_s, connect=min(10.0, settings.timeout_s)),
            limits=httpx2.Limits(max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency),
        )
        self._transport_errors = (httpx2.TransportError,)
        self._timeouts = (httpx2.TimeoutException,)
        self._received = (httpx2.ReadTimeout,)
        """A transport error after which the server holds the request (and may bill it): it was sent whole and no
        answer came in time."""

    @staticmethod
    def key_from_env(settings: EndpointOptions) -> Optional[str]:
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

    @property
    def path(self) -> str:
        return "/chat/completions" if self.api == "chat" else "/completions"

    def get(self, path: str) -> Optional[Reply]:
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

    def post(self, body: Mapping[str, Any], estimated_tokens: int = 0,
             parse: Optional[Callable[[Mapping[str, Any]], Any]] = None, path: Optional[str] = None) -> Any:
        """``POST`` ``body`` to the API (``path``, default the generate API's :attr:`path`), retried as the settings say; what ``parse`` makes of the answer's JSON (the
        :class:`Reply` without one). :class:`EndpointError` once it failed for good (a :class:`Malformed` answer, or one
        that is not JSON, is such a failure: not retried, counted toward the bound), :class:`EndpointDown` past the
        bound of failures in a row. ``parse``'s result, when it has ``tokens``, settles the token limit."""
        attempts = self.settings.max_retries + 1
        for attempt in range(attempts):
            self.breaker.check()
            self.limit.acquire(estimated_tokens)
            status: Optional[int] = None
            wait: Optional[float] = None
            kind: Optional[str] = None
            try:
                response = self.http.post(self.url + (path or self.path), content=json.dumps(body))
            except self._transport_errors as exc:
                message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                kind = "timeout" if isinstance(exc, self._timeouts) else "connection"
                # Counted only where the server has the request (it timed out on the answer): an attempt that never
                # reached it (refused, a kept-alive connection it closed as the request came) is neither a request
                # nor a retry, or the run's figures and cost would exceed what the server received.
                received = isinstance(exc, self._received)
                self.stats.add(requests=int(received))
                if self.recover is not None and self.recover():
                    self.stats.add(retries=int(received))
                    continue
            else:
                received = True
                self.stats.add(requests=1)
                status = response.status_code
                if status == 200:
                    kind = "malformed"
                    try:
                        payload = response.json()
                        result = parse(payload) if parse is not None else Reply(payload)
                    except Unfinished as exc:  # the server works; the row's answer is not the model's whole text
                        self.breaker.success()
                        self.stats.add(failed=1)
                        raise exc from None
                    except ValueError as exc:  # not JSON (json's error is a ValueError), or Malformed
                        message = (f"a malformed answer: {exc}" if isinstance(exc, Malformed)
                                   else f"a response that is not JSON: {response.text[:200]!r}")
                    else:
                        self.breaker.success()
                        tokens = getattr(result, "tokens", None)
                        self.limit.settle(estimated_tokens, estimated_tokens if tokens is None else tokens)
                        return result
                else:
                    message = _server_message(response)
                    wait = retry_after(response.headers)
            message = self.scrub(message)
            retryable = kind in ("timeout", "connection") or status in RETRY_STATUSES
            if status == 429:
                self.stats.add(rate_limited=1)
            else:
                self.breaker.failure(f"HTTP {status}: {message}" if status else message)
            if not retryable or attempt == attempts - 1:
                self.stats.add(failed=1)
                raise EndpointError(status, message, kind)
            self.stats.add(retries=int(received))
            self.sleep(backoff(attempt) if wait is None else wait)
        raise AssertionError("unreachable")

    def complete(self, options: Any, prompt: str, seed: Optional[int] = None,
                 image: Optional[Mapping[str, Any]] = None) -> Completion:
        """One prompt's :class:`Completion` under the generate settings ``options``, with ``image`` (a content part)
        before it where given (errors as :meth:`post`). The tokens-per-minute guess counts the prompt's text only (an
        image's tokens are the server's to count); ``usage`` settles it."""
        body = request_body(options, self.model, self.api, prompt, seed, image)
        estimate = len(prompt) // ESTIMATED_CHARS_PER_TOKEN + 1 + options.max_new_tokens
        completion = self.post(body, estimate, lambda answer: parse_completion(answer, self.api, options.stop,
                                                                               options.max_new_tokens))
        if completion.tokens is None:
            self.stats.add(unmetered=1)
        else:
            self.stats.add(tokens_in=completion.prompt_tokens, tokens_out=completion.completion_tokens)
        return completion


def _server_message(response: Any) -> str:
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
