"""loader plugin: Safetensors and PyTorch .bin weight files, read lazily with per-rank byte ranges."""

from .byte_layout import ByteLayout, layout_of
from .checkpoint_file import SafetensorsFile, open_checkpoint_file
from .detection import detect_weight_format
from .dtypes import DTYPES, SafetensorsDType
from .header import MAX_HEADER_BYTES, SafetensorsHeader, TensorInfo, read_header
from .tensor import SafetensorsTensor

__all__ = [
    "DTYPES",
    "MAX_HEADER_BYTES",
    "ByteLayout",
    "SafetensorsDType",
    "SafetensorsFile",
    "SafetensorsHeader",
    "SafetensorsTensor",
    "TensorInfo",
    "detect_weight_format",
    "layout_of",
    "open_checkpoint_file",
    "read_header",
]
