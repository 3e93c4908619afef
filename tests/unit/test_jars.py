"""Which Maven artifacts a built session needs, where their fetched copies live, and how they reach Spark conf."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakescore.jobs.config import SparkConfig
from lakescore.jobs.platform.spark.jars import cached_jars, delta_coordinate, fetch_jars, hadoop_version, s3a_coordinate
from lakescore.jobs.platform.spark.session import jar_confs, needs_s3a


def fake_fetched(jars_dir: Path, coordinate: str, names=("a.jar", "b.jar"), complete=True) -> list[Path]:
    """A directory laid out as fetch_jars leaves it (real files, no Maven)."""
    target = jars_dir / coordinate.replace(":", "__")
    target.mkdir(parents=True)
    for name in names:
        (target / name).write_bytes(b"PK")
    if complete:
        (target / ".complete").write_text(coordinate + "\n")
    return sorted(target / name for name in names)


def test_delta_coordinate_follows_the_artifact_naming_of_each_line():
    assert delta_coordinate("4.4.0", "4.1.1") == "io.delta:delta-spark_4.1_2.13:4.4.0"
    assert delta_coordinate("4.0.0", "4.0.1") == "io.delta:delta-spark_2.13:4.0.0"


def test_s3a_connector_matches_the_hadoop_that_pyspark_bundles():
    import pyspark

    version = hadoop_version()
    assert (Path(pyspark.__file__).parent / "jars" / f"hadoop-client-api-{version}.jar").is_file()
    assert s3a_coordinate() == f"org.apache.hadoop:hadoop-aws:{version}"
    # constraints.txt pins pyspark 4.1.1, which bundles Hadoop 3.4.2: a literal, so a wrong derivation cannot pass.
    assert s3a_coordinate() == "org.apache.hadoop:hadoop-aws:3.4.2"
    assert s3a_coordinate("3.3.6") == "org.apache.hadoop:hadoop-aws:3.3.6"


def test_hadoop_version_refuses_to_guess(tmp_path):
    (tmp_path / "jars").mkdir()
    with pytest.raises(RuntimeError, match="found: none"):
        hadoop_version(tmp_path)
    (tmp_path / "jars" / "hadoop-client-api-3.4.2.jar").write_bytes(b"")
    (tmp_path / "jars" / "hadoop-common-3.3.6.jar").write_bytes(b"")
    with pytest.raises(RuntimeError, match="found: 3.3.6, 3.4.2"):
        hadoop_version(tmp_path)
    (tmp_path / "jars" / "hadoop-common-3.3.6.jar").unlink()
    assert hadoop_version(tmp_path) == "3.4.2"


def test_only_a_complete_fetch_counts(tmp_path):
    fake_fetched(tmp_path, "org.example:half:1", complete=False)
    assert cached_jars(tmp_path, "org.example:half:1") is None
    assert cached_jars(tmp_path, "org.example:never:1") is None
    jars = fake_fetched(tmp_path, "org.example:whole:1")
    assert cached_jars(tmp_path, "org.example:whole:1") == jars


def test_fetch_reuses_complete_copies_without_resolving(tmp_path):
    # A resolution would start a JVM and ask Maven for these made-up artifacts, and fail.
    first, second = fake_fetched(tmp_path, "org.example:one:1"), fake_fetched(tmp_path, "org.example:two:2", ("c.jar",))
    assert fetch_jars(tmp_path, ["org.example:one:1", "org.example:two:2"]) == {
        "org.example:one:1": first,
        "org.example:two:2": second,
    }


@pytest.mark.parametrize(
    "s3a, refs, expected",
    [
        (None, ("db.table", "/data/out"), False),
        (None, ("S3A://bucket/in", "db.out"), True),
        (None, ("db.in", "s3a://bucket/out"), True),
        (None, ("s3://bucket/in", None), False),  # s3:// is not the S3A scheme
        (True, ("db.in", "db.out"), True),  # e.g. metastore tables located on S3
        (False, ("s3a://bucket/in",), False),  # the platform's Spark brings its own
    ],
)
def test_needs_s3a(s3a, refs, expected):
    assert needs_s3a(SparkConfig(s3a=s3a), refs) is expected


def test_jar_confs_put_fetched_jars_first_and_resolve_the_rest(tmp_path, caplog):
    delta = fake_fetched(tmp_path, delta_coordinate())
    cfg = SparkConfig(jars_dir=str(tmp_path))
    user = {"spark.jars": "/opt/mine.jar", "spark.jars.packages": "org.example:mine:1"}

    local = jar_confs(cfg, ("/data/in", "/data/out"), user)
    assert local["spark.jars"] == ",".join(map(str, delta)) + ",/opt/mine.jar"
    assert local["spark.jars.packages"] == "org.example:mine:1"

    remote = jar_confs(cfg, ("s3a://bucket/in", "/data/out"), user)
    assert remote["spark.jars"] == local["spark.jars"]
    assert remote["spark.jars.packages"] == f"{s3a_coordinate()},org.example:mine:1"
    assert "run `lakescore fetch-jars --s3a`" in caplog.text

    s3a = fake_fetched(tmp_path, s3a_coordinate(), ("sdk.jar",))
    fetched = jar_confs(cfg, ("s3a://bucket/in",), {})
    assert fetched == {"spark.jars": ",".join(map(str, delta + s3a))}
    assert user == {"spark.jars": "/opt/mine.jar", "spark.jars.packages": "org.example:mine:1"}  # not mutated
