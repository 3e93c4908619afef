"""The Ray Data / Daft side-by-side bench's pure parts (no Spark, no Ray, no Daft): each workload's output comparison
on hand-written Delta tables, and the table of ratios that only calls a peer ahead or behind on equal work."""

import json
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.peers.compare import COSINE_MIN, compare_embeddings, compare_labels, compare_texts, compare_top


def _delta(path, frame, parts=1):
    """A one-commit Delta table of ``frame`` in ``parts`` files (what :func:`bench.equivalence.delta_files` reads)."""
    (path / "_delta_log").mkdir(parents=True)
    actions = [{"metaData": {"partitionColumns": [], "configuration": {}}}]
    for n, chunk in enumerate(np.array_split(np.arange(len(frame)), parts)):
        pq.write_table(pa.Table.from_pandas(frame.iloc[chunk], preserve_index=False), path / f"part-{n}.parquet")
        actions.append({"add": {"path": f"part-{n}.parquet"}})
    (path / "_delta_log" / f"{0:020d}.json").write_text("\n".join(json.dumps(a) for a in actions))
    return path


def _vectors(seed, rows=6, dim=8):
    vectors = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_embeddings_the_same_in_another_row_order_and_file_split(tmp_path):
    vectors = _vectors(1)
    ours = _delta(tmp_path / "ours", pd.DataFrame({"review_id": range(6), "embedding": list(vectors)}))
    shuffled = pd.DataFrame({"review_id": range(6), "embedding": list(vectors + 1e-6)}).iloc[::-1]
    theirs = _delta(tmp_path / "theirs", shuffled, parts=3)
    found = compare_embeddings(ours, theirs)
    assert found["same"] and found["why"] == "" and found["matched"] == 6
    assert found["min_cosine"] == pytest.approx(1.0, abs=1e-6)


def test_embeddings_differ_below_the_cosine_floor_or_with_rows_missing(tmp_path):
    vectors = _vectors(2)
    ours = _delta(tmp_path / "ours", pd.DataFrame({"review_id": range(6), "embedding": list(vectors)}))
    bent = vectors.copy()
    bent[3] = _vectors(3, rows=1)[0]  # one row's vector from another model
    found = compare_embeddings(
        ours, _delta(tmp_path / "bent", pd.DataFrame({"review_id": range(6), "embedding": list(bent)}))
    )
    assert not found["same"] and found["min_cosine"] < COSINE_MIN and "lowest cosine" in found["why"]
    short = _delta(tmp_path / "short", pd.DataFrame({"review_id": range(5), "embedding": list(vectors[:5])}))
    found = compare_embeddings(ours, short)
    assert not found["same"] and (found["only_lakescore"], found["only_peer"]) == (1, 0)
    assert "1 rows only in lakescore's output" in found["why"]


def test_embeddings_as_fixed_size_lists_read_like_lists(tmp_path):
    """Daft writes its embedding type as a fixed-size list, Spark an array: both are read as one vector per row."""
    vectors = _vectors(4)
    ours = _delta(tmp_path / "ours", pd.DataFrame({"review_id": range(6), "embedding": list(vectors)}))
    (tmp_path / "fixed" / "_delta_log").mkdir(parents=True)
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 8)
    pq.write_table(
        pa.table({"review_id": pa.array(range(6), pa.int64()), "embedding": column}), tmp_path / "fixed" / "p.parquet"
    )
    (tmp_path / "fixed" / "_delta_log" / f"{0:020d}.json").write_text(json.dumps({"add": {"path": "p.parquet"}}))
    assert compare_embeddings(ours, tmp_path / "fixed")["same"]


def test_labels_equal_per_id_or_counted_as_different(tmp_path):
    ours = _delta(tmp_path / "ours", pd.DataFrame({"id": [1, 2, 3], "label": ["a", "b", "c"], "probs": [[1.0]] * 3}))
    same = _delta(tmp_path / "same", pd.DataFrame({"id": [3, 1, 2], "label": ["c", "a", "b"]}))
    assert compare_labels(ours, same)["same"]
    other = _delta(tmp_path / "other", pd.DataFrame({"id": [1, 2, 3], "label": ["a", "x", "c"]}))
    found = compare_labels(ours, other)
    assert not found["same"] and found["equal"] == 2 and found["why"] == "1 of 3 labels differ"


