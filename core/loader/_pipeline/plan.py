"""Which kernel each layer would get, without loading: the model is built on ``meta`` and each quantize method asked.

``loader inspect --layers`` shows it. Building on ``meta`` allocates and
reads nothing, and :meth:`~loader.layers.QuantizeMethodBase.layer_plan`
answers from shapes and the config alone (a :class:`~loader.kernels.KernelChoice`,
recorded as the load reports it), so a plan costs the config and the
checkpoint's headers, however large the weights are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .._plugins import PluginHost
from .._session import LoadSession, current_session, load_session
from ..errors import LoadError, PluginError
from ..kernels.choice import KernelChoice
from ..layers.quantization import QuantizeMethodBase
from .load import _build, build_options, resolve_options
from .prepare import prepare_checkpoint

__all__ = ["plan_layers"]


def plan_layers(
    source: str, *, dtype: Any = None, device: str = "cpu", load_format: str = "auto",
    quantization: str | None = None, quantization_options: Mapping[str, Any] | None = None,
    revision: str | None = None, model_impl: str = "auto", host: PluginHost | None = None,
    enable_expert_parallel: bool = False, trust_remote_code: bool = False,
) -> dict[str, Any]:
    """``{"quantization": describe() or None, "layers": {prefix: record or None}}`` for every layer that has a
    quantize method (every parallel linear; a quantized head), built for one rank on ``meta``; a record has the
    layer's ``scheme`` too when the config names one (:meth:`~loader.layers.QuantizationConfig.layer_scheme`)."""
    options = build_options(dtype=dtype, device=device, load_format=load_format, quantization=quantization,
                            revision=revision, quantization_options=quantization_options, model_impl=model_impl,
                            enable_expert_parallel=enable_expert_parallel, trust_remote_code=trust_remote_code)
    outer = current_session()
    session = LoadSession(host=host if host is not None else outer.host, tp_rank=outer.tp_rank,
                          tp_size=outer.tp_size, dtype=options.dtype, device=options.device,
                          enable_expert_parallel=options.enable_expert_parallel)
    with load_session(session):
        prepared = prepare_checkpoint(source, options, session.host)
        options = resolve_options(prepared, options, dtype)
        with load_session(attrs.evolve(current_session(), dtype=options.dtype)):
            _, model, quant_config = _build(prepared, options, options.dtype, session.host)
            layers = {_key(module, name): _plan(module, name, quant_config)
                      for name, module in model.named_modules() if _method(module) is not None}
    return {"quantization": quant_config.describe() if quant_config is not None else None, "layers": layers}


def _key(module: Any, name: str) -> str:
    """The layer's own prefix, which the methods' load records use (the transformers fallback nests loader's
    layers under ``hf_model.``, so a module's path is not its prefix there); its path when it has none."""
    prefix = getattr(module, "prefix", None)
    return prefix if isinstance(prefix, str) and prefix else name


def _method(module: Any) -> Any:
    method = getattr(module, "quant_method", None)
    return method if isinstance(method, QuantizeMethodBase) else None


def _plan(module: Any, name: str, quant_config: Any) -> dict[str, Any] | None:
    """One layer's record; a method's own bug becomes a :class:`PluginError` naming the quantization."""
    method = _method(module)
    try:
        plan = method.layer_plan(module)
    except LoadError:
        raise
    except Exception as exc:
        owner = getattr(quant_config, "name", None) or type(method).__name__
        raise PluginError(f"quantization {owner!r} failed in layer_plan for {name}: "
                          f"{type(exc).__name__}: {exc}") from exc
    if plan is None:
        return None
    if not isinstance(plan, KernelChoice):
        owner = getattr(quant_config, "name", None) or type(method).__name__
        raise PluginError(f"quantization {owner!r}: layer_plan for {name} returned {type(plan).__name__}, not a "
                          "loader.kernels.KernelChoice")
    scheme = quant_config.layer_scheme(_key(module, name)) if quant_config is not None else None
    return plan.record() if scheme is None else {**plan.record(), "scheme": scheme}
