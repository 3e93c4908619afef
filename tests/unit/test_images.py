"""Image tasks on tiny seeded ViT / CLIP models built here, over images of every mode and format made here.

``image_classify`` against ``transformers.pipeline("image-classification", top_k=None)``, ``image_embed`` against
``get_image_features`` (and a backbone's pooled output), CLIP's text tower through ``embed`` against
``get_text_features``; decoding against transformers' ``load_image``; each per-row failure reason; chunks bounded
by decoded pixels.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField

from lakescore.schemas.output import prediction_columns, scored_schema
from lakescore.udfs.batching import AdaptiveBudget, BatchPolicy, score_texts
from lakescore.udfs.images import decode_image, image_tokens, pixel_limit, preprocess_chunks, read_header
from lakescore.udfs.models import model_cache
from lakescore.udfs.models.model_fit import check_model_fits
from lakescore.udfs.models.model_source import ModelSpec, UnfitModelError
from lakescore.udfs.registry import get_task
from lakescore.udfs.runners import ImageRunner
from lakescore.udfs.scoring_udf import make_scoring_function

Image = pytest.importorskip("PIL.Image")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.tiny_vision import LABELS, VISION, encoded, picture, tiny_clip, vit_classifier  # noqa: E402

BUDGET = BatchPolicy(max_tokens=1024, max_rows=4)


def _sixteen_bit(width: int, height: int):
    values = (np.linspace(0, 65535, width * height).reshape(height, width)).astype(np.uint16)
    return Image.fromarray(values)


def _exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    return encoded(picture(48, 20, 7), "JPEG", exif=exif.tobytes())


IMAGES = {
    "rgb.jpg": lambda: encoded(picture(40, 30, 1), "JPEG", quality=90),
    "rgba.png": lambda: encoded(picture(33, 47, 2).convert("RGBA"), "PNG"),
    "gray.png": lambda: encoded(picture(50, 20, 3).convert("L"), "PNG"),
    "gray_alpha.png": lambda: encoded(picture(21, 21, 4).convert("LA"), "PNG"),
    "palette.gif": lambda: encoded(picture(36, 28, 5).convert("P"), "GIF"),
    "rgba.webp": lambda: encoded(picture(30, 40, 6).convert("RGBA"), "WEBP"),
    "bilevel.bmp": lambda: encoded(picture(31, 17, 8).convert("1"), "BMP"),
    "cmyk.tiff": lambda: encoded(picture(25, 35, 9).convert("CMYK"), "TIFF"),
    "cmyk.jpg": lambda: encoded(picture(29, 26, 10).convert("CMYK"), "JPEG"),
    "sixteen_bit.png": lambda: encoded(_sixteen_bit(40, 24), "PNG"),
    "sixteen_bit.tiff": lambda: encoded(_sixteen_bit(24, 40), "TIFF"),
    "exif_rotated.jpg": _exif_rotated,
}


def _bomb_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` RGB pixels, with a few bytes of data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


@pytest.fixture(scope="module")
def images():
    return {name: make() for name, make in IMAGES.items()}


@pytest.fixture(scope="module")
def image_files(images, tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    for name, data in images.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    return vit_classifier(tmp_path_factory.mktemp("vit"))


@pytest.fixture(scope="module")
def multi_label_vit_dir(tmp_path_factory):
    return vit_classifier(tmp_path_factory.mktemp("vit_multi"), problem_type="multi_label_classification")


@pytest.fixture(scope="module")
def vit_backbone_dir(tmp_path_factory):
    target = tmp_path_factory.mktemp("vit_backbone")
    torch.manual_seed(1)
    transformers.ViTModel(transformers.ViTConfig(**VISION)).eval().save_pretrained(target)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return tiny_clip(tmp_path_factory.mktemp("clip"))


def _head(task: str, model_dir):
    return get_task(task).load(ModelSpec(task, str(model_dir)), model_dir)


def _run(runner: ImageRunner, values, policy=BUDGET):
    prepared = runner.prepare(pa.record_batch({"image": pa.array(values, pa.binary())}))
    scored = runner.score(prepared, AdaptiveBudget(policy))
    return prepared, scored


def _reference_image(path):
    from transformers.image_utils import load_image

    return load_image(str(path))


def test_decoding_equals_load_image_for_every_mode_and_format(images, image_files):
    modes = set()
    for name, data in images.items():
        header, failure = read_header(data, 10**8)
        assert failure is None
        modes.add(header.mode)
        decoded = decode_image(data)
        assert decoded.mode == "RGB"
        assert np.array_equal(np.asarray(decoded), np.asarray(_reference_image(image_files / name))), name
    assert {"RGB", "RGBA", "L", "LA", "P", "1", "CMYK", "I;16"} <= modes
    assert decode_image(images["exif_rotated.jpg"]).size == (20, 48)  # stored 48 x 20, displayed upright


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow warns on the bomb it opens
def test_each_unreadable_row_is_refused_with_its_reason_and_the_rest_scored(vit_dir, images):
    good = images["rgb.jpg"]
    big = encoded(picture(64, 64, 11), "PNG")
    values = [good, None, b"", b"\x00garbage, not an image" * 3, images["rgba.png"][:200], _bomb_png(), big, good]
    runner = ImageRunner(_head("image_classify", vit_dir), ["image"], max_image_pixels=64 * 64 - 1)
    prepared, scored = _run(runner, values)
    assert scored.reasons == [
        None,
        "null_input",
        "null_input",
        "invalid_image",
        "invalid_image",
        "image_too_large",
        "image_too_large",
        None,
    ]
    assert scored.errors[3] == "not an image format Pillow reads"
    assert "truncated" in scored.errors[4] or "EOF" in scored.errors[4], scored.errors[4]
    assert (
        "decompression bomb" in scored.errors[5] and "64x64 = 4096 pixels, above the limit of 4095" in scored.errors[6]
    )
    # between Pillow's warning and error thresholds: refused by the header check at Pillow's limit, nothing decoded
    header, refused = read_header(_bomb_png(10_000, 10_000), pixel_limit(None))
    assert (
        header.pixels == 10**8
        and refused.reason == "image_too_large"
        and refused.error.endswith(f"above the limit of {Image.MAX_IMAGE_PIXELS}")
    )
    assert np.allclose(scored.outputs[0], scored.outputs[7]) and np.isclose(scored.outputs[0].sum(), 1.0)
    raw = runner.raw_inputs(prepared, scored)
    assert raw[0] is None and raw[1] is None and raw[2] == "0 bytes"
    assert raw[3].startswith("66 bytes, sha256 ") and raw[6].startswith("PNG RGB 64x64, ")
    import hashlib

    assert raw[5].endswith(hashlib.sha256(values[5]).hexdigest()) and raw[5].startswith(f"{len(values[5])} bytes")


def _pipeline_probs(pipe, path, labels) -> np.ndarray:
    by_label = {r["label"]: r["score"] for r in pipe(str(path))}
    return np.array([by_label[label] for label in labels])


@pytest.mark.parametrize("model", ["vit_dir", "multi_label_vit_dir"])
def test_image_classify_equals_the_pipeline(model, request, images, image_files):
    model_dir = request.getfixturevalue(model)
    head = _head("image_classify", model_dir)
    names = list(images)
    _prepared, scored = _run(ImageRunner(head, ["image"]), [images[n] for n in names])
    assert scored.ok.all()
    pipe = transformers.pipeline("image-classification", model=str(model_dir), top_k=None)
    expected = np.stack([_pipeline_probs(pipe, image_files / n, head.labels) for n in names])
    assert np.abs(scored.outputs - expected).max() < 1e-4
    assert head.activation == ("sigmoid" if model == "multi_label_vit_dir" else "softmax")
    label, score, probs = head.columns(scored.outputs, scored.ok)
    assert label.to_pylist() == [head.labels[i] for i in expected.argmax(axis=1)]
    assert np.allclose(score.to_numpy(), expected.max(axis=1), atol=1e-4)
    assert np.allclose(np.array(probs.to_pylist()), expected, atol=1e-4)


def _pixels(model_dir, paths):
    """What the image pipelines feed the model: each file through ``load_image``, then the model's own processor."""
    processor = transformers.AutoImageProcessor.from_pretrained(model_dir)
    return processor(images=[_reference_image(p) for p in paths], return_tensors="pt")["pixel_values"]


