"""Public: what a plugin's tests need from the core.

- :func:`create_plugin_host` builds a fresh plugin host (specs, the core's own
  implementations, installed plugins unless told not to); register in-process
  plugins on it with :meth:`PluginHost.register` and pass it to
  :func:`loader.load_model` as ``host=`` — no global state between tests;
- :class:`PluginRecord` is one row of ``loader plugins`` (``host.records``);
- :func:`simulated_tp` builds layers for one rank of a tensor-parallel group
  without launching several processes.
"""

from __future__ import annotations

from ._distributed import simulated_tp
from ._plugins import PluginHost, PluginRecord, create_plugin_host

__all__ = [
    "PluginHost",
    "PluginRecord",
    "create_plugin_host",
    "simulated_tp",
]
