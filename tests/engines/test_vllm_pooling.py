"""vLLM's pooling runner (``--runner pooling``) serving all-MiniLM-L6-v2 on ``/v1/embeddings``: the vectors the
in-process ``embed`` task is checked against (sentence-transformers' ``encode``), over-length texts truncated to the
model's limit by ``truncate_prompt_tokens`` (without it vLLM refuses them with a 400); and ``--task embed`` through it,
on real Spark + Delta: ``embed.server`` (lakescore serves the model with vLLM itself, and leaves no process of it) and
``embed.endpoint`` (the module's one standalone server): every row's vector equal to sentence-transformers' within
float rounding, an over-length text truncated, a null row dead-lettered, the tokens and their cost from ``usage``."""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import httpx2
import numpy as np
import pandas as pd
import pytest

from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from tests.engines.vllm_engine import ENGINE_ENV, STARTUP_S, VLLM_PYTHON, VllmServer, needs_vllm, vllm_processes
from tests.integration.test_score_job import read_output

pytestmark = needs_vllm

NAME = "minilm"
PRICE = 20.0
"""Per million prompt tokens (``embed.endpoint.price.input``)."""


@pytest.fixture(autouse=True)
def engine_env(monkeypatch):
    """A served engine inherits the worker's environment: 1 GiB of KV cache, offline (the session's workers start
    after)."""
    for name, value in ENGINE_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def texts():
    """Reviews, a text far past MiniLM's 256 tokens, Unicode, an empty text and a null one."""
    from tests.tiny_generators import reviews

    return reviews(30, seed=1) + [" ".join(reviews(200, seed=5)), "Ünïcödé — 漢字 and emoji 🙂", "", None]


def _embed_run(spark, tmp_path, texts, **flags):
    frame = pd.DataFrame({"review_id": range(1, len(texts) + 1), "body": texts})
    source, output = tmp_path / "reviews", tmp_path / "embeddings"
    spark.createDataFrame(frame, "review_id long, body string").write.format("delta").save(str(source))
    cfg = load_config(
        flags={
            "input": str(source),
            "output": str(output),
            "task": "embed",
            "id_col": "review_id",
            "text_col": "body",
            "spark.master": "local[2]",
            "scoring.partitions": 1,
            "scoring.max_batch_rows": 8,
            "max_error_rate": 0.1,
            **flags,
        }
    )  # 8: several requests a batch
    started = time.monotonic()
    report = run_scoring(cfg, spark)
    print(
        f"embed run ({', '.join(k for k in flags if k.endswith(('.url', '.engine')))}): "
        f"{time.monotonic() - started:.1f} s"
    )
    assert report.status == "succeeded", report.error
    return report, read_output(spark, str(output))


def _assert_sentence_transformers_vectors(out, texts, sentence_transformer):
    present = [t for t in texts if t is not None]
    assert out["review_id"].tolist() == [i + 1 for i, t in enumerate(texts) if t is not None]
    got = np.array(out["embedding"].tolist(), dtype=np.float64)
    expected = sentence_transformer.encode(present, normalize_embeddings=True)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # normalised as in-process (MiniLM's Normalize)
    cosine = (got * expected).sum(axis=1)
    print(f"cosine to sentence-transformers: min {cosine.min():.8f}")
    assert cosine.min() >= 0.9999, cosine  # the over-length text included: truncated as sentence-transformers does


def test_embed_server_serves_minilm_with_vllm_and_leaves_no_process(
    spark, tmp_path, minilm_dir, texts, sentence_transformer
):
    model = shutil.copytree(minilm_dir, tmp_path / "served-minilm")  # its path marks this test's engine
    python = VLLM_PYTHON.relative_to(Path.cwd()) if VLLM_PYTHON.is_relative_to(Path.cwd()) else VLLM_PYTHON
    report, out = _embed_run(
        spark,
        tmp_path,
        texts,
        **{
            "model.source": str(model),
            "embed.server.engine": "vllm",
            "embed.server.python": str(python),
            "embed.server.args": [
                "--dtype",
                "float32",
                "--gpu-memory-utilization",
                "0.1",
            ],  # lakescore adds --runner pooling
            "embed.server.startup_timeout_s": STARTUP_S,
        },
    )
    assert report.error_reasons == {"null_input": 1}
    _assert_sentence_transformers_vectors(out, texts, sentence_transformer)
    assert report.workers["requests"] >= 2 and report.workers["tokens_in"] > 0
    deadline = time.monotonic() + 60
    while [c for c in vllm_processes() if str(model) in c]:
        assert time.monotonic() < deadline, f"vLLM processes outlived the run: {vllm_processes()}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def pooling(minilm_dir, module_tmp_path):
    server = VllmServer(
        minilm_dir,
        module_tmp_path / "vllm.log",
        NAME,  # (MiniLM's own length: its 256 positions)
        args=("--runner", "pooling", "--dtype", "float32", "--gpu-memory-utilization", "0.1"),
    )
    try:
        yield server.start()
    finally:
        server.stop()


def test_the_pooling_runner_gives_sentence_transformers_vectors_and_truncates_over_length_texts(
    pooling, sentence_transformer
):
    from tests.tiny_generators import reviews

    long_text = " ".join(reviews(200, seed=5))  # far past MiniLM's 256 tokens
    texts = reviews(30, seed=1) + ["Ünïcödé — 漢字 and emoji 🙂", "", long_text]
    limit = sentence_transformer.max_seq_length
    response = httpx2.post(
        f"{pooling.url}/embeddings", timeout=300, json={"model": NAME, "input": texts, "truncate_prompt_tokens": limit}
    )
    assert response.status_code == 200, response.text
    got = np.array([row["embedding"] for row in sorted(response.json()["data"], key=lambda r: r["index"])])
    expected = sentence_transformer.encode(texts, normalize_embeddings=True)
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    cosine = (got * expected).sum(axis=1)
    assert cosine.min() >= 0.9999, cosine
    refused = httpx2.post(f"{pooling.url}/embeddings", timeout=300, json={"model": NAME, "input": [long_text]})
    assert refused.status_code == 400  # what a client must not send as it is: it asks for truncation


def test_embed_endpoint_scores_through_vllms_embeddings(pooling, spark, tmp_path, texts, sentence_transformer):
    report, out = _embed_run(
        spark,
        tmp_path,
        texts,
        **{"embed.endpoint.url": pooling.url, "embed.endpoint.model": NAME, "embed.endpoint.price": {"input": PRICE}},
    )
    assert report.error_reasons == {"null_input": 1}
    _assert_sentence_transformers_vectors(out, texts, sentence_transformer)
    # the present texts (33, or the distinct ones where dedup scored each once), at most 8 a request; and the
    # preflight's
    present = [t for t in texts if t is not None]
    assert report.workers["requests"] - 1 in (math.ceil(len(present) / 8), math.ceil(len(set(present)) / 8))
    assert report.workers["retries"] == 0
    tokens = report.workers["tokens_in"]
    assert tokens > 256  # the long text counts as its 256 truncated tokens, the others as theirs
    assert report.cost["token_cost"] == pytest.approx(tokens * PRICE / 1e6, abs=1e-6)  # (the report rounds to 6 places)
