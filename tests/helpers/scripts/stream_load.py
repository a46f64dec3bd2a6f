"""Child process: load SOURCE at DTYPE, save its state dict to OUT.pt, or write the error to OUT.json.

Object-store loads that reach the Run:ai streamer run here, one per process: the streamer keeps the
first object-store backend it loads for the whole process, so a test process that streamed ``s3://``
cannot stream ``gs://`` (and the Azure tests need a mount namespace of their own).
``--after-listing NAME FILE`` replaces object NAME (under the source's prefix) with FILE's bytes right
after the load lists the prefix: a truncation or a replacement in the middle of the load.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

import loader
from loader_plugin_runai.object_folder import ObjectFolder


def _upload(folder: ObjectFolder, name: str, data: bytes) -> None:
    store: Any = folder.store
    key = folder.uri.key(name)
    if folder.uri.scheme == "gs":
        store._client.bucket(folder.uri.bucket).blob(key).upload_from_string(data)
    else:
        store._container.get_blob_client(key).upload_blob(data, overwrite=True)


def _replace_after_listing(name: str, data: bytes) -> None:
    listing = ObjectFolder.listing
    done: list[bool] = []

    def listed(self: ObjectFolder) -> object:
        found = listing(self)
        if not done:
            done.append(True)
            _upload(self, name, data)
        return found

    ObjectFolder.listing = listed  # type: ignore[method-assign]


def main() -> None:
    source, dtype, out = sys.argv[1:4]
    if sys.argv[4:5] == ["--after-listing"]:
        _replace_after_listing(sys.argv[5], Path(sys.argv[6]).read_bytes())
    try:
        model = loader.load_model(source, dtype=dtype)
    except loader.LoadError as exc:
        with open(f"{out}.json", "w") as fh:
            json.dump({"error": type(exc).__name__, "message": str(exc)}, fh)
        return
    torch.save(model.state_dict(), f"{out}.pt")


if __name__ == "__main__":
    main()
