"""The ner head against ``transformers.pipeline("token-classification", aggregation_strategy="simple")``.

On a tiny seeded BERT token classifier (``tiny_ner_dir``) loaded through the real loader,
on text it never saw, through the real batching core and the scoring function.
"""

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StructField

from lakescore.schemas.output import scored_schema
from lakescore.udfs.batching import BatchPolicy, score_texts
from lakescore.udfs.heads.ner import TEXTS
from lakescore.udfs.models.model_source import ModelSourceError, ModelSpec
from lakescore.udfs.registry import get_task, named_columns
from lakescore.udfs.scoring_udf import make_scoring_function

OVER_LENGTH = "Angela Merkel flew from Berlin to Redmond to meet Satya Nadella at Microsoft. " * 60
"""About 1,000 tokens: twice the model's 512, so the pipeline and we both truncate."""

NER_UNSEEN = [
    "Angela Merkel met Satya Nadella at Microsoft in Redmond, Washington.",
    "Die Deutsche Bahn verbindet München und Hamburg; Olaf Scholz fährt mit.",
    "東京でソニーの平井一夫さんに会いました。",
    "التقى محمد بن سلمان بممثلي أرامكو في الرياض",
    "Loved it 🙂🔥👍🏽 — Zürich's café, São Paulo & Kraków!!!",
    "!!!???...;;; --- @@@ ### (((Acme Corp))) [[[NYC]]] {{{}}} ''' \"\"\"",
    "",
    "   ",
    "Unbelievably, Schwarzenegger's antidisestablishmentarianism persisted at Übermensch GmbH.",
    OVER_LENGTH,
]


def _load(path, **options):
    return get_task("ner").load(ModelSpec("ner", str(path), **options), path)


@pytest.fixture(scope="module")
def peer(tiny_ner_dir):
    from transformers import pipeline

    return pipeline("token-classification", model=str(tiny_ner_dir), aggregation_strategy="simple", device="cpu")


@pytest.fixture(scope="module")
def head(tiny_ner_dir):
    return _load(tiny_ner_dir)


def assert_same_entities(ours, theirs, text):
    """Same entities in the same order (group, word, start, end); scores within 1e-4."""
    key = ("entity_group", "word", "start", "end")
    assert [tuple(e[k] for k in key) for e in ours] == [tuple(e[k] for k in key) for e in theirs], text[:80]
    assert np.allclose([e["score"] for e in ours], [float(e["score"]) for e in theirs], atol=1e-4, rtol=0), text[:80]


def assert_worth_comparing(entities_per_text, texts, tokenizer):
    """The peer's output is not trivial: many entities, some of several tokens, some joining a word's subwords."""
    entities = [(text, e) for text, found in zip(texts, entities_per_text) for e in found]
    pieces = [tokenizer.tokenize(text[e["start"] : e["end"]]) for text, e in entities]
    assert len(entities) >= 100
    assert sum(len(p) > 1 for p in pieces) >= 30  # multi-token groups
    assert sum(any(t.startswith("##") for t in p[1:]) for p in pieces) >= 10  # subwords merged into one entity
    assert len({e["entity_group"] for _, e in entities}) == 3


class RecordingHead:
    """The real head, with the texts of every forward batch recorded (to see rows split and reordered)."""

    def __init__(self, head):
        self.head, self.padding_side, self.batches = head, head.padding_side, []

    def tokenize(self, texts):
        return self.head.tokenize(texts)

    def forward(self, features):
        self.batches.append(list(features[TEXTS]))
        return self.head.forward(features)


