"""The GGUF format: the header and its tensor table, the model's config and tokenizer from the metadata, and the
dequantized weight stream (each tensor read lazily and dequantized by this package's own kernels).

Everything a GGUF load needs whatever the quantization; keeping blocks packed for the CPU kernels is
:mod:`loader_plugin_gguf.packed`.
"""
