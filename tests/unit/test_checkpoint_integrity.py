"""Checkpoint integrity records (services/actor/integrity.py): signing, verifying, and the key they use."""

import pytest

from services.actor import integrity


@pytest.fixture
def key_home(tmp_path, monkeypatch):
    monkeypatch.delenv(integrity.KEY_VAR, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "meshrl" / "checkpoint.key"


def saved(folder, files: dict[str, bytes], key: bytes) -> None:
    before = integrity.snapshot(folder)
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    integrity.sign(folder, before, key)


def test_the_key_file_is_made_once_private_and_refused_when_not(key_home, monkeypatch):
    key = integrity.checkpoint_key()
    assert len(key) == 32 and integrity.checkpoint_key() == key
    assert key_home.stat().st_mode & 0o777 == 0o600
    key_home.chmod(0o644)  # readable by others: whoever read it could sign a pickle
    with pytest.raises(ValueError, match="only they may read"):
        integrity.checkpoint_key()
    monkeypatch.setenv(integrity.KEY_VAR, "shared secret")  # set: used instead
    assert integrity.checkpoint_key() == b"shared secret"


def test_a_signed_folder_verifies_and_a_changed_one_does_not(tmp_path, key_home):
    key = integrity.checkpoint_key()
    saved(tmp_path / "c", {"dcp/.metadata": b"m", "dcp/__0_0.distcp": b"w", "scheduler.json": b"{}"}, key)
    integrity.verify(tmp_path / "c", key)
    with pytest.raises(ValueError, match="not signed with this service's checkpoint key"):
        integrity.verify(tmp_path / "c", b"another key")
    (tmp_path / "c" / "dcp" / "extra").symlink_to(tmp_path / "c" / "scheduler.json")
    with pytest.raises(ValueError, match="dcp/extra is not a regular file"):
        integrity.verify(tmp_path / "c", key)
    (tmp_path / "c" / "dcp" / "extra").unlink()
    (tmp_path / "c" / "scheduler.json").unlink()
    with pytest.raises(ValueError, match="scheduler.json is in its integrity record but missing"):
        integrity.verify(tmp_path / "c", key)


def test_a_save_signs_only_what_it_wrote(tmp_path, key_home):
    key = integrity.checkpoint_key()
    folder = tmp_path / "c"
    saved(folder, {"dcp/.metadata": b"m"}, key)
    saved(folder, {"dcp/.metadata": b"m2"}, key)  # saved again into the same folder: fine
    integrity.verify(folder, key)
    (folder / "dcp" / "planted.distcp").write_bytes(b"p")  # there before the next save, untouched by it
    with pytest.raises(ValueError, match="did not write, e.g. \\['dcp/planted.distcp'\\]"):
        saved(folder, {"dcp/.metadata": b"m3"}, key)
