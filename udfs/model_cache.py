"""Process-wide model cache: each Python worker loads a model once and reuses it.

Spark reuses Python workers across tasks (``spark.python.worker.reuse``, on by
default), so a module-level cache turns "load per batch" or "load per task"
into "load per process". The key is the whole :class:`~udfs.model_source.ModelSpec`
(task, source, revision, device, head options): two UDFs over the same model
share one copy; a different revision or device is a different entry.

Unlike ``pyspark.ml``'s ``ModelCache`` (LRU of 3 keyed by a per-UDF uuid), the
key is the model's identity, so rebuilding the UDF on the driver does not
force a reload on the executors.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from udfs.model_source import ModelSpec, resolve_model_dir, weights_sha256

__all__ = ["LoadedModel", "get_model", "clear", "HEAD_LOADERS"]


@dataclass(frozen=True)
class LoadedModel:
    """A ready scorer plus the identity of the weights it runs."""

    scorer: Any
    """Has ``score(texts: list[str]) -> np.ndarray`` (one output row per text)."""
    model_dir: Path
    sha256: str
    load_seconds: float


def _load_embed(spec: ModelSpec, model_dir: Path) -> Any:
    from udfs.embed import load_embedder

    return load_embedder(spec, model_dir)


HEAD_LOADERS: dict[str, Callable[[ModelSpec, Path], Any]] = {"embed": _load_embed}
"""Task name -> ``loader(spec, model_dir) -> scorer``. The only per-task part of loading."""

_cache: dict[ModelSpec, LoadedModel] = {}
_lock = threading.Lock()


def get_model(spec: ModelSpec) -> tuple[LoadedModel, bool]:
    """Return ``(model, loaded_now)``: the cached model for ``spec``, loading it on first use.

    Raises ``KeyError`` for a task without a loader; loader and source errors propagate.
    """
    with _lock:
        cached = _cache.get(spec)
        if cached is not None:
            return cached, False
        start = time.perf_counter()
        model_dir = resolve_model_dir(spec.source, spec.revision)
        sha256 = weights_sha256(model_dir)
        scorer = HEAD_LOADERS[spec.task](spec, model_dir)
        loaded = LoadedModel(scorer, model_dir, sha256, time.perf_counter() - start)
        _cache[spec] = loaded
        return loaded, True


def clear() -> None:
    """Drop every cached model (tests, or a long-lived process switching models)."""
    with _lock:
        _cache.clear()
