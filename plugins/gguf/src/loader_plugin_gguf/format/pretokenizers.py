"""How a byte-level BPE vocabulary splits text before merging, keyed by ``tokenizer.ggml.pre``.

llama.cpp's converter records which pre-tokenizer a model's merges were learned with as a
name (``llama-bpe``, ``qwen2``, ``smollm``, ...); the splitting rules themselves live in
llama.cpp's C++ (``llama-vocab.cpp``). This module restates the rules of the names the
supported families use as ``tokenizers`` pre-tokenizers. An unknown name is refused rather
than guessed, since a wrong split silently changes token ids.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Regex, pre_tokenizers

from loader.errors import UnsupportedError

__all__ = ["IGNORE_MERGES", "KNOWN_PRE_TOKENIZERS", "pre_tokenizer_for"]

_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_SPLITS = {
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3, "smaug-bpe": _LLAMA3, "dbrx": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    "tekken": _TEKKEN,
}
_GPT2_NAMES = ("default", "gpt-2", "gpt2")
_DIGITS_THEN_GPT2 = ("smollm",)
KNOWN_PRE_TOKENIZERS = tuple(sorted((*_SPLITS, *_GPT2_NAMES, *_DIGITS_THEN_GPT2)))

IGNORE_MERGES = frozenset({"llama-bpe", "llama3", "llama-v3", "smaug-bpe"})
"""Vocabularies whose whole-word entries win before merges are tried (llama.cpp and HF's Llama 3)."""


def pre_tokenizer_for(name: str | None, where: str) -> Any:
    """The ``tokenizers`` pre-tokenizer for ``tokenizer.ggml.pre`` (``None``: GPT-2's rules)."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name is None or name in _GPT2_NAMES:
        return byte_level
    if name in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if name in _SPLITS:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[name]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    raise UnsupportedError(
        f"{where}: metadata key 'tokenizer.ggml.pre' is {name!r}; known pre-tokenizers: "
        + ", ".join(KNOWN_PRE_TOKENIZERS)
    )
