"""Settings of a task's remote engines: an OpenAI-compatible endpoint (``generate.endpoint``, ``embed.endpoint``) and a
served engine started on each executor host (``generate.server``, ``embed.server``). One pair of base classes
(:class:`RemoteEndpoint`, :class:`ServedEngine`) spells every key both tasks share; each task's class adds only what
its requests need (generate: ``api``, a price of generated tokens). Plain pydantic, importable without the HTTP
client, so the config and the driver read them without it (:mod:`lakescore.udfs.remote.client` is the client)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, model_validator

from lakescore.schemas.traffic import Traffic
from lakescore.udfs.options.base import ConfigError, Number, Section, Text, checked
from lakescore.udfs.options.batch import BatchOptions

__all__ = [
    "ENDPOINT_APIS",
    "ENGINES",
    "CACHE_WRITE_MULTIPLIER",
    "InputPrice",
    "Price",
    "RemoteEndpoint",
    "BatchableEndpoint",
    "ServedEngine",
    "EndpointOptions",
    "ServerOptions",
    "EmbedEndpointOptions",
    "EmbedServerOptions",
    "AudioPrice",
    "TranscribeEndpointOptions",
    "DEFAULT_CONCURRENCY",
    "MODELS_LISTING",
    "unsupported_settings",
    "MESSAGES_API",
    "GENERATE_ENDPOINT_APIS",
]

ENDPOINT_APIS = ("completions", "chat")
"""``completions``: the prompt as it is (``/v1/completions``); ``chat``: the prompt as the user message, the system
prompt as the system message, the server's chat template between them (``/v1/chat/completions``)."""
MESSAGES_API = "messages"
"""Anthropic's Messages API (``/v1/messages``, :mod:`~lakescore.udfs.remote.messages`): a generate endpoint's third
API, with its own key header; an engine lakescore serves speaks the OpenAI ones only."""
GENERATE_ENDPOINT_APIS = (*ENDPOINT_APIS, MESSAGES_API)
"""The APIs a generate endpoint speaks."""
ENGINES = ("vllm", "sglang", "transformers")
DEFAULT_CONCURRENCY = 16
"""Requests one task keeps in flight: enough to keep a continuous-batching engine's batch full with a few tasks per
executor, few enough that a shared endpoint queues them rather than refusing them."""

MODELS_LISTING = "/v1/models"
"""Where an endpoint's model files would be named: a model served elsewhere has no files here, so its identity's
``files`` hold, under this name, what the endpoint's ``/v1/models`` says of it (canonical JSON,
:func:`~lakescore.udfs.remote.generate.models_listing`)."""

OPENAI_HOST = "api.openai.com"
"""OpenAI's own API: where ``prompt_cache_key`` is sent by default (with ``api: chat``)."""

_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
"""An environment variable's name as keys are named (POSIX's convention: upper case, digits, ``_``). A lower-case value
is more likely a key typed here by mistake (``sk_live_...``, ``hf_...``) than a variable's name."""


def _key_env_problem(value: str) -> str | None:
    # the value is never quoted back: it may be the key itself, and the error reaches the console and the logs
    if _ENV_NAME.fullmatch(value) and len(value) <= 64:
        return None
    return (
        "must name the environment variable that holds the key (upper case, digits, _, e.g. LLM_API_KEY); the value "
        "given is not one and is not shown here, in case it is the key itself"
    )


Args = Annotated[tuple[Text, ...], BeforeValidator(lambda v: tuple(v) if isinstance(v, list) else v)]
"""An engine's flags, as YAML lists them (a number in the list is the text it was written as)."""


def _url_problem(value: str) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"must be an http:// or https:// base URL, got {value!r}"
    if parts.username or parts.password:
        return "holds credentials; give the key through the endpoint's api_key_env"
    if parts.query or parts.fragment:
        return "must be a base URL without a query or fragment"
    return None


