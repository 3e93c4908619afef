"""A run of several chunks reads its input once: the rows to score are written once, partitioned by chunk."""

from __future__ import annotations

import pandas as pd
from delta.tables import DeltaTable

from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from tests.integration.test_score_job import read_output


def test_chunks_read_the_input_once_and_a_rerun_not_at_all(spark, tmp_path, tiny_classifier_dir):
    frame = pd.DataFrame({"review_id": range(1, 11), "body": [f"text {i % 2}" for i in range(1, 11)], "stars": 3})
    source, output = tmp_path / "reviews", tmp_path / "labels"
    spark.createDataFrame(frame).write.format("delta").save(str(source))

    run = _runs(spark, source, output, tiny_classifier_dir, "on", "chunked")

    # A failed check leaves staging and the chunked rows for the rerun.
    failed = run(**{"validation.min_rows": 1000})
    assert failed.status == "validation_failed" and failed.chunks["total"] == 3 and failed.input_scans == 1
    staging_root = tmp_path / "_lakescore_staging" / "labels"
    assert len([p for p in staging_root.iterdir() if p.name.endswith("_rows")]) == 1
    rows_dir = next(p for p in staging_root.iterdir() if p.name.endswith("_rows"))
    assert sorted(p.name for p in rows_dir.iterdir() if p.name.startswith("_chunk=")) == [
        "_chunk=0",
        "_chunk=1",
        "_chunk=2",
    ]

    rerun = run()
    assert rerun.status == "succeeded" and rerun.chunks["skipped"] == 3 and rerun.input_scans == 0
    assert (
        rerun.output_rows == 10 and rerun.dedup["forward_passes_saved"] >= 4
    )  # at most 2 distinct texts in each of 3 chunks
    assert read_output(spark, str(output))["review_id"].tolist() == list(range(1, 11))
    assert not staging_root.exists()  # staging and the chunked rows are gone after the publish


def test_a_plain_pinned_input_is_read_once_per_chunk_without_a_prepared_copy(spark, tmp_path, tiny_classifier_dir):
    """Rows to score that are the pinned input as it is (no dedup digest, no refused id, not incremental) are read
    from it by each chunk: no prepared copy is written, and a rerun resumes every chunk from staging, even a rerun
    that sizes its chunks by time and so plans another count (one chunk for 10 rows)."""
    frame = pd.DataFrame({"review_id": range(1, 11), "body": [f"text {i}" for i in range(1, 11)], "stars": 3})
    source, output = tmp_path / "reviews", tmp_path / "labels"
    spark.createDataFrame(frame).write.parquet(str(source))

    run = _runs(spark, source, output, tiny_classifier_dir, "off", "rescan")

    failed = run(**{"validation.min_rows": 1000, "write.chunk_rows": 3})
    assert failed.status == "validation_failed" and failed.chunks["total"] == 4 and failed.input_scans == 4
    staging_root = tmp_path / "_lakescore_staging" / "labels"
    assert [p.name for p in staging_root.iterdir() if p.name.endswith("_rows")] == []
    (staged,) = staging_root.iterdir()  # staging keeps no per-column statistics: nothing reads it by them
    properties = DeltaTable.forPath(spark, str(staged)).detail().first()["properties"]
    assert properties.get("delta.dataSkippingNumIndexedCols") == "0"

    rerun = run(**{"write.chunk_rows": None})
    assert rerun.status == "succeeded" and rerun.chunks["total"] == 4 and rerun.chunks["skipped"] == 4
    assert rerun.input_scans == 0
    assert read_output(spark, str(output))["review_id"].tolist() == list(range(1, 11))  # each row in one chunk


def _runs(spark, source, output, model, dedup, run_id):
    """A function running the classifier over ``source`` into ``output`` in chunks of 4 rows, with ``flags`` on top."""

    def run(**flags):
        return run_scoring(
            load_config(
                flags={
                    "input": str(source),
                    "output": str(output),
                    "task": "classify",
                    "model.source": str(model),
                    "id_col": "review_id",
                    "text_col": "body",
                    "write.chunk_rows": 4,
                    "scoring.dedup": dedup,
                    "run_id": run_id,
                    **flags,
                }
            ),
            spark,
        )

    return run
