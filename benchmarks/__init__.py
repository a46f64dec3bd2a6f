"""Load benchmarks: loader against transformers, the vLLM-style loop and the page-cache floor.

``python benchmarks/run_all.py`` (``make bench``) is the entry point; see ``benchmarks/README.md``.
"""
