"""What a task sends through a provider's Batch API and what comes back, as one typed contract (:class:`BatchLines`):
the ledger, the files and the driver loop (:mod:`lakescore.udfs.batch_udfs`, ``lakescore.jobs.steps.provider_batch``)
are the same for every task, and each task that can go out as batch lines names its :class:`BatchLines` in the task
registry (``Task.batch_lines``).

* :class:`~lakescore.udfs.remote.generate.GenerateLines` (``generate.endpoint.batch``): a line is the per-row path's
  completions or chat request for the row (a sampled row's seed from its key), a result its
  :class:`~lakescore.udfs.heads.generate.Generation`, checked as the per-row path checks an answer.
* :class:`~lakescore.udfs.remote.embed.EmbedLines` (``embed.endpoint.batch``): a line is the per-row path's
  ``/v1/embeddings`` request holding the row's one text, so a file's inputs are its lines and stay within the
  provider's inputs per batch as its lines do; a result is that text's vector, normalised as the per-row path
  normalises it.

This module holds the contract only (light: the task registry names it), each task's lines live beside its per-row
head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

__all__ = ["BatchLines", "LineAnswer"]


@dataclass(frozen=True)
class LineAnswer:
    """What one result body gave a row: its ``output`` (what :meth:`BatchLines.columns` takes), the prompt tokens and
    generated tokens its ``usage`` reports (``tokens_in`` ``None``: no ``usage``), the prompt tokens read from the
    provider's prompt cache and those written to it (``tokens_cached``, ``tokens_cache_write``, each among
    ``tokens_in``, counted apart), and ``failure``, ``(reason, error)`` for an answer the row is dead-lettered for
    though it came back whole (generate's JSON that does not validate)."""

    output: Any
    tokens_in: int | None
    tokens_out: int = 0
    failure: tuple[str, str] | None = None
    tokens_cached: int = 0
    tokens_cache_write: int = 0


class BatchLines(Protocol):
    """A task's lines: picklable (the executors render and read them), built on the driver from the run's
    :class:`~lakescore.udfs.models.model_source.ModelSpec`."""

    @property
    def api(self) -> str:
        """The route the lines go to (``completions``, ``chat``, ``embeddings``:
        :func:`~lakescore.udfs.remote.batch_files.request_path`)."""
        ...

    def body(self, text: str, key: str) -> dict[str, Any]:
        """The request body the per-row path sends for the row keyed ``key`` whose input is ``text``."""
        ...

    def answer(self, body: Mapping[str, Any]) -> LineAnswer:
        """A result body as the row's answer; :class:`~lakescore.udfs.remote.answers.EndpointError` or
        :class:`ValueError` for what the per-row path dead-letters (its reason and words)."""
        ...

    def columns(self, outputs: np.ndarray, ok: np.ndarray) -> Sequence[pa.Array]:
        """The task's output columns for ``outputs`` (rows not ``ok`` null), as its per-row head writes them."""
        ...