def _normalised(vectors) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64).reshape(len(vectors), -1)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_image_embed_equals_get_image_features_and_a_backbones_pooled_output(
    clip_dir, vit_backbone_dir, images, image_files
):
    names = list(images)
    paths = [image_files / n for n in names]
    clip = transformers.CLIPModel.from_pretrained(clip_dir).eval()
    backbone = transformers.ViTModel.from_pretrained(vit_backbone_dir).eval()
    with torch.inference_mode():
        expected = {
            clip_dir: _normalised(clip.get_image_features(pixel_values=_pixels(clip_dir, paths)).pooler_output),
            vit_backbone_dir: _normalised(backbone(pixel_values=_pixels(vit_backbone_dir, paths)).pooler_output),
        }
    for model_dir, reference in expected.items():
        _, scored = _run(ImageRunner(_head("image_embed", model_dir), ["image"]), [images[n] for n in names])
        assert scored.ok.all() and scored.outputs.dtype == np.float32
        cosine = (_normalised(scored.outputs) * reference).sum(axis=1)
        assert cosine.min() > 0.9999 and np.allclose(np.linalg.norm(scored.outputs, axis=1), 1.0, atol=1e-5)


def test_a_classifier_checkpoint_has_no_trained_pooler_to_embed_with(vit_dir):
    with pytest.raises(
        UnfitModelError, match=r"task image_embed: .* loads as ViTModel without weights its output reads \(pooler"
    ):
        _head("image_embed", vit_dir)


