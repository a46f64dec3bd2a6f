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
    "ShapeMismatchError",
    "SourceNotFoundError",
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
    """The model configuration is missing, unreadable or inconsistent."""


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


class PackedSplitError(UnsupportedError):
    """A part or rank's share of a packed parameter does not start and end on a whole packed element."""


class FusedLayerSkipError(UnsupportedError):
    """A quantization config keeps some parts of a fused layer unquantized but not the others."""
