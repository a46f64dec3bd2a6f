"""``load_model``: the four steps of vLLM's DefaultModelLoader, then verification.

1. prepare (:mod:`.prepare`): source, format, files, config;
2. iterate: the format plugin's lazy ``(name, CheckpointTensor)`` stream;
3. load: the model's ``load_weights`` routes each tensor to its parameter's
   ``weight_loader``, which narrows to this rank's shard before reading;
4. post-process: quantization plugins finish their layouts.

Then every parameter must have been filled, else the load fails. A failed
load never returns a model: everything built so far is dropped before the
error propagates.
"""

from __future__ import annotations

import gc
import logging
import resource
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch import nn

from .. import _distributed, _hooks
from .._context import ModelContext
from .._heap import release_freed_heap
from .._load_record import LoadRecord, remember_load
from .._mapped_parameters import write_pending
from .._options import LoadOptions, check_model_impl, parse_dtype
from .._page_population import background_population
from .._plugins import PluginHost, current_plugin_host
from .._session import LoadSession, current_session, load_session
from ..errors import ConfigError, LoadError, PluginError, UnsupportedError
from ..weights import CheckpointTensor, ReadStats
from .budget import check_fits
from .by_name import load_by_name
from .factory_dtype import factory_dtype
from .materialize import materialize, parameter_bytes
from .prepare import PreparedCheckpoint, SourceLocation, prepare_checkpoint, source_location
from .progress import checkpoint_size, with_progress
from .verify import check_all_filled, reject_duplicates

if TYPE_CHECKING:
    from .._registry.registry import ModelChoice

__all__ = ["LoadReport", "build_options", "load_model", "load_model_with_report"]

log = logging.getLogger(__name__)


