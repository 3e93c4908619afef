"""The per-process cache and the scoring function Spark runs in each worker, run here without Spark."""

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField

from lakescore.schemas.output import scored_schema
from lakescore.udfs import registry
from lakescore.udfs.models import model_cache
from lakescore.udfs.models.model_source import ModelIntegrityError, ModelSpec
from lakescore.udfs.scoring_udf import make_scoring_function


@pytest.fixture
def load_counter(monkeypatch):
    """Counts real loads by wrapping the embed loader (the real loader still runs)."""
    calls = []
    real = registry.TASKS["embed"]

    def counting(spec, model_dir):
        calls.append(spec)
        return real.load(spec, model_dir)

    model_cache.clear()
    monkeypatch.setitem(registry.TASKS, "embed", dataclasses.replace(real, loader=counting))
    yield calls
    model_cache.clear()


def _embed_function(minilm_dir, rows_counter=None, **spec_options):
    schema = scored_schema("embed", StructField("id", LongType()))
    spec = ModelSpec("embed", str(minilm_dir), **spec_options)
    return make_scoring_function(
        spec,
        keep_cols=["id"],
        input_cols=["text"],
        schema=schema,
        max_tokens=512,
        max_rows=3,
        rows_counter=rows_counter,
    )


class _Counter:
    """Stands in for a classic session's accumulator: what the workers ``add`` to."""

    def __init__(self):
        self.value = 0

    def add(self, rows):
        self.value += rows


def test_model_loads_once_per_process_and_key(minilm_dir, load_counter):
    spec = ModelSpec("embed", str(minilm_dir))
    first, loaded_first = model_cache.get_model(spec)
    again, loaded_again = model_cache.get_model(ModelSpec("embed", str(minilm_dir)))  # equal key, new object
    assert (loaded_first, loaded_again) == (True, False)
    assert again is first and len(load_counter) == 1
    other, loaded_other = model_cache.get_model(ModelSpec("embed", str(minilm_dir), max_seq_length=32))
    assert loaded_other and other is not first and len(load_counter) == 2
    assert first.sha256 == other.sha256  # same weights, different head settings


def test_a_model_edited_in_place_is_loaded_again_not_served_from_the_cache(minilm_dir, load_counter, tmp_path):
    import shutil

    model = tmp_path / "minilm"
    shutil.copytree(minilm_dir, model)
    spec = ModelSpec("embed", str(model))
    first, _ = model_cache.get_model(spec)
    assert model_cache.get_model(spec) == (first, False)
    settings = model / "sentence_bert_config.json"
    settings.write_text(settings.read_text().replace('"max_seq_length": 256', '"max_seq_length": 8'))
    edited, loaded = model_cache.get_model(spec)
    assert loaded and edited is not first and len(load_counter) == 2
    assert edited.files["sentence_bert_config.json"] != first.files["sentence_bert_config.json"]
    long_text = ["the battery lasted all week and the screen stayed bright in the sun"]
    assert not np.allclose(edited.scorer.score(long_text), first.scorer.score(long_text), atol=1e-3)


