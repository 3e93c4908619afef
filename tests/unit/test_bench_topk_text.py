"""W6T's pure parts (no Spark): the candidate texts' shape and determinism, the comparison of two outputs that both
call their score ``score``, and the summary lines of a hand-built result."""

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from bench.alternating import PeerRun
from bench.proctree import Measurement
from bench.topk import compare_top
from bench.topk_text import W6TResult, make_w6t_data, w6t_lines
from tests.unit.test_bench_topk import _delta


def test_candidate_texts_are_seeded_contiguous_per_file_and_unique_per_user(tmp_path):
    one, again = tmp_path / "one", tmp_path / "again"
    assert make_w6t_data(one, 40, 5, files=4) == make_w6t_data(again, 40, 5, files=4) == 200
    files = sorted(one.glob("*.parquet"))
    assert len(files) == 4 and all(pq.ParquetFile(f).metadata.num_rows == 50 for f in files)
    table = pq.read_table(one)
    assert table.column_names == ["user_id", "item_id", "text"] and table.equals(pq.read_table(again))
    users = pq.read_table(files[1]).column("user_id").to_numpy()
    assert (users.min(), users.max()) == (11, 20)  # contiguous users per file
    frame = table.to_pandas()
    assert len(frame.drop_duplicates(["user_id", "item_id"])) == 200  # the composite id is unique
    words = np.array([len(t.split()) for t in frame["text"]])
    assert words.min() >= 1 and words.max() > 4 * np.median(words)  # uneven lengths: what the hand job pads


def test_compare_top_reads_the_score_column_on_both_sides(tmp_path):
    ours = pd.DataFrame({"user_id": [1, 1], "item_id": [5, 6], "rank": [1, 2], "score": [0.9, 0.5]})
    theirs = pd.DataFrame({"user_id": [1, 1], "item_id": [5, 6], "rank": [1, 2], "score": [0.9, 0.5 + 4e-6]})
    _delta(tmp_path / "ours", ours)
    _delta(tmp_path / "theirs", theirs)
    found = compare_top(tmp_path / "ours", tmp_path / "theirs", score_col="score")
    assert (found["matched"], found["only_lakescore"], found["only_window"]) == (2, 0, 0)
    assert found["max_score_delta"] == pytest.approx(4e-6)


def test_summary_lines_of_a_hand_built_result():
    report = {"workers": {"rows_scored": 1000}, "step_seconds": {"score_stage": 4.0}}
    result = W6TResult(users=50, candidates=20, top_k=10)
    result.runs = {
        "lakescore": [PeerRun(Measurement(0, 20.0, 2**30), report, 250.0)],
        "window": [PeerRun(Measurement(0, 90.0, 2**30), {"rows": 1000, "job_seconds": 80.0}, 12.5)],
    }
    result.equal = {"matched": 500, "only_lakescore": 0, "only_window": 0, "max_score_delta": 2e-7}
    text = "\n".join(w6t_lines(result))
    assert "50 users x 20 candidate W1 review texts = 1,000 rows" in text
    assert "90.0 / 20.0 s = 4.50x   target >= 1x: met" in text and "scores within 1e-05: met" in text
    result.runs["window"][0].measured = Measurement(0, 10.0, 2**30)
    result.equal["max_score_delta"] = 1e-3
    text = "\n".join(w6t_lines(result))
    assert "10.0 / 20.0 s = 0.50x   target >= 1x: NOT met" in text and "scores within 1e-05: NOT met" in text


def test_w9_pairs_are_seeded_contiguous_per_file_with_one_query_per_id(tmp_path):
    from bench.rerank_pairs import make_w9_data

    one, again = tmp_path / "one", tmp_path / "again"
    assert make_w9_data(one, 8, 5, files=4) == make_w9_data(again, 8, 5, files=4) == 40
    table = pq.read_table(one)
    assert table.column_names == ["user_id", "item_id", "query", "text"] and table.equals(pq.read_table(again))
    frame = table.to_pandas()
    assert len(frame.drop_duplicates(["user_id", "item_id"])) == 40
    assert (frame.groupby("user_id")["query"].nunique() == 1).all() and frame["query"].nunique() == 8
    assert frame["text"].nunique() > 30  # each pair its own passage


def test_w9_lines_name_the_target_and_peak_memory():
    from bench.rerank_pairs import W9Result, w9_lines

    report = {"workers": {"rows_scored": 1000}, "step_seconds": {"score_stage": 4.0}}
    result = W9Result(queries=20, passages=50, top_k=5)
    result.runs = {
        "lakescore": [PeerRun(Measurement(0, 20.0, 2**30), report, 250.0)],
        "window": [PeerRun(Measurement(0, 25.0, 2**31), {"rows": 1000, "job_seconds": 20.0}, 50.0)],
    }
    result.equal = {"matched": 100, "only_lakescore": 0, "only_window": 0, "max_score_delta": 2e-7}
    text = "\n".join(w9_lines(result))
    assert "20 queries x 50 W1 review passages = 1,000 pairs" in text
    assert "25.0 / 20.0 s = 1.25x   target >= 1.5x: NOT met" in text and "peak RSS 2048 MiB" in text
