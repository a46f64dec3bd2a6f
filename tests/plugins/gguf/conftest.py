"""Fixtures for the GGUF plugin tests: tiny GGUF files written once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.gguf_files import Q, write_gguf
from tests.helpers.hf_checkpoints import build_model, tiny_config

VOCAB = 288  # the test tokenizers need 3 specials + 256 bytes + a few merges


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Any]]:
    """``tiny_gguf(family, qtype=Q.F32, tokenizer="gpt2", quantized_as=None, **config_overrides) -> (path,
    hf_model)``, cached; ``quantized_as`` stores some tensors as another type (:func:`write_gguf`)."""
    cache: dict[tuple[Any, ...], tuple[Path, Any]] = {}
    folder = tmp_path_factory.mktemp("gguf")

    def make(family: str, qtype: Q = Q.F32, tokenizer: str = "gpt2", *,
             quantized_as: dict[str, Q] | None = None, **overrides: Any) -> tuple[Path, Any]:
        key = (family, qtype, tokenizer, repr(quantized_as), tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in cache:
            model = build_model(family, tiny_config(family, **{"vocab_size": VOCAB, **overrides}))
            sub = folder / f"m{len(cache)}"
            sub.mkdir()
            path = write_gguf(sub / f"{family}-{qtype.name}.gguf", model, family, qtype=qtype, tokenizer=tokenizer,
                              quantized_as=quantized_as)
            cache[key] = (path, model)
        return cache[key]

    return make
