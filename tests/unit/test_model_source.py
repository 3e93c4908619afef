import hashlib

import pytest

from lakescore.udfs.models.model_source import ModelSourceError, resolve_model_dir, weights_sha256


def test_single_weight_file_digest_equals_sha256sum(minilm_dir):
    expected = hashlib.sha256((minilm_dir / "model.safetensors").read_bytes()).hexdigest()
    assert weights_sha256(minilm_dir) == expected


def test_several_weight_files_digest_a_sorted_manifest(tmp_path):
    (tmp_path / "2_Dense").mkdir()
    (tmp_path / "model-00001.safetensors").write_bytes(b"first")
    (tmp_path / "2_Dense" / "model.safetensors").write_bytes(b"dense")
    (tmp_path / "config.json").write_text("{}")  # not a weight file: ignored
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "stale.safetensors").write_bytes(b"ignored")  # hidden folders are ignored
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    manifest = f"{sha(b'dense')}  2_Dense/model.safetensors\n{sha(b'first')}  model-00001.safetensors\n"
    assert weights_sha256(tmp_path) == sha(manifest.encode())


def test_digest_changes_when_weights_change(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"v1")
    before = weights_sha256(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"v2")
    assert weights_sha256(tmp_path) != before


def test_directory_without_weights_is_an_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelSourceError, match="no weight files"):
        weights_sha256(tmp_path)


def test_missing_local_directory_is_named(tmp_path):
    with pytest.raises(ModelSourceError, match=r"model path '.*/absent' does not exist"):
        resolve_model_dir(str(tmp_path / "absent"))


@pytest.mark.parametrize("task", ["embed", "classify"])
def test_a_file_is_not_a_text_model(tmp_path, task):
    from lakescore.udfs.models.model_source import ModelSpec
    from lakescore.udfs.registry import get_task

    path = tmp_path / "model.safetensors"
    path.write_bytes(b"x")
    assert resolve_model_dir(str(path)) == path  # files are fine as sources (tabular programs) ...
    with pytest.raises(ModelSourceError, match="is a file"):  # ... but a text model is a directory
        get_task(task).load(ModelSpec(task, str(path)), path)


def test_unreachable_hub_id_fails_with_the_id():
    # HF_HUB_OFFLINE=1 (conftest): the hub path runs for real and refuses at once.
    with pytest.raises(
        ModelSourceError, match=r"'no-such-org/no-such-model' is not a local directory and could not be fetched"
    ):
        resolve_model_dir("no-such-org/no-such-model")


def test_expect_sha256_match_loads_and_mismatch_refuses_naming_both(minilm_dir):
    from lakescore.udfs.models import model_cache
    from lakescore.udfs.models.model_source import ModelIntegrityError, ModelSpec

    digest = weights_sha256(minilm_dir)
    model_cache.clear()
    loaded, _ = model_cache.get_model(ModelSpec("embed", str(minilm_dir), expect_sha256=digest))
    assert loaded.sha256 == digest
    wrong = "ab" * 32
    with pytest.raises(ModelIntegrityError) as info:
        model_cache.get_model(ModelSpec("embed", str(minilm_dir), expect_sha256=wrong))
    assert digest in str(info.value) and wrong in str(info.value)
    model_cache.clear()


def test_remote_uris_are_told_from_paths_and_hub_ids():
    from lakescore.udfs.models.model_source import needs_staging

    assert needs_staging("s3a://bucket/models/x") and needs_staging("dbfs:/models/x") and needs_staging("file:/tmp/x")
    assert not needs_staging("/models/x") and not needs_staging("org/model") and not needs_staging("C:\\models")


def test_the_spec_takes_the_model_sections_settings_in_order_with_their_defaults():
    """``ModelSpec`` is written out field by field (so an editor and a type checker see them): each ``model.*`` setting
    a worker reads is a field, in the section's order and with its default; ``cache_dir`` is outside the cache key."""
    from dataclasses import MISSING, fields

    from lakescore.udfs.models.model_source import MODEL_SETTINGS, ModelSpec
    from lakescore.udfs.options.model import ModelOptions

    spec_fields = {f.name: f for f in fields(ModelSpec)}
    names = list(spec_fields)
    assert names[0] == "task" and names[1 : 1 + len(MODEL_SETTINGS)] == list(MODEL_SETTINGS)
    assert names[1 + len(MODEL_SETTINGS) :] == ["feature_cols", "generate", "embed", "transcribe", "input_kind"]
    assert spec_fields["source"].default is MISSING
    for name in MODEL_SETTINGS[1:]:
        assert spec_fields[name].default == ModelOptions.model_fields[name].default, name
    assert [name for name, f in spec_fields.items() if not f.compare] == ["cache_dir"]


_COPIER = """
import sys, time, shutil
from pathlib import Path
from lakescore.udfs.models.model_source import stage_once
source, cache, log = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
def copy(tmp):
    with log.open("a") as handle:
        handle.write("copy\\n")
    time.sleep(1.0)  # a slow remote: the second process arrives while the first copies
    shutil.copytree(source, tmp / "model")
print(stage_once("k1", cache, copy))
"""


def test_stage_once_copies_once_when_two_processes_ask_at_once(tmp_path):
    import subprocess
    import sys

    source = tmp_path / "remote"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"w" * 1000)
    cache, log = tmp_path / "cache", tmp_path / "copies.log"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _COPIER, str(source), str(cache), str(log)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert log.read_text().count("copy") == 1  # the second process waited and reused the first copy
    assert outputs[0] == outputs[1] == str(cache / "k1")
    assert (cache / "k1" / "model" / "model.safetensors").read_bytes() == b"w" * 1000
    assert not [p for p in cache.iterdir() if p.name.startswith(".k1.")]  # no half-copied leftovers


def test_a_failed_copy_leaves_nothing_that_looks_complete(tmp_path):
    from lakescore.udfs.models.model_source import stage_once

    def broken(tmp):
        (tmp / "partial").write_text("half")
        raise OSError("connection reset")

    with pytest.raises(OSError, match="connection reset"):
        stage_once("k2", tmp_path, broken)
    assert not (tmp_path / "k2").exists()
    assert stage_once("k2", tmp_path, lambda tmp: (tmp / "ok").write_text("done")) == tmp_path / "k2"


def test_devices_resolve_per_task_gpu_and_fall_back_for_auto():
    from lakescore.udfs.models.devices import resolve_device

    assert resolve_device("auto", cuda_available=False) == "cpu"
    assert resolve_device("auto", cuda_available=True, gpu_address="3") == "cuda:3"
    assert resolve_device("cuda", cuda_available=True, gpu_address="1") == "cuda:1"
    with pytest.raises(RuntimeError, match="sees no CUDA device"):
        resolve_device("cuda", cuda_available=False)
