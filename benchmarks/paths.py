"""The measured load paths: one ``setup`` + ``run`` pair per path, run inside a child process.

``setup(source)`` does what a long-running program pays once (imports, plugin
discovery, joining the process group, allocating a reused buffer) and returns
state for ``run``; ``run(source, state)`` is the timed load and ends with every
weight page resident. ``prepare(checkpoint, work_dir)`` runs in the parent,
untimed, and returns the source the child loads (the sharded-state folder for
``sharded_tp2``), or raises :class:`PathSkipped` with a note. ``warm(tiny, state)``
is what a warm process (``--warm-process``) runs once, untimed, on a tiny checkpoint
of the same architecture, so modules imported lazily during a load are already in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoints import shard_files
from .measure import touch_pages

__all__ = ["PATHS", "MeasuredPath", "PathSkipped"]


class PathSkipped(Exception):
    """A path that cannot run here yet (a feature not landed); the message says why."""


@dataclass(frozen=True)
class MeasuredPath:
    name: str
    label: str
    setup: Callable[[Path], Any]
    run: Callable[[Path, Any], dict[str, Any]]
    warm: Callable[[Path, Any], Any] | None
    tp: int = 1
    prepare: Callable[[Path, Path], Path] | None = None


# --- loader.load_model ------------------------------------------------------------------


def _setup_loader(source: Path) -> None:
    """Imports, plugin discovery and the model class of the checkpoint's architecture, like
    ``_setup_transformers`` importing ``modeling_llama``: a server pays these once."""
    import json

    import torch  # noqa: F401

    from loader._pipeline import load  # noqa: F401
    from loader._registry import get_registry

    config = source / "config.json"
    if config.is_file():
        get_registry().resolve(json.loads(config.read_text()).get("architectures", []))


def _run_loader(source: Path, state: Any, load_format: str = "auto", model_impl: str = "auto") -> dict[str, Any]:
    from loader import load_model_with_report

    model, report = load_model_with_report(str(source), dtype="bfloat16", load_format=load_format,
                                           model_impl=model_impl)
    pages = touch_pages(model)
    return {"pages_touched": pages, "bytes_read": report.bytes_read,
            "checkpoint_bytes": report.checkpoint_bytes, "parameter_bytes": report.parameter_bytes,
            "loader_seconds": report.seconds, "tp_rank": report.tp_rank, "tp_size": report.tp_size,
            "bytes_mapped": report.bytes_mapped,
            "load_format": report.load_format}


def loader_load_model(source: Path, state: Any) -> dict[str, Any]:
    """(a) ``loader.load_model_with_report(path, dtype="bfloat16")``, pages touched."""
    return _run_loader(source, state)


def _setup_loader_copying(source: Path) -> None:
    os.environ["LOADER_MAP_WEIGHTS"] = "0"
    _setup_loader(source)


def loader_copying(source: Path, state: Any) -> dict[str, Any]:
    """(a') the same with ``LOADER_MAP_WEIGHTS=0``: every byte copied into fresh memory, none mapped."""
    return _run_loader(source, state)


def _setup_loader_fallback(source: Path) -> None:
    """As ``_setup_loader``, but the class imported is the fallback's (and the modeling module it builds),
    not the native Llama class, which a program loading through the fallback never imports."""
    import torch  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    from loader._pipeline import load  # noqa: F401
    from loader._registry import get_registry

    registry = get_registry()
    fallback = registry.fallback
    if fallback is None:
        raise RuntimeError("loader-plugin-transformers is not installed: no fallback is registered")
    registry.load_class(fallback.architecture)


def loader_fallback(source: Path, state: Any) -> dict[str, Any]:
    """(a'') ``loader.load_model_with_report(path, dtype="bfloat16", model_impl="transformers")``, pages touched."""
    return _run_loader(source, state, model_impl="transformers")


# --- transformers.from_pretrained -------------------------------------------------------


def _setup_transformers(source: Path) -> None:
    """Imports, including the modeling module of the checkpoint's ``model_type`` (``modeling_llama``,
    ``modeling_qwen3_moe``): what a server pays once, kept out of the timed load as loader's setup is."""
    import importlib
    import json

    import torch  # noqa: F401
    import transformers  # noqa: F401

    config = source / "config.json"
    model_type = json.loads(config.read_text()).get("model_type", "llama") if config.is_file() else "llama"
    importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


def transformers_from_pretrained(source: Path, state: Any) -> dict[str, Any]:
    """(b) ``AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)``, then every page touched."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.bfloat16)
    pages = touch_pages(model)
    return {"pages_touched": pages, "parameter_bytes": _parameter_bytes(model)}


# --- torch.load of .bin shards (bench_bin_read.py) --------------------------------------


def _setup_torch_load(source: Path) -> None:
    import torch  # noqa: F401


def torch_load_mmap(source: Path, state: Any) -> dict[str, Any]:
    """``torch.load(f, mmap=True, weights_only=True)`` of every ``.bin`` shard, every page then touched."""
    import torch

    tensors: dict[str, Any] = {}
    for shard in sorted(source.glob("pytorch_model*.bin")):
        tensors.update(torch.load(shard, mmap=True, weights_only=True, map_location="cpu"))
    holder = torch.nn.Module()
    holder.tensors = torch.nn.ParameterList(torch.nn.Parameter(t, requires_grad=False) for t in tensors.values())
    pages = touch_pages(holder)
    return {"pages_touched": pages, "parameter_bytes": _parameter_bytes(holder)}


# --- the vLLM-style loop ----------------------------------------------------------------


def _setup_vllm_loop(source: Path) -> None:
    _setup_transformers(source)
    import safetensors.torch  # noqa: F401


def vllm_style_loop(source: Path, state: Any) -> dict[str, Any]:
    """(c) vLLM v0.8.5's default loop: a model built on the meta device, storage allocated
    with ``to_empty``, then per shard ``safe_open(f, "pt")`` + ``get_tensor`` + ``param.copy_``.

    The modules are transformers' ``LlamaForCausalLM`` (vLLM has its own classes, with the
    same parameter shapes); non-persistent buffers (rotary ``inv_freq``) are left
    uninitialised, as only the weights are being measured.
    """
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(str(source))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.to_empty(device="cpu")
    params = dict(model.named_parameters())
    copied = 0
    with torch.no_grad():
        for file in shard_files(source):
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                    tensor = handle.get_tensor(name)
                    params[name].copy_(tensor)
                    copied += tensor.nbytes
    pages = touch_pages(model)
    return {"pages_touched": pages, "checkpoint_bytes": copied, "parameter_bytes": _parameter_bytes(model)}


# --- the floor --------------------------------------------------------------------------


def _setup_floor(source: Path) -> memoryview:
    largest = max(file.stat().st_size for file in shard_files(source))
    buffer = bytearray(largest)  # zero-filled: every page faulted in before the clock starts
    return memoryview(buffer)


def page_cache_floor(source: Path, buffer: memoryview) -> dict[str, Any]:
    """(d) Every shard file read into one reused, pre-faulted buffer: a memcpy from the page cache."""
    total = 0
    for file in shard_files(source):
        size = file.stat().st_size
        fd = os.open(file, os.O_RDONLY)
        try:
            done = 0
            while done < size:
                n = os.preadv(fd, [buffer[done:size]], done)
                if n <= 0:
                    raise OSError(f"{file}: read returned {n} at byte {done} of {size}")
                done += n
        finally:
            os.close(fd)
        total += done
    return {"bytes_read": total, "checkpoint_bytes": total}


# --- tensor parallel: full checkpoint vs sharded state ----------------------------------


def _setup_loader_tp(source: Path) -> None:
    _setup_loader(source)
    from loader import _distributed as distributed

    distributed.init_distributed()


def loader_tp2(source: Path, state: Any) -> dict[str, Any]:
    """``loader.load_model`` on the full checkpoint, one rank of two (under torchrun)."""
    return _run_loader(source, state)


def loader_sharded_state_tp2(source: Path, state: Any) -> dict[str, Any]:
    """``loader.load_model(load_format="sharded_state")`` on ``loader save-sharded --tp 2`` output."""
    return _run_loader(source, state, load_format="sharded_state")


def _loader_cli() -> list[str]:
    script = Path(sys.executable).with_name("loader")
    return [str(script)] if script.exists() else [sys.executable, "-m", "loader._cli.main"]


def prepare_sharded_state(checkpoint: Path, work_dir: Path) -> Path:
    """Write the tp=2 sharded state of ``checkpoint`` with ``loader save-sharded``, untimed.

    Rewritten on every run (seconds for 1 GB) rather than cached: the sharded layout is
    loader's own format and may change between runs, the source checkpoint does not.
    """
    target = work_dir / f"{checkpoint.name}-sharded-tp2"
    probe = subprocess.run([*_loader_cli(), "save-sharded", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise PathSkipped("`loader save-sharded` is not available yet (issue 6 item 4); "
                          "sharded-state load at tp=2 not measured")
    if target.exists():
        shutil.rmtree(target)
    done = subprocess.run([*_loader_cli(), "save-sharded", str(checkpoint), str(target), "--tp", "2"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"`loader save-sharded {checkpoint} {target} --tp 2` failed: {' | '.join(tail)}")
    return target


def _parameter_bytes(model: Any) -> int:
    seen: set[int] = set()
    total = 0
    for param in model.parameters():
        if param.data_ptr() not in seen:
            seen.add(param.data_ptr())
            total += param.numel() * param.element_size()
    return total


PATHS: dict[str, MeasuredPath] = {
    path.name: path
    for path in (
        MeasuredPath("loader", "loader.load_model", _setup_loader, loader_load_model, loader_load_model),
        MeasuredPath("loader_copy", "loader.load_model, LOADER_MAP_WEIGHTS=0 (copying)", _setup_loader_copying,
                     loader_copying, loader_copying),
        MeasuredPath("loader_fallback", "loader.load_model, model_impl='transformers' (fallback)",
                     _setup_loader_fallback, loader_fallback, loader_fallback),
        MeasuredPath("transformers", "transformers.from_pretrained", _setup_transformers,
                     transformers_from_pretrained, transformers_from_pretrained),
        MeasuredPath("vllm_loop", "vLLM-style loop (meta + safe_open + copy_)", _setup_vllm_loop,
                     vllm_style_loop, vllm_style_loop),
        MeasuredPath("torch_load_mmap", "torch.load(mmap=True, weights_only=True), no model", _setup_torch_load,
                     torch_load_mmap, None),
        MeasuredPath("floor", "floor: read into one reused buffer", _setup_floor, page_cache_floor, None),
        MeasuredPath("loader_tp2", "loader.load_model, full checkpoint, tp=2", _setup_loader_tp, loader_tp2,
                     loader_tp2, tp=2),
        # No tiny sharded state to warm with; a full-checkpoint load imports nearly the same modules.
        MeasuredPath("sharded_tp2", "loader.load_model, sharded_state, tp=2", _setup_loader_tp,
                     loader_sharded_state_tp2, loader_tp2, tp=2, prepare=prepare_sharded_state),
    )
}
"""Every measured path by name (the names ``--only`` takes)."""
