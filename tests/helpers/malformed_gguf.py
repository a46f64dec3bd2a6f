"""A tiny valid Llama GGUF and byte-level patches of it, for the reliability corpus.

Written with ``gguf.GGUFWriter`` straight from :func:`tests.helpers.malformed.llama_tensors`
(no ``transformers`` model, no tokenizer), all tensors F32. Values are not
rotary-interleaved, so logits would differ from the safetensors twin; the corpus
only needs a file that loads, to break one field of at a time.
:func:`field_offsets` finds where each header field of a written file lies.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np

from tests.helpers.malformed import TINY_LLAMA, llama_tensors

__all__ = ["GGUF_NAMES", "TensorField", "field_offsets", "metadata_value_offset", "patch", "write_llama_gguf"]

_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
"""HF name -> llama.cpp name for the non-layer tensors (layers follow ``_LAYER``)."""


def _gguf_name(hf: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    _, _, index, rest = hf.split(".", 3)
    return f"blk.{index}.{_LAYER[rest.removesuffix('.weight')]}.weight"


def write_llama_gguf(path: Path, config: Mapping[str, Any] = TINY_LLAMA, *,
                     extra_metadata: Mapping[str, Any] | None = None, seed: int = 0,
                     alignment: int | None = None,
                     typed_metadata: Mapping[str, tuple[Any, gguf.GGUFValueType]] | None = None) -> Path:
    """A loadable single-file Llama GGUF (F32) of ``config``; ``extra_metadata`` adds keys.

    An ``extra_metadata`` value that is a list becomes an int32 array, a str a string.
    ``alignment`` writes ``general.alignment`` (uint32) and lays the data out with it, as
    ``GGUFWriter.add_custom_alignment`` does; ``typed_metadata`` adds keys of any value type
    (``general.alignment`` among them, which then leaves the layout at the default 32).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    for key, (value, vtype) in (typed_metadata or {}).items():
        writer.add_key_value(key, value, vtype)
    for key, value in (extra_metadata or {}).items():
        if isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_string(key, str(value))
    for hf, tensor in llama_tensors(config, seed=seed).items():
        writer.add_tensor(_gguf_name(hf), tensor.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@attrs.frozen
class TensorField:
    """Offsets of one tensor-table entry's fields in the file (``name``: its length field)."""

    name: int
    n_dims: int
    dims: int
    ggml_type: int
    data_offset: int


def _encoded(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def field_offsets(blob: bytes, tensor: str) -> TensorField:
    """Where the tensor-table entry of ``tensor`` lies in ``blob`` (a file from :func:`write_llama_gguf`)."""
    at = blob.index(_encoded(tensor))
    n_dims = at + len(_encoded(tensor))
    (rank,) = struct.unpack_from("<I", blob, n_dims)
    dims = n_dims + 4
    ggml_type = dims + 8 * rank
    return TensorField(at, n_dims, dims, ggml_type, ggml_type + 4)


def metadata_value_offset(blob: bytes, key: str) -> int:
    """Offset of the value type field that follows metadata ``key``'s name."""
    return blob.index(_encoded(key)) + len(_encoded(key))


def patch(path: Path, offset: int, fmt: str, value: int | bytes) -> None:
    """Overwrite the bytes at ``offset`` with ``struct.pack(fmt, value)`` (or raw bytes with fmt ``""``)."""
    blob = bytearray(path.read_bytes())
    raw = value if isinstance(value, bytes) else struct.pack(fmt, value)
    blob[offset:offset + len(raw)] = raw
    path.write_bytes(bytes(blob))
