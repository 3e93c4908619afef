"""W5: images (issue 36): ``lakescore score --task image_classify`` against a plain single-process loop.

A seeded ViT-base-shaped classifier (:func:`make_w5_model`: 12 layers x 768, patches of 16 at 224 px, 1,000 labels
as ImageNet's, about 86 million parameters) is built from a config and saved with ``save_pretrained`` beside a
``ViTImageProcessor`` once per bench into the bench's data dir; nothing is downloaded. :func:`make_w5_data` writes
``rows`` seeded images of mixed formats (JPEG, PNG, WebP), sizes (64 to 1,024 px a side) and modes (RGB, L, RGBA,
P; a few JPEGs rotated by their EXIF orientation) twice: as a folder of files (``w5_images``, nested) and as a
directory of Parquet files with ``id`` long and ``image`` binary (``w5``). Which one the peers read is
``input_shape``: ``table`` by default (a warehouse table with a binary column, the shape lakescore exists for),
``folder`` (``--input-format images``) on request. Then

1. ``lakescore``: ``lakescore score --task image_classify`` end to end, one whole process (Spark ``local[*]``);
2. ``loop``: :mod:`bench.peers.image_loop`, one process: Pillow decodes each image as transformers' ``load_image``
   does, the model's own processor prepares batches of 32, the model runs on them, torch's default threads.

They run alternately (round-robin, ``repeats`` each) in the same sitting; figures are medians. Targets (printed
with met / NOT met, never enforced): images/s of lakescore's scoring stage (``workers.rows_scored`` over
``step_seconds.score_stage``: decoding, preprocessing and the forward) >= 1.3x the loop's forward alone (images over
the seconds spent in the model, decoding and load excluded); whole process >= 1.0x the loop's wall time; the same
label on every row and probabilities within 1e-4.
"""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bench.alternating import PeerRun, PeerRuns, compare_first_good, run_alternately
from bench.data import FILES
from bench.equivalence import delta_files
from bench.fast_path import verdict
from bench.generation import LOOP_ENV

__all__ = [
    "W5",
    "W5_ROWS",
    "W5_REPEATS",
    "W5_SHAPES",
    "W5Result",
    "make_w5_model",
    "make_w5_data",
    "w5_images",
    "peer_commands",
    "run_w5",
    "compare_labels",
    "w5_lines",
]

W5 = "W5"
W5_ROWS = 3000
W5_REPEATS = 2
W5_SHAPES = ("table", "folder")
W5_SEED = 20261202
LOOP_BATCH = 32
STAGE_TARGET, WHOLE_TARGET, PROB_TOLERANCE = 1.3, 1.0, 1e-4
MODEL_SHAPE = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "image_size": 224,
    "patch_size": 16,
}
LABELS = 1000
SIDES = (64, 1024)
"""Shortest and longest side of a W5 image, in pixels (each side drawn log-uniformly between them)."""
FORMATS = {  # format: (share of images, {mode: share}, file extension)
    "JPEG": (0.6, {"RGB": 0.9, "L": 0.1}, "jpg"),
    "PNG": (0.25, {"RGB": 0.6, "RGBA": 0.2, "L": 0.1, "P": 0.1}, "png"),
    "WEBP": (0.15, {"RGB": 0.8, "RGBA": 0.2}, "webp"),
}
EXIF_ROTATED = 0.05
"""Share of JPEGs stored sideways with an EXIF orientation tag, as phones write them."""


def _picture(rng: np.random.Generator, width: int, height: int):
    """A smooth RGB picture with fine noise: a few seeded colours blown up bicubically, so it compresses like a
    photo."""
    from PIL import Image

    coarse = Image.fromarray(rng.integers(0, 256, size=(4, 5, 3), dtype=np.uint8))
    base = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    noise = rng.integers(-6, 7, size=base.shape, dtype=np.int16)
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def _choice(rng: np.random.Generator, shares: dict[str, float]) -> str:
    """One name of ``shares``, drawn with its share as its probability."""
    names = list(shares)
    weights = np.array([shares[n] for n in names])
    return names[rng.choice(len(names), p=weights / weights.sum())]


