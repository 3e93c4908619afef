"""What every remote head shares: the client it opens (an endpoint, or this host's served engine), the model's
identity from ``/v1/models``, the thread pool that keeps ``concurrency`` requests in flight, the features only a
remote head has (request counts, ``close``) as methods of the head protocol, and ``close``.

A task's remote head (:mod:`~lakescore.udfs.remote.generate`; :mod:`~lakescore.udfs.remote.embed` over
``/v1/embeddings``) subclasses :class:`RemoteHead` and adds how one row becomes a request and an answer becomes its
output.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lakescore.schemas.reasons import ENDPOINT_ERROR
from lakescore.schemas.traffic import Traffic
from lakescore.udfs.batching import Scored
from lakescore.udfs.options.remote import MESSAGES_API, MODELS_LISTING, EndpointOptions, RemoteEndpoint, ServedEngine
from lakescore.udfs.remote import messages
from lakescore.udfs.remote.answers import EndpointDown, EndpointError
from lakescore.udfs.remote.client import EndpointClient, Reply, bearer_headers

if TYPE_CHECKING:
    from lakescore.udfs.remote.engine import EngineServer

__all__ = [
    "RemoteHead",
    "open_client",
    "endpoint_identity",
    "models_listing",
    "canonical_entry",
    "canonical_json",
    "PER_ANSWER_S",
]


PER_ANSWER_S = 60.0
"""A ``created`` this close to the ``/v1/models`` answer's own time is the answer's time, not the model's (vLLM's and
LMDeploy's servers, for two, stamp every answer with the time it was made): it is left out of the identity."""


def canonical_json(value: Any) -> str:
    """``value`` as one stable JSON text: keys sorted, no blanks, characters as they are. Equal values give equal texts
    whatever order or layout the server wrote them in."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_entry(entry: Mapping[str, Any], answered_at: float) -> dict[str, Any]:
    """A ``/v1/models`` entry as the model's identity takes it: every field the server gives (``id``, ``created``,
    ``owned_by``, ``root``, ``max_model_len``, ...) but those made afresh for each answer, which would make every run
    look like a new model: ``created`` when it is within :data:`PER_ANSWER_S` of ``answered_at`` (the answer's
    ``Date``), and the ``id`` and ``created`` of each ``permission`` entry (vLLM draws them per answer)."""
    kept = json.loads(json.dumps(dict(entry)))  # plain JSON values: what the report and the commit metadata hold
    created = kept.get("created")
    if (
        isinstance(created, (int, float))
        and not isinstance(created, bool)
        and abs(created - answered_at) <= PER_ANSWER_S
    ):
        del kept["created"]
    if isinstance(kept.get("permission"), list):
        kept["permission"] = [
            {k: v for k, v in p.items() if k not in ("id", "created")} if isinstance(p, dict) else p
            for p in kept["permission"]
        ]
    return kept


def models_listing(reply: Reply | None, model: str) -> str:
    """What ``/v1/models`` says of ``model``, as canonical JSON (:func:`canonical_json`): ``{"answered": false}`` when
    the server did not answer it (404, an error, not JSON), ``{"answered": true, "entry": null}`` when its answer does
    not list the model (``transformers serve`` lists its hub cache, not what it serves), else ``{"answered": true,
    "entry": {...}}`` with the model's entry (:func:`canonical_entry`)."""
    if reply is None:
        return canonical_json({"answered": False})
    answered_at = time.time()
    date = reply.headers.get("date")
    if date:
        try:
            answered_at = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            pass
    models = reply.body.get("data") if isinstance(reply.body, Mapping) else None
    entry = next(
        (m for m in (models if isinstance(models, list) else ()) if isinstance(m, Mapping) and m.get("id") == model),
        None,
    )
    return canonical_json({"answered": True, "entry": None if entry is None else canonical_entry(entry, answered_at)})


def endpoint_identity(model: str, listing: str, revision: str | None) -> str:
    """The digest recorded as ``model_sha256`` for a model served elsewhere: its name, what ``/v1/models`` says of it
    (``listing``, :func:`models_listing`) and the user's ``revision``. A name alone cannot prove the weights behind
    it did not change; this is what the server lets a client see."""
    facts = {"model": model, "listing": json.loads(listing), "revision": revision}
    return hashlib.sha256(canonical_json(facts).encode()).hexdigest()


