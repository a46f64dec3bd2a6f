"""Greedy decoding with a KV cache, so generating N tokens costs N small forwards.

This is a checking tool (does the loaded model say sensible things?), not a
serving engine: one sequence, greedy, stops at an end-of-sequence token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import attrs

from . import _hooks
from ._chat_template import render_chat
from ._options import LoadOptions
from ._pipeline.prepare import SourceLocation, prepare_checkpoint
from .errors import LoadError, UnsupportedError
from .layers.attention import Attention, KVCache

if TYPE_CHECKING:
    from torch import nn

    from .checkpoint import TokenizerBundle

__all__ = ["GenerationResult", "encode_prompt", "generate_greedy", "greedy_tokens", "tokenizer_for"]


@attrs.frozen
class GenerationResult:
    """The prompt's token ids, the generated ids, their text and how long each phase took.

    ``seconds`` is the whole generation; ``prefill_seconds`` of it is the forward over the prompt that
    chose the first token, the rest (``decode_seconds``) produced the other tokens one forward each. The
    two rates differ by a lot (a prompt of 30 tokens is one wide forward, decoding is many narrow ones),
    so the decode rate is what compares with other engines' "eval" tokens/s.
    """

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    text: str
    seconds: float
    prefill_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens over the whole generation, prefill included."""
        return len(self.output_ids) / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_seconds(self) -> float:
        """Time spent on the tokens after the first."""
        return max(self.seconds - self.prefill_seconds, 0.0)

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Tokens after the first per second of decoding; ``None`` when no token came after the first."""
        decoded = len(self.output_ids) - 1
        if decoded <= 0 or self.decode_seconds <= 0:
            return None
        return decoded / self.decode_seconds


def tokenizer_for(location: SourceLocation, *, load_format: str = "auto",
                  revision: str | None = None) -> TokenizerBundle:
    """The tokenizer of the checkpoint at ``location`` (``tokenizer.json``, or what the format provides)."""
    import torch

    options = LoadOptions(dtype=torch.float32, device=torch.device("cpu"), load_format=load_format,
                          revision=revision)
    prepared = prepare_checkpoint(location, options)
    return _hooks.load_tokenizer(prepared.source, prepared.weight_format)


def encode_prompt(bundle: TokenizerBundle, prompt: str, *, chat: bool, system: str | None = None) -> list[int]:
    """Token ids for ``prompt``, through the chat template when ``chat``."""

    if chat:
        if not bundle.chat_template:
            raise LoadError("--chat asked for, but the checkpoint has no chat template")

        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        text = render_chat(bundle.chat_template, messages, bos_token=bundle.bos_token,
                           eos_token=bundle.eos_token)
        ids = bundle.tokenizer.encode(text, add_special_tokens=False).ids
    else:
        ids = bundle.tokenizer.encode(prompt, add_special_tokens=True).ids
    if bundle.add_bos_token and bundle.bos_token:
        bos_id = bundle.tokenizer.token_to_id(bundle.bos_token)
        if bos_id is not None and (not ids or ids[0] != bos_id):
            ids = [bos_id, *ids]
    return list(ids)


def greedy_tokens(model: nn.Module, prompt_ids: Sequence[int], max_new_tokens: int,
                  stop_ids: Sequence[int] = ()) -> Iterator[int]:
    """Yield greedily chosen token ids one at a time, reusing the KV cache."""
    import torch

    if not prompt_ids:
        raise ValueError("the prompt encodes to no tokens")
    device = next(model.parameters()).device
    cache = KVCache(sum(1 for m in model.modules() if isinstance(m, Attention)))
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            logits = model(ids, cache=cache)
            next_id = int(logits[0, -1].argmax())
            yield next_id
            if next_id in stop_ids:
                return
            ids = torch.tensor([[next_id]], dtype=torch.long, device=device)


def generate_greedy(model: nn.Module, bundle: TokenizerBundle, prompt: str, *, max_new_tokens: int = 32,
                    chat: bool = False, system: str | None = None) -> GenerationResult:
    """Encode, decode greedily until EOS or ``max_new_tokens``, and detokenize."""
    import itertools
    import time

    prompt_ids = encode_prompt(bundle, prompt, chat=chat, system=system)
    if not prompt_ids:
        raise UnsupportedError(f"--prompt {prompt!r} encodes to no tokens (and the tokenizer adds no BOS token); "
                        "give a prompt with some text")
    start = time.perf_counter()
    steps = greedy_tokens(model, prompt_ids, max_new_tokens, bundle.eos_token_ids)
    out = list(itertools.islice(steps, 1))  # the prompt's forward, which chooses the first token
    prefill_seconds = time.perf_counter() - start
    out.extend(steps)
    seconds = time.perf_counter() - start
    shown = [t for t in out if t not in bundle.eos_token_ids]
    text = bundle.tokenizer.decode(shown, skip_special_tokens=True)
    return GenerationResult(tuple(prompt_ids), tuple(out), text, seconds, prefill_seconds)
