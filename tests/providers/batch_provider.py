"""A Batch API provider for the test suite: OpenAI's Files + Batches and Anthropic's Messages and Message Batches as
their published contracts (and the ``openai`` / ``anthropic`` clients' types) define them, each line executed on a
real OpenAI-compatible upstream (``transformers serve`` over a tiny model; :class:`EmbeddingModel`, a real
sentence-transformers model, for ``/v1/embeddings``) or, with ``cheap``, answered in-process
(an echo of the prompt with plausible ``usage``) so a million lines are feasible. Batches move through their states on
a background thread; :class:`Faults` injects what users of real providers report (results in any order, error lines,
lines absent from every file, expired batches, refused files) deterministically by ``custom_id``; the provider keeps
its own record of what it executed so a test can audit a client against it.

In a test: ``with batch_provider(upstream_url) as provider: ...`` (``provider.url`` is the OpenAI base URL, ``.root``
Anthropic's, ``.key`` the key both want). Standalone (benchmarks, a driver killed while the provider stays up):
``python -m tests.providers.batch_provider --cheap --port 8765`` prints its URL and serves until interrupted."""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

HOST = "127.0.0.1"
CACHE_BREAKPOINT = "_cache_breakpoint"
"""Where :func:`messages_to_chat` notes an Anthropic request's ``cache_control`` breakpoint for the cache rule."""
HINT_FIELDS = ("prompt_cache_key", CACHE_BREAKPOINT)
"""What a request carries for the provider's cache and the upstream never sees."""
HINTS_KEPT = 10_000
"""The requests whose hints :attr:`BatchProvider.cache_hints` keeps: a million-line benchmark's would fill memory."""
OPENAI_BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
DAY_S = 24 * 3600
CHEAP_MODEL = "cheap-echo"
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "server_error",
}


@dataclass(frozen=True)
class Pick:
    """Which lines a fault hits, by ``custom_id`` alone so a rerun hits the same ones: those in ``ids`` and a seeded
    ``fraction`` of the rest. ``times`` is how many submissions of a hit line the fault lasts (``None``: all of them);
    the default 1 makes a resubmitted line succeed."""

    ids: frozenset[str] = frozenset()
    fraction: float = 0.0
    seed: int = 0
    times: int | None = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", frozenset(self.ids))

    def hits(self, custom_id: str, attempt: int) -> bool:
        """Whether the line's ``attempt``-th submission (from 1) is hit."""
        if self.times is not None and attempt > self.times:
            return False
        if custom_id in self.ids:
            return True
        digest = hashlib.sha256(f"{self.seed}:{custom_id}".encode()).digest()
        return self.fraction > 0 and int.from_bytes(digest[:8], "big") / 2**64 < self.fraction


@dataclass
class Faults:
    """The faults a provider instance injects; tests set them before they submit."""

    shuffle: bool = True
    """Results in an order of their own (seeded by the batch id), as every provider documents."""
    status: dict[int, Pick] = field(default_factory=dict)
    """Lines answered with this HTTP status without running (429, 500: retryable; 400: the content's fault): OpenAI's
    error file, Anthropic's ``errored`` result."""
    vanish: Pick = field(default_factory=Pick)
    """Lines run upstream but absent from every result file (counted ``completed``, as users report)."""
    expire_batches: int = 0
    """The next this many batches created expire once half their lines are done."""
    expired_in_error_file: bool = True
    """OpenAI documents an expired batch's unfinished lines in its error file (``batch_expired``); off: absent."""
    expired: Pick = field(default_factory=Pick)
    """Anthropic: lines whose result is ``expired`` in a batch that otherwise ends normally."""
    canceled: Pick = field(default_factory=Pick)
    """Anthropic: lines whose result is ``canceled``."""
    cached_prompt_tokens: int = 0
    """Prompt tokens every answer reports as read from a prompt cache (at most its prompt's)."""
    cache_prefix_words: int = 0
    """A prompt cache by prefix (0: none): a request run upstream whose prompt text (system and user parts, joined by a
    blank) begins with the same first ``cache_prefix_words`` words as one run upstream before it, on any route, reports
    that many of its prompt tokens (at most all of them) as read from the cache, one token a word; the first request
    of a prefix reports none. Decided as each request reaches the upstream, under the provider's lock, so a prefix's
    ``n`` requests report it ``n - 1`` times in whatever order they run. What the answers reported is
    :attr:`BatchProvider.cached_delivered`. The providers' hints change the rule as they change the real ones' caches:
    OpenAI's ``prompt_cache_key`` routes a key's requests to one cache, so a prefix counts as seen under the same key
    only; a request with Anthropic's ``cache_control`` is cached by its breakpoint instead (the system prompt and the
    user's text up to the marked block, one token a word, whatever ``cache_prefix_words``): read where a request
    marked the same text before, else written (``cache_creation_input_tokens``). Each request's hint is recorded in
    :attr:`BatchProvider.cache_hints`."""
    refuse_every: int = 0
    """Every so many per-row requests (``/v1/messages``, chat, completions, embeddings) answered 429."""
    retry_after_s: int = 1


class Upstream(Protocol):
    """Runs one OpenAI-style request (``path`` such as ``/v1/chat/completions``): ``(status, JSON body)``."""

    def call(self, path: str, body: dict) -> tuple[int, dict]: ...


