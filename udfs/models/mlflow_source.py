"""MLflow model URIs as model sources: pinned to a registry version, downloaded once per host.

Sources: ``models:/<name>/<version>``, ``models:/<name>@<alias>`` (the alias is resolved to
the version it points at, once, on the driver) and ``runs:/<run id>/<artifact path>``. A
Unity Catalog model name has three parts (``models:/main.ml.sentiment/3``). Stages and
``latest`` are refused: a run must name the weights it scores with.

:func:`pin_model` resolves the URI with MLflow's own client (tracking and registry URIs as
MLflow finds them: ``MLFLOW_TRACKING_URI``, ``MLFLOW_REGISTRY_URI``, a Databricks workspace).
:func:`download_model` fetches the artifact with ``mlflow.artifacts.download_artifacts`` into
``<cache_root>/<key>/<name>`` under the host-wide lock of
:func:`~lakescore.udfs.models.model_source.stage_once`, keeping only the model directory the flavour
describes, in the layout lakescore's loaders read:

============================  ====================================================================
flavour (``MLmodel``)          model directory
============================  ====================================================================
``sentence_transformers``      ``model.sentence_transformer/`` (``python_function.data``) as saved
``transformers``               ``model/`` (``model_binary``) merged with ``components/<name>/``
                               (tokenizer...), so config, weights and tokenizer sit side by side
``pytorch``                    ``data/`` (``model_data``) holding a ``torch.export`` program
                               (``model.pt2``); a pickled model (``model.pth``) is refused
============================  ====================================================================

Weights are then hashed and checked (``--expect-sha256``, safetensors only) like any local model.
MLflow is an optional dependency (``lakescore[mlflow]``), imported only for these URIs.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lakescore.udfs.models.model_source import ModelSourceError, stage_once

__all__ = ["PinnedModel", "check_uri", "pin_model", "download_model", "model_directory"]

_REGISTERED = re.compile(r"models:/(?P<name>[^/@]+)(?:/(?P<version>[0-9]+)|@(?P<alias>[^/@]+))")
_RUN = re.compile(r"runs:/(?P<run>[^/]+)/(?P<path>.+)")


@dataclass(frozen=True)
class PinnedModel:
    """An MLflow model URI that names fixed artifacts, and the revision every output row records."""

    uri: str
    """``models:/<name>/<version>`` or ``runs:/<run id>/<path>``."""
    revision: str
    """The registry version (an alias resolved), or the run id."""


def check_uri(source: str) -> re.Match:
    """The parts of MLflow URI ``source`` (no MLflow call); :class:`ModelSourceError` for one that names no fixed
    model."""
    match = _RUN.fullmatch(source) or _REGISTERED.fullmatch(source)
    if not match:
        raise ModelSourceError(
            f"model {source!r} is not an MLflow URI lakescore can pin: use models:/<name>/<version>, "
            "models:/<name>@<alias> or runs:/<run id>/<path> (stages and 'latest' move under a running job)"
        )
    return match


def pin_model(source: str) -> PinnedModel:
    """Resolve ``source`` to fixed artifacts with MLflow's client; one-line :class:`ModelSourceError` otherwise."""
    parts = check_uri(source)
    if "run" in parts.groupdict():
        return PinnedModel(source, parts["run"])
    name = parts["name"]
    client = _mlflow().MlflowClient()
    try:
        if parts["alias"]:
            version = client.get_model_version_by_alias(name, parts["alias"]).version
        else:
            version = client.get_model_version(name, parts["version"]).version
    except Exception as exc:  # MlflowException, connection errors: one line naming the source
        raise ModelSourceError(f"MLflow cannot resolve model {source!r}: {_first_line(exc)}") from exc
    return PinnedModel(f"models:/{name}/{version}", str(version))


def download_model(pinned: PinnedModel, cache_root: Path, name: str) -> Path:
    """The model directory of ``pinned`` on this host, ``<cache_root>/<key>/<name>``, downloaded once per host.

    The key covers the tracking and registry URIs and the pinned URI (a registry version's
    artifacts never change). Raises :class:`ModelSourceError` when the download fails or the
    artifact holds no model lakescore can load (:func:`model_directory`).
    """
    mlflow = _mlflow()
    where = f"{mlflow.get_tracking_uri()}\n{mlflow.get_registry_uri()}\n{pinned.uri}"
    key = hashlib.sha256(where.encode("utf-8")).hexdigest()[:24]

    def copy(tmp: Path) -> None:
        try:
            artifact = Path(
                mlflow.artifacts.download_artifacts(artifact_uri=pinned.uri, dst_path=str(tmp / "artifact"))
            )
        except Exception as exc:
            raise ModelSourceError(f"MLflow cannot download model {pinned.uri!r}: {_first_line(exc)}") from exc
        model_directory(artifact, tmp / name)
        shutil.rmtree(tmp / "artifact", ignore_errors=True)

    return stage_once(key, cache_root.expanduser(), copy) / name


def model_directory(artifact: Path, target: Path) -> None:
    """Move the model directory of the MLflow model at ``artifact`` to ``target`` (see the module docstring).

    Raises :class:`ModelSourceError` for an artifact without an ``MLmodel`` file, a transformers
    model logged without its weights, a pickled pytorch model, or no flavour lakescore reads.
    """
    flavors = _flavors(artifact)
    if "sentence_transformers" in flavors:
        data = flavors.get("python_function", {}).get("data", "model.sentence_transformer")
        shutil.move(str(artifact / data), str(target))
    elif "transformers" in flavors:
        _merge_transformers(artifact, flavors["transformers"], target)
    elif "pytorch" in flavors:
        data = artifact / flavors["pytorch"].get("model_data", "data")
        if not (data / "model.pt2").is_file():
            raise ModelSourceError(
                f"MLflow pytorch model at {artifact} is pickled ({', '.join(p.name for p in data.iterdir())}); "
                "lakescore loads torch.export programs only: log it with mlflow.pytorch.log_model(..., "
                "serialization_format='pt2')"
            )
        shutil.move(str(data), str(target))
    else:
        raise ModelSourceError(
            f"MLflow model at {artifact} has flavours {sorted(flavors)}; lakescore reads sentence_transformers, "
            "transformers and pytorch (torch.export) models"
        )


def _merge_transformers(artifact: Path, flavor: dict[str, Any], target: Path) -> None:
    """The transformers flavour's weights directory and its components (tokenizer...) as one directory."""
    binary = flavor.get("model_binary")
    if not binary or not (artifact / binary).is_dir():
        raise ModelSourceError(
            f"MLflow transformers model at {artifact} holds no weights (logged with save_pretrained=False?); "
            "log it with its weights"
        )
    shutil.move(str(artifact / binary), str(target))
    for component in flavor.get("components") or ():
        for item in (artifact / "components" / component).iterdir():
            if not (target / item.name).exists():
                shutil.move(str(item), str(target / item.name))


def _flavors(artifact: Path) -> dict[str, Any]:
    import yaml

    mlmodel = artifact / "MLmodel"
    if not mlmodel.is_file():
        raise ModelSourceError(f"{artifact} is not an MLflow model (no MLmodel file)")
    return dict(yaml.safe_load(mlmodel.read_text(encoding="utf-8")).get("flavors") or {})


def _mlflow():
    try:
        import mlflow
        import mlflow.artifacts
    except ImportError as exc:
        raise ModelSourceError("MLflow model URIs need MLflow: pip install 'lakescore[mlflow]'") from exc
    return mlflow


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
