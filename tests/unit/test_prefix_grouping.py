"""Which runs group rows by prompt prefix (``scoring.group_prefixes``), and when the scoring stage shuffles at all:
the decisions :func:`~lakescore.jobs.steps.score.score_dataframe` takes, without a JVM (the partitioning itself runs
on Spark in ``tests/integration/test_endpoint_job.py``)."""

from __future__ import annotations

import pytest

from lakescore.jobs.config import config_from_mapping
from lakescore.jobs.steps.score import scoring_shuffle

BASE = {"task": "generate", "input": "/data/docs", "output": "/data/answers", "id_col": "id", "text_col": "question"}
ENDPOINT = {"endpoint": {"url": "http://127.0.0.1:8000/v1", "model": "m"}}
SERVER = {"server": {"engine": "vllm"}}


@pytest.mark.parametrize(
    ("settings", "grouped"),
    [
        ({"generate": ENDPOINT}, True),
        ({"generate": SERVER}, True),
        ({"generate": {**ENDPOINT, "temperature": 0.7}}, True),  # a sampled row's seed is its id's: order is free
        ({"model": "/models/tiny"}, True),  # in process, greedy: the head computes a shared prefix once per batch
        ({"model": "/models/tiny", "generate": {"share_prefix_tokens": 0}}, False),  # ... unless that is off
        ({"model": "/models/tiny", "generate": {"temperature": 0.7}}, False),  # sampled rows compute prompts whole
        ({"generate": SERVER, "scoring": {"group_prefixes": False}}, False),
        ({"task": "embed", "embed": ENDPOINT}, False),  # a vector has no prefix cache to feed
    ],
    ids=["endpoint", "server", "sampled", "in-process", "in-process-unshared", "in-process-sampled", "off", "embed"],
)
def test_prompts_sent_as_requests_are_grouped_unless_turned_off(settings, grouped):
    cfg = config_from_mapping({**BASE, **settings})
    assert cfg.groups_prefixes is grouped


def test_images_with_prompts_are_not_grouped_their_image_comes_first():
    server = {"server": {"engine": "vllm", "api": "chat"}, "prompt_template": "Describe {name}"}
    cfg = config_from_mapping(
        {**{k: v for k, v in BASE.items() if k != "text_col"}, "image_col": "photo"} | {"generate": server}
    )
    assert cfg.groups_prefixes is False


@pytest.mark.parametrize(
    ("planned", "target", "configured", "shuffled"),
    [(1, 8, False, True), (8, 8, False, False), (16, 8, False, False), (16, 8, True, True), (None, 8, False, True)],
)
def test_the_stage_shuffles_when_its_input_has_too_few_partitions_or_unknown_or_tasks_are_configured(
    planned, target, configured, shuffled
):
    assert scoring_shuffle(planned, target, configured) is shuffled


DOC_TEMPLATES = {"prefix_template": "Document: {doc}\n\n", "prompt_template": "Question: {q}\nAnswer:"}


def _prompt(doc: str, question: str) -> str:
    return f"Document: {doc}\n\nQuestion: {question}\nAnswer:"


def test_a_prefix_template_renders_before_the_prompt_template_and_counts_as_the_one_template():
    """``generate.prefix_template`` is rendered first, the two as one template: the prompts, and so the spec's
    identity, are those of the one template written whole; a prefix without a template after it, or one whose end no
    prompt shows (a placeholder on each side), is refused when the config loads."""
    split = config_from_mapping({**BASE, "generate": {**ENDPOINT, **DOC_TEMPLATES}})
    whole = config_from_mapping({**BASE, "generate": {**ENDPOINT, "prompt_template": _prompt("{doc}", "{q}")}})
    assert split.prompt_template == whole.prompt_template == _prompt("{doc}", "{q}")
    assert split.generate.identity() == whole.generate.identity()
    with pytest.raises(ValueError, match="prefix_template needs generate.prompt_template"):
        config_from_mapping({**BASE, "generate": {"prefix_template": "Document: {doc}\n"}})
    with pytest.raises(ValueError, match="put text between them"):
        config_from_mapping({**BASE, "generate": {"prefix_template": "{doc}", "prompt_template": "{q}"}})
    assert config_from_mapping({**BASE, "generate": {"prefix_template": "Few shots.\n", "prompt_template": "{q}"}})


