"""The driver JVM's class-data-sharing archive: Spark, Hive and Delta classes mapped in, not parsed, at start-up.

A JVM that lakescore builds spends most of its first seconds loading and verifying ~20,000
classes. Java's AppCDS (JDK 13+, JEP 350) can dump the classes a run loaded into an archive
(``-XX:ArchiveClassesAtExit``) that later JVMs on the same classpath map at start-up
(``-XX:SharedArchiveFile``): the session starts and reads its input seconds sooner (figures in BENCHMARKS.md).

One archive per host and classpath: :func:`archive_path` names it by a digest of what makes up
the driver's classpath (the Java runtime, Spark's ``jars/``, ``spark.jars``, the class-path
settings and environment), so a changed jar or JDK gets a new archive and never a stale one.
:func:`~lakescore.jobs.commands.fetch_jars.build_archive` (``lakescore fetch-jars``, so ``make setup``) trains it in a
child process on a small workload touching what a scoring run touches (Parquet read, a Python
``mapInArrow`` task, Delta writes, time travel, history, ``MERGE``, a metastore table), waits
for that JVM to write it at exit and renames it into place: it only ever appears complete.
:func:`start_options` is what a session lakescore builds adds to its driver's Java options:
the archive when one exists for its classpath, nothing otherwise (the JVM then starts as
before). The JVM checks the archive too and, were it unusable, starts without it.

An archive is a few hundred MiB on disk, mapped read-only and shared by every JVM using it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from lakescore.jobs.platform.spark.jars import find_spark_home

__all__ = ["archive_path", "start_options", "ARCHIVE_DIR_NAME"]

log = logging.getLogger(__name__)

ARCHIVE_DIR_NAME = "class-archives"
"""Subdirectory of ``spark.jars_dir`` holding the archives."""

_FORMAT = "1"
"""Bumped when the training workload changes, so archives trained on the old one are rebuilt."""

_CLASSPATH_ENV = ("SPARK_HOME", "SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH")
"""Environment variables spark-submit's launcher reads into the driver's classpath."""


def java_home(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The JDK that spark-submit starts: ``$JAVA_HOME``, else the one ``java`` on ``PATH`` belongs to; ``None`` if
    neither."""
    if environ.get("JAVA_HOME"):
        return Path(environ["JAVA_HOME"]).resolve()
    java = shutil.which("java", path=environ.get("PATH"))
    return Path(java).resolve().parent.parent if java else None


def _file_facts(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def classpath_digest(settings: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> str | None:
    """A digest of everything that makes up the classpath of a driver JVM started with ``settings`` (a
    session's ``spark.*`` settings); ``None`` when no JDK can be found (then no archive applies)."""
    jdk = java_home(environ)
    if jdk is None:
        return None
    parts = [_FORMAT, _file_facts(jdk / "lib" / "modules"), _file_facts(jdk / "bin" / "java")]
    parts += [_file_facts(jar) for jar in sorted((find_spark_home(environ) / "jars").glob("*.jar"))]
    parts += [_file_facts(Path(jar)) for jar in settings.get("spark.jars", "").split(",") if jar]
    parts.append(f"spark.driver.extraClassPath={settings.get('spark.driver.extraClassPath', '')}")
    parts += [f"{name}={environ.get(name, '')}" for name in _CLASSPATH_ENV]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def archive_path(jars_dir: str, settings: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where the archive for a driver started with ``settings`` lives (whether or not it exists yet);
    ``None`` when no archive can apply (no JDK found, or jars resolved from Maven at start-up)."""
    if settings.get("spark.jars.packages"):
        return None  # Ivy resolves those at each start, into a classpath an archive cannot pin
    digest = classpath_digest(settings, environ)
    return None if digest is None else Path(jars_dir).expanduser() / ARCHIVE_DIR_NAME / f"{digest}.jsa"


def start_options(jars_dir: str, settings: Mapping[str, str]) -> list[str]:
    """Java options for a driver started with ``settings``: the host's archive for its classpath when it exists, else
    ``[]``."""
    path = archive_path(jars_dir, settings)
    if path is None or not path.is_file():
        log.debug("no JVM class archive for this classpath (%s); `lakescore fetch-jars` builds one", path)
        return []
    return [f"-XX:SharedArchiveFile={path}"]
