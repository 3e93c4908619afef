"""The test suite's Batch API provider in front of a real model server: a batch's answers, through OpenAI's Batches and
Anthropic's Message Batches, are the ones the upstream gives each body per row (``transformers serve`` over a tiny
seeded decoder with a chat template; greedy, so the same body gives the same text)."""

from __future__ import annotations

import io
import json
import time

import anthropic
import openai
import pytest

from tests.providers import batch_provider
from tests.served_models import transformers_serve
from tests.tiny_generators import CHAT_TEMPLATE, reviews, save_causal, train_tokenizer


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
    bodies = {f"row-{i}": {"model": model, "max_tokens": 6, "temperature": 0.0,
                           "messages": [{"role": "user", "content": text}]} for i, text in enumerate(texts)}
    direct = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
    per_row = {custom_id: direct.chat.completions.create(**body).choices[0].message.content
               for custom_id, body in bodies.items()}
    with batch_provider(server.url) as provider:
        client = openai.OpenAI(base_url=provider.url, api_key=provider.key, max_retries=0)
        lines = "".join(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                                    "body": body}) + "\n" for custom_id, body in bodies.items())
        uploaded = client.files.create(file=("rows.jsonl", io.BytesIO(lines.encode())), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        messages = anthropic.Anthropic(base_url=provider.root, api_key=provider.key, max_retries=0)
        # Anthropic's Messages params (anthropic 2.x) have no temperature: the upstream's default, greedy, answers.
        requests = [{"custom_id": custom_id, "params": {key: body[key] for key in ("model", "max_tokens", "messages")}}
                    for custom_id, body in bodies.items()]
        message_batch = messages.messages.batches.create(requests=requests)
        deadline = time.monotonic() + 120
        while (batch := client.batches.retrieve(batch.id)).status != "completed":
            assert batch.status in ("validating", "in_progress", "finalizing") and time.monotonic() < deadline, batch
            time.sleep(0.1)
        output = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
        batched = {line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"] for line in output}
        assert batched == per_row and any(per_row.values())
        provider.wait(message_batch.id)
        results = {item.custom_id: item.result.message.content[0].text
                   for item in messages.messages.batches.results(message_batch.id)}
        assert results == per_row
        row = messages.messages.create(**requests[0]["params"])  # per row through the provider's /v1/messages
        assert row.content[0].text == per_row["row-0"] and row.usage.input_tokens > 0
        assert provider.executions == {custom_id: 2 for custom_id in bodies}  # once per batch kind
