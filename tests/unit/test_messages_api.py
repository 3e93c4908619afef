"""``generate.endpoint.api: messages``: Anthropic's Messages API as lakescore sends and reads it
(udfs/remote/messages.py), the settings it cannot carry refused before compute, and the head through the test suite's
provider (tests/providers, cheap mode: answers computed in-process) with its key in ``x-api-key``, 429s retried, stop
reasons and cached tokens; and Anthropic's Message Batches wire format (udfs/remote/message_batches.py) against the
same provider."""

from __future__ import annotations

import json

import pytest

from lakescore.udfs.options.generate import GenerateOptions
from lakescore.udfs.remote.answers import EndpointError, Malformed, Unfinished
from lakescore.udfs.remote.client import scrub
from lakescore.udfs.remote.messages import auth_headers, parse_message, request_body
from tests.providers import Faults, batch_provider

PNG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def test_every_generate_setting_the_api_has_becomes_its_request_field():
    options = GenerateOptions(
        max_new_tokens=9,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        seed=3,
        stop=("\n\n",),
        system_prompt="Be brief.",
        json_schema='{"type": "object"}',
    )
    assert request_body(options, "claude-x", "Hi", image=PNG) == {
        "model": "claude-x",
        "max_tokens": 9,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "system": "Be brief.",
        "stop_sequences": ["\n\n"],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                    {"type": "text", "text": "Hi"},
                ],
            }
        ],
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
    }
    assert request_body(GenerateOptions(max_new_tokens=4), "m", "Hi") == {
        "model": "m",
        "max_tokens": 4,
        "temperature": 0.0,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    assert auth_headers("k") == {"anthropic-version": "2023-06-01", "x-api-key": "k"}
    assert "Authorization" not in auth_headers("k") and auth_headers(None) == {"anthropic-version": "2023-06-01"}


def _message(reason="end_turn", text="ok", usage=None):
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "stop_reason": reason,
        "usage": usage or {"input_tokens": 5, "output_tokens": 2},
    }


def test_stop_reasons_map_and_every_prompt_token_is_counted_cached_or_not():
    assert parse_message(_message("end_turn")).finish_reason == "stop"
    assert parse_message(_message("stop_sequence")).finish_reason == "stop"
    assert parse_message(_message("max_tokens")).finish_reason == "length"
    with pytest.raises(Unfinished, match="refusal"):
        parse_message(_message("refusal"))
    cached = parse_message(
        _message(
            usage={
                "input_tokens": 3,
                "output_tokens": 2,
                "cache_read_input_tokens": 40,
                "cache_creation_input_tokens": 7,
            }
        )
    )
    assert (cached.prompt_tokens, cached.completion_tokens) == (50, 2)
    assert (cached.cached_tokens, cached.cache_write_tokens) == (40, 7)  # read from the cache, written to it
    assert (parse_message(_message()).cached_tokens, parse_message(_message()).cache_write_tokens) == (0, 0)
    assert parse_message({**_message(), "usage": None}).tokens is None  # unknown, not 0
    assert parse_message(_message(text="a\n\nb"), stop=("\n\n",)).text == "a"
    with pytest.raises(Malformed, match="no content"):
        parse_message({"type": "error", "error": {"type": "api_error", "message": "x"}})
    with pytest.raises(Malformed, match="no stop_reason"):
        parse_message({**_message(), "stop_reason": None})
    with pytest.raises(Malformed, match="3 output tokens, 2 allowed"):
        parse_message(_message(usage={"input_tokens": 1, "output_tokens": 3}), max_tokens=2)


