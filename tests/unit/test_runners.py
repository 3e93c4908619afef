"""Runners prepare each Arrow batch per row: a row that cannot be decoded or tokenized is refused alone."""

import numpy as np
import pyarrow as pa
from pyspark.sql.types import LongType, StructField

from lakescore.schemas.output import scored_schema
from lakescore.udfs.batching import AdaptiveBudget, BatchPolicy
from lakescore.udfs.models import model_cache
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.runners import TextRunner, decode_texts
from lakescore.udfs.scoring_udf import make_scoring_function

INVALID = [b"\xff\xfe", b"lone surrogate \xed\xa0\x80 here", b"cut \xe2\x82"]


def _strings(values) -> pa.Array:
    """A string array holding bytes that need not be UTF-8, as Parquet and Spark hand them over."""
    return pa.array(values, pa.binary()).view(pa.string())


def test_invalid_utf8_rows_are_refused_alone_and_shown_escaped():
    texts, refused = decode_texts(_strings([b"ok", INVALID[0], None, "caf\u00e9".encode(), INVALID[1], INVALID[2]]))
    assert texts == ["ok", None, None, "caf\u00e9", None, None]
    assert sorted(refused) == [1, 4, 5] and {f.reason for f in refused.values()} == {"invalid_text"}
    assert refused[1].raw == "\\xff\\xfe" and refused[4].raw == "lone surrogate \\xed\\xa0\\x80 here"
    assert "not valid UTF-8" in refused[5].error


def test_valid_columns_decode_in_one_arrow_call():
    texts, refused = decode_texts(pa.array(["a", None, "\u65e5\u672c"], pa.large_string()))
    assert texts == ["a", None, "\u65e5\u672c"] and refused == {}


class PickyHead:
    """A real, tiny text head (one token per character) whose tokenizer rejects any text holding a '#'."""

    padding_side = "right"

    def tokenize(self, texts):
        if any("#" in t for t in texts):
            raise ValueError("cannot tokenize '#'")
        width = max(1, max(len(t) for t in texts))
        mask = np.zeros((len(texts), width), dtype=np.int64)
        for i, t in enumerate(texts):
            mask[i, : len(t)] = 1
        return {"attention_mask": mask}

    def forward(self, features):
        return features["attention_mask"].sum(1, keepdims=True).astype(np.float64)


def test_a_text_the_tokenizer_rejects_is_refused_and_its_batch_is_scored():
    runner = TextRunner(PickyHead(), ["text"])
    batch = pa.record_batch({"text": _strings([b"abc", b"x#y", INVALID[0], b"de", None])})
    prepared = runner.prepare(batch)
    scored = runner.score(prepared, AdaptiveBudget(BatchPolicy(max_tokens=64, max_rows=8)))
    assert scored.reasons == [None, "prepare_error", "invalid_text", None, "null_input"]
    assert scored.errors[1] == "ValueError: cannot tokenize '#'"
    assert scored.outputs[[0, 3], 0].tolist() == [3.0, 2.0]
    assert runner.raw_inputs(prepared, scored) == [None, "x#y", "\\xff\\xfe", None, None]


def test_the_worker_function_dead_letters_invalid_text_and_scores_the_rest(tiny_classifier_dir):
    model_cache.clear()
    schema = scored_schema("classify", StructField("id", LongType()))
    score = make_scoring_function(
        ModelSpec("classify", str(tiny_classifier_dir)),
        keep_cols=["id"],
        input_cols=["text"],
        schema=schema,
        max_tokens=256,
        max_rows=4,
    )
    batch = pa.record_batch({"id": pa.array([1, 2, 3], pa.int64()), "text": _strings([b"good", INVALID[0], b"bad"])})
    rows = pa.Table.from_batches(list(score(iter([batch])))).to_pylist()
    assert [r["_reason"] for r in rows] == [None, "invalid_text", None]
    assert rows[1]["label"] is None and rows[1]["_input"] == "\\xff\\xfe"
    assert rows[0]["label"] is not None and rows[2]["label"] is not None
    model_cache.clear()
