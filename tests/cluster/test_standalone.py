"""``lakescore score --master spark://…`` on a real Spark standalone cluster, as on-premises teams run Spark.

A master and a worker are started with pip pyspark's own launcher (``bin/spark-class``); the packaged CLI scores a
few rows with the bundled all-MiniLM-L6-v2 against them. Besides the Delta output, the test checks that none of
lakescore's local accelerators reached the cluster: the executors fork Python workers from Spark's own
``pyspark.daemon``, and no JVM of the run starts from a class archive or with C1-only JIT.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from lakescore.jobs.platform.spark.local import python_daemon
from tests.cluster.processes import CliRun, descendants, procs_now
from tests.cluster.test_submit_local import _delta_snapshot

ROWS = 12
LOCAL_ONLY_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:SharedArchiveFile")

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds Spark's processes through /proc")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spark_class(root: Path, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    with open(root / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [str(spark_class), f"org.apache.spark.deploy.{name}", *args],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"{log.name} exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in {log.name} within {timeout} s:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_packaged_job_runs_on_a_standalone_cluster_with_sparks_own_daemon(tmp_path, minilm_dir):
    import pyspark

    port = _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    env = {
        **os.environ,
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
    }
    master = _spark_class(
        tmp_path, "master.Master", ["--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"], env
    )
    worker = None
    try:
        _wait_for(tmp_path / "master.Master.log", "I have been elected leader", master)
        worker = _spark_class(
            tmp_path,
            "worker.Worker",
            [master_url, "--host", "127.0.0.1", "--cores", "2", "--memory", "4g", "--webui-port", "0"],
            env,
        )
        _wait_for(tmp_path / "worker.Worker.log", "Successfully registered with master", worker)

        frame = pd.DataFrame(
            {"review_id": range(1, ROWS + 1), "body": [f"review {i}: fine, works." for i in range(ROWS)]}
        )
        source, output, report, events = (
            tmp_path / "reviews.parquet",
            tmp_path / "out" / "embeddings",
            tmp_path / "report.json",
            tmp_path / "events",
        )
        frame.to_parquet(source)
        events.mkdir()
        cmd = [
            str(Path(sys.executable).with_name("lakescore")),
            "score",
            "--master",
            master_url,
            "--input",
            str(source),
            "--output",
            str(output),
            "--model",
            str(minilm_dir),
            "--id-col",
            "review_id",
            "--text-col",
            "body",
            "--report",
            str(report),
            "--set",
            f"spark.warehouse_dir={tmp_path / 'warehouse'}",
            "--set",
            "spark.conf.spark.ui.enabled=false",
            "--set",
            "spark.conf.spark.eventLog.enabled=true",
            "--set",
            f"spark.conf.spark.eventLog.dir={events}",
            "--set",
            "spark.conf.spark.eventLog.compress=false",
        ]
        run = CliRun(cmd, tmp_path, tmp_path / "score.log", env={"SPARK_LOCAL_IP": "127.0.0.1"})
        seen: dict[int, str] = {}  # every process of the run's driver and of the worker, while the run lasts
        while run.proc.poll() is None:
            procs = procs_now()
            for pid in descendants(run.proc.pid, procs) | descendants(worker.pid, procs):
                # the latest command line: a JVM's child is first seen as jspawnhelper, before it execs the executor
                seen[pid] = procs[pid][1]
            time.sleep(0.2)
        code = run.wait()
        assert code == 0, run.text()[-4000:]
    finally:
        for proc in (worker, master):
            if proc is not None:
                _stop(proc)

    result = json.loads(report.read_text())
    assert result["status"] == "succeeded", result
    assert result["input_rows"] == result["output_rows"] == ROWS
    assert result["spark"]["master"] == master_url
    _schema, files = _delta_snapshot(output)
    table = pq.ParquetDataset([str(f) for f in files]).read()
    assert sorted(table.column("review_id").to_pylist()) == list(range(1, ROWS + 1))
    assert {len(e) for e in table.column("embedding").to_pylist()} == {384}

    # The executors ran Spark's own Python daemon, with the workers it forked; none was lakescore's.
    executors = [c for c in seen.values() if "CoarseGrainedExecutorBackend" in c]
    python = [c for c in seen.values() if "pyspark.daemon" in c or python_daemon.runs_daemon(c.split())]
    assert executors and python, sorted(seen.values())
    assert all("pyspark.daemon" in c and not python_daemon.runs_daemon(c.split()) for c in python), python
    # Nor did any JVM start from a class archive or with C1-only JIT (the driver's included).
    jvms = [c for c in seen.values() if c.split() and c.split()[0].endswith("java")]
    assert len(jvms) >= 2 and not [c for c in jvms if any(o in c for o in LOCAL_ONLY_JVM_OPTIONS)], jvms
    # The session itself never named a daemon module.
    logs = [f for f in events.rglob("*") if f.is_file()]
    props = next(
        json.loads(line)["Spark Properties"]
        for f in logs
        for line in f.read_text().splitlines()
        if '"SparkListenerEnvironmentUpdate"' in line
    )
    assert "spark.python.daemon.module" not in props, props["spark.python.daemon.module"]
    assert not any(
        o in props.get(k, "")
        for o in LOCAL_ONLY_JVM_OPTIONS
        for k in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
    )
