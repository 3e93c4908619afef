"""Delta Lake jars for pip-installed Spark: which Maven artifact, and a local copy of it.

``delta.configure_spark_with_delta_pip`` resolves the jars from Maven at every
session start and overwrites ``spark.jars.packages``. lakescore instead fetches
them once (``make setup`` runs ``lakescore fetch-jars``) with Spark's own Ivy
resolver, keeps the resolved jar files in ``spark.jars_dir``, and starts later
sessions with ``spark.jars`` pointing at them: no resolution, no network, and
user ``spark.jars.packages`` left alone.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Optional

__all__ = ["delta_maven_coordinate", "cached_delta_jars", "fetch_delta_jars"]

log = logging.getLogger(__name__)

_COMPLETE = ".complete"


def delta_maven_coordinate(delta_version: Optional[str] = None, spark_version: Optional[str] = None) -> str:
    """Maven coordinate of the Delta jar matching the installed delta-spark and pyspark.

    Since Delta 4.1 the artifact name carries the Spark line (``delta-spark_4.1_2.13``);
    earlier 4.x releases use ``delta-spark_2.13``.
    """
    delta_version = delta_version or metadata.version("delta-spark")
    if spark_version is None:
        import pyspark

        spark_version = pyspark.__version__
    delta_mm = tuple(int(p) for p in delta_version.split(".")[:2])
    spark_mm = ".".join(spark_version.split(".")[:2])
    if delta_mm >= (4, 1):
        return f"io.delta:delta-spark_{spark_mm}_2.13:{delta_version}"
    return f"io.delta:delta-spark_2.13:{delta_version}"


def _dir_for(jars_dir: Path, coordinate: str) -> Path:
    return jars_dir.expanduser() / coordinate.replace(":", "__")


def cached_delta_jars(jars_dir: Path, coordinate: Optional[str] = None) -> Optional[list[Path]]:
    """The fetched jar files for ``coordinate``, or ``None`` if they were never fetched completely."""
    target = _dir_for(jars_dir, coordinate or delta_maven_coordinate())
    if not (target / _COMPLETE).is_file():
        return None
    return sorted(target.glob("*.jar"))


def fetch_delta_jars(jars_dir: Path, coordinate: Optional[str] = None) -> list[Path]:
    """Resolve ``coordinate`` and its dependencies with Spark's Ivy resolver into ``jars_dir``.

    Idempotent: returns the existing copy if one is complete. Needs Maven Central
    (or the repositories in ``spark.jars.repositories``) once.
    """
    coordinate = coordinate or delta_maven_coordinate()
    existing = cached_delta_jars(jars_dir, coordinate)
    if existing:
        return existing
    from pyspark.sql import SparkSession

    target = _dir_for(jars_dir, coordinate)
    with tempfile.TemporaryDirectory(prefix="lakescore-ivy-") as ivy:
        log.info("resolving %s from Maven", coordinate)
        spark = (
            SparkSession.builder.master("local[1]")
            .appName("lakescore-fetch-jars")
            .config("spark.jars.packages", coordinate)
            .config("spark.jars.ivy", ivy)
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.stop()
        resolved = sorted(Path(ivy, "jars").glob("*.jar"))
        if not resolved:
            raise RuntimeError(f"Spark resolved no jars for {coordinate}")
        target.mkdir(parents=True, exist_ok=True)
        for jar in resolved:
            shutil.copy2(jar, target / jar.name)
    (target / _COMPLETE).write_text(coordinate + "\n", encoding="utf-8")
    return sorted(target.glob("*.jar"))
