"""Provider batch files (issue 67): each row's line equals the per-row request, ids are stable, files stay within
both limits, every kind of result line is classified as the provider's contract says, and the render, download and
result stages map lines back to rows whatever their order: pure functions over Arrow, no Spark, no server."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from lakescore.jobs.config import ConfigError, load_config
from lakescore.udfs.batch_udfs import (
    CUSTOM_ID,
    LINE,
    OUTCOME_SCHEMA,
    make_download_function,
    make_render_function,
    make_result_function,
    outcome_column,
)
from lakescore.udfs.options.generate import GenerateOptions
from lakescore.udfs.registry import get_task
from lakescore.udfs.remote.batch_files import (
    DEAD,
    RESULT,
    RETRY,
    absent,
    batch_errors,
    batch_line,
    canonical,
    classify,
    custom_id,
    cut_files,
    next_step,
    parse_jsonl,
    part_digest,
    request_path,
    split_helps,
)
from lakescore.udfs.remote.batch_kinds import OpenAIBatches
from lakescore.udfs.remote.completions import request_body
from lakescore.udfs.remote.embed import EmbedLines
from lakescore.udfs.remote.generate import GenerateLines, row_body

ENDPOINT = {"url": "http://127.0.0.1:1/v1", "model": "m", "api": "chat", "batch": {"max_requests_per_file": 2}}


def _options(**settings) -> GenerateOptions:
    return GenerateOptions(**{"endpoint": ENDPOINT, **settings})


def test_line_body_is_the_per_row_request_and_ids_are_stable() -> None:
    options = _options(
        temperature=0.7, seed=3, stop=["\n"], max_new_tokens=9, system_prompt="be brief", json_schema={"type": "object"}
    )
    from lakescore.udfs.heads.seeds import row_seed

    body = row_body(options, "m", "chat", "hello", "42")
    assert body == request_body(options, "m", "chat", "hello", row_seed(3, "42"))
    line_id = custom_id("42", canonical(body))
    line = json.loads(batch_line(line_id, request_path(ENDPOINT["url"], "chat"), canonical(body)))
    assert line == {
        "custom_id": custom_id("42", canonical(body)),
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": body,
    }
    assert custom_id("42", canonical(body)) == custom_id("42", canonical(dict(reversed(list(body.items())))))
    assert custom_id("42", canonical(body)) != custom_id("43", canonical(body))
    other = row_body(options.model_copy(update={"max_new_tokens": 10}), "m", "chat", "hello", "42")
    assert custom_id("42", canonical(body)) != custom_id("42", canonical(other))  # another request: another id
    assert len(custom_id("42", canonical(body))) <= 64


@pytest.mark.parametrize("max_requests,max_bytes", [(3, 10_000), (1000, 95), (4, 70), (1, 31)])
def test_files_stay_within_both_limits_in_order(max_requests: int, max_bytes: int) -> None:
    rng = random.Random(7)
    lines = [(f"id{i}", b"x" * rng.randint(1, 30)) for i in range(50)]
    files = list(cut_files(lines, max_requests, max_bytes))
    assert [line for f in files for line in f] == lines
    assert all(len(f) <= max_requests and sum(len(b) for _, b in f) <= max_bytes for f in files)
    # a file is cut only when the next line would not fit it
    for f, following in zip(files, files[1:]):
        assert len(f) == max_requests or sum(len(b) for _, b in f) + len(following[0][1]) > max_bytes
    with pytest.raises(ValueError, match="more than a file"):
        list(cut_files([("big", b"x" * 100)], 10, 99))


def test_part_digest_names_round_and_lines() -> None:
    assert part_digest("k", 0, ["a", "b"]) == part_digest("k", 0, ["a", "b"])
    assert (
        len(
            {
                part_digest("k", 0, ["a", "b"]),
                part_digest("k", 1, ["a", "b"]),
                part_digest("k", 0, ["a"]),
                part_digest("j", 0, ["a", "b"]),
            }
        )
        == 4
    )


def test_result_lines_classified_as_the_contract_says() -> None:
    ok = {"custom_id": "a", "response": {"status_code": 200, "body": {"choices": [{"text": "hi"}]}}, "error": None}
    assert classify(ok) == classify(ok) and classify(ok).kind == RESULT and json.loads(classify(ok).body)["choices"]
    for status in (408, 429, 500, 503):
        assert (
            classify(
                {
                    "custom_id": "a",
                    "response": {"status_code": status, "body": {"error": {"message": "busy"}}},
                    "error": None,
                }
            ).kind
            == RETRY
        )
    expired = classify({"custom_id": "a", "response": None, "error": {"code": "batch_expired", "message": "late"}})
    assert (expired.kind, expired.message) == (RETRY, "batch_expired: late")
    refused = classify(
        {
            "custom_id": "a",
            "response": {
                "status_code": 400,
                "body": {"error": {"message": "max_tokens is too large", "code": "invalid_value"}},
            },
            "error": None,
        }
    )
    assert (refused.kind, refused.status, refused.message) == (DEAD, 400, "invalid_value: max_tokens is too large")
    assert absent("completed").kind == RETRY and "absent" in absent("completed").message
    assert "expired" in absent("expired").message
    assert [next_step(k, r, 2) for k, r in [(RESULT, 0), (DEAD, 0), (RETRY, 0), (RETRY, 1), (RETRY, 2)]] == [
        "done",
        "done",
        "resend",
        "resend",
        "dead",
    ]
    with pytest.raises(ValueError, match="no custom_id"):
        parse_jsonl('{"response": {}}\n')


def test_batch_settings_are_bounded_and_refuse_what_cannot_work() -> None:
    for wrong in (
        {"max_requests_per_file": 0},
        {"completion_window": "1h"},
        {"poll_interval": 5},
        {"max_bytes_per_file": 10},
    ):
        with pytest.raises(ValueError):  # pydantic's ValidationError, which the config loader words as one line
            GenerateOptions(endpoint={**ENDPOINT, "batch": wrong})
    base = [
        "task=generate",
        "input=in",
        "output=out",
        "id_col=id",
        "text_col=t",
        f"generate.endpoint={json.dumps(ENDPOINT)}",
    ]
    cfg = load_config(None, base)
    assert cfg.provider_batch and cfg.endpoint().batch.max_bytes_per_file == 200 * 1024 * 1024
    assert cfg.endpoint().batch.wait and cfg.endpoint().batch.max_resubmits == 3
    with pytest.raises(ConfigError, match="rank"):
        load_config(None, [*base, "rank.by=[t]", "rank.order_by=finish_reason", "rank.keep=1"])
    with pytest.raises(ConfigError, match="dedup"):
        load_config(None, [*base, "scoring.dedup=on"])


def _rendered(options, prompts, keys, max_bytes=10_000) -> pa.RecordBatch:
    schema = pa.schema([("id", pa.string()), ("prompt", pa.string())])
    out = schema.append(pa.field(CUSTOM_ID, pa.string())).append(pa.field(LINE, pa.binary()))
    lines = GenerateLines(
        options,
        "m",
        "chat",
        tuple(get_task("generate").output_arrow_types_for(options)),
        OpenAIBatches("chat", "/v1/chat/completions"),
    )
    render = make_render_function(lines, OpenAIBatches("chat", "/v1/chat/completions"), "prompt", "id", out, max_bytes)
    return next(render(iter([pa.record_batch([pa.array(keys), pa.array(prompts)], schema=schema)])))


def test_render_download_result_map_every_line_back_whatever_the_order() -> None:
    """Lines rendered, answered out of order with an error line, an absent line and a refused one: each row gets its
    own answer or the reason, and the tokens of the answers only."""
    options = _options(max_new_tokens=5)
    rendered = _rendered(options, ["p0", None, "p2", "p3", "p4", "p5"], ["0", "1", "2", "3", "4", "5"])
    ids = rendered.column(CUSTOM_ID).to_pylist()
    assert ids[1] is None and rendered.column(LINE)[1].as_py() is None and len(set(ids)) == 6
    lines = [json.loads(rendered.column(LINE)[i].as_py()) for i in (0, 2, 3, 4, 5)]
    assert lines[0]["body"]["messages"][-1]["content"] == "p0"

    def answer(line, text):
        return {
            "custom_id": line["custom_id"],
            "error": None,
            "response": {
                "status_code": 200,
                "body": {
                    "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2},
                },
            },
        }

    output = [answer(lines[3], "four"), answer(lines[0], "zero")]  # shuffled

    def failed(line, status, message):
        return {
            "custom_id": line["custom_id"],
            "error": None,
            "response": {"status_code": status, "body": {"error": {"message": message}}},
        }

    # the error file names an answered line too: the output's line wins, whichever file is read first
    errors = [failed(lines[1], 500, "oops"), failed(lines[2], 400, "bad"), failed(lines[0], 500, "late")]
    files = {"out": list(map(json.dumps, output)), "err": list(map(json.dumps, errors))}
    read: list[str] = []

    class Files:  # the provider's files as the download stage reads them: line by line, as they stream in
        def content_lines(self, file_id):
            for line in files[file_id]:
                read.append(file_id)
                yield line

        def scrub(self, text):
            return text

        def close(self):
            pass

    download = make_download_function(
        "http://x/v1",
        None,
        OpenAIBatches("chat", "/v1/chat/completions"),
        {"b1": {"status": "completed", "output_file_id": "out", "error_file_id": "err"}},
        client_factory=Files,
    )
    sent = [line["custom_id"] for line in lines]
    batch = pa.record_batch(
        [pa.array(sent), pa.array(["b1"] * 5), pa.array([0] * 5, pa.int32())], names=["custom_id", "batch_id", "round"]
    )
    outcomes = pa.Table.from_batches(list(download(iter([batch]))), schema=OUTCOME_SCHEMA).to_pylist()
    by_id = {o["custom_id"]: o for o in outcomes}
    assert len(outcomes) == len(by_id) == 5  # one outcome per line
    assert [by_id[i]["kind"] for i in sent] == [RESULT, RETRY, DEAD, RESULT, RETRY]
    assert read == ["out"] * 2 + ["err"] * 3  # each file read once, line by line
    assert "absent" in by_id[sent[4]]["message"]

    # the last round of each line, as the driver joins them: the 500 ended dead after its resubmissions
    final = {**by_id, sent[1]: {**by_id[sent[1]], "round": 3}}
    types = get_task("generate").output_arrow_types_for(options)
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    from lakescore.schemas.output import scored_schema

    out_schema = to_arrow_schema(scored_schema("generate", T.StructField("id", T.StringType())))
    lines = GenerateLines(options, "m", "chat", tuple(types), OpenAIBatches("chat", "/v1/chat/completions"))
    result = make_result_function(lines, "sha", ["id"], "prompt", types, out_schema, 10_000, 3)
    columns = {"id": rendered.column("id"), "prompt": rendered.column("prompt")}
    rows = [final.get(i) if i is not None else None for i in ids]
    for name, kind in (
        ("kind", pa.string()),
        ("status", pa.int32()),
        ("body", pa.string()),
        ("message", pa.string()),
        ("round", pa.int32()),
    ):
        columns[outcome_column(name)] = pa.array([None if r is None else r[name] for r in rows], kind)
    staged = pa.Table.from_batches(list(result(iter([pa.record_batch(list(columns.values()), names=list(columns))]))))
    staged = staged.to_pylist()
    assert [r["generated_text"] for r in staged] == ["zero", None, None, None, "four", None]
    assert [r["_reason"] for r in staged] == [
        None,
        "null_input",
        "endpoint_error",
        "endpoint_error",
        None,
        "endpoint_error",
    ]
    assert "bad" in staged[3]["_error"] and "4 times" in staged[2]["_error"] and "oops" in staged[2]["_error"]
    worker = staged[0]["_worker"]
    assert (worker["tokens_in"], worker["tokens_out"], worker["requests"], worker["retries"]) == (6, 4, 8, 3)


def test_a_line_larger_than_a_file_is_not_rendered() -> None:
    rendered = _rendered(_options(), ["x" * 500, "short"], ["0", "1"], max_bytes=300)
    assert rendered.column(LINE)[0].as_py() is None and rendered.column(LINE)[1].as_py() is not None


def test_a_batch_failed_for_a_limit_is_split_until_one_line_and_any_other_failure_is_refused_quoting_the_provider():
    from lakescore.jobs.steps.batch_ledger import BatchState
    from lakescore.jobs.steps.provider_batch import BatchRefused, _refuse_failed

    too_many = {
        "id": "batch_1",
        "status": "failed",
        "errors": {
            "object": "list",
            "data": [
                {
                    "code": "too_many_requests",
                    "line": None,
                    "param": None,
                    "message": "The input file holds 5 requests; at most 2 are allowed.",
                }
            ],
        },
    }
    said = batch_errors(too_many)
    assert said == "too_many_requests: The input file holds 5 requests; at most 2 are allowed."
    assert split_helps(said, 5) and split_helps("token_limit_exceeded: Enqueued token limit reached", 2)
    assert not split_helps(said, 1)  # one line cannot be halved
    assert not split_helps("mismatched_model: Every request in a batch must use the same model.", 4)
    assert batch_errors({"status": "failed", "errors": None}) is None and not split_helps(None, 9)
    _refuse_failed([BatchState("batch_1", 0, 5, "failed", message=said), BatchState("batch_2", 0, 3, "completed")])
    with pytest.raises(BatchRefused, match=r"failed batch batch_3 .*: file_too_large: The input file is 900 bytes"):
        _refuse_failed([BatchState("batch_3", 0, 1, "failed", message="file_too_large: The input file is 900 bytes")])
    with pytest.raises(BatchRefused, match="mismatched_model"):
        _refuse_failed([BatchState("batch_4", 0, 4, "failed", message="mismatched_model: one model per batch")])


def test_embed_lines_are_the_per_row_request_of_one_text_and_each_result_the_rows_normalised_vector() -> None:
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    from lakescore.schemas.output import scored_schema
    from lakescore.udfs.remote.embeddings import embeddings_body

    lines = EmbedLines("minilm", 128)
    assert lines.body("hello", "7") == embeddings_body("minilm", ["hello"], 128)  # what the per-row path sends
    assert request_path("http://h/v1", lines.api) == "/v1/embeddings"
    schema = pa.schema([("id", pa.string()), ("text", pa.string())])
    out = schema.append(pa.field(CUSTOM_ID, pa.string())).append(pa.field(LINE, pa.binary()))
    render = make_render_function(lines, OpenAIBatches("embeddings", "/v1/embeddings"), "text", "id", out, 10_000)
    rendered = next(render(iter([pa.record_batch([pa.array(["0", "1", "2"]), pa.array(["a b", "c", None])], schema)])))
    sent = [json.loads(line) for line in rendered.column(LINE).to_pylist() if line is not None]
    assert [line["body"]["input"] for line in sent] == [["a b"], ["c"]] and sent[0]["url"] == "/v1/embeddings"
    whole = {"object": "list", "data": [{"index": 0, "embedding": [3.0, 4.0]}], "usage": {"prompt_tokens": 4}}
    two = {"object": "list", "data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0]}]}
    types = get_task("embed").output_arrow_types_for(None)
    out_schema = to_arrow_schema(scored_schema("embed", T.StructField("id", T.StringType())))
    result = make_result_function(lines, "sha", ["id"], "body", types, out_schema, 10_000, 3)
    columns = {
        "id": rendered.column("id"),
        "body": rendered.column("text"),  # a row's own column may be named body
        outcome_column("kind"): pa.array([RESULT, RESULT, None]),
        outcome_column("status"): pa.array([200, 200, None], pa.int32()),
        outcome_column("body"): pa.array([json.dumps(whole), json.dumps(two), None]),
        outcome_column("message"): pa.array([None, None, None], pa.string()),
        outcome_column("round"): pa.array([0, 0, None], pa.int32()),
    }
    batch = pa.record_batch(list(columns.values()), names=list(columns))
    staged = pa.Table.from_batches(list(result(iter([batch])))).to_pylist()
    assert staged[0]["embedding"] == pytest.approx([0.6, 0.8]) and staged[0]["_reason"] is None
    assert staged[1]["embedding"] is None and "malformed" in staged[1]["_error"]  # two vectors for one text
    assert staged[2]["_reason"] == "null_input"
    worker = staged[0]["_worker"]
    assert (worker["tokens_in"], worker["tokens_out"], worker["requests"]) == (4, 0, 2)


def test_embed_endpoint_batch_is_a_provider_batch_run_priced_at_its_batch_share() -> None:
    embed = {"url": "http://127.0.0.1:1/v1", "model": "m", "price": {"input": 2.0}, "batch": {"wait": False}}
    base = ["task=embed", "input=in", "output=out", "id_col=id", "text_col=t", f"embed.endpoint={json.dumps(embed)}"]
    cfg = load_config(None, base)
    assert cfg.provider_batch and not cfg.endpoint().batch.wait and cfg.endpoint().price.batch == 0.5
    with pytest.raises(ConfigError, match="embed.endpoint.batch"):
        load_config(None, [*base, "scoring.dedup=on"])


def test_prefix_groups_are_ranges_of_the_sorted_prompts_of_about_a_file_each_and_files_never_mix_them() -> None:
    """A round's lines in prefix groups (issue 68's grouping, on the provider batch path): each group a contiguous range
    of the lines sorted by prompt (so a prefix's rows sit together across the round), within the file limit whatever
    the sample's error, and a file never holds two groups."""
    import random

    from lakescore.udfs.remote.batch_files import SAMPLES_PER_GROUP, cut_grouped, group_bounds, group_count, group_of

    rng = random.Random(7)
    # 2,000 documents asked 10 questions each: the rows of a document share a long prefix; in no order
    lines = [
        (f"Document {d:04d}: {'x' * 40}\nQuestion {q}", f"ls-{rng.getrandbits(64):016x}")
        for d in range(2000)
        for q in range(10)
    ]
    rng.shuffle(lines)
    groups = group_count(len(lines), 0, 1000, 10**9)
    every = max(1, len(lines) // (groups * SAMPLES_PER_GROUP))
    assert every > 1  # a sample, not every line
    sample = [(p, i) for p, i in lines if int(i[3:], 16) % every == 0]  # the ids choose it, as the stage's hash does
    bounds = group_bounds(sample, groups)
    assert len(bounds) == groups - 1
    placed = sorted((group_of(p, i, bounds), p, i) for p, i in lines)  # the stage: by group, then prompt, then id
    assert [(p, i) for _, p, i in placed] == sorted(lines)  # groups are ranges of the prompt order
    sizes = [sum(1 for g, _, _ in placed if g == k) for k in range(groups)]
    assert max(sizes) <= 1000 and min(sizes) > 0  # the sample's error within the headroom
    files = list(cut_grouped([(g, i, p.encode()) for g, p, i in placed], 1000, 10**9))
    assert len(files) == groups  # one file a group
    split = {p.split(":")[0] for f in files for p in (f[0][1].decode(), f[-1][1].decode())}
    documents = [{p.decode().split(":")[0] for _, p in f} for f in files]
    assert sum(len(d) for d in documents) <= 2000 + len(split)  # a document in one file, or in two across a bound
