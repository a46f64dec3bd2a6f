"""Load checkpoint A, then give it checkpoint B's weights in place, as a training loop would every few steps.

    python docs/examples/update_weights.py PATH_A PATH_B

Prints the update's report and whether the model now gives the same logits as a fresh load of B.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

import loader


def main(a: str, b: str) -> None:
    model = loader.load_model(a, dtype="float32")
    storage = {name: p.data_ptr() for name, p in model.named_parameters()}

    # What a trainer holds: a full state dict under the checkpoint's names (here read from B's files).
    new_weights: dict[str, torch.Tensor] = {}
    for file in sorted(Path(b).glob("*.safetensors")):
        new_weights.update(load_file(str(file)))

    report = loader.update_weights(model, new_weights)
    print(f"version {report.version}: {report.tensors} tensors, {len(report.parameters)} parameters")
    print("storage kept:", storage == {name: p.data_ptr() for name, p in model.named_parameters()})

    ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        same = torch.equal(model(ids), loader.load_model(b, dtype="float32")(ids))
    print("equal to a fresh load of B:", same)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