def test_texts_equal_per_id_or_counted_as_different(tmp_path):
    ours = _delta(tmp_path / "ours", pd.DataFrame({"id": [1, 2], "generated_text": [" good", " bad"]}))
    assert compare_texts(
        ours, _delta(tmp_path / "same", pd.DataFrame({"id": [2, 1], "generated_text": [" bad", " good"]}))
    )["same"]
    found = compare_texts(
        ours, _delta(tmp_path / "other", pd.DataFrame({"id": [1, 2], "generated_text": [" good", "bad"]}))
    )
    assert not found["same"] and found["why"] == "1 of 2 texts differ"  # a leading space is a different text


def test_top_rows_the_same_set_or_not(tmp_path):
    ours = _delta(
        tmp_path / "ours",
        pd.DataFrame({"user_id": [1, 1, 2], "item_id": [5, 6, 7], "rank": [1, 2, 1], "prediction": [0.9, 0.5, 0.3]}),
    )
    same = _delta(tmp_path / "same", pd.DataFrame({"user_id": [2, 1, 1], "item_id": [7, 6, 5], "rank": [1, 2, 1]}))
    assert compare_top(ours, same)["same"]
    swapped = _delta(
        tmp_path / "swapped", pd.DataFrame({"user_id": [1, 1, 2], "item_id": [6, 5, 7], "rank": [1, 2, 1]})
    )
    found = compare_top(ours, swapped)  # the same items, ranked the other way round
    assert not found["same"] and (found["matched"], found["only_lakescore"], found["only_peer"]) == (1, 2, 2)


def test_the_comparisons_import_neither_ray_nor_daft():
    import bench.peers.compare
    import bench.peers.side_by_side  # noqa: F401

    assert not {"ray", "daft"} & set(sys.modules)


def _runs(*walls, report=None):
    from bench.alternating import PeerRun
    from bench.proctree import Measurement

    return [PeerRun(Measurement(0 if w else 1, w or 5.0, 0), report if w else None) for w in walls]


def test_ratio_rows_give_a_verdict_only_on_equal_work():
    from bench.peers.side_by_side import ratio_rows

    runs = {
        "lakescore": _runs(100.0, 120.0, report={}),
        "ray": _runs(150.0, 170.0, report={}),
        "daft": _runs(90.0, 100.0, report={}),
    }
    rows = ratio_rows("W1", 12000, runs, {"ray": {"same": True, "why": ""}, "daft": {"same": True, "why": ""}})
    assert [r[2:] for r in rows] == [
        ["Ray Data", "110.0 (2)", "160.0 (2)", "1.45x", "same", "met"],
        ["Daft", "110.0 (2)", "95.0 (2)", "0.86x", "same", "NOT met"],
    ]
    differ = ratio_rows("W4", 10, runs, {"ray": {"same": False, "why": "3 of 10 texts differ"}, "daft": None})
    assert differ[0][6:] == ["differ: 3 of 10 texts differ", "no verdict (not the same work)"]
    assert differ[1][6:] == ["differ: not compared", "no verdict (not the same work)"]


def test_ratio_rows_say_which_side_failed():
    from bench.peers.side_by_side import ratio_rows

    runs = {"lakescore": _runs(100.0, report={}), "ray": _runs(None, None)}
    assert ratio_rows("W5", 10, runs, {"ray": None})[0][4:] == ["-", "-", "-", "FAILED: ray"]


def test_the_section_replaces_itself_and_keeps_the_rest():
    from bench.peers.side_by_side import SECTION, replace_section

    document = "# lakescore benchmarks\n\n## Findings that hold across runs\n\nkept\n\n## History\n\nrows\n"
    first = replace_section(document, f"{SECTION}\n\none\n")
    assert first.index("kept") < first.index(SECTION) < first.index("## History") and first.endswith("rows\n")
    second = replace_section(first, f"{SECTION}\n\ntwo\n")
    assert "one" not in second and second.count(SECTION) == 1 and second.replace("two", "one") == first
    assert replace_section("# only a title\n", f"{SECTION}\n").endswith(f"\n\n{SECTION}\n")


def test_run_walls_list_every_run_in_order():
    from bench.peers.side_by_side import run_walls

    runs = {"lakescore": _runs(239.94, 169.8, report={}), "daft": _runs(92.6, None, report={})}
    assert run_walls("W1", runs) == "W1 runs, wall seconds in run order: lakescore 239.9, 169.8; daft 92.6, FAILED"
