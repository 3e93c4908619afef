"""One real local Spark session for the integration tests: Delta, a Derby-backed Hive metastore, local[2]."""

from __future__ import annotations

import pytest

from lakescore.jobs.config import SparkConfig, load_config


@pytest.fixture(scope="session")
def spark_dirs(tmp_path_factory):
    return tmp_path_factory.mktemp("spark")


@pytest.fixture(scope="session")
def spark(spark_dirs):
    from lakescore.jobs.platform.spark.session import get_or_create_session
    from lakescore.udfs.registry import get_task

    session, created = get_or_create_session(
        SparkConfig(
            master="local[2]",
            app_name="lakescore-tests",
            warehouse_dir=str(spark_dirs / "warehouse"),
            metastore_dir=str(spark_dirs / "metastore_db"),
            conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
        ),
        worker_imports=get_task("embed").worker_imports("torch"),  # as `lakescore score` builds it for the text tasks
    )
    assert created, "another SparkSession was already active in the test process"
    yield session
    session.stop()


@pytest.fixture
def job_config(minilm_dir):
    """A config for the real model; tests add input/output/columns with ``flags``."""

    def make(**flags):
        base = {"model.source": str(minilm_dir), "id_col": "review_id", "text_col": "body", "spark.master": "local[2]"}
        base.update(flags)
        return load_config(flags=base)

    return make
