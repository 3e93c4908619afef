"""``image_classify`` / ``image_embed`` end to end on real Spark + Delta with tiny seeded ViT / CLIP models: a binary
column (a corrupt and a null image dead-lettered, identical images scored once, the digest the bytes' SHA-256), a
column of paths (read on the executors, a missing file dead-lettered ``missing_file``), and a folder of image files
read with ``--input-format images`` (an empty file dead-lettered, other files ignored and counted; the run's staging
key follows each file's length and modification time)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lakescore import transform
from lakescore.jobs.config import load_config
from lakescore.jobs.platform.files.hadoop_files import FUNCTION, STATUS_FUNCTION
from lakescore.jobs.score_job import run_scoring
from lakescore.schemas.output import FILE_COLUMNS
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.registry import get_task
from tests.tiny_vision import encoded, picture, vit_classifier


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    return vit_classifier(tmp_path_factory.mktemp("vit"))


def _own_scores(task: str, model_dir: Path, values: list[bytes]) -> np.ndarray:
    """What the runtime's own head computes for ``values``, in this process: the job must write the same."""
    return get_task(task).load(ModelSpec(task, str(model_dir)), model_dir).score(values)


def _config(**flags):
    return load_config(flags={"spark.master": "local[2]", "max_error_rate": 0.5, **flags})


def test_a_binary_column_into_delta_dead_letters_per_row_and_scores_each_image_once(spark, tmp_path, vit_dir):
    photos = {
        1: encoded(picture(40, 30, 1), "JPEG", quality=90),
        2: encoded(picture(33, 47, 2).convert("RGBA"), "PNG"),
        3: b"\x00not an image at all",
        4: None,
        5: None,  # below: row 1's bytes again
        6: encoded(picture(50, 20, 3).convert("L"), "PNG"),
    }
    photos[5] = photos[1]
    source, output = tmp_path / "photos", tmp_path / "labels"
    frame = pd.DataFrame({"photo_id": list(photos), "photo": list(photos.values())})
    spark.createDataFrame(frame, "photo_id long, photo binary").write.format("delta").save(str(source))

    report = run_scoring(
        _config(
            input=str(source),
            output=str(output),
            task="image_classify",
            id_col="photo_id",
            image_col="photo",
            max_error_rate=0.6,
            **{
                "model.source": str(vit_dir),
                "write.mode": "incremental",
                "scoring.dedup": "on",
                "scoring.max_image_pixels": 1500,
                "scoring.arrow_max_bytes_per_batch": 1,
            },
        ),
        spark,
    )
    assert report.status == "succeeded", report.error
    assert (report.output_rows, report.error_reasons) == (
        3,
        {"image_too_large": 1, "invalid_image": 1, "null_input": 1},
    )
    assert report.dedup["forward_passes_saved"] == 1  # rows 1 and 5 hold the same image
    # Arrow batches are cut by the bytes of the binary column (one image each under a 1-byte bound), not only by rows
    assert report.workers["arrow_batches"] == 5
    out = spark.read.format("delta").load(str(output)).toPandas().sort_values("photo_id").reset_index(drop=True)
    scored = [1, 5, 6]  # row 2's 33 x 47 pixels are over the limit
    assert out["photo_id"].tolist() == scored
    expected = _own_scores("image_classify", vit_dir, [photos[i] for i in scored])
    assert np.abs(np.stack(out["probs"].map(list)) - expected).max() < 1e-5
    labels = get_task("image_classify").load(ModelSpec("image_classify", str(vit_dir)), vit_dir).labels
    assert out["label"].tolist() == [labels[i] for i in expected.argmax(axis=1)]
    assert out["input_digest"].tolist() == [hashlib.sha256(photos[i]).hexdigest() for i in scored]
    errors = spark.read.format("delta").load(f"{output}_errors").toPandas().set_index("photo_id")
    assert errors.loc[3, "reason"] == "invalid_image" and errors.loc[4, "reason"] == "null_input"
    assert errors.loc[2, "reason"] == "image_too_large" and errors.loc[2, "input"].startswith("PNG RGBA 33x47, ")
    assert errors.loc[3, "input"] == f"{len(photos[3])} bytes, sha256 {hashlib.sha256(photos[3]).hexdigest()}"
    assert pd.isna(errors.loc[4, "input"])
    profiled = {s["column"]: s for s in report.profile["inputs"]}["photo"]  # the HTML report: sizes, not bytes
    assert profiled["kind"] == "numeric" and profiled["stats"]["max"] == max(len(v) for v in photos.values() if v)

    # The Python API over the same column: the same labels, the same reasons
    lazily = (
        transform(
            spark.read.format("delta").load(str(source)),
            task="image_classify",
            model=vit_dir,
            image_col="photo",
            id_col="photo_id",
            max_image_pixels=1500,
        )
        .toPandas()
        .set_index("photo_id")
    )
    assert lazily.loc[scored, "label"].tolist() == out["label"].tolist()
    assert lazily.loc[[2, 3, 4], "_reason"].tolist() == ["image_too_large", "invalid_image", "null_input"]