def test_the_shared_part_is_found_from_the_row_templates_end():
    """The row's own part is matched from the prompt's end, so a document holding the row template's text (a blank
    line, even ``Question:``) still splits where the document ends; a prompt the templates did not render (the
    preflight's) has no shared part."""
    options = config_from_mapping({**BASE, "generate": {**ENDPOINT, **DOC_TEMPLATES}}).generate
    doc = "Question: what?\n\nAnswer: this.\n\nMore."
    assert options.shared_prefix(_prompt(doc, "why?")) == f"Document: {doc}\n\n"
    assert options.shared_prefix("lakescore preflight") is None
    row_first = {"prefix_template": "Doc: {doc}\n\n", "prompt_template": "{q}?"}
    options = config_from_mapping({**BASE, "generate": {**ENDPOINT, **row_first}}).generate
    assert options.shared_prefix("Doc: a\n\nb\n\nwhy?") == "Doc: a\n\nb\n\n"  # after the prefix's last text
    assert options.shared_prefix("Doc: a\n\n?") == "Doc: a\n\n"


def _generate(**settings):
    return config_from_mapping({**BASE, "generate": settings}).generate


def test_openai_requests_carry_one_prompt_cache_key_per_shared_part():
    """``prompt_cache_key``: the same for the rows of a document, another for another document, whatever each row's
    question; without a ``prefix_template``, the digest of the prompt's first ``prompt_cache_key_chars`` characters.
    On by default for chat at OpenAI's own API only (elsewhere a server may refuse it: ``transformers serve`` on
    completions), never to a served engine or with an image, refused with Anthropic's API; the prompt is sent as it
    is."""
    from lakescore.udfs.remote.completions import request_body

    chat = {"endpoint": {"url": "https://api.openai.com/v1", "model": "m", "api": "chat"}}
    options = _generate(**chat, **DOC_TEMPLATES)

    def key(options, prompt, api="chat", **more):
        return request_body(options, "m", api, prompt, **more).get("prompt_cache_key")

    long_doc = "x" * 300
    keys = {(d, q): key(options, _prompt(d, q)) for d in ("a", long_doc) for q in ("why?", "how?")}
    assert keys[("a", "why?")] == keys[("a", "how?")] != keys[(long_doc, "why?")] == keys[(long_doc, "how?")]
    assert len(keys[("a", "why?")]) == 32
    body = request_body(options, "m", "chat", _prompt("a", "why?"))
    assert body["messages"] == [{"role": "user", "content": _prompt("a", "why?")}]
    by_chars = _generate(endpoint={**chat["endpoint"], "prompt_cache_key_chars": 4})
    assert key(by_chars, "abcd-1") == key(by_chars, "abcd-2") != key(by_chars, "abce-1")
    assert key(_generate(**ENDPOINT), "abcd") is None  # completions: off unless asked
    assert key(_generate(endpoint={**ENDPOINT["endpoint"], "api": "chat"}), "abcd") is None  # not OpenAI's: off
    on = _generate(endpoint={**ENDPOINT["endpoint"], "prompt_cache_key": True})
    assert key(on, "abcd", "completions") == key(_generate(**chat), "abcd")
    assert key(_generate(endpoint={**chat["endpoint"], "prompt_cache_key": False}), "abcd") is None
    assert key(_generate(**chat), "abcd", image={"type": "image_url", "image_url": {"url": "data:,"}}) is None
    assert key(_generate(server={"engine": "vllm", "api": "chat"}), "abcd") is None
    with pytest.raises(ValueError, match="prompt_cache_key is OpenAI's"):
        _generate(endpoint={**ENDPOINT["endpoint"], "api": "messages", "prompt_cache_key": True})


def test_anthropic_requests_mark_the_shared_part_as_a_cache_control_block():
    """With ``api: messages`` and a ``prefix_template``, the shared part is a text block of its own marked
    ``cache_control: {type: ephemeral}``, the row's part a second block: together the prompt as it is. Without a shared
    part (no template, the preflight's prompt, an image first) the prompt goes as one text."""
    from lakescore.udfs.remote.messages import request_body

    messages = {"endpoint": {**ENDPOINT["endpoint"], "api": "messages"}}
    options = _generate(**messages, **DOC_TEMPLATES)
    prompt = _prompt("the doc", "why?")
    content = request_body(options, "m", prompt)["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "Document: the doc\n\n", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Question: why?\nAnswer:"},
    ]
    assert "".join(block["text"] for block in content) == prompt
    assert request_body(options, "m", "lakescore preflight")["messages"][0]["content"] == "lakescore preflight"
    assert request_body(_generate(**messages), "m", prompt)["messages"][0]["content"] == prompt
    png = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    with_image = request_body(options, "m", prompt, image=png)["messages"][0]["content"]
    assert [block["type"] for block in with_image] == ["image", "text"] and "cache_control" not in with_image[1]