@attrs.frozen
class LoadReport:
    """What a load did and cost; the CLI and the benchmarks print these figures."""

    source: str
    load_format: str
    architecture: str
    files: tuple[str, ...]
    dtype: str
    device: str
    quantization: dict[str, Any] | None
    tp_rank: int
    tp_size: int
    seconds: float
    bytes_read: int
    bytes_mapped: int
    """Of ``bytes_read``, those mapped from the file's page cache rather than copied (CPU loads)."""
    checkpoint_bytes: int
    parameter_bytes: int
    peak_rss_bytes: int
    tensors: int
    model_impl: str = "native"
    """``"native"`` (a plugin's own class) or ``"transformers"`` (the fallback)."""
    fallback_reason: str | None = None
    """Why the fallback built the model (``None`` for a native class)."""

    @property
    def gb_per_second(self) -> float:
        return self.bytes_read / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["gb_per_second"] = round(self.gb_per_second, 3)
        data["seconds"] = round(self.seconds, 4)
        return data


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Hold off Python's cyclic garbage collector for the duration of a load.

    Building a model allocates thousands of objects, which triggers full
    collections that walk everything torch has imported, a large share of a
    load's time. The
    load makes no garbage cycles worth collecting early; they are collected
    afterwards (and at once on failure, see ``_load``).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _peak_rss_bytes() -> int:
    """This process's peak resident set: ``VmHWM`` (``ru_maxrss`` is inherited across fork)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _resolve_dtype(value: Any, hf_config: Mapping[str, Any]) -> torch.dtype:
    """The load's dtype: ``value`` parsed, or for ``"auto"`` the config's ``torch_dtype`` (else bfloat16)."""
    if isinstance(value, str) and value == "auto":
        declared = hf_config.get("torch_dtype", hf_config.get("dtype"))
        return parse_dtype(declared) if isinstance(declared, str) else torch.bfloat16
    return parse_dtype(value)


def _resolve_device(value: str | torch.device) -> torch.device:
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError) as exc:
        raise UnsupportedError(f"device {value!r} is not supported; use 'cpu' or 'cuda[:N]'") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UnsupportedError(f"device {value!r} asked for, but CUDA is not available")
        session = current_session()
        if device.index is None and session.tp_size > 1:
            import os

            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", session.tp_rank)))
    elif device.type == "meta":
        # a model on 'meta' has shapes but no storage: nothing could be read into it, so nothing was loaded
        raise UnsupportedError(f"device {str(value)!r} holds no data, so no weights can be loaded there; "
                               "use 'cpu' or 'cuda[:N]'")
    elif device.type != "cpu":
        raise UnsupportedError(f"device {value!r} is not supported; use 'cpu' or 'cuda[:N]'")
    return device


def build_options(
    *, dtype: Any = None, device: str | torch.device = "cpu", load_format: str = "auto",
    quantization: str | None = None, revision: str | None = None,
    quantization_options: Mapping[str, Any] | None = None, format_options: Mapping[str, Any] | None = None,
    model_impl: str = "auto", enable_expert_parallel: bool = False, trust_remote_code: bool = False,
) -> LoadOptions:
    """Validate user arguments into :class:`LoadOptions` (dtype ``"auto"`` and ``None`` are resolved later)."""
    model_impl = check_model_impl(model_impl)
    if not isinstance(load_format, str) or not load_format:
        raise UnsupportedError(f"load_format must be a format name or 'auto', found {load_format!r}")
    try:
        requested_device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UnsupportedError(f"device {device!r} is not supported; use 'cpu' or 'cuda[:N]'") from exc
    _distributed.init_distributed(requested_device)
    resolved_device = _resolve_device(requested_device)
    parsed = torch.bfloat16 if dtype is None or (isinstance(dtype, str) and dtype == "auto") else parse_dtype(dtype)
    return LoadOptions(
        dtype=parsed, device=resolved_device, load_format=load_format, quantization=quantization,
        revision=revision, model_impl=model_impl, quantization_options=quantization_options,
        format_options=format_options, dtype_auto=isinstance(dtype, str) and dtype == "auto",
        enable_expert_parallel=_flag("enable_expert_parallel", enable_expert_parallel),
        trust_remote_code=_flag("trust_remote_code", trust_remote_code),
    )


def _flag(name: str, value: Any) -> bool:
    """A boolean argument of :func:`load_model`; anything else (``"yes"``, ``1``) is refused by name."""
    if isinstance(value, bool):
        return value
    raise UnsupportedError(f"{name} must be True or False, found {value!r}")


def _counting(
    stream: Iterable[tuple[str, CheckpointTensor]], totals: list[int]
) -> Iterator[tuple[str, CheckpointTensor]]:
    for name, tensor in stream:
        totals[0] += tensor.nbytes
        totals[1] += 1
        yield name, tensor


def _build(prepared: PreparedCheckpoint, options: LoadOptions, dtype: torch.dtype,
           host: PluginHost | None) -> tuple[ModelChoice, nn.Module, Any]:
    from .._registry import get_registry

    registry = get_registry(host)
    choice = registry.choose(prepared.architectures, options.model_impl, origin=prepared.config_origin(),
                             host=host or current_plugin_host())
    arch, cls = choice.architecture, registry.load_class(choice.entry.architecture)
    if choice.fallback_reason is not None:
        log.warning("%s: loading %s through the %s fallback (%s); some features may be missing and it may be "
                    "slower than a native class", prepared.source.display(), arch, choice.entry.architecture,
                    choice.fallback_reason)
    quant_config = _hooks.detect_quantization(prepared.hf_config, options.quantization, options, host)
    if quant_config is not None:  # before any layer asks it, so its skip list sees fused names too
        from .._registry.capabilities import ModelInfoError, inspect_model_class

        try:
            quant_config.set_packed_modules(inspect_model_class(arch, cls).packed_modules())
        except ModelInfoError as exc:
            raise PluginError(f"model class for {arch}: {exc}") from exc
    ctx = ModelContext(hf_config=prepared.hf_config, dtype=dtype, quant_config=quant_config,
                       trust_remote_code=options.trust_remote_code, source_dir=prepared.source.directory)
    try:
        with factory_dtype(dtype), torch.device("meta"):
            model = cls(ctx)
    except LoadError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{prepared.source.display()}: {arch} cannot be built from this config: {exc}") from exc
    except Exception as exc:
        raise PluginError(f"model class for {arch} failed while being built: {type(exc).__name__}: {exc}") from exc
    return choice, model, quant_config


def _blamed_stream(stream: Iterable[tuple[str, CheckpointTensor]], failed_in: str
                   ) -> Iterator[tuple[str, CheckpointTensor]]:
    """Pass a stream a plugin transformed through; its bugs become a :class:`PluginError` saying ``failed_in``.

    Used for a quantization's ``wrap_weights`` and a format's renaming step, which run as the pipeline
    iterates, after the plugin's own hook returned (so the hook guard no longer covers them).
    """
    try:
        yield from stream
    except LoadError:
        raise
    except Exception as exc:
        raise PluginError(f"{failed_in}: {type(exc).__name__}: {exc}") from exc


def _load_weights(model: nn.Module, stream: Iterator[tuple[str, CheckpointTensor]], arch: str) -> set[str]:
    """``model.load_weights(stream)``; a bug in the model plugin becomes a :class:`PluginError` naming it."""
    try:
        with torch.no_grad(), background_population():
            return model.load_weights(stream)  # type: ignore[operator, no-any-return]
    except LoadError:
        raise
    except Exception as exc:
        raise PluginError(f"model class for {arch} failed in load_weights: {type(exc).__name__}: {exc}") from exc


def load_model_with_report(
    source: SourceLocation, *, dtype: Any = None, device: str | torch.device = "cpu", load_format: str = "auto",
    quantization: str | None = None, revision: str | None = None,
    quantization_options: Mapping[str, Any] | None = None, format_options: Mapping[str, Any] | None = None,
    progress: bool = False, host: PluginHost | None = None, model_impl: str = "auto",
    enable_expert_parallel: bool = False, trust_remote_code: bool = False,
) -> tuple[nn.Module, LoadReport]:
    """Load ``source`` and return the model with a :class:`LoadReport`."""
    start = time.perf_counter()
    source = source_location(source)
    options = build_options(dtype=dtype, device=device, load_format=load_format, quantization=quantization,
                            revision=revision, quantization_options=quantization_options,
                            format_options=format_options, model_impl=model_impl,
                            enable_expert_parallel=enable_expert_parallel, trust_remote_code=trust_remote_code)
    outer = current_session()  # a simulated rank (save-sharded, tests) carries over
    session = LoadSession(host=host if host is not None else outer.host, tp_rank=outer.tp_rank,
                          tp_size=outer.tp_size, dtype=options.dtype, device=options.device,
                          enable_expert_parallel=options.enable_expert_parallel)
    with _collector_paused(), load_session(session):
        return _load(source, options, dtype, progress, start, session.host)


def resolve_options(prepared: PreparedCheckpoint, options: LoadOptions, dtype_arg: Any) -> LoadOptions:
    """``options`` with the dtype resolved against the checkpoint, and what quantization detection needs to know.

    No dtype asked for means the format's default (``"bfloat16"``; GGUF says ``"auto"``, see
    :class:`~loader.checkpoint.WeightFormat`). ``dtype_auto``, ``weight_format`` and ``weight_files`` are
    filled in, which a plugin's ``loader_detect_quantization`` reads (GGUF keeps blocks packed for
    ``auto``, and plans each layer's kernel from the files' headers). A load and ``loader inspect --layers``
    both resolve through here, so a plan shows what the load will do.
    """
    requested = prepared.weight_format.default_dtype if dtype_arg is None else dtype_arg
    dtype = _resolve_dtype(requested, prepared.hf_config)
    return attrs.evolve(options, dtype=dtype, dtype_auto=isinstance(requested, str) and requested == "auto",
                        weight_format=prepared.weight_format.name, weight_files=prepared.weight_format.files)


def _load(source: str, options: LoadOptions, dtype_arg: Any, progress: bool, start: float,
          host: PluginHost | None) -> tuple[nn.Module, LoadReport]:
    try:
        prepared = prepare_checkpoint(source, options, host)
        options = resolve_options(prepared, options, dtype_arg)
        with load_session(attrs.evolve(current_session(), dtype=options.dtype)):
            return _build_and_fill(prepared, options, progress, start, host)
    except BaseException as exc:
        # Never hand out, or keep alive, a half-loaded model: drop the locals of the
        # finished frames the traceback holds (load_weights' ``self``, ...).
        traceback.clear_frames(exc.__traceback__)
        gc.collect()
        raise


def _build_and_fill(prepared: PreparedCheckpoint, options: LoadOptions, progress: bool, start: float,
                    host: PluginHost | None) -> tuple[nn.Module, LoadReport]:
    """Steps 2-4 and verification, inside the session that carries the resolved dtype."""
    dtype = options.dtype
    choice, model, quant_config = _build(prepared, options, dtype, host)
    arch = choice.architecture
    check_fits(parameter_bytes(model), options.device, f"{prepared.source.display()} ({arch})")
    materialize(model, options.device)
    stats = ReadStats()
    totals = [0, 0]
    weight_format = prepared.weight_format
    stream = _hooks.iter_weights(prepared.source, weight_format, options, stats, host, model)
    if weight_format.renaming is not None:
        stream = _blamed_stream(weight_format.renaming(stream, prepared.hf_config),
                                f"renaming of format {weight_format.name!r} failed")
    stream = reject_duplicates(stream)  # after renaming: two names for one tensor are one name twice
    if quant_config is not None and not weight_format.parameter_names:
        stream = _blamed_stream(quant_config.wrap_weights(stream),
                                f"quantization {quant_config.name!r} failed in wrap_weights")
    total = checkpoint_size(weight_format.files) if progress else None  # a stat per file, for the bar only
    stream = with_progress(_counting(stream, totals), progress, total)
    if weight_format.parameter_names:
        with torch.no_grad(), background_population():
            loaded = load_by_name(model, stream)
    else:
        loaded = _load_weights(model, stream, arch)
    write_pending(model)  # parts a fused parameter's largest part was to place, if it never did
    check_all_filled(model, loaded, prepared.source.display())
    remember_load(model, LoadRecord(prepared.source.location, options, host, quant_config, current_session().tp_rank,
                                    current_session().tp_size, prepared.hf_config))
    if not weight_format.post_processed:
        with torch.no_grad():
            _hooks.process_weights_after_loading(model, quant_config, options.device, host)
    release_freed_heap()  # what loading and post-processing freed, not kept as RSS
    model.eval()
    model.requires_grad_(False)
    report = LoadReport(
        source=prepared.source.display(), load_format=prepared.weight_format.name, architecture=arch,
        files=prepared.weight_format.files, dtype=str(dtype).removeprefix("torch."),
        device=str(options.device), quantization=quant_config.describe() if quant_config else None,
        tp_rank=current_session().tp_rank, tp_size=current_session().tp_size,
        seconds=time.perf_counter() - start,
        bytes_read=stats.bytes_read, bytes_mapped=stats.bytes_mapped, checkpoint_bytes=totals[0],
        parameter_bytes=parameter_bytes(model),
        peak_rss_bytes=_peak_rss_bytes(), tensors=totals[1], model_impl=choice.model_impl,
        fallback_reason=choice.fallback_reason,
    )
    return model, report


def load_model(
    source: SourceLocation, dtype: Any = None, device: str | torch.device = "cpu", load_format: str = "auto",
    quantization: str | None = None, *, revision: str | None = None,
    quantization_options: Mapping[str, Any] | None = None, format_options: Mapping[str, Any] | None = None,
    progress: bool = False, host: PluginHost | None = None, model_impl: str = "auto",
    enable_expert_parallel: bool = False, trust_remote_code: bool = False,
) -> nn.Module:
    """Load a checkpoint into a ready ``torch.nn.Module``.

    :param source: a local folder or file (a string or a path object), a Hub id (``org/name``), a URI a
        plugin handles (``s3://...``), or a ``.gguf`` file.
    :param dtype: ``"bfloat16"``, ``"float16"``, ``"float32"``, or ``"auto"``
        for the checkpoint's declared dtype. ``None`` (default) is the weight
        format's default: ``"bfloat16"``, except GGUF, whose default is
        ``"auto"`` (float32 activations, blocks kept packed where a kernel exists).
    :param device: ``"cpu"`` or ``"cuda[:N]"``; under ``torchrun`` each rank
        gets its own shard (and its own GPU).
    :param load_format: ``"auto"``, ``"dummy"`` (random weights, for benchmarks)
        or a format plugin's name (``"safetensors"``, ``"pt"``, ``"gguf"``, ...).
    :param quantization: a quantization plugin's method to quantize while
        loading (``"bitsandbytes"``), or ``None`` to use what the checkpoint declares.
    :param format_options: options for the format plugin that reads the
        weights (the Run:ai streamer's ``concurrency``, ``memory_limit``, ``chunk_bytesize``).
    :param model_impl: ``"auto"`` (a plugin's native class, else the installed
        fallback), ``"native"`` or ``"transformers"`` (force the fallback), as vLLM's ``--model-impl``.
    :param enable_expert_parallel: under tensor parallelism, place whole experts of a mixture-of-experts
        model on ranks (expert parallel size = tensor parallel size; attention stays split by heads)
        instead of splitting every expert's intermediate dimension, as vLLM's ``--enable-expert-parallel``.
    :param trust_remote_code: allow a checkpoint that ships its own modeling code (``auto_map``) to run it,
        as in vLLM and ``transformers``; without it such a checkpoint is refused and none of its files runs.
    :returns: the model in eval mode; ``model(input_ids)`` gives logits.
    :raises loader.LoadError: for any problem with the input; nothing half-loaded is returned.
    """
    model, _ = load_model_with_report(
        source, dtype=dtype, device=device, load_format=load_format, quantization=quantization,
        revision=revision, quantization_options=quantization_options, format_options=format_options,
        progress=progress, host=host, model_impl=model_impl,
        enable_expert_parallel=enable_expert_parallel, trust_remote_code=trust_remote_code,
    )
    return model
