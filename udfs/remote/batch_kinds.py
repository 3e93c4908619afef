"""The provider kinds of ``generate.endpoint.batch``: what differs between OpenAI's Files + Batches and Anthropic's
Message Batches, behind one contract (:class:`BatchKind`) the ledger's driver loop and the executors' stages call, so
nothing else asks which provider it talks to. :func:`batch_kind` picks the kind from the endpoint's ``api`` (``chat``
and ``completions``: :class:`OpenAIBatches`; ``messages``: :class:`MessageBatches`), in this one place.

A kind renders a row's line (its request exactly the per-row path's), submits a file's lines as one batch, reads a
batch's state as a :class:`Polled` (the provider's status word, kept as the ledger's, and whether it has ended), turns
an ended batch's results into one :class:`~lakescore.udfs.remote.batch_files.LineOutcome` per ``custom_id``, and
reads a result's body as the per-row path reads an answer. Both go over :class:`~lakescore.udfs.remote.batch_client.
BatchClient` (httpx2, one retry rule and key scrubber), not the official clients: those bring their own retry loops and
a run-time dependency for a handful of plain calls; the tests speak to the suite's provider through them."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, BinaryIO, Protocol

from lakescore.udfs.options.remote import MESSAGES_API
from lakescore.udfs.remote import message_batches, messages
from lakescore.udfs.remote.batch_client import BatchClient
from lakescore.udfs.remote.batch_files import (
    LineOutcome,
    absent,
    batch_errors,
    batch_line,
    canonical,
    classify,
    iter_jsonl,
    request_path,
)
from lakescore.udfs.remote.batch_intents import Listed
from lakescore.udfs.remote.completions import Completion

__all__ = ["BatchKind", "Polled", "OpenAIBatches", "MessageBatches", "batch_kind", "ENDED"]

ENDED = "ended"
"""Anthropic's word for a batch whose results are final (OpenAI's are ``completed``, ``expired``, ``cancelled``)."""


@dataclass(frozen=True)
class Polled:
    """A batch as one poll found it: the provider's ``status`` word (what the ledger records), whether it has ended
    for good (``terminal``), its lines done of ``total``, and once ended where its results are (``output`` and
    ``error``: OpenAI's file ids; Anthropic's ``results_url`` as ``output``), its lines that came back with a result
    (``completed``) and without (``failed``), and the provider's reason for a batch it refused (``message``)."""

    batch_id: str
    status: str
    terminal: bool
    done: int
    total: int
    output: str | None = None
    error: str | None = None
    completed: int | None = None
    failed: int | None = None
    message: str | None = None


class BatchKind(Protocol):
    """What a provider's batch API is to the ledger (module docstring)."""

    @property
    def keeps_metadata(self) -> bool:
        """Whether a batch carries the run's ``metadata`` (:meth:`held` finds it again); else the ledger records an
        intent before each create and :meth:`listed` finds it (:mod:`~lakescore.udfs.remote.batch_intents`)."""
        ...

    def client(self, url: str, key: str | None, *, timeout_s: float = 120.0, max_retries: int = 6) -> BatchClient:
        """A client for the provider at ``url`` whose key goes where this provider wants it."""
        ...

    def line(self, line_id: str, params: Mapping[str, Any]) -> bytes:
        """One request line (UTF-8, ending in a newline) of the row whose request is ``params``."""
        ...

    def request(self, options: Any, model: str, prompt: str, seed: int | None) -> dict[str, Any]:
        """The request the per-row path sends for ``prompt`` (``seed``: the row's, for a sampled row)."""
        ...

    def submit(
        self, client: BatchClient, name: str, lines: Sequence[bytes], spooled: BinaryIO, metadata: Mapping[str, str]
    ) -> tuple[str, str | None]:
        """Submit ``lines`` (also written to ``spooled``, at its start) as one batch named ``name``: its batch id and
        input file id (``None``: the provider keeps no file)."""
        ...

    def poll(self, client: BatchClient, batch_id: str) -> Polled:
        """The batch ``batch_id`` as the provider holds it now."""
        ...

    def held(self, client: BatchClient, metadata: Mapping[str, str]) -> list[tuple[Mapping[str, str], str, str | None]]:
        """The provider's batches whose metadata holds ``metadata``, each with its batch id and input file: a batch
        created but not recorded (a kill in between) found again. Empty for a provider that keeps no metadata."""
        ...

    def listed(self, client: BatchClient, since: float) -> list[Listed]:
        """The provider's batches created at or after ``since`` (seconds since the epoch), newest first. Empty for a
        provider that keeps metadata (:meth:`held` finds its batches)."""
        ...

    def result_ids(self, client: BatchClient, results: str) -> Iterator[str]:
        """The ``custom_id`` of each line at an ended batch's ``results`` (:attr:`Listed.results`), streamed."""
        ...

    def cancel(self, client: BatchClient, batch_id: str) -> str:
        """Ask the provider to cancel ``batch_id``; its status then."""
        ...

    def outcomes(self, client: BatchClient, output: str | None, error: str | None) -> Iterator[tuple[str, LineOutcome]]:
        """An ended batch's result lines as they are read (the output's before the error file's; a ``custom_id`` may
        come twice, the first wins), each a result, a retry or dead: streamed, never a whole file in memory."""
        ...

    def absent(self, status: str) -> LineOutcome:
        """What a line found in no result of a batch that ended ``status`` is: a retry."""
        ...

    def parse(self, body: Mapping[str, Any], options: Any) -> Completion:
        """A result's body read as the per-row path reads the answer (its checks, its errors)."""
        ...


