"""The ``generate`` head over images through an OpenAI-compatible server (``generate.endpoint`` or ``generate.server``):
each row one chat request whose user message holds the image as an ``image_url`` content part (a ``data:`` URI), then
the rendered prompt's text part, the order of the in-process head
(:func:`~lakescore.udfs.heads.image_prompts.chat_messages`).

The runner (:class:`~lakescore.udfs.runners.ImagePromptRunner`) checks and decodes every image here first, so a bad
image, an empty file or one over the pixel limit is the row's dead letter with the in-process reasons, and no request
is sent for it. The image's bytes then go as they are, in their own format (:func:`image_payload`), unless the server
could read other pixels from them than the in-process head reads: those go as a PNG of the decoded image.
Everything else (retries, rate limits, ``usage`` and cost, the model's identity, the preflight) is
:class:`~lakescore.udfs.remote.generate.EndpointGenerator`'s.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lakescore.schemas.reasons import NULL_INPUT
from lakescore.udfs.batching import Scored
from lakescore.udfs.heads.generate import refuse_unfinished_json
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.remote.generate import KEYS, EndpointGenerator, load_remote_generator

__all__ = ["SENT_AS_IS", "ImagePayload", "image_payload", "EndpointImageGenerator", "load_remote_image_generator"]

SENT_AS_IS = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp", "GIF": "image/gif"}
"""The formats whose bytes are sent as they are, with their media type: those OpenAI's chat API documents for images,
which vLLM, SGLang and ``transformers serve`` (Pillow) read too. Any other (BMP, TIFF, ...) is sent as PNG."""
IMAGES = "images"
"""Feature key: each present row's :class:`ImagePayload`, in row order."""


@dataclass(frozen=True)
class ImagePayload:
    """What one row's image is sent as: the encoded bytes and their media type."""

    data: bytes | memoryview
    media_type: str

    def content_part(self) -> dict[str, Any]:
        """The OpenAI chat API's image content part for these bytes (a ``data:`` URI)."""
        encoded = base64.b64encode(self.data).decode("ascii")
        return {"type": "image_url", "image_url": {"url": f"data:{self.media_type};base64,{encoded}"}}


def image_payload(encoded: bytes | memoryview, image: Any) -> ImagePayload:
    """What to send for a row whose file is ``encoded`` and whose decoded, upright RGB image (as the in-process head
    reads it, :func:`~lakescore.udfs.images.decode_image`) is ``image``: the bytes as they are when their format is in
    :data:`SENT_AS_IS`, they hold one frame and no transparency; else the decoded image as PNG (lossless: the server
    reads the in-process head's pixels)."""
    from PIL import Image

    # Header only: Pillow reads the pixels on load(), which the decoded image did already.
    with Image.open(io.BytesIO(encoded)) as source:
        fmt, frames = source.format, getattr(source, "n_frames", 1)
        # An alpha channel or a transparent colour is dropped by the in-process decode (Pillow's convert("RGB")) but
        # composited on white by vLLM: sent as PNG of the decoded pixels, every server reads what in-process reads.
        # A multi-frame file's first frame is what in-process reads; OpenAI's API takes no animated GIF.
        # (EXIF orientation needs no re-encoding: vLLM and transformers' load_image apply it, as in-process does.)
        transparent = source.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in source.info
    if fmt in SENT_AS_IS and frames == 1 and not transparent:
        return ImagePayload(encoded, SENT_AS_IS[fmt])
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return ImagePayload(buffer.getvalue(), "image/png")


class EndpointImageGenerator(EndpointGenerator):
    """The generate head for (image, prompt) rows answered over the chat API: :meth:`process` makes a row's
    :class:`ImagePayload`, :meth:`prepare` the batch's features, :meth:`score_prompts` sends each row's image with its
    prompt."""

    def process(self, image: Any, prompt: str, encoded: bytes | memoryview | None = None) -> ImagePayload:
        """One row's payload: ``encoded`` (the file's bytes) as they are, or ``image`` re-encoded
        (:func:`image_payload`)."""
        return image_payload(encoded, image)

    def prepare(self, rows: Sequence[ImagePayload], keys: Sequence[str]) -> dict[str, Any]:
        """The present rows' payloads and keys, in row order."""
        images = np.empty(len(rows), dtype=object)
        images[:] = list(rows)
        row_keys = np.empty(len(keys), dtype=object)
        row_keys[:] = list(keys)
        return {IMAGES: images, KEYS: row_keys}

    def row_cost(self, features: Mapping[str, Any]) -> np.ndarray:
        """One per row: the server plans its own batches (and counts the image's tokens in ``usage``)."""
        return np.ones(len(features[IMAGES]), dtype=np.int64)

    def tokenize(self, prompts: list[str], keys: Sequence[str] | None = None) -> dict[str, Any]:
        raise TypeError("the image generate head reads (image, prompt) rows: use prepare(), through ImagePromptRunner")

    def score_prompts(
        self,
        prompts: Sequence[str | None],
        policy: Any,
        keys: Sequence[str] | None = None,
        features: Mapping[str, Any] | None = None,
    ) -> Scored:
        """Send each present row (a prompt whose image :meth:`prepare` holds, in order) with its image, ``concurrency``
        at a time: results as :meth:`EndpointGenerator.score_prompts`."""
        reasons: list[str | None] = [None if isinstance(p, str) else NULL_INPUT for p in prompts]
        present = [i for i, reason in enumerate(reasons) if reason is None]
        images = {} if features is None else dict(zip(present, features[IMAGES]))
        sent = self.send(
            prompts,
            lambda i: self._one(prompts[i], None if keys is None else keys[i], images[i].content_part()),
            present,
            reasons,
        )
        return refuse_unfinished_json(sent, self.options.json_schema, self.client.scrub)

    def score(self, values: Sequence[Any]) -> np.ndarray:
        """The executors' preflight: ``values`` of encoded image bytes, or ``(bytes, prompt)`` pairs, sent with every
        setting of the run; ``ValueError`` for an image that cannot be decoded, :class:`EndpointRefused` as
        :meth:`EndpointGenerator.score`."""
        from lakescore.schemas.reasons import RowFailure
        from lakescore.udfs.images import decode_image, pixel_limit, read_header

        outputs = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            data, prompt = value if isinstance(value, tuple) else (value, "Describe the image.")
            image = read_header(data, pixel_limit(None))[1] or decode_image(data)
            if isinstance(image, RowFailure):
                raise ValueError(f"{image.reason}: {image.error}")
            outputs[i] = self._preflight_one(prompt, self.process(image, prompt, data).content_part())
        return outputs


def load_remote_image_generator(spec: ModelSpec, model_dir: Path | None) -> EndpointImageGenerator:
    """The image head for ``spec.generate.endpoint`` or ``spec.generate.server``, raising as
    :func:`~lakescore.udfs.remote.generate.load_remote_generator` does."""
    return load_remote_generator(spec, model_dir, EndpointImageGenerator)
