"""The contract between the loader core and its plugins.

Every hook a plugin may implement is declared here, in pytest's shape: a
summary line, whether the call stops at the first non-``None`` result, each
parameter and the return value. A plugin implements a hook with
``@loader.hookimpl`` and may accept fewer arguments than the spec lists, so
specs grow by adding arguments without breaking plugins.

Nothing outside the core calls these hooks directly: :mod:`loader._hooks`
wraps each one in a typed function that calls it through pluggy, and the
host registers each plugin guarded (:mod:`loader._plugin_guard`) so that a
failure names the plugin and the hook.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .checkpoint import LoadOptions, Source, TokenizerBundle, WeightFormat
    from .layers import QuantizationConfig
    from .weights import ReadStats, WeightStream

__all__ = [
    "PROJECT_NAME",
    "CliCommand",
    "RegisterArchitecture",
    "hookimpl",
    "hookspec",
    "loader_cli_commands",
    "loader_detect_format",
    "loader_detect_quantization",
    "loader_iter_weights",
    "loader_load_tokenizer",
    "loader_process_weights_after_loading",
    "loader_read_config",
    "loader_register_architectures",
    "loader_resolve_source",
]

PROJECT_NAME = "loader"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)



class RegisterArchitecture(Protocol):
    """``register(architecture, "package.module:Class", *, fallback=False)``: the callback plugins get."""

    def __call__(self, architecture: str, class_path: str, *, fallback: bool = False) -> None: ...


class CliCommand(Protocol):
    """A subcommand a plugin adds to the ``loader`` command line (what ``loader_cli_commands`` returns)."""

    name: str
    """The subcommand (``save-tensorized``); a core command's name is refused."""
    help: str
    """Its one-line help in ``loader --help``."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the subcommand's arguments on its own parser."""
        ...

    def run(self, args: argparse.Namespace) -> int:
        """Carry it out and return the exit status; a :class:`~loader.errors.LoadError` becomes one line."""
        ...


# --- source resolution -------------------------------------------------------


@hookspec(firstresult=True)
def loader_resolve_source(location: str, options: LoadOptions) -> Source | None:
    """Resolve what the user passed (a path, Hub id, URI) to a :class:`~loader.checkpoint.Source`.

    Stops at the first non-``None`` result. The core answers last for local
    paths and ``org/name`` Hub ids; a plugin claims schemes such as ``s3://``.

    :param location: the string given to ``load_model``.
    :param options: the validated load options (revision, requested format).
    :returns: the resolved source, or ``None`` if this plugin does not handle it.
    """


# --- format detection --------------------------------------------------------


@hookspec(firstresult=True)
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    """Say which weight format a source holds and list its weight files.

    Stops at the first non-``None`` result. With ``requested == "auto"`` a plugin
    answers if it recognises the files (safetensors before ``.bin``); with a
    format name it answers only for a name it owns. The core then keeps only
    files the returned index names and drops training artifacts.

    :param source: the resolved source.
    :param requested: ``"auto"`` or the ``load_format`` the user asked for.
    :returns: the format and its files, or ``None``.
    """


@hookspec(firstresult=True)
def loader_read_config(source: Source, weight_format: WeightFormat) -> Mapping[str, Any] | None:
    """Return the model configuration as a Hugging Face ``config.json``-shaped mapping.

    Stops at the first non-``None`` result. The core answers last by reading
    ``config.json``; a format whose files carry their own metadata (GGUF,
    Mistral's ``params.json``) answers first.

    :param source: the resolved source.
    :param weight_format: the chosen format.
    :returns: the configuration (must include ``architectures``), or ``None``.
    """


@hookspec(firstresult=True)
def loader_load_tokenizer(source: Source, weight_format: WeightFormat) -> TokenizerBundle | None:
    """Build the checkpoint's tokenizer.

    Stops at the first non-``None`` result. The core answers last from
    ``tokenizer.json`` and ``tokenizer_config.json``; GGUF builds one from metadata.

    :param source: the resolved source.
    :param weight_format: the chosen format.
    :returns: the tokenizer bundle, or ``None``.
    """


# --- weight iteration --------------------------------------------------------


