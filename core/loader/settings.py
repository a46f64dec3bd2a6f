"""Environment variables, declared once and parsed one way: a ``LOADER_*`` variable is a :class:`Setting`.

A setting is a record: its variable's name, a :class:`Kind` (how the text
becomes a value, and what the variable accepts, in words), the default and a
one-line doc. :meth:`Setting.read` is the one parse path: it reads the
variable when called (never cached, so a change to ``os.environ`` counts at
the next read), strips surrounding whitespace, gives the default when the
variable is unset or blank, and raises :class:`loader.errors.SettingError`
naming the variable, the value and what it accepts when the value does not
parse. No setting ignores a bad value.

The core declares its variables in one module (``loader._settings``); a plugin
declares its own the same way, as module constants, and reads them with
:meth:`Setting.read`::

    from loader.settings import FLAG, Setting

    PACKED_CACHE = Setting("LOADER_GGUF_PACKED_CACHE", FLAG, default=True,
                           doc="`0`: packed GGUF loads neither read nor write packed-weights bundles")

    if PACKED_CACHE.read(): ...

The user guide's table of environment variables is generated from these records
(``scripts/gen_docs.py``), so a variable that is read but not declared, or
declared but missing from the docs, fails the docs check.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Generic, TypeVar

import attrs

from .errors import SettingError

__all__ = ["FLAG", "FOLDER", "Kind", "Setting", "integer", "names", "seconds"]

T_co = TypeVar("T_co", covariant=True)
K_co = TypeVar("K_co", covariant=True)

_NAME = re.compile(r"LOADER_[A-Z0-9]+(?:_[A-Z0-9]+)*")
_YES = ("1", "true", "yes", "on")
_NO = ("0", "false", "no", "off")
_LIST_ITEM = re.compile(r"[\w.-]+")


@attrs.frozen
class Kind(Generic[K_co]):
    """How a setting's text becomes a value.

    ``parse`` gets the stripped, non-blank text (or ``""`` for a setting whose
    blank value means something, :attr:`Setting.blank_is_default`) and returns
    the value or raises :class:`ValueError`; ``expected`` says what it accepts,
    finishing the sentence "expected ..." of the error and shown in the docs.
    """

    parse: Callable[[str], K_co]
    expected: str


def _flag(text: str) -> bool:
    lowered = text.lower()
    if lowered in _YES:
        return True
    if lowered in _NO:
        return False
    raise ValueError(text)


FLAG: Kind[bool] = Kind(_flag, "a yes/no value (1, true, yes, on / 0, false, no, off)")
"""On or off: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``, any case."""


def integer(minimum: int = 0, *, unit: str = "") -> Kind[int]:
    """A whole number of at least ``minimum`` (decimal digits, an optional sign); ``unit`` names what it counts."""

    def parse(text: str) -> int:
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise ValueError(text)
        value = int(text)
        if value < minimum:
            raise ValueError(text)
        return value

    what = f"a whole number of {unit}" if unit else "a whole number"
    return Kind(parse, f"{what} (at least {minimum})")


def seconds() -> Kind[float]:
    """A positive, finite number of seconds (``2``, ``0.5``, ``1e3``)."""

    def parse(text: str) -> float:
        value = float(text)  # ValueError for text that is no number
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(text)
        return value

    return Kind(parse, "a positive number of seconds")


def names(noun: str = "", *, star: bool = False) -> Kind[frozenset[str]]:
    """Comma-separated names (letters, digits, ``_``, ``.``, ``-``; ``noun`` says of what), blanks around
    commas ignored; with ``star``, ``*`` may stand for every name. A blank value is no names."""

    def parse(text: str) -> frozenset[str]:
        parts = [part.strip() for part in text.split(",")]
        found = frozenset(part for part in parts if part)
        if any(not (_LIST_ITEM.fullmatch(part) or (star and part == "*")) for part in found):
            raise ValueError(text)
        return found

    expected = f"comma-separated {noun + ' ' if noun else ''}names (letters, digits, '_', '.', '-')"
    return Kind(parse, expected + (", or *" if star else ""))


def _folder(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_absolute():
        raise ValueError(text)
    return path


FOLDER: Kind[Path] = Kind(_folder, "an absolute path (a leading ~ is expanded)")
"""A folder, as an absolute path (``~`` expanded); a relative one is refused, as the XDG base directory
specification refuses one, since it would move with the working directory."""


def _show(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, frozenset):
        return ",".join(sorted(value)) or "none"
    return str(value)


@attrs.frozen
class Setting(Generic[T_co]):
    """One environment variable: its name, kind, default and one-line doc; :meth:`read` parses it."""

    name: str = attrs.field()
    """The variable, ``LOADER_`` then capitals, digits and single underscores (a plugin's: ``LOADER_<PLUGIN>_...``)."""
    kind: Kind[T_co]
    default: T_co
    """The value when the variable is unset (or blank). A default the reader computes is ``None`` (the
    setting is then a ``Setting[X | None]``), and :attr:`default_doc` says what it is."""
    doc: str = attrs.field()
    """What the variable does, one line of Markdown (the user guide's table shows it as written)."""
    default_doc: str | None = None
    """How the docs state the default, where :attr:`default` alone would not say it (a computed one)."""
    blank_is_default: bool = True
    """Whether a blank value means the default; ``False`` where blank means something (``LOADER_PLUGINS=``
    loads no plugin), and ``kind`` parses ``""``."""

    @name.validator
    def _check_name(self, _attribute: object, value: str) -> None:
        if not _NAME.fullmatch(value):
            raise ValueError(f"setting name {value!r} is not LOADER_ followed by capitals, digits and underscores")

    @doc.validator
    def _check_doc(self, _attribute: object, value: str) -> None:
        if not value.strip() or "\n" in value:
            raise ValueError(f"{self.name}: doc must be one non-empty line")

    def read(self, environ: Mapping[str, str] | None = None) -> T_co:
        """The variable's value in ``environ`` (default: ``os.environ``, read now), parsed.

        :raises loader.errors.SettingError: the value does not parse; the message names the variable, the value
            as it was set and what the variable accepts.
        """
        raw = (os.environ if environ is None else environ).get(self.name)
        if raw is None:
            return self.default
        text = raw.strip()
        if not text and self.blank_is_default:
            return self.default
        try:
            return self.kind.parse(text)
        except ValueError:
            raise SettingError(self.name, raw, self.kind.expected) from None

    def default_text(self) -> str:
        """The default as the docs state it."""
        if self.default_doc is not None:
            return self.default_doc
        return _show(self.default)