def test_a_vision_backbone_has_no_classifier_for_image_classify(vit_backbone_dir, vit_dir):
    """A ViT base saved without a classifier: transformers would add a random one. Refused on the driver by its
    architecture, and on the executors by the classifier weights it lacks, in one line naming task, class, weights."""
    with pytest.raises(
        UnfitModelError, match=r"^task image_classify: .* holds a ViTModel \(config.json architectures\)"
    ):
        check_model_fits(ModelSpec("image_classify", str(vit_backbone_dir)), vit_backbone_dir)
    with pytest.raises(
        UnfitModelError,
        match=r"^task image_classify: .* loads as ViTForImageClassification without "
        r"weights its output reads \(classifier.bias, classifier.weight\)",
    ):
        _head("image_classify", vit_backbone_dir)
    check_model_fits(ModelSpec("image_classify", str(vit_dir)), vit_dir)  # a classifier fits
    check_model_fits(
        ModelSpec("image_embed", str(vit_backbone_dir)), vit_backbone_dir
    )  # any model embeds by its pooler


def test_clip_text_through_embed_lands_in_the_image_space(clip_dir, images, image_files):
    texts = ["hello world", "a photo of a cat", "hi", "", "Ünïcödé — punctuation!?"]
    embedder = _head("embed", clip_dir)
    vectors = score_texts(texts, embedder, BUDGET).outputs
    clip = transformers.CLIPModel.from_pretrained(clip_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(clip_dir)
    with torch.inference_mode():
        expected = _normalised(
            clip.get_text_features(**tokenizer(texts, padding=True, return_tensors="pt")).pooler_output
        )
    assert ((_normalised(vectors) * expected).sum(axis=1)).min() > 0.9999
    # the similarity CLIP computes between these texts and images, from two lakescore runs
    _, scored = _run(ImageRunner(_head("image_embed", clip_dir), ["image"]), list(images.values()))
    with torch.inference_mode():
        pixels = _pixels(clip_dir, [image_files / n for n in images])
        reference = _normalised(clip.get_image_features(pixel_values=pixels).pooler_output) @ expected.T
    assert np.abs(scored.outputs @ vectors.T - reference).max() < 1e-4


def test_a_big_image_is_preprocessed_apart_from_small_ones_and_rows_come_back_in_order(vit_dir, images):
    head = _head("image_classify", vit_dir)
    small = [images["rgb.jpg"], images["gray.png"], images["rgba.webp"], images["palette.gif"]]
    big = encoded(picture(400, 300, 12), "PNG")
    values = small[:2] + [big] + small[2:]
    budget = 400 * 300  # the big image fills a chunk alone; the four small ones (about 1,100 pixels each) share one
    prepared, scored = _run(ImageRunner(head, ["image"], max_batch_pixels=budget), values)
    chunks = prepared.images.chunks
    assert [c.rows for c in chunks] == [(2,), (0, 1, 3, 4)]
    assert chunks[0].pixels == 400 * 300 and chunks[1].pixels == sum(read_header(v, 10**8)[0].pixels for v in small)
    assert chunks[0].encoded_bytes == len(big)
    _, one_chunk = _run(ImageRunner(head, ["image"]), values)
    assert np.allclose(scored.outputs, one_chunk.outputs, atol=1e-6) and scored.ok.all()
    _, alone = _run(ImageRunner(head, ["image"]), [small[2]])
    assert np.allclose(scored.outputs[3], alone.outputs[0], atol=1e-6)
    # rows per chunk are bounded too
    prepared, _ = _run(ImageRunner(head, ["image"], max_batch_images=3), values)
    assert [len(c.rows) for c in prepared.images.chunks] == [3, 2]


def test_an_image_counts_its_patches_against_the_token_budget_as_text_counts_tokens(vit_dir, images):
    assert image_tokens(np.zeros((2, 3, 224, 224), np.float32)) == 196 and image_tokens(np.zeros((1, 3, 8, 8))) == 1
    head = _head("image_classify", vit_dir)  # 32x32 inputs: 4 tokens an image
    forwards, model_forward = [], head.forward

    def forward(features):  # the real forward, counting the rows of each batch
        forwards.append(len(features["pixel_values"]))
        return model_forward(features)

    head.forward = forward
    runner = ImageRunner(head, ["image"])
    values = [images[name] for name in ("rgb.jpg", "gray.png", "rgba.webp", "palette.gif", "cmyk.jpg")]
    prepared, scored = _run(runner, values, BatchPolicy(max_tokens=8, max_rows=256))
    assert forwards == [2, 2, 1] and scored.ok.all()
    assert runner.row_costs(prepared).tolist() == [4] * 5
    _, by_rows = _run(
        ImageRunner(_head("image_classify", vit_dir), ["image"]), values, BatchPolicy(max_tokens=10**6, max_rows=256)
    )
    assert np.allclose(scored.outputs, by_rows.outputs, atol=1e-6)


def test_an_image_the_processor_rejects_is_refused_alone_and_mixed_shapes_fail_once(images):
    """A real numpy preprocessor that rejects images 50 pixels wide, or keeps each image's own size."""

    def picky(batch):
        if any(image.width == 50 for image in batch):
            raise ValueError("cannot preprocess a 50-pixel-wide image")
        return np.stack([np.asarray(image.resize((4, 4)), dtype=np.float32) for image in batch])

    values = [images["rgb.jpg"], images["gray.png"], images["cmyk.jpg"]]  # 40, 50 and 29 pixels wide
    done = preprocess_chunks(values, picky, 10**8, BatchPolicy(10**8, 8))
    assert done.ok.tolist() == [True, False, True] and done.failures[1].reason == "prepare_error"
    assert done.failures[1].error == "ValueError: cannot preprocess a 50-pixel-wide image"
    assert np.array_equal(done.pixel_values[2], picky([decode_image(values[2])])[0]) and not done.pixel_values[1].any()
    with pytest.raises(ValueError, match="need a processor that resizes every image to one shape"):
        preprocess_chunks(
            values, lambda batch: np.stack([np.asarray(image) for image in batch]), 10**8, BatchPolicy(10**8, 8)
        )


def test_the_worker_function_scores_a_binary_column_and_dead_letters_per_row(vit_dir, images):
    model_cache.clear()
    spec = ModelSpec("image_classify", str(vit_dir))
    assert prediction_columns("image_classify") == prediction_columns("classify")
    schema = scored_schema("image_classify", StructField("id", LongType()))
    score = make_scoring_function(
        spec,
        keep_cols=["id"],
        input_cols=["image"],
        schema=schema,
        max_tokens=None,
        max_rows=2,
        runner_options={"max_image_pixels": 40 * 30},
    )
    batch = pa.record_batch(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "image": pa.array([images["rgb.jpg"], b"nope", images["gray.png"], images["cmyk.tiff"]], pa.large_binary()),
        }
    )
    rows = pa.Table.from_batches(list(score(iter([batch])))).to_pylist()
    assert [r["_reason"] for r in rows] == [None, "invalid_image", None, None]
    assert rows[1]["label"] is None and rows[1]["_input"].startswith("4 bytes, sha256 ")
    assert all(r["label"] in LABELS.values() and len(r["probs"]) == 3 for r in (rows[0], rows[2], rows[3]))
    model = model_cache.get_model(spec)[0]
    assert model.scorer.score(get_task("image_classify").input_kind.preflight_sample(spec)).shape == (1, 3)
    refused = make_scoring_function(
        spec,
        keep_cols=["id"],
        input_cols=["image"],
        schema=schema,
        max_tokens=None,
        max_rows=2,
        runner_options={"max_image_pixels": 40 * 30 - 1},
    )
    rows = pa.Table.from_batches(list(refused(iter([batch])))).to_pylist()
    assert [r["_reason"] for r in rows] == ["image_too_large", "invalid_image", None, None]
    with pytest.raises(TypeError, match="image column 'image' is string"):
        list(score(iter([pa.record_batch({"id": pa.array([1], pa.int64()), "image": pa.array(["/a.png"])})])))
    model_cache.clear()


