"""Chunked embedding end to end (issue 59) on real Spark + Delta with MiniLM: one row per chunk, ids and
``chunk_index`` identifying it, each vector sentence-transformers' ``encode`` of its span; an incremental run after an
edit in the middle of a long document replaces all of its chunks, a shortened document leaves no stale chunk and a
removed one none at all; every figure counts documents."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lakescore.jobs.score_job import run_scoring

SENTENCE = "The battery of this kettle lasts {} days and the lid closes firmly. "
LONG = "".join(SENTENCE.format(i) for i in range(12))  # ~190 tokens: several 32-token chunks
REMARK = "A completely different remark about customer support, refunds, warranty claims and delivery times. "
EDITED = LONG[:300] + REMARK * 3 + LONG[300:]  # ~50 tokens inserted in the middle: chunks more
HUGE = LONG * 3  # over embed.chunk.max_chunks 20


def _write(spark, path, rows) -> None:
    frame = pd.DataFrame(rows, columns=["review_id", "body"])
    spark.createDataFrame(frame, "review_id long, body string").write.format("delta").mode("overwrite").save(str(path))


def _output(spark, path) -> pd.DataFrame:
    rows = spark.read.format("delta").load(str(path)).toPandas()
    return rows.sort_values(["review_id", "chunk_index"]).reset_index(drop=True)


def _check_chunks(rows: pd.DataFrame, texts: dict, sentence_transformer) -> None:
    """Every document's chunks: numbered 0.. in order, covering its text, each vector ``encode`` of its span; its
    ``chunk_index`` -1 row the normalised mean of them."""
    for review_id, text in texts.items():
        mine = rows[rows.review_id == review_id]
        chunks = mine[mine.chunk_index >= 0]
        assert list(chunks.chunk_index) == list(range(len(chunks)))
        assert chunks.chunk_start.iloc[0] == 0 and chunks.chunk_end.iloc[-1] == len(text)
        assert all(b <= a for a, b in zip(chunks.chunk_end.iloc[:-1], chunks.chunk_start.iloc[1:]))  # no gap
        spans = [text[s:e] for s, e in zip(chunks.chunk_start, chunks.chunk_end)]
        peer = sentence_transformer.encode(spans, normalize_embeddings=True)
        ours = np.stack(chunks.embedding.to_numpy())
        assert ((ours * peer).sum(1) / np.linalg.norm(ours, axis=1)).min() >= 0.9999
        (document,) = np.stack(mine[mine.chunk_index == -1].embedding.to_numpy())
        mean = peer.mean(0) / np.linalg.norm(peer.mean(0))
        assert float(document @ mean) / float(np.linalg.norm(document)) >= 0.9999


def test_chunked_documents_publish_whole_and_an_incremental_run_replaces_them_whole(
    spark, tmp_path, job_config, sentence_transformer
):
    source, output = tmp_path / "documents", tmp_path / "chunks"
    texts = {1: LONG, 2: "A short one.", 3: LONG[:500], 4: LONG[:260]}
    _write(spark, source, [*texts.items(), (5, None), (6, HUGE)])
    flags = {
        "input": str(source),
        "output": str(output),
        "write.mode": "incremental",
        "write.delete_missing": True,
        "embed.chunk.max_tokens": 32,
        "embed.chunk.overlap_tokens": 8,
        "embed.chunk.document_vector": "mean",
        "embed.chunk.max_chunks": 20,
        "max_error_rate": 0.5,
        "validation.drift.min_id_cosine_p5": 0.5,
    }
    cfg = job_config(**flags)
    first = run_scoring(cfg, spark)
    assert first.status == "succeeded", (first.error, first.validation)
    rows = _output(spark, output)
    # documents counted; a null text and one over max_chunks dead-lettered whole, never truncated
    assert (first.input_rows, first.output_rows, first.error_rows) == (6, 4, 2)
    assert first.error_reasons == {"null_input": 1, "too_many_chunks": 1}
    errors = spark.read.format("delta").load(str(output) + "_errors").toPandas()
    assert errors[errors.reason == "too_many_chunks"].input.tolist() == [HUGE]
    assert first.output_chunks == len(rows) > 3 * 4
    assert rows.groupby("review_id").chunk_index.min().eq(-1).all()
    _check_chunks(rows, texts, sentence_transformer)
    before = rows.set_index(["review_id", "chunk_index"])

    # 1 edited in the middle, 3 shortened to one chunk, 4 removed; 2 unchanged
    edited = {1: EDITED, 2: texts[2], 3: "Now short."}
    _write(spark, source, [*edited.items(), (5, None), (6, HUGE)])
    second = run_scoring(cfg, spark)
    assert second.status == "succeeded", (second.error, second.validation)
    assert (second.rows_kept, second.rows_scored, second.error_rows, second.rows_missing) == (1, 2, 2, 1)
    assert second.rows_carried == 2 and second.workers["rows_scored"] == 2  # 5 and 6 fail as before: not sent again
    # every count in documents: 4 removed whole (its chunk rows named as such, with 3's stale last chunks beside them)
    assert second.rows_deleted == 1 and second.chunk_rows_deleted == len(before.loc[4]) + len(before.loc[3]) - 2
    assert f"1 deleted from the output ({second.chunk_rows_deleted} chunk rows)" in second.summary()
    rows = _output(spark, output)
    assert set(rows.review_id) == {1, 2, 3}  # the removed document left no row
    assert list(rows[rows.review_id == 3].chunk_index) == [-1, 0]  # the shortened one no stale chunk
    _check_chunks(rows, edited, sentence_transformer)
    assert len(rows[rows.review_id == 1]) > len(before.loc[1])  # a chunk more, every one of them rewritten
    assert (rows[rows.review_id == 1].run_id == second.run_id).all()
    kept = rows[rows.review_id == 2].set_index(["review_id", "chunk_index"])
    assert (kept.run_id == first.run_id).all() and (kept.chunk_end == before.loc[kept.index].chunk_end).all()
    assert second.output_chunks == len(rows[rows.review_id.isin([1, 3])])

    # every document again: the drift gate compares each chunk with the same (id, chunk_index) of the baseline
    third = run_scoring(job_config(**flags, **{"write.full_rescore": True}), spark)
    assert third.status == "succeeded", (third.error, third.validation)
    assert third.drift["ids_compared"] == len(rows) and third.drift["figures"]["id_cosine_p5"] > 0.9999


def test_chunk_settings_are_refused_before_compute(job_config):
    from lakescore.jobs.config import ConfigError

    with pytest.raises(ConfigError, match="needs embed.chunk.max_tokens"):
        job_config(**{"embed.chunk.overlap_tokens": 8})
    with pytest.raises(ConfigError, match="embed.chunk makes a document many rows"):
        job_config(
            **{"embed.chunk.max_tokens": 32, "rank.partition_by": "body", "rank.order_by": "embedding", "rank.top_k": 1}
        )