class InputPrice(Section):
    """What the endpoint charges per million prompt tokens (an embedding endpoint's only tokens): the run's cost is
    reported from each response's ``usage``."""

    input: Number = Field(ge=0)
    """Per million prompt tokens."""
    batch: Number = Field(0.5, gt=0, le=1)
    """The share of these prices the provider charges for tokens sent through its Batch API (``endpoint.batch``)."""

    def cost(self, tokens_in: int, tokens_out: int = 0, tokens_cached: int = 0, tokens_cache_write: int = 0) -> float:
        """The price of ``tokens_in`` prompt tokens (an embedding has no generated tokens, and its cached tokens, where
        any, cost what the others do)."""
        return tokens_in * self.input / 1e6

    def charge(self, traffic: Traffic) -> float:
        """What the requests that carried ``traffic`` cost at these prices (every endpoint's price says so)."""
        return self.cost(traffic.tokens_in)


CACHE_WRITE_MULTIPLIER = 1.25
"""What Anthropic bills a token written to its default (5-minute) prompt cache, as a multiple of its input price."""


class Price(InputPrice):
    """What the endpoint charges, per million tokens: the run's cost is reported from each response's ``usage``."""

    output: Number = Field(ge=0)
    """Per million generated tokens."""
    cached_input: Number | None = Field(None, ge=0)
    """Per million prompt tokens the provider read from its prompt cache (the report's ``tokens_in_cached``: OpenAI's
    ``cached_tokens``, Anthropic's ``cache_read_input_tokens``); default: ``input``, as for any prompt token."""
    cache_write_input: Number | None = Field(None, ge=0)
    """Per million prompt tokens the provider wrote to its prompt cache (the report's ``tokens_in_cache_write``:
    Anthropic's ``cache_creation_input_tokens``; no other API reports them); default: 1.25 x ``input``, Anthropic's
    price of its default 5-minute cache. Set it for the 1-hour cache (2 x ``input``) or another provider's terms."""

    def cost(self, tokens_in: int, tokens_out: int, tokens_cached: int = 0, tokens_cache_write: int = 0) -> float:
        """The price of ``tokens_in`` prompt tokens, ``tokens_cached`` of them read from a prompt cache and
        ``tokens_cache_write`` of them written to it (each token one of the three kinds, priced once), and
        ``tokens_out`` generated tokens.

        >>> Price(input=2, output=10, cached_input=0.5).cost(1_000_000, 0, 400_000)
        1.4
        >>> Price(input=2, output=10, cached_input=0.2).cost(1_000_000, 100_000, 800_000, 100_000)  # 0.2+0.16+0.25+1
        1.61
        >>> Price(input=2, output=10).cost(1_000_000, 0, 0, 500_000)  # half written, at 1.25 x 2 by default
        2.25
        """
        cached_price = self.input if self.cached_input is None else self.cached_input
        write_price = self.input * CACHE_WRITE_MULTIPLIER if self.cache_write_input is None else self.cache_write_input
        plain = tokens_in - tokens_cached - tokens_cache_write
        return (
            plain * self.input
            + tokens_cached * cached_price
            + tokens_cache_write * write_price
            + tokens_out * self.output
        ) / 1e6

    def charge(self, traffic: Traffic) -> float:
        return self.cost(traffic.tokens_in, traffic.tokens_out, traffic.tokens_in_cached, traffic.tokens_in_cache_write)


class AudioPrice(Section):
    """What a transcription endpoint charges per minute of audio (OpenAI's and most providers' unit): the run's cost
    is reported from the seconds of audio its requests carried."""

    per_audio_minute: Number = Field(ge=0)
    """Per minute of audio sent (each recording's length as its header gives it)."""

    def charge(self, traffic: Traffic) -> float:
        """The price of the audio ``traffic`` carried.

        >>> AudioPrice(per_audio_minute=0.006).charge(Traffic(audio_ms=90_000))
        0.009
        """
        return round(traffic.audio_ms / 60_000 * self.per_audio_minute, 12)


