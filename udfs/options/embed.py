"""The ``embed`` task's settings (the config schema's ``embed`` section): chunked embedding of long documents, and an
OpenAI-compatible ``/v1/embeddings`` endpoint or a served engine in place of the model loaded here (the generate
task's remote settings, :mod:`lakescore.udfs.options.remote`, spelled the same).

Declared on the executors' side, as the ``generate`` section is: the workers' chunker
(:mod:`lakescore.udfs.chunking`) takes :class:`ChunkOptions` as it is. ``docs/documents.md`` describes the rows a
chunked run writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from lakescore.udfs.options.base import ConfigError, Section, cli
from lakescore.udfs.options.remote import EmbedEndpointOptions, EmbedServerOptions

__all__ = [
    "ChunkOptions",
    "EmbedOptions",
    "DOCUMENT_VECTORS",
    "DEFAULT_MAX_CHUNKS",
    "check_chunk_limit",
    "chunk_limit_error",
]

DOCUMENT_VECTORS = ("none", "mean")
DEFAULT_MAX_CHUNKS = 1000
"""Chunks one document may make: at 256-token chunks, a document of about a megabyte of English text."""


class ChunkOptions(Section):
    """Embed long texts in chunks instead of truncating them at the model's limit: each text is split by the model's
    own tokenizer into windows of at most ``max_tokens`` tokens, one output row per chunk (``chunk_index``,
    ``chunk_start``, ``chunk_end``, ``embedding``). Off unless ``max_tokens`` is set."""

    max_tokens: int | None = Field(None, ge=2, json_schema_extra=cli("--chunk-tokens", "N"))
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
    def _needs_max_tokens(self) -> ChunkOptions:
        given = sorted(self.model_fields_set - {"max_tokens"})
        if given and not self.enabled:
            raise ConfigError(
                f"embed.chunk.{given[0]} needs embed.chunk.max_tokens (--chunk-tokens), which turns chunking on"
            )
        if self.max_tokens is not None and self.overlap_tokens >= self.max_tokens:
            raise ConfigError(
                f"embed.chunk.overlap_tokens {self.overlap_tokens} must be below embed.chunk.max_tokens "
                f"{self.max_tokens}"
            )
        return self


class EmbedOptions(Section):
    """The ``embed`` task's own settings."""

    chunk: ChunkOptions = Field(default_factory=ChunkOptions)
    endpoint: EmbedEndpointOptions | None = None
    """Embed through an OpenAI-compatible ``/v1/embeddings`` endpoint instead of a model loaded here (``--model`` is not
    needed); see ``docs/embedding.md``."""
    server: EmbedServerOptions | None = None
    """Serve the model (``--model``) with an engine lakescore starts once per executor host (vLLM's pooling runner, or
    SGLang) and send each host's rows to its ``/v1/embeddings``; see ``docs/embedding.md``."""

    @model_validator(mode="after")
    def _remote(self) -> EmbedOptions:
        if self.endpoint is not None and self.server is not None:
            raise ConfigError("embed.endpoint and embed.server exclude each other: a model is called, or served here")
        if self.remote and self.chunked:
            # chunks are cut by the model's own tokenizer, which an endpoint does not lend: one rule for both remote
            # heads
            raise ConfigError(
                "embed.chunk with embed.endpoint / embed.server: chunks are cut by the model's tokenizer "
                "in-process; embed long documents in-process (drop the endpoint or server)"
            )
        return self

    @property
    def chunked(self) -> bool:
        """Whether one input row becomes many output rows (a document, its chunks)."""
        return self.chunk.enabled

    @property
    def deterministic(self) -> bool:
        """True: an embedding depends only on its text, so dedup may rely on it."""
        return True

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


def chunk_limit_error(max_tokens: int, limit: int) -> str:
    """The one line for an ``embed.chunk.max_tokens`` above the ``limit`` tokens the model reads, on the driver and the
    executors alike."""
    return (
        f"embed.chunk.max_tokens {max_tokens} is above the {limit} tokens the model reads, which would truncate every "
        f"full chunk; set it at most {limit}"
    )


def check_chunk_limit(spec: Any, model_dir: Path, config: dict) -> None:
    """The driver's check of ``embed.chunk.max_tokens`` against the tokens the model reads, from its own files as the
    executors' load computes it (:func:`lakescore.udfs.heads.hf_models.truncation_limit`): the smallest of
    ``model.max_seq_length`` (else ``sentence_bert_config.json``'s), ``max_position_embeddings`` and the tokenizer's
    ``model_max_length``. :class:`~lakescore.udfs.models.errors.UnfitModelError` before any executor starts; a model
    read otherwise (modules beyond Transformer and Pooling, a dual tower, a served model) is left to the executors."""
    from lakescore.udfs.models.errors import UnfitModelError
    from lakescore.udfs.models.json_files import NO_TOKENIZER_LIMIT, read_json

    options = spec.embed
    if options is None or not options.chunked or options.remote:
        return
    folder = _transformer_folder(model_dir)
    if folder is None or ("text_config" in config and "vision_config" in config):
        return
    transformer = model_dir / folder
    sentence = read_json(transformer / "sentence_bert_config.json") or {}
    facts = read_json(transformer / "config.json") or {}
    tokenizer = (read_json(transformer / "tokenizer_config.json") or {}).get("model_max_length")
    limits = [
        spec.max_seq_length or sentence.get("max_seq_length"),
        facts.get("max_position_embeddings"),
        tokenizer if isinstance(tokenizer, int) and tokenizer < NO_TOKENIZER_LIMIT else None,
    ]
    known = [v for v in limits if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if known and options.chunk.max_tokens > min(known):
        raise UnfitModelError(
            f"task {spec.task}: {chunk_limit_error(options.chunk.max_tokens, min(known))} ({model_dir})"
        )


def _transformer_folder(model_dir: Path) -> str | None:
    """The Transformer module's folder in ``model_dir`` (``""``: the model's own), or ``None`` for a
    sentence-transformers model with modules beyond Transformer, Pooling and Normalize (its limit is
    sentence-transformers' to read)."""
    import json

    path = model_dir / "modules.json"
    if not path.is_file():
        return ""
    try:
        modules = json.loads(path.read_text(encoding="utf-8"))
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    except (OSError, ValueError, AttributeError):
        return None
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return None
    return str(modules[0].get("path", ""))
