"""``generate.endpoint.batch`` (issue 67) on real Spark + Delta against the test suite's Batch API provider
(:mod:`tests.providers`), which executes each line on ``transformers serve`` running the tiny seeded Llama-shaped
model, started once for the module:

* ``batch.wait: false`` while the provider holds the batches: the run submits and stops pending, publishing nothing,
  recorded ``pending`` (not ``failed``); the same run then collects them, recorded ``succeeded``, submitting none
  again. Results shuffled, some lines answered 500 in the error file, some absent from both files, the first batch
  expired with half its lines done: every row published once with the text the per-row endpoint gives it
  (transformers' own greedy ``generate``), no line with a result executed twice, the provider's line counts equal to
  the report's, the tokens at half price, the prompt tokens the provider reported
  read from its cache counted apart and priced at ``price.cached_input``;
* a batch the provider fails for too many requests: split, its halves sent, every line run once;
* ``embed.endpoint.batch`` against a real sentence-transformers model behind the provider (``transformers serve`` has
  no embeddings route), error lines and lost lines among them: every row once with the per-row endpoint's vector;
* the run killed between a batch's create and its record (the submit task dies), then killed again while it polls,
  then run again: the provider holds each file's batch once, every line ran once, every row published;
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lakescore.jobs.commands.batches import format_batches, list_batches
from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_and_record, run_scoring
from lakescore.jobs.steps.metrics import read_attempts
from lakescore.jobs.steps.provider_batch import EXIT_PENDING, BatchesPending
from lakescore.jobs.testing_hooks import ENABLE_ENV, KILL_ENV
from tests.integration.test_generate_job import _reference_texts
from tests.integration.test_score_job import read_output
from tests.providers import EmbeddingModel, Faults, Pick, batch_provider
from tests.providers.batch_provider import CHEAP_MODEL, prompt_text
from tests.served_models import TransformersServe

TEMPLATE = "Review: {body}\nSummary:"
KEY_ENV = "LAKESCORE_TEST_BATCH_KEY"


@pytest.fixture(scope="module")
def served(tiny_causal_lm_dir, module_tmp_path):
    server = TransformersServe(tiny_causal_lm_dir, module_tmp_path / "serve.log").start()
    yield server
    server.kill()


@pytest.fixture
def provider_key(spark, monkeypatch):
    """The provider's key in the driver's environment (it polls) and the executors' (they upload and download)."""
    from tests.providers.batch_provider import BatchProvider

    key = BatchProvider.__init__.__kwdefaults__["key"]
    monkeypatch.setenv(KEY_ENV, key)
    environment = spark.sparkContext.environment
    environment[KEY_ENV] = key
    yield key
    environment.pop(KEY_ENV, None)


def _reviews(n: int) -> pd.DataFrame:
    rows = [(i, f"the food was good and room {i} was quiet") for i in range(1, n + 1)]
    rows[2] = (3, None)  # null_input, never sent
    return pd.DataFrame(rows, columns=["review_id", "body"])


def _write(spark, frame: pd.DataFrame, path: Path) -> None:
    spark.createDataFrame(frame, "review_id long, body string").write.format("delta").mode("overwrite").save(str(path))


def _flags(source: Path, output: Path, url: str, model_dir: Path, **batch) -> dict:
    return {
        "input": str(source),
        "output": str(output),
        "task": "generate",
        "id_col": "review_id",
        "generate.prompt_template": TEMPLATE,
        "generate.max_new_tokens": 6,
        "max_error_rate": 0.5,
        "spark.master": "local[2]",
        "generate.endpoint.url": url,
        "generate.endpoint.model": str(model_dir),
        "generate.endpoint.api_key_env": KEY_ENV,
        "generate.endpoint.price": {"input": 2.0, "output": 10.0, "cached_input": 0.5},
        "generate.endpoint.batch": {"max_requests_per_file": 4, "poll_interval_s": 0.2, **batch},
    }


