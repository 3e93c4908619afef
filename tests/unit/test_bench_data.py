"""The benchmark's generated tables: repetition is the stated share, and the next night's table has exactly the
changes it says (W3 of ``make bench``, issue 12); C1's training labels and its report lines (issue 13); W5's images
are seeded and mixed (issue 36)."""

from __future__ import annotations

import io

import pandas as pd

from bench import data


def test_review_repetition_comes_from_the_stock_share_not_from_the_generator():
    unique = list(data.review_bodies(5000, stock_share=0.0))
    stocked = list(data.review_bodies(5000, stock_share=0.2))
    repeated = lambda bodies: 1 - len(set(bodies)) / len(bodies)  # noqa: E731
    assert repeated(unique) < 0.01
    assert 0.15 < repeated(stocked) < 0.25
    assert "share their text with another row" in data.repetition(stocked)


def test_changed_table_edits_inserts_and_deletes_exactly_what_it_reports(tmp_path):
    data.write_table(data.review_bodies(1000), tmp_path / "before")
    counts = data.changed_table(tmp_path / "before", tmp_path / "after", edit=0.02, insert=0.01, delete=0.005)
    assert counts == {"edited": 20, "inserted": 10, "deleted": 5}
    before = pd.read_parquet(tmp_path / "before").set_index("review_id")["body"]
    after = pd.read_parquet(tmp_path / "after").set_index("review_id")["body"]
    assert after.index.is_unique
    assert len(before.index.difference(after.index)) == 5
    new_ids = after.index.difference(before.index)
    assert len(new_ids) == 10 and new_ids.min() > before.index.max()
    shared = before.index.intersection(after.index)
    assert (before[shared] != after[shared]).sum() == 20


def test_c1_reports_each_workload_against_the_jobs_tolerance_and_labels_training_rows_by_verdict():
    from bench.classifier import C1Result, _verdict_label, c1_lines

    assert [
        _verdict_label(t) for t in ("Sturdy kettle, superb overall.", "Flimsy tent, awful sadly.", "Odd lamp, okay.")
    ] == [2, 0, 1]
    lines = c1_lines(
        C1Result(
            0.87,
            {
                "int8": {
                    "W1": {"agreement": 0.965, "prob_delta_p99": 0.14, "prob_delta_max": 0.2, "rows": 1500},
                    "W2": {"agreement": 0.995, "prob_delta_p99": 0.015, "prob_delta_max": 0.03, "rows": 500},
                },
                "bfloat16": {"W1": {"agreement": 0.999, "prob_delta_p99": 0.03, "prob_delta_max": 0.05, "rows": 1500}},
            },
        )
    )
    assert lines[1].startswith("C1 int8 vs float32 torch (W1, 1,500 rows): label agreement 0.9650") and lines[
        1
    ].endswith("NOT met")
    assert "target agreement >= 0.99 and p99 difference <= 0.02: met" in lines[2]
    assert lines[3].startswith("C1 bfloat16 vs float32 torch (W1, 1,500 rows)") and lines[3].endswith(
        "NOT met"
    )  # p99 0.03
    assert c1_lines(C1Result(None, {}, error="boom")) == ["C1 int8 / bfloat16 classifier: not measured (boom)"]


def test_w5_images_are_seeded_and_mix_formats_modes_and_sizes():
    from PIL import Image

    from bench.images import SIDES, w5_images

    first = list(w5_images(80))
    assert first == list(w5_images(80)) and first != list(w5_images(80, seed=1))
    seen = set()
    for name, encoded in first:
        with Image.open(io.BytesIO(encoded)) as image:
            assert SIDES[0] <= min(image.size) and max(image.size) <= SIDES[1], (name, image.size)
            assert name.endswith({"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp"}[image.format])
            seen |= {image.format, image.mode}
    assert {"JPEG", "PNG", "WEBP", "RGB", "L", "RGBA"} <= seen, seen
