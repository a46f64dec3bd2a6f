"""loader plugin: Safetensors and PyTorch .bin weight files, read lazily with per-rank byte ranges.

The header parser and dtype table are the core's (:mod:`loader.checkpoint`), shared with every other
reader of the format; they are re-exported here under the names this package always offered.
"""

from loader.checkpoint import SAFETENSORS_DTYPES as DTYPES
from loader.checkpoint import SAFETENSORS_MAX_HEADER_BYTES as MAX_HEADER_BYTES
from loader.checkpoint import SafetensorsDType, SafetensorsHeader
from loader.checkpoint import SafetensorsTensorInfo as TensorInfo
from loader.checkpoint import read_safetensors_file_header as read_header

from .byte_layout import ByteLayout, layout_of
from .checkpoint_file import SafetensorsFile, open_checkpoint_file
from .detection import detect_weight_format
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
