"""The JVM class archive ``make setup`` built (``lakescore fetch-jars``) is the one a built session starts from, and the
JVM maps it."""

from __future__ import annotations

import os
import subprocess
import sys

from lakescore.jobs.config import SparkConfig
from lakescore.jobs.platform.spark.local.class_archive import archive_path
from lakescore.jobs.platform.spark.session import jar_confs

# -Xshare:on turns "archive unusable, start without it" into a JVM that refuses to start.
PROBE = """
import sys
from lakescore.jobs.config import SparkConfig
from lakescore.jobs.platform.spark.session import get_or_create_session
conf = {"spark.driver.extraJavaOptions": "-Xshare:on", "spark.ui.enabled": "false"}
spark, _ = get_or_create_session(SparkConfig(master="local[1]", warehouse_dir=sys.argv[1], conf=conf))
jvm = spark.sparkContext._jvm
print("ARGS", list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()))
print("ROWS", spark.range(5).count())
"""


def test_setup_built_the_archive_a_session_starts_from_and_the_jvm_maps_it(tmp_path):
    cfg = SparkConfig()
    path = archive_path(cfg.jars_dir, jar_confs(cfg, (), cfg.conf))
    assert path is not None and path.is_file(), (
        f"no JVM class archive at {path}: run `make setup` (lakescore fetch-jars)"
    )
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "warehouse")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert f"-XX:SharedArchiveFile={path}" in probe.stdout
    assert "ROWS 5" in probe.stdout
