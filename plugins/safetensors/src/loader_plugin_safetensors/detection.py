"""Which weight files a local source holds: safetensors first, then PyTorch ``.bin``/``.pt``.

Only top-level files of a folder count (``original/`` and other subfolders
hold duplicate checkpoints in other layouts). For the pickled formats the
training artifacts that share the extensions (optimizer and scheduler states,
RNG states, ``training_args.bin``) are dropped. The index file, when present,
is returned for the core to keep only the files its ``weight_map`` names;
that is also how a folder with both sharded ``model-*.safetensors`` and
Mistral's ``consolidated.safetensors`` resolves to one set.
"""

from __future__ import annotations

from pathlib import Path

from loader.checkpoint import Source, WeightFormat, is_training_artifact

__all__ = ["FORMATS", "PT_SUFFIXES", "SAFETENSORS_SUFFIX", "detect_weight_format", "is_training_artifact"]

SAFETENSORS = "safetensors"
PT = "pt"
FORMATS = (SAFETENSORS, PT)
SAFETENSORS_SUFFIX = ".safetensors"
PT_SUFFIXES = (".bin", ".pt")
SAFETENSORS_INDEX = "model.safetensors.index.json"
PT_INDEX = "pytorch_model.bin.index.json"

def _format_of(path: Path) -> str | None:
    if path.name.endswith(SAFETENSORS_SUFFIX):
        return SAFETENSORS
    if path.name.endswith(PT_SUFFIXES) and not is_training_artifact(path.name):
        return PT
    return None


def _index(folder: Path, standard: str, suffix: str) -> str | None:
    """The standard index name if present, else the only ``*<suffix>`` index in the folder."""
    if (folder / standard).is_file():
        return str(folder / standard)
    found = sorted(p for p in folder.glob(f"*{suffix}") if p.is_file())
    return str(found[0]) if len(found) == 1 else None


def detect_weight_format(source: Source, requested: str) -> WeightFormat | None:
    """The format and files of a local source, or ``None`` (remote source, other format, no files).

    :param source: a resolved source; remote ones (``path is None``) are left to other plugins.
    :param requested: ``"auto"`` (safetensors, else pt), ``"safetensors"`` or ``"pt"``.
    """
    if source.path is None or requested not in ("auto", *FORMATS):
        return None
    wanted = FORMATS if requested == "auto" else (requested,)
    path = source.path
    if path.is_file():
        kind = _format_of(path)
        return WeightFormat(kind, (str(path),)) if kind is not None and kind in wanted else None
    if not path.is_dir():
        return None
    by_format: dict[str, list[str]] = {name: [] for name in FORMATS}
    for child in path.iterdir():
        kind = _format_of(child)
        if kind is not None and child.is_file():
            by_format[kind].append(str(child))
    for kind in wanted:
        files = sorted(by_format[kind])
        if not files:
            continue
        if kind == SAFETENSORS:
            index = _index(path, SAFETENSORS_INDEX, ".safetensors.index.json")
        else:
            index = _index(path, PT_INDEX, ".bin.index.json")
        return WeightFormat(kind, tuple(files), index=index)
    return None