def test_a_pending_then_collected_batch_run_publishes_every_row_once_with_the_per_row_text_at_half_price(
    spark,
    tmp_path,
    served,
    tiny_causal_lm_dir,
    provider_key,
):
    source, output = tmp_path / "reviews", tmp_path / "summaries"
    frame = _reviews(12)
    _write(spark, frame, source)
    # custom_ids digest the request, whose model is this run's tmp path, so the picks differ from run to run: half
    # the lines fail 500 once and most of the rest vanish once, so that both land among the lines that run (not
    # only in the expiring batch's unrun half) on all but a fraction of a percent of runs (0.2 missed one in ~7)
    faults = Faults(
        status={500: Pick(fraction=0.5, seed=1)},
        vanish=Pick(fraction=0.8, seed=2),
        expire_batches=1,
        cache_prefix_words=3,  # "Review: the food" begins every prompt: all but the first read it from cache
    )
    with batch_provider(served.url, faults=faults, batch_slots=2) as provider:
        held = [provider.slots.acquire() for _ in range(2)]  # every batch stays in_progress until released
        # OpenAI's prompt_cache_key asked for over completions, by the prompts' first 16 characters: "Review: the food"
        hinted = {"generate.endpoint.prompt_cache_key": True, "generate.endpoint.prompt_cache_key_chars": 16}
        pending_flags = _flags(source, output, provider.url, tiny_causal_lm_dir, wait=False)
        pending = load_config(flags={**pending_flags, **hinted})
        with pytest.raises(BatchesPending, match="still running; run the same command again"):
            run_and_record(pending, spark)
        submitted = set(provider.batches)
        assert submitted and not (output / "_delta_log").exists()  # submitted, nothing published
        paid_before = provider.cached_delivered  # the pending run's own preflight: the batches ran nothing yet
        for _ in held:
            provider.slots.release()
        # the same run, waiting: it polls what the first submitted and submits only the resubmissions
        flags = {**_flags(source, output, provider.url, tiny_causal_lm_dir), **hinted}
        report = run_and_record(load_config(flags=flags), spark)
        assert report.status == "succeeded", report.error
        # every line ran with the one key of its shared part (the cache rule reads from cache within a key only), and
        # the rerun rendered the same bodies: it found the first run's lines by custom_id (no line with a result ran
        # again, below)
        shared_key = hashlib.sha256(b"Review: the food").hexdigest()[:32]
        line_keys = [key for prompt, key in provider.cache_hints if prompt.startswith("Review: ")]
        assert line_keys and set(line_keys) == {shared_key}
        attempts = read_attempts(spark.read.format("delta").load(pending.metrics_ref()))
        assert [a["status"] for a in attempts] == ["pending", "succeeded"]
        assert "still running" in attempts[0]["error"]
        round0 = {b["id"] for b in report.provider_batch["batches"] if b["round"] == 0}
        assert round0 == submitted
        out = read_output(spark, str(output))
        present = frame[frame["body"].notna()]
        expected, prompt_tokens = _reference_texts(
            tiny_causal_lm_dir, [TEMPLATE.format(**r) for r in present.to_dict("records")], 6
        )
        published = out[out["generated_text"].notna()]
        assert published["review_id"].tolist() == present["review_id"].tolist()  # every row once
        assert published["generated_text"].tolist() == expected
        assert published["prompt_tokens"].tolist() == prompt_tokens
        assert report.error_reasons == {"null_input": 1}
        assert provider.executed_after_result == []  # no line with a result ran again
        assert set(provider.delivered) and len(provider.delivered) == len(present)
        batch = report.provider_batch
        counts = provider.request_counts()
        assert {b["id"] for b in batch["batches"]} == set(counts)
        assert batch["lines_submitted"] == sum(c["total"] for c in counts.values())
        probe_requests = (report.workers.get("preflight") or {}).get("requests", 0)
        assert report.workers["requests"] - probe_requests == batch["lines_submitted"]  # each row's lines, counted
        assert batch["lines_resubmitted"] == batch["lines_submitted"] - len(present) > 0
        assert any("expired" in reason for reason in batch["retry_reasons"])
        assert any("absent" in reason for reason in batch["retry_reasons"])
        assert any("500" in reason for reason in batch["retry_reasons"])
        workers = report.workers
        probe = workers.get("preflight") or {"tokens_in": 0, "tokens_out": 0, "tokens_in_cached": 0}
        assert workers["tokens_out"] - probe["tokens_out"] == published["completion_tokens"].sum()
        # every answer's cached prompt tokens, per row (the preflight) and in the batches' results, as the provider said
        assert workers["tokens_in_cached"] == provider.cached_delivered - paid_before > 0
        assert workers["tokens_in_cache_write"] == 0  # OpenAI reports no cache writes

        def priced(tokens):
            uncached = tokens["tokens_in"] - tokens["tokens_in_cached"]
            return (uncached * 2.0 + tokens["tokens_in_cached"] * 0.5 + tokens["tokens_out"] * 10.0) / 1e6

        per_row, probe_cost = priced(workers), priced(probe)
        assert report.cost["token_cost"] == pytest.approx(probe_cost + (per_row - probe_cost) / 2, abs=1e-6)
        assert batch["saving"] == pytest.approx(per_row - report.cost["token_cost"], abs=1e-6)
        assert "provider batch:" in report.summary()


