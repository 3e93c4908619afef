"""Every task end to end into Delta, hostile input, run partitions, resume after a killed driver, the sha256 pin."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from lakescore.jobs.config import load_config
from lakescore.jobs.score_job import run_scoring
from tests.integration.test_score_job import read_output, reviews_frame


def test_classify_into_the_metastore_equals_the_pipeline(spark, tiny_classifier_dir):
    from transformers import pipeline

    spark.sql("CREATE DATABASE IF NOT EXISTS it")
    frame = reviews_frame(60, seed=21)
    spark.createDataFrame(frame).write.format("delta").mode("overwrite").saveAsTable("it.reviews_for_labels")
    cfg = load_config(
        flags={
            "input": "it.reviews_for_labels",
            "output": "it.review_labels",
            "task": "classify",
            "model.source": str(tiny_classifier_dir),
            "id_col": "review_id",
            "text_col": "body",
        }
    )
    report = run_scoring(cfg, spark)
    assert report.status == "succeeded", report.validation
    out = read_output(spark, "it.review_labels")
    assert list(out.columns) == [
        "review_id",
        "label",
        "score",
        "probs",
        "model_id",
        "model_revision",
        "model_sha256",
        "run_id",
    ]
    assert len(out) == 60
    peer = pipeline("text-classification", model=str(tiny_classifier_dir), top_k=None, device="cpu")
    texts = frame.set_index("review_id").loc[out["review_id"], "body"].tolist()
    for i in range(0, 60, 7):  # the pipeline raises on texts over the model's limit; these are within it
        if len(texts[i].split()) > 300:
            continue
        ranked = peer(texts[i])
        ranked = ranked[0] if isinstance(ranked[0], list) else ranked
        assert out["label"][i] == ranked[0]["label"] and abs(out["score"][i] - ranked[0]["score"]) < 1e-4


def test_ner_through_the_cli_into_a_delta_path_equals_the_pipeline(tmp_path, spark, tiny_ner_dir):
    from transformers import pipeline

    from lakescore.jobs.cli import main
    from tests.unit.test_ner import NER_UNSEEN, assert_same_entities

    frame = reviews_frame(24, seed=4)  # generated reviews and the edge cases (empty, 1,500 words, unicode)
    frame = pd.concat([frame, pd.DataFrame({"review_id": range(100, 100 + len(NER_UNSEEN)), "body": NER_UNSEEN})])
    source, output = tmp_path / "reviews.parquet", tmp_path / "entities"
    frame.to_parquet(source)
    code = main(
        [
            "score",
            "--task",
            "ner",
            "--input",
            str(source),
            "--output",
            str(output),
            "--model",
            str(tiny_ner_dir),
            "--id-col",
            "review_id",
            "--text-col",
            "body",
            "--set",
            "scoring.max_batch_tokens=512",
        ]
    )
    assert code == 0
    out = read_output(spark, str(output))
    assert list(out.columns) == ["review_id", "entities", "model_id", "model_revision", "model_sha256", "run_id"]
    assert out["review_id"].tolist() == sorted(frame["review_id"])
    peer = pipeline("token-classification", model=str(tiny_ner_dir), aggregation_strategy="simple", device="cpu")
    texts = frame.set_index("review_id").loc[out["review_id"], "body"]
    for text, entities in zip(texts, out["entities"]):
        assert_same_entities([row.asDict() for row in entities], peer(text), text)
    assert sum(len(e) for e in out["entities"]) >= 100


def test_tabular_by_feature_prefix_into_a_delta_path(tmp_path, spark, tiny_tabular):
    import torch

    module, script, _ = tiny_tabular
    rng = np.random.default_rng(5)
    frame = pd.DataFrame(rng.normal(size=(50, 4)), columns=["feature_a", "feature_b", "feature_c", "feature_d"])
    frame.insert(0, "account_id", np.arange(1000, 1050))
    frame["note"] = "not a feature"
    source = tmp_path / "accounts.parquet"
    frame.to_parquet(source)
    cfg = load_config(
        flags={
            "input": str(source),
            "output": str(tmp_path / "risk"),
            "task": "tabular",
            "model.source": str(script),
            "id_col": "account_id",
            "feature_prefix": "feature_",
        }
    )
    report = run_scoring(cfg, spark)
    assert report.status == "succeeded", report.validation
    out = spark.read.format("delta").load(str(tmp_path / "risk")).toPandas().sort_values("account_id")
    with torch.no_grad():
        peer = module(torch.as_tensor(frame[list(frame.columns[1:5])].to_numpy(), dtype=torch.float32)).double().numpy()
    assert np.allclose(np.stack(out["scores"].to_list()), peer, atol=1e-5)
    assert out["prediction"].tolist() == peer.argmax(1).astype(float).tolist()


def hostile_frame() -> pd.DataFrame:
    texts = [
        "fine",
        None,
        "",
        "x" * 20_000,
        "nul\x00byte\x00inside",
        "שלום עולם, مرحبا بالعالم",
        "日本語の文章と中文句子",
        "emoji 🙂🔥👍🏽",
        "Robert'); DROP TABLE students;--",
        "1 OR 1=1; SELECT * FROM users",
        "Ελληνικά και русский",
        "हिन्दी पाठ",
        "  leading and trailing spaces  ",
        "\n\t\r",
        None,
    ]
    ids = list(range(1, len(texts) + 1))
    ids[14] = 1  # a duplicate id: both copies are dead-lettered
    frame = pd.DataFrame({"review_id": pd.array(ids + [None], dtype="Int64"), "body": texts + ["orphan"]})
    return frame


def test_hostile_table_every_id_accounted_for_exactly_once(tmp_path, spark, job_config):
    source = tmp_path / "hostile.parquet"
    frame = hostile_frame()
    frame.to_parquet(source)
    output, errors = tmp_path / "out", tmp_path / "errs"
    report = run_scoring(
        job_config(input=str(source), output=str(output), errors=str(errors), max_error_rate=0.3), spark
    )
    assert report.status == "succeeded", (report.error, report.validation)
    out = spark.read.format("delta").load(str(output)).toPandas()
    dead = spark.read.format("delta").load(str(errors)).toPandas()
    assert report.error_reasons == {"duplicate_id": 2, "null_id": 1, "null_input": 1}
    assert report.input_rows == len(frame) == len(out) + len(dead)
    assert sorted(dead["reason"]) == ["duplicate_id", "duplicate_id", "null_id", "null_input"]
    assert out["review_id"].is_unique and not set(out["review_id"]) & set(dead["review_id"].dropna())
    scored_texts = frame.set_index("review_id").loc[out["review_id"], "body"]
    assert {"", "x" * 20_000, "nul\x00byte\x00inside", "\n\t\r"} <= set(scored_texts)  # scored, not dead-lettered
    assert all(len(v) == 384 for v in out["embedding"])


def test_replace_run_replaces_only_its_own_rows(tmp_path, spark, job_config):
    source = tmp_path / "reviews.parquet"
    reviews_frame(12).to_parquet(source)
    output = tmp_path / "daily"

    def run(date):
        return run_scoring(
            job_config(input=str(source), output=str(output), run_date=date, **{"write.mode": "replace_run"}), spark
        )

    assert run("2026-11-19").status == "succeeded"
    assert run("2026-11-20").status == "succeeded"
    again = run("2026-11-20")
    assert again.status == "succeeded"
    out = spark.read.format("delta").load(str(output)).toPandas()
    assert out.groupby("run_id").size().to_dict() == {"2026-11-19": 12, "2026-11-20": 12}  # no duplicates
    assert not out.duplicated(["run_id", "review_id"]).any()


def test_wrong_expect_sha256_exits_2_naming_both_digests_and_writes_nothing(tmp_path, spark, minilm_dir, capsys):
    from lakescore.jobs.cli import main
    from lakescore.udfs.models.model_source import weights_sha256

    source = tmp_path / "reviews.parquet"
    reviews_frame(10).to_parquet(source)
    output = tmp_path / "never"
    code = main(
        [
            "score",
            "--input",
            str(source),
            "--output",
            str(output),
            "--model",
            str(minilm_dir),
            "--id-col",
            "review_id",
            "--text-col",
            "body",
            "--expect-sha256",
            "f" * 64,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and weights_sha256(minilm_dir) in err and "f" * 64 in err and "refusing to score" in err
    assert not output.exists() and not Path(f"{output}_errors").exists()


def test_model_that_cannot_load_fails_on_the_executors_with_exit_2_and_writes_nothing(tmp_path, spark, capsys):
    from lakescore.jobs.cli import main

    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"not weights")
    source = tmp_path / "reviews.parquet"
    reviews_frame(10).to_parquet(source)
    output = tmp_path / "never"
    code = main(
        [
            "score",
            "--input",
            str(source),
            "--output",
            str(output),
            "--model",
            str(broken),
            "--id-col",
            "review_id",
            "--text-col",
            "body",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "failed to load or score a sample on executor" in err and str(broken) in err
    assert not output.exists() and not Path(f"{output}_errors").exists()


def test_killed_driver_resumes_from_committed_chunks(tmp_path, minilm_dir, spark):
    """Kill the job's driver (SIGKILL) after some chunks are staged; the rerun scores only the rest."""
    source = tmp_path / "reviews.parquet"
    frame = reviews_frame(160, seed=9)
    frame.to_parquet(source)
    output, report_path = tmp_path / "out", tmp_path / "report.json"
    staging_root = tmp_path / "staging"
    cmd = [
        str(Path(sys.executable).with_name("lakescore")),
        "score",
        "--input",
        str(source),
        "--output",
        str(output),
        "--model",
        str(minilm_dir),
        "--id-col",
        "review_id",
        "--text-col",
        "body",
        "--run-date",
        "2026-11-20",
        "--report",
        str(report_path),
        "--set",
        "write.chunk_rows=40",
        "--set",
        f"write.staging={staging_root}",
        "--set",
        f"spark.warehouse_dir={tmp_path / 'wh'}",
        "--set",
        "spark.master=local[2]",
        "--set",
        "spark.conf.spark.ui.enabled=false",
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    first = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.time() + 300
    while time.time() < deadline and not list(staging_root.glob("*/_delta_log/00000000000000000001.json")):
        assert first.poll() is None, first.stdout.read().decode()[-3000:]
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and its Python workers die mid-run
    first.wait(timeout=60)
    assert not output.exists()  # nothing was published

    rerun = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    import json

    report = json.loads(report_path.read_text())
    assert report["chunks"]["total"] == 4 and report["chunks"]["skipped"] >= 2, report["chunks"]
    assert "resumed:" in rerun.stdout
    out = read_output(spark, str(output))
    assert len(out) == 160 and out["review_id"].is_unique and set(out["review_id"]) == set(frame["review_id"])
    assert not list(staging_root.iterdir()) or not any(p.is_dir() and any(p.iterdir()) for p in staging_root.iterdir())


def test_model_on_a_hadoop_filesystem_is_staged_once_per_host(tmp_path, spark, minilm_dir):
    """A ``file:`` URI goes through the remote path: Hadoop FileSystem copy on the driver, addFile to executors."""
    import shutil

    from lakescore.udfs.models import model_cache

    remote = tmp_path / "bucket" / "minilm"
    shutil.copytree(minilm_dir, remote)
    cache = tmp_path / "model-cache"
    source = tmp_path / "reviews.parquet"
    reviews_frame(16).to_parquet(source)
    uri = f"file://{remote}"
    report = run_scoring(
        load_config(
            flags={
                "input": str(source),
                "output": str(tmp_path / "out"),
                "model.source": uri,
                "id_col": "review_id",
                "text_col": "body",
                "model.cache_dir": str(cache),
            }
        ),
        spark,
    )
    assert report.status == "succeeded" and report.model_id == uri
    assert report.model_sha256 == model_cache.get_model(model_cache.ModelSpec("embed", str(minilm_dir)))[0].sha256
    copies = [p for p in cache.iterdir() if p.is_dir()]
    assert len(copies) == 1 and (copies[0] / "minilm" / "model.safetensors").exists()
    run_scoring(
        load_config(
            flags={  # a second run reuses the host's copy
                "input": str(source),
                "output": str(tmp_path / "out"),
                "model.source": uri,
                "id_col": "review_id",
                "text_col": "body",
                "model.cache_dir": str(cache),
            }
        ),
        spark,
    )
    assert [p for p in cache.iterdir() if p.is_dir()] == copies


def test_empty_input_fails_with_one_line_and_writes_nothing(tmp_path, spark, minilm_dir, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lakescore.jobs.cli import main

    source = tmp_path / "empty.parquet"
    schema = pa.schema([("review_id", pa.int64()), ("body", pa.string()), ("stars", pa.int64())])
    pq.write_table(schema.empty_table(), source)  # typed columns, zero rows (pandas would write body as null type)
    output = tmp_path / "out"
    code = main(
        [
            "score",
            "--input",
            str(source),
            "--output",
            str(output),
            "--model",
            str(minilm_dir),
            "--id-col",
            "review_id",
            "--text-col",
            "body",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        code == 2
        and err == f"lakescore: error: input {str(source)!r} has no rows; nothing to score (nothing was written)"
    )
    assert not output.exists() and not Path(f"{output}_errors").exists()


def test_onnx_backend_classify_end_to_end_into_delta_equals_torch(tmp_path, spark, tiny_classifier_dir, onnx_cache_dir):
    from lakescore.jobs.cli import main

    frame = reviews_frame(40, seed=13)
    source = tmp_path / "reviews.parquet"
    frame.to_parquet(source)
    outputs = {}
    for backend in ("torch", "onnx"):
        output = tmp_path / f"labels-{backend}"
        code = main(
            [
                "score",
                "--task",
                "classify",
                "--input",
                str(source),
                "--output",
                str(output),
                "--model",
                str(tiny_classifier_dir),
                "--id-col",
                "review_id",
                "--text-col",
                "body",
                "--set",
                f"model.backend={backend}",
                "--set",
                f"model.cache_dir={onnx_cache_dir}",
            ]
        )
        assert code == 0
        outputs[backend] = read_output(spark, str(output))
    torch_out, onnx_out = outputs["torch"], outputs["onnx"]
    assert onnx_out["review_id"].tolist() == torch_out["review_id"].tolist() == sorted(frame["review_id"])
    assert onnx_out["label"].tolist() == torch_out["label"].tolist()
    assert np.abs(np.stack(onnx_out["probs"]) - np.stack(torch_out["probs"])).max() < 1e-5
    assert set(onnx_out["model_sha256"]) == set(torch_out["model_sha256"])  # the weights, whatever ran them


def test_int8_outside_tolerance_exits_2_naming_the_figures_and_writes_nothing(
    tmp_path, spark, minilm_dir, onnx_cache_dir, capsys
):
    from lakescore.jobs.cli import main

    source = tmp_path / "reviews.parquet"
    reviews_frame(30, seed=3).to_parquet(source)
    output = tmp_path / "never"
    code = main(
        [
            "score",
            "--input",
            str(source),
            "--output",
            str(output),
            "--model",
            str(minilm_dir),
            "--id-col",
            "review_id",
            "--text-col",
            "body",
            "--backend",
            "onnx",
            "--quantize",
            "int8",
            "--set",
            f"model.cache_dir={onnx_cache_dir}",
            "--set",
            "model.quantize_min_cosine=0.99999",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "outside tolerance" in err and "cosine_p1" in err and "0.99999" in err, err
    assert not output.exists() and not Path(f"{output}_errors").exists()


def test_bfloat16_is_checked_against_float32_then_scores_or_exits_2_writing_nothing(
    tmp_path, spark, minilm_dir, capsys
):
    """A bfloat16 run scores its own input's sample both ways in the preflight, as int8 does: within tolerance it
    scores into Delta (vectors within the tolerance of sentence-transformers' float32); outside it exits 2, one line."""
    from sentence_transformers import SentenceTransformer

    from lakescore.jobs.cli import main

    frame = reviews_frame(30, seed=5)
    source = tmp_path / "reviews.parquet"
    frame.to_parquet(source)
    args = [
        "score",
        "--input",
        str(source),
        "--model",
        str(minilm_dir),
        "--id-col",
        "review_id",
        "--text-col",
        "body",
        "--dtype",
        "bfloat16",
    ]
    refused = tmp_path / "never"
    code = main([*args, "--output", str(refused), "--set", "model.quantize_min_cosine=0.9999999"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "bfloat16 model" in err and "cosine_p1" in err and "model.dtype: float32" in err, err
    assert not refused.exists() and not Path(f"{refused}_errors").exists()

    output, report = tmp_path / "bf16", tmp_path / "bf16-report.json"
    assert main([*args, "--output", str(output), "--report", str(report)]) == 0
    scored = frame.dropna(subset=["body"]).set_index("review_id")
    check = json.loads(report.read_text())["precision_check"]  # the run keeps what it proved: the sample is every text
    assert check["path"] == "bfloat16" and check["sample_rows"] == len(scored) and 0.99 <= check["cosine_p1"] < 1.0, (
        check
    )
    printed = capsys.readouterr()
    assert (
        f"bfloat16: within tolerance of float32 on {len(scored)} sampled rows (cosine_p1 0.99"
        in printed.out + printed.err
    )
    out = read_output(spark, str(output)).set_index("review_id")
    ours = np.stack(out.loc[scored.index, "embedding"])
    expected = SentenceTransformer(str(minilm_dir), device="cpu").encode(
        scored["body"].tolist(), normalize_embeddings=True
    )
    cosine = (ours * expected).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.99 and cosine.min() < 1 - 1e-7  # bfloat16 ran (not float32), within the tolerance
