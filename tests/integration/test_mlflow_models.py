"""MLflow model URIs end to end: a real MLflow tracking and registry store (SQLite in tmp), tiny seeded models
logged with MLflow's own flavours, resolved by MLflow's client, staged once per host, scored on real Spark + Delta."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pandas as pd
import pytest

from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from lakescore.udfs.models.model_source import ModelIntegrityError, ModelSourceError
from tests.integration.test_score_job import read_output, reviews_frame


@pytest.fixture(scope="module")
def registry(module_tmp_path):
    """A fresh MLflow store: tracking and model registry in one SQLite file, artifacts in a directory."""
    import mlflow

    root = module_tmp_path
    uri = f"sqlite:///{root / 'mlflow.db'}"
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    os.environ.update(MLFLOW_TRACKING_URI=uri, MLFLOW_REGISTRY_URI=uri)
    experiment = mlflow.create_experiment("lakescore-tests", artifact_location=(root / "artifacts").as_uri())
    yield mlflow, experiment
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


@pytest.fixture(scope="module")
def classifiers(registry, minilm_dir):
    """Two versions of a registered text classifier (transformers flavour), alias ``champion`` on version 2.

    Version 2's head is version 1's negated, so the two disagree on labels: scoring the wrong version fails."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from tests.conftest import LABELS, _tiny_bert

    mlflow, experiment = registry
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    models = []
    with mlflow.start_run(experiment_id=experiment):
        for version in (1, 2):
            model = _tiny_bert(BertForSequenceClassification, LABELS)
            with torch.no_grad():
                model.classifier.weight.mul_(1 if version == 1 else -1)
            mlflow.transformers.log_model(
                {"model": model, "tokenizer": tokenizer},
                name=f"classifier-{version}",
                task="text-classification",
                registered_model_name="reviews-sentiment",
                pip_requirements=[],
            )
            models.append(model)
    mlflow.MlflowClient().set_registered_model_alias("reviews-sentiment", "champion", "2")
    return models, tokenizer


def _job(tmp_path, source, model, task="classify", **flags):
    return load_config(
        flags={
            "input": str(source),
            "output": str(tmp_path / "out"),
            "task": task,
            "model.source": model,
            "id_col": "review_id",
            "model.cache_dir": str(tmp_path / "model-cache"),
            **flags,
        }
    )


def test_registry_alias_resolves_to_its_version_and_equals_the_pipeline(tmp_path, spark, classifiers):
    from transformers import pipeline

    models, tokenizer = classifiers
    frame = reviews_frame(24, seed=8)
    source = tmp_path / "reviews.parquet"
    frame.to_parquet(source)
    report = run_scoring(_job(tmp_path, source, "models:/reviews-sentiment@champion", text_col="body"), spark)
    assert report.status == "succeeded", report.validation
    assert (report.model_id, report.model_revision) == ("models:/reviews-sentiment@champion", "2")
    staged = [p for p in (tmp_path / "model-cache").iterdir() if p.is_dir()]
    assert len(staged) == 1  # downloaded once for this host; the executors got it from Spark
    (weights,) = staged[0].glob("*/model.safetensors")
    assert report.model_sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    out = read_output(spark, str(tmp_path / "out"))
    assert set(out["model_revision"]) == {"2"} and set(out["model_id"]) == {"models:/reviews-sentiment@champion"}

    peer = pipeline("text-classification", model=models[1], tokenizer=tokenizer, top_k=None, device="cpu")
    texts = frame.set_index("review_id").loc[out["review_id"], "body"].tolist()
    checked = 0
    for i, text in enumerate(texts):
        if len(text.split()) > 300:  # the pipeline raises past the model's limit
            continue
        ranked = peer(text)
        ranked = ranked[0] if isinstance(ranked[0], list) else ranked
        assert out["label"][i] == ranked[0]["label"] and abs(out["score"][i] - ranked[0]["score"]) < 1e-4
        checked += 1
    assert checked >= 18

    with pytest.raises(ModelIntegrityError, match="refusing to score"):  # the pin still applies, before compute
        run_scoring(
            _job(
                tmp_path,
                source,
                "models:/reviews-sentiment/1",
                text_col="body",
                **{"model.expect_sha256": report.model_sha256},
            ),
            spark,
        )  # version 1 is other weights
    assert not (tmp_path / "out" / "_delta_log" / "00000000000000000001.json").exists()