class RemoteHead:
    """A head whose rows are answered by ``client`` (an endpoint, or the engine ``server`` on this host): its identity
    (``sha256``, ``files``, ``revision``), ``concurrency`` requests in flight, its request counts and ``close``."""

    def __init__(self, client: EndpointClient, revision: str | None = None, server: EngineServer | None = None) -> None:
        self.client, self.revision, self.server = client, revision, server
        """``server``: the engine served on this host (:class:`~lakescore.udfs.remote.engine.EngineServer`), or
        ``None``."""
        self.pool = ThreadPoolExecutor(max_workers=client.settings.concurrency, thread_name_prefix="lakescore-endpoint")
        self.listing = self._listing()
        """What ``/v1/models`` said of the model when this head was made (:func:`models_listing`)."""
        self.sha256 = endpoint_identity(client.model, self.listing, revision)
        self.files = {MODELS_LISTING: self.listing}
        """The identity's stand-in for the model's files (a model served elsewhere has none here): part of the scoring
        spec that incremental runs compare and commit, and of the run report."""

    def _listing(self) -> str:
        """One ``GET /v1/models`` (the preflight's first request; the request that follows proves the model answers).
        Keeps the ids it lists in :attr:`served`, for :meth:`not_served`."""
        reply = self.client.get("/models")
        models = reply.body.get("data") if reply is not None and isinstance(reply.body, Mapping) else None
        self.served: tuple[str, ...] = tuple(
            str(m["id"]) for m in (models if isinstance(models, list) else ()) if isinstance(m, Mapping) and "id" in m
        )
        """The model ids ``/v1/models`` listed when this head was made (none when it did not answer)."""
        return models_listing(reply, self.client.model)

    def not_served(self, error: EndpointError) -> str | None:
        """The preflight's line for a request the server failed because it does not serve :attr:`client`'s model (a
        404, or an error that says the model is not found), naming what it lists; ``None`` for any other failure."""
        said = error.message.lower()
        if error.status != 404 and not (
            error.status is not None and "model" in said and ("not found" in said or "does not exist" in said)
        ):
            return None
        listed = (
            f"; it lists {', '.join(self.served[:10])}{' ...' if len(self.served) > 10 else ''}" if self.served else ""
        )
        return f"{self.where} does not serve the model {self.client.model!r} (the preflight's request: {error}){listed}"

    @property
    def where(self) -> str:
        return f"endpoint {self.client.url} (model {self.client.model})"

    def is_current(self) -> bool:
        """Whether ``/v1/models`` still says what it said when this head was made: the model cache asks before it
        hands the head to a task, so a run never scores under another run's identity of the model. Only an answer
        that differs counts: one that fails now (a passing error, a server that never answers it) is no news."""
        if self.server is not None or not json.loads(self.listing)["answered"]:
            return True
        reply = self.client.get("/models")
        return reply is None or models_listing(reply, self.client.model) == self.listing

    def listed(self) -> bool:
        """Whether ``/v1/models`` answered when this head was made (else the head has no news of the model)."""
        return bool(json.loads(self.listing)["answered"])

    def traffic(self) -> Traffic:
        """What this process's client sent so far (:class:`~lakescore.udfs.heads.protocol.MetersTraffic`)."""
        return self.client.stats.traffic

    def default_max_tokens(self, device: str) -> int:
        return 1 << 30  # batches are cut by the Arrow batch; the server batches the requests itself

    def send(
        self, items: Sequence[Any], one: Callable[[Any], Any], present: Sequence[int], reasons: list[str | None]
    ) -> Scored:
        """``one(items[i])`` for each ``i`` in ``present``, ``concurrency`` at a time: the outputs, with ``reasons``
        (and the scrubbed error) ``endpoint_error`` for a row the server failed; :class:`EndpointDown` (the run stops)
        when the endpoint failed too many requests in a row."""
        n = len(items)
        errors: list[str | None] = [None] * n
        outputs = np.empty(n, dtype=object)
        futures: dict[Future, int] = {self.pool.submit(one, i): i for i in present}
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        down = next((f.exception() for f in done if isinstance(f.exception(), EndpointDown)), None)
        if down is not None:
            for future in pending:
                future.cancel()
            raise down
        for future, i in futures.items():
            error = future.exception()
            if error is None:
                outputs[i] = future.result()
            elif isinstance(error, EndpointDown):
                raise error
            else:  # every text from a server passes the one scrubber before it reaches the errors table
                text = str(error) if isinstance(error, EndpointError) else f"{type(error).__name__}: {error}"
                reasons[i] = error.reason if isinstance(error, EndpointError) else ENDPOINT_ERROR
                errors[i] = self.client.scrub(text)[:2000]
        return Scored(outputs, reasons, errors)

    def close(self) -> None:
        """Stop the thread pool and close the client's connections."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def open_client(
    endpoint: RemoteEndpoint | None, server: ServedEngine | None, model_dir: Path | None
) -> tuple[EndpointClient, EngineServer | None]:
    """The client for ``endpoint`` (:class:`~lakescore.udfs.options.remote.EndpointOptions`), or for ``server``: this
    host's engine serving ``model_dir``, started when no process of the host has started it yet; and the engine
    (``None`` for an endpoint). :class:`~lakescore.udfs.remote.answers.EndpointRefused` for a key named but not set;
    :class:`~lakescore.udfs.remote.engine.EngineStartError` for an engine that does not come up."""
    from lakescore.udfs.remote.engine import HOST, EngineServer, engine_gpus, task_gpus

    if endpoint is not None:
        auth = (
            messages.auth_headers
            if isinstance(endpoint, EndpointOptions) and endpoint.api == MESSAGES_API
            else bearer_headers
        )
        key = EndpointClient.key_from_env(endpoint)
        return EndpointClient(endpoint, endpoint.url, endpoint.model, api_key=key, auth=auth), None
    if server is None:
        raise ValueError("open_client needs an endpoint or a server")
    engine = EngineServer(
        server.engine,
        str(model_dir),
        server.args,
        server.startup_timeout_s,
        python=server.python,
        gpus=engine_gpus(server.args, task_gpus()),
    )
    url = engine.url()

    def recover() -> bool:  # the engine crashed: start it again (once per process), on whatever port it then has
        if not engine.recover():  # down again after its restart: the run stops, quoting the engine's own error
            raise EndpointDown(
                f"the served {engine.engine} engine serving {engine.name} stopped again after "
                f"its restart; its error: {engine.error() or 'none in its log ' + str(engine.log_path)}"
            )
        client.url = f"http://{HOST}:{engine.port}/v1"
        return True

    client = EndpointClient(server, url, engine.name, recover=recover)
    return client, engine
