import hashlib

import pytest

from udfs.model_source import ModelSourceError, resolve_model_dir, weights_sha256


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
    with pytest.raises(ModelSourceError, match=r"model directory '.*/absent' does not exist"):
        resolve_model_dir(str(tmp_path / "absent"))


def test_a_file_is_not_a_model_directory(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"x")
    with pytest.raises(ModelSourceError, match="is a file"):
        resolve_model_dir(str(path))


def test_unreachable_hub_id_fails_with_the_id():
    # HF_HUB_OFFLINE=1 (conftest): the hub path runs for real and refuses at once.
    with pytest.raises(ModelSourceError, match=r"'no-such-org/no-such-model' is not a local directory and could not be fetched"):
        resolve_model_dir("no-such-org/no-such-model")
