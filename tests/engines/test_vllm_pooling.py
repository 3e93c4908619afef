"""vLLM's pooling runner (``--runner pooling``) serving all-MiniLM-L6-v2 on ``/v1/embeddings``: the vectors the
in-process ``embed`` task is checked against (sentence-transformers' ``encode``), over-length texts truncated to the
model's limit by ``truncate_prompt_tokens`` (without it vLLM refuses them with a 400). What a remote ``embed`` head
(issue 58, item 4, not built yet) would stand on."""

from __future__ import annotations

import httpx2
import numpy as np
import pytest

from tests.engines.vllm_engine import VllmServer, needs_vllm

pytestmark = needs_vllm

NAME = "minilm"


@pytest.fixture(scope="module")
def pooling(minilm_dir, module_tmp_path):
    server = VllmServer(minilm_dir, module_tmp_path / "vllm.log", NAME,  # (MiniLM's own length: its 256 positions)
                        args=("--runner", "pooling", "--dtype", "float32", "--gpu-memory-utilization", "0.1"))
    try:
        yield server.start()
    finally:
        server.stop()


def test_the_pooling_runner_gives_sentence_transformers_vectors_and_truncates_over_length_texts(pooling, sentence_transformer):
    from tests.tiny_generators import reviews

    long_text = " ".join(reviews(200, seed=5))  # far past MiniLM's 256 tokens
    texts = reviews(30, seed=1) + ["Ünïcödé — 漢字 and emoji 🙂", "", long_text]
    limit = sentence_transformer.max_seq_length
    response = httpx2.post(f"{pooling.url}/embeddings", timeout=300,
                           json={"model": NAME, "input": texts, "truncate_prompt_tokens": limit})
    assert response.status_code == 200, response.text
    got = np.array([row["embedding"] for row in sorted(response.json()["data"], key=lambda r: r["index"])])
    expected = sentence_transformer.encode(texts, normalize_embeddings=True)
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    cosine = (got * expected).sum(axis=1)
    assert cosine.min() >= 0.9999, cosine
    refused = httpx2.post(f"{pooling.url}/embeddings", timeout=300, json={"model": NAME, "input": [long_text]})
    assert refused.status_code == 400  # what a client must not send as it is: it asks for truncation
