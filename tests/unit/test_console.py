"""Console quieting without a JVM: the log filter, the JVM stderr copy, the Java options."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from lakescore.jobs.platform.spark import console
from lakescore.jobs.platform.spark.local import own_host


@pytest.fixture(autouse=True)
def restore_logging():
    root, own, warned = logging.getLogger(), logging.getLogger("lakescore"), logging.getLogger("py.warnings")
    saved = (list(root.handlers), root.level, own.level, list(warned.handlers), warned.propagate)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    own.setLevel(saved[2])
    warned.handlers[:], warned.propagate = saved[3], saved[4]
    logging.captureWarnings(False)


def test_default_logging_shows_own_info_and_others_warnings_only(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    console.configure_logging(verbose=False, terminal=True)
    logging.getLogger("lakescore.jobs.score_job").info("scoring 3 rows")
    logging.getLogger("great_expectations.data_context").info("Created temporary directory")
    logging.getLogger("py4j.clientserver").warning("gateway hiccup")
    assert stream.getvalue().splitlines() == ["lakescore: scoring 3 rows", "lakescore: gateway hiccup"]


def test_verbose_logging_shows_everything_timestamped(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    console.configure_logging(verbose=True, terminal=True)
    assert console.is_verbose()
    logging.getLogger("great_expectations.data_context").info("Created temporary directory")
    assert stream.getvalue().rstrip().endswith("INFO great_expectations.data_context: Created temporary directory")
    console.configure_logging(verbose=False, terminal=False)
    assert not console.is_verbose()


def test_jvm_stderr_copy_drops_only_the_incubator_line(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    jvm = io.BytesIO(
        b"WARNING: Using incubator modules: jdk.incubator.vector\n26/11/23 WARN TaskSetManager: Lost task\n"
    )
    own_host._copy_stderr(jvm)
    assert out.getvalue() == "26/11/23 WARN TaskSetManager: Lost task\n"


def test_quiet_java_options_point_at_the_shipped_config():
    driver, executor = console.quiet_java_options("local[2]", verbose=False)
    assert driver.startswith("-Dlog4j2.configurationFile=file:/") and executor == ""
    assert console.QUIET_LOG4J2.is_file() and "rootLogger.level = warn" in console.QUIET_LOG4J2.read_text()
    assert console.quiet_java_options("local-cluster[2,1,1024]", verbose=False) == (driver, driver)
    assert console.quiet_java_options("local[2]", verbose=True) == ("", "")


def test_a_run_log_sends_only_the_drivers_log_to_its_file(tmp_path):
    quiet, _ = console.quiet_java_options("local[2]", verbose=False)
    log = tmp_path / "logs" / "run.log"
    driver, executor = console.quiet_java_options("local-cluster[2,1,1024]", verbose=False, log_file=log)
    assert driver.split() == [quiet, "-Dlakescore.log.appender=file", f"-Dlakescore.log.file={log}"]
    assert executor == quiet  # a local-cluster's executors log to their work directories
    assert console.quiet_java_options("local[2]", verbose=True, log_file=log) == ("", "")
    config = console.QUIET_LOG4J2.read_text()
    assert "${sys:lakescore.log.appender:-console}" in config and "createOnDemand = true" in config


def test_the_run_log_is_the_clis_choice_and_keeps_a_failures_traceback_once(tmp_path, monkeypatch):
    monkeypatch.setattr(console, "_run_log", {"wanted": False, "path": None})
    assert console.start_run_log(tmp_path / "logs") is None and console.keep_trace(ValueError("x")) is None
    console.log_jvm_to_file()
    path = console.start_run_log(tmp_path / "logs")
    assert path.parent == (tmp_path / "logs").resolve() and console.run_log() is None  # nothing logged yet
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        error = exc
    assert console.keep_trace(error) == path == console.keep_trace(error) == console.run_log()
    text = path.read_text()
    assert text.count("Traceback (most recent call last)") == 1 and "RuntimeError: boom" in text


def test_third_party_warnings_go_to_the_run_log_not_the_console(tmp_path, monkeypatch):
    """Issue 65: Pillow's DecompressionBombWarning reached an image run's console, from the driver and through the
    gateway JVM's stderr from the Python workers. With a run log both go there; the JVM's own lines still pass."""
    import warnings

    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    monkeypatch.setattr(console, "_run_log", {"wanted": True, "path": tmp_path / "run.log"})
    console.configure_logging(verbose=False, terminal=True)
    warnings.warn("Image size (95000000 pixels) exceeds limit", UserWarning, stacklevel=1)
    jvm = io.BytesIO(
        b"/site-packages/PIL/Image.py:3402: DecompressionBombWarning: Image size (95000000 pixels) exceeds limit\n"
        b"  warnings.warn(\n26/11/23 WARN TaskSetManager: Lost task\n\tat org.apache.spark.Executor.run\n"
    )
    own_host._copy_stderr(jvm)
    assert out.getvalue() == "26/11/23 WARN TaskSetManager: Lost task\n\tat org.apache.spark.Executor.run\n"
    logged = (tmp_path / "run.log").read_text()
    assert "WARN py.warnings: " in logged and "UserWarning: Image size (95000000 pixels) exceeds limit" in logged
    assert "DecompressionBombWarning: Image size" in logged and "  warnings.warn(\n" in logged
    # without a log file (the API, a notebook) a warning is shown as before, one line
    monkeypatch.setattr(console, "_run_log", {"wanted": False, "path": None})
    warnings.warn("still shown", UserWarning, stacklevel=1)
    assert "still shown" in out.getvalue()
