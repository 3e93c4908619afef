"""Which JVM class archive a built session starts from: one per classpath, never a stale one (no JVM here)."""

from __future__ import annotations

import pytest

from lakescore.jobs.platform.spark.local.class_archive import archive_path, classpath_digest, start_options


@pytest.fixture
def host(tmp_path):
    """A JDK and a Spark installation laid out as on disk (real files), and the environment naming them."""
    jdk, spark = tmp_path / "jdk", tmp_path / "spark"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "lib").mkdir()
    (jdk / "bin" / "java").write_bytes(b"java")
    (jdk / "lib" / "modules").write_bytes(b"modules v1")
    (spark / "jars").mkdir(parents=True)
    for name in ("spark-core.jar", "spark-sql.jar"):
        (spark / "jars" / name).write_bytes(b"PK " + name.encode())
    delta = tmp_path / "delta.jar"
    delta.write_bytes(b"PK delta")
    environ = {"JAVA_HOME": str(jdk), "SPARK_HOME": str(spark), "PATH": ""}
    return {"jdk": jdk, "spark": spark, "environ": environ, "settings": {"spark.jars": str(delta)}, "delta": delta}


def digest(host, **changes):
    return classpath_digest(
        {**host["settings"], **changes.get("settings", {})}, {**host["environ"], **changes.get("environ", {})}
    )


def test_the_digest_is_stable_for_one_classpath(host):
    assert digest(host) == digest(host)
    assert len(digest(host)) == 24


@pytest.mark.parametrize("change", ["spark jar added", "spark jar rewritten", "jdk upgraded", "delta jar rewritten"])
def test_any_change_to_what_makes_up_the_classpath_names_another_archive(host, change):
    before = digest(host)
    if change == "spark jar added":
        (host["spark"] / "jars" / "extra.jar").write_bytes(b"PK extra")
    elif change == "spark jar rewritten":
        (host["spark"] / "jars" / "spark-sql.jar").write_bytes(b"PK spark-sql 2")
    elif change == "jdk upgraded":
        (host["jdk"] / "lib" / "modules").write_bytes(b"modules v2, longer")
    else:
        (host["delta"]).write_bytes(b"PK delta 4.5")
    assert digest(host) != before


@pytest.mark.parametrize(
    "changes",
    [
        {"settings": {"spark.driver.extraClassPath": "/opt/udfs.jar"}},
        {"settings": {"spark.jars": ""}},
        {"environ": {"HADOOP_CONF_DIR": "/etc/hadoop"}},
        {"environ": {"SPARK_CONF_DIR": "/etc/spark"}},
    ],
)
def test_classpath_settings_and_environment_name_another_archive(host, changes):
    assert digest(host, **changes) != digest(host)


def test_no_archive_applies_without_a_jdk_or_with_jars_resolved_at_start(host, tmp_path):
    no_jdk = {**host["environ"]}
    del no_jdk["JAVA_HOME"]
    assert archive_path(str(tmp_path), host["settings"], no_jdk) is None
    assert (
        archive_path(str(tmp_path), {"spark.jars.packages": "io.delta:delta-spark_4.1_2.13:4.4.0"}, host["environ"])
        is None
    )


def test_a_session_starts_from_the_archive_only_once_it_exists(host, tmp_path, monkeypatch):
    for name, value in host["environ"].items():
        monkeypatch.setenv(name, value)
    jars_dir = tmp_path / "jars"
    path = archive_path(str(jars_dir), host["settings"])
    assert path is not None and path.parent == jars_dir / "class-archives"
    assert start_options(str(jars_dir), host["settings"]) == []
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert start_options(str(jars_dir), host["settings"]) == [f"-XX:SharedArchiveFile={path}"]
    (host["spark"] / "jars" / "spark-core.jar").write_bytes(b"PK spark-core upgraded")
    assert start_options(str(jars_dir), host["settings"]) == []  # the old archive no longer applies
