"""The SparkSession a job runs in: taken when one exists, built from ``spark:`` config otherwise.

On Databricks (or any host that already made a session) the existing session
is used as is: no jars added, nothing reconfigured, never stopped by us. Built
locally, the session has the Delta extension and catalog, a Hive metastore in
an embedded Derby database under ``spark.metastore_dir`` and managed tables
under ``spark.warehouse_dir``, so ``db.table`` names are real metastore tables.

Note: embedded Derby admits one process at a time per metastore directory;
concurrent local jobs need separate ``spark.metastore_dir`` values.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from jobs.config import SparkConfig
from jobs.delta_jars import cached_delta_jars, delta_maven_coordinate

__all__ = ["get_or_create_session"]

log = logging.getLogger(__name__)


def get_or_create_session(cfg: SparkConfig) -> tuple[SparkSession, bool]:
    """Return ``(spark, created)``; ``created`` tells the caller it owns (and may stop) the session."""
    active = SparkSession.getActiveSession()
    if active is not None:
        log.info("using the existing SparkSession (master %s)", active.sparkContext.master)
        return active, False

    # Python workers must start this interpreter, or pandas UDFs fail with ModuleNotFoundError.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    warehouse = Path(cfg.warehouse_dir).expanduser().resolve()
    metastore = Path(cfg.metastore_dir).expanduser().resolve() if cfg.metastore_dir else warehouse.parent / "metastore_db"
    metastore.parent.mkdir(parents=True, exist_ok=True)

    builder = (
        SparkSession.builder.master(cfg.master)
        .appName(cfg.app_name)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.hadoop.javax.jdo.option.ConnectionURL", f"jdbc:derby:;databaseName={metastore};create=true")
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={metastore.parent}")
        .config("spark.ui.showConsoleProgress", "false")
        .enableHiveSupport()
    )
    coordinate = delta_maven_coordinate()
    jars = cached_delta_jars(Path(cfg.jars_dir), coordinate)
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    else:
        log.warning("Delta jars not fetched yet (run `lakescore fetch-jars`); resolving %s from Maven", coordinate)
        builder = builder.config("spark.jars.packages", coordinate)
    for key, value in cfg.conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(cfg.log_level.upper())
    return spark, True
