"""``write.mode: incremental`` on real Spark + Delta with a tiny seeded classifier: only new / changed / re-modelled
rows are scored, the rest kept, changes applied with one MERGE; every run accounts input = kept + scored + errors."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import shutil
import time

import numpy as np
import pandas as pd
import pytest

from lakescore.jobs.config import load_config
from lakescore.jobs.platform.tables import TableError
from lakescore.jobs.report.files import write_report
from lakescore.jobs.score_job import run_scoring
from lakescore.jobs.steps.context import ModelIdentity
from lakescore.jobs.steps.preflight import ExecutorPreflight
from lakescore.jobs.steps.prepare import check_input_ids, compare_early, plan_run
from lakescore.jobs.steps.read import check_targets, open_input
from lakescore.jobs.testing_hooks import ANNOUNCE_ENV
from lakescore.udfs.models.model_source import ModelSourceError, model_file_digests
from tests.integration.held_run import run_held_at
from tests.integration.test_score_job import read_output

_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"


def _texts(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "review_id": range(1, n + 1),
            "body": [f"review number {i}: the battery lasts {i} days" for i in range(1, n + 1)],
        }
    )


def _write_input(spark, frame: pd.DataFrame, path) -> None:
    spark.createDataFrame(frame, "review_id long, body string").write.format("delta").mode("overwrite").save(str(path))


@pytest.fixture
def config(tmp_path, tiny_classifier_dir):
    def make(model=tiny_classifier_dir, output=tmp_path / "labels", **flags):
        return load_config(
            flags={
                "input": str(tmp_path / "reviews"),
                "output": str(output),
                "task": "classify",
                "model.source": str(model),
                "id_col": "review_id",
                "text_col": "body",
                "write.mode": "incremental",
                "max_error_rate": 0.5,
                **flags,
            }
        )

    return make


def _retrained(tiny_classifier_dir, target):
    """The tiny classifier with other weights (its head's bias moved): another ``model_sha256``, same labels."""
    import torch
    from transformers import BertForSequenceClassification

    shutil.copytree(tiny_classifier_dir, target)
    model = BertForSequenceClassification.from_pretrained(str(target))
    with torch.no_grad():
        model.classifier.bias += 0.5
    model.save_pretrained(str(target))
    return target


def _accounts(report) -> tuple:
    assert report.status == "succeeded", (report.error, report.validation)
    assert report.input_rows == report.rows_kept + report.rows_scored + report.error_rows
    return report.rows_kept, report.rows_scored, report.error_rows, report.rows_missing, report.rows_deleted


def _jvm_console(spark, capsys) -> str:
    """What the JVM wrote to the console (its stderr, copied to this process's) until now: a marker warning is
    logged last and waited for, so everything logged before it has arrived."""
    marker = f"lakescore-test-marker-{time.monotonic_ns()}"
    spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getLogger("lakescore.test").warn(marker)
    seen, deadline = "", time.monotonic() + 30
    while marker not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
        seen += capsys.readouterr().err
    assert marker in seen, "the JVM's stderr is not copied to the console: nothing to check"
    return seen


def test_incremental_runs_score_only_changes_and_merge_them(
    spark, tmp_path, config, tiny_classifier_dir, caplog, capsys, monkeypatch
):
    source, output = tmp_path / "reviews", tmp_path / "labels"
    frame = _texts(12)
    _write_input(spark, frame, source)

    # A first incremental run on a missing output is a full run, written with one overwrite commit.
    first = run_scoring(config(run_id="r1"), spark)
    assert _accounts(first) == (0, 12, 0, 0, 0) and first.delta_version == 0
    out = read_output(spark, str(output))
    assert list(out.columns)[-3:] == ["run_id", "input_digest", "spec_digest"]
    expected_digests = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in frame["body"]]
    assert out["input_digest"].tolist() == expected_digests and out["spec_digest"].nunique() == 1
    assert "deletionVectors" in _table_features(spark, output)  # write.deletion_vectors: true by default

    # Unchanged input: nothing scored, nothing staged (no chunk commit, so no staging table), nothing committed (no new
    # version for downstream readers). The log, the summary and the HTML report say there was nothing to score: no
    # rate, no empty prediction charts.
    caplog.set_level(logging.INFO, logger="lakescore")
    caplog.clear()
    points = tmp_path / "r2.points"
    monkeypatch.setenv(ANNOUNCE_ENV, str(points))
    same = run_scoring(config(run_id="r2"), spark)
    monkeypatch.delenv(ANNOUNCE_ENV)
    assert _accounts(same) == (12, 0, 0, 0, 0) and same.delta_version is None
    reached = [line.split()[0] for line in points.read_text().splitlines()]
    assert "staging_pinned" in reached and not [p for p in reached if p.startswith("chunk_commit")], reached
    assert "unchanged: no new version" in same.summary() and "nothing to score: 12 input rows kept" in same.summary()
    assert same.rows_per_second is None and "rows/s" not in same.summary()
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("lakescore")]
    assert any(m.startswith("nothing to score: none of the 12 rows") for m in logged), logged
    assert not [m for m in logged if m.startswith("scoring ") or " staged" in m], logged
    page = _html(same, tmp_path / "r2.json")
    assert "Nothing to score: 12 input rows kept as they are." in page
    assert "dimensions" not in page and "rows/s" not in page and "id=throughput" not in page
    assert _accounting_rows(page) == [
        ("input", "12"),
        ("kept (not scored again)", "12"),
        ("scored", "0"),
        ("errors", "0"),
        ("output ids missing from the input", "0"),
        ("deleted from the output", "0"),
    ]
    assert spark.sql(f"DESCRIBE HISTORY delta.`{output}`").count() == 1

    # An edit, an edit to a null text (dead-lettered, its stale row leaves the output), an insert, two deletes.
    edited = frame[~frame["review_id"].isin([3, 4])].copy()
    edited.loc[edited["review_id"] == 2, "body"] = "completely different words now"
    edited.loc[edited["review_id"] == 5, "body"] = None
    edited = pd.concat([edited, pd.DataFrame({"review_id": [13], "body": ["a brand new review"]})])
    _write_input(spark, edited, source)
    third = run_scoring(config(run_id="r3"), spark)
    assert _accounts(third) == (8, 2, 1, 2, 1) and third.error_reasons == {"null_input": 1}
    page = _html(third, tmp_path / "r3.json")
    assert "Rows: input = kept + scored + errors" in page
    assert _accounting_rows(page) == [
        ("input", "11"),
        ("kept (not scored again)", "8"),
        ("scored", "2"),
        ("errors", "1"),
        ("null_input", "1"),
        ("output ids missing from the input", "2"),
        ("deleted from the output", "1"),
    ]
    out = read_output(spark, str(output)).set_index("review_id")
    assert sorted(out.index) == [1, 2, 3, 4] + list(range(6, 14))  # 3 and 4 kept: delete_missing is off
    assert out.loc[[2, 13], "run_id"].tolist() == ["r3", "r3"] and set(out.drop(index=[2, 13])["run_id"]) == {"r1"}
    assert out.loc[2, "input_digest"] == hashlib.sha256(b"completely different words now").hexdigest()
    merge = spark.sql(f"DESCRIBE HISTORY delta.`{output}` LIMIT 1").first()
    assert merge["operation"] == "MERGE" and "r3" in merge["userMetadata"]
    # Deletion vectors: the MERGE marked the replaced rows deleted and copied no unchanged row into a new file.
    assert merge["operationMetrics"]["numTargetRowsCopied"] == "0"
    assert int(merge["operationMetrics"]["numTargetDeletionVectorsAdded"]) > 0
    # The MERGE materialized its source once (a Spark job: tens of ms at least); Delta's "auto" and "none" record ~1 ms.
    assert int(merge["operationMetrics"]["materializeSourceTimeMs"]) >= 20
    assert not (tmp_path / "_lakescore_staging").exists()  # staging and the changed rows' table are dropped
    # Delta's MERGE unpersists the source it checkpointed; the JVM's notice of it stays off the console.
    assert "locally checkpointed" not in _jvm_console(spark, capsys)

    # id 5's null text, unchanged under the same weights and spec, fails again whatever the run: it is not scored
    # again (no row reaches a worker) but carried, with its reason and the run that found it, and a failure carried is
    # no new failure: the strictest gate passes. delete_missing: ids 3 and 4 go. A session that chose how Delta's
    # MERGE materializes its source keeps its choice.
    errors_table = f"delta.`{output}_errors`"
    spark.conf.set(_MATERIALIZE_SOURCE, "none")
    try:
        fourth = run_scoring(config(run_id="r4", max_error_rate=0.0, **{"write.delete_missing": True}), spark)
        assert spark.conf.get(_MATERIALIZE_SOURCE) == "none"
    finally:
        spark.conf.unset(_MATERIALIZE_SOURCE)
    assert _accounts(fourth) == (10, 0, 1, 2, 2) and fourth.error_reasons == {"null_input": 1}
    assert fourth.rows_carried == 1 and fourth.workers["rows_scored"] == 0
    assert "1 dead letters carried (not scored again)" in fourth.summary()
    page = _html(fourth, tmp_path / "r4.json")
    assert ("carried from earlier runs (not scored again)", "1") in _accounting_rows(page)
    dead = spark.sql(f"SELECT review_id, reason, run_id, first_run_id, carried FROM {errors_table}").collect()
    assert [tuple(r) for r in dead] == [(5, "null_input", "r4", "r3", True)]
    merge = spark.sql(f"DESCRIBE HISTORY delta.`{output}` LIMIT 1").first()
    assert merge["operation"] == "MERGE" and int(merge["operationMetrics"]["materializeSourceTimeMs"]) <= 5
    incremental = read_output(spark, str(output)).set_index("review_id")
    assert sorted(incremental.index) == [1, 2] + list(range(6, 14))

    # write.retry_failed scores id 5 again: it fails again, a new failure this time, which the gate counts among
    # every row of the output's scope (kept ones included) and says so; nothing is merged, the output keeps its version.
    versions = spark.sql(f"DESCRIBE HISTORY delta.`{output}`").count()
    gated = run_scoring(config(run_id="r5", max_error_rate=0.05, **{"write.retry_failed": True}), spark)
    assert gated.status == "error_rate_exceeded" and gated.workers["rows_scored"] == 1 and gated.rows_carried == 0
    gate = "1 new failure of 11 rows in the output's scope (9.0909%; 10 kept unchanged), above max_error_rate"
    assert gate in gated.error
    assert gated.delta_version is None and spark.sql(f"DESCRIBE HISTORY delta.`{output}`").count() == versions

    # A reason that may be the server's fault (an endpoint's 5xx or timeout) is never carried: the row is scored again.
    spark.sql(f"UPDATE {errors_table} SET reason = 'endpoint_error' WHERE review_id = 5")
    transient = run_scoring(config(run_id="r5t"), spark)
    assert _accounts(transient) == (10, 0, 1, 0, 0) and transient.rows_carried == 0
    assert transient.workers["rows_scored"] == 1 and transient.error_reasons == {"null_input": 1}
    dead = spark.sql(f"SELECT review_id, reason, run_id, first_run_id, carried FROM {errors_table}").collect()
    assert [tuple(r) for r in dead] == [(5, "null_input", "r5t", "r5t", False)]

    # The incremental output equals a full rescore of the same input.
    full = run_scoring(config(output=tmp_path / "full", **{"write.mode": "overwrite"}), spark)
    assert full.status == "succeeded"
    rescored = read_output(spark, str(tmp_path / "full")).set_index("review_id")
    assert rescored.index.tolist() == incremental.index.tolist()
    assert rescored["label"].tolist() == incremental["label"].tolist()
    np.testing.assert_allclose(rescored["score"].to_numpy(), incremental["score"].to_numpy(), atol=1e-5)

    # Other weights: every row is scored again.
    other = _retrained(tiny_classifier_dir, tmp_path / "retrained")
    fifth = run_scoring(config(model=other, run_id="r6"), spark)
    assert _accounts(fifth) == (0, 10, 1, 0, 0)
    after = read_output(spark, str(output))
    assert set(after["model_sha256"]) == {fifth.model_sha256} != {first.model_sha256} and set(after["run_id"]) == {"r6"}

    # Another scoring spec (same weights): every row is scored again too.
    sixth = run_scoring(config(model=other, run_id="r7", **{"model.max_seq_length": 16}), spark)
    assert _accounts(sixth) == (0, 10, 1, 0, 0)
    assert sixth.spec_changes == ["max_seq_length null -> 16"] and "max_seq_length null -> 16" in sixth.summary()

    # An output id whose input rows are refused (id 6, now duplicated) is in the input, not missing: with
    # delete_missing its stale row leaves as a refused id, and nothing counts as missing.
    remaining = incremental.reset_index()[["review_id"]].merge(edited, on="review_id")
    duplicated = pd.concat([remaining, remaining[remaining["review_id"] == 6].assign(body="a second row for id 6")])
    _write_input(spark, duplicated, source)
    seventh = run_scoring(
        config(
            model=other, run_id="r8", max_error_rate=1.0, **{"model.max_seq_length": 16, "write.delete_missing": True}
        ),
        spark,
    )
    assert _accounts(seventh) == (9, 0, 2, 0, 1)
    assert sorted(read_output(spark, str(output))["review_id"]) == [1, 2] + list(range(7, 14))


