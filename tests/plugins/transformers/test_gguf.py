"""GGUF files of architectures no native plugin serves load through the fallback.

Files are written by gguf-py's ``GGUFWriter`` (:mod:`tests.helpers.gguf_fallback_files`);
the reference is ``transformers``' own ``from_pretrained(folder, gguf_file=...)`` of the
same file. loader reads the tensors with its own GGUF reader and renames them through
transformers' tables, so logits and (dequantized) parameters must agree.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import loader
from loader.errors import UnexpectedWeightError, UnknownArchitectureError, UnsupportedError
from tests.helpers.gguf_fallback_files import GGUF_FAMILIES, Q, write_fallback_gguf

pytest.importorskip("accelerate")  # transformers' GGUF loading (the reference) needs it

IDS = torch.tensor([[1, 17, 42, 99, 3, 200, 7, 64], [5, 6, 7, 8, 9, 10, 11, 12]])


def _reference(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("arch", sorted(GGUF_FAMILIES))
def test_gguf_through_the_fallback_equals_transformers(tmp_path, arch, qtype):
    path = tmp_path / "model.gguf"
    write_fallback_gguf(path, arch, qtype=qtype)
    reference = _reference(path)
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert report.model_impl == "transformers" and report.load_format == "gguf"
    ours = dict(model.hf_model.named_parameters())
    theirs = dict(reference.named_parameters())
    assert set(ours) == set(theirs)
    for name, param in theirs.items():  # the same dequantized (and rewritten) values, bit for bit
        assert torch.equal(ours[name], param), name
    with torch.no_grad():
        got = model(IDS)
        expected = reference(input_ids=IDS, use_cache=False).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_a_split_set_through_the_fallback_loads_like_the_single_file(tmp_path):
    """Phi-3's untied ``output.weight`` lies in the last part: the config must see every part's tensors
    (reading the first part's names only tied the head to the embedding)."""
    (tmp_path / "single").mkdir()
    single = write_fallback_gguf(tmp_path / "single" / "model.gguf", "phi3", qtype=Q.Q8_0)
    assert not single.config.tie_word_embeddings
    parts = tmp_path / "parts"
    parts.mkdir()
    write_fallback_gguf(parts / "model.gguf", "phi3", qtype=Q.Q8_0, split_max_tensors=6)
    assert len(list(parts.glob("model-*-of-*.gguf"))) > 1
    with torch.no_grad():
        from_parts = loader.load_model(str(parts), dtype="float32")(IDS)
        from_file = loader.load_model(str(tmp_path / "single" / "model.gguf"), dtype="float32")(IDS)
    assert torch.equal(from_parts, from_file)


def _write_arch_only(path: Path, arch: str) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_architecture_neither_native_nor_known_to_transformers_is_one_line(tmp_path):
    path = _write_arch_only(tmp_path / "model.gguf", "bert")
    with pytest.raises(UnknownArchitectureError) as info:
        loader.load_model(str(path))
    message = str(info.value)
    assert "\n" not in message
    assert "model.gguf: GGUF architecture 'bert' is not supported" in message
    assert "nor can the transformers fallback read it" in message and "phi3" in message


def test_architecture_whose_tensors_transformers_rewrites_unreproduced_is_refused(tmp_path):
    path = _write_arch_only(tmp_path / "model.gguf", "bloom")
    with pytest.raises(UnsupportedError, match=r"model\.gguf: GGUF architecture 'bloom' has no native plugin, and "
                                               r"transformers rewrites its tensors while loading "
                                               r"\(BloomTensorProcessor\)"):
        loader.load_model(str(path))


def test_a_gguf_tensor_with_no_place_is_named(tmp_path):
    path = tmp_path / "model.gguf"
    write_fallback_gguf(path, "phi3", extra_tensors={"blk.0.nonesuch.weight": np.zeros(4)})
    with pytest.raises(UnexpectedWeightError, match=r"GGUF tensor 'blk\.0\.nonesuch\.weight' has no place in "
                                                    r"transformers' Phi3ForCausalLM"):
        loader.load_model(str(path), dtype="float32")


def test_native_gguf_architectures_still_load_natively(tmp_path):
    from tests.helpers.gguf_files import write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    path = write_gguf(tmp_path / "llama.gguf", build_model("llama", tiny_config("llama", vocab_size=320)), "llama")
    _, report = loader.load_model_with_report(str(path), dtype="float32")
    assert report.model_impl == "native"