def test_image_tasks_load_in_reduced_precision_on_torch(vit_dir, images):
    spec = dataclasses.replace(ModelSpec("image_classify", str(vit_dir)), dtype="bfloat16")
    head = get_task("image_classify").load(spec, vit_dir)
    out = head.score([images["rgb.jpg"]])
    assert out.shape == (1, 3) and np.isclose(out.sum(), 1.0, atol=1e-3)
    assert get_task("image_classify").backends == ("torch",) == get_task("image_embed").backends


def test_image_files_are_read_by_path_and_uri_and_a_missing_one_is_none(images, image_files):
    from lakescore.udfs.image_files import local_path, read_file, read_in_slices

    path = image_files / "rgb.jpg"
    for named in (str(path), f"file:{path}", f"file://{path}", f"file://localhost{path}"):
        assert read_file(named) == images["rgb.jpg"], named
    assert local_path("dbfs:/mnt/photos/a.png") == "/dbfs/mnt/photos/a.png" and local_path("s3a://bucket/a.png") is None
    assert read_file(str(image_files / "gone.png")) is None and read_file(str(image_files)) is None
    with pytest.raises(OSError, match="cannot read 's3a://bucket/a.png': without lakescore's Hadoop file reader"):
        read_file("s3a://bucket/a.png")  # only the JVM's Hadoop filesystem reads other URIs
    names = ["rgb.jpg", "gray.png", "cmyk.tiff"]
    paths = [
        str(image_files / names[0]),
        None,
        str(image_files / names[1]),
        str(image_files / "gone.png"),
        str(image_files / names[2]),
    ]
    budget = len(images["rgb.jpg"]) + len(images["gray.png"])
    slices = list(read_in_slices(paths, budget))
    assert [len(s) for s in slices] == [4, 1]  # the third file would exceed the budget: it starts the next slice
    assert [value for part in slices for value in part] == [
        images["rgb.jpg"],
        None,
        images["gray.png"],
        None,
        images["cmyk.tiff"],
    ]


