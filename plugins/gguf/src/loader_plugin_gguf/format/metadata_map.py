"""A GGUF header's key/value pairs, where a string value that is not UTF-8 fails when read, not when parsed.

GGUF strings are meant to be UTF-8, but ggml's ``gguf_init`` keeps their bytes as they are and
gguf-py decodes a value only when asked: llama.cpp loads a file whose unused strings are not
UTF-8. Refusing such a file while parsing its header would refuse files both references load,
for a value the load may never read. So the header keeps an :class:`UndecodedString` for such a
value, and :class:`GGUFMetadata` raises a :class:`~loader.errors.CheckpointFormatError` naming the
file and the key when it is read -- as :class:`~.header.GGUFStrings` does for string arrays.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from loader.errors import CheckpointFormatError

__all__ = ["GGUFMetadata", "UndecodedString"]


@attrs.frozen
class UndecodedString:
    """A metadata string whose bytes are not UTF-8, and why they are not."""

    reason: str


class GGUFMetadata(Mapping[str, Any]):
    """Metadata key -> value; reading a key whose string value is not UTF-8 raises, naming the file and key."""

    __slots__ = ("_path", "_values")

    def __init__(self, path: Path, values: dict[str, Any]) -> None:
        self._path = path
        self._values = values

    def __getitem__(self, key: str) -> Any:
        value = self._values[key]
        if isinstance(value, UndecodedString):
            raise CheckpointFormatError(f"{self._path}: metadata key {key!r} is not valid UTF-8 ({value.reason})")
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"GGUFMetadata({len(self._values)} keys of {self._path})"
