"""An in-process plugin that loads a one-group compressed-tensors ``float-quantized`` checkpoint through
:func:`loader_plugin_marlin.fp8_config.fp8_scheme_from_ct`, standing in for the compressed-tensors dispatcher
(which decides per layer which group applies and calls that function for ``float-quantized`` groups) until it
lands. It runs before the marlin plugin's own detection (``tryfirst``) and answers only for such checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loader.hookspecs import hookimpl
from loader.testing import PluginHost, create_plugin_host
from loader_plugin_marlin.fp8_config import fp8_scheme_from_ct

__all__ = ["CtFloatStandIn", "host_with_ct_standin"]


class CtFloatStandIn:
    """``loader_detect_quantization`` for ``format: float-quantized`` with one config group."""

    @hookimpl(tryfirst=True)
    def loader_detect_quantization(self, hf_config: Mapping[str, Any], requested: str | None,
                                   options: Any) -> Any:
        declared = hf_config.get("quantization_config")
        if not isinstance(declared, Mapping) or declared.get("format") != "float-quantized":
            return None
        (name, group), = declared["config_groups"].items()
        return fp8_scheme_from_ct(name, group, options.quantization_options)


def host_with_ct_standin() -> PluginHost:
    """A fresh plugin host with :class:`CtFloatStandIn` registered."""
    host = create_plugin_host()
    host.register(CtFloatStandIn(), name="ct-float-standin")
    return host