def test_a_path_column_reads_each_file_on_the_executors_and_dead_letters_a_missing_one(spark, tmp_path, vit_dir):
    root = tmp_path / "receipts"
    root.mkdir()
    files = {
        "a.png": encoded(picture(40, 30, 4), "PNG"),
        "b c.jpg": encoded(picture(30, 41, 5), "JPEG"),
        "d.webp": encoded(picture(35, 35, 6), "WEBP"),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    paths = {
        1: str(root / "a.png"),
        2: f"file://{root / 'b c.jpg'}",
        3: str(root / "gone.png"),
        4: None,
        5: f"file:{root / 'd.webp'}",
    }
    source, output = tmp_path / "receipts_table", tmp_path / "receipt_labels"
    spark.createDataFrame(
        pd.DataFrame({"receipt_id": list(paths), "scan": list(paths.values())}), "receipt_id long, scan string"
    ).write.format("delta").save(str(source))

    report = run_scoring(
        _config(
            input=str(source),
            output=str(output),
            task="image_classify",
            id_col="receipt_id",
            image_col="scan",
            **{"model.source": str(vit_dir), "write.mode": "incremental", "scoring.dedup": "on"},
        ),
        spark,
    )
    assert report.status == "succeeded", report.error
    assert (report.output_rows, report.error_reasons) == (3, {"missing_file": 1, "null_input": 1})
    out = spark.read.format("delta").load(str(output)).toPandas().sort_values("receipt_id").reset_index(drop=True)
    assert out["receipt_id"].tolist() == [1, 2, 5] and "_lakescore_image" not in out.columns
    read = [files["a.png"], files["b c.jpg"], files["d.webp"]]
    assert np.abs(np.stack(out["probs"].map(list)) - _own_scores("image_classify", vit_dir, read)).max() < 1e-5
    assert out["input_digest"].tolist() == [hashlib.sha256(data).hexdigest() for data in read]  # the files' bytes
    errors = spark.read.format("delta").load(f"{output}_errors").toPandas().set_index("receipt_id")
    assert (errors.loc[3, "reason"], errors.loc[3, "input"]) == ("missing_file", paths[3])
    assert errors.loc[3, "error"] == f"no file at {paths[3]}" and errors.loc[4, "reason"] == "null_input"
    stats = {1: root / "a.png", 2: root / "b c.jpg", 5: root / "d.webp"}  # each row's own, through dedup's fan-out
    assert out["input_path"].tolist() == [paths[1], paths[2], paths[5]]  # as the column has them
    assert out[["input_length", "input_modified"]].values.tolist() == [_status(stats[i]) for i in (1, 2, 5)]

    # The rerun: a file rewritten with other bytes of the same length and its modification time set back is taken as
    # unchanged without being read (its stored digest stands: the pre-check trades this for reading no file whose
    # status is unchanged); a file touched (a later time, the same bytes) is read, found equal and kept; a file
    # replaced by another picture is scored again.
    before = (root / "a.png").stat()
    (root / "a.png").write_bytes(bytes(reversed(files["a.png"])))
    os.utime(root / "a.png", ns=(before.st_atime_ns, before.st_mtime_ns))
    touched = (root / "b c.jpg").stat()
    os.utime(root / "b c.jpg", ns=(touched.st_atime_ns, touched.st_mtime_ns + 5_000_000_000))
    files["d.webp"] = encoded(picture(41, 29, 7), "WEBP")
    (root / "d.webp").write_bytes(files["d.webp"])
    flags = dict(
        input=str(source),
        task="image_classify",
        id_col="receipt_id",
        image_col="scan",
        max_error_rate=0.7,
        **{"model.source": str(vit_dir), "write.mode": "incremental"},
    )
    rerun = _config(output=str(output), **flags)
    _the_comparison_reads_files_once_after_the_pre_check(spark, rerun)
    again = run_scoring(rerun, spark)
    assert again.status == "succeeded", again.error
    assert (again.rows_kept, again.rows_scored, again.error_reasons) == (2, 1, {"missing_file": 1, "null_input": 1})
    now = spark.read.format("delta").load(str(output)).toPandas().set_index("receipt_id")
    assert now.loc[[1, 2], "run_id"].tolist() == [report.run_id] * 2 and now.loc[5, "run_id"] == again.run_id
    assert now.loc[1, "input_digest"] == hashlib.sha256(read[0]).hexdigest()  # the bytes before the rewrite
    assert now.loc[5, "input_digest"] == hashlib.sha256(files["d.webp"]).hexdigest()
    assert [now.loc[5, "input_length"], now.loc[5, "input_modified"]] == _status(stats[5])
    assert [now.loc[2, "input_length"], now.loc[2, "input_modified"]] == [
        touched.st_size,
        touched.st_mtime_ns // 1_000_000,
    ]

    # An output written before outputs stored file status: merged into as it is, each file read for its digest before
    # the join; a full rescore rewrites it with the file status columns.
    older = tmp_path / "older_labels"
    spark.read.format("delta").load(str(output)).drop(*FILE_COLUMNS).write.format("delta").save(str(older))
    targets, plan, rescored = _compared(
        spark, _config(output=str(older), **flags), _config(output=str(older), **flags, **{"write.full_rescore": True})
    )
    assert not targets.file_status and not targets.replaces_layout and "input_path" not in targets.output_schema.names
    join = plan.index("Join FullOuter")
    assert plan.count(f"{FUNCTION}(") == 1 and plan.index(f"{FUNCTION}(") > join, plan
    assert rescored.file_status and rescored.replaces_layout and "input_path" in rescored.output_schema.names


def test_a_folder_run_scores_each_image_dead_letters_an_empty_one_and_counts_the_others_ignored(
    spark, tmp_path, vit_dir
):
    """Every file under the folder is scored, dead-lettered with its reason (a 0-byte image, which Spark's file scan
    skips, is ``null_input`` as through a path column) or ignored and counted (not an image)."""
    root = tmp_path / "photos"
    (root / "nested").mkdir(parents=True)
    files = {
        "one.jpg": encoded(picture(40, 30, 1), "JPEG", quality=90),
        "nested/two.PNG": encoded(picture(33, 47, 2), "PNG"),
    }
    for name, data in {**files, "x.png": b"", "notes.txt": b"not an image"}.items():
        (root / name).write_bytes(data)
    output = tmp_path / "labels"
    report = run_scoring(
        _config(
            input=str(root),
            input_format="images",
            output=str(output),
            task="image_classify",
            **{"model.source": str(vit_dir)},
        ),
        spark,
    )
    assert report.status == "succeeded", report.error
    assert (report.input_rows, report.output_rows, report.ignored_files) == (3, 2, 1)
    assert report.error_reasons == {"null_input": 1}
    out = spark.read.format("delta").load(str(output)).toPandas().sort_values("path")
    assert [p.split(f"{root}/", 1)[1] for p in out["path"]] == sorted(files)
    errors = spark.read.format("delta").load(f"{output}_errors").toPandas()
    assert errors["path"].tolist() == [f"file:{root / 'x.png'}"] and errors["reason"].tolist() == ["null_input"]
    assert errors["error"].tolist() == ["no image bytes"]


def _folder(root: Path) -> dict[str, bytes]:
    """Image files of every extension, any case, in nested folders; two files that are not images."""
    files = {
        "one.jpg": encoded(picture(40, 30, 1), "JPEG", quality=90),
        "nested/two.PNG": encoded(picture(33, 47, 2).convert("RGBA"), "PNG"),
        "nested/deeper/three.webp": encoded(picture(30, 40, 6), "WEBP"),
        "four.gif": encoded(picture(36, 28, 5).convert("P"), "GIF"),
        "nested/five.bmp": encoded(picture(31, 17, 8), "BMP"),
        "six.Tiff": encoded(picture(25, 35, 9).convert("CMYK"), "TIFF"),
    }
    for name, data in {**files, "notes.txt": b"not an image", "nested/README.md": b"# photos"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def test_a_folder_runs_key_changes_when_a_file_is_replaced_under_its_name(spark, tmp_path):
    """A folder run's staging key covers each file's modification time and length, not only its name: a file replaced
    between a killed run and its rerun is scored again, never taken from the killed run's chunks."""
    import os

    from lakescore.jobs.platform.tables import read_files
    from lakescore.jobs.steps.staging import input_fingerprint

    root = tmp_path / "photos"
    files = _folder(root)

    def key() -> str:
        return input_fingerprint(
            read_files(spark, str(root), ("jpg", "png", "webp", "gif", "bmp", "tiff"))[0], file_stats=True
        )

    before = key()
    assert key() == before  # the same files: the same key
    target = root / "one.jpg"
    stat = target.stat()
    target.write_bytes(bytes(reversed(files["one.jpg"])))  # same name, same length, other bytes, a later time
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    assert key() != before


def _status(path: Path) -> list[int]:
    """A file's length and modification time in milliseconds, as Hadoop's local filesystem gives them."""
    found = path.stat()
    return [found.st_size, found.st_mtime_ns // 1_000_000]


def _compared(spark, cfg, rescore=None):
    """``cfg``'s checked targets, the optimized plan of its comparison with the output, and the targets of the same
    run under ``rescore`` (another config of it)."""
    from lakescore.jobs.steps.incremental import _changed_or_missing
    from lakescore.jobs.steps.prepare import check_input_ids
    from lakescore.jobs.steps.read import check_targets, open_input

    run = open_input(cfg, spark)
    try:
        targets = check_targets(run)
        compared = _changed_or_missing(run, check_input_ids(run).scorable, targets.previous_version, "weights", "spec")
        other = check_targets(dataclasses.replace(run, cfg=rescore)) if rescore is not None else None
        return targets, compared._jdf.queryExecution().optimizedPlan().toString(), other
    finally:
        run.worker_start.wait()


def _the_comparison_reads_files_once_after_the_pre_check(spark, cfg) -> None:
    """The comparison's plan: each file's status is taken below the join with the output, its bytes read once, above
    the join (so only for the rows the pre-check leaves), and no filter on their digest is pushed below that read."""
    targets, plan, _ = _compared(spark, cfg)
    assert targets.file_status
    join = plan.index("Join FullOuter")
    assert plan.count(f"{FUNCTION}(") == 1 and plan.index(f"{FUNCTION}(") < join, plan
    assert plan.index(f"{STATUS_FUNCTION}(") > join, plan


def test_generate_reads_each_image_with_its_prompt_through_the_cli_as_transformers_does_by_hand(
    spark, tmp_path, capsys
):
    """``lakescore score --task generate --image-col`` over a column of paths, the prompt rendered from another column:
    each row's text is transformers' greedy ``generate`` run by hand with the processor; a corrupt image and a missing
    file are that row's dead letters; a language model that reads no images is refused in one line before compute."""
    import torch
    import transformers

    from lakescore.jobs.cli import main
    from tests.tiny_generators import CHAT_TEMPLATE, save_causal, train_tokenizer
    from tests.tiny_vlms import tiny_llava

    model_dir = tiny_llava(tmp_path / "llava")
    root = tmp_path / "products"
    root.mkdir()
    images = {1: picture(40, 30, 8), 2: picture(30, 44, 9), 4: picture(36, 36, 10)}
    for i, image in images.items():
        image.save(root / f"{i}.png")
    (root / "3.png").write_bytes(b"not a png")
    rows = [
        (i, str(root / f"{i}.png"), name)
        for i, name in ((1, "lamp"), (2, "mug"), (3, "chair"), (4, "desk"), (5, "rug"))
    ]
    source, output = tmp_path / "catalog", tmp_path / "captions"
    spark.createDataFrame(
        pd.DataFrame(rows, columns=["sku", "photo", "name"]), "sku long, photo string, name string"
    ).write.format("delta").save(str(source))
    template = "Caption this photo of a {name}."
    flags = [
        "--task",
        "generate",
        "--input",
        str(source),
        "--output",
        str(output),
        "--id-col",
        "sku",
        "--image-col",
        "photo",
        "--prompt-template",
        template,
        "--max-new-tokens",
        "6",
        "--set",
        "max_error_rate=0.5",
        "--set",
        "spark.master=local[2]",
    ]
    assert main(["score", "--model", str(model_dir), *flags, "--write-mode", "incremental"]) == 0
    out = spark.read.format("delta").load(str(output)).toPandas().sort_values("sku").reset_index(drop=True)
    assert out["sku"].tolist() == [1, 2, 4]
    for sku, digest in zip(out["sku"], out["input_digest"]):  # the image's bytes and its prompt
        prompt = template.format(name={r[0]: r[2] for r in rows}[sku])
        image = hashlib.sha256((root / f"{sku}.png").read_bytes()).hexdigest()
        assert digest == hashlib.sha256(f"{image}\n{hashlib.sha256(prompt.encode()).hexdigest()}".encode()).hexdigest()
    processor = transformers.AutoProcessor.from_pretrained(model_dir)
    model = transformers.AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    for sku, text, tokens in zip(out["sku"], out["generated_text"], out["prompt_tokens"]):
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": images[sku]},
                    {"type": "text", "text": template.format(name={r[0]: r[2] for r in rows}[sku])},
                ],
            }
        ]
        inputs = processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
        with torch.no_grad():
            new = model.generate(**inputs, do_sample=False, max_new_tokens=6)[0, inputs["input_ids"].shape[1] :]
        assert (text, tokens) == (processor.decode(new, skip_special_tokens=True), inputs["input_ids"].shape[1])
    errors = spark.read.format("delta").load(f"{output}_errors").toPandas().set_index("sku")
    assert errors.loc[3, "reason"] == "invalid_image" and errors.loc[3, "input"] == str(root / "3.png")
    assert errors.loc[5, "reason"] == "missing_file"

    # Incremental: one product renamed, its photo unchanged on disk: its prompt changed, so it alone is generated again.
    renamed = [(sku, photo, "lamp shade" if sku == 1 else name) for sku, photo, name in rows]
    spark.createDataFrame(
        pd.DataFrame(renamed, columns=["sku", "photo", "name"]), "sku long, photo string, name string"
    ).write.format("delta").mode("overwrite").save(str(source))
    assert (
        main(
            [
                "score",
                "--model",
                str(model_dir),
                *flags,
                "--write-mode",
                "incremental",
                "--set",
                "max_error_rate=0.9",
                "--report",
                str(tmp_path / "again.json"),
            ]
        )
        == 0
    )  # (the two dead-lettered rows are carried)
    again = json.loads((tmp_path / "again.json").read_text())
    assert (again["rows_kept"], again["rows_scored"], again["rows_carried"]) == (2, 1, 2), again

    # The Python API over a binary column: the same texts.
    frame = pd.DataFrame(
        {
            "sku": [1, 2],
            "photo": [(root / "1.png").read_bytes(), (root / "2.png").read_bytes()],
            "name": ["lamp", "mug"],
        }
    )
    lazily = transform(
        spark.createDataFrame(frame, "sku long, photo binary, name string"),
        task="generate",
        model=model_dir,
        image_col="photo",
        id_col="sku",
        prompt_template=template,
        max_new_tokens=6,
    ).toPandas()
    assert lazily.sort_values("sku")["generated_text"].tolist() == out["generated_text"].tolist()[:2]

    tokenizer = train_tokenizer("bos")
    tokenizer.chat_template = CHAT_TEMPLATE
    text_only = save_causal(tmp_path / "llama", tokenizer)
    capsys.readouterr()
    refused = tmp_path / "refused"
    code = main(["score", "--model", str(text_only), *flags[:5], str(refused), *flags[6:]])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert code == 2 and len(err) == 1, err
    assert "not a vision-language model" in err[0] and not refused.exists()