def w5_images(rows: int, seed: int = W5_SEED) -> Iterator[tuple[str, bytes]]:
    """W5's images: ``rows`` (relative file name, encoded bytes) pairs, the same for the same seed on every machine."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    low, high = np.log(SIDES[0]), np.log(SIDES[1])
    for i in range(rows):
        width, height = (round(v) for v in np.exp(rng.uniform(low, high, size=2)))
        fmt = _choice(rng, {name: share for name, (share, _, _) in FORMATS.items()})
        mode = _choice(rng, FORMATS[fmt][1])
        image = _picture(rng, width, height)
        if mode == "RGBA":
            alpha = Image.linear_gradient("L").resize((width, height))
            image = Image.merge("RGBA", (*image.split(), alpha))
        elif mode == "P":
            image = image.quantize(colors=int(rng.integers(16, 257)))
        elif mode != "RGB":
            image = image.convert(mode)
        options = {"quality": int(rng.integers(75, 96))} if fmt in ("JPEG", "WEBP") else {}
        if fmt == "JPEG" and rng.random() < EXIF_ROTATED:
            exif = Image.Exif()
            exif[0x0112] = 6  # shown rotated 90 degrees clockwise
            options["exif"] = exif.tobytes()
        buffer = io.BytesIO()
        image.save(buffer, fmt, **options)
        yield f"{i // 500:02d}/{i:05d}.{FORMATS[fmt][2]}", buffer.getvalue()


def make_w5_data(data_dir: Path, rows: int = W5_ROWS) -> dict[str, Path]:
    """Write W5's images under ``data_dir`` as a folder of files and as a Parquet table (``id`` 1..n, ``image``
    binary; :data:`~bench.data.FILES` files); return both paths by input shape."""
    folder, table = data_dir / "w5_images", data_dir / "w5"
    for path in (folder, table):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    images = []
    for name, data in w5_images(rows):
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(data)
        images.append(data)
    bounds = np.linspace(0, len(images), num=max(1, min(FILES, len(images))) + 1).astype(int)
    for part, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        pq.write_table(
            pa.table(
                {
                    "id": pa.array(np.arange(start + 1, stop + 1), pa.int64()),
                    "image": pa.array(images[start:stop], pa.binary()),
                }
            ),
            table / f"part-{part:05d}.parquet",
        )
    return {"table": table, "folder": folder}


def make_w5_model(target: Path) -> Path:
    """Build W5's seeded ViT-base-shaped classifier and its image processor from a config into ``target``
    (``save_pretrained``; safetensors); return ``target``. The same seed gives the same weights on every machine."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(W5_SEED)
    labels = {i: f"class_{i:03d}" for i in range(LABELS)}
    config = ViTConfig(**MODEL_SHAPE, num_labels=LABELS, id2label=labels, label2id={v: k for k, v in labels.items()})
    ViTForImageClassification(config).eval().save_pretrained(target)
    size = MODEL_SHAPE["image_size"]
    ViTImageProcessor(size={"height": size, "width": size}).save_pretrained(target)
    return target


def images_per_second(report: dict) -> float:
    """Images over lakescore's scoring stage, or over the loop's seconds in the model."""
    if "forward_seconds" in report:
        return report["images"] / report["forward_seconds"]
    return (report.get("workers") or {}).get("rows_scored", 0) / report["step_seconds"]["score_stage"]


@dataclass
class W5Result(PeerRuns):
    """Every W5 run by peer (``lakescore``, ``loop``), in run order, and the comparison of their labels."""

    rows: int
    shape: str
    images: str
    runs: dict[str, list[PeerRun]] = field(default_factory=dict)
    equal: dict | None = None