class HttpUpstream:
    """An OpenAI-compatible server at ``base_url`` (ending in ``/v1``)."""

    def __init__(self, base_url: str, timeout: float = 300.0) -> None:
        self.base_url, self.timeout = base_url.rstrip("/"), timeout

    def call(self, path: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(
            self.base_url + path.removeprefix("/v1"),
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                return error.code, json.loads(text)
            except ValueError:
                return error.code, {"error": {"message": text, "type": "upstream_error"}}
        except (urllib.error.URLError, OSError) as error:
            return 502, {"error": {"message": f"upstream unreachable: {error}", "type": "server_error"}}


def prompt_text(body: dict) -> str:
    """The prompt of an OpenAI-style request: its messages' text parts joined by a blank, or its ``prompt``."""
    if "messages" in body:
        parts = []
        for message in body["messages"]:
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(part.get("text", "") for part in content if part.get("type") == "text")
        return " ".join(parts)
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


class EmbeddingModel:
    """Answers ``/v1/embeddings`` with a real sentence-transformers ``model`` in this process (``transformers serve``
    has no embeddings route): each input truncated at the request's ``truncate_prompt_tokens`` (absent or -1: the
    model's own limit), pooled and normalised by the model's own modules, ``usage`` its tokens; one request at a
    time."""

    def __init__(self, model: Any) -> None:
        self.model, self.lock = model, threading.Lock()

    def call(self, path: str, body: dict) -> tuple[int, dict]:
        if path != "/v1/embeddings":
            return 404, _openai_error(404, f"this server only embeds, not {path}")
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
        limit = body.get("truncate_prompt_tokens")
        with self.lock:
            own = self.model.max_seq_length
            self.model.max_seq_length = min(limit, own) if isinstance(limit, int) and limit > 0 else own
            try:
                vectors = self.model.encode(inputs, convert_to_numpy=True)
                tokens = sum(
                    len(self.model.tokenizer(text, truncation=True, max_length=self.model.max_seq_length)["input_ids"])
                    for text in inputs
                )
            finally:
                self.model.max_seq_length = own
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return 200, {"object": "list", "data": data, "model": body.get("model"), "usage": usage}


class CheapUpstream:
    """Answers in-process and deterministically: the prompt's first ``max_tokens`` words back, one token a word."""

    def call(self, path: str, body: dict) -> tuple[int, dict]:
        created, model = int(time.time()), body.get("model") or CHEAP_MODEL
        if path == "/v1/embeddings":
            inputs = body.get("input")
            inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
            data = [
                {"object": "embedding", "index": i, "embedding": _vector(str(text))} for i, text in enumerate(inputs)
            ]
            tokens = sum(len(str(text).split()) + 1 for text in inputs)
            return 200, {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        words = prompt_text(body).split()
        limit = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        text, finish = " ".join(words[:limit]), "length" if len(words) > limit else "stop"
        usage = {"prompt_tokens": len(words) + 1, "completion_tokens": min(len(words), limit)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        ident = "cmpl-" + uuid.uuid4().hex[:24]
        if path == "/v1/completions":
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            return 200, {
                "id": ident,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        return 200, {
            "id": "chatcmpl-" + ident[5:],
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage,
        }


def _vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [round(byte / 255.0 - 0.5, 6) for byte in digest[:8]]


def _cached_of(answer: dict) -> int:
    """The prompt tokens an OpenAI-style answer reports read from a cache."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    return int(((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


CACHE_WRITTEN = "_cache_written"
"""Where an answer to a request with a ``cache_control`` breakpoint holds the tokens written to the cache, until
:func:`chat_to_message` reports them as Anthropic does."""


def _written_of(answer: dict) -> int:
    """The prompt tokens an answer (OpenAI-style, before :func:`chat_to_message`) reports written to a cache."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    return int((usage or {}).get(CACHE_WRITTEN) or 0)


def _with_cached(answer: dict, cached: int, written: int = 0) -> dict:
    """``answer`` with ``cached`` of its prompt tokens reported as read from cache (OpenAI's place for them) and
    ``written`` of the rest as written to it (for :func:`chat_to_message`)."""
    usage = answer.get("usage")
    if isinstance(usage, dict) and "prompt_tokens" in usage:
        prompt = int(usage["prompt_tokens"])
        if cached:
            usage["prompt_tokens_details"] = {"cached_tokens": min(cached, prompt)}
        if written:
            usage[CACHE_WRITTEN] = min(written, prompt - min(cached, prompt))
    return answer


def _upstream_body(body: dict) -> dict:
    """``body`` without what only the provider reads (:data:`HINT_FIELDS`), as OpenAI and Anthropic take their hints
    and send the model the rest."""
    return {key: value for key, value in body.items() if key not in HINT_FIELDS}


def messages_to_chat(params: dict) -> dict:
    """An Anthropic Messages request as the OpenAI chat completions request that asks the same."""
    messages: list[dict] = []
    system = params.get("system")
    if system:
        text = system if isinstance(system, str) else "".join(b.get("text", "") for b in system)
        messages.append({"role": "system", "content": text})
    marked: list[str] = []  # the user's text up to the cache_control block, where one is marked
    for message in params.get("messages") or []:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for block in content:
                if block.get("type") == "text":
                    parts.append({"type": "text", "text": block["text"]})
                    if block.get("cache_control") is not None:
                        marked.append("".join(part["text"] for part in parts if part["type"] == "text"))
                elif block.get("type") == "image":
                    source = block.get("source") or {}
                    url = source.get("url") or f"data:{source.get('media_type')};base64,{source.get('data')}"
                    parts.append({"type": "image_url", "image_url": {"url": url}})
            if all(part["type"] == "text" for part in parts):
                content = "".join(part["text"] for part in parts)
            else:
                content = parts
        messages.append({"role": message.get("role"), "content": content})
    body: dict[str, Any] = {"model": params.get("model"), "messages": messages, "max_tokens": params.get("max_tokens")}
    if marked:  # the provider's own note, taken off before the upstream sees the request (_upstream_body)
        body[CACHE_BREAKPOINT] = {"system": messages[0]["content"] if system else "", "text": marked[-1]}
    for key in ("temperature", "top_p"):
        if key in params:
            body[key] = params[key]
    if params.get("stop_sequences"):
        body["stop"] = params["stop_sequences"]
    output_format = (params.get("output_config") or {}).get("format")
    if output_format and output_format.get("type") == "json_schema":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "row", "schema": output_format["schema"], "strict": True},
        }
    return body


def chat_to_message(answer: dict, model: str) -> dict:
    """An OpenAI chat completion as the Anthropic Message it stands for. Anthropic's ``input_tokens`` leaves out the
    tokens read from and written to the cache (``cache_read_input_tokens``, ``cache_creation_input_tokens``); OpenAI's
    ``prompt_tokens`` holds them."""
    choice = (answer.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or ""
    usage = answer.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    written = int(usage.get(CACHE_WRITTEN) or 0)
    return {
        "id": "msg_" + uuid.uuid4().hex[:24],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "max_tokens" if choice.get("finish_reason") == "length" else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt - cached - written,
            "output_tokens": int(usage.get("completion_tokens") or 0),
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": written,
        },
    }


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def _openai_error(status: int, message: str, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": OPENAI_ERROR_TYPES.get(status, "invalid_request_error"),
            "param": None,
            "code": code,
        }
    }


def _anthropic_error(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": message}}


class HttpError(Exception):
    """An answer other than 2xx: its status and JSON body."""

    def __init__(self, status: int, body: dict) -> None:
        super().__init__(status)
        self.status, self.body = status, body


@dataclass
class _Outcome:
    """What became of one line: ``kind`` is ok, http (a non-2xx answer), vanished, expired, canceled."""

    custom_id: str
    kind: str
    status: int = 200
    body: dict | None = None


@dataclass
class _Batch:
    kind: str  # "openai" or "anthropic"
    id: str
    created_at: float
    endpoint: str = "/v1/messages"
    input_file_id: str = ""
    completion_window: str = "24h"
    metadata: dict | None = None
    status: str = "validating"
    times: dict[str, float] = field(default_factory=dict)
    errors: list[dict] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    counts: Counter = field(default_factory=Counter)
    total: int = 0
    expire: bool = False
    cancel: threading.Event = field(default_factory=threading.Event)
    requests: list[dict] | None = None  # Anthropic: the submitted requests until processed
    results_path: Path | None = None
    usage: Counter = field(default_factory=Counter)
    model: str | None = None


class BatchProvider:
    """The provider: an HTTP server on a free loopback port (or ``port``), its files on disk under a temporary folder.

    :attr:`executions` counts each ``custom_id``'s runs upstream; :attr:`executed_after_result` lists the lines run
    again after a result for them was delivered (a client that pays twice); :meth:`request_counts` gives the
    provider's own counts. ``min_seconds`` keeps every batch running at least that long, so clients poll."""

    def __init__(
        self,
        upstream: str | Upstream | None = None,
        *,
        cheap: bool = False,
        key: str = "sk-test-batch-key",
        port: int = 0,
        min_seconds: float = 0.0,
        concurrency: int = 4,
        batch_slots: int = 2,
        max_requests_per_file: int = 50_000,
        max_bytes_per_file: int = 200 * 1024 * 1024,
        faults: Faults | None = None,
    ) -> None:
        if (upstream is None) == (not cheap):
            raise ValueError("a BatchProvider needs an upstream (its URL or an Upstream) or cheap=True, not both")
        self.upstream: Upstream = (
            HttpUpstream(upstream)
            if isinstance(upstream, str)
            else upstream
            if upstream is not None
            else CheapUpstream()
        )
        self.key, self.min_seconds, self.concurrency = key, min_seconds, concurrency
        self.max_requests_per_file, self.max_bytes_per_file = max_requests_per_file, max_bytes_per_file
        self.faults = faults or Faults()
        self.executions: Counter[str] = Counter()
        self.executed_after_result: list[str] = []
        self.delivered: set[str] = set()
        self.cached_delivered = 0
        """Prompt tokens reported read from a prompt cache, over the answers delivered (a batch's results, per-row
        answers): what a client's report of cached tokens must equal."""
        self.written_delivered = 0
        """Prompt tokens reported written to the prompt cache (Anthropic's ``cache_creation_input_tokens``), over the
        answers delivered: what a client's report of cache writes must equal."""
        self.prefixes_seen: set[tuple[str | None, ...]] = set()
        self.breakpoints_seen: set[tuple[str, str]] = set()
        self.cache_hints: deque[tuple[str, str | None]] = deque(maxlen=HINTS_KEPT)
        """Each request run upstream (per row or a batch's line), the last :data:`HINTS_KEPT`: its prompt text (system
        and user parts, joined by a blank) and its cache hint: the ``prompt_cache_key``, or the text of the user's
        blocks up to the one marked ``cache_control``, or ``None``."""
        self.submissions: Counter[str] = Counter()
        self.row_requests = 0
        self.key_headers: Counter[str] = Counter()
        """Requests by the header that carried the key (``x-api-key``, ``authorization``; ``none``: no valid key)."""
        self.lock = threading.Lock()
        self.folder = Path(tempfile.mkdtemp(prefix="batch-provider-"))
        self.files: dict[str, dict] = {}
        self.batches: dict[str, _Batch] = {}
        self.slots = threading.Semaphore(batch_slots)
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="batch-line")
        self.httpd = ThreadingHTTPServer((HOST, port), _handler(self))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="batch-provider")

    @property
    def root(self) -> str:
        """Anthropic's base URL (its paths start with ``/v1``)."""
        return f"http://{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL."""
        return self.root + "/v1"

    def __enter__(self) -> BatchProvider:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for batch in list(self.batches.values()):
            batch.cancel.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def request_counts(self) -> dict[str, dict[str, int]]:
        """Each batch's counts as its API reports them, by batch id."""
        with self.lock:
            return {batch.id: self._counts(batch) for batch in self.batches.values()}

    def wait(self, batch_id: str, timeout: float = 120.0) -> None:
        """Block until the batch has reached a final state."""
        deadline = time.monotonic() + timeout
        while self.batches[batch_id].status not in ("failed", "completed", "expired", "cancelled", "ended"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} still {self.batches[batch_id].status}")
            time.sleep(0.05)

    # files

    def _store_file(self, data: bytes, filename: str, purpose: str) -> dict:
        file_id = "file-" + uuid.uuid4().hex[:24]
        (self.folder / file_id).write_bytes(data)
        record = {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
        with self.lock:
            self.files[file_id] = record
        return record

    def _file(self, file_id: str) -> dict:
        with self.lock:
            record = self.files.get(file_id)
        if record is None:
            raise HttpError(404, _openai_error(404, f"No such File object: {file_id}"))
        return record

    # OpenAI batches

    def _openai_view(self, batch: _Batch) -> dict:
        times = {
            f"{name}_at": int(batch.times[name]) if name in batch.times else None
            for name in ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
        }
        usage = None
        if batch.usage:
            usage = {
                "input_tokens": batch.usage["input"],
                "input_tokens_details": {"cached_tokens": batch.usage["cached"]},
                "output_tokens": batch.usage["output"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": batch.usage["input"] + batch.usage["output"],
            }
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "model": batch.model,
            "errors": None if batch.errors is None else {"object": "list", "data": batch.errors},
            "input_file_id": batch.input_file_id,
            "completion_window": batch.completion_window,
            "status": batch.status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": int(batch.created_at),
            "expires_at": int(batch.created_at) + DAY_S,
            **times,
            "request_counts": self._counts(batch),
            "metadata": batch.metadata,
            "usage": usage,
        }

    def _counts(self, batch: _Batch) -> dict[str, int]:
        if batch.kind == "openai":
            return {"total": batch.total, "completed": batch.counts["completed"], "failed": batch.counts["failed"]}
        ended = batch.status == "ended"
        counts = {name: batch.counts[name] if ended else 0 for name in ("succeeded", "errored", "canceled", "expired")}
        return {"processing": 0 if ended else batch.total, **counts}

    def create_openai_batch(self, body: dict) -> dict:
        endpoint, file_id = body.get("endpoint"), body.get("input_file_id")
        if endpoint not in OPENAI_BATCH_ENDPOINTS:
            raise HttpError(
                400,
                _openai_error(
                    400, f"Invalid endpoint {endpoint!r}: one of {', '.join(OPENAI_BATCH_ENDPOINTS)}", "invalid_value"
                ),
            )
        if body.get("completion_window") != "24h":
            raise HttpError(400, _openai_error(400, "completion_window must be '24h'", "invalid_value"))
        record = self._file(str(file_id))
        if record["purpose"] != "batch":
            raise HttpError(400, _openai_error(400, f"File {file_id} has purpose {record['purpose']!r}, not 'batch'"))
        batch = _Batch(
            "openai",
            "batch_" + uuid.uuid4().hex[:24],
            time.time(),
            endpoint=endpoint,
            input_file_id=str(file_id),
            metadata=body.get("metadata"),
        )
        self._register(batch)
        view = self._openai_view(batch)
        threading.Thread(target=self._guarded, args=(self._run_openai, batch), daemon=True, name=batch.id).start()
        return view

    def _guarded(self, run, batch: _Batch) -> None:
        """Run a batch; a fault of this server's own ends the batch failed with its reason rather than hanging it."""
        try:
            run(batch)
        except Exception as error:  # noqa: BLE001 (any fault here is the test server's, reported on the batch)
            with self.lock:
                batch.errors = [{"code": "server_error", "line": None, "param": None, "message": repr(error)}]
                batch.status = "ended" if batch.kind == "anthropic" else "failed"
                batch.times["failed"] = time.time()

    def _register(self, batch: _Batch) -> None:
        with self.lock:
            if self.faults.expire_batches > 0:
                self.faults.expire_batches -= 1
                batch.expire = True
            self.batches[batch.id] = batch

    def _validate_openai(self, batch: _Batch) -> list[tuple[str, str, dict]] | None:
        path = self.folder / batch.input_file_id
        errors, lines, seen, models = [], [], set(), set()
        size = path.stat().st_size
        if size > self.max_bytes_per_file:
            errors.append(
                {
                    "code": "file_too_large",
                    "line": None,
                    "param": None,
                    "message": f"The input file is {size} bytes; at most {self.max_bytes_per_file} are allowed.",
                }
            )
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    line = json.loads(raw)
                    custom_id, method, url, request = line["custom_id"], line["method"], line["url"], line["body"]
                except (ValueError, KeyError, TypeError):
                    errors.append(
                        {
                            "code": "invalid_json_line",
                            "line": number,
                            "param": None,
                            "message": "This line is not valid JSON or lacks custom_id, method, url or body.",
                        }
                    )
                    continue
                if custom_id in seen:
                    errors.append(
                        {
                            "code": "duplicate_custom_id",
                            "line": number,
                            "param": "custom_id",
                            "message": f"The custom_id {custom_id!r} is used by more than one request.",
                        }
                    )
                if method != "POST":
                    errors.append(
                        {
                            "code": "invalid_method",
                            "line": number,
                            "param": "method",
                            "message": "Only POST requests are supported in a batch.",
                        }
                    )
                if url != batch.endpoint:
                    errors.append(
                        {
                            "code": "mismatched_endpoint",
                            "line": number,
                            "param": "url",
                            "message": f"The url {url!r} does not match the batch's endpoint {batch.endpoint!r}.",
                        }
                    )
                models.add(request.get("model"))
                if len(models) > 1:
                    errors.append(
                        {
                            "code": "mismatched_model",
                            "line": number,
                            "param": "body.model",
                            "message": "Every request in a batch must use the same model.",
                        }
                    )
                    models = {request.get("model")}
                seen.add(custom_id)
                lines.append((custom_id, url, request))
        if not lines and not errors:
            errors.append({"code": "empty_file", "line": None, "param": None, "message": "The input file is empty."})
        if len(lines) > self.max_requests_per_file:
            errors.append(
                {
                    "code": "too_many_requests",
                    "line": None,
                    "param": None,
                    "message": f"The input file holds {len(lines)} requests; at most "
                    f"{self.max_requests_per_file} are allowed.",
                }
            )
        if errors:
            with self.lock:
                batch.errors, batch.status, batch.times["failed"] = errors[:100], "failed", time.time()
            return None
        batch.model = next(iter(models), None)
        return lines

    def _run_openai(self, batch: _Batch) -> None:
        lines = self._validate_openai(batch)
        if lines is None:
            return
        with self.lock:
            batch.total, batch.status, batch.times["in_progress"] = len(lines), "in_progress", time.time()
            for custom_id, _, _ in lines:
                self.submissions[custom_id] += 1
        with self.slots:
            outcomes = self._execute(batch, lines)
        self._hold(batch)
        with self.lock:
            batch.times["finalizing"] = time.time()
            if batch.status != "cancelling":
                batch.status = "finalizing"
        output, errors = [], []
        for outcome in outcomes:
            self._openai_line(batch, outcome, output, errors)
        rng = random.Random(batch.id)
        if self.faults.shuffle:
            rng.shuffle(output)
            rng.shuffle(errors)
        output_id = (
            self._store_file(b"".join(output), f"{batch.id}_output.jsonl", "batch_output")["id"] if output else None
        )
        error_id = (
            self._store_file(b"".join(errors), f"{batch.id}_error.jsonl", "batch_output")["id"] if errors else None
        )
        with self.lock:
            batch.output_file_id, batch.error_file_id = output_id, error_id
            final = "cancelled" if batch.cancel.is_set() else "expired" if batch.expire else "completed"
            batch.status, batch.times[final] = final, time.time()

    def _openai_line(self, batch: _Batch, outcome: _Outcome, output: list, errors: list) -> None:
        line: dict[str, Any] = {
            "id": "batch_req_" + uuid.uuid4().hex[:24],
            "custom_id": outcome.custom_id,
            "response": None,
            "error": None,
        }
        if outcome.kind == "vanished":
            batch.counts["completed"] += 1
            return
        if outcome.kind in ("expired", "canceled"):
            if outcome.kind == "expired" and not self.faults.expired_in_error_file:
                return
            code, message = (
                ("batch_expired", "This request could not be executed before the completion window expired.")
                if outcome.kind == "expired"
                else ("batch_cancelled", "This request was not executed: the batch was cancelled.")
            )
            line["error"] = {"code": code, "message": message}
            batch.counts["failed"] += 1
            errors.append(json.dumps(line).encode() + b"\n")
            return
        line["response"] = {
            "status_code": outcome.status,
            "request_id": "req_" + uuid.uuid4().hex[:24],
            "body": outcome.body,
        }
        ok = 200 <= outcome.status < 300
        batch.counts["completed" if ok else "failed"] += 1
        (output if ok else errors).append(json.dumps(line).encode() + b"\n")

    def _hold(self, batch: _Batch) -> None:
        """Keep the batch running until ``min_seconds`` after it was created (or it is cancelled)."""
        remaining = batch.created_at + self.min_seconds - time.time()
        if remaining > 0:
            batch.cancel.wait(remaining)

    def _execute(self, batch: _Batch, lines: list[tuple[str, str, dict]]) -> list[_Outcome]:
        """Each line's outcome; lines past half of an expiring batch, or after a cancel, never run."""
        half = len(lines) // 2 if batch.expire else len(lines)

        def one(index: int) -> _Outcome:
            custom_id, path, request = lines[index]
            if index >= half:
                return _Outcome(custom_id, "expired")
            if batch.cancel.is_set():
                return _Outcome(custom_id, "canceled")
            return self._line(batch, custom_id, path, request)

        if isinstance(self.upstream, CheapUpstream):
            return [one(index) for index in range(len(lines))]
        return list(self.pool.map(one, range(len(lines))))

    def _line(self, batch: _Batch, custom_id: str, path: str, request: dict) -> _Outcome:
        faults = self.faults
        attempt = self.submissions[custom_id]
        for status, pick in faults.status.items():
            if pick.hits(custom_id, attempt):
                body = (
                    _anthropic_error(status, f"injected {status}")
                    if batch.kind == "anthropic"
                    else _openai_error(status, f"injected {status} for {custom_id}")
                )
                return _Outcome(custom_id, "http", status, body)
        if batch.kind == "anthropic":
            for kind, pick in (("expired", faults.expired), ("canceled", faults.canceled)):
                if pick.hits(custom_id, attempt):
                    return _Outcome(custom_id, kind)
        cached, written = self.cache_read(request)
        status, body = self.upstream.call(path, _upstream_body(request))
        if 200 <= status < 300:
            body = _with_cached(body, cached, written)
        vanished = 200 <= status < 300 and faults.vanish.hits(custom_id, attempt)
        with self.lock:
            if custom_id in self.delivered:
                self.executed_after_result.append(custom_id)
            self.executions[custom_id] += 1
            if 200 <= status < 300 and not vanished:
                self.delivered.add(custom_id)
                self.cached_delivered += _cached_of(body)
                self.written_delivered += _written_of(body)
                usage = body.get("usage") or {}
                batch.usage["input"] += int(usage.get("prompt_tokens") or 0)
                batch.usage["output"] += int(usage.get("completion_tokens") or 0)
                batch.usage["cached"] += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return _Outcome(custom_id, "vanished" if vanished else "http", status, body)

    def cancel_openai(self, batch_id: str) -> dict:
        batch = self._batch(batch_id, "openai")
        with self.lock:
            if batch.status in ("validating", "in_progress", "finalizing"):
                batch.status, batch.times["cancelling"] = "cancelling", time.time()
                batch.cancel.set()
            elif batch.status not in ("cancelling", "cancelled"):
                raise HttpError(400, _openai_error(400, f"Cannot cancel a batch with status {batch.status}."))
        return self._openai_view(batch)

    def _batch(self, batch_id: str, kind: str) -> _Batch:
        with self.lock:
            batch = self.batches.get(batch_id)
        if batch is None or batch.kind != kind:
            raise HttpError(
                404,
                _openai_error(404, f"No such batch: {batch_id}")
                if kind == "openai"
                else _anthropic_error(404, f"No such message batch: {batch_id}"),
            )
        return batch

    def _listing(self, kind: str, after: str | None, before: str | None, limit: int) -> tuple[list[_Batch], bool]:
        """Batches of ``kind``, newest first, after (older than) ``after`` or before (newer than) ``before``."""
        with self.lock:
            newest_first = [batch for batch in reversed(self.batches.values()) if batch.kind == kind]
        ids = [batch.id for batch in newest_first]
        if after in ids:
            newest_first = newest_first[ids.index(after) + 1 :]
        elif before in ids:
            older = newest_first[: ids.index(before)]
            return older[-limit:], len(older) > limit
        return newest_first[:limit], len(newest_first) > limit

    # Anthropic

    def create_anthropic_batch(self, body: dict, size: int) -> dict:
        requests = body.get("requests")
        if not isinstance(requests, list) or not requests:
            raise HttpError(400, _anthropic_error(400, "requests: a non-empty list is required"))
        if size > self.max_bytes_per_file:
            raise HttpError(
                413, _anthropic_error(413, f"Request exceeds the maximum size of {self.max_bytes_per_file} bytes")
            )
        if len(requests) > self.max_requests_per_file:
            raise HttpError(400, _anthropic_error(400, f"requests: at most {self.max_requests_per_file} requests"))
        seen = set()
        for index, request in enumerate(requests):
            custom_id = request.get("custom_id") if isinstance(request, dict) else None
            params = request.get("params") if isinstance(request, dict) else None
            if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 64:
                raise HttpError(400, _anthropic_error(400, f"requests.{index}.custom_id: 1 to 64 characters"))
            if custom_id in seen:
                raise HttpError(400, _anthropic_error(400, f"requests.{index}.custom_id: {custom_id!r} is not unique"))
            if not isinstance(params, dict) or not all(key in params for key in ("model", "max_tokens", "messages")):
                raise HttpError(
                    400, _anthropic_error(400, f"requests.{index}.params: model, max_tokens and messages are required")
                )
            seen.add(custom_id)
        batch = _Batch(
            "anthropic",
            "msgbatch_" + uuid.uuid4().hex[:24],
            time.time(),
            status="in_progress",
            requests=requests,
            total=len(requests),
        )
        with self.lock:
            for custom_id in seen:
                self.submissions[custom_id] += 1
        self._register(batch)
        view = self._anthropic_view(batch)
        threading.Thread(target=self._guarded, args=(self._run_anthropic, batch), daemon=True, name=batch.id).start()
        return view

    def _run_anthropic(self, batch: _Batch) -> None:
        lines = [(r["custom_id"], "/v1/chat/completions", messages_to_chat(r["params"])) for r in batch.requests or []]
        models = {r["custom_id"]: r["params"]["model"] for r in batch.requests or []}
        with self.slots:
            outcomes = self._execute(batch, lines)
        self._hold(batch)
        results = []
        for outcome in outcomes:
            result = self._anthropic_result(outcome, models[outcome.custom_id])
            batch.counts["succeeded" if result is None else result["type"]] += 1  # a vanished line counts succeeded
            if result is not None:
                results.append(json.dumps({"custom_id": outcome.custom_id, "result": result}).encode() + b"\n")
        if self.faults.shuffle:
            random.Random(batch.id).shuffle(results)
        path = self.folder / batch.id
        path.write_bytes(b"".join(results))
        with self.lock:
            batch.requests, batch.results_path = None, path
            batch.status, batch.times["ended"] = "ended", time.time()

    @staticmethod
    def _anthropic_result(outcome: _Outcome, model: str) -> dict | None:
        if outcome.kind == "vanished":
            return None
        if outcome.kind in ("expired", "canceled"):
            return {"type": outcome.kind}
        if 200 <= outcome.status < 300:
            return {"type": "succeeded", "message": chat_to_message(outcome.body or {}, model)}
        error = outcome.body or {}
        if error.get("type") != "error":
            message = (error.get("error") or {}).get("message") or json.dumps(error)
            error = _anthropic_error(outcome.status, message)
        return {"type": "errored", "error": error}

    def _anthropic_view(self, batch: _Batch) -> dict:
        ended = batch.status == "ended"
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": batch.status,
            "request_counts": self._counts(batch),
            "created_at": _iso(batch.created_at),
            "expires_at": _iso(batch.created_at + DAY_S),
            "ended_at": _iso(batch.times.get("ended")),
            "cancel_initiated_at": _iso(batch.times.get("cancelling")),
            "archived_at": None,
            "results_url": f"{self.root}/v1/messages/batches/{batch.id}/results" if ended else None,
        }

    def cancel_anthropic(self, batch_id: str) -> dict:
        batch = self._batch(batch_id, "anthropic")
        with self.lock:
            if batch.status == "in_progress":
                batch.status, batch.times["cancelling"] = "canceling", time.time()
                batch.cancel.set()
        return self._anthropic_view(batch)

    def message(self, params: dict) -> dict:
        """One Anthropic Messages request run upstream as a chat completion."""
        if not all(key in params for key in ("model", "max_tokens", "messages")):
            raise HttpError(400, _anthropic_error(400, "model, max_tokens and messages are required"))
        status, answer = self.row_call("/v1/chat/completions", messages_to_chat(params))
        if not 200 <= status < 300:
            message = (answer.get("error") or {}).get("message") if isinstance(answer.get("error"), dict) else None
            raise HttpError(status, _anthropic_error(status, message or json.dumps(answer)))
        return chat_to_message(answer, str(params["model"]))

    def row_call(self, path: str, body: dict) -> tuple[int, dict]:
        """One per-row request run upstream, its answer's cached tokens as :class:`Faults` says."""
        cached, written = self.cache_read(body)
        status, answer = self.upstream.call(path, _upstream_body(body))
        if 200 <= status < 300:
            answer = _with_cached(answer, cached, written)
            with self.lock:
                self.cached_delivered += _cached_of(answer)
                self.written_delivered += _written_of(answer)
        return status, answer

    def cache_read(self, body: dict) -> tuple[int, int]:
        """The prompt tokens the answer to ``body`` (an OpenAI-style request about to run upstream) reports read from
        the cache and written to it: :attr:`Faults.cached_prompt_tokens`, or the prefix rule's
        (:attr:`Faults.cache_prefix_words`), by the request's hint where it carries one; its hint recorded."""
        key, mark = body.get("prompt_cache_key"), body.get(CACHE_BREAKPOINT)
        with self.lock:
            self.cache_hints.append((prompt_text(body), mark["text"] if mark else key))
        if mark:  # Anthropic caches by the marked block alone
            marked = (mark["system"], mark["text"])
            tokens = len(" ".join(marked).split())
            with self.lock:
                seen = marked in self.breakpoints_seen
                self.breakpoints_seen.add(marked)
            return max(self.faults.cached_prompt_tokens, tokens if seen else 0), 0 if seen else tokens
        words = self.faults.cache_prefix_words
        if not words:
            return self.faults.cached_prompt_tokens, 0
        prefix = (key, *prompt_text(body).split()[:words])  # OpenAI: a key's requests share one cache
        with self.lock:
            seen = prefix in self.prefixes_seen
            self.prefixes_seen.add(prefix)
        return max(self.faults.cached_prompt_tokens, len(prefix) - 1 if seen else 0), 0

    def refuse_this_row(self) -> bool:
        """Whether this per-row request is one the ``refuse_every`` knob answers 429."""
        with self.lock:
            self.row_requests += 1
            every = self.faults.refuse_every
            return every > 0 and self.row_requests % every == 0


def _multipart(content_type: str, data: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A ``multipart/form-data`` body's fields: name -> (filename, bytes)."""
    boundary = next(
        (part.split("=", 1)[1].strip('"') for part in content_type.split(";") if part.strip().startswith("boundary=")),
        None,
    )
    if boundary is None:
        raise HttpError(400, _openai_error(400, "Expected multipart/form-data with a boundary"))
    fields = {}
    for part in data.split(b"--" + boundary.encode())[1:]:
        if part.startswith(b"--"):
            break
        head, _, body = part.lstrip(b"\r\n").partition(b"\r\n\r\n")
        disposition = next(
            (
                line
                for line in head.decode(errors="replace").split("\r\n")
                if line.lower().startswith("content-disposition")
            ),
            "",
        )
        attributes = dict(item.strip().split("=", 1) for item in disposition.split(";")[1:] if "=" in item)
        name = attributes.get("name", "").strip('"')
        filename = attributes["filename"].strip('"') if "filename" in attributes else None
        fields[name] = (filename, body.removesuffix(b"\r\n"))
    return fields


def _handler(provider: BatchProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            split = urlsplit(self.path)
            path, query = split.path.rstrip("/"), {k: v[-1] for k, v in parse_qs(split.query).items()}
            anthropic = path.startswith("/v1/messages")
            try:
                self._authorize(anthropic)
                status, body, raw = self._route(method, path, query, data)
            except HttpError as error:
                status, body, raw = error.status, error.body, None
            except (ValueError, KeyError, TypeError) as error:
                status = 400
                body = (
                    _anthropic_error(400, f"malformed request: {error}")
                    if anthropic
                    else _openai_error(400, f"malformed request: {error}")
                )
                raw = None
            payload = raw if raw is not None else json.dumps(body).encode()
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", str(provider.faults.retry_after_s))
            self.send_header("Content-Type", "application/octet-stream" if raw is not None else "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _authorize(self, anthropic: bool) -> None:
            by_header = (
                "x-api-key"
                if self.headers.get("x-api-key") == provider.key
                else "authorization"
                if self.headers.get("Authorization") == f"Bearer {provider.key}"
                else None
            )
            with provider.lock:
                provider.key_headers[by_header or "none"] += 1
            if anthropic or (by_header == "x-api-key" and self.path.rstrip("/") == "/v1/models"):
                # The anthropic client from 2.x sends its key as a bearer token; the API takes either header.
                if by_header is None:
                    raise HttpError(401, _anthropic_error(401, "invalid x-api-key"))
                if not self.headers.get("anthropic-version"):
                    raise HttpError(400, _anthropic_error(400, "anthropic-version: header is required"))
            elif by_header != "authorization":
                raise HttpError(
                    401,
                    {
                        "error": {
                            "message": "Incorrect API key provided.",
                            "type": "invalid_request_error",
                            "param": None,
                            "code": "invalid_api_key",
                        }
                    },
                )

        def _route(self, method: str, path: str, query: dict, data: bytes) -> tuple[int, dict, bytes | None]:
            parts = path.split("/")[2:]  # after "/v1"
            json_body = json.loads(data) if data and method == "POST" and not path.endswith("/files") else {}
            if parts[:1] == ["files"]:
                return self._files(method, parts[1:], data)
            if parts[:1] == ["batches"]:
                return self._batches(method, parts[1:], query, json_body)
            if parts[:2] == ["messages", "batches"]:
                return self._message_batches(method, parts[2:], query, json_body, len(data))
            if method == "POST" and "/" + "/".join(["v1", *parts]) in (*OPENAI_BATCH_ENDPOINTS, "/v1/messages"):
                if provider.refuse_this_row():
                    raise HttpError(
                        429,
                        _anthropic_error(429, "rate limited")
                        if parts == ["messages"]
                        else _openai_error(429, "rate limited"),
                    )
                if parts == ["messages"]:
                    return 200, provider.message(json_body), None
                status, answer = provider.row_call(path, json_body)
                return status, answer, None
            if method == "GET" and parts == ["models"]:
                listed = [{"id": CHEAP_MODEL, "object": "model", "owned_by": "test"}]
                return 200, {"object": "list", "data": listed}, None
            raise HttpError(404, _openai_error(404, f"No route {method} {path}"))

        def _files(self, method: str, rest: list[str], data: bytes) -> tuple[int, dict, bytes | None]:
            if method == "POST" and not rest:
                fields = _multipart(self.headers.get("Content-Type", ""), data)
                if "file" not in fields or (fields.get("purpose") or (None, b""))[1] != b"batch":
                    raise HttpError(400, _openai_error(400, "A file and purpose 'batch' are required"))
                filename, content = fields["file"]
                return 200, provider._store_file(content, filename or "upload.jsonl", "batch"), None
            if method == "GET" and not rest:
                with provider.lock:
                    listed = list(provider.files.values())
                return 200, {"object": "list", "data": listed, "has_more": False}, None
            record = provider._file(rest[0])
            if method == "GET" and rest[1:] == ["content"]:
                return 200, {}, (provider.folder / record["id"]).read_bytes()
            if method == "GET" and len(rest) == 1:
                return 200, record, None
            if method == "DELETE" and len(rest) == 1:
                with provider.lock:
                    provider.files.pop(record["id"], None)
                (provider.folder / record["id"]).unlink(missing_ok=True)
                return 200, {"id": record["id"], "object": "file", "deleted": True}, None
            raise HttpError(404, _openai_error(404, "No such route"))

        def _batches(self, method: str, rest: list[str], query: dict, body: dict) -> tuple[int, dict, None]:
            if method == "POST" and not rest:
                return 200, provider.create_openai_batch(body), None
            if method == "GET" and not rest:
                limit = max(1, min(100, int(query.get("limit", 20))))
                listed, more = provider._listing("openai", query.get("after"), None, limit)
                data = [provider._openai_view(batch) for batch in listed]
                return (
                    200,
                    {
                        "object": "list",
                        "data": data,
                        "first_id": data[0]["id"] if data else None,
                        "last_id": data[-1]["id"] if data else None,
                        "has_more": more,
                    },
                    None,
                )
            if method == "GET" and len(rest) == 1:
                return 200, provider._openai_view(provider._batch(rest[0], "openai")), None
            if method == "POST" and rest[1:] == ["cancel"]:
                return 200, provider.cancel_openai(rest[0]), None
            raise HttpError(404, _openai_error(404, "No such route"))

        def _message_batches(
            self, method: str, rest: list[str], query: dict, body: dict, size: int
        ) -> tuple[int, dict, bytes | None]:
            if method == "POST" and not rest:
                return 200, provider.create_anthropic_batch(body, size), None
            if method == "GET" and not rest:
                limit = max(1, min(1000, int(query.get("limit", 20))))
                listed, more = provider._listing("anthropic", query.get("after_id"), query.get("before_id"), limit)
                data = [provider._anthropic_view(batch) for batch in listed]
                return (
                    200,
                    {
                        "data": data,
                        "has_more": more,
                        "first_id": data[0]["id"] if data else None,
                        "last_id": data[-1]["id"] if data else None,
                    },
                    None,
                )
            batch = provider._batch(rest[0], "anthropic")
            if method == "GET" and len(rest) == 1:
                return 200, provider._anthropic_view(batch), None
            if method == "POST" and rest[1:] == ["cancel"]:
                return 200, provider.cancel_anthropic(rest[0]), None
            if method == "GET" and rest[1:] == ["results"]:
                if batch.results_path is None:
                    raise HttpError(404, _anthropic_error(404, f"Batch {batch.id} has not ended yet"))
                return 200, {}, batch.results_path.read_bytes()
            if method == "DELETE" and len(rest) == 1:
                if batch.status != "ended":
                    raise HttpError(400, _anthropic_error(400, "Only an ended batch can be deleted"))
                with provider.lock:
                    provider.batches.pop(batch.id, None)
                return 200, {"id": batch.id, "type": "message_batch_deleted"}, None
            raise HttpError(404, _anthropic_error(404, "No such route"))

    return Handler


@contextmanager
def batch_provider(upstream: str | None = None, **options) -> Iterator[BatchProvider]:
    """A :class:`BatchProvider` serving for the ``with`` block (``cheap=True`` in place of ``upstream`` for one
    that answers in-process)."""
    with BatchProvider(upstream, **options) as provider:
        yield provider


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--upstream", help="an OpenAI-compatible base URL ending in /v1")
    source.add_argument("--cheap", action="store_true", help="answer in-process (an echo with usage)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--key", default="sk-test-batch-key")
    parser.add_argument("--min-seconds", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-requests-per-file", type=int, default=50_000)
    parser.add_argument("--max-bytes-per-file", type=int, default=200 * 1024 * 1024)
    args = parser.parse_args(argv)
    provider = BatchProvider(
        args.upstream,
        cheap=args.cheap,
        key=args.key,
        port=args.port,
        min_seconds=args.min_seconds,
        concurrency=args.concurrency,
        max_requests_per_file=args.max_requests_per_file,
        max_bytes_per_file=args.max_bytes_per_file,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with provider:
        print(f"batch provider at {provider.url} (key {provider.key})", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
