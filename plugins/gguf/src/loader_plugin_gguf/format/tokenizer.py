"""A ``tokenizers.Tokenizer`` built from GGUF metadata, so a ``.gguf`` needs no other file.

Two vocabulary kinds, by ``tokenizer.ggml.model``:

* ``gpt2``: byte-level BPE from ``tokens`` and ``merges``, split first by the rules named in
  ``tokenizer.ggml.pre`` (see :mod:`.pretokenizers`);
* ``llama``: SentencePiece BPE with byte fallback (``<0x0A>`` tokens). Merges come from the
  file when present, else from ``scores`` (a merge ranks by its result's score, the order
  SentencePiece applies them in); a space is prepended to each text segment, as llama.cpp
  does, unless ``add_space_prefix`` is false.

Tokens typed CONTROL become special added tokens and USER_DEFINED ones plain added tokens,
so both are matched whole in text. BOS/EOS are added by the post-processor when
``add_bos_token``/``add_eos_token`` say so (SentencePiece vocabularies default to BOS on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from loader.checkpoint import TokenizerBundle
from loader.errors import UnsupportedError

from .header import GGUFHeader, GGUFStrings, read_header
from .pretokenizers import IGNORE_MERGES, pre_tokenizer_for

__all__ = ["build_tokenizer", "byte_alphabet", "merges_from_scores", "tokenizer_of_file"]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPIECE_SPACE = "\u2581"


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (bytes that print keep their glyph)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def merges_from_scores(vocab: Mapping[str, int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece merges implied by a scored vocabulary: every split of a token into two tokens,
    best-scored result first (ties: longer left piece, then longer right, then vocabulary order)."""
    by_id = {i: t for t, i in vocab.items()}
    found: list[tuple[float, int, int, int, str, str]] = []
    for token_id in range(len(scores)):
        token = by_id.get(token_id)
        if token is None or len(token) < 2:
            continue
        local = []
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                local.append((vocab[left], vocab[right], left, right))
        for _, _, left, right in sorted(local):
            found.append((-float(scores[token_id]), -len(left), -len(right), len(found), left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def _ids(meta: Mapping[str, Any], key: str, tokens: Sequence[str]) -> int | None:
    value = meta.get(f"tokenizer.ggml.{key}")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(tokens):
        return value
    return None


def _list(meta: Mapping[str, Any], key: str) -> list[Any] | None:
    value = meta.get(key)
    return None if value is None else list(value)


def _byte_level(meta: Mapping[str, Any], tokens: list[str], types: list[int], where: str) -> Tokenizer:
    alphabet = byte_alphabet()
    glyphs = set(alphabet.values())
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if types[i] == NORMAL and not set(token) <= glyphs:  # respell into the byte alphabet
            token = "".join(alphabet[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, i)
    merges = [tuple(m.split(" ", 1)) for m in _list(meta, "tokenizer.ggml.merges") or []]
    pre = meta.get("tokenizer.ggml.pre")
    model = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in IGNORE_MERGES)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizer_for(pre if isinstance(pre, str) else None, where)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(meta: Mapping[str, Any], tokens: list[str], types: list[int]) -> Tokenizer:
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    file_merges = _list(meta, "tokenizer.ggml.merges")
    if file_merges:
        merges = [tuple(m.split(" ", 1)) for m in file_merges]
    else:
        scores = _list(meta, "tokenizer.ggml.scores") or [0.0] * len(tokens)
        merges = merges_from_scores(vocab, scores)
    unk_id = _ids(meta, "unknown_token_id", tokens)
    unk = tokens[unk_id] if unk_id is not None else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps: list[Any] = [normalizers.Replace(" ", SPIECE_SPACE)]
    decode: list[Any] = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend(SPIECE_SPACE))
        decode.append(decoders.Strip(content=" ", left=1, right=0))
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence(decode)
    return tok


def _post_processor(tokens: list[str], bos: int | None, eos: int | None, add_bos: bool, add_eos: bool) -> Any:
    single, pair, special = "$A", "$A $B", []
    if add_bos and bos is not None:
        single, pair = f"{tokens[bos]} {single}", f"{tokens[bos]} $A {tokens[bos]} $B"
        special.append((tokens[bos], bos))
    if add_eos and eos is not None:
        single, pair = f"{single} {tokens[eos]}", f"{pair} {tokens[eos]}"
        if tokens[eos] not in {t for t, _ in special}:
            special.append((tokens[eos], eos))
    if not special:
        return None
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def build_tokenizer(header: GGUFHeader) -> TokenizerBundle | None:
    """The file's tokenizer, or ``None`` when it carries no vocabulary."""
    meta = header.metadata
    where = str(header.path)
    kind = meta.get("tokenizer.ggml.model")
    listed = meta.get("tokenizer.ggml.tokens")
    if kind is None or not isinstance(listed, GGUFStrings | list):
        return None
    tokens = list(listed)  # decodes the vocabulary (the header parse leaves it as bytes)
    raw_types = meta.get("tokenizer.ggml.token_type")
    types = [int(t) for t in raw_types] if raw_types is not None else [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        types = (types + [NORMAL] * len(tokens))[: len(tokens)]
    if kind == "gpt2":
        tok = _byte_level(meta, tokens, types, where)
        default_bos = False
    elif kind == "llama":
        tok = _sentencepiece(meta, tokens, types)
        default_bos = True
    else:
        raise UnsupportedError(f"{where}: metadata key 'tokenizer.ggml.model' is {kind!r}; "
                               "supported: 'gpt2' (byte-level BPE), 'llama' (SentencePiece)")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types, strict=True) if k == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED])
    bos = _ids(meta, "bos_token_id", tokens)
    eos = _ids(meta, "eos_token_id", tokens)
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", default_bos))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    post = _post_processor(tokens, bos, eos, add_bos, add_eos)
    if post is not None:
        tok.post_processor = post
    stops = [i for i in (eos, _ids(meta, "eot_token_id", tokens), _ids(meta, "eom_token_id", tokens))
             if i is not None]
    template = meta.get("tokenizer.chat_template")
    return TokenizerBundle(
        tokenizer=tok,
        chat_template=template if isinstance(template, str) else None,
        bos_token=tokens[bos] if bos is not None else None,
        eos_token=tokens[eos] if eos is not None else None,
        eos_token_ids=tuple(dict.fromkeys(stops)),
        add_bos_token=add_bos,
    )


def tokenizer_of_file(file: str) -> TokenizerBundle | None:
    """:func:`build_tokenizer` from the metadata of ``file`` (a split set's first part holds it)."""
    return build_tokenizer(read_header(Path(file)))
