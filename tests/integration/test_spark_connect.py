"""The whole job over Spark Connect: the real CLI against a real local Connect server, with real Delta.

One server for the module (:mod:`tests.integration.connect_server`). Each ``lakescore score --remote``
runs in its own process, as a client: nothing of a classic SparkContext exists there. The same
command then runs in this process's classic local session, and the two output tables must agree.
The server's tables are read back here through their Delta directories in its warehouse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lakescore.jobs.cli import main
from tests.integration.connect_server import start_connect_server
from tests.integration.test_score_job import reviews_frame

ROWS = 48
CLI = Path(sys.executable).with_name("lakescore")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = start_connect_server(tmp_path_factory.mktemp("connect"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reviews(spark, tmp_path_factory):
    """A Delta input at a path both sessions read: generated reviews, the edge cases, one null text."""
    frame = reviews_frame(ROWS, seed=17)
    frame.loc[3, "body"] = None
    path = tmp_path_factory.mktemp("connect-input") / "reviews"
    spark.createDataFrame(frame, "review_id long, body string, stars long").write.format("delta").save(str(path))
    return frame, str(path)


def score_over_connect(server, args: list[str], tmp_path: Path, via_env: bool = False) -> tuple[int, str, dict]:
    """``lakescore score ARGS`` as a Spark Connect client (``--remote``, or ``SPARK_REMOTE`` with ``via_env``)."""
    report = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}  # the server's workers have their own
    if via_env:
        env["SPARK_REMOTE"] = server.url
    command = [str(CLI), "score", *args, "--report", str(report)] + ([] if via_env else ["--remote", server.url])
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    return done.returncode, done.stderr, json.loads(report.read_text()) if report.exists() else {}


def server_table(spark, server, name: str) -> pd.DataFrame:
    """A managed table of the server's ``default`` schema, read here from its Delta directory."""
    return (
        spark.read.format("delta")
        .load(str(server.warehouse / name))
        .toPandas()
        .sort_values("review_id")
        .reset_index(drop=True)
    )


def embed_args(input_path: str, minilm_dir: Path, output: str) -> list[str]:
    return [
        "--input",
        input_path,
        "--output",
        output,
        "--task",
        "embed",
        "--model",
        str(minilm_dir),
        "--id-col",
        "review_id",
        "--text-col",
        "body",
        "--run-id",
        "connect-embed",
        "--set",
        "max_error_rate=0.05",
        "--set",
        "scoring.arrow_max_records_per_batch=16",
    ]


def test_embed_over_connect_equals_the_classic_session_and_reruns_in_place(
    server, spark, reviews, minilm_dir, tmp_path
):
    _, source = reviews
    args = embed_args(source, minilm_dir, "spark_catalog.default.review_embeddings")  # a three-part name, over Connect
    code, err, report = score_over_connect(server, args, tmp_path)
    assert code == 0, err[-3000:]
    assert report["spark"]["mode"] == "connect" and report["spark"]["master"] == "local[2]"
    assert (report["input_rows"], report["output_rows"], report["error_rows"]) == (ROWS, ROWS - 1, 1)
    assert report["validation"]["success"] and report["error_reasons"] == {"null_input": 1}
    # Worker metrics come from the scored rows themselves: Connect has no accumulators.
    assert report["workers"]["rows_scored"] == ROWS and report["workers"]["arrow_batches"] >= 3
    assert 1 <= report["workers"]["model_loads"] <= 2 and report["workers"]["model_seconds"] > 0
    remote = server_table(spark, server, "review_embeddings")
    assert not list(server.warehouse.glob("review_embeddings__lakescore_staging_*"))  # staging table dropped
    assert server_table(spark, server, "review_embeddings_errors")["reason"].tolist() == ["null_input"]

    assert main(["score", *args, "--report", str(tmp_path / "classic.json")]) == 0  # the same command, classic session
    classic = (
        spark.table("spark_catalog.default.review_embeddings")
        .toPandas()
        .sort_values("review_id")
        .reset_index(drop=True)
    )
    local = json.loads((tmp_path / "classic.json").read_text())
    assert local["spark"]["mode"] == "classic"
    for key in ("input_rows", "output_rows", "error_rows", "error_reasons", "model_sha256", "run_id"):
        assert report[key] == local[key], key
    assert [c["expectation"] for c in report["validation"]["checks"]] == [
        c["expectation"] for c in local["validation"]["checks"]
    ]
    assert remote["review_id"].tolist() == classic["review_id"].tolist() and len(remote) == ROWS - 1
    np.testing.assert_allclose(np.stack(remote["embedding"]), np.stack(classic["embedding"]), atol=1e-6)
    assert remote.drop(columns="embedding").equals(classic.drop(columns="embedding"))

    code, err, rerun = score_over_connect(server, args, tmp_path, via_env=True)  # SPARK_REMOTE this time
    assert code == 0, err[-3000:]
    assert (rerun["previous_delta_version"], rerun["delta_version"]) == (
        report["delta_version"],
        report["delta_version"] + 1,
    )
    again = server_table(spark, server, "review_embeddings")
    assert len(again) == ROWS - 1 and again["review_id"].is_unique  # replaced, not appended
    np.testing.assert_allclose(np.stack(again["embedding"]), np.stack(remote["embedding"]), atol=1e-6)
    # The client sent the metrics row (Arrow, over Connect); the rerun of the run id added its second attempt's row.
    metrics = spark.read.format("delta").load(str(server.warehouse / "review_embeddings_metrics")).toPandas()
    assert sorted(metrics[["attempt", "run_id", "status", "delta_version"]].values.tolist()) == [
        [1, "connect-embed", "succeeded", report["delta_version"]],
        [2, "connect-embed", "succeeded", rerun["delta_version"]],
    ]


