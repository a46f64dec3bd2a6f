"""Sharded state: each tensor-parallel rank's post-processed parameters, saved once, read back directly.

``loader save-sharded SOURCE OUT --tp N`` writes ``model-rank-{rank}-part-{part}.safetensors``
per rank plus the config; ``load_format="sharded_state"`` then lets each rank
read only its own files, by parameter name, with no name mapping, no slicing
and no post-processing.
"""
