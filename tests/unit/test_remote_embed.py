"""The remote embed head's parts that need no server: how present texts are cut into requests, what a
``/v1/embeddings`` answer must hold to be taken, the flags that make an engine embed, and the ``embed.endpoint`` /
``embed.server`` settings: the generate task's keys, refused before any compute where they cannot hold. The head
against a real server (vLLM's pooling runner) is tests/engines/test_vllm_pooling.py."""

from __future__ import annotations

import numpy as np
import pytest

from lakescore.jobs.config import ConfigError, load_config
from lakescore.udfs.remote.answers import Malformed
from lakescore.udfs.remote.embed import cut_requests, served_args
from lakescore.udfs.remote.embeddings import parse_embeddings

BASE = {"input": "db.reviews", "output": "db.embeddings", "task": "embed", "id_col": "id", "text_col": "body"}
ENDPOINT = {"embed.endpoint.url": "https://api.example.com/v1", "embed.endpoint.model": "minilm"}


def test_requests_are_cut_by_inputs_and_characters_in_order_and_a_long_text_goes_alone():
    assert cut_requests([], 4) == []
    assert cut_requests([5] * 10, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert cut_requests([40, 40, 40, 10], 8, max_chars=100) == [[0, 1], [2, 3]]
    assert cut_requests([10, 500, 10, 10], 8, max_chars=100) == [[0], [1], [2, 3]]  # over the budget: alone
    cut = cut_requests([7, 1, 30, 2, 9, 9, 40], 3, max_chars=50)
    assert [i for rows in cut for i in rows] == list(range(7))
    assert all(
        len(rows) <= 3 and (len(rows) == 1 or sum([7, 1, 30, 2, 9, 9, 40][i] for i in rows) <= 50) for rows in cut
    )


def test_an_answer_is_taken_in_index_order_with_its_usage_and_refused_when_it_is_not_whole():
    answer = {
        "data": [{"index": 1, "embedding": [0.0, 2.0]}, {"index": 0, "embedding": [1.0, 0.0]}],
        "usage": {"prompt_tokens": 7, "total_tokens": 7},
    }
    parsed = parse_embeddings(answer, 2)
    assert (
        np.array_equal(parsed.vectors, np.array([[1, 0], [0, 2]], dtype=np.float32))
        and parsed.vectors.dtype == np.float32
    )
    assert parsed.prompt_tokens == parsed.tokens == 7
    assert parse_embeddings({"data": answer["data"]}, 2).prompt_tokens is None  # no usage: unknown, not 0
    broken = [
        {"data": answer["data"][:1]},  # fewer vectors than inputs
        {"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]},  # an index twice
        {"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}]},  # ragged
        {"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [float("nan")]}]},
        {"data": [{"index": 0, "embedding": "AAAA"}, {"index": 1, "embedding": "AAAA"}]},  # base64, not asked for
        {"data": answer["data"], "usage": {"prompt_tokens": -1}},
        {"error": "no data"},
    ]
    for body in broken:
        with pytest.raises(Malformed):
            parse_embeddings(body, 2)


def test_the_engine_is_told_to_embed_unless_its_flags_say_how():
    assert served_args("vllm", ["--dtype", "float32"]) == ("--runner", "pooling", "--dtype", "float32")
    assert served_args("vllm", ["--runner=pooling"]) == ("--runner=pooling",)
    assert served_args("vllm", ["--runner", "pooling"]) == ("--runner", "pooling")
    assert served_args("sglang", ()) == ("--is-embedding",)


def test_the_embed_endpoint_takes_the_generate_endpoints_keys_and_its_digest_names_the_model():
    cfg = load_config(
        flags={
            **BASE,
            **ENDPOINT,
            "embed.endpoint.api_key_env": "EMBED_KEY",
            "embed.endpoint.concurrency": 4,
            "embed.endpoint.price": {"input": 0.02},
            "embed.endpoint.revision": "v2",
        }
    )
    cfg.require_for_scoring()  # no model.source: the endpoint's model answers
    assert cfg.endpoint() is cfg.embed.endpoint and cfg.secret_env_names() == ("EMBED_KEY",)
    assert cfg.embed.endpoint.price.cost(2_000_000) == pytest.approx(0.04)
    elsewhere = load_config(flags={**BASE, **ENDPOINT, "embed.endpoint.url": "https://other.example.com/v1"})
    assert elsewhere.embed.identity() == {"endpoint": {"model": "minilm", "revision": None}}
    assert load_config(flags=BASE).embed.identity() == {}  # in-process: the digests it had before


@pytest.mark.parametrize(
    "flags, refusal",
    [
        ({**ENDPOINT, "embed.endpoint.api": "chat"}, "unknown config key 'embed.endpoint.api'"),
        ({"model.source": "/m", "embed.server.engine": "transformers"}, "has no /v1/embeddings route"),
        (
            {"model.source": "/m", "embed.server.engine": "vllm", "embed.server.api": "chat"},
            "unknown config key 'embed.server.api'",
        ),
        ({**ENDPOINT, "embed.chunk.max_tokens": 64}, "chunks are cut by the model's tokenizer in-process"),
        (
            {**ENDPOINT, "model.source": "/m", "embed.server.engine": "vllm"},
            "embed.endpoint and embed.server exclude each other",
        ),
    ],
)
def test_what_an_embedding_server_cannot_do_is_refused_in_one_line_before_any_compute(flags, refusal):
    with pytest.raises(ConfigError) as refused:
        load_config(flags={**BASE, **flags})
    assert refusal in str(refused.value) and "\n" not in str(refused.value).strip()


def test_model_settings_a_server_cannot_honour_are_refused_before_any_request():
    from lakescore.jobs.steps.read import model_spec
    from lakescore.udfs.remote.embed import load_remote_embedder

    # an unreachable endpoint: each refusal comes before the first request
    endpoint = {"embed.endpoint.url": "http://127.0.0.1:9/v1", "embed.endpoint.model": "minilm"}
    for flags, refusal in (
        ({"model.pooling": "cls"}, "a served model pools as its own configuration says"),
        ({"model.normalize": False}, "comes normalised from the server's pooler"),
        ({"model.prompt_name": "query"}, "which an endpoint does not lend"),
        ({"model.dtype": "bfloat16"}, "a served model runs at the server's precision"),
    ):
        with pytest.raises(ValueError, match=refusal):
            load_remote_embedder(model_spec(load_config(flags={**BASE, **endpoint, **flags})), None)


def test_a_notebook_call_takes_endpoint_as_the_tasks_own_section():
    from lakescore.jobs.api import _notebook_config

    endpoint = {"url": "https://api.example.com/v1", "model": "m"}
    embed = _notebook_config("embed", "unused", None, {"endpoint": endpoint}, text_col="body")
    generate = _notebook_config("generate", "unused", None, {"endpoint": endpoint}, text_col="body")
    assert embed.embed.endpoint.model == "m" and embed.generate.endpoint is None
    assert generate.generate.endpoint.model == "m" and generate.embed.endpoint is None


def test_the_conf_example_the_docs_show_exists_and_loads():
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    shown = re.findall(r"```yaml\n# (conf/[\w.-]+\.yaml)\n(.*?)```", (repo / "docs/embedding.md").read_text(), re.S)
    assert [path for path, _ in shown] == ["conf/embed-vllm.yaml"]
    path, body = shown[0]
    assert (repo / path).read_text().split("\n", 1)[1] == body
    cfg = load_config(repo / path)
    cfg.require_for_scoring()
    assert cfg.embed.server.engine == "vllm" and cfg.task == "embed"


def test_an_embedding_servers_prompt_tokens_reach_the_runs_figures_without_generated_ones():
    """Before: the report's tokens were kept only when some were generated, so an embed run's went unreported and
    unbilled."""
    from lakescore.jobs.steps.account import _worker_totals
    from lakescore.schemas.output import WORKER_METRICS

    group = dict.fromkeys(WORKER_METRICS.fieldNames(), 0)
    group.update(arrow_batches=1, tokens_in=300, requests=5)
    workers = _worker_totals([group], 33, 0, {"requests": 1, "tokens_in": 4})
    assert (workers["requests"], workers["tokens_in"], workers["tokens_out"]) == (6, 304, 0)
    in_process = dict.fromkeys(WORKER_METRICS.fieldNames(), 0)
    assert "tokens_in" not in _worker_totals([in_process], 33, 0)  # in-process embed: no tokens, as before


@pytest.mark.parametrize("flags", [ENDPOINT, {"model.source": "/m", "embed.server.engine": "vllm"}])
def test_sweep_refuses_a_model_served_elsewhere_before_any_session_or_request(flags):
    from lakescore.jobs.commands.sweep import run_sweep

    with pytest.raises(ConfigError, match="nothing to sweep"):
        run_sweep(load_config(flags={**BASE, **flags}))  # no spark given: a session would be started after the check
