"""RMS normalisation as Llama, Mistral and Qwen use it."""

from __future__ import annotations

import torch
from torch import nn

from .._session import current_session
from .default_loader import default_weight_loader
from .param_layout import ParamLayout, set_param_layout

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)``, normalised in float32 like Hugging Face.

    The normalisation runs in float32 and the result is cast back to the
    input's dtype *before* the weight multiplies it, which is what
    ``LlamaRMSNorm`` does; matching that order keeps bf16 logits equal to the
    reference (in float32 ``torch.nn.functional.rms_norm`` runs the same steps
    in one call). ``forward(x, residual)`` first adds the residual and returns
    ``(normed, x + residual)``, the fused form decoder layers use.
    """

    def __init__(
        self, hidden_size: int, eps: float = 1e-6, *, params_dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        dtype = params_dtype if params_dtype is not None else current_session().dtype
        weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        set_param_layout(weight, ParamLayout(weight_loader=default_weight_loader))
        self.weight = weight

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # the same steps in one call (no casts to place in float32): faster than the steps below and
            # bit-equal to them (tests/core/test_layers_layernorm.py)
            return torch.nn.functional.rms_norm(x, (self.hidden_size,), self.weight, self.eps)
        wide = x.to(torch.float32)
        variance = wide.pow(2).mean(-1, keepdim=True)
        return self.weight * (wide * torch.rsqrt(variance + self.eps)).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self._norm(x)
        summed = x + residual
        return self._norm(summed), summed

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
