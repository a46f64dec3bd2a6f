"""Child process: load SOURCE at DTYPE, save its state dict to OUT.pt, or write the error to OUT.json.

Used where the load must run in another environment than the test's (the Azure tests' mount namespace).
``--truncate NAME BYTES`` cuts ``az://`` object NAME (under the source's prefix) to BYTES right after the
load lists the prefix.
"""

from __future__ import annotations

import json
import sys

import torch

import loader
from loader_plugin_runai.object_folder import ObjectFolder


def _truncate_after_listing(name: str, size: int) -> None:
    listing = ObjectFolder.listing
    done: list[bool] = []

    def listed(self: ObjectFolder) -> object:
        found = listing(self)
        if not done:
            done.append(True)
            blob = self.store._container.get_blob_client(self.uri.key(name))  # type: ignore[attr-defined]
            data = blob.download_blob().readall()
            blob.upload_blob(data[:size], overwrite=True)
        return found

    ObjectFolder.listing = listed  # type: ignore[method-assign]


def main() -> None:
    source, dtype, out = sys.argv[1:4]
    if sys.argv[4:5] == ["--truncate"]:
        _truncate_after_listing(sys.argv[5], int(sys.argv[6]))
    try:
        model = loader.load_model(source, dtype=dtype)
    except loader.LoadError as exc:
        with open(f"{out}.json", "w") as fh:
            json.dump({"error": type(exc).__name__, "message": str(exc)}, fh)
        return
    torch.save(model.state_dict(), f"{out}.pt")


if __name__ == "__main__":
    main()
