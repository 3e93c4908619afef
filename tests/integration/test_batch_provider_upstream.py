"""The test suite's Batch API provider in front of a real model server (``transformers serve`` over a tiny seeded
decoder with a chat template, started once; greedy, so the same body gives the same text): a batch's answers, through
OpenAI's Batches and Anthropic's Message Batches, are the ones the upstream gives each body per row; and a lakescore
run with ``generate.endpoint.api: messages`` through the provider's ``/v1/messages`` equals a chat endpoint run on
the upstream itself (real Spark + Delta)."""

from __future__ import annotations

import io
import json
import time

import anthropic
import openai
import pytest

from lakescore.jobs.report.html import render_html
from lakescore.jobs.score_job import run_scoring
from lakescore.jobs.testing_hooks import KILL_ENV
from tests.integration.test_endpoint_job import KEY, KEY_ENV, TEMPLATE, _config, _reviews, _write
from tests.integration.test_score_job import read_output
from tests.providers import Faults, Pick, batch_provider
from tests.served_models import transformers_serve
from tests.tiny_generators import CHAT_TEMPLATE, reviews, save_causal, train_tokenizer

SPLIT_TEMPLATE = {"generate.prefix_template": "Review: ", "generate.prompt_template": "{body}\nSummary:"}
"""``TEMPLATE`` with its shared part declared apart: the same prompts, sent with Anthropic's cache hint."""


@pytest.fixture(scope="module")
def served_chat(module_tmp_path):
    tokenizer = train_tokenizer("bos")
    tokenizer.chat_template = CHAT_TEMPLATE
    model_dir = save_causal(module_tmp_path / "tiny-chat-lm", tokenizer)
    with transformers_serve(model_dir, module_tmp_path / "serve.log") as server:
        yield server, str(model_dir)


