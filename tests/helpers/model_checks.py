"""Checks every model-family test repeats: logits against ``transformers``, cache against full forward.

The tolerances are the project's: float32 within 1e-5 relative error of the
``transformers`` model, bfloat16 within 2e-2 of the same float32 reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.helpers.hf_checkpoints import reference_logits, relative_error, save_checkpoint, tiny_config

FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 2e-2


def random_ids(vocab_size: int, batch: int = 2, seq: int = 12, seed: int = 1) -> torch.Tensor:
    """Reproducible random token ids ``[batch, seq]``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq), generator=generator)


def write_family_checkpoint(family: str, path: Path, **overrides: Any) -> Any:
    """A sharded random checkpoint of ``family`` (with config ``overrides``); returns the HF model."""
    return save_checkpoint(family, path, config=tiny_config(family, **overrides))


def assert_logits_match(
    model: torch.nn.Module, reference_model: Any, *, dtype: torch.dtype = torch.float32, seq: int = 12
) -> float:
    """``model``'s logits on random ids against ``reference_model``'s float32 logits; returns the error."""
    ids = random_ids(reference_model.config.vocab_size, seq=seq)
    expected = reference_logits(reference_model, ids)
    with torch.no_grad():
        actual = model(ids)
    assert actual.dtype == torch.float32
    assert actual.shape == expected.shape
    error = relative_error(actual, expected)
    tolerance = FP32_TOLERANCE if dtype == torch.float32 else BF16_TOLERANCE
    assert error <= tolerance, f"relative error {error:.3g} above {tolerance:g} for {dtype}"
    return error


def assert_cache_matches_full(model: Any, vocab_size: int, *, prompt: int = 5, steps: int = 4) -> None:
    """Logits of a prompt then single-token steps through a KV cache equal one full forward."""
    from loader.layers.attention import KVCache

    ids = random_ids(vocab_size, batch=2, seq=prompt + steps, seed=7)
    with torch.no_grad():
        full = model(ids)
        cache = KVCache(model.config.num_hidden_layers)
        pieces = [model(ids[:, :prompt], cache=cache)]
        for i in range(prompt, prompt + steps):
            assert cache.seq_len == i
            pieces.append(model(ids[:, i : i + 1], cache=cache))
    incremental = torch.cat(pieces, dim=1)
    assert relative_error(incremental, full) <= 1e-6


def load(path: Path, dtype: str = "float32") -> Any:
    """``loader.load_model`` on a local checkpoint folder, on the CPU."""
    import loader

    return loader.load_model(str(path), dtype=dtype)
