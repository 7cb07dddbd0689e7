"""Key files: an identity's seed on disk, written private and checked on load.

The private key file holds the 32-byte seed as hex on one line, written with
mode 0600 so other local users cannot read it. Loading a key file that is
missing, unreadable, too open or malformed raises `KeyFileError` with a
message a user can act on.

Why here and not in `node.core.identity`: the core is sans-IO (it never opens
a file); the runtime, the CLI and the relay client load and save keys.
`load_or_create_identity` is the node's own key (the runtime's data dir):
made on first open, and its problems reported as `NodeError` like any other
failure to open a node.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from node.core.identity import SEED_BYTES, Identity
from node.errors import NodeError

KEY_FILE_MODE = 0o600


class KeyFileError(Exception):
    """A key file could not be created or loaded; the message says why."""


def save_identity(identity: Identity, path: str | os.PathLike[str]) -> None:
    """Write the seed to `path` (mode 0600); refuse to overwrite an existing file."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
    except FileExistsError:
        raise KeyFileError(f"key file {path} already exists; not overwriting it") from None
    except OSError as exc:
        raise KeyFileError(f"cannot create key file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(identity.seed.hex() + "\n")


def load_identity(path: str | os.PathLike[str]) -> Identity:
    """The identity whose seed `path` holds; KeyFileError says what is wrong with the file."""
    path = Path(path)
    try:
        info = path.stat()
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise KeyFileError(f"key file {path} does not exist (create one with `megnode keygen`)") from None
    except PermissionError:
        raise KeyFileError(f"key file {path} is not readable by this user") from None
    except UnicodeDecodeError:
        raise KeyFileError(f"key file {path} is malformed: not a hex seed") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"key file {path} is readable by other users (mode {oct(info.st_mode & 0o777)}); "
            f"run: chmod 600 {path}"
        )
    try:
        seed = bytes.fromhex(text.strip())
    except ValueError:
        raise KeyFileError(f"key file {path} is malformed: not a hex seed") from None
    if len(seed) != SEED_BYTES:
        raise KeyFileError(
            f"key file {path} is malformed: seed is {len(seed)} bytes, expected {SEED_BYTES}"
        )
    return Identity.from_seed(seed)


def load_or_create_identity(path: Path) -> Identity:
    """The node's identity from `path`, generated (mode 0600) if the file does not exist."""
    if not path.exists():
        identity = Identity.generate()
        try:
            save_identity(identity, path)
        except KeyFileError as exc:
            raise NodeError(str(exc)) from None
        return identity
    try:
        return load_identity(path)
    except KeyFileError as exc:
        raise NodeError(str(exc)) from None
