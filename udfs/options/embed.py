"""The ``embed`` task's settings (the config schema's ``embed`` section): chunked embedding of long documents, and an
OpenAI-compatible ``/v1/embeddings`` endpoint or a served engine in place of the model loaded here (the generate
task's remote settings, :mod:`lakescore.udfs.options.remote`, spelled the same).

Declared on the executors' side, as the ``generate`` section is: the workers' chunker
(:mod:`lakescore.udfs.chunking`) takes :class:`ChunkOptions` as it is. ``docs/documents.md`` describes the rows a
chunked run writes."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from lakescore.udfs.options.remote import EmbedEndpointOptions, EmbedServerOptions
from lakescore.udfs.options.base import ConfigError, Section, cli

__all__ = ["ChunkOptions", "EmbedOptions", "DOCUMENT_VECTORS", "DEFAULT_MAX_CHUNKS"]

DOCUMENT_VECTORS = ("none", "mean")
DEFAULT_MAX_CHUNKS = 1000
"""Chunks one document may make: at 256-token chunks, a document of about a megabyte of English text."""


class ChunkOptions(Section):
    """Embed long texts in chunks instead of truncating them at the model's limit: each text is split by the model's
    own tokenizer into windows of at most ``max_tokens`` tokens, one output row per chunk (``chunk_index``,
    ``chunk_start``, ``chunk_end``, ``embedding``). Off unless ``max_tokens`` is set."""

    max_tokens: Optional[int] = Field(None, ge=2, json_schema_extra=cli("--chunk-tokens", "N"))
    """Tokens one chunk is read as at most, the model's special tokens and prompt included (at most the model's
    ``max_seq_length``); a text that fits is one chunk."""
    overlap_tokens: int = Field(0, ge=0, json_schema_extra=cli("--chunk-overlap", "N"))
    """Tokens consecutive chunks share (below the text tokens a chunk holds)."""
    max_chunks: int = Field(DEFAULT_MAX_CHUNKS, ge=1)
    """Chunks one document may make: a document that would make more is dead-lettered (``too_many_chunks``), never
    truncated, found from its token count before any chunk is embedded."""
    document_vector: Literal[DOCUMENT_VECTORS] = "none"
    """``mean``: one more row per document, ``chunk_index`` -1 spanning the whole text, holding the L2-normalised mean
    of its chunk vectors."""

    @property
    def enabled(self) -> bool:
        return self.max_tokens is not None

    @model_validator(mode="after")
    def _needs_max_tokens(self) -> "ChunkOptions":
        given = sorted(self.model_fields_set - {"max_tokens"})
        if given and not self.enabled:
            raise ConfigError(f"embed.chunk.{given[0]} needs embed.chunk.max_tokens (--chunk-tokens), which turns chunking on")
        if self.enabled and self.overlap_tokens >= self.max_tokens:
            raise ConfigError(f"embed.chunk.overlap_tokens {self.overlap_tokens} must be below embed.chunk.max_tokens "
                              f"{self.max_tokens}")
        return self


class EmbedOptions(Section):
    """The ``embed`` task's own settings."""

    chunk: ChunkOptions = Field(default_factory=ChunkOptions)
    endpoint: Optional[EmbedEndpointOptions] = None
    """Embed through an OpenAI-compatible ``/v1/embeddings`` endpoint instead of a model loaded here (``--model`` is not
    needed); see ``docs/embedding.md``."""
    server: Optional[EmbedServerOptions] = None
    """Serve the model (``--model``) with an engine lakescore starts once per executor host (vLLM's pooling runner, or
    SGLang) and send each host's rows to its ``/v1/embeddings``; see ``docs/embedding.md``."""

    @model_validator(mode="after")
    def _remote(self) -> "EmbedOptions":
        if self.endpoint is not None and self.server is not None:
            raise ConfigError("embed.endpoint and embed.server exclude each other: a model is called, or served here")
        if self.remote and self.chunked:
            # chunks are cut by the model's own tokenizer, which an endpoint does not lend: one rule for both remote heads
            raise ConfigError("embed.chunk with embed.endpoint / embed.server: chunks are cut by the model's tokenizer "
                              "in-process; embed long documents in-process (drop the endpoint or server)")
        return self

    @property
    def chunked(self) -> bool:
        """Whether one input row becomes many output rows (a document, its chunks)."""
        return self.chunk.enabled

    @property
    def remote(self) -> bool:
        """Whether an endpoint or a served engine embeds, rather than a model loaded in the worker."""
        return self.endpoint is not None or self.server is not None

    def identity(self) -> dict[str, Any]:
        """What a spec digest covers: the chunk settings when chunking is on, an endpoint or server by what names the
        model that answers; else nothing (so an in-process, unchunked run's digests stay as they were before the
        section existed)."""
        facts: dict[str, Any] = {"chunk": self.chunk.model_dump()} if self.chunked else {}
        for name in ("endpoint", "server"):
            if getattr(self, name) is not None:
                facts[name] = getattr(self, name).identity()
        return facts