def test_a_text_column_named_as_an_outcome_field_in_two_chunks_publishes_every_row_once(spark, tmp_path, provider_key):
    """The rows' own text column is ``body`` (an outcome field's name too), no template, two chunks (each staged
    alone): every row once with the cheap provider's echo, every file within ``max_requests_per_file``, and the files
    ranges of the prompts in order (``scoring.group_prefixes``: rows sharing a prefix sit together)."""
    source, output = tmp_path / "reviews", tmp_path / "echoes"
    frame = _reviews(10)
    _write(spark, frame, source)
    with batch_provider(cheap=True) as provider:
        flags = {
            "input": str(source),
            "output": str(output),
            "task": "generate",
            "id_col": "review_id",
            "text_col": "body",
            "generate.max_new_tokens": 3,
            "max_error_rate": 0.5,
            "spark.master": "local[2]",
            "write.chunk_rows": 5,
            "generate.endpoint.url": provider.url,
            "generate.endpoint.model": CHEAP_MODEL,
            "generate.endpoint.api_key_env": KEY_ENV,
            "generate.endpoint.batch": {"max_requests_per_file": 3, "poll_interval_s": 0.2},
        }
        report = run_scoring(load_config(flags=flags), spark)
        assert report.status == "succeeded", report.error
        counts = provider.request_counts()
        uploaded = [
            [prompt_text(json.loads(line)["body"]) for line in (provider.folder / f["id"]).read_text().splitlines()]
            for f in provider.files.values()
            if f["purpose"] == "batch"
        ]
    # the files are ranges of the prompts in order: each file's in order, and no two files' ranges overlap
    in_files = [prompt for prompts in sorted(uploaded) for prompt in prompts]
    assert len(uploaded) == len(counts) > 1 and in_files == sorted(in_files)
    assert report.chunks["total"] == 2
    out = read_output(spark, str(output)).sort_values("review_id")
    present = frame[frame["body"].notna()].sort_values("review_id")
    assert out["review_id"].tolist() == present["review_id"].tolist()  # every row once, the null one dead-lettered
    assert report.error_reasons == {"null_input": 1}
    assert out["generated_text"].tolist() == [" ".join(b.split()[:3]) for b in present["body"]]
    assert sum(c["total"] for c in counts.values()) == 9 and max(c["total"] for c in counts.values()) <= 3


def test_a_batch_the_provider_fails_for_too_many_requests_is_split_in_halves_that_pass(
    spark, tmp_path, served, tiny_causal_lm_dir, provider_key
):
    source, output = tmp_path / "reviews", tmp_path / "summaries"
    _write(spark, _reviews(6), source)
    # the run cuts one file of the 5 lines (6 a file, a prefix group's 20% to spare); the provider takes 3 (OpenAI's
    # error shape: the batch fails, too_many_requests)
    with batch_provider(served.url, faults=Faults(shuffle=False), max_requests_per_file=3) as provider:
        cfg = load_config(flags=_flags(source, output, provider.url, tiny_causal_lm_dir, max_requests_per_file=6))
        report = run_scoring(cfg, spark)
        assert report.status == "succeeded", report.error
        batches = report.provider_batch["batches"]
        assert [b["lines"] for b in batches if b["status"] == "failed"] == [5]
        assert sorted(b["lines"] for b in batches if b["status"] == "completed") == [2, 3]  # its halves
        assert sorted(provider.executions.values()) == [1] * 5  # every line ran once, none in a failed batch
        assert report.provider_batch["lines_submitted"] == 5 and report.provider_batch["lines_resubmitted"] == 0
        out = read_output(spark, str(output))
        assert out["generated_text"].notna().sum() == 5 and report.error_reasons == {"null_input": 1}


