"""Issue 68: rows whose prompts share a prefix, grouped by the scoring stage (``scoring.group_prefixes``), against a
standalone vLLM server (CPU build) with prefix caching on, cached tokens in its answers' usage
(``--enable-prompt-tokens-details``) and a KV cache capped to a few prompts (``--num-gpu-blocks-override``), serving
the tier's seeded random Llama.

The input holds :data:`DOCS` documents with :data:`QUESTIONS` questions each, the document first in every prompt,
stored in a shuffled order. Scored grouped, the server's prefix cache hits (its ``/metrics`` counters, read before and
after the run, the cache reset between runs) cover most of each document's later questions; scored with grouping off,
the shuffled order reaches a document again only after the capped cache has dropped it. Both runs write the same texts,
and each run's report counts the cached tokens the server's counters do.
"""

from __future__ import annotations

import random
import re
import urllib.request

import pandas as pd
import pytest

from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from tests.engines.vllm_engine import SERVE_ARGS, VllmServer, needs_vllm

pytestmark = needs_vllm

NAME = "tiny-llama"
DOCS, QUESTIONS = 16, 4
BLOCK_SIZE, BLOCKS = 32, 32
"""1,024 tokens of KV cache: about six of the module's prompts (vLLM needs room for one of --max-model-len 512; its CPU
attention takes blocks of a multiple of 32 tokens)."""
TEMPLATE = "Document: {doc}\n\nQuestion: {question}\nAnswer:"


def _rows() -> pd.DataFrame:
    from tests.tiny_generators import reviews

    docs = [" ".join(reviews(12, seed=d)) for d in range(DOCS)]
    rows = [(d * QUESTIONS + q, docs[d], f"question {q}: is it good?") for d in range(DOCS) for q in range(QUESTIONS)]
    random.Random(68).shuffle(rows)
    return pd.DataFrame(rows, columns=["id", "doc", "question"])


@pytest.fixture(scope="module")
def vllm(vllm_llama_dir, module_tmp_path):
    caching = ("--enable-prefix-caching", "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(BLOCKS))
    server = VllmServer(
        vllm_llama_dir,
        module_tmp_path / "vllm.log",
        NAME,
        args=(*SERVE_ARGS, *caching, "--enable-prompt-tokens-details"),
        env={"VLLM_SERVER_DEV_MODE": "1"},  # /reset_prefix_cache, between runs
    )
    try:
        yield server.start()
    finally:
        server.stop()


def _counters(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30).read().decode()
    return {
        name: sum(float(v) for v in re.findall(rf"^vllm:{name}_total(?:{{[^}}]*}})? (\S+)$", text, re.M))
        for name in ("prefix_cache_queries", "prefix_cache_hits")
    }


def _hit_rate(spark, tmp_path, url: str, grouped: bool) -> tuple[float, pd.DataFrame]:
    """Score the module's rows (grouped or not) after a reset of the server's prefix cache: the share of the prompt
    tokens vLLM looked up that its cache held, and the output. The run's report counts the cached tokens the server's
    counters do (``usage.prompt_tokens_details.cached_tokens``, summed over every request, the preflight's too)."""
    reset = urllib.request.Request(url.removesuffix("/v1") + "/reset_prefix_cache", method="POST", data=b"")
    urllib.request.urlopen(reset, timeout=60).read()
    source, output = tmp_path / f"docs-{grouped}", tmp_path / f"answers-{grouped}"
    spark.createDataFrame(_rows(), "id long, doc string, question string").coalesce(1).write.format("delta").save(
        str(source)
    )
    before = _counters(url)
    cfg = load_config(
        flags={
            "input": str(source),
            "output": str(output),
            "task": "generate",
            "id_col": "id",
            "generate.prompt_template": TEMPLATE,
            "generate.max_new_tokens": 2,
            "generate.endpoint.url": url,
            "generate.endpoint.model": NAME,
            "generate.endpoint.concurrency": 2,
            "scoring.group_prefixes": grouped,
            "spark.master": "local[2]",
        }
    )
    report = run_scoring(cfg, spark)
    assert report.status == "succeeded", report.error
    after = _counters(url)
    queried = after["prefix_cache_queries"] - before["prefix_cache_queries"]
    assert report.workers["tokens_in_cached"] == after["prefix_cache_hits"] - before["prefix_cache_hits"] > 0
    out = spark.read.format("delta").load(str(output)).toPandas().sort_values("id").reset_index(drop=True)
    return (after["prefix_cache_hits"] - before["prefix_cache_hits"]) / queried, out


def test_grouped_rows_hit_the_engines_prefix_cache_that_the_tables_order_misses(spark, tmp_path, vllm):
    grouped, out = _hit_rate(spark, tmp_path, vllm.url, True)
    ungrouped, other = _hit_rate(spark, tmp_path, vllm.url, False)
    print(f"vLLM prefix cache hit rate: grouped {grouped:.1%}, ungrouped {ungrouped:.1%}")
    # grouped: every question of a document but its first reads the document from the cache
    assert grouped >= 0.5 and grouped >= 2 * ungrouped
    texts = [frame.set_index("id")["generated_text"].sort_index() for frame in (out, other)]
    assert len(out) == DOCS * QUESTIONS and texts[0].equals(texts[1])
