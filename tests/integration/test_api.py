"""The public Python API (``lakescore.score``, ``transform``, ``pandas_udf``) on real local Spark + Delta,
with the real all-MiniLM-L6-v2 against sentence-transformers and tiny seeded models against their peers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

import lakescore
from lakescore.jobs.config import ConfigError
from lakescore.schemas.contracts import InputContractError
from lakescore.udfs.models.model_source import ModelSourceError
from tests.integration.test_score_job import read_output, reviews_frame


def _cosines(got: list, expected: np.ndarray) -> np.ndarray:
    got = np.asarray([np.asarray(v, dtype=np.float64) for v in got])
    expected = np.asarray(expected, dtype=np.float64)
    return (got * expected).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))


@pytest.fixture(scope="module")
def reviews(spark):
    frame = reviews_frame(60, seed=5)
    frame.loc[7, "body"] = None  # a null text: null prediction, a reason, never a made-up vector
    return frame, spark.createDataFrame(frame, "review_id long, body string, stars long")


def test_score_runs_the_whole_job_and_writes_its_report(tmp_path, spark, minilm_dir, sentence_transformer):
    source, output, report_path = tmp_path / "in.parquet", str(tmp_path / "out"), tmp_path / "report.json"
    frame = reviews_frame(50, seed=9)
    frame.to_parquet(source)
    report = lakescore.score(
        spark,
        input=str(source),
        output=output,
        task="embed",
        id_col="review_id",
        text_col="body",
        model={"source": str(minilm_dir)},
        write={"mode": "replace_run"},
        run_date="2026-11-23",
        report=str(report_path),
    )
    assert report.status == "succeeded" and report.run_id == "2026-11-23"
    assert (report.input_rows, report.output_rows, report.error_rows) == (50, 50, 0)
    assert json.loads(report_path.read_text())["run_id"] == "2026-11-23"
    out = read_output(spark, output)
    expected = sentence_transformer.encode(frame.sort_values("review_id")["body"].tolist())
    assert _cosines(out["embedding"].tolist(), expected).min() >= 0.999
    assert set(out["run_id"]) == {"2026-11-23"}


def test_score_refuses_a_bad_setting_before_any_compute(spark, minilm_dir):
    for model in ({"source": str(minilm_dir)}, str(minilm_dir)):  # the model section, or its source alone
        with pytest.raises(ConfigError, match="unknown config key 'write.mdoe'; did you mean 'write.mode'"):
            lakescore.score(spark, input="x", output="y", model=model, write={"mdoe": "overwrite"})


def test_transform_keeps_every_column_and_equals_sentence_transformers(
    spark, reviews, minilm_dir, sentence_transformer
):
    frame, df = reviews
    scored = lakescore.transform(df, task="embed", model=minilm_dir, text_col="body", max_batch_tokens=512)
    assert scored.columns == ["review_id", "body", "stars", "embedding", "model_sha256", "_reason", "_error"]
    rows = scored.toPandas().sort_values("review_id").reset_index(drop=True)
    assert (
        rows["review_id"].tolist() == sorted(frame["review_id"]) and rows["stars"].tolist() == frame["stars"].tolist()
    )
    present = rows["body"].notna()
    assert rows.loc[~present, "embedding"].isna().all() and set(rows.loc[~present, "_reason"]) == {"null_input"}
    assert rows.loc[present, "_reason"].isna().all()
    expected = sentence_transformer.encode(rows.loc[present, "body"].tolist())
    assert _cosines(rows.loc[present, "embedding"].tolist(), expected).min() >= 0.999


def test_transform_with_an_id_keeps_only_the_id_whatever_its_name(spark, reviews, minilm_dir):
    _, df = reviews
    five = df.orderBy("review_id").limit(5)
    scored = lakescore.transform(five, task="embed", model=str(minilm_dir), text_col="body", id_col="review_id")
    assert scored.columns == ["review_id", "embedding", "model_sha256", "_reason", "_error"]
    rows = scored.toPandas().sort_values("review_id")
    assert len(rows) == 5

    # A dot (read as a struct field by a bare name) and a backtick (refused there) in the names.
    awkward = five.withColumnsRenamed({"review_id": "review.id", "body": "the `body`"})
    scored = lakescore.transform(
        awkward, task="embed", model=str(minilm_dir), text_col="the `body`", id_col="review.id"
    )
    assert scored.columns == ["review.id", "embedding", "model_sha256", "_reason", "_error"]
    same = scored.toPandas().sort_values("review.id")
    assert same["review.id"].tolist() == rows["review_id"].tolist()
    assert same["embedding"].notna().tolist() == rows["embedding"].notna().tolist()


def test_transform_renders_a_prompt_template_as_the_job_does(spark, tiny_causal_lm_dir):
    from pyspark.sql import functions as F

    df = spark.createDataFrame(
        [(1, "lamp", "Arrived late."), (2, "desk", "Solid, and cheap!"), (3, None, "Fine.")],
        "id long, product string, body string",
    )
    options = dict(task="generate", model=tiny_causal_lm_dir, id_col="id", max_new_tokens=4)
    by_hand = df.withColumn(
        "prompt", F.concat(F.lit("Review of "), "product", F.lit(": "), "body", F.lit("\nSummary:"))
    )
    reference = lakescore.transform(by_hand, text_col="prompt", **options).toPandas().set_index("id").sort_index()
    template = "Review of {product}: {body}\nSummary:"
    for columns in ({"text_col": "body"}, {}):  # with a text column too the template is the prompt, as in the job
        scored = lakescore.transform(df, prompt_template=template, **columns, **options)
        assert scored.columns == ["id", *reference.columns]
        got = scored.toPandas().set_index("id").sort_index()
        assert got.drop(columns="choice_logprobs").equals(reference.drop(columns="choice_logprobs")), columns
    assert reference.loc[3, "_reason"] == "null_input" and reference.loc[1, "prompt_tokens"] > 6  # the rendered prompt


def test_transform_checks_before_any_spark_job(spark, reviews, minilm_dir, tmp_path):
    _, df = reviews
    context = spark.sparkContext
    context.setJobGroup("api-checks", "every check of this test")  # jobs this thread starts from here on
    try:
        _transform_refusals(df, minilm_dir, tmp_path)
        assert context.statusTracker().getJobIdsForGroup("api-checks") == []
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)


def _transform_refusals(df, minilm_dir, tmp_path):
    with pytest.raises(InputContractError, match="text column 'text' not found"):
        lakescore.transform(df, task="embed", model=minilm_dir, text_col="text")
    with pytest.raises(InputContractError, match=r"already has column\(s\) \['embedding'\]"):
        lakescore.transform(df.withColumn("embedding", df.stars), task="embed", model=minilm_dir, text_col="body")
    with pytest.raises(ConfigError, match="unknown option 'batch_size'"):
        lakescore.transform(df, task="embed", model=minilm_dir, text_col="body", batch_size=8)
    with pytest.raises(ConfigError, match="task must be one of"):
        lakescore.transform(df, task="summarize", model=minilm_dir, text_col="body")
    with pytest.raises(ModelSourceError, match="does not exist"):
        lakescore.transform(df, task="embed", model=str(tmp_path / "absent"), text_col="body")
    # A model the workers would refuse, refused here rather than in the first job: no weights, pickle only, a config
    # that is not JSON, other weights than expected. pandas_udf checks the same.
    no_weights = tmp_path / "no-weights"
    shutil.copytree(minilm_dir, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(ModelSourceError, match=f"no weight files .* found under model directory {no_weights}"):
        lakescore.transform(df, task="embed", model=no_weights, text_col="body")
    with pytest.raises(ModelSourceError, match="no weight files"):
        lakescore.pandas_udf(task="embed", model=str(no_weights))
    (no_weights / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelSourceError, match="holds only pickle-based weights"):
        lakescore.transform(df, task="embed", model=no_weights, text_col="body")
    (no_weights / "config.json").write_text("{not json")
    with pytest.raises(ModelSourceError, match="config.json cannot be read as JSON"):
        lakescore.transform(df, task="embed", model=no_weights, text_col="body", allow_pickle=True)
    with pytest.raises(ModelSourceError, match="but the run expects 00000000"):
        lakescore.transform(
            df, task="embed", model={"source": str(minilm_dir), "expect_sha256": "0" * 64}, text_col="body"
        )


def test_pandas_udf_embeds_in_a_select(spark, reviews, minilm_dir, sentence_transformer):
    _frame, df = reviews
    embed = lakescore.pandas_udf(task="embed", model=minilm_dir, max_batch_tokens=512)
    rows = df.select("review_id", "body", embed("body").alias("vector")).toPandas().sort_values("review_id")
    present = rows["body"].notna()
    assert rows.loc[~present, "vector"].isna().all()
    expected = sentence_transformer.encode(rows.loc[present, "body"].tolist())
    assert _cosines(rows.loc[present, "vector"].tolist(), expected).min() >= 0.999


def test_pandas_udf_classifies_into_a_struct_equal_to_the_pipeline(spark, tiny_classifier_dir):
    from transformers import pipeline

    texts = ["great blender", "awful, broke in a week", "", "Das ist gut.", "ok " * 400]
    df = spark.createDataFrame(pd.DataFrame({"id": range(len(texts)), "text": texts}))
    classify = lakescore.pandas_udf(task="classify", model=tiny_classifier_dir)
    rows = (
        df.withColumn("p", classify("text")).select("id", "p.label", "p.score", "p.probs").toPandas().sort_values("id")
    )
    peer = pipeline("text-classification", model=str(tiny_classifier_dir), top_k=None, device="cpu")
    for text, label, score in zip(texts, rows["label"], rows["score"]):
        ranked = peer(text, truncation=True)
        ranked = ranked[0] if ranked and isinstance(ranked[0], list) else ranked
        assert label == ranked[0]["label"] and abs(score - ranked[0]["score"]) < 1e-4


def test_pandas_udf_takes_one_column_per_feature(spark, tiny_tabular):
    import torch

    from tests.conftest import TinyTabular

    module, script, _ = tiny_tabular
    matrix = np.random.default_rng(4).normal(size=(20, 4))
    df = spark.createDataFrame(pd.DataFrame(matrix, columns=list(TinyTabular.FEATURES)).assign(id=range(20)))
    predict = lakescore.pandas_udf(task="tabular", model=script, feature_cols=TinyTabular.FEATURES)
    rows = (
        df.select("id", predict(*TinyTabular.FEATURES).alias("p")).select("id", "p.scores").toPandas().sort_values("id")
    )
    with torch.no_grad():
        expected = module(torch.as_tensor(matrix, dtype=torch.float32)).double().numpy()
    assert np.allclose(np.stack(rows["scores"].tolist()), expected, atol=1e-6)


def test_pandas_udf_returns_varying_length_entities_equal_to_the_pipeline(spark, tiny_ner_dir):
    from transformers import pipeline

    from tests.unit.test_ner import assert_same_entities

    texts = ["Angela Merkel met Tim Cook in Berlin.", "", "ok", "Ünïcödé in 東京 🙂, said Jürgen Klopp."]
    df = spark.createDataFrame(pd.DataFrame({"id": range(len(texts)), "text": texts}))
    ner = lakescore.pandas_udf(task="ner", model=tiny_ner_dir)
    rows = df.select("id", ner("text").alias("entities")).toPandas().sort_values("id")
    peer = pipeline("token-classification", model=str(tiny_ner_dir), aggregation_strategy="simple", device="cpu")
    found = 0
    for text, entities in zip(texts, rows["entities"]):
        ours = [e.asDict() for e in entities]
        found += len(ours)
        assert_same_entities(ours, peer(text), text)
    assert found >= 3  # the tiny model tags many tokens: the comparison is not between empty lists
