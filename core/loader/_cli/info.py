"""``loader plugins`` and ``loader models``: what is installed and what it can do."""

from __future__ import annotations

import argparse

from .._plugins import current_plugin_host
from .._registry import get_registry
from .output import print_json, print_table

__all__ = ["run_models", "run_plugins"]


def run_plugins(args: argparse.Namespace) -> int:

    host = current_plugin_host()  # the process-wide host, unless a caller set another
    records = host.plugin_records()
    registry = get_registry(host)
    conflicts = registry.conflicts()
    if args.json:
        print_json([{**r.to_json(),
                     "conflicts": [a for a in conflicts if r.name in registry.conflicting_plugins(a)]}
                    for r in records])
        return 0
    print_table(
        ["name", "distribution", "version", "status", "hooks"],
        [[r.name, r.distribution, r.version, r.status if not r.error else f"{r.status}: {r.error}",
          ", ".join(h.removeprefix("loader_") for h in r.hooks)] for r in records],
    )
    for error in conflicts.values():
        print(f"conflict: {error}")
    return 0


def run_models(args: argparse.Namespace) -> int:
    registry = get_registry()
    entries = registry.entries()
    infos = registry.model_infos_or_errors([e.architecture for e in entries])
    rows: list[dict[str, object]] = []
    for entry in entries:
        info = infos[entry.architecture]
        row: dict[str, object] = {"architecture": entry.architecture, "plugin": entry.plugin,
                                  "class_path": entry.class_path, "fallback": entry.fallback}
        if isinstance(info, Exception):
            row["error"] = str(info)
        else:
            row.update({k: v for k, v in info.to_json().items() if k != "architecture"})
        rows.append(row)
    if args.json:
        print_json(rows)
        return 0
    print_table(
        ["architecture", "plugin", "class", "text-gen", "tp", "pp", "quant", "tied"],
        [[r["architecture"], r["plugin"], r["class_path"], r.get("is_text_generation_model"),
          r.get("supports_tensor_parallel"), r.get("supports_pipeline_parallel"),
          r.get("supports_quantization"), r.get("tied_embeddings_supported")] for r in rows],
    )
    for r in rows:
        covered = r.get("fallback_for")
        if r["fallback"] and isinstance(covered, list):
            print(f"\n{r['architecture']} (plugin {r['plugin']}) is the fallback for architectures no plugin "
                  f"registers; it covers {len(covered)}: {', '.join(covered)}")
        if "error" in r:
            print(f"error: {r['architecture']}: {r['error']}")
    return 0
