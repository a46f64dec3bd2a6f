"""Build a wheel of every shipped distribution into one folder, and check each before anything installs it.

tox runs this once per run (its ``.pkg_external`` packaging env, see tox.ini); every test env then
installs the wheels it needs with ``scripts/install_wheels.py``, so the tests run against what a
user would get from PyPI and a file missing from a wheel fails CI. The checks
(``scripts/distributions.py``) refuse a wheel without the license, classifiers, project URLs or
version bounds on our own distributions, a plugin README without its install line, or one that
lacks a file of its package's source folder.

    python scripts/build_wheels.py OUT_DIR     # needs hatchling installed (no build isolation)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributions import ROOT, find_wheel, shipped_distributions, wheel_problems


def build(out_dir: Path) -> list[Path]:
    """Build every shipped distribution's wheel into ``out_dir`` (emptied of wheels first); return them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.whl"):
        stale.unlink()
    distributions = shipped_distributions()
    # one pip process for all of them; the backend (hatchling) comes from this env, not a fresh one per wheel
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out_dir), *(str(d.project_dir) for d in distributions)], check=True)
    return [find_wheel(out_dir, d) for d in distributions]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path, help="folder for the wheels (its old wheels are removed)")
    args = parser.parse_args()
    wheels = build(args.out_dir)
    distributions = shipped_distributions()
    versions = {d.name: d.version for d in distributions}
    license_text = (ROOT / "LICENSE").read_bytes()
    problems = [p for d, w in zip(distributions, wheels, strict=True)
                for p in wheel_problems(w, d, versions, license_text)]
    for wheel in wheels:
        print(f"built {wheel.name}")
    for problem in problems:
        sys.stderr.write(f"error: {problem}\n")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
