"""Image bytes -> upright RGB images, per row, and the model's own preprocessing of them in bounded chunks.

Decoding does what transformers' ``load_image`` does for the image pipelines (Pillow opens the bytes, the EXIF
orientation is applied, the image is converted to RGB), so every mode Pillow reads (``1``, ``L``, ``LA``, ``P``,
``RGBA``, ``CMYK``, 16-bit ``I;16``, ``F``) reaches the model as the pipeline's would. It fails per row, never per
batch:

* ``null_input``: a null or empty value;
* ``invalid_image``: bytes Pillow cannot identify or decode (garbage, a truncated file, a corrupt header);
* ``image_too_large``: a header whose width x height exceeds the pixel limit (Pillow's ``MAX_IMAGE_PIXELS``
  unless configured). The header is read without decoding the image, so a decompression bomb costs nothing;
* ``prepare_error``: an image the model's processor rejects.

Decoded images are held for one chunk at a time: :func:`preprocess_chunks` plans chunks by decoded pixels and rows
with the batching core's :func:`~lakescore.udfs.batching.plan_batches`, decodes a chunk, runs the model's
``AutoImageProcessor`` on it and drops the images, so a few huge images never sit in memory together.
"""

from __future__ import annotations

import hashlib
import io
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lakescore.schemas.reasons import IMAGE_TOO_LARGE, INVALID_IMAGE, NULL_INPUT, PREPARE_ERROR, RowFailure
from lakescore.udfs.batching import BatchPolicy, plan_batches

__all__ = [
    "DEFAULT_MAX_BATCH_PIXELS",
    "DEFAULT_MAX_BATCH_IMAGES",
    "ImageHeader",
    "Chunk",
    "Preprocessed",
    "pixel_limit",
    "read_header",
    "row_index",
    "image_tokens",
    "decode_image",
    "describe_image",
    "preprocess_chunks",
    "preflight_image",
]

