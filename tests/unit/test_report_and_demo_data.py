import json

from lakescore.jobs.commands.demo import generate_reviews
from lakescore.jobs.report.files import write_report
from lakescore.jobs.report.model import RunReport


def test_report_is_written_as_json_atomically(tmp_path):
    report = RunReport(
        run_id="r1",
        status="succeeded",
        task="embed",
        input="db.in",
        output="db.out",
        model_id="m",
        model_revision=None,
        model_sha256="ab" * 32,
        input_rows=4,
        output_rows=3,
        error_rows=1,
        errors_table="db.out_errors",
        error_reasons={"null_input": 1},
        delta_version=2,
    )
    target = write_report(report, tmp_path / "nested" / "report.json")
    data = json.loads(target.read_text())
    assert data["run_id"] == "r1" and data["output_rows"] == 3 and data["model_sha256"] == "ab" * 32
    # no temp file left behind; the HTML page beside the JSON
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.html", "report.json"]
    assert data["html_report"] == str(target.with_suffix(".html").resolve())
    assert "4 input rows -> 3 rows for db.out (Delta version 2)" in report.summary()
    assert "1 rows in db.out_errors (null_input 1)" in report.summary()


def test_generated_reviews_are_deterministic_and_long_tailed():
    first = list(generate_reviews(2000, seed=7))
    assert first == list(generate_reviews(2000, seed=7))
    assert [r[0] for r in first] == list(range(1, 2001))
    words = sorted(len(body.split()) for _, body, _ in first)
    assert words[0] >= 3 and words[-1] <= 1500
    assert words[len(words) // 2] < 80 < words[-1] / 3  # many short reviews, a long tail
    assert {stars for *_, stars in first} == {1, 2, 3, 4, 5}
