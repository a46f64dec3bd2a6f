"""Llama-shaped bf16 checkpoints the benchmark writes for itself, cached by size.

No model hub is reachable, and a benchmark must not depend on what happens to
be on disk, so each size is generated once: random bf16 weights (std 0.02,
norms 1.0) in several ``safetensors`` shards with ``model.safetensors.index.json``
and a ``config.json`` for ``LlamaForCausalLM``, the layout
``transformers.save_pretrained`` writes. A folder is reused when its
``.complete`` marker holds the same spec, so reruns skip generation.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "LlamaShape",
    "SHARDS",
    "checkpoint_dir",
    "ensure_checkpoint",
    "ensure_shape_checkpoint",
    "ensure_tiny_checkpoint",
    "shape_for_size",
    "shard_files",
    "tensor_specs",
    "warm_page_cache",
]

SHARDS = 4
"""``max_shard_size`` is a quarter of the weights; greedy packing in state-dict order then gives
4-5 files ("several", like a multi-file Hub checkpoint): 5 for the 1 GB and 4 GB sizes."""

_FORMAT_VERSION = 1
"""Bumped when the generator changes, so cached checkpoints are rewritten."""

_VOCAB = 32000
_BF16_BYTES = 2

# (hidden, intermediate, heads, kv heads) per size bucket: the smallest bucket whose
# upper bound (GB) is at least the requested size is used; layers fill up the rest.
_BUCKETS: tuple[tuple[float, tuple[int, int, int, int]], ...] = (
    (0.3, (512, 1408, 8, 2)),
    (2.0, (2048, 5632, 16, 4)),
    (math.inf, (3072, 8192, 24, 8)),
)


@dataclass(frozen=True)
class LlamaShape:
    """Sizes of one generated Llama; ``parameter_bytes`` is the bf16 total."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    layers: int
    vocab: int = _VOCAB

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def parameter_bytes(self) -> int:
        return sum(math.prod(shape) for _, shape in tensor_specs(self)) * _BF16_BYTES

    def config(self) -> dict[str, object]:
        """``config.json`` for ``LlamaForCausalLM`` (read by loader and by transformers)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "torch_dtype": "bfloat16",
        }


def tensor_specs(shape: LlamaShape) -> Iterator[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every tensor, in ``LlamaForCausalLM.state_dict()`` order."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    yield "model.embed_tokens.weight", (shape.vocab, h)
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        yield p + "self_attn.q_proj.weight", (h, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, h)
        yield p + "mlp.gate_proj.weight", (shape.intermediate, h)
        yield p + "mlp.up_proj.weight", (shape.intermediate, h)
        yield p + "mlp.down_proj.weight", (h, shape.intermediate)
        yield p + "input_layernorm.weight", (h,)
        yield p + "post_attention_layernorm.weight", (h,)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (shape.vocab, h)


def shape_for_size(gigabytes: float) -> LlamaShape:
    """The Llama whose bf16 weights come closest to ``gigabytes`` (1e9 bytes) in its bucket's widths.

    1 GB gives hidden 2048 / 8 layers (0.98 GB, the checkpoint of issue 6's table),
    4 GB gives hidden 3072 / 18 layers (4.0 GB).
    """
    if gigabytes <= 0:
        raise ValueError(f"checkpoint size must be positive, found {gigabytes} GB")
    hidden, intermediate, heads, kv_heads = next(dims for bound, dims in _BUCKETS if gigabytes <= bound)
    empty = LlamaShape(hidden, intermediate, heads, kv_heads, layers=0)
    one = LlamaShape(hidden, intermediate, heads, kv_heads, layers=1)
    per_layer = one.parameter_bytes - empty.parameter_bytes
    layers = max(1, round((gigabytes * 1e9 - empty.parameter_bytes) / per_layer))
    return LlamaShape(hidden, intermediate, heads, kv_heads, layers=layers)


def checkpoint_dir(out_dir: Path, gigabytes: float) -> Path:
    """Cache folder for one size, e.g. ``benchmarks/out/llama-1gb``."""
    return out_dir / f"llama-{gigabytes:g}gb"


def shard_files(folder: Path) -> list[Path]:
    """The checkpoint's shard files, in index order."""
    return sorted(folder.glob("model-*.safetensors"))


def _spec(shape: LlamaShape) -> dict[str, object]:
    return {"format_version": _FORMAT_VERSION, "shards": SHARDS, **asdict(shape)}


def _split_into_shards(shape: LlamaShape) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Greedy packing in state-dict order, like ``save_pretrained``'s ``max_shard_size``."""
    limit = math.ceil(shape.parameter_bytes / SHARDS)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for name, dims in tensor_specs(shape):
        nbytes = math.prod(dims) * _BF16_BYTES
        if shards[-1] and used + nbytes > limit:
            shards.append([])
            used = 0
        shards[-1].append((name, dims))
        used += nbytes
    return shards


def _write(folder: Path, shape: LlamaShape) -> None:
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    groups = _split_into_shards(shape)
    weight_map: dict[str, str] = {}
    for number, group in enumerate(groups, start=1):
        file_name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for name, dims in group:
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(dims, dtype=torch.bfloat16)
            else:
                values = torch.empty(dims, dtype=torch.float32).normal_(0.0, 0.02, generator=generator)
                tensors[name] = values.to(torch.bfloat16)
                del values
            weight_map[name] = file_name
        save_file(tensors, str(folder / file_name), metadata={"format": "pt"})
        del tensors
    index = {"metadata": {"total_size": shape.parameter_bytes}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(shape.config(), indent=2) + "\n")


TINY = LlamaShape(hidden=64, intermediate=128, heads=4, kv_heads=2, layers=2, vocab=256)
"""The warm-up checkpoint of ``--warm-process``: same architecture, a few hundred KB."""


def ensure_checkpoint(out_dir: Path, gigabytes: float) -> tuple[Path, LlamaShape, bool]:
    """Return ``(folder, shape, generated)``, writing the checkpoint unless a complete one is cached."""
    return _ensure(checkpoint_dir(out_dir, gigabytes), shape_for_size(gigabytes))


def ensure_shape_checkpoint(out_dir: Path, name: str, shape: LlamaShape) -> tuple[Path, LlamaShape, bool]:
    """:func:`ensure_checkpoint` for a given shape (e.g. a real model's), cached in ``out_dir / name``."""
    return _ensure(out_dir / name, shape)


def ensure_tiny_checkpoint(out_dir: Path) -> Path:
    """The tiny same-architecture checkpoint a warm process loads once before the timed load."""
    return _ensure(out_dir / "llama-tiny", TINY)[0]


def _ensure(folder: Path, shape: LlamaShape) -> tuple[Path, LlamaShape, bool]:
    marker = folder / ".complete"
    spec = json.dumps(_spec(shape), sort_keys=True)
    if marker.is_file() and marker.read_text() == spec:
        return folder, shape, False
    folder.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    for stale in folder.glob("*.safetensors"):
        stale.unlink()
    _write(folder, shape)
    marker.write_text(spec)
    return folder, shape, True


def warm_page_cache(files: list[Path]) -> int:
    """Read every file once so later reads come from the page cache; return the bytes read."""
    total = 0
    buffer = bytearray(64 << 20)
    view = memoryview(buffer)
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            while (n := os.readv(fd, [view])) > 0:
                total += n
        finally:
            os.close(fd)
    return total
