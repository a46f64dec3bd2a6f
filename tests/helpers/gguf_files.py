"""Tiny GGUF files written with gguf-py, the way llama.cpp's converter writes real ones.

``write_gguf`` converts a tiny random ``transformers`` model (from :mod:`tests.helpers.hf_checkpoints`)
to GGUF: names through gguf-py's ``TensorNameMap`` (HF -> GGUF, the converter's direction),
Llama-family q/k rows interleaved for llama.cpp's rotary kernel, 2-D weights quantized with
``gguf.quants.quantize``, 1-D tensors kept in F32, Llama 3 scaling stored as a ``rope_freqs``
tensor, the model's metadata and a small tokenizer (byte-level BPE or SentencePiece).

``raw_header`` builds header bytes by hand for malformed-file tests; ``random_blocks`` makes
random but valid quantized blocks for the types gguf-py cannot quantize (K-quants).
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
QUANTIZABLE = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)
"""Every type gguf-py can produce in numpy (and our loader reads)."""
K_QUANTS = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
_SCALE_OFFSETS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
_GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BPE_MERGES = ("Ġ t", "h e", "Ġt he", "i n", "e r", "Ġ a", "o n", "Ġ w", "Ġa n", "Ġan d", "r e", "a t")
SPM_PIECES = ("▁", "▁t", "he", "▁the", "in", "er", "▁a", "on", "▁w", "▁an", "▁and", "re", "at", "▁is",
              "t", "h", "e", "a", "n", "d", "i", "s", "o", "w", "r")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def random_blocks(qtype: GGMLQuantizationType, n_blocks: int, seed: int = 0, scale: float = 0.01) -> np.ndarray:
    """``uint8 [n_blocks, type_size]``: random bytes with finite, small float16 scales."""
    rng = np.random.default_rng(seed)
    _, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for at in _SCALE_OFFSETS.get(qtype, ()):
        scale_values = (rng.standard_normal((n_blocks, 1)) * scale).astype(np.float16)
        blocks[:, at:at + 2] = scale_values.view(np.uint8)
    return blocks


def encode(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """``values`` in ``qtype``'s storage: float arrays for F32/F16, raw block bytes otherwise.

    gguf-py cannot quantize K-quants; for those the values are ignored and replaced by random
    valid blocks of the same shape (seeded by the shape), which both loaders must decode alike.
    """
    if qtype in K_QUANTS:
        block, _ = GGML_QUANT_SIZES[qtype]
        rows, cols = values.shape
        return random_blocks(qtype, rows * cols // block, seed=rows * 7919 + cols, scale=0.002).reshape(rows, -1)
    if qtype == Q.F32:
        return values.astype(np.float32)
    if qtype == Q.F16:
        return values.astype(np.float16)
    return gguf.quants.quantize(values.astype(np.float32), qtype)


def add_weight(writer: gguf.GGUFWriter, name: str, values: np.ndarray, qtype: GGMLQuantizationType) -> None:
    """One tensor stored as llama.cpp stores it: 1-D (norms, biases) as F32, 2-D as ``qtype``."""
    if values.ndim == 1:
        writer.add_tensor(name, values.astype(np.float32))
    elif qtype in (Q.F32, Q.F16):
        writer.add_tensor(name, encode(values, qtype))
    else:
        writer.add_tensor(name, encode(values, qtype), raw_dtype=qtype)


def finish(writer: gguf.GGUFWriter, extra_tensors: dict[str, np.ndarray] | None) -> None:
    """Add ``extra_tensors`` (F32) and write header, metadata and tensors."""
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def interleave_rotary(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's q/k permutation: each head's rotary halves interleaved pairwise."""
    rows = weight.shape[0]
    half = rows // n_heads // 2
    return (weight.reshape(n_heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape))


def byte_glyphs() -> list[str]:
    """GPT-2's 256 byte glyphs in byte order (the tokenizer tests check them against transformers)."""
    from loader_plugin_gguf.format.tokenizer import byte_alphabet

    table = byte_alphabet()
    return [table[b] for b in range(256)]


def bpe_vocab(size: int) -> tuple[list[str], list[int], list[str]]:
    """A byte-level vocabulary of exactly ``size`` tokens: specials, 256 bytes, merges, padding."""
    tokens = [*SPECIALS, *byte_glyphs(), *(m.replace(" ", "") for m in BPE_MERGES)]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    if len(tokens) > size:
        raise ValueError(f"vocab_size {size} is too small for the test vocabulary ({len(tokens)})")
    for i in range(len(tokens), size):
        tokens.append(f"[PAD{i}]")
        types.append(5)
    return tokens, types, list(BPE_MERGES)