def test_a_model_file_edit_rescores_and_write_modes_switch_only_when_asked(spark, tmp_path, minilm_dir):
    """The model is more than its weights: editing the copy's ``sentence_bert_config.json`` (``max_seq_length`` 256 ->
    8) rescores every row, and the report names the file. An explicit overwrite replaces an incremental output (a
    fresh full run, equal to the rescored rows); incremental on that plain output is refused until ``--full-rescore``;
    ``replace_run`` on an incremental output is refused, naming the way out."""
    model = tmp_path / "minilm"
    shutil.copytree(minilm_dir, model)
    frame = pd.DataFrame(
        {
            "review_id": range(1, 7),
            "body": [
                f"review {i}: the battery lasted all week and the screen stayed bright in the sun" for i in range(1, 7)
            ],
        }
    )
    _write_input(spark, frame, tmp_path / "reviews")
    output = tmp_path / "vectors"

    def run(mode="incremental", **flags):
        return run_scoring(
            load_config(
                flags={
                    "input": str(tmp_path / "reviews"),
                    "output": str(output),
                    "task": "embed",
                    "model.source": str(model),
                    "id_col": "review_id",
                    "text_col": "body",
                    "write.mode": mode,
                    **flags,
                }
            ),
            spark,
        )

    first = run(run_id="e1")
    assert _accounts(first) == (0, 6, 0, 0, 0) and first.spec_changes is None
    before = np.stack(read_output(spark, str(output))["embedding"])
    settings = model / "sentence_bert_config.json"
    settings.write_text(settings.read_text().replace('"max_seq_length": 256', '"max_seq_length": 8'))
    edited = run(run_id="e2")
    assert _accounts(edited) == (0, 6, 0, 0, 0) and edited.delta_version == 1
    assert edited.spec_changes == ["file sentence_bert_config.json changed"]
    rescored = read_output(spark, str(output))
    assert set(rescored["run_id"]) == {"e2"}
    assert (np.einsum("ij,ij->i", before, np.stack(rescored["embedding"])) < 0.99).all()  # 8 tokens, not the whole text
    assert run(run_id="e3").rows_scored == 0  # the edit is now the output's spec: nothing more to score

    with pytest.raises(TableError, match="replace it with --write-mode overwrite"):
        run("replace_run", run_id="e4")
    fresh = run("overwrite", run_id="e5")
    assert fresh.status == "succeeded" and fresh.output_rows == 6
    plain = read_output(spark, str(output))
    assert "input_digest" not in plain.columns
    np.testing.assert_allclose(np.stack(plain["embedding"]), np.stack(rescored["embedding"]), atol=1e-6)
    with pytest.raises(TableError, match=r"--full-rescore \(write.full_rescore: true\)"):
        run(run_id="e6")
    again = run(run_id="e7", **{"write.full_rescore": True})
    assert _accounts(again) == (0, 6, 0, 0, 0)
    assert list(read_output(spark, str(output)).columns)[-2:] == ["input_digest", "spec_digest"]