def test_worker_scores_batches_in_order_with_one_load(minilm_dir, sentence_transformer, load_counter):
    counter = _Counter()
    score = _embed_function(minilm_dir, counter)
    texts = ["a long review " * 40, "short", None, "", "mid length review text", "x " * 300, "last one"]
    ids = [10, 11, 12, 13, 14, 15, 16]
    batches = [
        pa.record_batch({"id": pa.array(ids[:4], pa.int64()), "text": pa.array(texts[:4])}),
        pa.record_batch({"id": pa.array(ids[4:], pa.int64()), "text": pa.array(texts[4:])}),
    ]
    out = pa.Table.from_batches(list(score(iter(batches))))
    assert len(load_counter) == 1  # one load for every batch of the task
    assert out.column_names == ["id", "embedding", "model_sha256", "_reason", "_error", "_input", "_worker"]
    assert out.column("id").to_pylist() == ids  # ids pass through as they came
    assert counter.value == 7  # live rows, batch by batch
    # Worker metrics ride on each batch's first row: the load on the batch that loaded, one batch each.
    worker = out.column("_worker").to_pylist()
    assert [w is not None for w in worker] == [True, False, False, False, True, False, False]
    assert [(w["model_loads"], w["arrow_batches"], w["budget_halvings"]) for w in (worker[0], worker[4])] == [
        (1, 1, 0),
        (0, 1, 0),
    ]
    assert worker[0]["model_seconds"] > 0 and worker[4]["model_seconds"] > 0
    rows = out.to_pylist()
    assert rows[2]["embedding"] is None and rows[2]["_reason"] == "null_input"  # never a made-up vector
    present = [i for i, t in enumerate(texts) if t is not None]
    assert all(rows[i]["_reason"] is None and rows[i]["_input"] is None for i in present)
    ours = np.array([rows[i]["embedding"] for i in present])
    peer = sentence_transformer.encode([texts[i] for i in present], normalize_embeddings=True)
    assert ((ours * peer).sum(1) >= 0.9999).all()
    assert set(out.column("model_sha256").to_pylist()) == {
        model_cache.get_model(ModelSpec("embed", str(minilm_dir)))[0].sha256
    }


def test_empty_partition_loads_nothing(minilm_dir, load_counter):
    assert list(_embed_function(minilm_dir)(iter([]))) == []
    assert load_counter == []


def test_worker_refuses_weights_other_than_the_drivers(minilm_dir, load_counter):
    score = _embed_function(minilm_dir, expect_sha256="0" * 64)
    batch = pa.record_batch({"id": pa.array([1], pa.int64()), "text": pa.array(["hello"])})
    with pytest.raises(ModelIntegrityError, match="expects 0000"):
        list(score(iter([batch])))
    assert load_counter == []  # refused before loading


def test_tabular_worker_dead_letters_bad_feature_rows_with_their_values(tiny_tabular):
    import torch

    from tests.conftest import TinyTabular

    module, script, _ = tiny_tabular
    features = TinyTabular.FEATURES
    schema = scored_schema("tabular", StructField("id", LongType()))
    spec = ModelSpec("tabular", str(script), feature_cols=features)
    score = make_scoring_function(
        spec, keep_cols=["id"], input_cols=features, schema=schema, max_tokens=None, max_rows=2
    )
    values = {name: [0.5, None, 1.0, float("nan"), -2.0] for name in features}
    values["feature_b"] = [1, 2, 3, 4, 5]  # an integer column is a feature too
    batch = pa.record_batch(
        {"id": pa.array([1, 2, 3, 4, 5], pa.int64()), **{k: pa.array(v) for k, v in values.items()}}
    )
    rows = pa.Table.from_batches(list(score(iter([batch])))).to_pylist()
    assert [r["_reason"] for r in rows] == [None, "bad_feature_value", None, "bad_feature_value", None]
    assert rows[1]["_input"] == '{"feature_a": "nan", "feature_b": 2.0, "feature_c": "nan", "feature_d": "nan"}'
    good = [0, 2, 4]
    matrix = np.array([[values[f][i] for f in features] for i in good], dtype=np.float32)
    with torch.no_grad():
        peer = module(torch.from_numpy(matrix)).double().numpy()
    assert np.allclose([rows[i]["scores"] for i in good], peer, atol=1e-6)
    assert [rows[i]["prediction"] for i in good] == peer.argmax(1).astype(float).tolist()


def test_a_pin_is_checked_on_the_cached_model_not_a_second_load(minilm_dir, load_counter):
    unpinned, _ = model_cache.get_model(ModelSpec("embed", str(minilm_dir)))
    pinned, loaded_now = model_cache.get_model(ModelSpec("embed", str(minilm_dir), expect_sha256=unpinned.sha256))
    assert (
        pinned is unpinned and not loaded_now and len(load_counter) == 1
    )  # the scoring stage reuses the preflight's load
    with pytest.raises(ModelIntegrityError, match="refusing to score"):
        model_cache.get_model(ModelSpec("embed", str(minilm_dir), expect_sha256="0" * 64))


