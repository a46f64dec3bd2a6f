"""A fresh virtual environment layered over the test's own, for installing a plugin as a user would.

A plugin's tests install its wheel with ``pip install`` and run ``loader`` in a
fresh environment, so the project's environment is never changed and a
concurrent test run never sees the plugin. Reinstalling torch and the core
there would take minutes, so the new environment sees the project's packages:
``python -m venv --system-site-packages`` cannot do it (a venv made from inside
a venv starts from the base interpreter, whose site-packages do not hold
them), so a ``.pth`` file adds the project's site-packages with
``site.addsitedir``, which also runs their editable-install ``.pth`` files.
pip in the new environment then counts the project's packages as installed
(``loader-core`` satisfies a plugin's bound) and installs only the new wheel,
into the new environment.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import venv
from pathlib import Path

__all__ = ["LayeredVenv", "create_layered_venv"]

REPO = Path(__file__).resolve().parents[2]


class LayeredVenv:
    """The new environment's folders and the process environment that runs commands in it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.python = self.bin / "python"
        self.site_packages = next(root.glob("lib/python*/site-packages"))
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "LOADER_PLUGINS", "LOADER_DISABLE_PLUGINS", "PIP_TARGET")}
        self.env.update({
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "VIRTUAL_ENV": str(root),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PIP_CONSTRAINT": str(REPO / "constraints.txt"),
            "PIP_NO_INDEX": "1",  # everything a plugin needs is installed: a resolver that looks further fails fast
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        })

    def pip(self, *args: str) -> None:
        """Run ``python -m pip`` in this environment; fail the test with pip's output when it fails."""
        done = subprocess.run([str(self.python), "-m", "pip", *args], env=self.env, capture_output=True,
                              text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise AssertionError(f"pip {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")

    def install_built_wheel(self, project: Path, dist: Path) -> Path:
        """Build ``project``'s wheel into ``dist`` (with the installed hatchling) and install it here."""
        self.pip("wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir", str(dist), str(project))
        (wheel,) = dist.glob("*.whl")
        self.pip("install", "--quiet", str(wheel))
        return wheel


def create_layered_venv(root: Path) -> LayeredVenv:
    """Create the environment at ``root`` with a ``loader`` command of its own.

    Commands there share the test session's capability cache (``LOADER_CACHE_DIR``, set by tests/conftest.py),
    so an architecture probed by an earlier test is not probed again.
    """
    venv.EnvBuilder(with_pip=False).create(root)
    created = LayeredVenv(root)
    dirs = "; ".join(f"site.addsitedir({d!r})" for d in site.getsitepackages())
    (created.site_packages / "_layered_over_project.pth").write_text(f"import site; {dirs}\n")
    # The project's console script, run by the new interpreter so that it sees what is installed there.
    script = Path(sys.executable).with_name("loader").read_text().split("\n", 1)[1]
    launcher = created.bin / "loader"
    launcher.write_text(f"#!{created.python}\n{script}")
    launcher.chmod(0o755)
    return created
