"""The test suite's Batch API provider (tests/providers) follows OpenAI's Files + Batches and Anthropic's Messages and
Message Batches contracts as the official ``openai`` and ``anthropic`` clients see them, and injects the faults it
promises. Cheap mode throughout (answers computed in-process): no model server starts here."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import anthropic
import openai
import pytest

from tests.providers import Faults, Pick, batch_provider

MODEL = "cheap-echo"


def _lines(ids, endpoint="/v1/chat/completions", model=MODEL, max_tokens=4) -> bytes:
    out = []
    for custom_id in ids:
        body = {
            "model": model,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"{custom_id} says hello to the batch world"}],
        }
        out.append(json.dumps({"custom_id": custom_id, "method": "POST", "url": endpoint, "body": body}))
    return ("\n".join(out) + "\n").encode()


def _client(provider) -> openai.OpenAI:
    return openai.OpenAI(base_url=provider.url, api_key=provider.key, max_retries=0)


def _submit(client, data: bytes, **extra):
    uploaded = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", **extra
    )


def _wait(client, batch_id: str, timeout: float = 30.0, seen: set | None = None):
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        if seen is not None:
            seen.add(batch.status)
        time.sleep(0.05)
    return batch


def _jsonl(client, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_an_openai_batch_goes_through_files_and_batches_and_comes_back_shuffled_by_custom_id():
    ids = [f"row-{i}" for i in range(20)]
    with batch_provider(cheap=True, min_seconds=0.3) as provider:
        client = _client(provider)
        created = _submit(client, _lines(ids), metadata={"run": "r1"})
        assert created.status == "validating" and created.endpoint == "/v1/chat/completions"
        seen: set[str] = set()
        batch = _wait(client, created.id, seen=seen)
        assert "in_progress" in seen and batch.status == "completed"
        assert batch.request_counts.total == 20 and batch.request_counts.completed == 20 and batch.error_file_id is None
        assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.usage.output_tokens == 80
        output = _jsonl(client, batch.output_file_id)
        assert sorted(line["custom_id"] for line in output) == sorted(ids)
        assert [line["custom_id"] for line in output] != ids  # results come back in an order of their own
        first = next(line for line in output if line["custom_id"] == "row-3")
        assert first["error"] is None and first["response"]["status_code"] == 200 and first["response"]["request_id"]
        assert first["response"]["body"]["choices"][0]["message"]["content"] == "row-3 says hello to"
        assert first["response"]["body"]["choices"][0]["finish_reason"] == "length"
        listed = list(client.batches.list(limit=5))
        assert [b.id for b in listed] == [created.id] and listed[0].metadata == {"run": "r1"}
        assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"
        assert client.files.delete(batch.input_file_id).deleted
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(batch.input_file_id)
        assert provider.executions == dict.fromkeys(ids, 1)
        assert provider.request_counts()[created.id] == {"total": 20, "completed": 20, "failed": 0}


def test_error_lines_and_vanished_lines_and_their_resubmission_run_each_line_once_per_attempt():
    ids = [f"row-{i}" for i in range(8)]
    faults = Faults(
        status={429: Pick({"row-1"}), 500: Pick({"row-2"}), 400: Pick({"row-3"}, times=None)}, vanish=Pick({"row-4"})
    )
    with batch_provider(cheap=True, faults=faults) as provider:
        client = _client(provider)
        batch = _wait(client, _submit(client, _lines(ids)).id)
        assert batch.status == "completed"
        output, errors = _jsonl(client, batch.output_file_id), _jsonl(client, batch.error_file_id)
        assert sorted(line["custom_id"] for line in output) == ["row-0", "row-5", "row-6", "row-7"]
        statuses = {line["custom_id"]: line["response"]["status_code"] for line in errors}
        assert statuses == {"row-1": 429, "row-2": 500, "row-3": 400}
        assert all(line["response"]["body"]["error"]["message"] for line in errors)
        # The vanished line is counted completed, as providers report it: the counts alone do not show it.
        assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 3)
        again = _wait(client, _submit(client, _lines(["row-1", "row-2", "row-3", "row-4"])).id)
        output = _jsonl(client, again.output_file_id)
        assert sorted(line["custom_id"] for line in output) == ["row-1", "row-2", "row-4"]
        assert [line["custom_id"] for line in _jsonl(client, again.error_file_id)] == ["row-3"]  # always the content's
        assert provider.executions["row-4"] == 2 and provider.executions["row-1"] == 1
        assert "row-3" not in provider.executions
        assert provider.executed_after_result == []
        _wait(client, _submit(client, _lines(["row-0"])).id)
        assert provider.executed_after_result == ["row-0"]  # a client that pays twice is caught


def test_an_expired_batch_keeps_its_done_half_and_lists_the_rest_as_batch_expired():
    ids = [f"row-{i}" for i in range(10)]
    with batch_provider(cheap=True, faults=Faults(expire_batches=1)) as provider:
        client = _client(provider)
        batch = _wait(client, _submit(client, _lines(ids)).id)
        assert batch.status == "expired" and batch.expired_at
        done, rest = _jsonl(client, batch.output_file_id), _jsonl(client, batch.error_file_id)
        assert len(done) == 5 and len(rest) == 5
        assert {line["custom_id"] for line in done} | {line["custom_id"] for line in rest} == set(ids)
        assert all(line["response"] is None and line["error"]["code"] == "batch_expired" for line in rest)
        assert _wait(client, _submit(client, _lines(["row-x"])).id).status == "completed"  # the next one won't expire


def test_a_file_the_provider_cannot_take_fails_validation_with_each_reason_and_line():
    with batch_provider(cheap=True, max_requests_per_file=3) as provider:
        client = _client(provider)
        bad = _lines(["a", "a"]) + _lines(["b"], endpoint="/v1/completions") + _lines(["c"], model="other")
        batch = _wait(client, _submit(client, bad).id)
        assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
        found = {(error.code, error.line) for error in batch.errors.data}
        assert found == {
            ("duplicate_custom_id", 2),
            ("mismatched_endpoint", 3),
            ("mismatched_model", 4),
            ("too_many_requests", None),
        }
        assert provider.executions == {}
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=provider.url, api_key="wrong", max_retries=0).batches.list()


def test_batches_list_newest_first_in_pages_and_a_cancelled_batch_ends_cancelled():
    with batch_provider(cheap=True, min_seconds=30) as provider:
        client = _client(provider)
        made = [_submit(client, _lines([f"row-{i}"]), metadata={"n": str(i)}).id for i in range(3)]
        page = client.batches.list(limit=2)
        assert [b.id for b in page.data] == made[::-1][:2] and page.has_more
        assert [b.id for b in client.batches.list(limit=2)] == made[::-1]  # the client follows `after`
        for batch_id in made:
            assert client.batches.cancel(batch_id).status == "cancelling"
        assert {_wait(client, batch_id).status for batch_id in made} == {"cancelled"}
        assert client.batches.retrieve(made[0]).cancelled_at


def _anthropic(provider, key=None) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=provider.root, api_key=key or provider.key, max_retries=0)


def test_anthropic_messages_answer_per_row_with_stop_reasons_and_cached_tokens_apart():
    with batch_provider(cheap=True, faults=Faults(cached_prompt_tokens=2)) as provider:
        client = _anthropic(provider)
        message = client.messages.create(
            model=MODEL, max_tokens=3, system="be brief", messages=[{"role": "user", "content": "one two three four"}]
        )
        assert message.type == "message" and message.role == "assistant" and message.content[0].text == "be brief one"
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
        # OpenAI's prompt_tokens (7) hold the cached ones; Anthropic's input_tokens leave them out.
        assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (5, 2)
        short = client.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
        assert short.stop_reason == "end_turn" and short.content[0].text == "hi"
        with pytest.raises(anthropic.AuthenticationError):
            _anthropic(provider, key="wrong").messages.create(
                model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "x"}]
            )
        provider.faults.refuse_every = 1
        with pytest.raises(anthropic.RateLimitError):
            client.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "x"}])


def test_the_prefix_cache_reports_a_repeated_prefix_as_cached_on_every_route_and_counts_what_it_reported():
    """The cache by prefix: the first request of a prefix reports nothing cached, every later one (per row or in a
    batch, OpenAI's or Anthropic's wire) its prefix's words; the provider's tally is what the answers said."""
    with batch_provider(cheap=True, faults=Faults(cache_prefix_words=3)) as provider:
        chat = _client(provider).chat.completions

        def ask(text: str):
            return chat.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": text}]).usage

        first, again, other = ask("the long document asks one"), ask("the long document asks two"), ask("another doc")
        assert first.prompt_tokens_details is None and again.prompt_tokens_details.cached_tokens == 3
        assert other.prompt_tokens_details is None
        message = _anthropic(provider).messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "the long document asks three"}]
        )
        assert (message.usage.cache_read_input_tokens, message.usage.input_tokens) == (3, 3)  # 6 prompt tokens
        batch = _wait(_client(provider), _submit(_client(provider), _lines(["a", "b"])).id)
        # "a says hello ..." and "b says hello ...": two prefixes seen for the first time
        assert batch.usage.input_tokens_details.cached_tokens == 0
        again = _wait(_client(provider), _submit(_client(provider), _lines(["a"])).id)
        assert again.usage.input_tokens_details.cached_tokens == 3
        assert provider.cached_delivered == 3 + 3 + 3
        # OpenAI's prompt_cache_key: a key's requests share one cache, a seen prefix under another key is not a hit
        keyed = [
            chat.create(
                model=MODEL,
                max_tokens=2,
                messages=[{"role": "user", "content": "the long document asks " + n}],
                prompt_cache_key=key,
            ).usage.prompt_tokens_details
            for n, key in (("four", "k1"), ("five", "k2"), ("six", "k1"))
        ]
        assert keyed[0] is None and keyed[1] is None and keyed[2].cached_tokens == 3
        # Anthropic's cache_control: cached by the marked block, written the first time and read after
        messages = _anthropic(provider).messages

        def marked(question: str):
            blocks = [
                {"type": "text", "text": "One shared document. ", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": question},
            ]
            return messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": blocks}])

        written, read = marked("Why?"), marked("How so?")
        assert (written.usage.cache_creation_input_tokens, written.usage.cache_read_input_tokens) == (3, 0)
        assert (read.usage.cache_creation_input_tokens, read.usage.cache_read_input_tokens) == (0, 3)
        assert provider.written_delivered == 3  # what the answers reported written
        assert read.content[0].text == "One shared"  # the text as one: the blocks joined
        hints = list(provider.cache_hints)[-5:]
        assert [hint for _, hint in hints] == ["k1", "k2", "k1", "One shared document. ", "One shared document. "]
        assert hints[-1][0] == "One shared document. How so?"


def test_anthropic_message_batches_end_with_succeeded_errored_expired_and_canceled_results():
    ids = [f"row-{i}" for i in range(8)]
    faults = Faults(
        status={500: Pick({"row-1"}), 400: Pick({"row-2"})},
        expired=Pick({"row-3"}),
        canceled=Pick({"row-4"}),
        vanish=Pick({"row-5"}),
    )
    with batch_provider(cheap=True, min_seconds=0.3, faults=faults) as provider:
        client = _anthropic(provider)
        requests = [
            {
                "custom_id": custom_id,
                "params": {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": custom_id}]},
            }
            for custom_id in ids
        ]
        created = client.messages.batches.create(requests=requests)
        assert created.processing_status == "in_progress" and created.request_counts.processing == 8
        assert created.results_url is None
        deadline = time.monotonic() + 30
        while (batch := client.messages.batches.retrieve(created.id)).processing_status != "ended":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        counts = batch.request_counts
        assert (counts.processing, counts.succeeded, counts.errored, counts.expired, counts.canceled) == (0, 4, 2, 1, 1)
        results = {item.custom_id: item.result for item in client.messages.batches.results(created.id)}
        assert set(results) == set(ids) - {"row-5"}
        assert results["row-0"].type == "succeeded" and results["row-0"].message.content[0].text == "row-0"
        assert results["row-1"].type == "errored" and results["row-1"].error.error.type == "api_error"
        assert results["row-2"].error.error.type == "invalid_request_error"
        assert (results["row-3"].type, results["row-4"].type) == ("expired", "canceled")
        page = client.messages.batches.list(limit=1)
        assert [b.id for b in page.data] == [created.id] and page.last_id == created.id and not page.has_more
        with pytest.raises(anthropic.BadRequestError):
            client.messages.batches.create(requests=requests[:1] * 2)  # a custom_id twice is refused at once
        assert provider.executions == dict.fromkeys(("row-0", "row-5", "row-6", "row-7"), 1)


def test_the_standalone_provider_serves_until_it_is_stopped(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.providers.batch_provider", "--cheap", "--key", "k1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        url = line.split()[3]
        client = openai.OpenAI(base_url=url, api_key="k1", max_retries=0)
        answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "per row too"}])
        assert answer.choices[0].message.content == "per row too"
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