DEFAULT_MAX_BATCH_PIXELS = 1 << 24
"""Decoded pixels one preprocessing chunk holds at most (48 MiB as RGB; the processor's working copies of an image
are a few times its size): many thumbnails, one or two camera photos, or one huge image alone."""
DEFAULT_MAX_BATCH_IMAGES = 64
"""Images one preprocessing chunk holds at most."""
VALUES_PER_TOKEN = 16 * 16 * 3
"""What one token of an image's model input is, in values: a 16x16 RGB patch, a ViT-B/16 token."""


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says: format, mode and size, read without decoding the pixels."""

    format: str
    mode: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


@dataclass(frozen=True)
class Chunk:
    """One preprocessing chunk: its rows (indices into the batch), their decoded pixels and encoded bytes."""

    rows: tuple[int, ...]
    pixels: int
    encoded_bytes: int


@dataclass
class Preprocessed:
    """A batch of image values after decoding and preprocessing.

    ``pixel_values`` is the processor's output for every row (rows not ``ok`` hold zeros; ``None`` when no row
    decoded), ``failures`` the rows refused with why, ``headers`` what each readable header said, ``chunks`` how
    the rows were grouped while decoded.
    """

    pixel_values: Any
    ok: np.ndarray
    failures: dict[int, RowFailure] = field(default_factory=dict)
    headers: dict[int, ImageHeader] = field(default_factory=dict)
    chunks: list[Chunk] = field(default_factory=list)


def pixel_limit(max_image_pixels: int | None) -> int:
    """The pixels an image may have: ``max_image_pixels``, else Pillow's ``MAX_IMAGE_PIXELS`` (its decompression-bomb
    warning threshold; no limit where the process turned Pillow's off). A limit above Pillow's own raises Pillow's,
    which would otherwise refuse such images in ``Image.open`` before they reach this check."""
    from PIL import Image

    if max_image_pixels is None:
        return sys.maxsize if Image.MAX_IMAGE_PIXELS is None else int(Image.MAX_IMAGE_PIXELS)
    if max_image_pixels < 1:
        raise ValueError(f"max_image_pixels must be >= 1, got {max_image_pixels}")
    if Image.MAX_IMAGE_PIXELS is not None and max_image_pixels > Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = max_image_pixels  # Pillow's documented setting: it is process-wide
    return max_image_pixels


def read_header(data: bytes | None, limit: int) -> tuple[ImageHeader | None, RowFailure | None]:
    """``data``'s header (``None`` where unreadable) and why the row cannot be scored (``None`` where it can): null or
    empty, not an image, or more than ``limit`` pixels. Only the header is read."""
    if not data:
        return None, RowFailure(NULL_INPUT, "no image bytes" if data is not None else "null image")
    try:
        with _open(data) as image:
            header = ImageHeader(str(image.format), image.mode, *image.size)
    except Exception as exc:  # Pillow raises many types for unreadable bytes; the row is refused, not the batch
        return None, _failure(exc)
    if header.pixels > limit:
        return header, RowFailure(
            IMAGE_TOO_LARGE, f"{header.width}x{header.height} = {header.pixels} pixels, above the limit of {limit}"
        )
    return header, None


def decode_image(data: bytes):
    """The upright RGB image ``data`` holds, as transformers' ``load_image`` makes it (EXIF orientation applied,
    converted to RGB; a multi-frame file's first frame), or a :class:`~lakescore.schemas.reasons.RowFailure`
    (``invalid_image``) for bytes that do not decode (a truncated file). Check the header with :func:`read_header`
    first."""
    from PIL import ImageOps

    try:
        image = _open(data)
        image.load()  # decode here, so a truncated file fails as this row's image
        # In place, and no conversion of an RGB image: load_image's copies hold the same pixels, twice the memory
        ImageOps.exif_transpose(image, in_place=True)
        return image if image.mode == "RGB" else image.convert("RGB")
    except Exception as exc:
        return _failure(exc)


def _open(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data))


def _failure(exc: Exception) -> RowFailure:
    from PIL import Image

    if isinstance(exc, Image.DecompressionBombError):
        return RowFailure(IMAGE_TOO_LARGE, str(exc))
    if isinstance(exc, Image.UnidentifiedImageError):  # its text names the BytesIO object: say it plainly
        return RowFailure(INVALID_IMAGE, "not an image format Pillow reads")
    return RowFailure.of(INVALID_IMAGE, exc)


def describe_image(data: bytes | None, header: ImageHeader | None = None) -> str | None:
    """A row's image as the errors table shows it: format and size when the header was read, the byte count and
    the SHA-256 of the bytes (never the bytes themselves); ``None`` for a null value."""
    if data is None:
        return None
    if not data:
        return "0 bytes"
    shown = f"{header.format} {header.mode} {header.width}x{header.height}, " if header is not None else ""
    return f"{shown}{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"


def preprocess_chunks(
    values: Sequence[bytes | None],
    preprocess: Callable[[list], Any],
    limit: int,
    policy: BatchPolicy,
) -> Preprocessed:
    """Decode ``values`` (encoded image bytes, ``None`` for null) and run ``preprocess`` (a list of RGB images ->
    a tensor or array shaped ``(n, ...)``) on them, chunk by chunk.

    Headers are read first (``limit``: pixels per image); chunks are then cut by decoded pixels and rows
    (``policy``: ``max_tokens`` pixels, ``max_rows`` images; an image over the budget is a chunk alone) and each
    chunk's images are decoded, preprocessed and released before the next. Rows that fail keep their reason in
    ``failures``. Raises ``ValueError`` when the processor makes images of different shapes for one model.
    """
    n = len(values)
    failures: dict[int, RowFailure] = {}
    headers: dict[int, ImageHeader] = {}
    for i, data in enumerate(values):
        header, failure = read_header(data, limit)
        if header is not None:
            headers[i] = header
        if failure is not None:
            failures[i] = failure
    readable = np.fromiter((i for i in headers if i not in failures), dtype=np.int64)
    pixels = np.fromiter((headers[i].pixels for i in readable), dtype=np.int64, count=len(readable))
    ok = np.zeros(n, dtype=bool)
    pixel_values = None
    chunks: list[Chunk] = []
    for planned in plan_batches(pixels, policy):
        rows = np.sort(readable[planned])
        chunks.append(Chunk(tuple(int(r) for r in rows), int(pixels[planned].sum()), sum(len(values[r]) for r in rows)))
        decoded, processed = _preprocess_chunk(values, rows, preprocess, failures)
        if not decoded:
            continue
        if pixel_values is None:
            pixel_values = _zeros_like_rows(processed, n)
        _require_one_shape([pixel_values, processed])
        pixel_values[row_index(decoded, processed)] = processed
        ok[decoded] = True
    return Preprocessed(pixel_values, ok, failures, headers, chunks)


def _preprocess_chunk(values, rows: np.ndarray, preprocess: Callable[[list], Any], failures: dict[int, RowFailure]):
    """The ``rows`` that decoded and their preprocessing; the others added to ``failures``. Decoded images live only
    in this call. An image the processor rejects is refused alone (``prepare_error``), its neighbours kept."""
    decoded, images = [], []
    for row in rows:
        image = decode_image(values[row])
        if isinstance(image, RowFailure):
            failures[int(row)] = image
        else:
            decoded.append(int(row))
            images.append(image)
    if not images:
        return [], None
    try:
        return decoded, preprocess(images)
    except Exception:
        pass
    kept, parts = [], []
    for row, image in zip(decoded, images):
        try:
            parts.append(preprocess([image]))
            kept.append(row)
        except Exception as exc:
            failures[row] = RowFailure.of(PREPARE_ERROR, exc)
    return kept, (_concatenate(parts) if parts else None)


def _require_one_shape(arrays: list) -> None:
    shapes = sorted({tuple(a.shape[1:]) for a in arrays})
    if len(shapes) > 1:
        raise ValueError(
            f"the image processor made inputs shaped {shapes[0]} and {shapes[1]}; lakescore's image tasks need a "
            "processor that resizes every image to one shape"
        )


def _concatenate(parts: list):
    _require_one_shape(parts)
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    import torch

    return torch.cat(parts)


def _zeros_like_rows(processed, n: int):
    """Zeros shaped ``(n, *processed.shape[1:])``, in ``processed``'s array library and dtype."""
    if isinstance(processed, np.ndarray):
        return np.zeros((n, *processed.shape[1:]), dtype=processed.dtype)
    import torch

    return torch.zeros((n, *processed.shape[1:]), dtype=processed.dtype)


def row_index(rows: Sequence[int] | np.ndarray, like):
    """Row indices to index ``like`` with: numpy for a numpy array, a tensor for a torch tensor."""
    if isinstance(like, np.ndarray):
        return np.asarray(rows, dtype=np.int64)
    import torch

    return torch.as_tensor(rows, dtype=torch.long)


def image_tokens(pixel_values) -> int:
    """The tokens one image counts for against the forward batch's token budget (``scoring.max_batch_tokens``): its
    model input's values per :data:`VALUES_PER_TOKEN`, at least one. ``pixel_values`` holds every image of a batch
    in one shape (:class:`Preprocessed`)."""
    # Counted like text so that the CPU budget that keeps a text batch's activations in cache does the same for
    # images: batches of the row cap were no faster and held far more memory (BENCHMARKS.md, issue 49).
    if pixel_values is None or not len(pixel_values):
        return 1
    return max(1, -(-int(np.prod(pixel_values.shape[1:])) // VALUES_PER_TOKEN))


def preflight_image() -> bytes:
    """A small PNG, what an executor's preflight scores."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (128, 128, 128)).save(buffer, "PNG")
    return buffer.getvalue()
