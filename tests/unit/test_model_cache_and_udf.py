"""The per-process cache and the UDF's worker function, run in this process without Spark."""

import numpy as np
import pandas as pd
import pytest

from udfs import model_cache
from udfs.batching import BatchPolicy
from udfs.model_source import ModelSpec
from udfs.scoring_udf import make_scoring_udf


@pytest.fixture
def load_counter(monkeypatch):
    """Counts real loads by wrapping the embed loader (the real loader still runs)."""
    calls = []
    real = model_cache.HEAD_LOADERS["embed"]

    def counting(spec, model_dir):
        calls.append(spec)
        return real(spec, model_dir)

    model_cache.clear()
    monkeypatch.setitem(model_cache.HEAD_LOADERS, "embed", counting)
    yield calls
    model_cache.clear()


def test_model_loads_once_per_process_and_key(minilm_dir, load_counter):
    spec = ModelSpec("embed", str(minilm_dir))
    first, loaded_first = model_cache.get_model(spec)
    again, loaded_again = model_cache.get_model(ModelSpec("embed", str(minilm_dir)))  # equal key, new object
    assert (loaded_first, loaded_again) == (True, False)
    assert again is first and len(load_counter) == 1
    other, loaded_other = model_cache.get_model(ModelSpec("embed", str(minilm_dir), max_seq_length=32))
    assert loaded_other and other is not first and len(load_counter) == 2
    assert first.sha256 == other.sha256  # same weights, different head settings


def test_udf_worker_scores_batches_in_order_with_one_load(minilm_dir, sentence_transformer, load_counter):
    udf = make_scoring_udf(ModelSpec("embed", str(minilm_dir)), policy=BatchPolicy(max_tokens=512, max_rows=3))
    texts = ["a long review " * 40, "short", None, "", "mid length review text", "x " * 300, "last one"]
    batches = [pd.Series(texts[:4]), pd.Series(texts[4:])]
    frames = list(udf.func(iter(batches)))  # the function Spark runs inside the worker
    assert len(load_counter) == 1  # one load for every batch of the task
    out = pd.concat(frames, ignore_index=True)
    assert list(out.columns) == ["embedding", "model_sha256"]
    assert out["embedding"][2] is None  # a null text gets a null embedding, never a made-up one
    present = [i for i, t in enumerate(texts) if t is not None]
    ours = np.stack(out["embedding"][present].to_list())
    peer = sentence_transformer.encode([texts[i] for i in present], normalize_embeddings=True)
    assert ((ours * peer).sum(1) >= 0.9999).all()
    assert out["model_sha256"].nunique() == 1 and len(out["model_sha256"][0]) == 64


def test_empty_partition_loads_nothing(minilm_dir, load_counter):
    udf = make_scoring_udf(ModelSpec("embed", str(minilm_dir)), policy=BatchPolicy(max_tokens=512, max_rows=4))
    assert list(udf.func(iter([]))) == []
    assert load_counter == []
