"""``--task generate`` through ``generate.endpoint`` against a standalone vLLM server (CPU build) started once for the
module, on real Spark + Delta, serving a seeded random Llama (head_dim 64).

* every row scored; texts equal vLLM's own offline ``LLM.generate`` of the same prompts (greedy, same dtype and
  length); the share equal to transformers' in-process greedy is reported (a random model's near-ties may split);
  the ``token_logprobs`` column (``generate.logprobs``) filled from the server's log-probabilities;
* ``json_schema`` through ``response_format``: every published row validates, none dead-lettered.
"""

from __future__ import annotations

import json

import jsonschema
import pandas as pd
import pytest

from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from tests.engines.vllm_engine import (
    SERVE_ARGS,
    VllmServer,
    equal_texts,
    needs_vllm,
    offline_texts,
    start_offline_generate,
    vllm_processes,
)
from tests.integration.test_generate_job import _reference_texts
from tests.integration.test_score_job import read_output

pytestmark = needs_vllm

TEMPLATE = "Review: {body}\nSummary:"
NEW_TOKENS = 8
NAME = "tiny-llama"


def _reviews(n: int = 12) -> pd.DataFrame:
    from tests.tiny_generators import reviews

    return pd.DataFrame(list(enumerate(reviews(n, seed=7), start=1)), columns=["review_id", "body"])


@pytest.fixture(scope="module")
def vllm(vllm_llama_dir, module_tmp_path):
    """The server, and vLLM's offline texts of the module's prompts (computed while the server starts)."""
    prompts = [TEMPLATE.format(body=body) for body in _reviews()["body"]]
    offline_log = module_tmp_path / "offline.log"
    offline = start_offline_generate(vllm_llama_dir, prompts, NEW_TOKENS, offline_log)
    # JSON without free whitespace: a random model would fill max_new_tokens with the blanks JSON allows
    structured = '{"backend": "xgrammar", "disable_any_whitespace": true}'
    server = VllmServer(
        vllm_llama_dir,
        module_tmp_path / "vllm.log",
        NAME,
        args=(*SERVE_ARGS, "--structured-outputs-config", structured),
    )
    try:
        server.start()
        server.offline = offline_texts(offline, offline_log)
        yield server
    finally:
        server.stop()
        if offline.poll() is None:
            offline.kill()
    assert not [c for c in vllm_processes() if str(vllm_llama_dir) in c], "a vLLM process outlived its server"


def _config(source, output, url, **flags):
    return load_config(
        flags={
            "input": str(source),
            "output": str(output),
            "task": "generate",
            "id_col": "review_id",
            "generate.prompt_template": TEMPLATE,
            "generate.max_new_tokens": NEW_TOKENS,
            "spark.master": "local[2]",
            "generate.endpoint.url": url,
            "generate.endpoint.model": NAME,
            **flags,
        }
    )


def _write(spark, frame, path):
    spark.createDataFrame(frame, "review_id long, body string").write.format("delta").mode("overwrite").save(str(path))


def test_an_endpoint_run_gives_vllms_own_offline_texts_and_its_token_logprobs(spark, tmp_path, vllm, vllm_llama_dir):
    source, output = tmp_path / "reviews", tmp_path / "summaries"
    frame = _reviews()
    _write(spark, frame, source)
    report = run_scoring(_config(source, output, vllm.url, **{"generate.logprobs": True}), spark)
    assert report.status == "succeeded", report.error
    out = read_output(spark, str(output))
    assert len(out) == len(frame) and not report.error_reasons
    assert out["generated_text"].tolist() == vllm.offline
    expected, prompt_tokens = _reference_texts(
        vllm_llama_dir, [TEMPLATE.format(body=b) for b in frame["body"]], NEW_TOKENS
    )
    assert out["prompt_tokens"].tolist() == prompt_tokens  # vLLM's usage counts the tokenizer's tokens, BOS included
    same, same_but_cut = equal_texts(out["generated_text"].tolist(), expected)
    print(
        f"vLLM endpoint vs transformers' in-process greedy: {same} of {len(expected)} texts equal, {same_but_cut} but "
        "for a last character cut at max_new_tokens"
    )
    assert same_but_cut / len(expected) >= 0.75
    for logprobs, n in zip(out["token_logprobs"], out["completion_tokens"]):
        assert len(logprobs) == n and all(v <= 0 for v in logprobs)


SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["good", "bad"]},
        "stars": {"type": "integer", "enum": [1, 2, 3, 4, 5]},
    },
    "required": ["label", "stars"],
    "additionalProperties": False,
}


def test_json_schema_goes_as_response_format_and_every_row_validates(spark, tmp_path, vllm):
    source, output = tmp_path / "reviews", tmp_path / "labels"
    _write(spark, _reviews(6), source)
    cfg = _config(source, output, vllm.url, **{"generate.json_schema": SCHEMA, "generate.max_new_tokens": 40})
    report = run_scoring(cfg, spark)
    assert report.status == "succeeded", report.error
    assert not report.error_reasons
    out = read_output(spark, str(output))
    assert len(out) == 6
    for text, finish in zip(out["generated_text"], out["finish_reason"]):
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)
