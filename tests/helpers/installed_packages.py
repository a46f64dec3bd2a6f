"""Where ``loader`` and the installed plugins would be imported from, for the wheel envs' guard.

tox installs every distribution from its built wheel (``LOADER_TESTS_FROM_WHEELS=1``) so that a file
missing from a wheel fails the tests; that only holds while nothing imports the same packages from
this checkout instead (an editable install, a ``PYTHONPATH`` or ``sys.path`` entry pointing into
``core/`` or ``plugins/*/src``). :func:`not_from_wheels` names each package that would be imported from
anywhere but this environment's site-packages, and each editable install; the suite's conftest
refuses to run when it finds one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import sysconfig
from pathlib import Path

__all__ = ["import_locations", "not_from_wheels", "site_packages"]

OURS = re.compile(r"^loader[-_](core|plugin[-_].+)$", re.IGNORECASE)


def _top_level_packages() -> list[str]:
    """``loader`` and the top-level package of every entry point in group ``loader.plugins``."""
    plugins = [ep.value.split(":", 1)[0].split(".", 1)[0]
               for ep in importlib.metadata.entry_points(group="loader.plugins")]
    return list(dict.fromkeys(["loader", *plugins]))


def import_locations() -> dict[str, Path | None]:
    """Each of our top-level packages and the folder it would be imported from (``None``: not importable)."""
    found: dict[str, Path | None] = {}
    for name in _top_level_packages():
        spec = importlib.util.find_spec(name)
        if spec is None:
            found[name] = None
        elif spec.submodule_search_locations:
            found[name] = Path(next(iter(spec.submodule_search_locations))).resolve()
        else:
            found[name] = Path(spec.origin).resolve().parent if spec.origin else None
    return found


def _editable_distributions() -> list[str]:
    editable = []
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        text = dist.read_text("direct_url.json") if OURS.match(name) else None
        if text and json.loads(text).get("dir_info", {}).get("editable"):
            editable.append(name)
    return sorted(editable)


def site_packages() -> list[Path]:
    """This environment's folders for installed distributions (a tox env's lies inside the checkout's .tox)."""
    paths = sysconfig.get_paths()
    return sorted({Path(paths[key]).resolve() for key in ("purelib", "platlib")})


def not_from_wheels() -> list[str]:
    """What would not come from an installed wheel: packages found outside site-packages, editable installs."""
    installed = site_packages()
    problems = [f"{name} from {where}" for name, where in import_locations().items()
                if where is not None and not any(where.is_relative_to(folder) for folder in installed)]
    problems += [f"{name} is an editable install" for name in _editable_distributions()]
    return problems