def _openai_request(options: Any, model: str, api: str, prompt: str, seed: int | None) -> dict[str, Any]:
    from lakescore.udfs.remote.completions import request_body

    return request_body(options, model, api, prompt, seed)


@dataclass(frozen=True)
class OpenAIBatches:
    """OpenAI's Files + Batches (and the providers that copy it): a JSONL file uploaded, a batch created on it with
    ``metadata``, ``completed`` / ``expired`` / ``cancelled`` / ``failed``, an output and an error file."""

    api: str
    path: str
    completion_window: str = "24h"

    @property
    def keeps_metadata(self) -> bool:
        return True

    def client(self, url: str, key: str | None, *, timeout_s: float = 120.0, max_retries: int = 6) -> BatchClient:
        return BatchClient(url, key, timeout_s=timeout_s, max_retries=max_retries)

    def line(self, line_id: str, params: Mapping[str, Any]) -> bytes:
        return batch_line(line_id, self.path, canonical(params))

    def request(self, options: Any, model: str, prompt: str, seed: int | None) -> dict[str, Any]:
        return _openai_request(options, model, self.api, prompt, seed)

    def submit(
        self, client: BatchClient, name: str, lines: Sequence[bytes], spooled: BinaryIO, metadata: Mapping[str, str]
    ) -> tuple[str, str | None]:
        file_id = client.upload(name + ".jsonl", spooled)
        created = client.create(file_id, self.path, self.completion_window, metadata)
        return str(created["id"]), file_id

    def poll(self, client: BatchClient, batch_id: str) -> Polled:
        return openai_polled(client.get(batch_id))

    def held(self, client: BatchClient, metadata: Mapping[str, str]) -> list[tuple[Mapping[str, str], str, str | None]]:
        found: list[tuple[Mapping[str, str], str, str | None]] = []
        for batch in client.batches():
            held = batch.get("metadata") or {}
            if all(held.get(k) == v for k, v in metadata.items()) and batch.get("status") != "failed":
                found.append((held, str(batch["id"]), str(batch.get("input_file_id"))))
        return found

    def listed(self, client: BatchClient, since: float) -> list[Listed]:
        return []

    def result_ids(self, client: BatchClient, results: str) -> Iterator[str]:
        return (line["custom_id"] for line in iter_jsonl(client.content_lines(results)))

    def cancel(self, client: BatchClient, batch_id: str) -> str:
        return str(client.cancel(batch_id).get("status"))

    def outcomes(self, client: BatchClient, output: str | None, error: str | None) -> Iterator[tuple[str, LineOutcome]]:
        for file_id in (output, error):  # an output line wins over an error line: it comes first
            if file_id:
                for line in iter_jsonl(client.content_lines(file_id)):
                    yield line["custom_id"], classify(line)

    def absent(self, status: str) -> LineOutcome:
        return absent(status)

    def parse(self, body: Mapping[str, Any], options: Any) -> Completion:
        from lakescore.udfs.remote.completions import parse_completion

        return parse_completion(body, self.api, options.stop, options.max_new_tokens)


_OPENAI_TERMINAL = frozenset({"completed", "expired", "cancelled", "failed"})


def openai_polled(batch: Mapping[str, Any]) -> Polled:
    """An OpenAI batch object as a :class:`Polled`."""
    status = str(batch.get("status"))
    counts = batch.get("request_counts") or {}
    completed, failed = counts.get("completed"), counts.get("failed")
    return Polled(
        str(batch["id"]),
        status,
        status in _OPENAI_TERMINAL,
        int(completed or 0) + int(failed or 0),
        int(counts.get("total") or 0),
        batch.get("output_file_id"),
        batch.get("error_file_id"),
        completed,
        failed,
        batch_errors(batch),
    )