def test_an_embed_batch_run_gives_every_row_once_the_per_row_endpoints_vector_at_half_price(
    spark, tmp_path, sentence_transformer, provider_key
):
    import json
    import urllib.request

    import numpy as np

    from lakescore.udfs.remote.embeddings import SERVER_LIMIT, embeddings_body

    source, output = tmp_path / "reviews", tmp_path / "embeddings"
    frame = _reviews(8)
    _write(spark, frame, source)
    faults = Faults(status={500: Pick(fraction=0.3, seed=3)}, vanish=Pick(fraction=0.3, seed=4))
    with batch_provider(EmbeddingModel(sentence_transformer), faults=faults) as provider:
        flags = {
            "input": str(source),
            "output": str(output),
            "task": "embed",
            "id_col": "review_id",
            "text_col": "body",
            "max_error_rate": 0.5,
            "spark.master": "local[2]",
            "embed.endpoint.url": provider.url,
            "embed.endpoint.model": "minilm",
            "embed.endpoint.api_key_env": KEY_ENV,
            "embed.endpoint.price": {"input": 2.0},
            "embed.endpoint.batch": {"max_requests_per_file": 3, "poll_interval_s": 0.2},
        }
        report = run_scoring(load_config(flags=flags), spark)
        assert report.status == "succeeded", report.error
        present = frame[frame["body"].notna()]
        # the per-row path's request (embed.endpoint without batch) for the same texts, to the same server
        request = urllib.request.Request(
            provider.url + "/embeddings",
            data=json.dumps(embeddings_body("minilm", present["body"].tolist(), SERVER_LIMIT)).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {provider_key}"},
        )
        with urllib.request.urlopen(request) as answer:
            per_row = np.array([row["embedding"] for row in json.loads(answer.read())["data"]])
        assert provider.executed_after_result == [] and len(provider.delivered) == len(present)
    out = read_output(spark, str(output)).sort_values("review_id")
    published = out[out["embedding"].notna()]
    assert published["review_id"].tolist() == present["review_id"].tolist()  # every row once
    vectors = np.stack(published["embedding"].to_numpy())
    np.testing.assert_allclose(vectors, per_row, atol=1e-5)
    np.testing.assert_allclose(vectors, sentence_transformer.encode(present["body"].tolist()), atol=1e-5)
    assert report.error_reasons == {"null_input": 1}
    batch = report.provider_batch
    assert batch["lines_resubmitted"] == batch["lines_submitted"] - len(present) > 0
    assert any("500" in reason for reason in batch["retry_reasons"])
    assert any("absent" in reason for reason in batch["retry_reasons"])
    probe = report.workers.get("preflight") or {"tokens_in": 0}
    tokens = report.workers["tokens_in"] - probe["tokens_in"]
    assert tokens > 0 and report.workers["tokens_out"] == 0
    assert report.cost["token_cost"] == pytest.approx((probe["tokens_in"] + tokens / 2) * 2.0 / 1e6, abs=1e-9)


def _score(flags: dict, env: dict) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "lakescore.jobs.cli", "score"]
    for key, value in flags.items():
        import json

        args += ["--set", f"{key}={json.dumps(value) if isinstance(value, dict) else value}"]
    return subprocess.run(args, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def test_a_killed_run_resumes_without_submitting_a_batch_twice(
    spark, tmp_path, served, tiny_causal_lm_dir, provider_key
):
    source, output = tmp_path / "reviews", tmp_path / "summaries"
    frame = _reviews(10)
    _write(spark, frame, source)
    with batch_provider(served.url, faults=Faults(), min_seconds=2) as provider:
        flags = _flags(source, output, provider.url, tiny_causal_lm_dir)
        cfg = load_config(flags=flags)
        # the submit task dies right after its first batch is created, before anything recorded it
        environment = spark.sparkContext.environment
        environment[KILL_ENV] = "batch_created"
        try:
            with pytest.raises(Exception):  # noqa: B017 (a dead task arrives as whatever Spark wraps it in)
                run_scoring(cfg, spark)
        finally:
            environment.pop(KILL_ENV, None)
        assert len(provider.batches) >= 1
        # the driver killed while it polls
        died = _score(flags, {KEY_ENV: provider_key, ENABLE_ENV: "1", KILL_ENV: "batch_polling"})
        assert died.returncode == -9, died.stderr[-2000:]
        held = set(provider.batches)
        report = run_scoring(cfg, spark)
        assert report.status == "succeeded", report.error
        assert set(provider.batches) == held  # the rerun polled what the provider held: nothing submitted again
        assert max(provider.submissions.values()) == 1 and len(provider.submissions) == 9
        assert max(provider.executions.values()) == 1
        assert len(report.provider_batch["batches"]) == len(held)
        out = read_output(spark, str(output))
        assert out["generated_text"].notna().sum() == 9 and report.error_reasons == {"null_input": 1}
        listed = list_batches(spark, cfg)  # lakescore batches: the ledger's batches, every one ended
        assert {row.batch_id for row in listed} == held and all(row.status == "completed" for row in listed)
        assert all(batch_id in format_batches(listed) for batch_id in held)


def test_pending_exit_code() -> None:
    from lakescore.jobs.cli import _failure
    from lakescore.jobs.steps.report import stopped_status

    pending = BatchesPending("2 provider batch(es) (7 lines) still running")
    assert _failure(pending)[0] == EXIT_PENDING == 75
    assert stopped_status(pending) == "pending" and stopped_status(RuntimeError("no")) == "failed"
