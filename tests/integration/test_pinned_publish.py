"""The publish is the staging snapshot GX validated: a commit to staging after the pin changes nothing published,
and every commit a run makes is found by its run tag, not as "the latest" of its table.

Real local Spark + Delta, the tiny seeded tabular model (in-process)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lakescore.jobs.config import load_config
from lakescore.jobs.platform.tables import delta_history, own_commit, run_metadata
from lakescore.jobs.score_job import run_scoring
from tests.conftest import TinyTabular
from tests.integration.held_run import run_held_at

ROWS = 120


def _accounts(rows: int, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(rng.normal(size=(rows, 4)), columns=list(TinyTabular.FEATURES))
    frame.insert(0, "account_id", np.arange(1, rows + 1, dtype="int64"))
    return frame


def test_a_staging_commit_after_the_pin_changes_nothing_published(spark, tmp_path, tiny_tabular, monkeypatch):
    _, script, _ = tiny_tabular
    source, output, staging_root = tmp_path / "accounts.parquet", tmp_path / "risk", tmp_path / "staging"
    _accounts(ROWS).to_parquet(source)
    cfg = load_config(
        flags={
            "input": str(source),
            "output": str(output),
            "task": "tabular",
            "model.source": str(script),
            "id_col": "account_id",
            "feature_prefix": "feature_",
            "run_id": "pinned-1",
            "write.chunk_rows": 50,
            "write.staging": str(staging_root),
        }
    )
    staged_at: list = []

    def write_to_staging_after_the_pin():
        # A concurrent writer (another process of the same run key, a stray job) commits to staging after the pin:
        # one duplicated row and one foreign id, tagged as someone else's.
        (staging,) = [p for p in staging_root.iterdir() if not p.name.endswith("_rows")]
        staged_at.append(staging)
        staged = spark.read.format("delta").load(str(staging))
        pinned_version = len(list((staging / "_delta_log").glob("*.json"))) - 1
        intruders = staged.limit(2).toPandas()
        intruders.loc[1, "account_id"] = 999_999
        spark.createDataFrame(intruders, staged.schema).write.format("delta").mode("append").option(
            "userMetadata", "someone else"
        ).save(str(staging))
        assert len(list((staging / "_delta_log").glob("*.json"))) - 1 == pinned_version + 1  # the commit happened

    # The run waits at the validate step, right after the pin.
    report = run_held_at(spark, cfg, "validate", tmp_path / "barrier", write_to_staging_after_the_pin, monkeypatch)

    assert report.status == "succeeded", (report.error, report.validation)
    assert (report.input_rows, report.output_rows, report.error_rows) == (ROWS, ROWS, 0)
    out = spark.read.format("delta").load(str(output)).toPandas().sort_values("account_id")
    assert out["account_id"].tolist() == list(range(1, ROWS + 1))  # no intruder, no duplicate
    assert report.validation["success"] is True
    # The commit the report names is the run's own, found by its tag; it wrote the validated count.
    tag = run_metadata("pinned-1", None)
    history = delta_history(spark, str(output))
    assert [(h.version, h.run_id, h.rows) for h in history] == [(report.delta_version, "pinned-1", ROWS)]
    assert len(staged_at) == 1 and not staged_at[0].exists()

    # Another writer commits to the output after the run: the run's commit is still the one found by its tag.
    spark.read.format("delta").load(str(output)).limit(1).write.format("delta").mode("append").option(
        "userMetadata", "later"
    ).save(str(output))
    assert own_commit(spark, str(output), tag).version == report.delta_version
    assert own_commit(spark, str(output), None).version == report.delta_version + 1


def test_every_staging_chunk_commit_carries_the_run_tag(spark, tmp_path, tiny_tabular):
    """Chunk commits are tagged with the run (kept staging: the run fails validation, so staging stays)."""
    _, script, _ = tiny_tabular
    source, output, staging_root = tmp_path / "accounts.parquet", tmp_path / "risk", tmp_path / "staging"
    _accounts(60, seed=4).to_parquet(source)
    cfg = load_config(
        flags={
            "input": str(source),
            "output": str(output),
            "task": "tabular",
            "model.source": str(script),
            "id_col": "account_id",
            "feature_prefix": "feature_",
            "run_id": "tagged-1",
            "write.chunk_rows": 25,
            "write.staging": str(staging_root),
            "validation.min_rows": 1000,
        }
    )
    report = run_scoring(cfg, spark)
    assert report.status == "validation_failed" and not output.exists()
    (staging,) = [p for p in staging_root.iterdir() if not p.name.endswith("_rows")]
    tags = [h.run_id for h in delta_history(spark, str(staging))]
    assert tags == ["tagged-1"] * 3  # three chunks, three tagged commits