def test_batch_answers_through_the_upstream_equal_its_per_row_chat_completions(served_chat):
    server, model = served_chat
    texts = reviews(4, seed=5)
    bodies = {
        f"row-{i}": {
            "model": model,
            "max_tokens": 6,
            "temperature": 0.0,
            "messages": [{"role": "user", "content": text}],
        }
        for i, text in enumerate(texts)
    }
    direct = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    per_row = {
        custom_id: direct.chat.completions.create(**body).choices[0].message.content
        for custom_id, body in bodies.items()
    }
    # transformers serve takes OpenAI's prompt_cache_key on chat, the text unchanged, and refuses it on completions
    hinted = direct.chat.completions.create(**bodies["row-0"], prompt_cache_key="group-1")
    assert hinted.choices[0].message.content == per_row["row-0"]
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        direct.completions.create(model=model, prompt="x", max_tokens=1, extra_body={"prompt_cache_key": "group-1"})
    assert "Unexpected fields in the request: {'prompt_cache_key'}" in refused.value.response.text
    with batch_provider(server.url) as provider:
        client = openai.OpenAI(base_url=provider.url, api_key=provider.key, max_retries=0)
        lines = "".join(
            json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n"
            for custom_id, body in bodies.items()
        )
        uploaded = client.files.create(file=("rows.jsonl", io.BytesIO(lines.encode())), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        messages = anthropic.Anthropic(base_url=provider.root, api_key=provider.key, max_retries=0)
        # Anthropic's Messages params (anthropic 2.x) have no temperature: the upstream's default, greedy, answers.
        requests = [
            {"custom_id": custom_id, "params": {key: body[key] for key in ("model", "max_tokens", "messages")}}
            for custom_id, body in bodies.items()
        ]
        message_batch = messages.messages.batches.create(requests=requests)
        deadline = time.monotonic() + 120
        while (batch := client.batches.retrieve(batch.id)).status != "completed":
            assert batch.status in ("validating", "in_progress", "finalizing") and time.monotonic() < deadline, batch
            time.sleep(0.1)
        output = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
        batched = {line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"] for line in output}
        assert batched == per_row and any(per_row.values())
        provider.wait(message_batch.id)
        results = {
            item.custom_id: item.result.message.content[0].text
            for item in messages.messages.batches.results(message_batch.id)
        }
        assert results == per_row
        row = messages.messages.create(**requests[0]["params"])  # per row through the provider's /v1/messages
        assert row.content[0].text == per_row["row-0"] and row.usage.input_tokens > 0
        assert provider.executions == dict.fromkeys(bodies, 2)  # once per batch kind


@pytest.fixture
def executor_key(spark):
    """The key in the executors' environment, as ``spark.executorEnv.<NAME>`` puts it there (as test_endpoint_job's)."""
    environment = spark.sparkContext.environment
    environment[KEY_ENV] = KEY
    yield
    environment.pop(KEY_ENV, None)


def test_a_messages_endpoint_run_gives_the_chat_endpoints_texts_and_tokens(spark, tmp_path, served_chat, executor_key):
    """``generate.endpoint.api: messages`` through the provider's ``/v1/messages`` (each request run on the upstream as
    a chat completion): texts, stop reasons and prompt tokens equal the upstream's own chat completions for the same
    rows' prompts; the key goes as ``x-api-key``, a 429 is retried, and the prompt tokens the provider reports read
    from cache count among the prompt's. The prompt's shared part, declared as ``prefix_template``, goes as a
    ``cache_control`` block: each row's request marks it, the texts are the hint-less chat's."""
    server, model = served_chat
    source, frame = tmp_path / "reviews", _reviews(4)
    _write(spark, frame, source)
    faults = Faults(refuse_every=3, retry_after_s=0, cached_prompt_tokens=2)
    with batch_provider(server.url, key=KEY, faults=faults) as provider:
        report = run_scoring(
            _config(
                source,
                tmp_path / "messages",
                **{
                    "generate.endpoint.url": provider.url,
                    "generate.endpoint.model": model,
                    "generate.system_prompt": "Sum up.",
                    "generate.endpoint.api": "messages",
                    "generate.endpoint.api_key_env": KEY_ENV,
                    "generate.endpoint.price": {"input": 3.0, "output": 15.0},
                    **SPLIT_TEMPLATE,
                },
            ),
            spark,
        )
        assert report.status == "succeeded", report.error
        assert provider.key_headers["x-api-key"] >= 4 and provider.key_headers["authorization"] == 0
        hints = dict(provider.cache_hints)  # the preflight's prompt is no template's: sent whole
        rows = [f"Sum up. {TEMPLATE.format(body=body)}" for body in frame["body"].dropna()]
        assert [hints[row] for row in rows] == ["Review: "] * 3 and hints["Sum up. lakescore preflight"] is None
    got = read_output(spark, str(tmp_path / "messages")).dropna(subset=["generated_text"])
    direct = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    expected = []
    for body in frame["body"].dropna():
        messages = [{"role": "system", "content": "Sum up."}, {"role": "user", "content": TEMPLATE.format(body=body)}]
        answer = direct.chat.completions.create(model=model, max_tokens=6, temperature=0.0, messages=messages)
        expected.append(
            (
                answer.choices[0].message.content,
                answer.choices[0].finish_reason,
                answer.usage.prompt_tokens,
                answer.usage.completion_tokens,
            )
        )
    columns = ["generated_text", "finish_reason", "prompt_tokens", "completion_tokens"]
    assert list(got[columns].itertuples(index=False, name=None)) == expected and len(expected) == 3
    workers = report.workers
    assert workers["rate_limited"] >= 1
    assert workers["tokens_in"] == got["prompt_tokens"].sum() + workers["preflight"]["tokens_in"]
    assert workers["tokens_in_cached"] == provider.cached_delivered > 0  # Anthropic's cache_read_input_tokens
    # Anthropic's cache_creation_input_tokens: the first row's marked part, written once
    written = workers["tokens_in_cache_write"]
    assert written == provider.written_delivered > 0
    plain = workers["tokens_in"] - workers["tokens_in_cached"] - written  # each prompt token priced once
    expected_cost = (plain * 3 + workers["tokens_in_cached"] * 3 + written * 3.75 + workers["tokens_out"] * 15) / 1e6
    # a write at 1.25 x input by default (the report rounds to 6 decimals; the write's extra is 3 x 0.75 of that)
    assert report.cost["token_cost"] == pytest.approx(expected_cost, abs=6e-7)
    assert f"; {written} written to the provider's prompt cache)" in report.summary()
    html_row = f"<th>of them written to the provider&#x27;s prompt cache (priced apart)</th><td>{written:,}</td>"
    assert html_row in render_html(report.as_dict())
    assert KEY not in got.to_json()


def test_a_messages_batch_run_resubmits_what_anthropic_ended_unanswered_and_gives_the_per_row_texts(
    spark, tmp_path, served_chat, executor_key, monkeypatch
):
    """``generate.endpoint.api: messages`` with ``batch``: the rows go out as Anthropic Message Batches (the key as
    ``x-api-key``); the first run dies right after its batch is created, before the ledger records it (a Message Batch
    keeps no metadata: the rerun finds it again by the intent recorded before the create, in the provider's list);
    one line ``errored`` with ``overloaded_error`` (retryable) and one absent from the results are sent again and
    answered: one batch per file, each row published once with the per-row path's text, no line with a result run
    again, the provider's counts and cached prompt tokens equal to the report's."""
    from lakescore.udfs.remote.batch_files import canonical, custom_id
    from lakescore.udfs.remote.batch_kinds import MessageBatches
    from lakescore.udfs.remote.generate import row_body

    server, model = served_chat
    source, frame = tmp_path / "reviews", _reviews(4)
    _write(spark, frame, source)
    monkeypatch.setenv(KEY_ENV, KEY)  # the driver polls
    with batch_provider(server.url, key=KEY, faults=Faults(cache_prefix_words=3)) as provider:
        cfg = _config(
            source,
            tmp_path / "batched",
            **{
                "generate.endpoint.url": provider.url,
                "generate.endpoint.model": model,
                "generate.system_prompt": "Sum up.",
                "generate.endpoint.api": "messages",
                "generate.endpoint.api_key_env": KEY_ENV,
                "generate.endpoint.price": {"input": 3.0, "output": 15.0, "cached_input": 0.3},
                "generate.endpoint.batch": {"poll_interval_s": 0.2},
                **SPLIT_TEMPLATE,
            },
        )

        def line_id(review_id: int) -> str:  # the row's custom_id, as the run renders it
            prompt = TEMPLATE.format(body=frame.set_index("review_id").loc[review_id, "body"])
            params = row_body(cfg.generate, model, MessageBatches(), prompt, str(review_id))
            return custom_id(str(review_id), canonical(params))

        provider.faults.status = {529: Pick({line_id(1)})}  # each hits the line's first submission only
        provider.faults.vanish = Pick({line_id(2)})
        environment = spark.sparkContext.environment
        environment[KILL_ENV] = "batch_created"  # the submit task dies right after the create, nothing recorded
        try:
            with pytest.raises(Exception):  # noqa: B017 (a dead task arrives as whatever Spark wraps it in)
                run_scoring(cfg, spark)
        finally:
            environment.pop(KILL_ENV, None)
        assert len(provider.batches) == 1
        (created,) = provider.batches.values()
        provider.wait(created.id)
        # the killed run's per-row preflight answers were paid, and no report counts them
        unreported = provider.cached_delivered - created.usage["cached"]
        report = run_scoring(cfg, spark)
        assert report.status == "succeeded", report.error
        assert len(provider.batches) == 2  # the first found again, not created twice; the resubmission's
        assert provider.key_headers["authorization"] == 0 and provider.key_headers["none"] == 0
        assert provider.executed_after_result == [] and len(provider.delivered) == 3
        assert provider.submissions == {line_id(1): 2, line_id(2): 2, line_id(4): 1}
        counts = provider.request_counts()
        cached, written = provider.cached_delivered, provider.written_delivered
        hints = list(provider.cache_hints)
        run_upstream = sum(provider.executions.values())
    assert sum(hint is not None for _, hint in hints) == run_upstream == 4  # every line run, resubmissions too
    batch = report.provider_batch
    assert {b["id"] for b in batch["batches"]} == set(counts) and all(b["status"] == "ended" for b in batch["batches"])
    assert batch["lines_submitted"] == sum(sum(c.values()) for c in counts.values()) == 5
    assert batch["lines_resubmitted"] == 2
    assert any("overloaded_error" in reason for reason in batch["retry_reasons"])
    assert any("absent" in reason for reason in batch["retry_reasons"])
    got = read_output(spark, str(tmp_path / "batched")).dropna(subset=["generated_text"])
    direct = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    expected = []
    for body in frame["body"].dropna():
        messages = [{"role": "system", "content": "Sum up."}, {"role": "user", "content": TEMPLATE.format(body=body)}]
        answer = direct.chat.completions.create(model=model, max_tokens=6, temperature=0.0, messages=messages)
        expected.append((answer.choices[0].message.content, answer.usage.prompt_tokens))
    assert list(got[["generated_text", "prompt_tokens"]].itertuples(index=False, name=None)) == expected
    assert report.error_reasons == {"null_input": 1}
    # what Anthropic's cache_read_input_tokens said
    assert report.workers["tokens_in_cached"] == cached - unreported > 0
    # and its cache_creation_input_tokens: each delivered line read its marked part or wrote it (which line wrote first
    # is the provider's race; a line that vanished may have been the one), never both
    workers, marked = report.workers, len("Sum up. Review: ".split())
    probe = workers.get("preflight") or {}
    assert workers["tokens_in_cache_write"] == written
    assert workers["tokens_in_cached"] - probe.get("tokens_in_cached", 0) + written == 3 * marked

    def priced(tokens):  # each prompt token once, at its kind's price: plain, read, written (1.25 x input)
        read, write, out = (tokens.get(k, 0) for k in ("tokens_in_cached", "tokens_in_cache_write", "tokens_out"))
        return ((tokens.get("tokens_in", 0) - read - write) * 3.0 + read * 0.3 + write * 3.75 + out * 15.0) / 1e6

    per_row, probe_cost = priced(workers), priced(probe)  # the batch's half price stacks on the write's
    assert report.cost["token_cost"] == pytest.approx(probe_cost + (per_row - probe_cost) / 2, abs=6e-7)
    assert {hint for _, hint in hints if hint is not None} == {"Review: "}  # each line marks its shared part