def test_run_uri_of_a_sentence_transformers_model_equals_sentence_transformers(
    tmp_path, spark, registry, sentence_transformer
):
    mlflow, experiment = registry
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.sentence_transformers.log_model(sentence_transformer, name="embedder", pip_requirements=[])
    frame = reviews_frame(16, seed=2)
    source = tmp_path / "reviews.parquet"
    frame.to_parquet(source)
    uri = f"runs:/{run.info.run_id}/embedder"
    report = run_scoring(_job(tmp_path, source, uri, task="embed", text_col="body"), spark)
    assert report.status == "succeeded" and report.model_revision == run.info.run_id
    out = read_output(spark, str(tmp_path / "out"))
    peer = sentence_transformer.encode(frame.set_index("review_id").loc[out["review_id"], "body"].tolist())
    ours = np.stack(out["embedding"].to_list())
    assert ((ours * peer).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(peer, axis=1)).min() >= 0.999


def test_pytorch_flavour_torch_export_scores_and_a_pickled_one_is_refused(tmp_path, spark, registry):
    import torch

    from tests.conftest import TinyTabular

    mlflow, experiment = registry
    module = TinyTabular.module()
    example = np.zeros((2, 4), dtype=np.float32)
    with mlflow.start_run(experiment_id=experiment):
        mlflow.pytorch.log_model(
            module, name="program", registered_model_name="tabular-pt2", input_example=example, pip_requirements=[]
        )
        mlflow.pytorch.log_model(
            module,
            name="pickled",
            registered_model_name="tabular-pickle",
            serialization_format="pickle",
            pip_requirements=[],
        )
    features = list(TinyTabular.FEATURES)
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(rng.normal(size=(20, 4)).astype(np.float32), columns=features)
    frame.insert(0, "review_id", range(20))
    source = tmp_path / "features.parquet"
    frame.to_parquet(source)
    report = run_scoring(_job(tmp_path, source, "models:/tabular-pt2/1", task="tabular", feature_cols=features), spark)
    assert report.status == "succeeded" and report.model_revision == "1"
    out = read_output(spark, str(tmp_path / "out"))
    with torch.no_grad():
        peer = module(torch.from_numpy(frame[features].to_numpy())).double().numpy()
    np.testing.assert_allclose(np.stack(out["scores"]), peer, atol=1e-6)

    with pytest.raises(ModelSourceError, match="is pickled .*serialization_format='pt2'"):
        run_scoring(_job(tmp_path, source, "models:/tabular-pickle/1", task="tabular", feature_cols=features), spark)


@pytest.mark.parametrize(
    "uri, message",
    [
        ("models:/reviews-sentiment/latest", "not an MLflow URI lakescore can pin"),
        ("models:/reviews-sentiment/Production", "not an MLflow URI lakescore can pin"),
        ("models:/reviews-sentiment@nobody", "MLflow cannot resolve model 'models:/reviews-sentiment@nobody'"),
        ("models:/no-such-model/1", "MLflow cannot resolve model 'models:/no-such-model/1'"),
    ],
)
def test_unpinnable_or_unknown_models_fail_before_compute_in_one_line(tmp_path, spark, classifiers, uri, message):
    source = tmp_path / "reviews.parquet"
    reviews_frame(4).to_parquet(source)
    with pytest.raises(ModelSourceError, match=message) as caught:
        run_scoring(_job(tmp_path, source, uri, text_col="body"), spark)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()
