"""Console quieting without a JVM: the log filter, the JVM stderr copy, the Java options."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from lakescore.jobs.platform import console


@pytest.fixture(autouse=True)
def restore_logging():
    root, own = logging.getLogger(), logging.getLogger("lakescore")
    saved = (list(root.handlers), root.level, own.level)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    own.setLevel(saved[2])
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
    jvm = io.BytesIO(b"WARNING: Using incubator modules: jdk.incubator.vector\n26/11/23 WARN TaskSetManager: Lost task\n")
    console._copy_stderr(jvm)
    assert out.getvalue() == "26/11/23 WARN TaskSetManager: Lost task\n"


def test_quiet_java_options_point_at_the_shipped_config():
    driver, executor = console.quiet_java_options("local[2]", verbose=False)
    assert driver.startswith("-Dlog4j2.configurationFile=file:/") and executor == ""
    assert console.QUIET_LOG4J2.is_file() and "rootLogger.level = warn" in console.QUIET_LOG4J2.read_text()
    assert console.quiet_java_options("local-cluster[2,1,1024]", verbose=False) == (driver, driver)
    assert console.quiet_java_options("local[2]", verbose=True) == ("", "")
