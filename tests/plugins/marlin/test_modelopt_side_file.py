"""A ModelOpt export that describes its quantization only in ``hf_quant_config.json`` loads as one with it in
``config.json``: the core reads the side file as ``quantization_config`` (``quant_method: "modelopt"``)."""

from __future__ import annotations

import json

import torch

import loader
from tests.helpers.fp4_checkpoints import save_fp4_checkpoint
from tests.helpers.model_checks import random_ids


def test_hf_quant_config_json_alone_describes_the_quantization(tmp_path) -> None:
    path, _ = save_fp4_checkpoint("llama", tmp_path / "flat", "modelopt-nvfp4")
    expected = loader.load_model(str(path), dtype="float32")
    config = json.loads((path / "config.json").read_text())
    flat = config.pop("quantization_config")
    (path / "config.json").write_text(json.dumps(config))
    (path / "hf_quant_config.json").write_text(json.dumps({  # as ModelOpt's exporter writes it
        "producer": flat["producer"],
        "quantization": {"quant_algo": flat["quant_algo"], "group_size": flat["group_size"],
                         "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}}))
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert report.quantization["method"] == "modelopt"
    ids = random_ids(model.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(model(ids), expected(ids))


def test_config_json_wins_over_the_side_file(tmp_path) -> None:
    path, _ = save_fp4_checkpoint("llama", tmp_path / "both", "modelopt-nvfp4")
    (path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8_PB_WO"}}))
    assert loader.load_model_with_report(str(path), dtype="float32")[1].quantization["method"] == "modelopt"
