"""``make submit-local`` end to end: the demo through spark-submit on ``local-cluster[2,1,2048]``.

The submission runs from the package artifacts only (``dist/launcher.py`` and ``build/env``, a venv
made from the wheel). The results are read without Spark, so nothing here shares a session or a
Derby metastore with the integration tests: the run report, the Spark event log and the output
table's own Delta log and Parquet files.

Slow: a standalone cluster, two executor JVMs and the real model take minutes; the first run on a
machine also builds ``build/env`` (~25 s: uv links torch and its CUDA libraries from the cache ``make setup`` filled).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
ROWS = 200
MASTER = "local-cluster[2,1,2048]"


@pytest.fixture(scope="module")
def submitted(module_tmp_path):
    """Run ``make submit-local`` into a fresh work dir; return ``(work_dir, console output)``."""
    work = module_tmp_path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing from the source tree
    cmd = ["make", "-s", f"VENV={sys.prefix}", "submit-local", f"SUBMIT_DIR={work}", f"SUBMIT_ROWS={ROWS}"]
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=2400
    )
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-6000:]}"
    return work, proc.stdout


def _events(work: Path) -> list[dict]:
    files = sorted((work / "spark-events").glob("*/events_*")) + sorted((work / "spark-events").glob("app-*"))
    assert files, f"no Spark event log under {work / 'spark-events'}"
    return [json.loads(line) for f in files for line in f.read_text(encoding="utf-8").splitlines() if line]


def _delta_snapshot(table: Path) -> tuple[dict, list[Path]]:
    """The latest schema and live data files of the Delta table at ``table``, from its JSON commits."""
    log = table / "_delta_log"
    assert not list(log.glob("*.checkpoint*.parquet")), "a checkpoint appeared; replay it too"
    schema, live = None, {}
    for commit in sorted(log.glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "metaData" in action:
                schema = json.loads(action["metaData"]["schemaString"])
            elif "add" in action:
                live[action["add"]["path"]] = table / unquote(action["add"]["path"])
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    assert schema is not None, f"no metaData action in {log}"
    return schema, list(live.values())


def test_report_says_the_run_succeeded_and_was_validated(submitted):
    work, output = submitted
    report = json.loads((work / "report.json").read_text())
    assert report["status"] == "succeeded", report
    assert report["input_rows"] == report["output_rows"] == ROWS
    assert report["validation"]["success"] is True and report["validation"]["failed"] == []
    assert report["spark"]["master"] == MASTER
    assert report["workers"]["rows_scored"] == ROWS
    assert "submit-local: spark-submit exited 0" in output


def test_delta_table_holds_every_generated_row_with_the_declared_schema(submitted):
    work, _ = submitted
    report = json.loads((work / "report.json").read_text())
    schema, files = _delta_snapshot(work / "warehouse" / "lakescore_demo.db" / "review_embeddings")
    fields = {f["name"]: f["type"] for f in schema["fields"]}
    assert list(fields) == ["review_id", "embedding", "model_id", "model_revision", "model_sha256", "run_id"]
    assert fields["review_id"] == "long"
    assert fields["embedding"] == {"type": "array", "elementType": "float", "containsNull": True}
    assert fields["model_id"] == fields["model_sha256"] == fields["run_id"] == "string"

    table = pq.ParquetDataset([str(f) for f in files]).read()
    assert table.num_rows == ROWS
    assert sorted(table.column("review_id").to_pylist()) == list(range(1, ROWS + 1))
    assert {len(e) for e in table.column("embedding").to_pylist()} == {384}  # all-MiniLM-L6-v2
    assert set(table.column("run_id").to_pylist()) == {report["run_id"]}
    assert set(table.column("model_sha256").to_pylist()) == {report["model_sha256"]}


def test_two_executors_scored_and_the_code_came_from_the_wheel(submitted):
    work, _ = submitted
    events = _events(work)
    added = {e["Executor ID"] for e in events if e["Event"] == "SparkListenerExecutorAdded"}
    removed = {e["Executor ID"] for e in events if e["Event"] == "SparkListenerExecutorRemoved"}
    assert len(added) == 2 and not removed, (added, removed)

    # Three Arrow functions run as PythonMapInArrow, the first two under their own job tags: the worker
    # started while the input is read, the model preflight and the scoring stage. The scoring stage ran
    # tasks on both executors.
    arrow_stages = [
        e
        for e in events
        if e["Event"] == "SparkListenerStageSubmitted"
        and any("MapInArrow" in (rdd.get("Scope") or "") for rdd in e["Stage Info"]["RDD Info"])
    ]

    def tagged(stage_event, name: str) -> bool:
        # spark_adapter.job_tag: SparkContext.addJobTag, stored as is in spark.job.tags
        tags = (stage_event.get("Properties") or {}).get("spark.job.tags", "").split(",")
        return any(tag.startswith(f"lakescore-{name}-") for tag in tags)

    worker_start = {e["Stage Info"]["Stage ID"] for e in arrow_stages if tagged(e, "worker-start")}
    preflight = {e["Stage Info"]["Stage ID"] for e in arrow_stages if tagged(e, "preflight")}
    scoring = {e["Stage Info"]["Stage ID"] for e in arrow_stages} - worker_start - preflight
    assert len(worker_start) == 1, "no Python worker was started while the input was read"
    assert preflight, "the model was not loaded on the executors before scoring"
    assert scoring, "no stage ran the scoring UDF"
    assert max(worker_start) < min(preflight) and max(preflight) < min(scoring)
    executors = {
        e["Task Info"]["Executor ID"]
        for e in events
        if e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] in scoring
    }
    assert executors == added

    # Python ran from build/env, and lakescore's frames (stage call sites) are the installed wheel's.
    props = next(e["Spark Properties"] for e in events if e["Event"] == "SparkListenerEnvironmentUpdate")
    assert props["spark.pyspark.python"] == str(REPO / "build" / "env" / "bin" / "python")
    # A one-host cluster: every JVM runs C1-only, as lakescore's own local-cluster sessions.
    assert "-XX:TieredStopAtLevel=1" in props["spark.driver.extraJavaOptions"].split()
    assert "-XX:TieredStopAtLevel=1" in props["spark.executor.extraJavaOptions"].split()  # after Spark's own options
    sites = [e["Stage Info"]["Stage Name"] for e in events if e["Event"] == "SparkListenerStageSubmitted"]
    ours = [s for s in sites if "/jobs/" in s or "/udfs/" in s or "/schemas/" in s]
    assert ours, sites
    site_packages = str(REPO / "build" / "env" / "lib")
    assert all(site_packages in s and "/site-packages/" in s for s in ours), ours


def test_the_wheel_installs_one_import_name(submitted, tmp_path):
    """build/env holds the wheel alone: ``lakescore`` imports, the repo folders' own names do not."""
    import zipfile

    python = REPO / "build" / "env" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for name in ("jobs", "udfs", "schemas"):
        probe = subprocess.run(
            [str(python), "-c", f"import {name}"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert probe.returncode != 0 and f"No module named '{name}'" in probe.stderr, probe.stderr
    # build/env has no pyspark (a cluster's Spark brings it): the API's names are declared, the CLI imports.
    api = subprocess.run(
        [
            str(python),
            "-c",
            "import lakescore, lakescore.jobs.cli, lakescore.udfs.registry; "
            "print(lakescore.__version__, *sorted(set(lakescore.__all__) & {'score', 'transform', 'pandas_udf'}))",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert api.returncode == 0, api.stderr
    assert api.stdout.split()[1:] == ["pandas_udf", "score", "transform"]
    (wheel,) = (REPO / "dist").glob(f"lakescore-{api.stdout.split()[0]}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        top = {n.split("/", 1)[0] for n in archive.namelist() if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"lakescore"}, top