def peer_commands(source: Path, shape: str, model: Path, run_dir: Path) -> dict[str, list[str]]:
    """Each W5 peer's command line over ``source`` (``shape``: ``table`` or ``folder``); its files go under
    ``run_dir``."""
    columns = ["--id-col", "id", "--image-col", "image"] if shape == "table" else ["--input-format", "images"]
    return {
        "lakescore": [
            str(Path(sys.prefix) / "bin" / "lakescore"),
            "score",
            "--input",
            str(source),
            "--output",
            str(run_dir / "delta"),
            "--task",
            "image_classify",
            "--model",
            str(model),
            *columns,
            "--report",
            str(run_dir / "report.json"),
            # a fresh warehouse and Derby metastore per run: embedded Derby is single-process
            "--set",
            f"spark.warehouse_dir={run_dir / 'warehouse'}",
            "--set",
            f"spark.metastore_dir={run_dir / 'metastore_db'}",
            "--set",
            f"model.cache_dir={run_dir / 'model_cache'}",
        ],
        "loop": [
            sys.executable,
            "-m",
            "bench.peers.image_loop",
            "--input",
            str(source),
            "--shape",
            shape,
            "--model",
            str(model),
            "--output",
            str(run_dir / "labels.parquet"),
            "--timings",
            str(run_dir / "timings.json"),
            "--batch",
            str(LOOP_BATCH),
        ],
    }


def run_w5(
    data_dir: Path,
    runs_dir: Path,
    env: dict[str, str],
    repo: Path,
    repeats: int,
    rows: int = W5_ROWS,
    shape: str = "table",
) -> W5Result:
    """Build W5's model and images, run both peers over the ``shape`` input alternately ``repeats`` times each (a line
    per run), compare the first good outputs row by row."""
    if shape not in W5_SHAPES:
        raise SystemExit(f"W5 input shape must be one of {', '.join(W5_SHAPES)}, not {shape!r}")
    model = make_w5_model(data_dir / "w5_model")
    sources = make_w5_data(data_dir, rows)
    result = W5Result(rows=rows, shape=shape, images=_describe(sources["table"]))
    print(f"W5: {rows:,} images ({result.images}), read as a {shape}; model {model}", flush=True)
    commands = {
        peer: (lambda run_dir, peer=peer: peer_commands(sources[shape], shape, model, run_dir)[peer])
        for peer in ("lakescore", "loop")
    }
    result.runs = run_alternately(
        W5,
        commands,
        {"lakescore": "report.json", "loop": "timings.json"},
        images_per_second,
        lambda peer, rate: f"{rate:.2f} images/s ({'scoring stage' if peer == 'lakescore' else 'forward'})",
        runs_dir,
        env,
        {"loop": LOOP_ENV},
        repo,
        repeats,
    )
    result.equal = compare_first_good(
        runs_dir,
        W5,
        result.runs,
        {"lakescore": "delta", "loop": "labels.parquet"},
        lambda ours, theirs: compare_labels(ours, theirs, shape),
    )
    return result


def _describe(table: Path) -> str:
    """Formats, modes, sizes and bytes of the images in W5's table (read back from their headers)."""
    from PIL import Image

    images = pq.read_table(table, columns=["image"]).column("image").to_pylist()
    headers = []
    for data in images:
        with Image.open(io.BytesIO(data)) as image:
            headers.append((image.format, image.mode, max(image.size)))
    formats = pd.Series([f"{f} {m}" for f, m, _ in headers]).value_counts()
    sides = pd.Series([s for _, _, s in headers])
    sizes = pd.Series([len(d) for d in images])
    return (
        ", ".join(f"{name} {count}" for name, count in formats.items())
        + f"; longest side median {sides.median():.0f} px (max {sides.max()}); encoded median "
        f"{sizes.median() / 1e3:.0f} kB, {sizes.sum() / 1e6:.0f} MB in all"
    )


