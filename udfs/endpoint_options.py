"""Settings of the generate task's remote engines: an OpenAI-compatible endpoint (``generate.endpoint``) and a
served engine started on each executor host (``generate.server``). Plain pydantic, importable without the HTTP
client, so the config and the driver read them without it (:mod:`lakescore.udfs.endpoint` is the client)."""

from __future__ import annotations

import re
from typing import Literal, Optional
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ENDPOINT_APIS", "ENGINES", "Price", "EndpointOptions", "ServerOptions", "DEFAULT_CONCURRENCY"]

ENDPOINT_APIS = ("completions", "chat")
"""``completions``: the prompt as it is (``/v1/completions``); ``chat``: the prompt as the user message, the system
prompt as the system message, the server's chat template between them (``/v1/chat/completions``)."""
ENGINES = ("vllm", "sglang", "transformers")
DEFAULT_CONCURRENCY = 16
"""Requests one task keeps in flight: enough to keep a continuous-batching engine's batch full with a few tasks per
executor, few enough that a shared endpoint queues them rather than refusing them."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Settings(BaseModel):
    # frozen: part of the model spec, which is hashed as the worker's cache key; lax, so YAML's 120 is 120.0
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Price(_Settings):
    """What the endpoint charges, per million tokens: the run's cost is reported from each response's ``usage``."""

    input: float = Field(ge=0)
    """Per million prompt tokens."""
    output: float = Field(ge=0)
    """Per million generated tokens."""

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        """The price of ``tokens_in`` prompt and ``tokens_out`` generated tokens."""
        return (tokens_in * self.input + tokens_out * self.output) / 1e6


class _Client(_Settings):
    """How each task sends its rows: shared by an endpoint and a served engine."""

    concurrency: int = Field(DEFAULT_CONCURRENCY, ge=1, le=1024)
    """Requests one task keeps in flight at once."""
    timeout_s: float = Field(120.0, gt=0)
    """Seconds one request may take before it is retried."""
    max_retries: int = Field(6, ge=0, le=50)
    """Retries of a request answered 429 or 5xx, or lost to a connection error or timeout: exponential backoff with
    jitter, or what the server's ``Retry-After`` says; then the row is dead-lettered ``endpoint_error``."""
    max_consecutive_failures: int = Field(16, ge=1)
    """Failed requests in a row (429s aside) after which the run stops: a dead or refusing endpoint does not burn
    through the table. Nothing is published; the chunks staged so far are kept for the rerun."""
    requests_per_minute: Optional[int] = Field(None, ge=1)
    """Requests per minute, shared by the tasks on one executor host; default: no limit."""
    tokens_per_minute: Optional[int] = Field(None, ge=1)
    """Tokens (prompt plus ``max_new_tokens`` ahead, settled from ``usage`` after) per minute, shared by the tasks on
    one executor host; default: no limit."""


class EndpointOptions(_Client):
    """An OpenAI-compatible endpoint: a hosted API, a model serving endpoint, a team's vLLM cluster."""

    url: str
    """The base URL, usually ending ``/v1`` (``https://api.example.com/v1``); requests go to ``<url>/completions`` or
    ``<url>/chat/completions``."""
    model: str
    """The served model's name, as requests name it."""
    api: Literal[ENDPOINT_APIS] = "completions"
    """``completions`` (the prompt as it is) or ``chat`` (the server's chat template, the system prompt as the system
    message)."""
    api_key_env: Optional[str] = None
    """The name of the environment variable holding the API key (on clusters, set ``spark.executorEnv.<NAME>``); the key
    itself is never in the config, logs, reports or tables."""
    revision: Optional[str] = None
    """A version the user vouches for (a name alone cannot prove the weights behind it did not change): part of the
    model's identity, recorded as ``model_revision``."""
    price: Optional[Price] = None
    """``{input: .., output: ..}`` per million tokens: the run's cost in the report, summary, history and metrics."""

    def identity(self) -> dict:
        """What names the model that answers: its name, the API (which decides the prompt's wrapping) and the user's
        revision. Where the endpoint is, how it is called and what it costs change no output."""
        return {"model": self.model, "api": self.api, "revision": self.revision}

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"must be an http:// or https:// base URL, got {value!r}")
        if parts.username or parts.password:
            raise ValueError("holds credentials; give the key through generate.endpoint.api_key_env")
        if parts.query or parts.fragment:
            raise ValueError("must be a base URL without a query or fragment")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError(f"must name an environment variable (letters, digits, _), got {value!r}")
        return value


class ServerOptions(_Client):
    """A served engine lakescore starts once per executor host, on a free local port, for the rows of that host."""

    engine: Literal[ENGINES]
    """``vllm`` (``vllm serve``), ``sglang`` (``python -m sglang.launch_server``) or ``transformers`` (``transformers
    serve``). vLLM and SGLang are optional installs with their own CUDA requirements."""
    args: tuple[str, ...] = ()
    """The engine's own command-line flags, passed as they are (``[--max-model-len, "4096"]``); lakescore sets the model,
    host and port."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """Seconds the engine may take to answer its health check (loading weights, compiling) before the task fails."""
    api: Literal[ENDPOINT_APIS] = "completions"
    """As ``generate.endpoint.api``."""

    def identity(self) -> dict:
        """What changes an output besides the model's files: the engine, its flags and the API."""
        return {"engine": self.engine, "args": list(self.args), "api": self.api}