def _html(report, json_path) -> str:
    """The HTML page :func:`write_report` writes beside ``json_path``."""
    write_report(report, json_path)
    return json_path.with_suffix(".html").read_text(encoding="utf-8")


def _accounting_rows(page: str) -> list[tuple[str, str]]:
    """The row accounting table of a report page, as (label, rows) text pairs."""
    section = re.search(r'<section id="rows">(.*?)</section>', page, re.S).group(1)
    return [(k.strip(), v) for k, v in re.findall(r"<tr><td>(.*?)</td><td class=num>(.*?)</td></tr>", section)]


def _table_features(spark, path) -> list[str]:
    return spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["tableFeatures"]


def test_deletion_vectors_off_leaves_the_output_readable_by_older_readers(spark, tmp_path, config):
    _write_input(spark, _texts(3), tmp_path / "reviews")
    report = run_scoring(config(**{"write.deletion_vectors": False}), spark)
    assert report.status == "succeeded" and report.output_rows == 3
    assert "deletionVectors" not in _table_features(spark, tmp_path / "labels")


def test_column_names_delta_or_spark_find_awkward_are_scored_and_an_id_column_delta_refuses_is_refused(
    spark, tmp_path, config
):
    """A text column named ``review text`` (a name Delta refuses without column mapping) reaches the run's private
    tables escaped: the prepared rows of a chunked run, then the changed rows of an incremental one. An id column named
    ``review.id`` (which the scoring stage's ``mapInArrow`` and GX would read as a struct field) is checked for
    duplicates, scored, validated and merged under its name. An id column Delta refuses would be an output column:
    refused before anything is written."""
    source = tmp_path / "reviews.parquet"
    source.mkdir()
    frame = _texts(12).rename(columns={"review_id": "review.id", "body": "review text"})
    frame = pd.concat([frame, frame.tail(1)], ignore_index=True)  # id 12 twice: both rows refused
    frame.to_parquet(source / "part-0.parquet")

    def awkward(**flags):
        return config(**{"input": str(source), "id_col": "review.id", "text_col": "review text", **flags})

    first = run_scoring(awkward(run_id="r1", **{"write.chunk_rows": 5}), spark)
    assert _accounts(first) == (0, 11, 2, 0, 0) and first.chunks["total"] == 3
    assert first.error_reasons == {"duplicate_id": 2}
    frame.loc[frame["review.id"] == 7, "review text"] = "an edited review"
    frame.to_parquet(source / "part-0.parquet")
    second = run_scoring(awkward(run_id="r2", max_error_rate=1.0), spark)  # the refused rows are looked at again
    assert _accounts(second) == (10, 1, 2, 0, 0)
    out = spark.read.format("delta").load(str(tmp_path / "labels")).toPandas().set_index("review.id")
    assert sorted(out.index) == list(range(1, 12)) and out.loc[7, "run_id"] == "r2"
    assert out.loc[7, "input_digest"] == hashlib.sha256(b"an edited review").hexdigest()

    frame.rename(columns={"review.id": "review id"}).to_parquet(source / "part-0.parquet")
    refused = tmp_path / "refused"
    with pytest.raises(TableError, match=r"cannot have a column named 'review id'.*SELECT `review id` AS review_id"):
        run_scoring(awkward(id_col="review id", output=refused), spark)
    assert not refused.exists() and not (tmp_path / "_lakescore_staging" / "refused").exists()


