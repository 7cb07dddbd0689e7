"""Identity key files (node.keyfile): 0600 on save, clear errors on every bad file."""

import os
import stat

import pytest

from node.core.identity import Identity
from node.keyfile import KeyFileError, load_identity, save_identity


def test_save_then_load_gives_the_same_key_with_private_mode(tmp_path):
    path = tmp_path / "node.key"
    original = Identity.generate()
    save_identity(original, path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_identity(path).public_key == original.public_key


def test_save_refuses_to_overwrite(tmp_path):
    path = tmp_path / "node.key"
    save_identity(Identity.generate(), path)
    with pytest.raises(KeyFileError, match="already exists"):
        save_identity(Identity.generate(), path)


def test_missing_key_file(tmp_path):
    with pytest.raises(KeyFileError, match="does not exist"):
        load_identity(tmp_path / "absent.key")


@pytest.mark.parametrize(
    "content, message",
    [("not hex at all\n", "malformed"), ("abcd\n", "malformed: seed is 2 bytes"), ("", "malformed")],
)
def test_malformed_key_file(tmp_path, content, message):
    path = tmp_path / "bad.key"
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match=message):
        load_identity(path)


def test_binary_garbage_key_file(tmp_path):
    path = tmp_path / "bin.key"
    path.write_bytes(b"\xff\xfe\x00garbage")
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match="malformed"):
        load_identity(path)


def test_key_file_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "open.key"
    save_identity(Identity.generate(), path)
    path.chmod(0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_identity(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_key_file(tmp_path):
    path = tmp_path / "locked.key"
    save_identity(Identity.generate(), path)
    path.chmod(0o000)
    with pytest.raises(KeyFileError, match="not readable"):
        load_identity(path)
