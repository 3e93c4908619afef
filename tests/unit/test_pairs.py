"""(query, passage) pairs through the classify head: each row's two texts go to the model as one pair, as
sentence-transformers' ``CrossEncoder.predict`` passes them, through the real runner and batching core."""

import json

import numpy as np
import pyarrow as pa
import pytest

from lakescore.udfs.batching import AdaptiveBudget, BatchPolicy
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.registry import get_task
from lakescore.udfs.runners import TextRunner

LONG = "The delivery was late and the box arrived crushed, but the blender itself works fine. " * 60
QUERIES = [
    "is the blender loud?",
    "Lieferzeit nach Berlin",
    "配送は早いですか",
    "refund policy",
    "refund policy",
    "how long does the battery last " * 100,
    "ok",
]
PASSAGES = [
    "It is quieter than my old one, even on full power.",
    "Die Lieferung dauerte drei Tage.",
    "配送が早くて助かりました",
    LONG,
    "Returns are accepted within 30 days with a receipt.",
    "About a day.",
    LONG,
]


def _runner(model_dir, **options):
    head = get_task("classify").load(ModelSpec("classify", str(model_dir), **options), model_dir)
    return head, TextRunner(head, ["query", "passage"])


def _score(runner, queries, passages, max_tokens=512):
    batch = pa.record_batch({"query": pa.array(queries, pa.string()), "passage": pa.array(passages, pa.string())})
    prepared = runner.prepare(batch)
    return prepared, runner.score(prepared, AdaptiveBudget(BatchPolicy(max_tokens=max_tokens, max_rows=4)))


def test_pair_scores_equal_cross_encoder_predict(minilm_cross_encoder_dir):
    """Short, multilingual and over-length pairs (cut longest side first at the model's limit), batched by the token
    budget: each score within 1e-5 of ``CrossEncoder.predict``'s (a one-label model: the logit's sigmoid)."""
    from sentence_transformers import CrossEncoder

    head, runner = _runner(minilm_cross_encoder_dir, max_seq_length=128)  # over-length at 128 tokens: a cheaper test
    prepared, scored = _score(runner, QUERIES, PASSAGES, max_tokens=256)
    assert scored.ok.all() and runner.row_costs(prepared).max() == 128
    peer = CrossEncoder(str(minilm_cross_encoder_dir), device="cpu", max_length=128).predict(
        list(zip(QUERIES, PASSAGES))
    )
    np.testing.assert_allclose(scored.outputs[:, 0], peer, atol=1e-5, rtol=0)
    # the pair is what the model saw: the same texts alone, or swapped, score otherwise
    assert np.abs(head.score(QUERIES)[:, 0] - peer).max() > 1e-3
    assert np.abs(head.score(list(zip(PASSAGES, QUERIES)))[:, 0] - peer).max() > 1e-3


def test_the_token_budget_counts_both_sides_and_truncates_longest_first(minilm_cross_encoder_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_cross_encoder_dir))
    _, runner = _runner(minilm_cross_encoder_dir)
    prepared, _ = _score(runner, QUERIES, PASSAGES)
    expected = [
        len(tokenizer(q, p, truncation="longest_first", max_length=512)["input_ids"]) for q, p in zip(QUERIES, PASSAGES)
    ]
    assert runner.row_costs(prepared).tolist() == expected
    assert expected[3] == 512 and expected[5] == 512  # over-length pairs, cut at the model's limit
    long_passage, long_query = prepared.features["input_ids"][3], prepared.features["input_ids"][5]
    assert tokenizer.decode(long_passage).startswith("[CLS] refund policy [SEP] the delivery")  # the query kept whole
    assert tokenizer.decode(long_query).endswith(" [SEP] about a day. [SEP]")  # the passage kept whole


def test_a_null_or_empty_side_is_a_null_input_shown_with_both_sides(minilm_cross_encoder_dir):
    _, runner = _runner(minilm_cross_encoder_dir)
    queries = ["q1", None, "", "q4", "q5"]
    passages = ["p1", "p2", "p3", "", None]
    prepared, scored = _score(runner, queries, passages)
    assert scored.reasons == [None, "null_input", "null_input", "null_input", "null_input"]
    raw = runner.raw_inputs(prepared, scored)
    assert raw[0] is None
    assert [json.loads(r) for r in raw[1:]] == [
        {"passage": "p2"},
        {"query": "", "passage": "p3"},
        {"query": "q4", "passage": ""},
        {"query": "q5"},
    ]


def test_invalid_utf8_on_either_side_is_refused_with_both_sides_shown(minilm_cross_encoder_dir):
    _, runner = _runner(minilm_cross_encoder_dir)
    batch = pa.record_batch(
        {
            "query": pa.array([b"ok", b"q\xff"], pa.binary()).view(pa.string()),
            "passage": pa.array([b"p\xfe", b"fine"], pa.binary()).view(pa.string()),
        }
    )
    prepared = runner.prepare(batch)
    scored = runner.score(prepared, AdaptiveBudget(BatchPolicy(max_tokens=512, max_rows=4)))
    assert scored.reasons == ["invalid_text", "invalid_text"]
    raw = [json.loads(r) for r in runner.raw_inputs(prepared, scored)]
    assert raw == [{"query": "ok", "passage": "p\\xfe"}, {"query": "q\\xff", "passage": "fine"}]


def test_a_reduced_precision_run_is_checked_on_pairs(minilm_cross_encoder_dir):
    """The preflight's tolerance check scores the run's sample of pairs both ways (here bfloat16 against float32):
    figures from pairs, and a refusal when the tolerance is tighter than they are."""
    from lakescore.udfs.models import model_cache
    from lakescore.udfs.models.quantize import QuantizationToleranceError, Tolerance
    from tests.unit.test_backends import _preflight_row

    spec = ModelSpec("classify", str(minilm_cross_encoder_dir), dtype="bfloat16", max_seq_length=64)
    sample = list(zip(QUERIES, PASSAGES))
    model_cache.clear()
    try:
        passed = _preflight_row(spec, sample, Tolerance())
        refused = _preflight_row(spec, sample, Tolerance(max_prob_delta=1e-9))
    finally:
        model_cache.clear()
    figures = json.loads(passed["fidelity"])
    assert passed["error"] is None and figures["agreement"] == 1.0 and 0 < figures["prob_delta_max"] < 0.02, figures
    assert refused["error_type"] == QuantizationToleranceError.__name__


@pytest.mark.parametrize("setting", [{"text_pair_col": "passage", "task": "embed"}])
def test_text_pair_col_is_refused_for_tasks_that_read_one_text(setting):
    from lakescore.jobs.config import ConfigError, config_from_mapping

    with pytest.raises(ConfigError, match="text_pair_col applies to task classify, not 'embed'"):
        config_from_mapping(setting)