class _Client(Section):
    """How each task sends its rows: shared by an endpoint and a served engine."""

    concurrency: int = Field(DEFAULT_CONCURRENCY, ge=1, le=1024)
    """Requests one task keeps in flight at once."""
    timeout_s: Number = Field(120.0, gt=0)
    """Seconds one request may take before it is retried."""
    max_retries: int = Field(6, ge=0, le=50)
    """Retries of a request answered 408, 409, 429, 500, 502, 503, 504 or 529 (``RETRY_STATUSES`` of
    :mod:`lakescore.udfs.remote.answers`), or lost to a connection error or timeout: exponential backoff with
    jitter, or what the server's ``Retry-After`` says; then the row is dead-lettered ``endpoint_error``."""
    max_consecutive_failures: int = Field(16, ge=1)
    """Failed requests in a row (429s aside) after which the run stops: a dead or refusing endpoint does not burn
    through the table. Nothing is published; the chunks staged so far are kept for the rerun."""
    requests_per_minute: int | None = Field(None, ge=1)
    """Requests per minute, shared by the tasks on one executor host; default: no limit."""
    tokens_per_minute: int | None = Field(None, ge=1)
    """Tokens (prompt plus generate's ``max_new_tokens`` ahead, settled from ``usage`` after) per minute, shared by the
    tasks on one executor host; default: no limit."""


class RemoteEndpoint(_Client):
    """An OpenAI-compatible endpoint: a hosted API, a model serving endpoint, a team's vLLM cluster. What every task's
    ``endpoint`` section holds (``generate.endpoint``, ``embed.endpoint``)."""

    url: Annotated[Text, checked(_url_problem)]
    """The base URL, usually ending ``/v1`` (``https://api.example.com/v1``); requests go to ``<url>/completions``,
    ``<url>/chat/completions`` (generate), ``<url>/embeddings`` (embed) or ``<url>/audio/transcriptions``
    (transcribe)."""
    model: Text
    """The served model's name, as requests name it."""
    api_key_env: Annotated[Text | None, checked(_key_env_problem)] = None
    """The name of the environment variable holding the API key, in upper case (``LLM_API_KEY``); on clusters, see
    docs/generation.md "The key" for how the executors get it without showing it. The key itself is never in the
    config, logs, reports or tables: a value that is not such a name is refused without being shown."""
    revision: Text | None = None
    """A version the user vouches for (a name alone cannot prove the weights behind it did not change): part of the
    model's identity, recorded as ``model_revision``."""

    def identity(self) -> dict:
        """What names the model that answers: its name and the user's revision. Where the endpoint is, how it is
        called and what it costs change no output."""
        return {"model": self.model, "revision": self.revision}


class BatchableEndpoint(RemoteEndpoint):
    """An endpoint whose provider may take the rows as a Batch API's files (``generate.endpoint``,
    ``embed.endpoint``)."""

    batch: BatchOptions | None = None
    """Send the rows through the provider's Batch API (files of requests, at its batch price) instead of one request
    per row; see ``docs/generation.md`` "Provider batches"."""


