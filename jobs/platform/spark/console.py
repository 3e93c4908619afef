"""What a run prints to the console: lakescore's own lines, and the JVM's only when they matter.

At default verbosity a session lakescore builds starts quiet:

* the JVM logs through ``log4j2-quiet.properties`` (shipped beside this module), passed with
  ``-Dlog4j2.configurationFile`` in ``spark.driver.extraJavaOptions`` (and the executors'
  options where they run on this host, ``local-cluster``): Spark's real warnings stay,
  the start-up notices of Hadoop, Hive's embedded metastore and Derby do not;
* on this host's own masters, the one line log4j cannot reach, ``WARNING: Using incubator modules:
  jdk.incubator.vector`` (the JVM itself prints it for the module Spark's launcher adds), is dropped from the
  gateway JVM's stderr, which is otherwise copied through unchanged
  (:func:`lakescore.jobs.platform.spark.local.own_host.launch_quiet_gateway`);
* Python logging shows lakescore's INFO lines and other libraries' warnings only; Python's own warnings (a library's
  ``warnings.warn``: Pillow's ``DecompressionBombWarning``, deprecations), on the driver and from the Python workers
  whose stderr the gateway JVM passes on, go to the log file instead, where there is one (:func:`to_run_log`);
* for the CLI (:func:`log_jvm_to_file`), the JVM's warnings and errors, stack traces and all, go to a log
  file of the session's own (:func:`run_log`) instead of the console, and so does the traceback of a
  failure (:func:`keep_trace`): the console gets the one line that names the cause and that file.

``-v`` (lakescore's logger at DEBUG, see :func:`is_verbose`) brings everything back: Spark's
default log4j profile, the JVM's stderr as is, every library's log records.
A session lakescore did not build (Databricks, spark-submit, a notebook) is never touched.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

__all__ = [
    "QUIET_LOG4J2",
    "is_verbose",
    "quiet_java_options",
    "configure_logging",
    "log_jvm_to_file",
    "start_run_log",
    "run_log",
    "keep_trace",
]

QUIET_LOG4J2 = Path(__file__).with_name("log4j2-quiet.properties")
"""The log4j2 configuration of quiet sessions."""

_LAKESCORE = "lakescore"

PYTHON_WARNING = re.compile(rb"^\S.*:\d+: \w*Warning: ")
"""A Python warning as ``warnings`` prints it on stderr (``file.py:12: DecompressionBombWarning: ...``), followed by
indented lines of its source."""


def is_verbose() -> bool:
    """Whether the user asked for everything (``-v``): lakescore's logger is enabled at DEBUG."""
    return logging.getLogger(_LAKESCORE).isEnabledFor(logging.DEBUG)


def quiet_java_options(master: str, verbose: bool, log_file: Path | None = None) -> tuple[str, str]:
    """``(driver, executor)`` Java options that make a session's JVMs log through :data:`QUIET_LOG4J2`.

    Empty when ``verbose``. The executors get it only where they run on this host
    (``local``: inside the driver JVM anyway; ``local-cluster``: their own JVMs here), since
    the file's path means nothing on a remote node. With ``log_file`` the driver JVM logs to that
    file instead of stderr (a ``local-cluster``'s executors log to their work directories anyway).

    >>> quiet_java_options("local[2]", verbose=True)
    ('', '')
    """
    if verbose:
        return "", ""
    option = f"-Dlog4j2.configurationFile={QUIET_LOG4J2.resolve().as_uri()}"
    driver = f"{option} -Dlakescore.log.appender=file -Dlakescore.log.file={log_file}" if log_file else option
    return driver, option if master.startswith("local-cluster") else ""


_run_log: dict[str, Any] = {"wanted": False, "path": None, "kept": None}


def log_jvm_to_file() -> None:
    """The CLI's choice: a quiet session lakescore builds from now on logs its JVM to a file (:func:`start_run_log`)."""
    _run_log["wanted"] = True


def start_run_log(directory: Path) -> Path | None:
    """For the session being built: the file under ``directory`` its driver JVM logs to, or ``None`` (the console):
    the CLI did not ask (:func:`log_jvm_to_file`), or the directory cannot be made. The file itself appears with
    its first line."""
    if not _run_log["wanted"]:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        logging.getLogger(__name__).warning("cannot create %s (%s): the JVM logs to the console", directory, exc)
        return None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    _run_log["path"] = (directory / f"lakescore-{stamp}-{os.getpid()}.log").resolve()
    return _run_log["path"]


def run_log() -> Path | None:
    """The log file of the session lakescore built in this process, once something was written to it; else ``None``."""
    path = _run_log["path"]
    return path if path is not None and path.exists() else None


def to_run_log(text: str) -> bool:
    """Append ``text`` to the session's log file; ``False`` (nothing written) where there is none, or it cannot be
    written."""
    path = _run_log["path"]
    if path is None:
        return False
    try:
        with open(path, "a", encoding="utf-8") as log_file:
            log_file.write(text)
    except OSError:
        return False
    return True


class _WarningsToRunLog(logging.Handler):
    """Python warnings (``logging.captureWarnings``: the ``py.warnings`` logger) into the session's log file, one
    timestamped line each; where there is no log file, to the root logger's handlers, as any library's warning."""

    def emit(self, record: logging.LogRecord) -> None:
        stamp = datetime.now(timezone.utc).strftime("%y/%m/%d %H:%M:%S")
        if not to_run_log(f"{stamp} WARN {record.name}: {record.getMessage()}\n"):
            for handler in logging.getLogger().handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)


def keep_trace(exc: BaseException) -> Path | None:
    """Append ``exc``'s traceback (its whole chain, the JVM's stack traces in it) to the session's log file,
    once per exception, and return the file; ``None`` where the JVM logs to the console."""
    path = _run_log["path"]
    if path is None:
        return None
    if _run_log.get("kept") is not exc:  # the run's recorder and the CLI both ask: written once
        stamp = datetime.now(timezone.utc).strftime("%y/%m/%d %H:%M:%S")
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            with open(path, "a", encoding="utf-8") as log_file:
                log_file.write(f"{stamp} ERROR lakescore: the run failed\n{trace}")
        except OSError:  # a full disk may be why the run failed: the console line still names the cause
            return run_log()
        _run_log["kept"] = exc
    return path


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


def configure_logging(verbose: bool, terminal: bool | None = None) -> None:
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
        # a library's warning (Pillow's DecompressionBombWarning, a deprecation) is no news of the run: the log file
        warnings_logger = logging.getLogger("py.warnings")
        warnings_logger.handlers[:] = [_WarningsToRunLog()]
        warnings_logger.propagate = False
    else:
        logging.getLogger("py.warnings").handlers[:] = []
        logging.getLogger("py.warnings").propagate = True
