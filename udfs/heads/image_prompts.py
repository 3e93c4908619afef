"""The ``generate`` task over images: a vision-language model reads each row's image and rendered prompt.

Each row is one user message whose content is the image part, then the prompt's text part (the order of
transformers' and vLLM's own examples; :func:`chat_messages`), rendered by the model's processor with
``apply_chat_template(add_generation_prompt=True)`` and processed with the row's image by the same processor, alone, so
its tokens (the image's tokens expanded as the processor makes them, then the prompt's) and pixels do not depend on its
batch. Decoding is the text head's (:mod:`lakescore.udfs.heads.decoding`): greedy, seeded sampling, ``stop``,
``json_schema`` and ``choices`` behave as for text; the image's inputs go in with the prompt's prefill only.

A row costs its tokens, image tokens included, plus ``max_new_tokens`` against the token budget, as a text prompt does
(:meth:`Generator.row_cost`), and ``lakescore plan`` counts the same. A prompt over the model's context is
``prompt_too_long`` whatever ``generate.truncate`` says: cutting it on the left would cut the image's tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lakescore.udfs.heads.generate import Generator
from lakescore.udfs.models.errors import UnfitModelError
from lakescore.udfs.models.model_source import ModelSpec
from lakescore.udfs.options.generate import GenerateOptions

__all__ = ["IMAGE_PART", "VISION", "chat_messages", "ImagePromptGenerator", "load_image_prompt_generator"]

IMAGE_PART = {"type": "image"}
"""The image's content part as a processor's chat template takes it; a remote head sends an OpenAI ``image_url`` part
(a ``data:`` URI of the image's bytes) in its place."""
VISION = "vision_inputs"
"""Feature key: each row's image inputs from the processor (a dict of tensors, one row along their first axis), as a
numpy object array."""
TEXT_KEYS = ("input_ids", "attention_mask")


def chat_messages(
    prompt: str, system_prompt: str | None = None, image_part: Mapping[str, Any] = IMAGE_PART
) -> list[dict]:
    """One row's chat: the system prompt when set, then one user message whose content is ``image_part`` followed by
    the prompt's text part."""
    system = (
        [{"role": "system", "content": [{"type": "text", "text": system_prompt}]}] if system_prompt is not None else []
    )
    return system + [{"role": "user", "content": [dict(image_part), {"type": "text", "text": prompt}]}]


class ImagePromptGenerator(Generator):
    """The generate head over (image, prompt) rows: :meth:`prepare` renders and processes them, one
    :class:`~lakescore.udfs.heads.generate.Generation` per row as the text head gives it; score with
    :func:`~lakescore.udfs.heads.generate.score_prompts` and the features :meth:`prepare` made."""

    def __init__(self, model, processor, options: GenerateOptions, context: int | None, output_types) -> None:
        super().__init__(model, processor.tokenizer, options, context, output_types)
        self.processor = processor
        if not getattr(processor, "chat_template", None):
            raise UnfitModelError(
                "task generate: the model's processor has no chat template, which places the image "
                "among the prompt's tokens; save one with the processor (chat_template.jinja)"
            )

    @property
    def share_prefix_tokens(self) -> int:
        """0: rows whose token ids are the same may hold different images (their placeholder tokens are alike)."""
        return 0

    def prompt_text(self, prompt: str) -> str:
        """The text the processor reads for ``prompt``: the chat of :func:`chat_messages` through its chat template."""
        return self.processor.apply_chat_template(
            chat_messages(prompt, self.options.system_prompt), add_generation_prompt=True, tokenize=False
        )

    def process(self, image, prompt: str, encoded: bytes | None = None) -> dict[str, Any]:
        """The processor's inputs for one row (RGB ``image``, ``prompt``; ``encoded``, the file's bytes, is for a remote
        head): ``input_ids`` and the image's tensors, with a batch axis of one. The chat template carries its special
        tokens: the processor adds none."""
        return dict(
            self.processor(
                images=[image], text=[self.prompt_text(prompt)], add_special_tokens=False, return_tensors="pt"
            )
        )

    def prepare(self, rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
        """Left-padded ``input_ids`` / ``attention_mask``, :data:`PROMPT_TOKENS`, :data:`OVERFLOW`, :data:`ROW_KEY`
        and :data:`VISION` for rows :meth:`process` made, ``keys`` seeding their sampling."""
        ids = [row["input_ids"][0].tolist() for row in rows]
        lengths = np.fromiter((len(r) for r in ids), dtype=np.int64, count=len(ids))
        limit = self.prompt_limit
        overflow = np.where(lengths > limit, lengths, 0) if limit is not None else np.zeros(len(ids), dtype=np.int64)
        features = self.padded(ids, overflow, keys)
        vision = np.empty(len(rows), dtype=object)
        vision[:] = [{k: v for k, v in row.items() if k not in TEXT_KEYS} for row in rows]
        features[VISION] = vision
        return features

    def tokenize(self, prompts: list[str], keys: Sequence[str] | None = None) -> dict[str, Any]:
        raise TypeError("the image generate head reads (image, prompt) rows: use prepare(), through ImagePromptRunner")

    def prefill(self, features: Mapping[str, Any]) -> dict[str, Any]:
        """The rows' image inputs joined for the prefill (:func:`join_rows`)."""
        return join_rows(list(features[VISION]))

    def score(self, values: Sequence[Any]) -> np.ndarray:
        """Convenience for a few rows (the executors' preflight): ``values`` of encoded image bytes, or
        ``(bytes, prompt)`` pairs, as one batch; ``ValueError`` for an image that cannot be decoded."""
        from lakescore.schemas.reasons import RowFailure
        from lakescore.udfs.images import decode_image, pixel_limit, read_header

        rows = []
        for value in values:
            data, prompt = value if isinstance(value, tuple) else (value, "Describe the image.")
            image = read_header(data, pixel_limit(None))[1] or decode_image(data)
            if isinstance(image, RowFailure):
                raise ValueError(f"{image.reason}: {image.error}")
            rows.append(self.process(image, prompt))
        return self.forward(self.prepare(rows, [str(i) for i in range(len(rows))]))


def join_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows' image inputs as one batch: each tensor concatenated along its first axis, rows whose tensors differ
    in their other axes (a number of tiles) zero-padded at the end of each, as the processors pad a batch (Idefics3's
    ``pixel_attention_mask`` marks real pixels; a tile of zeros is dropped as padding)."""
    import torch

    joined: dict[str, Any] = {}
    for name in rows[0] if rows else ():
        values = [row[name] for row in rows]
        if not isinstance(values[0], torch.Tensor):
            joined[name] = values[0]
            continue
        shape = [max(v.shape[d] for v in values) for d in range(1, values[0].ndim)]
        padded = []
        for value in values:
            pad = [p for d in reversed(range(1, value.ndim)) for p in (0, shape[d - 1] - value.shape[d])]
            padded.append(torch.nn.functional.pad(value, pad) if any(pad) else value)
        joined[name] = torch.cat(padded)
    return joined


def load_image_prompt_generator(spec: ModelSpec, model_dir: Path) -> ImagePromptGenerator:
    """Load the vision-language model in ``model_dir`` (``AutoModelForImageTextToText``) and its ``AutoProcessor`` as
    ``spec`` configures them, with ``spec.generate``'s options; the trust rules of every head (safetensors unless
    ``spec.allow_pickle``, remote code only with ``spec.trust_remote_code``, local files only).

    Raises :class:`~lakescore.udfs.models.model_source.UnfitModelError` in one line for a model that is not a
    vision-language model, or whose processor has no chat template."""
    from transformers import AutoConfig, AutoProcessor

    from lakescore.udfs.models.backends import ModelKind, load_torch_model
    from lakescore.udfs.models.model_source import refuse_pickle_weights, require_directory
    from lakescore.udfs.options.generate import model_context, require_room
    from lakescore.udfs.registry import get_task

    options = spec.generate or GenerateOptions()
    if spec.backend != "torch":
        raise ValueError(f"the generate task runs on the torch backend, not {spec.backend!r}")
    require_directory(model_dir, spec.task)
    refuse_pickle_weights(model_dir, spec.allow_pickle)
    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=spec.trust_remote_code)
    require_vision_language(config.to_dict(), model_dir)
    processor = AutoProcessor.from_pretrained(
        str(model_dir), local_files_only=True, trust_remote_code=spec.trust_remote_code
    )
    text = getattr(config, "text_config", None) or config
    positions = getattr(text, "max_position_embeddings", None)
    context = model_context(positions, spec.max_seq_length, getattr(processor.tokenizer, "model_max_length", None))
    require_room(spec, model_dir, context)
    model = load_torch_model(spec, model_dir, ModelKind("AutoModelForImageTextToText", "logits"))
    return ImagePromptGenerator(model, processor, options, context, get_task(spec.task).output_arrow_types_for(options))


def require_vision_language(config: Mapping[str, Any], model_dir: Path) -> None:
    """:class:`UnfitModelError` in one line unless ``config`` (a ``config.json``) is a vision-language model's that
    transformers' ``AutoModelForImageTextToText`` loads: the driver's check before any compute, and the loader's."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    model_type = config.get("model_type")
    if model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        raise UnfitModelError(
            f"task generate with image_col: {model_dir} is a {model_type or 'model of no model_type'} "
            f"({', '.join(config.get('architectures') or ()) or 'no architectures'}), not a vision-language model "
            "(transformers' AutoModelForImageTextToText: LLaVA, Idefics3 / SmolVLM, Qwen2-VL, Gemma 3, ...)"
        )