class EndpointOptions(BatchableEndpoint):
    """An OpenAI-compatible endpoint that generates (``generate.endpoint``): a hosted API, a model serving endpoint, a
    team's vLLM cluster."""

    api: Literal[GENERATE_ENDPOINT_APIS] = "completions"
    """``completions`` (the prompt as it is), ``chat`` (the server's chat template, the system prompt as the system
    message) or ``messages`` (Anthropic's Messages API: ``<url>/messages``, the key sent as ``x-api-key`` with
    ``anthropic-version``; the prompt as the user message, the system prompt as ``system``)."""
    price: Price | None = None
    """``{input: .., output: ..}`` per million tokens: the run's cost in the report, summary, history and metrics."""
    prompt_cache_key: bool | None = None
    """Send OpenAI's ``prompt_cache_key`` with each request (``api`` ``chat`` or ``completions``, per row and in batch
    files): a digest of the prompt's shared part (``generate.prefix_template``'s text where set, else its first
    ``prompt_cache_key_chars`` characters), the same for the rows that share it, so the provider routes them to one
    cache. A hint: it changes no answer, but a server that refuses unknown fields refuses the run in the preflight.
    Default: on for ``chat`` at OpenAI's own API (``api.openai.com``), the one server known to route by it; off
    elsewhere (vLLM ignores it, ``transformers serve`` refuses it on completions, as OpenAI's legacy completions API
    has no such field). Anthropic's hint is ``prefix_template``'s ``cache_control``."""
    prompt_cache_key_chars: int = Field(256, ge=1)
    """Without ``generate.prefix_template``: how many of the prompt's first characters ``prompt_cache_key`` digests
    (shorter: more rows share a key; longer than the shared part: each row a key of its own)."""

    @model_validator(mode="after")
    def _hints(self) -> EndpointOptions:
        if self.prompt_cache_key and self.api == MESSAGES_API:
            raise ConfigError(
                "generate.endpoint.prompt_cache_key is OpenAI's; with api messages the hint is Anthropic's "
                "cache_control, sent for generate.prefix_template"
            )
        return self

    @property
    def sends_prompt_cache_key(self) -> bool:
        """Whether requests carry ``prompt_cache_key``: as set, else for ``chat`` at :data:`OPENAI_HOST`.

        >>> EndpointOptions(url="https://api.openai.com/v1", model="m", api="chat").sends_prompt_cache_key
        True
        >>> EndpointOptions(url="http://vllm:8000/v1", model="m", api="chat").sends_prompt_cache_key
        False
        """
        if self.api == MESSAGES_API:
            return False
        if self.prompt_cache_key is not None:
            return self.prompt_cache_key
        return self.api == "chat" and urlsplit(self.url).hostname == OPENAI_HOST

    def identity(self) -> dict:
        """:meth:`RemoteEndpoint.identity` and the API, which decides the prompt's wrapping."""
        return {**super().identity(), "api": self.api}


class EmbedEndpointOptions(BatchableEndpoint):
    """An OpenAI-compatible ``/v1/embeddings`` endpoint (``embed.endpoint``): a hosted API, a team's vLLM pooling
    server."""

    price: InputPrice | None = None
    """``{input: ..}`` per million prompt tokens: the run's cost in the report, summary, history and metrics."""

    @property
    def api(self) -> str:
        """The one API an embedding endpoint speaks (``<url>/embeddings``): not a setting."""
        return "embeddings"