def test_ner_equals_the_pipeline_through_the_batching_core(head, peer, tiny_ner_dir):
    texts = [None, *NER_UNSEEN[:5], None, *NER_UNSEEN[5:]]
    recording = RecordingHead(head)
    scored = score_texts(texts, recording, BatchPolicy(max_tokens=96, max_rows=3))
    assert len(recording.batches) >= 4 and recording.batches[0] == [OVER_LENGTH]  # longest first, alone
    assert sorted(t for b in recording.batches for t in b) == sorted(NER_UNSEEN)  # every text once
    assert scored.reasons == ["null_input" if t is None else None for t in texts]

    (column,) = named_columns("ner", head.columns(scored.outputs, scored.ok)).values()
    assert column.type == get_task("ner").output_arrow_types[0]
    rows = column.to_pylist()
    expected = [None if t is None else peer(t) for t in texts]
    for text, ours, theirs in zip(texts, rows, expected):
        if text is None:
            assert ours is None  # dead-lettered, never an empty list
        else:
            assert_same_entities(ours, theirs, text)
    assert_worth_comparing([e for e in expected if e is not None], [t for t in texts if t is not None], peer.tokenizer)


def test_over_length_text_is_truncated_where_the_pipeline_truncates(head, peer):
    assert len(head._tokenizer(OVER_LENGTH)["input_ids"]) > 900
    (ours,) = head.score([OVER_LENGTH])
    assert_same_entities(ours, peer(OVER_LENGTH), OVER_LENGTH)
    assert ours and max(e["end"] for e in ours) < len(OVER_LENGTH) * 0.6  # nothing found past the limit


def test_one_padded_batch_equals_rows_alone(head):
    """Padding never changes a row's entities: the batch of all texts equals each text scored alone."""
    together = head.score(NER_UNSEEN)
    for text, entities in zip(NER_UNSEEN, together):
        (alone,) = head.score([text])
        assert_same_entities(entities, alone, text)


def test_max_seq_length_truncates_sooner(tiny_ner_dir):
    short = _load(tiny_ner_dir, max_seq_length=8)
    (entities,) = short.score([NER_UNSEEN[0]])
    assert short.max_length == 8 and entities and max(e["end"] for e in entities) <= len("Angela Merkel met Satya")


def test_pickle_weights_are_refused_unless_allowed(tmp_path, tiny_ner_dir, head):
    import shutil

    import torch
    from safetensors.torch import load_file

    target = tmp_path / "pickled-ner"
    target.mkdir()
    for f in tiny_ner_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, target / f.name)
    torch.save(load_file(tiny_ner_dir / "model.safetensors"), target / "pytorch_model.bin")
    with pytest.raises(ModelSourceError, match="pickle-based weights.*allow_pickle"):
        _load(target)
    allowed = _load(target, allow_pickle=True)
    for ours, theirs, text in zip(allowed.score(NER_UNSEEN[:4]), head.score(NER_UNSEEN[:4]), NER_UNSEEN):
        assert_same_entities(ours, theirs, text)


def test_scoring_function_returns_the_declared_schema_and_the_pipelines_entities(tiny_ner_dir, peer):
    from lakescore.udfs.models import model_cache

    schema = scored_schema("ner", StructField("id", LongType()))
    score = make_scoring_function(
        ModelSpec("ner", str(tiny_ner_dir)),
        keep_cols=["id"],
        input_cols=["text"],
        schema=schema,
        max_tokens=128,
        max_rows=2,
    )
    texts = [NER_UNSEEN[0], None, NER_UNSEEN[2], "", NER_UNSEEN[4]]
    batches = [
        pa.record_batch({"id": pa.array([1, 2, 3], pa.int64()), "text": pa.array(texts[:3], pa.string())}),
        pa.record_batch({"id": pa.array([4, 5], pa.int64()), "text": pa.array(texts[3:], pa.string())}),
        pa.record_batch({"id": pa.array([6], pa.int64()), "text": pa.array([None], pa.string())}),  # nothing to score
    ]
    try:
        out = pa.Table.from_batches(list(score(iter(batches))))
    finally:
        model_cache.clear()
    assert out.schema == to_arrow_schema(schema)
    assert out.column_names == ["id", "entities", "model_sha256", "_reason", "_error", "_input", "_worker"]
    rows = out.to_pylist()
    assert [r["id"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["_reason"] for r in rows] == [None, "null_input", None, None, None, "null_input"]
    for row, text in zip(rows, texts + [None]):
        if text is None:
            assert row["entities"] is None
        else:
            assert_same_entities(row["entities"], peer(text), text)
    assert rows[3]["entities"] == []  # the empty text: scored, no entities
