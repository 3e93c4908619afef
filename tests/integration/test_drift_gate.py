"""The drift gate and the metrics table on real Spark + Delta with tiny seeded models (issue 37, items 1 and 2; issue
45, items 2-4).

A classifier's first run publishes with a note (no baseline); the same model again passes (every figure 0); a new
version that gives every review another label is refused with exit 1, the figures on one line, the output and the errors
table unchanged. Its rerun against a baseline version the output does not have is refused before compute (exit 2); its
rerun without a bound publishes, and both attempts of that run id keep their rows. An embedding model swap is caught by
``min_id_cosine_p5``. Every attempt, interrupted, published or refused, leaves one row in ``<output>_metrics``, a table
that an earlier lakescore wrote without the attempt and cache-write columns.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from datetime import datetime

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from lakescore.jobs.api import score
from lakescore.jobs.cli import main
from lakescore.jobs.platform.spark.interrupts import was_interrupted
from lakescore.jobs.testing_hooks import BARRIER_ENV
from tests.conftest import LABELS
from tests.integration.test_score_job import read_output, reviews_frame

ROWS = 120


def _metrics(spark, output) -> dict:
    """The metrics rows by ``(run id, attempt)``."""
    rows = spark.read.format("delta").load(f"{output}_metrics").collect()
    return {(row["run_id"], row["attempt"]): row.asDict(recursive=True) for row in rows}


def _old_metrics_table(spark, output) -> None:
    """``<output>_metrics`` as lakescore wrote it before attempts were numbered and cache writes counted: no
    ``attempt`` or ``tokens_in_cache_write`` column, one row."""
    from datetime import datetime

    from pyspark.sql import types as T

    from lakescore.jobs.steps.metrics import ATTEMPT, METRICS_SCHEMA

    schema = T.StructType([f for f in METRICS_SCHEMA.fields if f.name not in (ATTEMPT, "tokens_in_cache_write")])
    row = {f.name: None for f in schema.fields} | {
        "run_id": "r-old",
        "status": "succeeded",
        "task": "classify",
        "started_at": datetime(2026, 1, 1),
        "finished_at": datetime(2026, 1, 1, 0, 1),
    }
    spark.createDataFrame([row], schema).write.format("delta").save(f"{output}_metrics")


def _versions(spark, output) -> int:
    return spark.sql(f"DESCRIBE HISTORY delta.`{output}`").count()


def _leaning(tiny_classifier_dir, target, label: str):
    """The tiny classifier with the logit of ``label`` raised: a new version that gives every row that label."""
    import torch
    from transformers import BertForSequenceClassification

    shutil.copytree(tiny_classifier_dir, target)
    model = BertForSequenceClassification.from_pretrained(str(target))
    with torch.no_grad():
        model.classifier.bias[model.config.label2id[label]] += 5.0
    model.save_pretrained(str(target))
    return target


def _interrupted_at(spark, config: dict, step: str, barrier) -> BaseException:
    """``score(spark, **config)`` in this (the main) thread, held at ``step`` and interrupted there by a real SIGINT, as
    Ctrl-C or a scheduler's signal reaches a driver; the exception the run raised."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # the signal raises KeyboardInterrupt here
    ended = threading.Event()

    def interrupt():  # once the run waits at the barrier; never after it ended (it failed before reaching it)
        while not list(barrier.glob("arrived-*")):
            if ended.wait(0.05):
                return
        os.kill(os.getpid(), signal.SIGINT)

    helper = threading.Thread(target=interrupt)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(BARRIER_ENV, f"{step}:2:{barrier}")
            helper.start()
            with pytest.raises(KeyboardInterrupt) as raised:
                score(spark, **config)
    finally:
        ended.set()
        helper.join()
        signal.signal(signal.SIGINT, previous)
    return raised.value


