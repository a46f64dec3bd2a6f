"""Errors a user can cause, each naming the file, tensor or field at fault.

Every failure that comes from the input (a checkpoint, a config, an option) is a
:class:`LoadError` subclass so callers can catch one type, and the CLI can print
it on one line with exit code 2. Bugs in loader itself stay ordinary exceptions.
"""

from __future__ import annotations

__all__ = [
    "CheckpointFormatError",
    "ConfigError",
    "FusedLayerSkipError",
    "LoadError",
    "MissingWeightsError",
    "PackedSplitError",
    "PluginError",
    "SettingError",
    "ShapeMismatchError",
    "SourceNotFoundError",
    "TrustRemoteCodeError",
    "UnexpectedWeightError",
    "UnknownArchitectureError",
    "UnsupportedError",
]


class LoadError(Exception):
    """Base class of every error caused by the input to a load."""


class SourceNotFoundError(LoadError):
    """The source (path, Hub id, URI) does not exist or holds no weights."""


class CheckpointFormatError(LoadError):
    """A weight file is malformed: bad header, truncated data, unknown dtype."""


class ConfigError(LoadError):
    """The configuration is missing, unreadable or inconsistent: the model's, or the process's (its environment)."""


class SettingError(ConfigError):
    """An environment variable (a ``LOADER_*`` setting, :mod:`loader.settings`) holds a value it cannot take.

    Raised when the setting is read, not when the process starts, so it names the
    variable, the value as it was set and what the variable accepts:
    ``LOADER_READ_THREADS='many': expected a whole number of threads (at least 1)``.
    :attr:`name`, :attr:`value` and :attr:`expected` hold the three parts.
    """

    def __init__(self, name: str, value: str, expected: str, message: str | None = None) -> None:
        self.name = name
        self.value = value
        self.expected = expected
        super().__init__(message if message is not None else f"{name}={value!r}: expected {expected}")

    def __reduce__(self) -> tuple[type[SettingError], tuple[str, str, str, str]]:
        return type(self), (self.name, self.value, self.expected, str(self))  # so it crosses processes whole


class UnknownArchitectureError(LoadError):
    """No installed plugin registers the checkpoint's architecture."""


class UnsupportedError(LoadError):
    """The request is well-formed but not supported (dtype, quant type, tp size)."""


class PluginError(LoadError):
    """A plugin raised inside a hook; the message names the plugin and the hook."""


class MissingWeightsError(LoadError):
    """Some parameters were never filled from the checkpoint."""


class UnexpectedWeightError(LoadError):
    """The checkpoint holds a tensor the model has no place for."""


class ShapeMismatchError(LoadError):
    """A checkpoint tensor does not have the shape its parameter expects."""


class TrustRemoteCodeError(UnsupportedError):
    """The checkpoint needs its own modeling code (``auto_map``) and ``trust_remote_code`` was not given."""


class PackedSplitError(UnsupportedError):
    """A part or rank's share of a packed parameter does not start and end on a whole packed element."""


class FusedLayerSkipError(UnsupportedError):
    """A quantization config keeps some parts of a fused layer unquantized but not the others."""
