"""What a run prints to the console: lakescore's own lines, and the JVM's only when they matter.

At default verbosity a session lakescore builds starts quiet:

* the JVM logs through ``log4j2-quiet.properties`` (shipped beside this module), passed with
  ``-Dlog4j2.configurationFile`` in ``spark.driver.extraJavaOptions`` (and the executors'
  options where they run on this host, ``local-cluster``): Spark's real warnings stay,
  the start-up notices of Hadoop, Hive's embedded metastore and Derby do not;
* the one line log4j cannot reach, ``WARNING: Using incubator modules: jdk.incubator.vector``
  (the JVM itself prints it for the module Spark's launcher adds), is dropped from the
  gateway JVM's stderr, which is otherwise copied through unchanged;
* Python logging shows lakescore's INFO lines and other libraries' warnings only.

``-v`` (lakescore's logger at DEBUG, see :func:`is_verbose`) brings everything back: Spark's
default log4j profile, the JVM's stderr as is, every library's log records.
A session lakescore did not build (Databricks, spark-submit, a notebook) is never touched.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Optional

__all__ = [
    "QUIET_LOG4J2", "is_verbose", "quiet_java_options", "configure_logging", "launch_quiet_gateway", "JVM_NOISE",
]

QUIET_LOG4J2 = Path(__file__).with_name("log4j2-quiet.properties")
"""The log4j2 configuration of quiet sessions."""

JVM_NOISE = (b"WARNING: Using incubator modules:",)
"""Starts of JVM stderr lines that log4j cannot silence and no run needs."""

_LAKESCORE = "lakescore"


def is_verbose() -> bool:
    """Whether the user asked for everything (``-v``): lakescore's logger is enabled at DEBUG."""
    return logging.getLogger(_LAKESCORE).isEnabledFor(logging.DEBUG)


def quiet_java_options(master: str, verbose: bool) -> tuple[str, str]:
    """``(driver, executor)`` Java options that make a session's JVMs log through :data:`QUIET_LOG4J2`.

    Empty when ``verbose``. The executors get it only where they run on this host
    (``local``: inside the driver JVM anyway; ``local-cluster``: their own JVMs here), since
    the file's path means nothing on a remote node.

    >>> quiet_java_options("local[2]", verbose=True)
    ('', '')
    """
    if verbose:
        return "", ""
    option = f"-Dlog4j2.configurationFile={QUIET_LOG4J2.resolve().as_uri()}"
    return option, option if master.startswith("local-cluster") else ""


class _CurrentStderr(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is now (a live progress display swaps it)."""

    @property
    def stream(self) -> IO[str]:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _OwnAndWarnings(logging.Filter):
    """lakescore's records at its level; everyone else's from WARNING up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".", 1)[0] == _LAKESCORE or record.levelno >= logging.WARNING


def configure_logging(verbose: bool, terminal: Optional[bool] = None) -> None:
    """Set up the CLI's logging on stderr.

    Default: lakescore's INFO lines and other libraries' warnings; on a terminal
    (``terminal``, default ``sys.stderr.isatty()``) as ``lakescore: message``, elsewhere
    (CI, Databricks logs) with a timestamp, level and logger name. ``verbose``: every
    record from DEBUG up, timestamped.
    """
    terminal = sys.stderr.isatty() if terminal is None else terminal
    handler = _CurrentStderr()
    if verbose or not terminal:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("lakescore: %(message)s"))
    if not verbose:
        handler.addFilter(_OwnAndWarnings())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger(_LAKESCORE).setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("py4j", "urllib3", "httpx", "filelock", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not verbose:
        logging.captureWarnings(True)  # Python warnings become WARNING records: one line each, no source echo


def launch_quiet_gateway(conf):
    """Start the Py4J gateway JVM for ``conf`` (a ``SparkConf``) with :data:`JVM_NOISE` dropped from its stderr.

    Every other line the JVM (or a Python worker it forks) writes to stderr is copied, as
    it comes, to this process's current ``sys.stderr`` by a daemon thread.
    """
    from pyspark.java_gateway import launch_gateway

    popen = {"stderr": subprocess.PIPE}
    gateway = launch_gateway(conf, popen_kwargs=popen)
    process = getattr(gateway, "proc", None)
    if process is not None and process.stderr is not None:
        threading.Thread(target=_copy_stderr, args=(process.stderr,), name="lakescore-jvm-stderr", daemon=True).start()
    return gateway


def _copy_stderr(source: IO[bytes]) -> None:
    for line in iter(source.readline, b""):
        if line.startswith(JVM_NOISE):
            continue
        try:
            sys.stderr.write(line.decode("utf-8", "replace"))
            sys.stderr.flush()
        except (ValueError, OSError):  # stderr closed at interpreter exit
            return
