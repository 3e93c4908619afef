"""Who owns the SparkSession: the decision only, from the environment (no Spark started)."""

import pytest

from lakescore.jobs.platform.spark.session import session_source


@pytest.mark.parametrize(
    "environ, active, expected",
    [
        ({}, False, "build"),
        ({}, True, "active"),
        # A Databricks wheel task: the JVM has a session, Python has no active one yet.
        ({"DATABRICKS_RUNTIME_VERSION": "15.4"}, False, "databricks"),
        ({"DATABRICKS_RUNTIME_VERSION": "15.4", "PYSPARK_GATEWAY_PORT": "40123"}, False, "databricks"),
        ({"DATABRICKS_RUNTIME_VERSION": "15.4"}, True, "active"),
        ({"DATABRICKS_RUNTIME_VERSION": ""}, False, "build"),
        # spark-submit (EMR step, make submit-local): the submit command's conf owns the session.
        ({"PYSPARK_GATEWAY_PORT": "40123"}, False, "spark-submit"),
        ({"PYSPARK_GATEWAY_PORT": "40123"}, True, "active"),
    ],
)
def test_session_source(environ, active, expected):
    assert session_source(environ, active) == expected


@pytest.mark.parametrize(
    "environ, active, remote, expected",
    [
        # --remote / spark.remote, said explicitly, wins over everything.
        ({}, False, "sc://h:15002", "connect"),
        ({}, True, "sc://h:15002", "connect"),
        ({"DATABRICKS_RUNTIME_VERSION": "16.4"}, False, "sc://h:15002", "connect"),
        # SPARK_REMOTE is ambient: an active session or a platform's own comes first.
        ({"SPARK_REMOTE": "sc://h:15002"}, False, None, "connect"),
        ({"SPARK_REMOTE": "sc://h:15002"}, True, None, "active"),
        ({"SPARK_REMOTE": "sc://h:15002", "DATABRICKS_RUNTIME_VERSION": "16.4"}, False, None, "databricks"),
    ],
)
def test_spark_connect_sources(environ, active, remote, expected):
    assert session_source(environ, active, remote) == expected


def test_databricks_env_var_in_the_real_environment_selects_databricks(monkeypatch):
    import os

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "16.4")
    assert session_source(os.environ, False) == "databricks"
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION")
    assert session_source(os.environ, False) == "build"