@hookspec(firstresult=True)
def loader_iter_weights(
    source: Source, weight_format: WeightFormat, options: LoadOptions, stats: ReadStats, model: nn.Module
) -> WeightStream | None:
    """Yield the checkpoint's tensors lazily, as ``(name, CheckpointTensor)`` pairs.

    Stops at the first non-``None`` result: the plugin that owns
    ``weight_format.name`` answers. Handles must not be read before the
    model's weight loaders narrow them, so a TP rank reads only its own bytes;
    each read adds to ``stats``. Names are in the Hugging Face convention the
    model's ``load_weights`` maps from, unless the format says it holds the
    model's own parameter names (:attr:`~loader.checkpoint.WeightFormat.parameter_names`).
    The load's rank, size, dtype and device are :func:`loader.models.current_session`'s.

    :param source: the resolved source.
    :param weight_format: the chosen format with the filtered files.
    :param options: the load options (target dtype and device, TP rank/size);
        ``options.format_options`` holds the user's options for the format
        (``load_model(format_options=...)``, ``--format-option``), and
        ``options.headers_only`` is true when the caller reads only names,
        shapes and dtypes (``loader inspect``), so a streaming format need not fetch values
        (yield :class:`~loader.weights.HeaderOnlyTensor` handles built from the headers).
    :param stats: counter of bytes read.
    :param model: the model being loaded, built and given storage (the core's ``dummy``
        format reads its parameter names and shapes; checkpoint formats need not take it).
    :returns: an iterator of name/tensor pairs, or ``None`` for a format this plugin does not own.
    """


# --- architecture registration -----------------------------------------------


@hookspec
def loader_register_architectures(register: RegisterArchitecture) -> None:
    """Register model classes by architecture name.

    Called for every plugin. Call ``register("LlamaForCausalLM",
    "loader_plugin_llama.model:LlamaForCausalLM")``; the string form is lazy:
    nothing is imported until the class is used, and capabilities are probed in
    a child process. A name registered by two plugins is a conflict of that
    architecture only (loading it raises a ``PluginError`` naming both; the
    others load), unless ``LOADER_OVERRIDE_ARCHITECTURES`` names it: then the
    plugin asked first (registered later) wins, with a warning.

    ``register("TransformersForCausalLM", "...:Class", fallback=True)`` registers
    a *fallback*: the registry hands it the architectures no plugin registers
    (native classes always win) and every load asked for with
    ``model_impl="transformers"``. Its class reads the architecture from
    ``ctx.hf_config["architectures"]`` and raises
    :class:`~loader.errors.UnknownArchitectureError` for one it cannot build.
    At most one fallback may be installed.

    :param register: the registration callback.
    """


# --- command line -----------------------------------------------------------


@hookspec
def loader_cli_commands() -> Sequence[CliCommand] | None:
    """Add subcommands to the ``loader`` command line.

    Called for every plugin when the command line is built for a command the
    core does not own (and for ``loader --help``), so core commands never
    import a plugin. Each returned :class:`CliCommand` gets its own subparser;
    its ``run`` gets the parsed arguments, and a
    :class:`~loader.errors.LoadError` it raises prints as one ``error:`` line.
    Import what the command needs inside ``run``, not at module level.

    :returns: the plugin's commands, or ``None``.
    """


# --- quantization ------------------------------------------------------------


@hookspec(firstresult=True)
def loader_detect_quantization(
    hf_config: Mapping[str, Any], requested: str | None, options: LoadOptions
) -> QuantizationConfig | None:
    """Build the quantization config for a load.

    Stops at the first non-``None`` result. A plugin answers when ``requested``
    names its method (quantize while loading) or when ``requested`` is ``None``
    and ``hf_config["quantization_config"]`` declares its method (a
    pre-quantized checkpoint).

    :param hf_config: the model configuration.
    :param requested: the ``quantization`` argument of ``load_model``, or ``None``.
    :param options: the load options: ``options.quantization_options`` holds the user's
        options for the method (``load_model(quantization_options=...)``), and
        ``options.weight_format``, ``options.weight_files`` and ``options.dtype_auto``
        say what the checkpoint resolved to (the format's name, its files, whether
        the dtype came from ``"auto"``).
    :returns: the plugin's quantization config, or ``None``. Each quantizable
        layer asks it for its method (``QuantizationConfig.get_quant_method(layer,
        prefix)``); the pipeline gives it the model's fused-module table first.
    """


@hookspec
def loader_process_weights_after_loading(
    model: nn.Module, quant_config: QuantizationConfig | None, target_device: torch.device
) -> None:
    """Finish the model after every weight is loaded (repack, permute scales).

    Called for every plugin. The core's own implementation runs each layer's
    ``quant_method.process_weights_after_loading`` with that layer's parameters
    temporarily on ``target_device``; on a CPU load, layers whose method sets
    ``process_weights_concurrently`` run on worker threads (``LOADER_READ_THREADS``
    of them, ended with the step) beside the others. Plugins add model-wide steps.

    :param model: the loaded model.
    :param quant_config: the load's quantization config, or ``None``.
    :param target_device: the device the model is loaded for.
    """
