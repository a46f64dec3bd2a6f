"""The plugin is discovered with its hooks, and its command is on the command line."""

from __future__ import annotations

import json
import subprocess
import sys


def test_loader_plugins_lists_tensorizer_with_its_hooks() -> None:
    done = subprocess.run([sys.executable, "-m", "loader._cli.main", "plugins", "--json"], capture_output=True,
                          text=True, check=True)
    records = {p["name"]: p for p in json.loads(done.stdout)}
    assert records["tensorizer"]["status"] == "loaded"
    assert set(records["tensorizer"]["hooks"]) == {"loader_cli_commands", "loader_detect_format",
                                                   "loader_iter_weights", "loader_resolve_source"}


def test_save_tensorized_is_a_loader_command() -> None:
    done = subprocess.run([sys.executable, "-m", "loader._cli.main", "save-tensorized", "--help"],
                          capture_output=True, text=True, check=True)
    assert "--encrypt KEYFILE" in done.stdout and "-tp N" in done.stdout
