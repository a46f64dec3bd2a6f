"""The formats the core implements itself, through the same hooks as any format plugin.

``dummy`` (random weights, for benchmarks) and ``sharded_state`` (what
``loader save-sharded`` wrote) are registered as core plugins, so the pipeline
treats them like every other format and names none of them.
"""