class TranscribeEndpointOptions(RemoteEndpoint):
    """An OpenAI-compatible ``/v1/audio/transcriptions`` endpoint (``transcribe.endpoint``): a hosted speech API, vLLM
    serving Whisper, ``transformers serve``."""

    price: AudioPrice | None = None
    """``{per_audio_minute: ..}``: the run's cost in the report, summary, history and metrics."""

    @model_validator(mode="before")
    @classmethod
    def _no_batch(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("batch") is not None:
            raise ConfigError(
                "transcribe.endpoint.batch: no provider's Batch API takes audio (OpenAI's batches take chat, "
                "completions and embeddings); drop it, each recording is sent as a request of its own"
            )
        return values

    @property
    def api(self) -> str:
        """The one API a transcription endpoint speaks (``<url>/audio/transcriptions``): not a setting."""
        return "transcriptions"


class ServedEngine(_Client):
    """A served engine lakescore starts once per executor host, on a free local port, for the rows of that host. What
    every task's ``server`` section holds (``generate.server``, ``embed.server``)."""

    engine: Literal[ENGINES]
    """``vllm`` (``vllm serve``), ``sglang`` (``python -m sglang.launch_server``) or ``transformers`` (``transformers
    serve``, generate only). vLLM and SGLang are optional installs with their own CUDA requirements."""
    args: Args = ()
    """The engine's own command-line flags, passed as they are (``[--max-model-len, "4096"]``); lakescore sets the
    model, host and port."""
    startup_timeout_s: Number = Field(600.0, gt=0)
    """Seconds the engine may take to answer its health check (loading weights, compiling) before the task fails."""
    python: Text | None = None
    """The Python interpreter that runs the engine (``<python> -m vllm.entrypoints.openai.api_server``, ``-m
    sglang.launch_server``, ``-m transformers.cli.transformers serve``), so the engine can live in an environment of its
    own (``build/engines/vllm/bin/python``; a relative path is taken from the worker's working directory). Default: the
    engine's command beside the job's own interpreter (``vllm serve``, ``transformers serve``), else on ``PATH``."""

    def identity(self) -> dict:
        """What changes an output besides the model's files: the engine and its flags. Where the engine is installed
        (``python``) is left out, as the path of the default command is: a path names no version."""
        return {"engine": self.engine, "args": list(self.args)}


class ServerOptions(ServedEngine):
    """A served engine that generates (``generate.server``), started once per executor host."""

    api: Literal[ENDPOINT_APIS] = "completions"
    """As ``generate.endpoint.api``."""

    def identity(self) -> dict:
        """:meth:`ServedEngine.identity` and the API."""
        return {**super().identity(), "api": self.api}


EMBEDDING_ENGINES = ("vllm", "sglang")
"""The engines that serve ``/v1/embeddings``: ``transformers serve`` has no such route."""


class EmbedServerOptions(ServedEngine):
    """A served engine that embeds (``embed.server``), started once per executor host on ``/v1/embeddings``: vLLM's
    pooling runner (lakescore adds ``--runner pooling`` unless ``args`` name a runner) or SGLang (``--is-embedding``
    added likewise)."""

    @model_validator(mode="after")
    def _serves_embeddings(self) -> EmbedServerOptions:
        if self.engine not in EMBEDDING_ENGINES:
            raise ConfigError(
                f"embed.server.engine {self.engine}: `transformers serve` has no /v1/embeddings route; "
                f"use {' or '.join(EMBEDDING_ENGINES)}, or embed in-process (drop embed.server)"
            )
        return self


def unsupported_settings(options: Any, api: str) -> list[str]:
    """The generate settings no OpenAI-compatible request through ``api`` can carry, each as the line that refuses
    it."""
    refused = []
    if options.choices:
        # vLLM returns prompt log-probabilities (echo with logprobs), but over the completions API the prompt and the
        # choice go as one text the server tokenizes together, where in-process choices tokenize them apart (and apply
        # the chat template): the scores would not be in-process choices' scores
        refused.append(
            "generate.choices is refused over an endpoint: a choice's log-probability given the prompt would "
            "come from the prompt and the choice sent as one text (echo with logprobs), which the server "
            "tokenizes together, where in-process choices tokenize them apart, so the scores could differ; "
            "run choices in-process, or ask for one word with generate.json_schema (an enum)"
        )
    if options.truncate != "none":
        refused.append(
            "generate.truncate: left needs the model's tokenizer; over an endpoint the server applies its own limit"
        )
    if options.chat_template == "never" and api in ("chat", MESSAGES_API):
        refused.append("generate.chat_template: never needs the completions API")
    if api == MESSAGES_API:
        refused.extend(_messages_unsupported(options))
    return refused


def _messages_unsupported(options: Any) -> list[str]:
    """The generate settings Anthropic's Messages API has no field for (or no such value), each as its refusal."""
    refused = []
    if options.logprobs:
        refused.append(
            "generate.logprobs: Anthropic's Messages API returns no log-probabilities; use api chat or "
            "completions with a server that does"
        )
    for name, neutral in (("repetition_penalty", 1.0), ("min_new_tokens", 0), ("stop_token_ids", ())):
        if getattr(options, name) != neutral:
            refused.append(f"generate.{name}: Anthropic's Messages API has no such setting (api messages)")
    if options.temperature > 1:
        refused.append(f"generate.temperature {options.temperature}: Anthropic's Messages API takes 0 to 1")
    return refused
