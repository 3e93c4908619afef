"""Maven jars for pip-installed Spark: which artifacts, and one local copy of each.

Two artifacts are known: Delta Lake (every session lakescore builds) and the
Hadoop S3A connector (sessions that read or write ``s3a://``). Spark can
resolve either from Maven at every session start through
``spark.jars.packages``; lakescore instead fetches each once
(``lakescore fetch-jars``, run by ``make setup``) with Spark's own Ivy
resolver, keeps the resolved jar files in ``spark.jars_dir/<coordinate>/`` and
starts later sessions with ``spark.jars`` pointing at them: no resolution, no
network, and user ``spark.jars.packages`` left alone.

A coordinate's directory is complete when it holds a ``.complete`` marker; it
only ever appears complete (resolved in a scratch directory, then renamed).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path

__all__ = ["delta_coordinate", "hadoop_version", "find_spark_home", "s3a_coordinate", "cached_jars", "fetch_jars"]

log = logging.getLogger(__name__)

_COMPLETE = ".complete"


def delta_coordinate(delta_version: str | None = None, spark_version: str | None = None) -> str:
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


def find_spark_home(environ: Mapping[str, str] = os.environ) -> Path:
    """The Spark installation pyspark's launcher starts: ``$SPARK_HOME``, else the pip pyspark package directory."""
    if environ.get("SPARK_HOME"):
        return Path(environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).parent


def hadoop_version(spark_home: os.PathLike | str | None = None) -> str:
    """The Hadoop version the Spark installation bundles, read from its ``jars/`` file names.

    ``spark_home`` defaults to ``$SPARK_HOME``, else the pyspark package directory (pip
    pyspark 4.1.1 bundles ``hadoop-client-api-3.4.2.jar``). Raises :class:`RuntimeError`
    when no ``hadoop-client-api-*.jar`` or ``hadoop-common-*.jar`` is there (a
    "Hadoop-free" Spark build: use the platform's own hadoop-aws).
    """
    jars = Path(spark_home if spark_home is not None else find_spark_home()) / "jars"
    pattern = re.compile(r"hadoop-(?:client-api|common)-(\d+\.\d+\.\d+)\.jar")
    versions = sorted({m.group(1) for p in jars.glob("hadoop-*.jar") if (m := pattern.fullmatch(p.name))})
    if len(versions) != 1:
        found = ", ".join(versions) or "none"
        raise RuntimeError(
            f"cannot tell the Hadoop version of the Spark in {jars}: hadoop-client-api/-common jars found: {found}"
        )
    return versions[0]


def s3a_coordinate(version: str | None = None) -> str:
    """Maven coordinate of the S3A connector (``hadoop-aws``) for ``version``, default the bundled Hadoop's.

    hadoop-aws must match Hadoop exactly; it brings the AWS SDK v2 ``bundle`` jar it was built with.
    """
    return f"org.apache.hadoop:hadoop-aws:{version or hadoop_version()}"


def _dir_for(jars_dir: Path, coordinate: str) -> Path:
    return Path(jars_dir).expanduser() / coordinate.replace(":", "__")


def cached_jars(jars_dir: os.PathLike | str, coordinate: str) -> list[Path] | None:
    """The fetched jar files for ``coordinate``, or ``None`` if they were never fetched completely."""
    target = _dir_for(Path(jars_dir), coordinate)
    if not (target / _COMPLETE).is_file():
        return None
    return sorted(target.glob("*.jar"))


def fetch_jars(jars_dir: os.PathLike | str, coordinates: Sequence[str]) -> dict[str, list[Path]]:
    """Resolve each of ``coordinates`` with its dependencies into ``jars_dir``; return its jar files.

    Idempotent: a coordinate already complete there is not resolved again. Needs Maven
    Central (or the repositories in ``spark.jars.repositories``) for the others. Raises
    :class:`RuntimeError` when a resolution fails or yields no jar.
    """
    root = Path(jars_dir).expanduser()
    fetched: dict[str, list[Path]] = {}
    for coordinate in coordinates:
        existing = cached_jars(root, coordinate)
        if existing is None:
            root.mkdir(parents=True, exist_ok=True)
            _resolve_into(root, coordinate)
            existing = cached_jars(root, coordinate)
            assert existing is not None
        fetched[coordinate] = existing
    return fetched


# Spark resolves spark.jars.packages only when it launches its JVM, and a Python process
# launches one JVM at most, so every coordinate is resolved by a fresh interpreter.
_RESOLVE_SCRIPT = """
import sys
from pyspark.sql import SparkSession
coordinate, ivy = sys.argv[1:3]
SparkSession.builder.master("local[1]").appName("lakescore-fetch-jars") \\
    .config("spark.jars.packages", coordinate).config("spark.jars.ivy", ivy) \\
    .config("spark.ui.enabled", "false").getOrCreate().stop()
"""


def _resolve_into(root: Path, coordinate: str) -> None:
    target = _dir_for(root, coordinate)
    # Scratch inside jars_dir, so the resolved jars are renamed into place, not copied.
    with tempfile.TemporaryDirectory(prefix=".resolve-", dir=root) as scratch:
        ivy, staging = Path(scratch, "ivy"), Path(scratch, "staging")
        log.info("resolving %s from Maven into %s", coordinate, target)
        result = subprocess.run([sys.executable, "-c", _RESOLVE_SCRIPT, coordinate, str(ivy)], check=False)
        resolved = sorted((ivy / "jars").glob("*.jar"))
        if result.returncode != 0 or not resolved:
            raise RuntimeError(f"Spark could not resolve {coordinate} (exit {result.returncode}, {len(resolved)} jars)")
        staging.mkdir()
        for jar in resolved:
            os.replace(jar, staging / jar.name)
        (staging / _COMPLETE).write_text(coordinate + "\n", encoding="utf-8")
        if target.exists():  # an incomplete copy from an interrupted older version of this code
            shutil.rmtree(target)
        os.replace(staging, target)
