"""``lakescore score`` against a real S3 API: moto's server on loopback, read and written through S3A.

The job runs as a subprocess through the real CLI, so it builds its own session
the way a user's run does: the S3A connector jars added because the input is
``s3a://``, the endpoint from ``--set spark.conf...``, the credentials from the
environment, which also reach the executors' reads of a path column's ``s3a://``
files. The shared ``spark`` fixture (no S3A) only reads local results.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lakescore.jobs.commands.demo import generate_reviews
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.registry import get_task
from tests.tiny_vision import LABELS, encoded, picture, vit_classifier

BUCKET = "lakescore-it"
# moto accepts any key pair; these are placeholders, not secrets. No region: S3A needs none for an endpoint.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "lakescore-test", "AWS_SECRET_ACCESS_KEY": "lakescore-test-secret"}


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free loopback port with one empty bucket: ``(endpoint, boto3 client)``."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    client.create_bucket(Bucket=BUCKET)
    yield endpoint, client
    server.stop()


def put_parquet(client, key: str, frame: pd.DataFrame) -> None:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    client.put_object(Bucket=BUCKET, Key=key, Body=buffer.getvalue())


def keys_under(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))


def run_cli(tmp_path: Path, endpoint: str, *args: str) -> subprocess.CompletedProcess:
    cli = Path(sys.executable).with_name("lakescore")
    # Upload blocks buffered in memory, not under the host's /tmp: the test should not depend on the CI disk's free
    # space.
    s3a = {
        "endpoint": endpoint,
        "path.style.access": "true",
        "connection.ssl.enabled": "false",
        "fast.upload.buffer": "bytebuffer",
    }
    command = [
        str(cli),
        "score",
        *args,
        "--set",
        f"spark.warehouse_dir={tmp_path / 'warehouse'}",
        "--set",
        "spark.master=local[2]",
        "--set",
        "spark.conf.spark.ui.enabled=false",
    ]
    for key, value in s3a.items():
        command += ["--set", f"spark.conf.spark.hadoop.fs.s3a.{key}={value}"]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        # Only the test's placeholder credentials: none of the developer's own AWS settings leak in.
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
            **CREDENTIALS,
            "PYSPARK_PYTHON": sys.executable,
        },
    )


def test_score_s3a_parquet_into_s3a_delta_and_a_column_of_s3a_paths(tmp_path, s3, minilm_dir, spark):
    endpoint, client = s3
    reviews = pd.DataFrame(generate_reviews(150, seed=5), columns=["review_id", "body", "stars"])
    # Two objects under one prefix: Spark lists the prefix like a directory.
    put_parquet(client, "reviews/part-0.parquet", reviews.iloc[:70])
    put_parquet(client, "reviews/part-1.parquet", reviews.iloc[70:])
    common = ["--model", str(minilm_dir), "--id-col", "review_id", "--text-col", "body"]

    # Parquet read from S3 and Delta written to S3, in one run: the table is a valid Delta table once copied back out
    # of the bucket.
    report = tmp_path / "report.json"
    result = run_cli(
        tmp_path,
        endpoint,
        "--input",
        f"s3a://{BUCKET}/reviews",
        "--output",
        f"s3a://{BUCKET}/embeddings",
        "--report",
        str(report),
        "--run-id",
        "s3a-run",
        *common,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "run s3a-run: succeeded" in result.stdout
    data = json.loads(report.read_text())
    assert data["status"] == "succeeded" and data["validation"]["success"] is True
    assert data["input_rows"] == data["output_rows"] == 150 and data["input"] == f"s3a://{BUCKET}/reviews"
    assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in result.stdout + result.stderr + report.read_text()
    keys = keys_under(client, "embeddings/")
    assert "embeddings/_delta_log/00000000000000000000.json" in keys
    copy = tmp_path / "from-s3"
    for key in (k for k in keys if not k.endswith("/")):  # S3A's empty directory markers hold no data
        (copy / key).parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, key, str(copy / key))
    written = spark.read.format("delta").load(str(copy / "embeddings")).toPandas()
    assert sorted(written["review_id"]) == sorted(reviews["review_id"]) and set(written["run_id"]) == {"s3a-run"}

    # A column of s3a:// paths: each file read on the executors through S3A with the same spark.hadoop.* settings;
    # a key that is not there is that row's missing_file.
    vit = vit_classifier(tmp_path / "vit")
    photos = {f"photos/{i}.png": encoded(picture(30 + i, 28, i), "PNG") for i in range(3)}
    for key, data in photos.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
    gone = f"s3a://{BUCKET}/photos/gone.png"
    put_parquet(
        client,
        "scans/part-0.parquet",
        pd.DataFrame({"scan_id": [0, 1, 2, 3], "scan": [f"s3a://{BUCKET}/{key}" for key in photos] + [gone]}),
    )
    labels = tmp_path / "labels"
    result = run_cli(
        tmp_path,
        endpoint,
        "--task",
        "image_classify",
        "--model",
        str(vit),
        "--input",
        f"s3a://{BUCKET}/scans",
        "--id-col",
        "scan_id",
        "--image-col",
        "scan",
        "--output",
        str(labels),
        "--set",
        "max_error_rate=0.5",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = spark.read.format("delta").load(str(labels)).toPandas().sort_values("scan_id")
    expected = get_task("image_classify").load(ModelSpec("image_classify", str(vit)), vit).score(list(photos.values()))
    assert out["scan_id"].tolist() == [0, 1, 2] and np.abs(np.stack(out["probs"].map(list)) - expected).max() < 1e-5
    assert out["label"].tolist() == [LABELS[i] for i in expected.argmax(axis=1)]
    errors = spark.read.format("delta").load(f"{labels}_errors").toPandas()
    assert errors[["scan_id", "reason", "input"]].values.tolist() == [[3, "missing_file", gone]]


def test_missing_s3a_prefix_fails_before_compute_with_exit_2(tmp_path, s3, minilm_dir):
    endpoint, _client = s3
    result = run_cli(
        tmp_path,
        endpoint,
        "--input",
        f"s3a://{BUCKET}/no-such-prefix",
        "--output",
        str(tmp_path / "o"),
        "--model",
        str(minilm_dir),
        "--id-col",
        "review_id",
        "--text-col",
        "body",
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"lakescore: error: cannot read input 's3a://{BUCKET}/no-such-prefix'" in result.stderr.splitlines()[-1]
    assert not (tmp_path / "o").exists()
