"""Encryption keys: a key file holds tensorizer's 32-byte key as raw bytes (as vLLM's ``encryption_keyfile``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from loader.errors import UnsupportedError

__all__ = ["KEY_BYTES", "decryption_for", "encryption_for", "read_key"]

KEY_BYTES = 32


def read_key(path: Path) -> bytes:
    """The key in ``path``; a missing file or one of the wrong length is an error naming it."""
    try:
        key = path.read_bytes()
    except OSError as exc:
        raise UnsupportedError(f"{path}: cannot read the encryption key file ({exc.strerror or exc})") from exc
    if len(key) != KEY_BYTES:
        raise UnsupportedError(f"{path}: an encryption key file holds {KEY_BYTES} raw bytes, found {len(key)}")
    return key


def decryption_for(path: Path | None) -> Any:
    """tensorizer's ``DecryptionParams`` for the key in ``path``, or ``None`` for a plain file."""
    if path is None:
        return None
    from tensorizer.serialization import DecryptionParams

    return DecryptionParams.from_key(read_key(path))


def encryption_for(path: Path) -> Any:
    """tensorizer's ``EncryptionParams`` for the key in ``path``; a missing file gets a new random key (0600)."""
    from tensorizer.serialization import EncryptionParams

    if path.exists():
        return EncryptionParams(read_key(path))
    params = EncryptionParams.random()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(params.key)
    return params
