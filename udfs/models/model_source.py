"""Model sources: where a model's files are, and which weights they hold.

A source is one of

* a local directory or file (``/models/x``, ``./model.pt2``);
* a Hadoop filesystem URI (``s3a://``, ``dbfs:/``, ``abfss://``, ``file:/``, ...):
  the job stages it to local disk with Spark (:mod:`lakescore.jobs.platform.files.model_staging`;
  executors get it through Spark's files, copied once per host) and workers load the
  staged copy (:func:`staged_copy`);
* an MLflow model URI (``models:/name/version``, ``models:/name@alias``, ``runs:/id/path``):
  pinned and downloaded by the driver with MLflow's client (:mod:`lakescore.udfs.models.mlflow_source`),
  shipped to the executors the same way;
* a Hugging Face hub id with an optional revision, resolved through
  ``huggingface_hub``'s own cache, so users with a hub keep working.

Nothing here reaches the network for a local path.

The weights digest is what every output row carries as ``model_sha256``:

* one weight file: the plain SHA-256 of that file, so ``sha256sum
  model.safetensors`` on any machine gives the same hex;
* several (sharded models, extra ST modules): the SHA-256 of their sorted
  ``sha256sum``-style manifest (``"<hex>  <relative path>\\n"`` per file).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakescore.udfs.models.errors import ModelIntegrityError, ModelSourceError, UnfitModelError
from lakescore.udfs.options.model import (
    BACKENDS,
    DEVICES,
    DRIVER_ONLY,
    DTYPES,
    POOLING_MODES,
    QUANTIZATIONS,
    ModelOptions,
)

if TYPE_CHECKING:  # the sections' types only: they are built by the config, never here
    from lakescore.udfs.options.embed import EmbedOptions
    from lakescore.udfs.options.generate import GenerateOptions
    from lakescore.udfs.options.transcribe import TranscribeOptions

__all__ = [
    "ModelSourceError",
    "ModelIntegrityError",
    "UnfitModelError",
    "ModelSpec",
    "needs_staging",
    "is_mlflow_uri",
    "shipped_name",
    "resolve_model_dir",
    "hub_revision",
    "staged_copy",
    "stage_once",
    "register_staged",
    "refuse_pickle_weights",
    "require_directory",
    "verify_sha256",
    "weights_sha256",
    "model_file_digests",
    "WEIGHT_SUFFIXES",
    "DEVICES",
    "DTYPES",
    "BACKENDS",
    "QUANTIZATIONS",
    "POOLING_MODES",
]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".pt2", ".ckpt")
"""File suffixes counted as weights in the digest."""

NOT_READ_SUFFIXES = (".md", ".rst", ".onnx", ".h5", ".msgpack", ".ot", ".tflite", ".gguf", ".pyc")
"""Files a model directory may hold that no lakescore backend reads: documentation, and other runtimes' copies of the
weights (lakescore exports its own ONNX graph). Every other non-weight file can change a prediction."""

PICKLE_SUFFIXES = (".bin", ".pth", ".ckpt")
"""Weight files that are Python pickles: loading one can run arbitrary code."""

_CHUNK = 8 << 20


@dataclass(frozen=True)
class ModelSpec:
    """Everything a worker needs to load the same model the driver chose.

    Small, frozen and picklable: it is what crosses to the executors, never the model itself. It is also the
    process-wide cache key. Its fields are the ``model`` section's (:class:`~lakescore.udfs.options.model.ModelOptions`,
    in its order and with its defaults; tests/unit/test_model_source.py keeps them in step) but
    :data:`~lakescore.udfs.options.model.DRIVER_ONLY`, plus the ``task``, a tabular model's ``feature_cols`` (in the
    order the program takes them), the ``generate``, ``embed`` and ``transcribe`` tasks' settings
    (:class:`~lakescore.udfs.options.generate.GenerateOptions`, :class:`~lakescore.udfs.options.embed.EmbedOptions`,
    :class:`~lakescore.udfs.options.transcribe.TranscribeOptions`)
    and the name of another input kind the task reads than its own (``input_kind``).
    """

    task: str
    source: str
    revision: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    expect_sha256: str | None = None
    allow_pickle: bool = False
    trust_remote_code: bool = False
    cache_dir: str = field(default="~/.cache/lakescore/models", compare=False)  # where, not what: outside the key
    max_seq_length: int | None = None
    pooling: str | None = None
    normalize: bool | None = None
    prompt_name: str | None = None
    backend: str = "torch"
    quantize: str = "none"
    feature_cols: tuple[str, ...] = ()
    generate: GenerateOptions | None = None
    embed: EmbedOptions | None = None
    transcribe: TranscribeOptions | None = None
    input_kind: str | None = None

    def identity(self) -> dict:
        """Every field that can change the numbers (all but ``cache_dir``), e.g. for a run key. ``generate`` counts
        as its settings by name, and only when set: a spec of another task keeps the facts (and digests) it had
        before the field existed."""
        facts = {f.name: getattr(self, f.name) for f in fields(self) if f.compare}
        for section in _TASK_SECTIONS:
            options = facts.pop(section)
            if options is not None and options.identity():
                facts[section] = options.identity()
        if facts["input_kind"] is None:  # the task's own input: digests stay as they were before the field existed
            del facts["input_kind"]
        return facts

    def scoring_settings(self) -> dict:
        """The settings that change a prediction for given model files: :meth:`identity` less where the files come
        from (``source``, ``revision``: the files themselves are digested), where they run (``device``) and the
        load-time guards (``expect_sha256``, ``allow_pickle``)."""
        where = ("source", "revision", "device", "expect_sha256", "allow_pickle")
        return {k: v for k, v in self.identity().items() if k not in where}

    @property
    def reduced_precision(self) -> str | None:
        """The lossy numeric path this spec runs, ``int8`` (``quantize``) or ``bfloat16`` / ``float16`` (``dtype``);
        ``None`` for float32. A run on such a path checks a sample of its input against float32 before it scores
        (:func:`lakescore.udfs.models.quantize.check_fidelity`)."""
        if self.quantize != "none":
            return self.quantize
        return None if self.dtype == "float32" else self.dtype

    def float32_reference(self) -> ModelSpec:
        """The same weights at float32, unquantized: what a reduced-precision run is checked against."""
        return replace(self, quantize="none", dtype="float32", expect_sha256=None)

    @classmethod
    def of(
        cls,
        task: str,
        model: ModelOptions,
        feature_cols: tuple[str, ...] = (),
        input_kind: str | None = None,
        **task_options: Any,
    ) -> ModelSpec:
        """The spec of ``task`` with the ``model`` section's settings (the weights digest pin in lower case) and the
        task's own section by its name (``generate=``: :class:`~lakescore.udfs.options.generate.GenerateOptions`,
        ``embed=``: :class:`~lakescore.udfs.options.embed.EmbedOptions`); ``input_kind``: the name of another input
        kind the task reads than its own (:attr:`lakescore.udfs.registry.Task.other_inputs`)."""
        settings = {name: getattr(model, name) for name in MODEL_SETTINGS}  # the section's fields, by their names
        if "auto" in (settings["backend"], settings["dtype"]):
            raise ValueError("model.backend / model.dtype auto: make them concrete first (ModelOptions.on_cpu)")
        pin = settings["expect_sha256"]
        settings["expect_sha256"] = pin.lower() if pin else None
        return cls(task=task, **settings, feature_cols=feature_cols, input_kind=input_kind, **task_options)


MODEL_SETTINGS = tuple(name for name in ModelOptions.model_fields if name not in DRIVER_ONLY)
"""The ``model`` section's settings a worker reads: the spec's fields after ``task``, up to ``feature_cols``."""

_TASK_SECTIONS = ("generate", "embed", "transcribe")
"""The spec's fields holding a task's own settings section, each counted in :meth:`~ModelSpec.identity` only when
it says something (so a spec without one keeps the digests it had before the field existed)."""


def needs_staging(source: str) -> bool:
    """True for a URI (``scheme:/...``: Hadoop filesystems, MLflow) that must be staged to local disk first."""
    scheme, sep, _ = source.partition(":")
    return bool(sep) and len(scheme) > 1 and scheme.replace("+", "").replace("-", "").isalnum()


def is_mlflow_uri(source: str) -> bool:
    """True for an MLflow model URI (``models:/...``, ``runs:/...``)."""
    return source.startswith(("models:/", "runs:/"))


def shipped_name(source: str, revision: str | None = None) -> str:
    """The name under which executors find the staged copy of remote ``source`` (``SparkFiles.get``).

    A Hadoop URI keeps its basename (what ``addFile`` names it); an MLflow model is named by a
    digest of the URI and its pinned revision, so an alias that moves is a new name.
    """
    if is_mlflow_uri(source):
        return "lakescore-mlflow-" + hashlib.sha256(f"{source}\n{revision}".encode()).hexdigest()[:16]
    return source.rstrip("/").rsplit("/", 1)[-1]


def resolve_model_dir(source: str, revision: str | None = None) -> Path:
    """Return a local directory (or, for tabular programs, a file) holding the model for ``source``.

    A path that exists is used as is. A remote URI resolves to its staged copy
    (:func:`staged_copy`). Anything else is treated as a hub id and fetched (or
    found in the local hub cache) with ``huggingface_hub``.

    Raises :class:`ModelSourceError` naming the source when none of these works.
    """
    if needs_staging(source):
        staged = staged_copy(source, revision)
        if staged is None:
            raise ModelSourceError(
                f"model {source!r} is remote and was not staged to this host (see "
                "lakescore.jobs.platform.files.model_staging)"
            )
        return staged
    path = Path(source).expanduser()
    if path.exists():
        return path.resolve()
    if source.startswith((".", "/", "~")):
        raise ModelSourceError(f"model path {source!r} does not exist")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=source, revision=revision))
    except Exception as exc:  # hub errors are many types; one message names the source
        raise ModelSourceError(
            f"model {source!r} is not a local directory and could not be fetched from the hub: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc


def hub_revision(model_dir: Path) -> str | None:
    """The commit a hub snapshot directory holds (``.../snapshots/<commit>``), else ``None``."""
    if model_dir.parent.name == "snapshots" and len(model_dir.name) == 40:
        return model_dir.name
    return None


_staged: dict[str, Path] = {}
"""Shipped name (:func:`shipped_name`) -> local copy, registered by whoever staged it in this process."""


def staged_copy(source: str, revision: str | None = None) -> Path | None:
    """The local copy of remote ``source`` in this process: registered, or shipped by Spark (``SparkFiles``)."""
    name = shipped_name(source, revision)
    if name in _staged:
        return _staged[name]
    try:
        from pyspark import SparkFiles

        candidate = Path(SparkFiles.get(name))
    except Exception:  # no SparkContext / SparkFiles root in this process
        return None
    return candidate if candidate.exists() else None


def register_staged(name: str, local: Path) -> None:
    """Record that the model shipped as ``name`` (:func:`shipped_name`) is at ``local`` in this process."""
    _staged[name] = local


def stage_once(key: str, cache_root: Path, copy: Callable[[Path], None]) -> Path:
    """Return ``cache_root/<key>``, running ``copy(tmp_dir)`` to fill it only if no process has yet.

    Processes of one host share ``cache_root``: an exclusive ``fcntl`` lock on
    ``<key>.lock`` makes concurrent callers wait for the first copy instead of
    copying again, and the copy lands under a temporary name, renamed into place
    only when complete, so a crashed copy is never mistaken for a finished one.
    ``copy`` receives an empty directory and must put the model files in it.
    """
    import fcntl
    import shutil
    import tempfile

    cache_root.mkdir(parents=True, exist_ok=True)
    target = cache_root / key
    with open(cache_root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if target.exists():
                return target
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_root))
            try:
                copy(tmp)
                tmp.rename(target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return target
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def require_directory(model_path: Path, task: str) -> None:
    """Raise :class:`ModelSourceError` when a ``task`` model that needs a directory was given as a file."""
    if not model_path.is_dir():
        raise ModelSourceError(
            f"model source {str(model_path)!r} is a file; a {task} model is a directory (config, weights, tokenizer)"
        )


def refuse_pickle_weights(model_path: Path, allow_pickle: bool) -> None:
    """Raise :class:`ModelSourceError` when ``model_path`` holds only pickle weights and pickle is not allowed."""
    if allow_pickle:
        return
    files = weight_files(model_path)
    if files and all(f.suffix in PICKLE_SUFFIXES for f in files):
        raise ModelSourceError(
            f"{model_path} holds only pickle-based weights ({', '.join(f.name for f in files)}); loading them can run "
            "arbitrary code. Convert them to safetensors, or opt in with model.allow_pickle: true (--allow-pickle)"
        )


def weight_files(model_dir: Path) -> list[Path]:
    """Weight files under ``model_dir`` (recursively, hidden folders skipped), sorted; a file is its own list."""
    if model_dir.is_file():
        return [model_dir]
    files = [
        p
        for p in model_dir.rglob("*")
        if p.is_file()
        and p.suffix in WEIGHT_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(model_dir).parts)
    ]
    return sorted(files, key=lambda p: p.relative_to(model_dir).as_posix())


def model_file_digests(model_dir: Path) -> dict[str, str]:
    """SHA-256 of every file in ``model_dir`` that is not weights and may change a prediction, by relative path:
    configs, tokenizer files, sentence-transformers module configs, label maps, chat templates, remote code
    (hidden folders, ``__pycache__`` and :data:`NOT_READ_SUFFIXES` skipped). ``{}`` for a one-file model.

    Weights are digested apart (:func:`weights_sha256`): together they are what the model computes."""
    if model_dir.is_file():
        return {}
    files = sorted(
        p
        for p in model_dir.rglob("*")
        if p.is_file()
        and p.suffix not in WEIGHT_SUFFIXES + NOT_READ_SUFFIXES
        and not p.name.upper().startswith(("LICENSE", "NOTICE"))
        and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(model_dir).parts)
    )
    return {p.relative_to(model_dir).as_posix(): _file_sha256(p) for p in files}


def verify_sha256(found: str, expected: str | None, source: str) -> None:
    """Raise :class:`ModelIntegrityError` naming both digests when ``expected`` is set and differs."""
    if expected is not None and found.lower() != expected.lower():
        raise ModelIntegrityError(
            f"model {source!r} has weights sha256 {found}, but the run expects {expected.lower()}; refusing to score"
        )


def weights_sha256(model_dir: Path) -> str:
    """Digest of the weight files in ``model_dir`` (see module docstring).

    Raises :class:`ModelSourceError` if the directory holds no weight file.
    """
    files = weight_files(model_dir)
    if not files:
        raise ModelSourceError(
            f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) found under model directory {model_dir}"
        )
    root = model_dir.parent if model_dir.is_file() else model_dir
    digests = [(_file_sha256(p), p.relative_to(root).as_posix()) for p in files]
    return _manifest_digest(digests)


def _manifest_digest(digests: list[tuple[str, str]]) -> str:
    if len(digests) == 1:
        return digests[0][0]
    manifest = "".join(f"{hexdigest}  {name}\n" for hexdigest, name in digests)
    return hashlib.sha256(manifest.encode("utf-8")).hexdigest()


_file_digests: dict[tuple[str, int, int], str] = {}
"""(path, size, mtime_ns) -> sha256: a process hashes a weight file once (the cache and the ONNX export both ask)."""


def _file_sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _file_digests:
        _file_digests[key] = _hash_file(path)
    return _file_digests[key]


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