def test_the_settings_the_messages_api_cannot_carry_are_refused_in_one_line_before_compute():
    from lakescore.jobs.config import ConfigError, load_config

    base = {
        "task": "generate",
        "input": "in",
        "output": "out",
        "id_col": "id",
        "text_col": "body",
        "generate.endpoint.url": "https://api.anthropic.com/v1",
        "generate.endpoint.model": "claude-x",
        "generate.endpoint.api": "messages",
    }
    load_config(flags=base).require_for_scoring()
    for setting, value, message in (
        ("generate.logprobs", True, "generate.logprobs: Anthropic's Messages API returns no log-probabilities"),
        ("generate.repetition_penalty", 1.2, "generate.repetition_penalty: Anthropic's Messages API has no such"),
        ("generate.temperature", 1.5, "generate.temperature 1.5: Anthropic's Messages API takes 0 to 1"),
        ("generate.chat_template", "never", "generate.chat_template: never needs the completions API"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(flags={**base, setting: value})
    with pytest.raises(ConfigError, match="generate.server.api"):
        load_config(
            flags={k: v for k, v in base.items() if not k.startswith("generate.endpoint")}
            | {"generate.server.engine": "vllm", "generate.server.api": "messages", "model.source": "m"}
        )


def test_the_head_speaks_messages_with_its_key_in_x_api_key_and_retries_a_429():
    from lakescore.udfs.options.remote import EndpointOptions
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.remote.generate import EndpointGenerator
    from lakescore.udfs.remote.head import open_client

    options = GenerateOptions(max_new_tokens=3)
    with batch_provider(
        cheap=True, key="sk-ant-test-0123", faults=Faults(refuse_every=2, retry_after_s=0, cached_prompt_tokens=2)
    ) as provider:
        settings = EndpointOptions(
            url=provider.url, model="claude-x", api="messages", api_key_env="ANT_TEST_KEY", concurrency=1
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ANT_TEST_KEY", provider.key)
            client, _ = open_client(settings, None, None)
        head = EndpointGenerator(client, options, get_task("generate").output_arrow_types)
        scored = head.score_prompts(["one two three four", "hi", None], None)
        assert scored.reasons == [None, None, "null_input"]
        first, second = scored.outputs[0], scored.outputs[1]
        assert (first.text, first.finish_reason, second.text, second.finish_reason) == (
            "one two three",
            "length",
            "hi",
            "stop",
        )
        assert (first.prompt_tokens, first.completion_tokens) == (5, 3)  # the 2 read from cache count among them
        counts = head.traffic().as_dict()
        assert counts["rate_limited"] >= 1 and counts["retries"] >= counts["rate_limited"]
        assert counts["tokens_in"] == 5 + 2 and counts["tokens_out"] == 4
        assert provider.key_headers["x-api-key"] >= 3 and provider.key_headers["authorization"] == 0
        provider.key = "another"
        with pytest.raises(EndpointError) as refused:
            client.post(request_body(options, "claude-x", "x"), path="/messages")
        assert refused.value.status == 401 and "sk-ant-test-0123" not in str(refused.value)
        head.close()
    assert scrub('{"x-api-key": "sk-ant-abc"} x-api-key: sk-ant-def') == '{"x-api-key": "***"} x-api-key: ***'


def test_a_message_batch_goes_out_and_each_result_line_is_a_result_a_retry_or_dead():
    """The Message Batches wire format (udfs/remote/message_batches.py) through lakescore's client against the
    provider: submitted as the per-row path's params, polled until ended, every line classified from its results."""
    import time

    import httpx2

    from lakescore.udfs.options.remote import EndpointOptions
    from lakescore.udfs.remote import message_batches as mb
    from lakescore.udfs.remote.client import EndpointClient
    from lakescore.udfs.remote.messages import auth_headers
    from tests.providers import Pick

    options = GenerateOptions(max_new_tokens=2)
    ids = [f"ls-{i}" for i in range(6)]
    faults = Faults(status={500: Pick({"ls-1"}), 400: Pick({"ls-2"})}, expired=Pick({"ls-3"}), vanish=Pick({"ls-4"}))
    with batch_provider(cheap=True, faults=faults) as provider:
        settings = EndpointOptions(url=provider.url, model="claude-x", api="messages")
        client = EndpointClient(settings, provider.url, "claude-x", api_key=provider.key, auth=auth_headers)
        body = mb.batch_body((line_id, request_body(options, "claude-x", f"{line_id} says hi")) for line_id in ids)
        created = client.post(body, path=mb.BATCHES_PATH).body
        assert not mb.ended(created) and created["request_counts"]["processing"] == 6
        deadline = time.monotonic() + 30
        while not mb.ended(batch := client.get(f"{mb.BATCHES_PATH}/{created['id']}").body):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with httpx2.Client(headers=auth_headers(provider.key)) as http:
            results = mb.parse_results(http.get(batch["results_url"]).text)
        client.close()
    outcomes = {line_id: mb.classify(results[line_id]) if line_id in results else mb.absent() for line_id in ids}
    assert {line_id: outcome.kind for line_id, outcome in outcomes.items()} == {
        "ls-0": "result",
        "ls-1": "retry",
        "ls-2": "dead",
        "ls-3": "retry",
        "ls-4": "retry",
        "ls-5": "result",
    }
    assert outcomes["ls-2"].message == "invalid_request_error: injected 400"
    assert parse_message(json.loads(outcomes["ls-5"].body)).text == "ls-5 says"
    with pytest.raises(ValueError, match="line 1 has no custom_id"):
        mb.parse_results('{"result": {"type": "expired"}}\n')


def test_the_message_batches_kind_submits_polls_and_reads_results_as_the_per_row_path_reads_answers():
    """The provider kind ``generate.endpoint.batch`` takes for ``api: messages``: lines posted as one Message Batch
    with the key as ``x-api-key``, polled to ``ended``, each result line a result, a retry or dead, and a result's
    Message read as the per-row path reads one (text, stop reason, cached prompt tokens apart)."""
    import io
    import time

    from lakescore.udfs.batch_udfs import find_again
    from lakescore.udfs.remote.batch_intents import Found, Intent
    from lakescore.udfs.remote.batch_kinds import MessageBatches, batch_kind
    from tests.providers import Pick

    kind = batch_kind("https://api.anthropic.com/v1", "messages")
    assert isinstance(kind, MessageBatches)
    options = GenerateOptions(max_new_tokens=2)
    faults = Faults(status={400: Pick({"ls-b"})}, cache_prefix_words=2)
    with batch_provider(cheap=True, faults=faults) as provider:
        client = kind.client(provider.url, provider.key)
        ids = ["ls-a", "ls-b", "ls-c"]
        lines = [kind.line(i, request_body(options, "claude-x", f"same start {i}")) for i in ids]
        batch_id, file_id = kind.submit(client, "part", lines, io.BytesIO(), {"lakescore_run": "r"})
        assert file_id is None and kind.held(client, {"lakescore_run": "r"}) == []  # no metadata to find it by
        deadline = time.monotonic() + 30
        while not (polled := kind.poll(client, batch_id)).terminal:
            assert polled.status == "in_progress" and time.monotonic() < deadline
            time.sleep(0.05)
        outcomes = dict(kind.outcomes(client, polled.output, polled.error))
        # found again by the provider's list (GET /v1/messages/batches, newest first): an intent recorded before the
        # create matches it by time, request count and, the batch having ended, its results' custom_ids
        listed = kind.listed(client, time.time() - 60)
        assert [(b.batch_id, b.lines, b.ended) for b in listed] == [(batch_id, 3, True)]
        assert sorted(kind.result_ids(client, polled.output or "")) == ids
        intent = Intent("part", 3, ("ls-a",), time.time() - 30)
        assert find_again(client, kind, [intent], frozenset()).adopted == {"part": batch_id}
        other = Intent("other", 3, ("ls-z",), time.time() - 30)  # the same size, but its lines are not in the results
        assert find_again(client, kind, [other], frozenset()) == Found()
        assert find_again(client, kind, [intent], frozenset({batch_id})) == Found()  # recorded already
        client.close()
        assert provider.key_headers["authorization"] == 0 and provider.key_headers["x-api-key"] >= 3
    assert (polled.status, polled.total, polled.completed, polled.failed) == ("ended", 3, 2, 1)
    assert {i: o.kind for i, o in outcomes.items()} == {"ls-a": "result", "ls-b": "dead", "ls-c": "result"}
    assert outcomes["ls-b"].message == "invalid_request_error: injected 400"
    assert kind.absent("ended").kind == "retry"
    first, again = (kind.parse(json.loads(outcomes[i].body), options) for i in ("ls-a", "ls-c"))
    assert (again.text, again.finish_reason, again.prompt_tokens) == ("same start", "length", 4)
    assert (first.cached_tokens, again.cached_tokens) == (0, 2)  # "same start" read from the cache the second time