@dataclass(frozen=True)
class MessageBatches:
    """Anthropic's Message Batches (:mod:`~lakescore.udfs.remote.message_batches`): the lines posted as one body to
    ``<url>/messages/batches``, ``in_progress`` / ``canceling`` / ``ended``, results at ``results_url``. A batch
    carries no metadata: one created but not recorded (a kill in that instant) is found again in the provider's list
    (``GET <url>/messages/batches``) by the intent the ledger recorded before it
    (:mod:`~lakescore.udfs.remote.batch_intents`)."""

    @property
    def keeps_metadata(self) -> bool:
        return False

    def client(self, url: str, key: str | None, *, timeout_s: float = 120.0, max_retries: int = 6) -> BatchClient:
        return BatchClient(url, key, timeout_s=timeout_s, max_retries=max_retries, auth=messages.auth_headers)

    def line(self, line_id: str, params: Mapping[str, Any]) -> bytes:
        return ('{"custom_id":' + json.dumps(line_id) + ',"params":' + canonical(params) + "}\n").encode("utf-8")

    def request(self, options: Any, model: str, prompt: str, seed: int | None) -> dict[str, Any]:
        return messages.request_body(options, model, prompt)  # the Messages API has no seed

    def submit(
        self, client: BatchClient, name: str, lines: Sequence[bytes], spooled: BinaryIO, metadata: Mapping[str, str]
    ) -> tuple[str, str | None]:
        body = b'{"requests":[' + b",".join(line.rstrip(b"\n") for line in lines) + b"]}"
        created = client.post_json(message_batches.BATCHES_PATH, body, "create a message batch")
        return str(created["id"]), None

    def poll(self, client: BatchClient, batch_id: str) -> Polled:
        batch = client.get_json(f"{message_batches.BATCHES_PATH}/{batch_id}", f"read message batch {batch_id}")
        return anthropic_polled(batch)

    def held(self, client: BatchClient, metadata: Mapping[str, str]) -> list[tuple[Mapping[str, str], str, str | None]]:
        return []

    def listed(self, client: BatchClient, since: float) -> list[Listed]:
        found: list[Listed] = []
        after: str | None = None
        while True:  # newest first (Anthropic's order), a page at a time, until one created before ``since``
            path = f"{message_batches.BATCHES_PATH}?limit=100" + (f"&after_id={after}" if after else "")
            page = client.get_json(path, "list message batches")
            data = page.get("data") or []
            for batch in data:
                created = _epoch(batch.get("created_at"))
                if created < since:
                    return found
                counts = batch.get("request_counts") or {}
                found.append(
                    Listed(
                        str(batch["id"]),
                        created,
                        sum(int(v or 0) for v in counts.values()),
                        batch.get("processing_status") == ENDED,
                        batch.get("results_url"),
                    )
                )
            if not page.get("has_more") or not data:
                return found
            after = str(data[-1]["id"])

    def result_ids(self, client: BatchClient, results: str) -> Iterator[str]:
        lines = client.lines(results, "download a message batch's results")
        return (line["custom_id"] for line in message_batches.iter_results(lines))

    def cancel(self, client: BatchClient, batch_id: str) -> str:
        path = f"{message_batches.BATCHES_PATH}/{batch_id}/cancel"
        return str(client.post_json(path, b"", f"cancel message batch {batch_id}").get("processing_status"))

    def outcomes(self, client: BatchClient, output: str | None, error: str | None) -> Iterator[tuple[str, LineOutcome]]:
        if not output:
            return
        for line in message_batches.iter_results(client.lines(output, "download a message batch's results")):
            said = message_batches.classify(line)
            status = 200 if said.kind == message_batches.RESULT else None
            yield line["custom_id"], LineOutcome(said.kind, status, said.body, said.message)

    def absent(self, status: str) -> LineOutcome:
        said = message_batches.absent()
        return LineOutcome(said.kind, None, None, said.message)

    def parse(self, body: Mapping[str, Any], options: Any) -> Completion:
        return messages.parse_message(body, options.stop, options.max_new_tokens)


def anthropic_polled(batch: Mapping[str, Any]) -> Polled:
    """An Anthropic Message Batch object as a :class:`Polled`: its counts by result type."""
    status = str(batch.get("processing_status"))
    counts = {k: int(v or 0) for k, v in (batch.get("request_counts") or {}).items()}
    failed = counts.get("errored", 0) + counts.get("canceled", 0) + counts.get("expired", 0)
    succeeded = counts.get("succeeded", 0)
    return Polled(
        str(batch["id"]),
        status,
        status == ENDED,
        succeeded + failed,
        sum(counts.values()),
        batch.get("results_url"),
        None,
        succeeded,
        failed,
    )


def _epoch(stamp: Any) -> float:
    """An RFC 3339 time (Anthropic's ``created_at``) as seconds since the epoch; none: 0 (older than any intent)."""
    if not isinstance(stamp, str) or not stamp:
        return 0.0
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def batch_kind(url: str, api: str, completion_window: str = "24h") -> BatchKind:
    """The provider kind of an endpoint at ``url`` speaking ``api``: the one place that tells them apart."""
    if api == MESSAGES_API:
        return MessageBatches()
    return OpenAIBatches(api, request_path(url, api), completion_window)
