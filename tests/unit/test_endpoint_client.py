"""The endpoint client against a real local HTTP server (stdlib ``http.server`` in a thread) that answers as a script
says: retries with backoff on 5xx and lost connections, ``Retry-After`` honoured on 429 and counted, a row's own
failure not retried, a dead endpoint stopping the client, the key sent only in its header and scrubbed from errors;
the request each generate setting becomes; the host-wide rate limit's buckets."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lakescore.schemas.output import SERVER_REASONS, carries
from lakescore.udfs.options.generate import GenerateOptions
from lakescore.udfs.options.remote import EndpointOptions, Price
from lakescore.udfs.remote.answers import EndpointDown, EndpointError, Unfinished
from lakescore.udfs.remote.client import EndpointClient, backoff, retry_after
from lakescore.udfs.remote.completions import complete, parse_completion, request_body
from lakescore.udfs.remote.rate_limit import HostRateLimit

KEY = "sk-test-0123456789abcdef"


@dataclass
class Script:
    """What the server answers, request by request: ``(status, headers, body)``; the last entry repeats."""

    answers: list[tuple[int, dict, dict]]
    seen: list[dict] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    models: dict | None = field(
        default_factory=lambda: {"object": "list", "data": [{"id": "tiny", "object": "model", "created": 1}]}
    )
    """What ``GET /v1/models`` answers; ``None``: 404."""
    delay: float = 0.0
    """Seconds each ``POST`` waits before it answers (a server slower than the client's timeout)."""
    echo_headers: bool = False
    """Answer every ``POST`` 400 with the request's headers in the error, as some servers and proxies do."""


def _ok(text: str = "hello", finish: str = "stop") -> tuple[int, dict, dict]:
    return (
        200,
        {},
        {"choices": [{"text": text, "finish_reason": finish}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    )


@pytest.fixture
def server():
    script = Script([_ok()])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            if script.models is None:
                self._answer(404, {}, {"detail": "Not Found"})
            else:
                self._answer(200, {}, script.models)

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            script.seen.append(json.loads(self.rfile.read(length)))
            script.auth.append(self.headers.get("Authorization"))
            if script.delay:
                import time

                time.sleep(script.delay)
            if script.echo_headers:
                return self._answer(400, {}, {"error": {"message": f"bad request; headers were {dict(self.headers)}"}})
            index = min(len(script.seen) - 1, len(script.answers) - 1)
            self._answer(*script.answers[index])

        def _answer(self, status, headers, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.handle_error = lambda *args: None  # a client that timed out and left: not the test's failure
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield script, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _client(url, waits, key=None, **settings) -> EndpointClient:
    options = EndpointOptions(url=url, model="tiny", **settings)
    return EndpointClient(options, options.url, options.model, api_key=key, sleep=waits.append)


def test_a_429_is_retried_after_what_retry_after_says_and_counted(server):
    script, url = server
    script.answers = [
        (429, {"Retry-After": "7"}, {"error": {"message": "slow down"}}),
        (429, {"retry-after-ms": "250"}, {"error": {"message": "slow down"}}),
        _ok("fine"),
    ]
    waits: list[float] = []
    client = _client(url, waits)
    completion = complete(client, GenerateOptions(max_new_tokens=4), "a prompt")
    assert (completion.text, completion.finish_reason, completion.prompt_tokens, completion.completion_tokens) == (
        "fine",
        "stop",
        3,
        2,
    )
    assert waits == [7.0, 0.25]
    assert (
        client.stats.traffic.requests,
        client.stats.traffic.retries,
        client.stats.traffic.rate_limited,
        client.stats.failed,
    ) == (3, 2, 2, 0)
    assert (client.stats.traffic.tokens_in, client.stats.traffic.tokens_out) == (3, 2)
    assert client.breaker.failures == 0  # 429s are the server's pace, not failures


def test_5xx_backs_off_exponentially_then_the_row_fails_with_the_servers_message(server):
    script, url = server
    script.answers = [(503, {}, {"error": {"message": "engine overloaded"}})]
    waits: list[float] = []
    client = _client(url, waits, max_retries=3)
    with pytest.raises(EndpointError) as failed:
        complete(client, GenerateOptions(), "p")
    assert failed.value.status == 503 and failed.value.message == "engine overloaded"
    assert str(failed.value) == "HTTP 503: engine overloaded"
    assert len(waits) == 3 and all(0.5 * 2**i / 2 <= w <= 0.5 * 2**i for i, w in enumerate(waits))
    assert (client.stats.traffic.requests, client.stats.traffic.retries, client.stats.failed) == (4, 3, 1)


def test_a_rows_own_4xx_is_not_retried_and_a_success_resets_the_failures_in_a_row(server):
    script, url = server
    script.answers = [(400, {}, {"detail": "prompt is too long for this model"}), _ok()]
    waits: list[float] = []
    client = _client(url, waits)
    with pytest.raises(EndpointError, match="HTTP 400: prompt is too long"):
        complete(client, GenerateOptions(), "p")
    assert waits == [] and client.breaker.failures == 1
    complete(client, GenerateOptions(), "p")
    assert client.breaker.failures == 0


@pytest.mark.parametrize("status", [408, 409])
def test_408_and_409_are_retried_and_then_the_servers_failure_not_the_contents(server, status):
    """One meaning for 408 and 409 everywhere: retried as a passing failure, and once retries are spent neither a
    refusal of the content (an embed request is not split over them) nor of the run's settings (the preflight)."""
    from lakescore.udfs.remote.answers import content_refused, what_happened

    script, url = server
    script.answers = [(status, {}, {"error": {"message": "try again"}})]
    waits: list[float] = []
    client = _client(url, waits, max_retries=2)
    with pytest.raises(EndpointError) as failed:
        complete(client, GenerateOptions(), "p")
    assert len(waits) == 2 and (client.stats.traffic.requests, client.stats.traffic.retries, client.stats.failed) == (
        3,
        2,
        1,
    )
    assert not content_refused(failed.value)
    assert what_happened(failed.value, 2).startswith("failed the preflight's request")
    assert content_refused(EndpointError(400, "too long"))  # a 4xx of the content's own: split, refused


def test_a_dead_endpoint_stops_the_client_in_one_line_naming_it():
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    waits: list[float] = []
    client = _client(url, waits, max_consecutive_failures=3, max_retries=5)
    with pytest.raises(EndpointDown) as down:
        complete(client, GenerateOptions(), "p")
    line = str(down.value)
    assert "\n" not in line and url in line and "model tiny" in line and "3 requests in a row" in line
    assert "ConnectError" in line
    with pytest.raises(EndpointDown):  # every later row too, without a request
        complete(client, GenerateOptions(), "p")
    assert len(waits) == 2  # three attempts, the third stopped it
    assert (
        client.stats.traffic.requests == client.stats.traffic.retries == 0
    )  # none reached a server: nothing to count or pay


def test_the_key_goes_only_in_the_authorization_header_and_never_into_an_error(server):
    script, url = server
    script.answers = [(401, {}, {"error": {"message": f"Incorrect API key provided: {KEY}"}})]
    client = _client(url, [], key=KEY)
    with pytest.raises(EndpointError) as failed:
        complete(client, GenerateOptions(), "p")
    assert KEY not in str(failed.value) and "***" in str(failed.value)
    assert script.auth == [f"Bearer {KEY}"] and KEY not in json.dumps(script.seen)


def test_every_generate_setting_becomes_its_request_field():
    options = GenerateOptions(
        max_new_tokens=9,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        stop=("\n\n",),
        system_prompt="Be brief.",
        json_schema='{"type": "object"}',
        top_k=40,
        repetition_penalty=1.1,
        min_new_tokens=2,
        stop_token_ids=(7,),
    )
    chat = request_body(options, "m", "chat", "Hi", seed=11)
    assert chat == {
        "model": "m",
        "max_tokens": 9,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 11,
        "stop": ["\n\n"],
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "row", "schema": {"type": "object"}, "strict": True},
        },
        "top_k": 40,
        "repetition_penalty": 1.1,
        "min_tokens": 2,
        "stop_token_ids": [7],
    }
    greedy = request_body(GenerateOptions(max_new_tokens=4, system_prompt="S"), "m", "completions", "Hi", seed=11)
    assert greedy == {"model": "m", "max_tokens": 4, "temperature": 0.0, "prompt": "S\n\nHi"}  # greedy sends no seed


def test_a_response_is_read_as_the_row_with_its_stop_string_cut():
    body = {
        "choices": [{"text": "good stay.\n\nNext", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2},
    }
    completion = parse_completion(body, "completions", stop=("\n\n",))
    assert (completion.text, completion.prompt_tokens, completion.completion_tokens) == ("good stay.", 4, 2)
    chat = {"choices": [{"message": {"content": "x"}, "finish_reason": "length"}]}
    assert (parse_completion(chat, "chat").text, parse_completion(chat, "chat").finish_reason) == ("x", "length")
    with pytest.raises(ValueError, match="no text"):
        parse_completion({"error": "x"}, "completions")


def test_cached_prompt_tokens_are_read_apart_and_priced_at_the_cached_price():
    """OpenAI's and vLLM's ``usage.prompt_tokens_details.cached_tokens`` are among ``prompt_tokens``: read apart, 0
    where the server says nothing (no details, null), refused where they cannot be true; the run's figures carry
    them (``tokens_in_cached``, 0 rather than absent) and ``price.cached_input`` prices them."""
    from lakescore.jobs.steps.account import _worker_totals
    from lakescore.schemas.output import WORKER_METRICS

    def answer(**usage):
        return {"choices": [{"text": "a", "finish_reason": "stop"}], "usage": {"prompt_tokens": 10, **usage}}

    body = answer(completion_tokens=1, prompt_tokens_details={"cached_tokens": 6})
    completion = parse_completion(body, "completions")
    assert (completion.prompt_tokens, completion.cached_tokens) == (10, 6)
    assert parse_completion(answer(completion_tokens=1), "completions").cached_tokens == 0
    assert parse_completion(answer(completion_tokens=1, prompt_tokens_details=None), "completions").cached_tokens == 0
    for impossible in (11, -1, "6"):
        with pytest.raises(ValueError, match="cached_tokens"):
            parse_completion(answer(completion_tokens=1, prompt_tokens_details={"cached_tokens": impossible}), "chat")
    group = dict.fromkeys(WORKER_METRICS.fieldNames(), 0)
    group.update(tokens_in=30, tokens_out=20, requests=10)
    assert _worker_totals([group], 10, 0)["tokens_in_cached"] == 0  # a server that reports none: 0, not missing
    group.update(tokens_in_cached=12)
    assert _worker_totals([group], 10, 0)["tokens_in_cached"] == 12
    price = Price(input=2.0, output=10.0, cached_input=0.5)
    assert price.cost(30, 20, 12) == pytest.approx((18 * 2.0 + 12 * 0.5 + 20 * 10.0) / 1e6)
    assert Price(input=2.0, output=10.0).cost(30, 20, 12) == pytest.approx(Price(input=2.0, output=10.0).cost(30, 20))


def test_cache_writes_are_counted_apart_and_priced_at_their_own_price():
    """Anthropic's ``cache_creation_input_tokens`` are among the prompt tokens, as its cache reads are: the run's
    figures carry them (``tokens_in_cache_write``, 0 rather than absent), and ``Price`` prices each prompt token once
    at its kind's price (plain, read from the cache, written to it: 1.25 x ``input`` unless
    ``price.cache_write_input`` says otherwise); the summary, the HTML report and the metrics row show them."""
    from lakescore.jobs.report.html import render_html
    from lakescore.jobs.report.model import RunReport
    from lakescore.jobs.steps.account import _worker_totals
    from lakescore.jobs.steps.metrics import metrics_row
    from lakescore.schemas.output import WORKER_METRICS
    from lakescore.udfs.remote.completions import completion_traffic
    from lakescore.udfs.remote.messages import parse_message

    usage = {"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 40, "cache_creation_input_tokens": 7}
    message = {"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "usage": usage}
    traffic = completion_traffic(parse_message(message))
    assert (traffic.tokens_in, traffic.tokens_in_cached, traffic.tokens_in_cache_write) == (50, 40, 7)
    usage = {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}}
    answer = {"choices": [{"text": "a", "finish_reason": "stop"}], "usage": usage}
    openai_like = completion_traffic(parse_completion(answer, "completions"))
    assert (openai_like.tokens_in_cached, openai_like.tokens_in_cache_write) == (4, 0)  # only Anthropic reports writes
    group = dict.fromkeys(WORKER_METRICS.fieldNames(), 0)
    group.update(tokens_in=30, tokens_out=20, requests=10)
    assert _worker_totals([group], 10, 0)["tokens_in_cache_write"] == 0
    group.update(tokens_in_cached=12, tokens_in_cache_write=6)
    workers = _worker_totals([group], 10, 0)
    assert (workers["tokens_in"], workers["tokens_in_cached"], workers["tokens_in_cache_write"]) == (30, 12, 6)
    price = Price(input=2.0, output=10.0, cached_input=0.5)  # writes at 1.25 x 2.0 by default
    assert price.cost(30, 20, 12, 6) == pytest.approx((12 * 2.0 + 12 * 0.5 + 6 * 2.5 + 20 * 10.0) / 1e6)
    assert Price(input=2.0, output=10.0, cache_write_input=4.0).cost(30, 20, 0, 6) == pytest.approx(
        (24 * 2.0 + 6 * 4.0 + 20 * 10.0) / 1e6
    )
    assert price.charge(traffic) == pytest.approx((3 * 2.0 + 40 * 0.5 + 7 * 2.5 + 2 * 10.0) / 1e6)
    report = RunReport(
        run_id="r1",
        status="succeeded",
        task="generate",
        input="in",
        output="out",
        model_id="m",
        model_revision=None,
        model_sha256=None,
        workers=workers,
    )
    assert "from 30 prompt tokens (12 cached: a prompt cache or a shared prefix; 6 written to the provider" in (
        report.summary()
    )
    assert "<th>of them written to the provider&#x27;s prompt cache (priced apart)</th><td>6</td>" in render_html(
        report.as_dict()
    )
    assert metrics_row(report)["tokens_in_cache_write"] == 6


def test_retry_after_reads_seconds_dates_and_milliseconds_and_caps_them():
    assert retry_after({"Retry-After": "3"}) == 3.0
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:05 GMT"}, now=1445412480.0) == 5.0
    assert retry_after({"Retry-After": "99999"}) == 300.0
    assert retry_after({"Retry-After": "soon"}) is None and retry_after({}) is None
    assert [backoff(a, rng=lambda: 1.0) for a in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_the_rate_limit_is_shared_through_its_file_and_waits_for_the_refill(tmp_path):
    now = [1000.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    one = HostRateLimit(
        "e", requests_per_minute=2, tokens_per_minute=600, folder=tmp_path, clock=lambda: now[0], sleep=sleep
    )
    other = HostRateLimit(
        "e", requests_per_minute=2, tokens_per_minute=600, folder=tmp_path, clock=lambda: now[0], sleep=sleep
    )
    one.acquire(100)
    other.acquire(100)  # the second of two requests a minute, from another process's limiter over the same file
    assert waits == []
    one.acquire(100)  # a third waits for one request's refill: 30 s
    assert waits == [pytest.approx(30.0)]
    other.settle(100, 500)  # the response said it cost 500 tokens: the bucket is debited the difference
    other.acquire(400)
    assert waits[-1] > 0 and one.waited + other.waited == pytest.approx(sum(waits))


def test_settings_refuse_credentials_in_the_url_and_price_a_run():
    with pytest.raises(ValueError, match="credentials"):
        EndpointOptions(url="https://user:secret@api.example.com/v1", model="m")
    with pytest.raises(ValueError, match="environment variable"):
        EndpointOptions(url="https://api.example.com/v1", model="m", api_key_env="sk-live-123")
    assert Price(input=0.5, output=1.5).cost(2_000_000, 1_000_000) == pytest.approx(2.5)


def test_the_config_takes_an_endpoint_without_a_model_and_refuses_what_no_request_can_carry():
    from lakescore.jobs.config import ConfigError, load_config

    base = {
        "task": "generate",
        "input": "in",
        "output": "out",
        "id_col": "id",
        "text_col": "body",
        "generate.endpoint.url": "https://api.example.com/v1",
        "generate.endpoint.model": "m",
    }
    cfg = load_config(flags=base)
    cfg.require_for_scoring()  # no model.source: the endpoint's model is the server's
    with pytest.raises(
        ConfigError, match="generate.choices is refused over an endpoint: a choice's log-probability given the prompt"
    ):
        load_config(flags={**base, "generate.choices": ["yes", "no"]})
    with pytest.raises(ConfigError, match="exclude each other"):
        load_config(flags={**base, "generate.server.engine": "vllm"})
    with pytest.raises(ConfigError, match="min_new_tokens 9 exceeds generate.max_new_tokens 4"):
        load_config(flags={**base, "generate.min_new_tokens": 9, "generate.max_new_tokens": 4})
    with pytest.raises(ConfigError, match="generate.endpoint.model"):
        load_config(flags={k: v for k, v in base.items() if k != "generate.endpoint.model"})


def test_the_spec_identity_names_the_model_not_how_it_is_called_and_keeps_older_digests():
    plain = GenerateOptions(max_new_tokens=8)
    assert set(plain.identity()) == {
        "prompt_template",
        "system_prompt",
        "chat_template",
        "max_new_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "truncate",
        "choices",
        "choice_score",
        "json_schema",
    }
    one = GenerateOptions(endpoint=EndpointOptions(url="https://a.example.com/v1", model="m", revision="7"))
    other = GenerateOptions(
        endpoint=EndpointOptions(
            url="https://b.example.com/v1",
            model="m",
            revision="7",
            concurrency=64,
            api_key_env="KEY",
            price=Price(input=1, output=2),
        )
    )
    assert one.identity() == other.identity() and one.identity()["endpoint"] == {
        "model": "m",
        "api": "completions",
        "revision": "7",
    }
    assert GenerateOptions(top_k=5).identity()["top_k"] == 5


def test_the_head_dead_letters_a_failed_row_alone_and_stops_on_a_dead_endpoint(server):
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.remote.generate import EndpointGenerator

    script, url = server
    script.answers = [
        _ok('{"stars": 3}'),
        (400, {}, {"error": {"message": "prompt too long"}}),
        _ok("not json"),
        _ok('{"sta', "length"),
    ]
    options = GenerateOptions(max_new_tokens=4, json_schema='{"type": "object", "required": ["stars"]}')
    settings = EndpointOptions(url=url, model="tiny", concurrency=1)  # one at a time: the script's order is the rows'
    head = EndpointGenerator(EndpointClient(settings, url, "tiny"), options, get_task("generate").output_arrow_types)
    assert (
        head.listing == '{"answered":true,"entry":{"created":1,"id":"tiny","object":"model"}}'
        and len(head.sha256) == 64
    )
    assert head.files == {"/v1/models": head.listing} and head.is_current()
    script.models = {"data": [{"id": "tiny", "object": "model", "created": 2}]}
    assert not head.is_current()  # the model cache loads the head again, under the new identity
    script.models = None
    assert (
        EndpointGenerator(
            EndpointClient(settings, url, "tiny"), options, get_task("generate").output_arrow_types
        ).listing
        == '{"answered":false}'
    )
    scored = head.score_prompts(["a", "b", None, "c", "d"], None)
    # A text that is not the schema's JSON is never published: its own reason, the text kept in the error (issue 65).
    assert scored.reasons == [None, "endpoint_error", "null_input", "json_invalid", "json_incomplete"]
    assert scored.outputs[0].text == '{"stars": 3}' and scored.errors[1] == "HTTP 400: prompt too long"
    assert scored.errors[3].startswith("the text is not JSON valid against generate.json_schema: ")
    assert scored.errors[3].endswith("; the text: not json")
    assert (
        scored.errors[4]
        == 'the text reached max_new_tokens (2 tokens) before its JSON was complete; the cut text: {"sta'
    )
    columns = head.columns(scored.outputs, scored.ok)
    assert columns[0].to_pylist() == ['{"stars": 3}', None, None, None, None]
    assert columns[3].to_pylist() == [2, None, None, None, None]

    script.answers = [(503, {}, {"error": {"message": "down"}})]
    dead = EndpointGenerator(
        EndpointClient(
            EndpointOptions(url=url, model="tiny", max_retries=0, max_consecutive_failures=2),
            url,
            "tiny",
            sleep=lambda s: None,
        ),
        options,
        get_task("generate").output_arrow_types,
    )
    with pytest.raises(
        EndpointDown, match=r"failed [2-4] requests in a row; last: HTTP 503: down"
    ):  # 2 and those in flight
        dead.score_prompts(["a", "b", "c", "d"], None)


def test_the_models_listing_is_canonical_and_leaves_out_what_each_answer_makes_afresh():
    import email.utils

    from lakescore.udfs.remote.client import Reply
    from lakescore.udfs.remote.generate import endpoint_identity, models_listing

    now = 1_800_000_000
    date = {"date": email.utils.formatdate(now, usegmt=True)}
    entry = {"id": "m", "object": "model", "created": 1_700_000_000, "owned_by": "équipe", "max_model_len": 4096}
    listing = models_listing(Reply({"object": "list", "data": [{"id": "other"}, entry]}, date), "m")
    assert listing == (
        '{"answered":true,"entry":{"created":1700000000,"id":"m","max_model_len":4096,"object":"model",'
        '"owned_by":"équipe"}}'
    )
    assert models_listing(Reply({"data": [dict(reversed(list(entry.items())))]}, date), "m") == listing  # any order
    # vLLM's and SGLang's entries: created is the answer's own time, a permission's id and time are drawn per answer
    first = {
        **entry,
        "created": now - 1,
        "permission": [{"id": "modelperm-1", "created": now - 1, "allow_logprobs": True}],
    }
    second = {**entry, "created": now, "permission": [{"id": "modelperm-2", "created": now, "allow_logprobs": True}]}
    one, two = (models_listing(Reply({"data": [e]}, date), "m") for e in (first, second))
    assert one == two and json.loads(one)["entry"] == {
        "id": "m",
        "object": "model",
        "owned_by": "équipe",
        "max_model_len": 4096,
        "permission": [{"allow_logprobs": True}],
    }
    # what a server says differently of the model is another identity
    moved = models_listing(Reply({"data": [{**entry, "owned_by": "team-b"}]}, date), "m")
    assert moved != listing and endpoint_identity("m", moved, None) != endpoint_identity("m", listing, None)
    assert endpoint_identity("m", listing, "v7") != endpoint_identity("m", listing, None)
    assert models_listing(None, "m") == '{"answered":false}'  # 404, an error, or no JSON: recorded as not answered
    assert models_listing(Reply({"data": [{"id": "other"}]}, date), "m") == '{"answered":true,"entry":null}'


def test_log_probabilities_are_asked_for_in_each_api_and_read_from_each_answer(server):
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.remote.answers import EndpointRefused
    from lakescore.udfs.remote.generate import EndpointGenerator

    options = GenerateOptions(max_new_tokens=4, logprobs=True)
    assert request_body(options, "m", "completions", "p")["logprobs"] == 1  # the chosen token's, and the top one's
    assert request_body(options, "m", "chat", "p")["logprobs"] is True
    assert "logprobs" not in request_body(GenerateOptions(), "m", "chat", "p")
    completions = {
        "choices": [
            {
                "text": "ab",
                "finish_reason": "stop",
                "logprobs": {
                    "tokens": ["a", "b"],
                    "token_logprobs": [-0.5, -1.25],
                    "top_logprobs": [{"a": -0.5}, {"c": -1.0}],
                },
            }
        ]
    }
    assert parse_completion(completions, "completions").token_logprobs == (-0.5, -1.25)
    chat = {
        "choices": [
            {
                "message": {"content": "ab"},
                "finish_reason": "stop",
                "logprobs": {
                    "content": [
                        {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []},
                        {"token": "b", "logprob": -1.25, "bytes": [98], "top_logprobs": []},
                    ]
                },
            }
        ]
    }
    assert parse_completion(chat, "chat").token_logprobs == (-0.5, -1.25)
    assert (
        parse_completion(
            {"choices": [{"text": "ab", "finish_reason": "stop", "logprobs": None}]}, "completions"
        ).token_logprobs
        is None
    )

    script, url = server
    types = get_task("generate").output_arrow_types_for(options)
    settings = EndpointOptions(url=url, model="tiny", concurrency=1)
    script.answers = [(200, {}, completions)]
    head = EndpointGenerator(EndpointClient(settings, url, "tiny"), options, types)
    scored = head.score_prompts(["a", None], None)
    assert head.columns(scored.outputs, scored.ok)[5].to_pylist() == [[-0.5, -1.25], None]
    assert script.seen[-1]["logprobs"] == 1
    script.answers = [_ok()]  # a server that takes the field and returns none: refused before any row
    with pytest.raises(
        EndpointRefused, match=r"\(model tiny\) does not honour generate.logprobs: the response holds no "
    ):
        head.score(["lakescore preflight"])


def _head(url, options=None, **settings):
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.remote.generate import EndpointGenerator

    options = options or GenerateOptions(max_new_tokens=8)
    client = EndpointClient(EndpointOptions(url=url, model="tiny", **settings), url, "tiny", sleep=lambda s: None)
    return EndpointGenerator(client, options, get_task("generate").output_arrow_types_for(options))


def test_an_answer_is_published_only_when_it_is_whole_and_well_formed(server):
    """The probe's bad answers (issue 57): a filtered empty text, no usage, impossible usage. Before: published as
    ``("", "stop")``, as 0 and 0 tokens, and as -7 and 999999 tokens."""
    script, url = server
    filtered = (
        200,
        {},
        {
            "choices": [{"text": "", "finish_reason": "content_filter"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 0},
        },
    )
    unmetered = (200, {}, {"choices": [{"text": "no usage", "finish_reason": "stop"}]})
    impossible = (
        200,
        {},
        {
            "choices": [{"text": "x", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": -7, "completion_tokens": 999999},
        },
    )
    too_many = (
        200,
        {},
        {
            "choices": [{"text": "x", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 999999},
        },
    )
    empty = (
        200,
        {},
        {"choices": [{"text": "", "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    )
    script.answers = [filtered, unmetered, impossible, too_many, empty]
    head = _head(url, concurrency=1, max_retries=0)  # one at a time: the script's order is the rows'
    scored = head.score_prompts(["a", "b", "c", "d", "e"], None)
    assert scored.reasons == ["endpoint_unfinished", None, "endpoint_error", "endpoint_error", None]
    assert scored.errors[0] == "HTTP 200: the server ended the answer with finish_reason 'content_filter'"
    assert (
        "impossible (prompt_tokens -7)" in scored.errors[2]
        and "999999 completion tokens, 8 allowed" in scored.errors[3]
    )
    text, finish, prompt_tokens, completion_tokens = (
        c.to_pylist() for c in head.columns(scored.outputs, scored.ok)[:4]
    )
    assert (text[1], finish[1], prompt_tokens[1], completion_tokens[1]) == (
        "no usage",
        "stop",
        None,
        None,
    )  # unknown, not 0
    assert (text[4], finish[4], prompt_tokens[4], completion_tokens[4]) == (
        "",
        "stop",
        3,
        1,
    )  # a model that stops at once
    stats = head.client.stats
    assert (stats.traffic.tokens_in, stats.traffic.tokens_out, stats.traffic.unmetered) == (
        3,
        1,
        1,
    )  # nothing impossible billed; one unmetered
    assert head.client.breaker.failures == 0  # the empty answer last: a good answer resets the breaker


def test_a_malformed_answer_counts_toward_the_circuit_breaker(server):
    """A gateway that answers 200 with a body that is no OpenAI answer stops the run after the bound, as bad JSON does
    (before: every row's request went out)."""
    script, url = server
    script.answers = [(200, {}, {"status": "ok", "result": "a gateway's own page"})]
    head = _head(url, concurrency=1, max_consecutive_failures=3)
    with pytest.raises(
        EndpointDown, match=r"failed 3 requests in a row; last: HTTP 200: a malformed answer: the response "
    ):
        head.score_prompts([str(i) for i in range(20)], None)
    assert len(script.seen) == 3


def test_a_server_that_echoes_the_request_headers_never_puts_the_key_in_an_error(server):
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.remote.client import scrub
    from lakescore.udfs.remote.generate import EndpointGenerator

    script, url = server
    script.echo_headers = True
    options = GenerateOptions(max_new_tokens=4)
    client = EndpointClient(EndpointOptions(url=url, model="tiny"), url, "tiny", api_key=KEY, sleep=lambda s: None)
    head = EndpointGenerator(client, options, get_task("generate").output_arrow_types)
    scored = head.score_prompts(["a"], None)
    assert script.auth == [f"Bearer {KEY}"] and scored.reasons == ["endpoint_error"]
    assert KEY not in scored.errors[0] and "'Authorization': '***'" in scored.errors[0]
    # any Authorization value or bearer token, whatever key it is
    assert (
        scrub('{"authorization": "Bearer other-token"} and bearer xyz.abc') == '{"authorization": "***"} and bearer ***'
    )
    assert scrub("Authorization: Basic dXNlcjpwYXNz") == "Authorization: ***"
    assert scrub("a key k-1 twice k-1", ("k-1",)) == "a key *** twice ***"


def test_the_preflight_says_what_happened(server):
    """Rate limited, timed out and malformed are worded as such (before: all three "refused the run's settings")."""
    from lakescore.udfs.remote.answers import EndpointRefused

    script, url = server
    script.answers = [(429, {"Retry-After": "0"}, {"error": {"message": "slow down"}})]
    with pytest.raises(
        EndpointRefused, match=r"\(model tiny\) rate limited the preflight's request \(429 after 1 retries\)"
    ):
        _head(url, max_retries=1).score(["p"])
    script.answers = [(200, {}, {"unexpected": True})]
    with pytest.raises(
        EndpointRefused, match=r"answered the preflight's request with a malformed answer: the response holds"
    ):
        _head(url).score(["p"])
    script.answers = [(400, {}, {"error": {"message": "top_k is not supported"}})]
    with pytest.raises(EndpointRefused, match=r"refused the run's settings: HTTP 400: top_k is not supported"):
        _head(url).score(["p"])
    script.answers, script.delay = [_ok()], 1.0
    with pytest.raises(EndpointRefused, match=r"timed out on the preflight's request \(0 retries\)"):
        _head(url, timeout_s=0.2, max_retries=0).score(["p"])


def test_a_key_typed_into_api_key_env_is_refused_before_compute_and_never_echoed(tmp_path):
    """Before: ``sk_live_...`` is a valid variable name, accepted, echoed on the console and written into the report."""
    import subprocess
    import sys

    from lakescore.jobs.config import ConfigError, load_config

    typed = "sk_live_51HqLakescoreNotAName0123"
    flags = {
        "input": str(tmp_path / "in"),
        "output": str(tmp_path / "out"),
        "task": "generate",
        "id_col": "id",
        "generate.prompt_template": "{x}",
        "generate.endpoint.url": "https://a.example.com/v1",
        "generate.endpoint.model": "m",
    }
    assert load_config(flags={**flags, "generate.endpoint.api_key_env": "LLM_API_KEY"}).secret_env_names() == (
        "LLM_API_KEY",
    )
    for value in (typed, "hf_abcdefghijklmnopqrstuvwxyz0123", "sk-live-51Hq", "A" * 65):
        with pytest.raises(ConfigError) as refused:
            load_config(flags={**flags, "generate.endpoint.api_key_env": value})
        assert value not in str(refused.value) and "is not shown here" in str(refused.value)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lakescore.jobs.cli",
            "score",
            "--input",
            flags["input"],
            "--output",
            flags["output"],
            "--task",
            "generate",
            "--id-col",
            "id",
            "--set",
            "generate.prompt_template={x}",
            "--set",
            "generate.endpoint.url=https://a.example.com/v1",
            "--set",
            "generate.endpoint.model=m",
            "--set",
            f"generate.endpoint.api_key_env={typed}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "api_key_env must name the environment variable" in run.stderr
    assert typed not in run.stdout + run.stderr and not (tmp_path / "out").exists()


def test_the_session_lakescore_builds_hides_the_keys_variable():
    import re

    from lakescore.jobs.platform.spark.session import SPARK_REDACTION_DEFAULT, redaction_regex

    assert not re.search(SPARK_REDACTION_DEFAULT, "spark.executorEnv.LLM_API_KEY")  # Spark's default shows it
    hidden = redaction_regex(None, ["LLM_API_KEY"])
    assert re.search(hidden, "spark.executorEnv.LLM_API_KEY") and re.search(hidden, "spark.ssl.keyPassword")
    assert not re.search(hidden, "spark.executorEnv.LLM_API_KEY_HINT") and not re.search(hidden, "spark.app.name")
    assert redaction_regex("(?i)mine", ["K"]).startswith("(?i)mine|") and redaction_regex(None, []) is None
    # the warning for a session lakescore did not build: tests/integration/test_endpoint_job.py, on a real session


def test_a_head_the_model_cache_drops_is_closed_and_its_threads_and_connections_with_it(server):
    """Before: ``EndpointGenerator.close()`` was never called; a dropped head's pool and connections stayed open for
    the worker's life."""
    from lakescore.udfs.heads.protocol import HoldsResources, MetersTraffic, ServedElsewhere
    from lakescore.udfs.models import model_cache
    from lakescore.udfs.models.model_cache import LoadedModel

    _script, url = server
    head = _head(url, concurrency=2)
    assert isinstance(head, ServedElsewhere) and isinstance(head, HoldsResources) and isinstance(head, MetersTraffic)
    assert head.score_prompts(["a", "b"], None).reasons == [None, None]
    assert head.traffic().as_dict() == {
        "requests": 2,
        "retries": 0,
        "rate_limited": 0,
        "unmetered": 0,
        "tokens_in": 6,
        "tokens_in_cached": 0,
        "tokens_in_cache_write": 0,
        "tokens_out": 4,
        "audio_ms": 0,
    }
    key = object()
    model_cache._cache[key] = LoadedModel(head, None, head.sha256, None, head.files)
    model_cache.clear()  # what the worker's exit runs too (atexit)
    assert head.pool._shutdown and head.client.http.is_closed


def test_the_conf_examples_the_docs_name_exist_load_and_say_what_the_docs_show():
    """Before: docs/generation.md named conf/reviews-endpoint.yaml and conf/reviews-vllm.yaml, which did not exist."""
    import re
    from pathlib import Path

    from lakescore.jobs.config import load_config

    repo = Path(__file__).resolve().parents[2]
    shown = re.findall(r"```yaml\n# (conf/[\w.-]+\.yaml)\n(.*?)```", (repo / "docs/generation.md").read_text(), re.S)
    assert {path for path, _ in shown} == {
        "conf/reviews-endpoint.yaml",
        "conf/reviews-vllm.yaml",
        "conf/reviews-batch.yaml",
    }
    for path, body in shown:
        assert (repo / path).read_text().split("\n", 1)[1] == body, path
        cfg = load_config(repo / path)
        assert (cfg.generate.endpoint or cfg.generate.server) is not None
    assert load_config(repo / "conf/reviews-endpoint.yaml").secret_env_names() == ("LLM_API_KEY",)


def test_the_preflights_requests_are_in_the_runs_figures_and_a_cost_without_usage_says_it_is_incomplete():
    """Before: the preflight's requests and tokens were left out of the run's figures and cost, and answers without
    ``usage`` were billed as 0 tokens with nothing said."""
    from lakescore.jobs.cost import SessionResources, cost_text, run_cost
    from lakescore.jobs.steps.account import _worker_totals
    from lakescore.schemas.output import WORKER_METRICS

    group = dict.fromkeys(WORKER_METRICS.fieldNames(), 0)
    group.update(arrow_batches=2, tokens_in=30, tokens_out=20, requests=10, retries=1, unmetered=2)
    preflight = {"requests": 2, "retries": 0, "rate_limited": 0, "unmetered": 0, "tokens_in": 6, "tokens_out": 4}
    workers = _worker_totals([group], 10, 0, preflight)
    assert (workers["requests"], workers["tokens_in"], workers["tokens_out"], workers["unmetered"]) == (12, 36, 24, 2)
    assert workers["preflight"] == preflight
    assert "preflight" not in _worker_totals([group], 10, 0, {}) and _worker_totals([group], 10, 0)["requests"] == 10
    price = Price(input=2.0, output=10.0)
    cost = run_cost(
        seconds=10,
        stage_seconds=5,
        worker_seconds=4,
        rows_scored=10,
        resources=SessionResources(2, 2, 1),
        token_cost=price.cost(36, 24),
        token_cost_unmetered=workers["unmetered"],
    )
    assert cost["token_cost"] == pytest.approx(3.12e-4) and cost["token_cost_unmetered"] == 2
    assert cost_text(cost).endswith("the endpoint's tokens (incomplete: 2 answers had no usage)")


def test_the_preflight_reads_the_models_listing_and_sends_its_paid_request_only_when_asked(server):
    """Before: every preflight task sent its sample to the endpoint, even for a run with nothing to score (an unchanged
    incremental rerun). Now its first part only reads ``/v1/models``; the driver asks for the probe once rows will be
    scored (:meth:`~lakescore.jobs.steps.served_model.ServedModel.probe`), and that probe's request is counted."""
    import pyarrow as pa

    from lakescore.udfs.models import model_cache
    from lakescore.udfs.models.model_source import ModelSpec
    from lakescore.udfs.scoring_udf import make_preflight_function

    script, url = server
    options = GenerateOptions(max_new_tokens=8, endpoint=EndpointOptions(url=url, model="tiny"))
    spec = ModelSpec("generate", None, generate=options)
    rows = [pa.record_batch({"id": pa.array([0])})]
    try:
        (listed,) = list(make_preflight_function(spec, probe=False)(iter(rows))).pop().to_pylist()
        assert listed["error"] is None and listed["probed"] is False and listed["sha256"]
        assert script.seen == [] and json.loads(listed["files"])  # /v1/models read, no paid request
        (probed,) = list(make_preflight_function(spec)(iter(rows))).pop().to_pylist()
        assert probed["error"] is None and probed["probed"] is True and probed["sha256"] == listed["sha256"]
        assert len(script.seen) == 1 and json.loads(probed["traffic"])["requests"] == 1
    finally:
        model_cache.clear()


def test_the_requests_counted_are_the_requests_the_server_received():
    """Before: an attempt that never reached the server (a kept-alive connection the server closed as the request
    came, its idle timeout racing the request, as uvicorn's does after a pause) was counted as a request and a retry,
    so the run's figures exceeded what the server saw (issue 57: 45 against 40, 50 against 49)."""
    import select

    received: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers answer

        def log_message(self, *args):
            pass

        def handle(self):  # one answer per connection; the next request finds the connection closing, unread
            self.handle_one_request()
            select.select([self.connection], [], [], 2.0)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append(1)
            data = json.dumps(_ok()[2]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.handle_error = lambda *args: None
    httpd.block_on_close = False  # a connection no request came back to waits out its select: not the test's time
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        head = _head(f"http://127.0.0.1:{httpd.server_address[1]}/v1", concurrency=2, max_consecutive_failures=100)
        scored = head.score_prompts([f"row {i}" for i in range(8)], None)
        counts = head.traffic().as_dict()
        head.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert scored.reasons == [None] * 8
    assert counts["requests"] == len(received) == 8 and counts["retries"] == 0


def test_a_row_the_endpoint_failed_is_scored_again_and_a_row_s_own_failure_is_carried():
    # Every reason an endpoint's failure is dead-lettered with may be the server's (a 5xx, a timeout, a refused
    # connection, a rate limit outlasting its retries, an aborted answer): an incremental run never carries it.
    for error in (
        EndpointError(503, "overloaded"),
        EndpointError(None, "timed out", "timeout"),
        EndpointError(429, "slow down"),
        Unfinished("abort"),
    ):
        assert error.reason in SERVER_REASONS and not carries(error.reason)
    # A row's own failure fails again on the same input, weights and spec: carried. The id's are found from the input.
    for reason in (
        "null_input",
        "invalid_text",
        "prepare_error",
        "prompt_too_long",
        "too_many_chunks",
        "scoring_error",
        "generation_error",
        "bad_feature_value",
        "invalid_image",
        "image_too_large",
        "missing_file",
    ):
        assert carries(reason), reason
    assert not carries("null_id") and not carries("duplicate_id")


def test_a_model_the_server_does_not_serve_is_named_with_what_it_lists(server):
    """Issue 65: a wrong ``embed.endpoint.model`` answered 404 was followed by a hint about truncate_prompt_tokens; the
    preflight's line now says the endpoint does not serve the model and names what ``/v1/models`` lists."""
    from lakescore.udfs.registry import get_task
    from lakescore.udfs.remote.answers import EndpointRefused
    from lakescore.udfs.remote.embed import EndpointEmbedder
    from lakescore.udfs.remote.generate import EndpointGenerator

    script, url = server
    script.answers = [(404, {}, {"error": {"message": "The model `nope` does not exist.", "code": 404}})]
    settings = EndpointOptions(url=url, model="nope", max_retries=0)
    embedder = EndpointEmbedder(EndpointClient(settings, url, "nope"), truncate_to=128)
    with pytest.raises(EndpointRefused) as refused:
        embedder.score(["a text"])
    assert str(refused.value) == (
        f"endpoint {url} (model nope) does not serve the model 'nope' (the preflight's request: "
        "HTTP 404: The model `nope` does not exist.); it lists tiny"
    )
    generator = EndpointGenerator(
        EndpointClient(settings, url, "nope"),
        GenerateOptions(max_new_tokens=4),
        get_task("generate").output_arrow_types,
    )
    with pytest.raises(
        EndpointRefused,
        match=r"does not serve the model 'nope' \(the preflight's request: HTTP 404: .*\); it lists tiny$",
    ):
        generator.score(["a prompt"])
    script.answers = [(400, {}, {"error": {"message": "input too long"}})]  # any other refusal keeps its own hint
    with pytest.raises(EndpointRefused, match="truncate_prompt_tokens 128"):
        embedder.score(["a text"])
