"""Per-layer kernel records, summarised alike by ``loader load`` and ``loader inspect --layers`` for any plugin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loader._cli.layer_kernels import UNDECIDED, kernel_summary_lines, print_layer_table
from tests.core.test_cli import NEEDS_LLAMA, run_cli

RECORDS = {
    "model.layers.0.mlp.down_proj": {"kernel": "int4", "reason": None, "packed_bytes": 1024},
    "model.layers.0.self_attn.o_proj": {"kernel": "dequantized", "reason": "type Q6_K has no packed kernel",
                                        "packed_bytes": 0},
    "model.layers.1.self_attn.o_proj": {"kernel": "dequantized", "reason": "type Q6_K has no packed kernel",
                                        "packed_bytes": 0},
    "model.layers.1.mlp.down_proj": {"kernel": "int4", "reason": None, "packed_bytes": 1024},
    "model.layers.2.mlp.down_proj": {"kernel": "int4", "reason": None, "packed_bytes": 1024},
    "lm_head": None,
}


def test_the_summary_counts_kernels_and_names_each_fallback_reason_once():
    assert kernel_summary_lines(RECORDS) == [
        f"int4 3, dequantized 2, {UNDECIDED} 1",
        "dequantized (2 layers): type Q6_K has no packed kernel",
    ]


def test_the_layer_table_shows_the_path_per_token_bucket(capsys):
    """One path for every bucket prints once; paths that change with the tokens print per bucket."""
    mixed = {"1": "packed-bf16", "2-16": "packed-bf16", "17-64": "packed-bf16", "65-256": "dequantize",
             "257+": "dequantize"}
    print_layer_table({
        "a": {"kernel": "int4pack", "reason": None, "by_tokens": {"float32": dict.fromkeys(mixed, "packed-bf16")},
              "paths_from": "static"},
        "b": {"kernel": "int4pack", "reason": None, "by_tokens": {"float32": mixed}, "paths_from": "measured"},
    })
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["layer", "kernel", "reason", "by_tokens", "paths_from"]
    assert lines[2].split() == ["a", "int4pack", "float32:", "packed-bf16", "static"]
    assert lines[3].split() == ["b", "int4pack", "float32:", "1=packed-bf16", "2-16=packed-bf16",
                                "17-64=packed-bf16", "65-256=dequantize", "257+=dequantize", "measured"]


def test_the_layer_table_shows_every_layer_and_the_records_own_keys(capsys):
    print_layer_table(RECORDS)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["layer", "kernel", "reason", "packed_bytes"]
    assert lines[3].split()[:2] == ["model.layers.0.self_attn.o_proj", "dequantized"]
    assert lines[3].endswith("type Q6_K has no packed kernel  0")
    assert lines[-1].split() == ["lm_head", "decided", "at", "load"]


def test_a_list_valued_key_prints_as_a_comma_separated_cell(capsys):
    """GGUF's records list each part's block type: shown ``Q4_1, Q8_0``, not as a Python tuple."""
    print_layer_table({"model.layers.0.mlp.gate_up_proj": {"kernel": "dequantized", "reason": "part 1: Q8_0",
                                                            "types": ("Q4_1", "Q8_0")}})
    assert capsys.readouterr().out.splitlines()[-1].endswith("part 1: Q8_0  Q4_1, Q8_0")


@pytest.mark.needs_plugins
@NEEDS_LLAMA
def test_inspect_layers_plans_a_dense_model(tmp_path: Path):
    from tests.helpers.hf_checkpoints import save_checkpoint

    save_checkpoint("llama", tmp_path / "dense")
    result = run_cli("inspect", str(tmp_path / "dense"), "--layers", "--json")
    assert result.returncode == 0, result.stderr
    layers = json.loads(result.stdout)["layers"]
    assert layers["model.layers.0.self_attn.qkv_proj"] == {"kernel": "dense", "reason": None}
    assert len(layers) == 8 and {r["kernel"] for r in layers.values()} == {"dense"}
    text = run_cli("inspect", str(tmp_path / "dense"), "--layers")
    assert "kernels on cpu (planned from shapes; no weights read): dense 8" in text.stdout


@pytest.mark.parametrize("flag", ["--device", "--quantization"])
def test_inspect_layer_options_have_help(flag):
    result = run_cli("inspect", "--help")
    assert flag in result.stdout and "--layers" in result.stdout