def compare_labels(delta: Path, loop: Path, shape: str) -> dict:
    """lakescore's labels and probabilities (its Delta output) against the loop's, per image: rows compared, rows with
    the same label, the largest probability difference, ids missing either side."""
    id_col = "id" if shape == "table" else "path"
    ours = (
        pq.read_table(delta_files(delta), columns=[id_col, "label", "probs"]).to_pandas().rename(columns={id_col: "id"})
    )
    theirs = pd.read_parquet(loop, columns=["id", "label", "probs"])
    if shape == "folder":  # lakescore's id is the file's URI, the loop's its path under the folder
        ours["id"] = ours["id"].str.split("/w5_images/", n=1).str[1]
    both = ours.merge(theirs, on="id", suffixes=("_lakescore", "_loop"))
    delta_p = (
        np.abs(np.stack(both["probs_lakescore"].map(list)) - np.stack(both["probs_loop"].map(list)))
        if len(both)
        else np.zeros(1)
    )
    return {
        "matched": len(both),
        "equal": int((both["label_lakescore"] == both["label_loop"]).sum()),
        "max_prob_delta": float(delta_p.max()),
        "missing_in_lakescore": len(theirs) - len(both),
        "extra_in_lakescore": len(ours) - len(both),
    }


def w5_lines(result: W5Result) -> list[str]:
    """The W5 figures and its three targets with met / NOT met."""
    lines = [
        f"W5 data: {result.rows:,} images read as a {result.shape} ({result.images}); ViT-base-shaped "
        f"{MODEL_SHAPE['num_hidden_layers']} x {MODEL_SHAPE['hidden_size']} at {MODEL_SHAPE['image_size']} px, "
        f"{LABELS} labels, float32"
    ]
    for peer in ("lakescore", "loop"):
        part = "scoring stage" if peer == "lakescore" else "forward"
        line = result.peer_line(W5, peer, f"images/s of its {part}", 2)
        lines += [line] if line else []
    report = next((r.report for r in result.good("lakescore")), None)
    if report:
        workers = report.get("workers") or {}
        lines.append(
            f"W5 lakescore's report: {workers.get('rows_scored')} rows scored in {workers.get('arrow_batches')} "
            f"Arrow batches, {report.get('error_rows')} error rows; step seconds "
            + ", ".join(f"{k} {v:.1f}" for k, v in (report.get("step_seconds") or {}).items())
        )
    timings = next((r.report for r in result.good("loop")), None)
    if timings:
        lines.append(
            f"W5 loop: load {timings['load_seconds']:.1f} s, decode {timings['decode_seconds']:.1f} s, processor "
            f"{timings['preprocess_seconds']:.1f} s, forward {timings['forward_seconds']:.1f} s for "
            f"{timings['images']:,} images, batch {timings['batch']}, {timings['threads']} torch threads"
        )
    ours, theirs = result.median("lakescore", "rate"), result.median("loop", "rate")
    if ours and theirs:
        lines.append(
            f"W5 images/s, lakescore's scoring stage vs the loop's forward: {ours:.2f} vs {theirs:.2f} = "
            f"{ours / theirs:.2f}x   target >= {STAGE_TARGET:g}x: {verdict(ours / theirs >= STAGE_TARGET)}"
        )
    lines += filter(None, [result.whole_line(W5, "loop", "loop's", WHOLE_TARGET)])
    eq = result.equal
    if eq:
        share = eq["equal"] / max(1, eq["matched"])
        complete = eq["missing_in_lakescore"] == 0 and eq["extra_in_lakescore"] == 0
        close = eq["max_prob_delta"] <= PROB_TOLERANCE
        lines.append(
            f"W5 labels, lakescore vs the loop: {eq['equal']:,} of {eq['matched']:,} rows the same label "
            f"({share:.2%}); largest probability difference {eq['max_prob_delta']:.2e}; "
            f"{eq['missing_in_lakescore']} missing, {eq['extra_in_lakescore']} extra   target every label equal, "
            f"probabilities within {PROB_TOLERANCE:g} and nothing missing: "
            f"{verdict(share == 1.0 and close and complete)}"
        )
    return lines
