"""Which embedder an embed run scores with: the model in this process (:mod:`lakescore.udfs.heads.embed`, over chunks
of each text with ``embed.chunk``), or requests to an endpoint's or this host's served engine's ``/v1/embeddings``
(:mod:`lakescore.udfs.remote.embed`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

__all__ = ["load_embedder"]


def load_embedder(spec: Any, model_dir: Optional[Path]) -> Any:
    """The embed head for ``spec``: over the wire when ``embed.endpoint`` or ``embed.server`` is set (``model_dir``
    ``None`` for an endpoint), else the in-process one; each raises as its own loader says."""
    if spec.embed is not None and spec.embed.remote:
        from lakescore.udfs.remote.embed import load_remote_embedder

        return load_remote_embedder(spec, model_dir)
    from lakescore.udfs.heads.embed import load_embedder as load_in_process

    return load_in_process(spec, model_dir)
