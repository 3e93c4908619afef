"""W6's pure parts (no Spark): the candidate generator's shape and determinism, the seeded model, the output
comparison on hand-written Delta tables, and the summary lines of a hand-built result."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.alternating import PeerRun
from bench.proctree import Measurement
from bench.topk import FEATURES, W6Result, compare_top, make_w6_data, make_w6_model, w6_chunks, w6_lines


def test_candidates_are_seeded_and_unique_per_user(tmp_path):
    chunks = list(w6_chunks(5, 7, chunk_users=2))
    assert [c.num_rows for c in chunks] == [14, 14, 7]
    table = pa.concat_tables(chunks)
    assert table.column_names == ["user_id", "item_id", *FEATURES]
    users = table.column("user_id").to_numpy()
    assert (users == np.repeat(np.arange(1, 6), 7)).all()
    pairs = set(zip(users.tolist(), table.column("item_id").to_pylist()))
    assert len(pairs) == 35  # the composite id is unique
    first = table.column(FEATURES[0]).to_numpy().reshape(5, 7)
    assert (first == first[:, :1]).all() and len(set(first[:, 0])) == 5  # a user feature: one value per user
    assert len(set(table.column(FEATURES[-1]).to_pylist())) == 35  # a pair feature: one per row
    assert pa.concat_tables(w6_chunks(5, 7, chunk_users=2)).equals(table)  # seeded

    one, again = tmp_path / "one", tmp_path / "again"
    assert make_w6_data(one, 40, 3, files=4) == make_w6_data(again, 40, 3, files=4) == 120
    files = sorted(one.glob("*.parquet"))
    assert len(files) == 4 and all(pq.ParquetFile(f).metadata.num_rows == 30 for f in files)
    assert (
        pq.read_table(one).equals(pq.read_table(again))
        and pq.read_table(one).schema.field(FEATURES[0]).type == pa.float32()
    )
    users = pq.read_table(files[1]).column("user_id").to_numpy()
    assert (users.min(), users.max()) == (11, 20)  # contiguous users per file


def test_model_is_seeded_torchscript_over_the_features(tmp_path):
    import torch

    a, b = make_w6_model(tmp_path / "a"), make_w6_model(tmp_path / "b")
    x = torch.randn(5, len(FEATURES))
    out = torch.jit.load(str(a))(x)
    assert out.shape == (5, 1) and torch.equal(out, torch.jit.load(str(b))(x))


def _delta(path, frame):
    """A one-commit Delta table of ``frame`` (what :func:`bench.equivalence.delta_files` reads)."""
    (path / "_delta_log").mkdir(parents=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path / "part-0.parquet")
    actions = [{"metaData": {"partitionColumns": [], "configuration": {}}}, {"add": {"path": "part-0.parquet"}}]
    (path / "_delta_log" / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions))


def test_compare_top_counts_rows_on_both_sides_and_the_score_gap(tmp_path):
    import pandas as pd

    ours = pd.DataFrame({"user_id": [1, 1, 2], "item_id": [5, 6, 7], "rank": [1, 2, 1], "prediction": [0.9, 0.5, 0.3]})
    theirs = pd.DataFrame(
        {"user_id": [1, 1, 2], "item_id": [5, 6, 8], "rank": [1, 2, 1], "score": [0.9, 0.5 + 3e-6, 0.2]}
    )
    _delta(tmp_path / "ours", ours)
    _delta(tmp_path / "theirs", theirs)
    found = compare_top(tmp_path / "ours", tmp_path / "theirs")
    assert (found["matched"], found["only_lakescore"], found["only_window"]) == (2, 1, 1)
    assert found["max_score_delta"] == pytest.approx(3e-6)


def _run(wall, peak_mib, report, code=0):
    return PeerRun(Measurement(code, wall, int(peak_mib * 2**20), worker_private_bytes=100 * 2**20), report)


def test_summary_lines_of_a_hand_built_result():
    report = {
        "workers": {"rows_scored": 1000, "arrow_batches": 2},
        "output_rows": 200,
        "ranked_out": 800,
        "error_rows": 0,
        "step_seconds": {"score_stage": 4.0, "rank": 1.5},
    }
    result = W6Result(users=100, candidates=10, top_k=2)
    result.runs = {
        "lakescore": [_run(20.0, 1000, report), _run(30.0, 1100, report)],
        "window": [_run(30.0, 900, {"rows": 1000, "job_seconds": 10.0}), _run(50.0, 950, None, code=1)],
    }
    for runs in result.runs.values():
        for run in runs:
            run.rate = 250.0 if run.ok else None
    result.tenth = _run(10.0, 1000, report)
    result.equal = {"matched": 200, "only_lakescore": 0, "only_window": 0, "max_score_delta": 2e-7}
    text = "\n".join(w6_lines(result))
    assert "W6 window: whole process median 30.0 s" in text and "1 FAILED" in text
    assert "200 published, 800 ranked out" in text and "rank 1.5" in text
    assert "30.0 / 25.0 s = 1.20x   target >= 1x: met" in text
    assert "1100 vs 1000 MiB = 1.10x" in text and "target <= 1.25x: met" in text
    assert "200 (user_id, item_id, rank) rows in both" in text and "scores within 1e-05: met" in text

    result.equal["only_window"], result.tenth = 3, _run(10.0, 800, report)
    text = "\n".join(w6_lines(result))
    assert "1100 vs 800 MiB = 1.38x" in text and "target <= 1.25x: NOT met" in text
    assert "3 only in the window job's" in text and "scores within 1e-05: NOT met" in text
