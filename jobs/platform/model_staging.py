"""Remote model sources (``s3a://``, ``dbfs:/``, ``abfss://``, ``file:/`` ...) staged to local disk.

Models load from local files. For a source on any filesystem Spark can read:

* the driver copies it once per host into ``<model.cache_dir>/<key>``
  with the Hadoop ``FileSystem`` API (so Spark's own credentials and connectors
  apply), under a host-wide file lock (:func:`lakescore.udfs.model_source.stage_once`):
  concurrent jobs on one host wait for the first copy instead of copying again;
* executors get it through ``SparkContext.addFile(..., recursive=True)``: Spark's
  fetch cache (``spark.files.useFetchCache``, on by default) copies it once per
  host under its own lock, and workers find it with ``SparkFiles``.

The cache key covers the URI and the listing (paths, sizes, modification
times), so a changed remote model is copied again.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from pyspark.sql import SparkSession

from lakescore.udfs.model_source import ModelSourceError, register_staged, stage_once

__all__ = ["stage_remote_model"]

log = logging.getLogger(__name__)

def stage_remote_model(spark: SparkSession, source: str, cache_root: Path) -> Path:
    """Copy remote ``source`` to this host (once) and ship it to the executors; return the local copy.

    Raises :class:`~lakescore.udfs.model_source.ModelSourceError` when the source does not exist or cannot be read.
    """
    sc = spark.sparkContext
    jvm = sc._jvm
    path = jvm.org.apache.hadoop.fs.Path(source)
    try:
        fs = path.getFileSystem(sc._jsc.hadoopConfiguration())
        if not fs.exists(path):
            raise ModelSourceError(f"model {source!r} does not exist")
        listing = _listing(fs, path)
    except ModelSourceError:
        raise
    except Exception as exc:
        raise ModelSourceError(f"cannot read model {source!r}: {str(exc).splitlines()[0] if str(exc) else exc}") from exc

    key = hashlib.sha256((source + "\n" + listing).encode("utf-8")).hexdigest()[:24]
    name = source.rstrip("/").rsplit("/", 1)[-1]

    def copy(tmp: Path) -> None:
        log.info("copying model %s to %s", source, tmp)
        fs.copyToLocalFile(False, path, jvm.org.apache.hadoop.fs.Path(str(tmp / name)), True)

    local = stage_once(key, cache_root.expanduser(), copy) / name
    register_staged(source, local)
    sc.addFile(source, recursive=fs.getFileStatus(path).isDirectory())
    return local


def _listing(fs, path) -> str:
    files = fs.listFiles(path, True)
    entries = []
    while files.hasNext():
        status = files.next()
        entries.append(f"{status.getPath().toString()} {status.getLen()} {status.getModificationTime()}")
    return "\n".join(sorted(entries))