def spm_vocab(size: int) -> tuple[list[str], list[int], list[float]]:
    """A SentencePiece vocabulary: <unk>/<s>/</s>, 256 byte tokens, scored pieces, padding."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *SPM_PIECES]
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(SPM_PIECES))]
    if len(tokens) > size:
        raise ValueError(f"vocab_size {size} is too small for the test vocabulary ({len(tokens)})")
    for i in range(len(tokens), size):
        tokens.append(f"<unused{i}>")
        types.append(5)
        scores.append(-1e9)
    return tokens, types, scores


def _llama3_divisors(config: Any, head_dim: int) -> np.ndarray | None:
    scaling = getattr(config, "rope_scaling", None) or {}
    if scaling.get("rope_type") != "llama3":
        return None
    factor, lf, hf = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    theta = _rope_theta(config)
    divisors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old / hf:
            divisors.append(1.0)
        elif wavelen > old / lf:
            divisors.append(factor)
        else:
            smooth = (old / wavelen - lf) / (hf - lf)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def write_gguf(path: Path, model: Any, family: str, *, qtype: GGMLQuantizationType = Q.F32,
               tokenizer: str = "gpt2", pre: str | None = "default",
               metadata: dict[str, Any] | None = None, skip_tensors: tuple[str, ...] = (),
               split_max_tensors: int = 0, tensor_types: dict[str, GGMLQuantizationType] | None = None,
               extra_tensors: dict[str, np.ndarray] | None = None,
               quantized_as: dict[str, GGMLQuantizationType] | None = None) -> Path:
    """Convert a tiny HF ``model`` of ``family`` to a GGUF file at ``path``; return ``path``.

    With ``split_max_tensors``, gguf-py writes a split set ``<stem>-0000i-of-0000n.gguf`` beside
    ``path`` instead (as llama.cpp's ``gguf-split`` does); the first part is returned.
    ``tensor_types`` stores the named GGUF tensors as random blocks of another type (for refusal
    tests); ``quantized_as`` quantizes the named GGUF tensors' own values to another type than ``qtype``
    (a file mixing types, as llama.cpp's ``_M`` mixes write); ``extra_tensors`` adds F32 tensors the model
    does not have.
    """
    config = model.config
    arch = _GGUF_ARCH[family]
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(head_dim)
    if family == "qwen3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if family != "qwen2":  # llama.cpp's Qwen2 files carry no vocab_size
        writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(int(qtype) if qtype != Q.F32 else 0)
    if tokenizer == "gpt2":
        tokens, types, merges = bpe_vocab(config.vocab_size)
        writer.add_tokenizer_model("gpt2")
        if pre is not None:
            writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(False)
    elif tokenizer == "llama":
        tokens, types, scores = spm_vocab(config.vocab_size)
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_scores(scores)
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    divisors = _llama3_divisors(config, head_dim)
    if divisors is not None and family in ("llama", "mistral"):
        writer.add_tensor("rope_freqs.weight", divisors)
    for hf_name, tensor in model.state_dict().items():
        module, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(module)
        if gguf_name is None:
            raise KeyError(f"gguf-py has no GGUF name for {hf_name}")
        name = f"{gguf_name}.{suffix}"
        if name in skip_tensors or (hf_name == "lm_head.weight" and config.tie_word_embeddings):
            continue
        values = tensor.detach().float().numpy()
        if arch == "llama" and module.endswith("q_proj"):
            values = interleave_rotary(values, heads)
        elif arch == "llama" and module.endswith("k_proj"):
            values = interleave_rotary(values, kv_heads)
        if name in (tensor_types or {}):
            other = (tensor_types or {})[name]
            block, _ = GGML_QUANT_SIZES[other]
            writer.add_tensor(name, random_blocks(other, values.size // block).reshape(values.shape[0], -1),
                              raw_dtype=other)
        else:
            add_weight(writer, name, values, (quantized_as or {}).get(name, qtype))
    finish(writer, extra_tensors)
    parts = sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))
    return parts[0] if split_max_tensors and parts else path


def raw_header(*, magic: bytes = b"GGUF", version: int = 3, tensor_count: int = 0, kv_count: int | None = None,
               kv: bytes = b"", tensors: bytes = b"") -> bytes:
    """Header bytes with the given counts and pre-encoded sections (for malformed-file tests)."""
    count = kv_count if kv_count is not None else 0
    return magic + struct.pack("<IQQ", version, tensor_count, count) + kv + tensors


def gguf_string(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw
