"""Entry point of loader-plugin-gguf: hook implementations only, imports kept light.

torch, numpy, gguf and tokenizers are imported inside the hooks (through this package's
submodules: the format in :mod:`.format`, the packed-CPU quantize method in :mod:`.packed`),
so ``loader plugins`` lists this plugin without loading any of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loader.hookspecs import hookimpl

if TYPE_CHECKING:
    from collections.abc import Generator

    import torch
    from torch import nn

    from loader.checkpoint import LoadOptions, Source, TokenizerBundle, WeightFormat
    from loader.layers import QuantizationConfig
    from loader.weights import ReadStats, WeightStream

FORMAT_NAME = "gguf"


@hookimpl(trylast=True)
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    """A ``.gguf`` file, a folder holding one GGUF model, or a split set; ``trylast`` so that a
    folder with both safetensors and GGUF files loads the safetensors, as HF repos intend."""
    if requested not in ("auto", FORMAT_NAME):
        return None
    from .format.detect import detect_gguf

    return detect_gguf(source, requested)


@hookimpl
def loader_read_config(source: Source, weight_format: WeightFormat) -> Mapping[str, Any] | None:
    if weight_format.name != FORMAT_NAME:
        return None
    from .format.config import hf_config
    from .format.header import read_header

    headers = [read_header(Path(file)) for file in weight_format.files]  # cached: the load reads them again
    return hf_config(headers[0], frozenset().union(*(header.tensor_names() for header in headers)))


@hookimpl
def loader_load_tokenizer(source: Source, weight_format: WeightFormat) -> TokenizerBundle | None:
    if weight_format.name != FORMAT_NAME:
        return None
    from .format.header import read_header
    from .format.tokenizer import build_tokenizer

    return build_tokenizer(read_header(Path(weight_format.files[0])))


@hookimpl
def loader_iter_weights(source: Source, weight_format: WeightFormat, options: LoadOptions,
                        stats: ReadStats) -> WeightStream | None:
    if weight_format.name != FORMAT_NAME:
        return None
    from .format.weight_stream import iter_gguf_weights

    return iter_gguf_weights(weight_format.files, stats)


@hookimpl
def loader_detect_quantization(hf_config: Mapping[str, Any], requested: str | None,
                               options: LoadOptions) -> QuantizationConfig | None:
    """Keep a GGUF file's 4-bit blocks packed for torch's CPU int4 kernel, when the load asks for it.

    ``quantization="gguf"`` always does; with no quantization named, a GGUF load does when its dtype is
    ``auto`` (the default) or a dtype the kernel computes in, unless ``format_options`` has
    ``dequantize`` (see :func:`~.packed.options.packing_requested`); ``format_options`` ``kernel_dtype``
    chooses the dtype the kernel computes in, ``packed_cache`` whether packed layers are kept on disk for
    the next load (:mod:`~.packed.bundle_keys`; default on, ``LOADER_GGUF_PACKED_CACHE=0`` turns it off). The
    load's GGUF files (``weight_files``) go with it, so ``loader inspect --layers`` plans every layer from
    their headers.
    """
    if requested not in ("gguf", None) or (requested is None and options.weight_format != FORMAT_NAME):
        return None
    from .packed.bundle_keys import cache_requested
    from .packed.config import GGUFQuantConfig
    from .packed.options import kernel_dtype_for, kernel_dtype_requested, packing_requested

    kernel_dtype = kernel_dtype_requested(options) or kernel_dtype_for(options.dtype)
    use_cache = cache_requested(options)
    # the files' headers let each layer plan its kernel before loading (``loader inspect --layers``)
    files = options.weight_files if options.weight_format == FORMAT_NAME else ()
    if requested == "gguf" or packing_requested(options):
        # dtype auto: what cannot stay packed is dequantized to the kernel's dtype, not float32
        dense_dtype = kernel_dtype if options.dtype_auto else None
        return GGUFQuantConfig(kernel_dtype=kernel_dtype, dense_dtype=dense_dtype, files=files,
                               head_type=_output_head_type(files), use_packed_cache=use_cache)
    return None


@hookimpl(wrapper=True)
def loader_process_weights_after_loading(model: nn.Module, quant_config: QuantizationConfig | None,
                                         target_device: torch.device) -> Generator[None, list[None], list[None]]:
    """Around every layer's post-processing: once it has succeeded, write the packed-weights bundle of a GGUF
    load that packed layers it did not find there (:mod:`~.packed.bundle_keys`); a failed load writes nothing."""
    result = yield
    if quant_config is not None and quant_config.name == "gguf":
        from .packed.config import GGUFQuantConfig

        if isinstance(quant_config, GGUFQuantConfig):
            quant_config.finish_packed_cache()
    return result


def _output_head_type(files: tuple[str, ...]) -> int | None:
    """The ggml type of ``output.weight`` in any of the load's files (headers are cached), ``None`` if absent."""
    from .format.header import read_header

    for file in files:
        for info in read_header(Path(file)).tensors:
            if info.name == "output.weight":
                return int(info.ggml_type)
    return None