def test_an_upstream_commit_during_the_run_changes_nothing_in_it(spark, tmp_path, config, monkeypatch):
    source, output = tmp_path / "reviews", tmp_path / "labels"
    frame = _texts(6)
    _write_input(spark, frame, source)

    def edit_and_append():
        changed = pd.concat([frame.assign(body=frame["body"] + " (edited)"), _texts(8).iloc[6:]])
        _write_input(spark, changed, source)

    # Held at the scoring step: the run has counted and planned its rows; then upstream changes the input.
    report = run_held_at(
        spark, config(run_id="pinned"), "score_stage", tmp_path / "barrier-pinned", edit_and_append, monkeypatch
    )
    assert report.status == "succeeded" and report.input_version == 0
    assert (report.input_rows, report.rows_scored) == (6, 6)
    out = read_output(spark, str(output))
    assert out["input_digest"].tolist() == [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in frame["body"]]
    assert run_scoring(config(run_id="next"), spark).input_version == 1  # the next run reads the new version

    # A Parquet input is pinned to the file listing taken at the start: a file added meanwhile is not read.
    parquet = tmp_path / "reviews.parquet"
    parquet.mkdir()
    frame.to_parquet(parquet / "part-0.parquet")
    add_file = lambda: _texts(8).iloc[6:].to_parquet(parquet / "part-1.parquet")  # noqa: E731
    cfg = config(
        run_id="pinned-parquet", input=str(parquet), output=tmp_path / "from-parquet", **{"write.mode": "overwrite"}
    )
    report = run_held_at(spark, cfg, "score_stage", tmp_path / "barrier-pinned-parquet", add_file, monkeypatch)
    assert report.status == "succeeded" and report.input_version is None and report.output_rows == 6


