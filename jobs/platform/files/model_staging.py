"""Remote and MLflow model sources, staged to local disk on the driver and shipped to the executors.

Models load from local files. Two kinds of source need staging first:

* a URI on any filesystem Spark can read (``s3a://``, ``dbfs:/``, ``abfss://``, ``file:/``...):
  the driver copies it once per host into ``<model.cache_dir>/<key>/<name>``, its key covering the
  URI and the listing (paths, sizes, modification times), so a changed remote model is copied again.
  In a classic session the copy uses the Hadoop ``FileSystem`` (Spark's own credentials and
  connectors) and executors fetch the URI themselves (``addFile``: Spark's fetch cache copies once
  per host); over Spark Connect Spark reads the files for the client and the client ships its copy
  (:mod:`lakescore.jobs.platform.spark.adapter`);
* an MLflow model URI: pinned to a registry version and downloaded by MLflow's client
  (:mod:`lakescore.udfs.models.mlflow_source`), then shipped.

Shipping a local copy is the same in both kinds of session: ``SparkSession.addArtifacts``, a
directory as an archive (unpacked once per executor), so workers find it with ``SparkFiles``
under :func:`~lakescore.udfs.models.model_source.shipped_name`. Copies are made under a host-wide file
lock (:func:`~lakescore.udfs.models.model_source.stage_once`): concurrent jobs on one host wait for the
first copy instead of copying again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import tarfile
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from lakescore.jobs.config import ConfigError
from lakescore.jobs.platform.spark.adapter import NotOnConnect, remote_files
from lakescore.udfs.models.model_source import (
    ModelSourceError,
    ModelSpec,
    is_mlflow_uri,
    needs_staging,
    register_staged,
    shipped_name,
    stage_once,
)

__all__ = ["stage_model", "stage_remote_model"]

log = logging.getLogger(__name__)


def stage_model(spark: SparkSession, spec: ModelSpec, cache_root: Path) -> ModelSpec:
    """Stage ``spec``'s model when it is remote or in MLflow; return the spec the workers load.

    An MLflow URI comes back with ``revision`` set to the registry version (or run id) it was
    pinned to; any other spec comes back as it was. Raises
    :class:`~lakescore.udfs.models.model_source.ModelSourceError` when the model cannot be found or
    fetched, :class:`~lakescore.jobs.config.ConfigError` for ``--revision`` with an MLflow URI.
    """
    if is_mlflow_uri(spec.source):
        return _stage_mlflow_model(spark, spec, cache_root)
    if needs_staging(spec.source):
        stage_remote_model(spark, spec.source, cache_root)
    return spec


def stage_remote_model(spark: SparkSession, source: str, cache_root: Path) -> Path:
    """Copy remote ``source`` to this host (once) and ship it to the executors; return the local copy.

    Raises :class:`~lakescore.udfs.models.model_source.ModelSourceError` when the source does not exist or cannot be
    read.
    """
    files = remote_files(spark, source)
    try:
        listing = files.listing()
    except FileNotFoundError:
        raise ModelSourceError(f"model {source!r} does not exist") from None
    except Exception as exc:
        raise ModelSourceError(
            f"cannot read model {source!r}: {str(exc).splitlines()[0] if str(exc) else exc}"
        ) from exc

    manifest = "\n".join(f"{path} {size} {modified}" for path, size, modified in listing)
    key = hashlib.sha256((source + "\n" + manifest).encode("utf-8")).hexdigest()[:24]
    name = shipped_name(source)

    def copy(tmp: Path) -> None:
        log.info("copying model %s to %s", source, tmp)
        try:
            files.copy_to(tmp / name)
        except NotOnConnect:
            raise
        except Exception as exc:
            raise ModelSourceError(
                f"cannot copy model {source!r}: {str(exc).splitlines()[0] if str(exc) else exc}"
            ) from exc

    local = stage_once(key, cache_root.expanduser(), copy) / name
    register_staged(name, local)
    if not files.ship_source():
        _ship(spark, local, name)
    return local


def _stage_mlflow_model(spark: SparkSession, spec: ModelSpec, cache_root: Path) -> ModelSpec:
    """Pin, download (once per host) and ship the MLflow model of ``spec``; the spec with its revision pinned."""
    from lakescore.udfs.models.mlflow_source import download_model, pin_model

    if spec.revision:
        raise ConfigError(
            f"model {spec.source!r} is an MLflow URI: its version is part of it; drop --revision / model.revision"
        )
    pinned = pin_model(spec.source)
    name = shipped_name(spec.source, pinned.revision)
    local = download_model(pinned, cache_root, name)
    log.info("MLflow model %s is %s (revision %s), staged at %s", spec.source, pinned.uri, pinned.revision, local)
    register_staged(name, local)
    _ship(spark, local, name)
    return dataclasses.replace(spec, revision=pinned.revision)


def _ship(spark: SparkSession, local: Path, name: str) -> None:
    """Make ``local`` reachable on every executor as ``SparkFiles.get(name)`` (classic and Connect sessions alike)."""
    if local.is_dir():
        spark.addArtifacts(f"{_archive(local)}#{name}", archive=True)
    else:  # a single program file: shipped under its own name, which is ``name``
        spark.addArtifacts(str(local), file=True)


def _archive(directory: Path) -> Path:
    """``<directory>.tar`` holding the directory's files (made once; entries relative, as Spark unpacks safely)."""
    archive = directory.with_name(directory.name + ".tar")
    if not archive.exists():
        handle, tmp = tempfile.mkstemp(prefix=f".{archive.name}.", dir=directory.parent)
        os.close(handle)
        with tarfile.open(tmp, "w") as tar:
            for item in sorted(directory.iterdir()):
                tar.add(item, arcname=item.name)
        os.replace(tmp, archive)  # a concurrent maker writes the same bytes; the rename is atomic
    return archive
