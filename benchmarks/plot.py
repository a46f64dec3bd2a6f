"""The PNG of seconds per path: one panel per checkpoint size, medians with min-max whiskers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .report import PathSummary

__all__ = ["MATPLOTLIB_HINT", "have_matplotlib", "plot_seconds"]

MATPLOTLIB_HINT = ("matplotlib is not installed, so no plot was drawn; install it with "
                   "`.venv/bin/pip install -c constraints.txt -r benchmarks/requirements.txt`")


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_seconds(sizes: list[dict[str, Any]], target: Path) -> None:
    """Draw horizontal bars of median seconds per path, one panel per size, into ``target``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [size for size in sizes if any(s.seconds for s in size["summaries"].values())]
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.2 + 0.55 * max(
        len(size["summaries"]) for size in panels) * len(panels)), squeeze=False)
    for axis, size in zip(axes[:, 0], panels, strict=True):
        measured: list[PathSummary] = [s for s in size["summaries"].values() if s.seconds]
        labels = [s.label for s in measured]
        medians = [s.median or 0.0 for s in measured]
        low = [m - min(s.seconds) for m, s in zip(medians, measured, strict=True)]
        high = [max(s.seconds) - m for m, s in zip(medians, measured, strict=True)]
        colors = ["tab:green" if s.name.startswith(("loader", "sharded")) else
                  "tab:gray" if s.name == "floor" else "tab:blue" for s in measured]
        positions = range(len(measured))
        axis.barh(positions, medians, xerr=[low, high], color=colors, capsize=3)
        axis.set_yticks(list(positions), labels)
        axis.invert_yaxis()
        for y, value in zip(positions, medians, strict=True):
            axis.annotate(f" {value:.3f} s", (value, y), va="center", fontsize=8)
        axis.set_title(f"{size['gigabytes']:g} GB bf16 Llama, warm page cache, median of {size['reps']}")
        axis.set_xlabel("seconds (lower is better)")
        axis.set_xlim(0, max(medians) * 1.3 if max(medians) > 0 else 1)
    fig.tight_layout()
    fig.savefig(target, dpi=120)
    plt.close(fig)
