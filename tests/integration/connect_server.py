"""A real local Spark Connect server for the tests: pip pyspark's own ``SparkConnectServer``, with Delta.

``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer spark-internal`` (the
class ships in pyspark's ``jars/spark-connect_2.13-*.jar``) on a free loopback port, with the Delta
jars ``lakescore fetch-jars`` cached, Delta's extension and catalog, a Derby metastore and a warehouse
of its own, and Python workers that run this interpreter (so they import lakescore). Its JVM and Python workers start
as a session lakescore builds on this host would (class archive, C1-only JIT, workers forked from a daemon that imported
the scoring runtime once): the module's subject is the client, not how the server starts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lakescore.jobs.config import SparkConfig
from lakescore.jobs.platform.spark.local import class_archive
from lakescore.jobs.platform.spark.local.own_host import local_java_options, worker_preload_confs
from lakescore.jobs.platform.spark.session import jar_confs
from lakescore.udfs.registry import get_task

START_SECONDS = 240


@dataclass
class ConnectServer:
    """A running server: its ``sc://`` URL, warehouse, log, and the process to stop."""

    url: str
    warehouse: Path
    log: Path
    process: subprocess.Popen

    def stop(self) -> None:
        """Stop the server and its Python workers (its own process group)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_connect_server(root: Path, master: str = "local[2]") -> ConnectServer:
    """Start a server under ``root`` and wait until it accepts connections (``RuntimeError`` with its log otherwise)."""
    port = _free_port()
    warehouse, metastore, log = root / "warehouse", root / "metastore_db", root / "connect-server.log"
    cfg = SparkConfig(master=master)
    confs = jar_confs(
        cfg,
        (),
        {
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.sql.catalogImplementation": "hive",
            "spark.sql.warehouse.dir": str(warehouse),
            "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={metastore};create=true",
            "spark.driver.extraJavaOptions": " ".join([f"-Dderby.system.home={root}", *local_java_options("1g", "")]),
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.databricks.delta.snapshotPartitions": "2",
            # each CLI run's scoring workers would otherwise import torch and transformers again
            **worker_preload_confs(cfg, get_task("embed").worker_imports("torch")),
        },
    )
    archive = class_archive.start_options(cfg.jars_dir, confs)
    confs["spark.driver.extraJavaOptions"] = " ".join([confs["spark.driver.extraJavaOptions"], *archive])
    command = [
        str(Path(sys.executable).with_name("spark-submit")),
        "--master",
        master,
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
    ]
    for key, value in confs.items():
        command += ["--conf", f"{key}={value}"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "HF_HUB_OFFLINE": "1"}
    env.pop("SPARK_REMOTE", None)
    with log.open("w") as out:
        process = subprocess.Popen(
            command + ["spark-internal"],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = ConnectServer(f"sc://127.0.0.1:{port}", warehouse, log, process)
    deadline = time.monotonic() + START_SECONDS
    while not _accepts(port):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(
                f"Spark Connect server did not start (exit {process.poll()}):\n{log.read_text()[-4000:]}"
            )
        time.sleep(0.5)
    return server


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0
