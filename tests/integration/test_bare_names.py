"""A bare name is a local path when one exists beside you, a table otherwise; not-found errors say both."""

from __future__ import annotations

import pandas as pd
import pytest

from lakescore.jobs.cli import main
from lakescore.jobs.platform.tables import TableError, is_path, local_ref, read_input


def test_local_parquet_named_without_dot_slash_is_read_as_a_file(tmp_path, monkeypatch, spark):
    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"review_id": [1, 2], "body": ["a", "b"]}).to_parquet("reviews.parquet")
    assert is_path("reviews.parquet") and local_ref("reviews.parquet") == str(tmp_path / "reviews.parquet")
    assert sorted(r.review_id for r in read_input(spark, "reviews.parquet").collect()) == [1, 2]


def test_missing_bare_name_says_what_was_tried(tmp_path, monkeypatch, spark):
    monkeypatch.chdir(tmp_path)
    assert not is_path("reviews.parquet") and local_ref("reviews.parquet") == "reviews.parquet"
    with pytest.raises(TableError) as caught:
        read_input(spark, "reviews.parquet")
    assert str(caught.value) == (
        "cannot read input 'reviews.parquet': no table `reviews`.`parquet`, and no file ./reviews.parquet"
    )


def test_cli_scores_a_bare_local_file_into_a_bare_existing_delta_dir(tmp_path, monkeypatch, spark, minilm_dir):
    monkeypatch.chdir(tmp_path)
    pd.DataFrame({"review_id": [1, 2, 3], "body": ["good", "bad", "fine"]}).to_parquet("reviews.parquet")
    common = ["--model", str(minilm_dir), "--id-col", "review_id", "--text-col", "body"]
    assert main(["score", "--input", "reviews.parquet", "--output", str(tmp_path / "scores"), *common]) == 0
    # Now "scores" is a local Delta dir (and no table): the rerun must replace it, errors beside it.
    assert main(["score", "--input", "reviews.parquet", "--output", "scores", *common]) == 0
    history = spark.sql(f"DESCRIBE HISTORY delta.`{tmp_path / 'scores'}`").select("version").collect()
    assert sorted(r.version for r in history) == [0, 1]
    assert (tmp_path / "scores_errors" / "_delta_log").is_dir()
    assert not spark.catalog.tableExists("scores") and not spark.catalog.tableExists("scores_errors")