def test_the_driver_compares_before_the_preflight_and_again_when_the_executors_hashed_other_weights(
    spark, tmp_path, config, tiny_classifier_dir
):
    """``compare_early`` finds the rows to score with the digest of the driver's copy of the weights, while the
    executors still load theirs; ``plan_run`` keeps that comparison when the executors agree, and compares again
    (dropping the first comparison's table) when they hashed other weights."""
    _write_input(spark, _texts(12), tmp_path / "reviews")
    first = run_scoring(config(run_id="r1"), spark)
    assert _accounts(first) == (0, 12, 0, 0, 0)

    run = open_input(config(run_id="r2"), spark)
    try:
        targets = check_targets(run)
        split = check_input_ids(run)
        executors = ModelIdentity(
            first.model_id, None, first.model_sha256, model_files=model_file_digests(tiny_classifier_dir)
        )

        early = compare_early(run, targets, split)
        assert (early.model_sha256, early.rows_to_score, early.rows_kept) == (first.model_sha256, 0, 12)
        assert plan_run(run, targets, split, executors, early).changes is early

        # As if the driver's copy held other weights than the executors loaded: every row looks stale to it.
        other = _retrained(tiny_classifier_dir, tmp_path / "retrained")
        stale = compare_early(dataclasses.replace(run, model_dir=other), targets, split)
        assert stale.model_sha256 != first.model_sha256 and stale.rows_to_score == 12 and stale.table.exists()
        plan = plan_run(run, targets, split, executors, stale)
        assert (plan.changes.model_sha256, plan.changes.rows_to_score, plan.changes.rows_kept) == (
            first.model_sha256,
            0,
            12,
        )
        assert plan.identity.sha256 == first.model_sha256 and not stale.table.exists()
    finally:
        run.worker_start.wait()