def classify_args(input_path: str, model_uri: str, cache: Path, output: Path, *extra: str) -> list[str]:
    return [
        "--input",
        input_path,
        "--output",
        str(output),
        "--task",
        "classify",
        "--model",
        model_uri,
        "--id-col",
        "review_id",
        "--text-col",
        "body",
        "--run-id",
        "connect-classify",
        "--set",
        "max_error_rate=0.05",
        "--set",
        f"model.cache_dir={cache}",
        *extra,
    ]


def test_classify_over_connect_failed_validation_publishes_nothing_then_a_run_equals_classic(
    server, spark, reviews, tiny_classifier_dir, tmp_path
):
    _, source = reviews
    output = tmp_path / "labels"  # a Delta path output; staging in a table, as Connect needs
    # The model as a Hadoop URI: over Connect, Spark reads its files for the client, which ships them (addArtifacts).
    model, cache = f"file://{tiny_classifier_dir}", tmp_path / "model-cache"
    args = classify_args(source, model, cache, output, "--set", "write.staging=default.connect_stage")
    code, err, failed = score_over_connect(server, args + ["--set", "validation.min_rows=1000"], tmp_path)
    assert (
        code == 1
        and err.strip().splitlines()[-1] == "lakescore: error: the output failed validation and was not published"
    )
    assert failed["status"] == "validation_failed" and failed["delta_version"] is None
    assert [c["expectation"] for c in failed["validation"]["failed"]] == ["expect_table_row_count_to_be_between"]
    assert not output.exists() and not Path(f"{output}_errors").exists()  # nothing published: the report explains it
    assert failed["error_rows"] == 1
    assert len(list(server.warehouse.glob("connect_stage_*"))) == 1  # kept for the rerun to resume

    code, err, report = score_over_connect(server, args, tmp_path)
    assert code == 0, err[-3000:]
    assert report["chunks"]["skipped"] == 1 and report["output_rows"] == ROWS - 1  # resumed from the staging table
    assert report["workers"]["rows_scored"] == 0  # nothing scored again
    assert not list(server.warehouse.glob("connect_stage_*"))
    remote = spark.read.format("delta").load(str(output)).toPandas().sort_values("review_id").reset_index(drop=True)

    classic_output = tmp_path / "labels-classic"
    assert main(["score", *classify_args(source, model, cache, classic_output)]) == 0  # the same command, classic
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1  # one copy on this host for all three runs
    classic = (
        spark.read.format("delta").load(str(classic_output)).toPandas().sort_values("review_id").reset_index(drop=True)
    )
    assert len(remote) == ROWS - 1 and remote["review_id"].tolist() == classic["review_id"].tolist()
    assert set(remote["model_sha256"]) == set(classic["model_sha256"]) and set(remote["model_id"]) == {model}
    assert remote["label"].tolist() == classic["label"].tolist()
    np.testing.assert_allclose(remote["score"], classic["score"], atol=1e-6)
    np.testing.assert_allclose(np.stack(remote["probs"]), np.stack(classic["probs"]), atol=1e-6)


def test_connect_refuses_path_staging_before_compute(server, reviews, minilm_dir, tmp_path):
    _, source = reviews
    output = tmp_path / "never"
    code, err, report = score_over_connect(server, embed_args(source, minilm_dir, str(output)), tmp_path)
    reason = "over Spark Connect the staging area must be a table (lakescore cannot delete a directory"
    assert code == 2 and err.strip().splitlines()[-1].startswith(f"lakescore: error: {reason}")
    assert report["status"] == "failed" and report["error"].startswith(reason) and report["delta_version"] is None
    assert not output.exists() and not Path(f"{output}_errors").exists()


def test_incremental_over_connect_pins_the_input_chunks_once_and_merges(
    server, spark, reviews, tiny_classifier_dir, tmp_path
):
    frame, _ = reviews
    source = tmp_path / "reviews"
    spark.createDataFrame(frame, "review_id long, body string, stars long").write.format("delta").save(str(source))
    output = tmp_path / "labels"
    args = classify_args(
        str(source),
        f"file://{tiny_classifier_dir}",
        tmp_path / "cache",
        output,
        "--set",
        "write.staging=default.inc_stage",
        "--write-mode",
        "incremental",
        "--delete-missing",
        "--set",
        "write.chunk_rows=20",
        "--set",
        "scoring.dedup=on",
        "--set",
        "max_error_rate=0.6",
    )  # the second run looks at 2 rows: the edit and the null text
    code, err, first = score_over_connect(server, args, tmp_path)
    assert code == 0, err[-3000:]
    assert (first["rows_kept"], first["rows_scored"], first["error_rows"], first["input_version"]) == (
        0,
        ROWS - 1,
        1,
        0,
    )
    assert first["chunks"]["total"] == 3 and first["input_scans"] == 1 and first["dedup"]["used"] is True

    edited = frame.copy()
    edited.loc[edited["review_id"] == 1, "body"] = "an edited review"
    spark.createDataFrame(edited[edited["review_id"] != 2], "review_id long, body string, stars long").write.format(
        "delta"
    ).mode("overwrite").save(str(source))
    code, err, second = score_over_connect(server, args, tmp_path)
    assert code == 0, err[-3000:]
    assert (second["rows_kept"], second["rows_scored"], second["error_rows"]) == (ROWS - 3, 1, 1)
    assert (second["rows_missing"], second["rows_deleted"], second["input_version"]) == (1, 1, 1)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{output}`").select("operation").collect()
    assert next(r[0] for r in history) == "MERGE"
    out = spark.read.format("delta").load(str(output)).toPandas()
    assert len(out) == ROWS - 2 and 2 not in set(out["review_id"]) and not list(server.warehouse.glob("inc_stage_*"))