def test_a_classifier_whose_label_mix_moves_is_refused_and_the_same_model_passes(
    tmp_path, spark, tiny_classifier_dir, capsys
):
    source, output = tmp_path / "reviews.parquet", tmp_path / "labels"
    errors_table = f"{output}_errors"
    frame = reviews_frame(ROWS, seed=5)
    frame.loc[0, "body"] = None  # one dead-lettered row a run, for the errors table to hold
    frame.to_parquet(source)
    config = {
        "input": str(source),
        "output": str(output),
        "task": "classify",
        "model": str(tiny_classifier_dir),
        "id_col": "review_id",
        "text_col": "body",
        "max_error_rate": 0.05,
        "validation": {"drift": {"max_label_js": 0.1, "max_score_psi": 0.25}},
    }
    _old_metrics_table(spark, output)

    # Interrupted once it has its plan: no output, but a metrics row that says so.
    stopped = _interrupted_at(spark, {**config, "run_id": "r0"}, "score_stage", tmp_path / "barrier")
    assert was_interrupted(stopped) and not output.exists()

    # A first run has no baseline: it publishes, with a note, and every bound waits for a baseline.
    first = score(spark, **config, run_id="r1")
    assert first.status == "succeeded" and first.delta_version == 0
    assert first.drift["note"] == "no baseline: the output does not exist yet" and first.drift["figures"] == {}
    assert "  drift: no baseline: the output does not exist yet" in first.summary()

    # The same model on the same rows: nothing moved.
    same = score(spark, **config, run_id="r2")
    assert same.status == "succeeded" and same.delta_version == 1, same.error
    assert same.drift["baseline_version"] == 0 and same.drift["exceeded"] == []
    assert same.drift["figures"] == {"label_js": 0.0, "score_psi": 0.0}
    published = read_output(spark, str(output))
    shares = published["label"].value_counts(normalize=True).to_dict()
    assert same.drift["profiles"]["run"]["label_shares"] == pytest.approx(shares)
    assert same.drift["profiles"]["baseline"]["label_shares"] == pytest.approx(shares)

    # A new version that gives every review the label this one gives least: refused with exit 1, the figures on one
    # line, nothing published.
    rarest = min(LABELS.values(), key=lambda label: shares.get(label, 0.0))
    moved = _leaning(tiny_classifier_dir, tmp_path / "leaning", rarest)
    report = tmp_path / "r3.json"
    args = [
        "score",
        "--input",
        str(source),
        "--output",
        str(output),
        "--task",
        "classify",
        "--model",
        str(moved),
        "--id-col",
        "review_id",
        "--text-col",
        "body",
        "--run-id",
        "r3",
        "--set",
        "max_error_rate=0.05",
        "--set",
        "validation.drift.max_label_js=0.1",
        "--set",
        "validation.drift.max_score_psi=0.25",
    ]
    dead_letters = spark.read.format("delta").load(errors_table).toPandas()
    assert set(dead_letters["run_id"]) == {"r2"} and len(dead_letters) == 1
    capsys.readouterr()
    assert main([*args, "--report", str(report)]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lakescore:")]
    assert len(errors) == 1 and errors[0].startswith(
        "lakescore: error: drift past its bounds against version 1: label_js "
    )
    assert "(max 0.1: exceeded)" in errors[0] and errors[0].endswith("The output was not published.")
    refused = json.loads(report.read_text())
    drift = refused["drift"]
    assert refused["status"] == "drift_exceeded" and refused["delta_version"] is None and refused["attempt"] == 1
    assert "label_js" in drift["exceeded"] and drift["gated"] and drift["baseline_version"] == 1
    run_shares, base_shares = drift["profiles"]["run"]["label_shares"], drift["profiles"]["baseline"]["label_shares"]
    assert base_shares == pytest.approx(shares) and run_shares[rarest] > shares.get(rarest, 0.0) + 0.3
    labels = sorted(set(run_shares) | set(base_shares))
    assert drift["figures"]["label_js"] == pytest.approx(
        jensenshannon([run_shares.get(k, 0) for k in labels], [base_shares.get(k, 0) for k in labels], base=2), abs=1e-5
    )
    assert _versions(spark, output) == 2 and read_output(spark, str(output)).equals(published)  # the output unchanged
    # ... and so is the errors table: it goes with the output's rows; the refused run's dead letter is in its report.
    assert (
        spark.read.format("delta").load(errors_table).toPandas().equals(dead_letters)
        and _versions(spark, errors_table) == 2
    )
    assert refused["error_rows"] == 1 and refused["profile"]["dead_letters"]["rows"][0][-1] == "r3"
    page = (tmp_path / "r3.html").read_text(encoding="utf-8")
    assert '<section id="drift">' in page and "<td class=fail>EXCEEDED</td>" in page

    # Rerun against a baseline version the output does not have: a setting that cannot hold, refused before compute.
    assert main([*args, "--set", "validation.drift.baseline=99"]) == 2
    errors_said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lakescore:")]
    assert errors_said == [
        f"lakescore: error: validation.drift.baseline is 99, but output {str(output)!r} has no "
        "readable version 99 (it has versions 0 to 1); name one of those, or previous"
    ]
    assert (
        _versions(spark, output) == 2
        and _versions(spark, errors_table) == 2
        and ("r3", 2) not in _metrics(spark, output)
    )

    # Rerun without a bound: the run id's second attempt resumes its staging and publishes, errors table and all.
    again = score(spark, **{**config, "validation": {}, "model": str(moved)}, run_id="r3", report=str(report))
    assert again.status == "succeeded" and again.delta_version == 2 and again.chunks["skipped"] == again.chunks["total"]
    assert (again.attempt, [a["status"] for a in again.attempts]) == (2, ["drift_exceeded"])
    assert again.drift["figures"]["label_js"] > 0.1 and "drift" not in again.summary()  # no bound: no gate to speak of
    assert set(spark.read.format("delta").load(errors_table).toPandas()["run_id"]) == {"r3"}

    # One metrics row per attempt, published or not, beside the row an earlier lakescore wrote.
    rows = _metrics(spark, output)
    assert {k: v["status"] for k, v in rows.items()} == {
        ("r-old", None): "succeeded",
        ("r0", 1): "interrupted",
        ("r1", 1): "succeeded",
        ("r2", 1): "succeeded",
        ("r3", 1): "drift_exceeded",
        ("r3", 2): "succeeded",
    }
    assert rows["r0", 1]["input_rows"] is None and rows["r0", 1]["label_shares"] is None
    assert all(row["tokens_in_cache_write"] is None for row in rows.values())  # the column added; a classifier: null
    assert rows["r1", 1]["baseline_version"] is None and rows["r1", 1]["drift_note"].startswith("no baseline")
    assert rows["r2", 1]["label_shares"] == pytest.approx(shares) and rows["r2", 1]["delta_version"] == 1
    assert len(rows["r2", 1]["score_deciles"]) == 9 and rows["r2", 1]["score_deciles"] == sorted(
        rows["r2", 1]["score_deciles"]
    )
    first_try = rows["r3", 1]
    assert first_try["label_js"] == drift["figures"]["label_js"] and first_try["drift_exceeded"] == drift["exceeded"]
    assert (first_try["input_rows"], first_try["output_rows"], first_try["delta_version"]) == (ROWS, ROWS - 1, None)
    assert rows["r3", 2]["delta_version"] == 2 and rows["r3", 2]["drift_exceeded"] == []
    # The same instants as the report's (Spark returns them naive, in this process's local time).
    assert [first_try[k].timestamp() for k in ("started_at", "finished_at")] == [
        datetime.fromisoformat(refused[k]).timestamp() for k in ("started_at", "finished_at")
    ]

    # history lists every attempt with its figures, from the attempt's report or else from its metrics row.
    assert main(["history", str(output)]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    by_attempt = {(cells[0], cells[-5] if cells[0] == "r3" else None): cells for cells in listed}
    marks = {figure: "!" if figure in drift["exceeded"] else "" for figure in drift["figures"]}
    assert by_attempt["r3", "1"][3] == "drift_exceeded" and " ".join(by_attempt["r3", "1"]).endswith(
        f"- 1 label_js {drift['figures']['label_js']:.3f}!, score_psi "
        f"{drift['figures']['score_psi']:.3f}{marks['score_psi']}"
    )
    assert by_attempt["r3", "2"][3] == "succeeded" and by_attempt["r3", "2"][-6:-4] == ["2", "2"]
    assert " ".join(by_attempt["r2", None]).endswith("1 1 label_js 0.000, score_psi 0.000")
    assert by_attempt["r-old", None][3] == "succeeded" and by_attempt["r-old", None][-2:] == ["1", "-"]


def _mean_pooled(model_dir, texts) -> np.ndarray:
    """Mean-pooled, L2-normalised embeddings with transformers directly (the plain-HF-dir defaults)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(str(model_dir)), AutoModel.from_pretrained(str(model_dir)).eval()
    batch = tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


def test_an_embedding_model_swap_is_caught_by_the_per_id_cosine(tmp_path, spark, plain_bert_dir):
    import torch
    from transformers import BertModel

    swapped = tmp_path / "swapped-bert"
    shutil.copytree(plain_bert_dir, swapped)
    torch.manual_seed(1)  # the same architecture and width, other weights
    BertModel(BertModel.from_pretrained(str(plain_bert_dir)).config).eval().save_pretrained(
        swapped, safe_serialization=True
    )
    frame = reviews_frame(ROWS, seed=6)
    source, output = tmp_path / "reviews.parquet", tmp_path / "vectors"
    frame.to_parquet(source)
    config = {
        "input": str(source),
        "output": str(output),
        "task": "embed",
        "id_col": "review_id",
        "text_col": "body",
        "validation": {"drift": {"min_id_cosine_p5": 0.9}},
    }

    first = score(spark, **config, model=str(plain_bert_dir), run_id="e1")
    assert first.status == "succeeded" and first.drift["figures"] == {}
    before = read_output(spark, str(output))

    report = score(spark, **config, model=str(swapped), run_id="e2")
    assert report.status == "drift_exceeded" and report.drift["exceeded"] == ["id_cosine_p5"], report.drift
    assert report.drift["ids_compared"] == ROWS and report.delta_version is None
    texts = frame.sort_values("review_id")["body"]
    cosines = np.sum(_mean_pooled(plain_bert_dir, texts) * _mean_pooled(swapped, texts), axis=1)
    assert report.drift["figures"]["id_cosine_p5"] == pytest.approx(
        np.percentile(cosines, 5, method="inverted_cdf"), abs=1e-3
    )
    assert "id_cosine_p5" in report.error and "(min 0.9: exceeded)" in report.error
    assert read_output(spark, str(output)).equals(before) and _versions(spark, output) == 1
    norms = report.drift["profiles"]["run"]["embedding_norm_deciles"]
    assert norms == pytest.approx([1.0] * 9, abs=1e-5)  # normalised vectors
    assert {k: v["status"] for k, v in _metrics(spark, output).items()} == {
        ("e1", 1): "succeeded",
        ("e2", 1): "drift_exceeded",
    }
