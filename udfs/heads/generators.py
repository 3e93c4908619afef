"""Which generator a generate run scores with: the model in this process (:mod:`lakescore.udfs.heads.generate`), or
requests to an endpoint or to this host's served engine (:mod:`lakescore.udfs.remote.generate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

__all__ = ["load_generator"]


def load_generator(spec: Any, model_dir: Optional[Path]) -> Any:
    """The generate head for ``spec``: over the wire when ``generate.endpoint`` or ``generate.server`` is set, else
    the in-process one; each raises as its own loader says."""
    from lakescore.udfs.generate_options import GenerateOptions

    images = getattr(spec, "input_kind", None) == "image"  # image_col: a vision-language model over each image and prompt
    if (spec.generate or GenerateOptions()).remote:
        if images:
            from lakescore.udfs.remote.image_prompts import load_remote_image_generator

            return load_remote_image_generator(spec, model_dir)
        from lakescore.udfs.remote.generate import load_remote_generator

        return load_remote_generator(spec, model_dir)
    if images:
        from lakescore.udfs.heads.image_prompts import load_image_prompt_generator

        return load_image_prompt_generator(spec, model_dir)
    from lakescore.udfs.heads.generate import load_generator as load_in_process

    return load_in_process(spec, model_dir)
