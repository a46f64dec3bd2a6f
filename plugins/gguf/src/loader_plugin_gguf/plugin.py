"""Entry point of loader-plugin-gguf: hook implementations only, imports kept light.

torch, numpy, gguf and tokenizers are imported inside the hooks (through this package's
submodules: the format in :mod:`.format`, the packed-CPU quantize method in :mod:`.packed`),
so ``loader plugins`` lists this plugin without loading any of them.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    from .format.config import hf_config_of_files

    return hf_config_of_files(weight_format.files)


@hookimpl
def loader_load_tokenizer(source: Source, weight_format: WeightFormat) -> TokenizerBundle | None:
    if weight_format.name != FORMAT_NAME:
        return None
    from .format.tokenizer import tokenizer_of_file

    return tokenizer_of_file(weight_format.files[0])


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
    from .packed.config import config_for_load

    # the files' headers let each layer plan its kernel before loading (``loader inspect --layers``)
    return config_for_load(requested, options, options.weight_files if options.weight_format == FORMAT_NAME else ())


@hookimpl(wrapper=True)
def loader_process_weights_after_loading(model: nn.Module, quant_config: QuantizationConfig | None,
                                         target_device: torch.device) -> Generator[None, list[None], list[None]]:
    """Around every layer's post-processing: once it has succeeded, write the packed-weights bundle of a GGUF
    load that packed layers it did not find there (:mod:`~.packed.bundle_keys`); a failed load writes nothing."""
    result = yield
    if quant_config is not None and quant_config.name == "gguf":
        from .packed.config import finish_load

        finish_load(quant_config)
    return result

