"""The ``generate`` head over an OpenAI-compatible server: an endpoint (``generate.endpoint``) or the engine served on
this host (``generate.server``, :mod:`lakescore.udfs.engine_server`).

It takes the place of :class:`~lakescore.udfs.heads.generate.Generator` behind the prompt runner: no tokenizer and no
weights here, each present prompt one request (:mod:`lakescore.udfs.endpoint`), the rows of a batch in flight together
(``concurrency`` of them). The output columns are the in-process head's (:func:`~lakescore.udfs.heads.generate.generation_columns`);
``prompt_tokens`` and ``completion_tokens`` are what the server's ``usage`` reports. A row the server fails is
``endpoint_error``; the run stops on :class:`~lakescore.udfs.endpoint.EndpointDown`.

The executors' preflight (:meth:`EndpointGenerator.score`) sends one request with every setting of the run: a setting
the server refuses, or ignores where the answer shows it (no log-probabilities, text that is not the schema's JSON),
is refused there, in one line, before any row is sent.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from lakescore.udfs.batching import Scored
from lakescore.udfs.endpoint import Completion, EndpointClient, EndpointDown, EndpointError, EndpointRefused
from lakescore.udfs.heads.generate import Generation, generation_columns

__all__ = ["EndpointGenerator", "endpoint_identity", "load_remote_generator"]

PROMPTS, KEYS = "prompts", "keys"
"""Feature keys: the present prompts and their row keys (what sampled rows' seeds derive from)."""


def endpoint_identity(model: str, listed: Optional[Mapping[str, Any]], revision: Optional[str]) -> str:
    """The digest recorded as ``model_sha256`` for a served model: its name, what ``/v1/models`` says of it
    (``listed``, where the server answers) and the user's ``revision``. A name alone cannot prove the weights behind
    it did not change; this is what the server lets a client see."""
    facts = {"model": model, "listed": dict(listed) if listed else None, "revision": revision}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


class EndpointGenerator:
    """The generate head for prompts answered by ``client`` under the generate settings ``options``: ``tokenize``
    keeps the prompts, ``score_prompts`` sends them, ``columns`` writes the task's output columns."""

    padding_side = "left"

    def __init__(self, client: EndpointClient, options: Any, output_types: Sequence[Any], revision: Optional[str] = None,
                 server: Any = None) -> None:
        self.client, self.options, self._output_types = client, options, output_types
        self.revision = revision
        self.server = server
        """The engine served on this host (:class:`~lakescore.udfs.engine_server.EngineServer`), or ``None``."""
        self.pool = ThreadPoolExecutor(max_workers=client.settings.concurrency, thread_name_prefix="lakescore-endpoint")
        self.listed = self._listed_model()
        self.sha256 = endpoint_identity(client.model, self.listed, revision)

    def _listed_model(self) -> Optional[Mapping[str, Any]]:
        """What ``/v1/models`` says of the served model; ``None`` where the server does not answer it or does not list
        the model (``transformers serve`` lists its cache, not what it serves: the preflight request is what proves the
        model is there)."""
        reply = self.client.get("/models")
        models = reply.body.get("data") if reply is not None else None
        for entry in models if isinstance(models, list) else ():
            if isinstance(entry, Mapping) and entry.get("id") == self.client.model:
                return {k: v for k, v in entry.items() if k != "created"}  # a reload's time is not another model
        return None

    # -- the runner's interface ------------------------------------------------------------------------------------

    def default_max_tokens(self, device: str) -> int:
        return 1 << 30  # batches are cut by the Arrow batch; the server batches the requests itself

    def tokenize(self, prompts: list[str], keys: Optional[Sequence[str]] = None) -> dict[str, Any]:
        """The prompts as they are (the server tokenizes) and each row's key."""
        rows = np.empty(len(prompts), dtype=object)
        rows[:] = list(prompts)
        row_keys = np.empty(len(prompts), dtype=object)
        row_keys[:] = list(keys) if keys is not None else list(prompts)
        return {PROMPTS: rows, KEYS: row_keys}

    def row_cost(self, features: Mapping[str, Any]) -> np.ndarray:
        """One per row: the server plans its own batches."""
        return np.ones(len(features[PROMPTS]), dtype=np.int64)

    def score_prompts(self, prompts: Sequence[Optional[str]], policy: Any, keys: Optional[Sequence[str]] = None,
                      features: Optional[Mapping[str, Any]] = None) -> Scored:
        """Send every present prompt, ``concurrency`` at a time: each row's :class:`Generation`, ``null_input`` for a
        null prompt, ``endpoint_error`` with the status and message for a row the server failed.
        :class:`EndpointDown` (the run stops) when the endpoint failed too many requests in a row."""
        n = len(prompts)
        reasons: list[Optional[str]] = [None if isinstance(p, str) else "null_input" for p in prompts]
        errors: list[Optional[str]] = [None] * n
        outputs = np.empty(n, dtype=object)
        present = [i for i in range(n) if reasons[i] is None]
        futures: dict[Future, int] = {
            self.pool.submit(self._one, prompts[i], None if keys is None else keys[i]): i for i in present
        }
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
            elif isinstance(error, EndpointError):
                reasons[i], errors[i] = "endpoint_error", str(error)[:2000]
            elif isinstance(error, EndpointDown):
                raise error
            else:
                reasons[i], errors[i] = "endpoint_error", f"{type(error).__name__}: {error}"[:2000]
        return Scored(outputs, reasons, errors)

    def _one(self, prompt: str, key: Optional[str]) -> Generation:
        seed = None
        if not self.options.greedy:
            from lakescore.udfs.heads.seeds import row_seed

            seed = row_seed(self.options.seed, "" if key is None else str(key))
        completion = self.client.complete(self.options, prompt, seed)
        self._check_json(completion)
        return Generation(completion.text, completion.finish_reason, completion.prompt_tokens, completion.completion_tokens)

    def _check_json(self, completion: Completion) -> None:
        """A finished text under ``json_schema`` must be JSON that validates: the row's :class:`EndpointError`
        otherwise (a text cut at ``max_new_tokens`` is kept, ``length``, as in-process)."""
        if self.options.json_schema is None or completion.finish_reason == "length":
            return
        from jsonschema import ValidationError, validate

        try:
            validate(json.loads(completion.text), json.loads(self.options.json_schema))
        except (ValueError, ValidationError) as exc:
            message = exc.message if isinstance(exc, ValidationError) else str(exc)
            raise EndpointError(200, f"the text is not JSON valid against generate.json_schema: {message}"[:500]) from None

    def columns(self, outputs: np.ndarray, ok: np.ndarray):
        return generation_columns(outputs, ok, self._output_types)

    def score(self, prompts: list[str]) -> np.ndarray:
        """The executors' preflight: ``prompts`` sent with every setting of the run; :class:`EndpointRefused` in one
        line when the server refuses one, or its answer shows it ignored one."""
        outputs = np.empty(len(prompts), dtype=object)
        for i, prompt in enumerate(prompts):
            outputs[i] = self._preflight_one(prompt)
        return outputs

    def _preflight_one(self, prompt: str) -> Generation:
        where = f"endpoint {self.client.url} (model {self.client.model})"
        try:
            return self._one(prompt, prompt)
        except EndpointDown as exc:
            raise EndpointRefused(str(exc)) from None
        except EndpointError as exc:
            if exc.status == 200:
                raise EndpointRefused(f"{where} does not honour generate.json_schema (response_format): {exc.message}") from None
            raise EndpointRefused(f"{where} refused the run's settings: {exc}") from None

    @staticmethod
    def fidelity(reference: np.ndarray, outputs: np.ndarray) -> dict[str, float]:
        from lakescore.udfs.heads.generate import Generator

        return Generator.fidelity(reference, outputs)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def load_remote_generator(spec: Any, model_dir: Optional[Path]) -> EndpointGenerator:
    """The head for ``spec.generate.endpoint`` (``model_dir`` ``None``: no files here), or for ``spec.generate.server``:
    this host's engine serving ``model_dir``, started when no process of the host has started it yet.
    :class:`EndpointRefused` for a setting no request can carry, or a key named but not set;
    :class:`~lakescore.udfs.engine_server.EngineStartError` for an engine that does not come up."""
    from lakescore.udfs.engine_server import HOST, EngineServer
    from lakescore.udfs.registry import get_task

    options = spec.generate
    endpoint, server = options.endpoint, options.server
    types = get_task(spec.task).output_arrow_types
    if endpoint is not None:
        client = EndpointClient(endpoint, endpoint.url, endpoint.model, api_key=EndpointClient.key_from_env(endpoint))
        return EndpointGenerator(client, options, types, endpoint.revision)
    engine = EngineServer(server.engine, str(model_dir), server.args, server.startup_timeout_s, env=_engine_env())
    url = engine.url()

    def recover() -> bool:  # the engine crashed: start it again (once per process), on whatever port it then has
        if not engine.recover():
            return False
        client.url = f"http://{HOST}:{engine.port}/v1"
        return True

    client = EndpointClient(server, url, engine.name, recover=recover)
    return EndpointGenerator(client, options, types, spec.revision, server=engine)


def _engine_env() -> Optional[dict[str, str]]:
    """The engine's environment: this worker's, with ``CUDA_VISIBLE_DEVICES`` the GPU Spark gave the task (the scoring
    stage's resource profile), so the engine takes that GPU as in-process scoring does; ``None`` (inherit) without one."""
    import os

    from lakescore.udfs.models.devices import task_gpu_address

    address = task_gpu_address()
    return None if address is None else {**os.environ, "CUDA_VISIBLE_DEVICES": address}
