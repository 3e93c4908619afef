"""Model sources: where a model's files are, and which weights they hold.

A source is a local directory or a Hugging Face hub id (with an optional
revision). Hub ids resolve through ``huggingface_hub``'s own cache, so users
with a hub keep working; nothing here reaches the network for a local path.

The weights digest is what every output row carries as ``model_sha256``:

* one weight file: the plain SHA-256 of that file, so ``sha256sum
  model.safetensors`` on any machine gives the same hex;
* several (sharded models, extra ST modules): the SHA-256 of their sorted
  ``sha256sum``-style manifest (``"<hex>  <relative path>\\n"`` per file).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

__all__ = ["ModelSourceError", "ModelSpec", "resolve_model_dir", "weights_sha256", "WEIGHT_SUFFIXES"]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
"""File suffixes counted as weights in the digest."""

_CHUNK = 8 << 20


class ModelSourceError(RuntimeError):
    """The model source cannot be found, fetched or read."""


@dataclass(frozen=True)
class ModelSpec:
    """Everything a worker needs to load the same model the driver chose.

    Small, frozen and picklable: it is what crosses to the executors, never
    the model itself. It is also the process-wide cache key.
    """

    task: str
    source: str
    revision: Optional[str] = None
    device: str = "cpu"
    max_seq_length: Optional[int] = None
    pooling: Optional[str] = None
    normalize: Optional[bool] = None


def resolve_model_dir(source: str, revision: Optional[str] = None) -> Path:
    """Return a local directory holding the model files for ``source``.

    A path that exists is used as is. Anything else is treated as a hub id and
    fetched (or found in the local hub cache) with ``huggingface_hub``.

    Raises :class:`ModelSourceError` naming the source when neither works.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise ModelSourceError(f"model source {source!r} is a file; expected a model directory or a hub id")
    if source.startswith((".", "/", "~")) or "://" in source:
        raise ModelSourceError(f"model directory {source!r} does not exist")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=source, revision=revision))
    except Exception as exc:  # hub errors are many types; one message names the source
        raise ModelSourceError(
            f"model {source!r} is not a local directory and could not be fetched from the hub: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc


def weight_files(model_dir: Path) -> list[Path]:
    """Weight files under ``model_dir`` (recursively, hidden folders skipped), sorted."""
    files = [
        p
        for p in model_dir.rglob("*")
        if p.is_file()
        and p.suffix in WEIGHT_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(model_dir).parts)
    ]
    return sorted(files, key=lambda p: p.relative_to(model_dir).as_posix())


def weights_sha256(model_dir: Path) -> str:
    """Digest of the weight files in ``model_dir`` (see module docstring).

    Raises :class:`ModelSourceError` if the directory holds no weight file.
    """
    files = weight_files(model_dir)
    if not files:
        raise ModelSourceError(
            f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) found under model directory {model_dir}"
        )
    digests = [(_file_sha256(p), p.relative_to(model_dir).as_posix()) for p in files]
    if len(digests) == 1:
        return digests[0][0]
    manifest = "".join(f"{hexdigest}  {name}\n" for hexdigest, name in digests)
    return hashlib.sha256(manifest.encode("utf-8")).hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
