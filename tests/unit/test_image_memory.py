"""Executor memory stays flat over a table mixing 10 kB and 50 MB images (issue 36, item 4).

A fresh Python process does what a scoring task's worker does, without Spark: the executor's scoring loop
(:func:`~lakescore.udfs.scoring_udf.score_batches`: the image runner, the next batch prepared ahead in a thread)
over Arrow batches cut at ``scoring.arrow_max_bytes_per_batch``, and reports how far its RSS peaked over the table
after a warm-up batch (the kernel's peak, ``VmHWM``, reset before it: Linux only). Decoded images are held one
preprocessing chunk at a time, so the table costs at most the Arrow batches in flight and one chunk's decoded
pixels with the processor's working copies; the same batches decoded whole (chunks unbounded) cost far more, which
shows the bound would catch it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lakescore.jobs.config import ScoringConfig
from lakescore.udfs.images import DEFAULT_MAX_BATCH_PIXELS
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.registry import get_task
from lakescore.udfs.scoring_udf import score_batches

Image = pytest.importorskip("PIL.Image")

from tests.tiny_vision import encoded, picture, vit_classifier  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
SIDE = 4096
"""A big image's side: SIDE x SIDE RGB pixels are 50 MB decoded, exactly one preprocessing chunk's pixel budget."""
SMALL_ROWS, BIG_JPEGS, BIG_PNGS = 300, 6, 2
BYTES_PER_CHUNK_PIXEL = 14
"""Memory per decoded pixel of a chunk: Pillow's image (4 bytes: RGB is stored as RGBX) and the processor's numpy
copy of it (3), held for the chunk; while the processor resizes an image, its uint8 copy (3) and the Pillow image
made from that (4)."""
SLACK = 128 * MiB
"""What the allocator keeps of freed blocks (Pillow allocates images in blocks that glibc serves from its heaps once
a few were freed), pixel values and outputs."""


def _batches(small: bytes, jpeg: bytes, png: bytes, max_bytes: int):
    """The table as the executor receives it: Arrow batches of the ``image`` column, each cut before the row that
    would take it over ``max_bytes`` (a bigger row alone), built one at a time as the worker reads them."""
    half = SMALL_ROWS // 2
    rows = [small] * half
    for k in reversed(range(BIG_JPEGS)):  # the big JPEGs among the first half's small images
        rows.insert(k * (half // BIG_JPEGS), jpeg)
    rows += [png] + [small] * (SMALL_ROWS - half) + [png] * (BIG_PNGS - 1)  # a big PNG after each half
    part, size = [], 0
    for data in rows:
        if part and size + len(data) > max_bytes:
            yield pa.record_batch({"image": pa.array(part, pa.binary())})
            part, size = [], 0
        part.append(data)
        size += len(data)
    yield pa.record_batch({"image": pa.array(part, pa.binary())})


def _peaks(model_dir: str, images_dir: str) -> None:
    """In a fresh process, after a warm-up batch: how far RSS peaked over the table, and over its first batch again
    with chunks unbounded; printed as JSON with the Arrow batches' sizes."""
    folder = Path(images_dir)
    small, jpeg, png = ((folder / name).read_bytes() for name in ("small.jpg", "big.jpg", "big.png"))
    spec = ModelSpec("image_classify", model_dir)
    types = get_task("image_classify").output_arrow_types
    max_bytes = ScoringConfig().arrow_max_bytes_per_batch

    def run(batches, **options) -> list[int]:
        sizes = []
        for batch, scored in score_batches(spec, ["image"], batches, types, None, 256, options):
            assert all(reason is None for reason in scored.reasons), set(scored.errors)
            sizes.append(batch.nbytes)
        return sizes

    def status(field: str) -> int:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
        return int(line.split()[1]) * 1024  # kB

    def growth(work) -> tuple[int, object]:
        """How far RSS peaked above where it stood when ``work`` started: the kernel's peak (VmHWM) is reset first
        (``clear_refs`` 5), so an earlier phase's higher peak (loading the model) cannot hide this one's."""
        Path("/proc/self/clear_refs").write_text("5")
        start = status("VmRSS")
        result = work()
        return status("VmHWM") - start, result

    run(iter([pa.record_batch({"image": pa.array([small] * 16, pa.binary())})]))  # the model loaded, torch warm
    table, sizes = growth(lambda: run(_batches(small, jpeg, png, max_bytes)))
    first = next(_batches(small, jpeg, png, max_bytes))
    unbounded, _ = growth(lambda: run(iter([first]), max_batch_pixels=1 << 40, max_batch_images=1 << 20))
    print(json.dumps({"table": table, "unbounded": unbounded, "batches": sizes, "max_bytes": max_bytes}))


def _big_picture() -> bytes:
    """A SIDE x SIDE photo-like JPEG: smooth gradients, a megabyte or two encoded."""
    ramp = Image.linear_gradient("L").resize((SIDE, SIDE))
    return encoded(
        Image.merge("RGB", (ramp, ramp.rotate(90), Image.radial_gradient("L").resize((SIDE, SIDE)))), "JPEG", quality=90
    )


def _big_noise() -> bytes:
    """A SIDE x SIDE PNG of noise, stored uncompressed: 50 MB encoded as well as decoded."""
    pixels = np.random.default_rng(0).integers(0, 256, size=(SIDE, SIDE, 3), dtype=np.uint8)
    return encoded(Image.fromarray(pixels), "PNG", compress_level=0)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable peak RSS")
def test_executor_memory_stays_flat_over_a_table_mixing_10_kb_and_50_mb_images(tmp_path):
    model = vit_classifier(tmp_path / "vit")
    images = {
        "small.jpg": encoded(picture(192, 192, 1), "JPEG", quality=90),
        "big.jpg": _big_picture(),
        "big.png": _big_noise(),
    }
    assert 5_000 < len(images["small.jpg"]) < 20_000 and len(images["big.png"]) > 50_000_000, {
        k: len(v) for k, v in images.items()
    }
    for name, data in images.items():
        (tmp_path / name).write_bytes(data)
    code = "import sys; from tests.unit.test_image_memory import _peaks; _peaks(*sys.argv[1:])"
    done = subprocess.run(
        [sys.executable, "-c", code, str(model), str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])

    assert SIDE * SIDE == DEFAULT_MAX_BATCH_PIXELS and len(found["batches"]) == 2
    assert max(found["batches"]) <= found["max_bytes"]
    # Both Arrow batches are alive while the first is prepared (the worker reads the next batch ahead), each within
    # the byte bound; one chunk's decoded pixels with the processor's copies; the decoder's copy of the encoded bytes.
    bound = 2 * found["max_bytes"] + BYTES_PER_CHUNK_PIXEL * DEFAULT_MAX_BATCH_PIXELS + len(images["big.png"]) + SLACK
    assert found["table"] <= bound, (found["table"] / MiB, bound / MiB, found)
    # The first batch's images decoded together (chunks unbounded) break the bound: the test tells the difference.
    assert found["unbounded"] > bound, (found["unbounded"] / MiB, bound / MiB)