def test_a_failed_preflight_abandons_the_comparison_and_raises_its_own_error(
    spark, tmp_path, config, tiny_classifier_dir
):
    """Work that needs the model (the early comparison) is interrupted as soon as the executors fail to load it, and
    the run fails with the model's error, not the interruption's; the output keeps its version."""
    _write_input(spark, _texts(4), tmp_path / "reviews")
    assert run_scoring(config(run_id="r1"), spark).status == "succeeded"
    broken = tmp_path / "broken"
    shutil.copytree(tiny_classifier_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")  # the driver hashes it; no worker can load it

    def slow(batches):  # defined here, so Spark ships it by value (workers cannot import the tests package)
        time.sleep(120)  # far longer than the preflight takes to fail
        yield from batches

    run = open_input(config(model=broken, run_id="r2"), spark)
    started = time.monotonic()
    with (
        pytest.raises(ModelSourceError, match="failed to load or score a sample on executor"),
        ExecutorPreflight(run) as preflight,
        preflight.abandoned_if_it_fails(),
    ):
        spark.range(1, numPartitions=1).mapInPandas(slow, "id long").collect()
    assert time.monotonic() - started < 60

    with pytest.raises(ModelSourceError, match="failed to load or score a sample on executor"):
        run_scoring(config(model=broken, run_id="r3"), spark)
    assert spark.sql(f"DESCRIBE HISTORY delta.`{tmp_path / 'labels'}`").count() == 1