def test_preflight_loads_into_the_worker_cache_and_reports_the_weights(minilm_dir, load_counter):
    from lakescore.udfs.scoring_udf import make_preflight_function

    spec = ModelSpec("embed", str(minilm_dir))
    (batch,) = list(make_preflight_function(spec)(iter([pa.record_batch({"id": pa.array([0], pa.int64())})])))
    (row,) = batch.to_pylist()
    assert row["error"] is None and row["device"] == "cpu" and row["seconds"] > 0 and row["loaded"] is True
    (again,) = list(make_preflight_function(spec)(iter([]))).pop().to_pylist()
    assert again["loaded"] is False  # a second preflight task in this worker found it cached
    assert row["sha256"] == model_cache.get_model(spec)[0].sha256 and len(load_counter) == 1  # scoring finds it loaded
    list(
        _embed_function(minilm_dir, expect_sha256=row["sha256"])(
            iter([pa.record_batch({"id": pa.array([1], pa.int64()), "text": pa.array(["hi"])})])
        )
    )
    assert len(load_counter) == 1


def test_preflight_returns_a_load_failure_instead_of_raising(tmp_path, load_counter):
    from lakescore.udfs.scoring_udf import make_preflight_function

    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "model.safetensors").write_bytes(b"not weights")
    (batch,) = list(make_preflight_function(ModelSpec("embed", str(tmp_path)))(iter([])))
    (row,) = batch.to_pylist()
    assert row["sha256"] is None and row["error_type"] and row["error"]  # the driver turns this into one clear error


def test_a_batch_with_no_scorable_row_comes_back_null_with_reasons(minilm_dir, tiny_tabular):
    from tests.conftest import TinyTabular

    texts = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "text": pa.array([None, None], pa.string())})
    rows = pa.Table.from_batches(list(_embed_function(minilm_dir)(iter([texts])))).to_pylist()
    assert [(r["embedding"], r["_reason"]) for r in rows] == [(None, "null_input"), (None, "null_input")]

    features = TinyTabular.FEATURES
    schema = scored_schema("tabular", StructField("id", LongType()))
    score = make_scoring_function(
        ModelSpec("tabular", str(tiny_tabular[1]), feature_cols=features),
        keep_cols=["id"],
        input_cols=features,
        schema=schema,
        max_tokens=None,
        max_rows=2,
    )
    bad = pa.record_batch({"id": pa.array([7], pa.int64()), **{f: pa.array([float("nan")]) for f in features}})
    (row,) = pa.Table.from_batches(list(score(iter([bad])))).to_pylist()
    assert row["prediction"] is None and row["scores"] is None and row["_reason"] == "bad_feature_value"


def test_the_preflight_times_a_batch_of_its_sample_except_for_generation(tiny_tabular, tiny_causal_lm_dir, tmp_path):
    """The preflight's seconds per row decide whether the scoring stage shuffles rows for progress: measured on a batch
    of the sample for a tabular program, not for generation (a batch of prompts would be a whole generation)."""
    from lakescore.udfs.scoring_udf import make_preflight_function

    def row(spec):
        (batch,) = list(make_preflight_function(spec)(iter([pa.record_batch({"id": pa.array([0])})])))
        return batch.to_pylist()[0]

    _, script, _ = tiny_tabular
    tabular = row(ModelSpec("tabular", str(script), feature_cols=("a", "b", "c", "d"), cache_dir=str(tmp_path)))
    assert tabular["error"] is None and 0 < tabular["row_seconds"] < tabular["seconds"]
    generate = row(ModelSpec("generate", str(tiny_causal_lm_dir), cache_dir=str(tmp_path)))
    assert generate["error"] is None and generate["row_seconds"] is None