def test_a_files_status_is_its_length_and_time_in_milliseconds_without_reading_it(image_files):
    from lakescore.udfs.image_files import file_status

    path = image_files / "rgb.jpg"
    os.utime(path, ns=(0, 1_700_000_000_123_456_789))  # Hadoop's local filesystem keeps milliseconds, truncated
    for named in (str(path), f"file:{path}", f"file://{path}"):
        assert file_status(named) == (path.stat().st_size, 1_700_000_000_123), named
    assert file_status(None) is None and file_status(str(image_files / "gone.png")) is None
    assert file_status(str(image_files)) is None  # a directory, as the Hadoop function says
    with pytest.raises(OSError, match="cannot read 's3a://bucket/a.png'"):
        file_status("s3a://bucket/a.png")


def test_a_path_column_reads_files_and_dead_letters_a_missing_one_with_its_path(vit_dir, images, image_files):
    model_cache.clear()
    spec = ModelSpec("image_classify", str(vit_dir))
    schema = scored_schema("image_classify", StructField("id", LongType()))
    score = make_scoring_function(
        spec, keep_cols=["id"], input_cols=["image", "path"], schema=schema, max_tokens=None, max_rows=2
    )
    gone = str(image_files / "gone.png")
    batch = pa.record_batch(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "image": pa.array([images["rgb.jpg"], None, None, b"nope"], pa.binary()),
            "path": pa.array([str(image_files / "rgb.jpg"), gone, None, "/x/corrupt.png"]),
        }
    )
    rows = pa.Table.from_batches(list(score(iter([batch])))).to_pylist()
    assert [r["_reason"] for r in rows] == [None, "missing_file", "null_input", "invalid_image"]
    assert (
        rows[1]["_error"] == f"no file at {gone}"
        and rows[1]["_input"] == gone
        and rows[3]["_input"] == "/x/corrupt.png"
    )
    model_cache.clear()


