"""Process-wide model cache: each Python worker loads a model once and reuses it.

Spark reuses Python workers across tasks (``spark.python.worker.reuse``, on by
default), so a module-level cache turns "load per batch" or "load per task"
into "load per process". The key is the whole :class:`~lakescore.udfs.models.model_source.ModelSpec`
(task, source, revision, device, head options) except ``expect_sha256``, which
is checked on every lookup: two UDFs over the same model share one copy (the
executor preflight's and the pinned scoring stage's included); a different
revision or device is a different entry. A lookup also checks that the model's files
are still those it loaded (weights and every other file, by digests cached per file
size and modification time): a model directory edited in place is loaded again, never
served stale from a long-lived worker.

Unlike ``pyspark.ml``'s ``ModelCache`` (LRU of 3 keyed by a per-UDF uuid), the
key is the model's identity, so rebuilding the UDF on the driver does not
force a reload on the executors.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path

from lakescore.udfs.heads.protocol import Head, HoldsResources, ServedElsewhere
from lakescore.udfs.models.model_source import (
    ModelSourceError,
    ModelSpec,
    hub_revision,
    model_file_digests,
    resolve_model_dir,
    verify_sha256,
    weights_sha256,
)
from lakescore.udfs.registry import get_task

__all__ = ["LoadedModel", "get_model", "clear"]


def _as_the_run_names_it(loaded: LoadedModel, expect_sha256: str | None) -> LoadedModel:
    """``loaded``, or, for a model served elsewhere whose ``/v1/models`` this worker could not read, the same head under
    the identity the run pinned: a failed listing is no news (the driver kept the last one,
    ``ServedModel.identity``)."""
    if (
        expect_sha256
        and loaded.model_dir is None
        and isinstance(loaded.scorer, ServedElsewhere)
        and not loaded.scorer.listed()
    ):
        return dataclasses.replace(loaded, sha256=expect_sha256)
    return loaded


def _drop(loaded: LoadedModel | None) -> None:
    if loaded is not None and isinstance(loaded.scorer, HoldsResources):
        loaded.scorer.close()


@dataclass(frozen=True)
class LoadedModel:
    """A ready scorer plus the identity of the weights it runs."""

    scorer: Head
    """The task head (:mod:`lakescore.udfs.heads.protocol`)."""
    model_dir: Path | None
    """Where the files are; ``None`` for a model served elsewhere (``generate.endpoint``), whose head names its
    identity (``sha256``, ``revision``)."""
    sha256: str
    revision: str | None
    """The hub commit the files came from, when known."""
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    """:func:`~lakescore.udfs.models.model_source.model_file_digests` of ``model_dir`` when it was loaded; for a model
    served elsewhere, what its head names in their place (what the endpoint's ``/v1/models`` said of it)."""

    def is_current(self) -> bool:
        """Whether ``model_dir`` still holds the files this model was loaded from; a model served elsewhere: whether its
        head says the server still names the same model (``is_current``, where it has one)."""
        if isinstance(self.scorer, ServedElsewhere) and not self.scorer.is_current():
            return False
        if self.model_dir is None:
            return True
        try:
            return weights_sha256(self.model_dir) == self.sha256 and model_file_digests(self.model_dir) == self.files
        except (OSError, ModelSourceError):  # the directory went away or lost its weights: load again, and fail there
            return False


_cache: dict[ModelSpec, LoadedModel] = {}
_lock = threading.Lock()


def get_model(spec: ModelSpec) -> tuple[LoadedModel, bool]:
    """Return ``(model, loaded_now)``: the cached model for ``spec``, loading it on first use.

    The weights are hashed once per process and checked against ``spec.expect_sha256``
    *before* loading (:class:`~lakescore.udfs.models.model_source.ModelIntegrityError` names both digests).
    Raises ``ValueError`` for an unknown task (:mod:`lakescore.udfs.registry`); loader and source errors propagate.
    """
    key = dataclasses.replace(spec, expect_sha256=None)  # a pin checks the weights; it is not another model
    with _lock:
        cached = _cache.pop(key, None)
        if cached is not None and cached.is_current():
            named = _as_the_run_names_it(cached, spec.expect_sha256)
            verify_sha256(named.sha256, spec.expect_sha256, spec.source)
            _cache[key] = cached
            return named, False
        _drop(cached)  # edited in place since it was loaded: free it (its threads and connections too) before loading
        del cached
        if spec.source is None:  # a model served elsewhere: no files here; the head says which model answers
            scorer = get_task(spec.task).load(key, None)
            if not isinstance(scorer, ServedElsewhere):
                raise TypeError(f"the {spec.task} head loaded without model files is not served elsewhere")
            loaded = LoadedModel(scorer, None, scorer.sha256, scorer.revision, dict(scorer.files))
            named = _as_the_run_names_it(loaded, spec.expect_sha256)
            # the server names another model than the run's preflight found (its /v1/models entry changed): refused
            verify_sha256(named.sha256, spec.expect_sha256, scorer.where)
            _cache[key] = loaded
            return named, True
        model_dir = resolve_model_dir(spec.source, spec.revision)
        sha256 = weights_sha256(model_dir)
        verify_sha256(sha256, spec.expect_sha256, spec.source)
        files = model_file_digests(model_dir)
        scorer = get_task(spec.task).load(key, model_dir)
        revision = hub_revision(model_dir) or spec.revision
        loaded = LoadedModel(scorer, model_dir, sha256, revision, files)
        _cache[key] = loaded
        return loaded, True


def clear() -> None:
    """Drop every cached model (tests, a long-lived process switching models, the worker's exit), closing the heads
    that hold threads or connections."""
    with _lock:
        dropped = list(_cache.values())
        _cache.clear()
    for loaded in dropped:
        _drop(loaded)


atexit.register(
    clear
)  # a worker that exits normally closes its heads' connections (a forked one's end closes them too)
