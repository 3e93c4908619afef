"""Settings of a provider's Batch API (``generate.endpoint.batch``, ``embed.endpoint.batch``): the section whose
presence sends a run's rows as files of requests (OpenAI's Files + Batches contract; Anthropic's Message Batches for
``api: messages``) instead of one request per row. Plain pydantic, importable without the HTTP client
(:mod:`lakescore.udfs.remote.batch_client` is the client)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from lakescore.udfs.options.base import Number, Section

__all__ = ["BatchOptions", "COMPLETION_WINDOWS"]

COMPLETION_WINDOWS = ("24h",)
"""The completion windows the OpenAI Batch API takes (providers that copy it take the same)."""


class BatchOptions(Section):
    """Send the rows through the provider's Batch API (``POST /files``, ``POST /batches``; with ``api: messages``
    ``POST /messages/batches``) at its batch price: files cut within the limits below, polled until they end, results
    joined back to rows by ``custom_id``; see ``docs/generation.md`` "Provider batches"."""

    max_requests_per_file: int = Field(50_000, ge=1, le=1_000_000)
    """Request lines per uploaded file at most (OpenAI's limit: 50,000; Anthropic's per Message Batch: 100,000)."""
    max_bytes_per_file: int = Field(200 * 1024 * 1024, ge=1024, le=2 * 1024**3)
    """Bytes per uploaded file at most (OpenAI's limit: 200 MB; Anthropic's per Message Batch: 256 MB); a row whose
    one line is larger is dead-lettered."""
    completion_window: Literal[COMPLETION_WINDOWS] = "24h"
    """How long the provider may take for a batch; what it has not done by then comes back expired and is sent
    again."""
    poll_interval_s: Number = Field(30.0, ge=0.05, le=3600)
    """Seconds between two polls of the batches' states."""
    max_resubmits: int = Field(3, ge=0, le=20)
    """Times a line the provider ended without a result (a 429 or 5xx error line, an expired or cancelled batch's
    unfinished line, a line absent from both the output and the error file) is sent again in a new batch; then the row
    is dead-lettered ``endpoint_error`` with the provider's reason."""
    wait: bool = True
    """``true``: the run waits for its batches and publishes; ``false``: it submits and returns with exit code 75,
    and the same command run later collects what ended (and waits for nothing)."""