def test_a_batch_of_big_images_is_held_once_by_arrow_while_decoded_one_chunk_at_a_time(vit_dir):
    """Python holds views of the Arrow batch's bytes, not copies: the memory Python allocates while a batch of big
    images is prepared stays far below the batch's own size (each image decodes alone, by the pixel budget)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    noise = [Image.fromarray(rng.integers(0, 256, size=(600, 600, 3), dtype=np.uint8)) for _ in range(2)]
    big = [encoded(noise[i % 2], "PNG", compress_level=0) for i in range(8)]  # about 1 MB each, as decoded
    column = pa.array(big, pa.large_binary())
    runner = ImageRunner(_head("image_classify", vit_dir), ["image"], max_batch_pixels=600 * 600)
    values = runner.prepare(pa.record_batch({"image": column.slice(1)})).values
    assert [bytes(v) for v in values] == big[1:] and all(v.obj.address == column.buffers()[2].address for v in values)
    tracemalloc.start()
    try:
        prepared = runner.prepare(pa.record_batch({"image": column}))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert prepared.images.ok.all() and len(prepared.images.chunks) == 8
    assert peak < sum(len(b) for b in big) / 2, peak  # to_pylist copies would hold all of them at once


def test_an_rgba_image_loses_its_alpha_and_an_animated_gif_is_its_first_frame():
    """What README's Images section says (issue 65): the alpha channel is dropped, each pixel's colour kept as stored
    (not blended onto a background), and a multi-frame file is read at its first frame."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGBA", (4, 4), (10, 20, 30, 0)).save(buffer, "PNG")
    image = decode_image(buffer.getvalue())
    assert (image.mode, image.getpixel((0, 0))) == ("RGB", (10, 20, 30))
    frames = [Image.new("RGB", (4, 4), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    assert Image.open(io.BytesIO(buffer.getvalue())).n_frames == 2
    assert decode_image(buffer.getvalue()).getpixel((0, 0)) == (255, 0, 0)
