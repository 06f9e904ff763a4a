"""`replace(model)`: swap PyTorch modules for block ops in place, copying weights."""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

from torch import nn
from torch.overrides import TorchFunctionMode
import torch.nn.functional as F

from . import modules as bm
from . import ops

# source type -> block-op type; parameters/buffers carry over by name (same state_dict).
REPLACEMENTS: dict[type, type] = {
    nn.LayerNorm: bm.LayerNorm, nn.RMSNorm: bm.RMSNorm, nn.GroupNorm: bm.GroupNorm,
    nn.LSTM: bm.BlockLSTM, nn.GRU: bm.BlockGRU, nn.MultiheadAttention: bm.MultiheadAttention,
}


@dataclass
class ReplaceReport:
    replaced: Counter = field(default_factory=Counter)      # "nn.LayerNorm -> qlower LayerNorm": n
    modules: list[str] = field(default_factory=list)        # qualified names swapped
    sdpa_routed: bool = False

    def __str__(self) -> str:
        lines = [f"{k}: {v}" for k, v in sorted(self.replaced.items())] or ["nothing replaced"]
        if self.sdpa_routed:
            lines.append("F.scaled_dot_product_attention calls route to qlower::attention")
        return "\n".join(lines)


class _SDPAAsBlockOp(TorchFunctionMode):
    """Routes F.scaled_dot_product_attention to the attention block op while active."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and not kwargs.get("dropout_p"):
            q, k, v = args[:3]
            mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
            causal = args[5] if len(args) > 5 else kwargs.get("is_causal", False)
            return ops.attention(q, k, v, mask, bool(causal), kwargs.get("scale"))
        return func(*args, **kwargs)


def _is_hf_rms_norm(module: nn.Module) -> bool:
    """transformers' LLaMA-family RMSNorm (LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm, ...):
    `weight * x * rsqrt(mean(x^2) + variance_epsilon)`. Gemma's variant (1 + weight) has no
    `variance_epsilon` and is left alone."""
    weight = getattr(module, "weight", None)
    return type(module).__name__.endswith("RMSNorm") and isinstance(weight, nn.Parameter) and weight.dim() == 1 \
        and isinstance(getattr(module, "variance_epsilon", None), float) and not list(module.children())


def _from_hf_rms_norm(old: nn.Module) -> bm.RMSNorm:
    new = bm.RMSNorm(old.weight.shape[0], eps=old.variance_epsilon, device="meta")
    new.weight = old.weight  # shared storage, as for the other swaps
    new.train(old.training)
    return new


def _swap(parent: nn.Module, name: str, old: nn.Module, new_type: type) -> nn.Module:
    new = new_type.__new__(new_type)
    new.__dict__.update(old.__dict__)  # same parameters, buffers, hyper-parameters, hooks
    if isinstance(new, bm.GroupNorm):
        new.silu = False
    setattr(parent, name, new)
    return new


def replace(model: nn.Module, *, route_sdpa: bool = True) -> ReplaceReport:
    """Swap supported modules for block ops in place; with `route_sdpa`, also route
    F.scaled_dot_product_attention calls in model.forward to qlower::attention. The swapped
    modules share parameter storage with the originals (no copy needed, state_dicts match).
    transformers' LLaMA-family RMSNorm modules (`variance_epsilon`) become RMSNorm too.
    Exceptions: nn.MultiheadAttention's fused fast path and the block op may differ in the last
    float bit; LSTM/GRU that are bidirectional, projected or bias-free keep PyTorch's kernel."""
    report = ReplaceReport()
    for qualified, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            new_type = REPLACEMENTS.get(type(child))
            if new_type is None and _is_hf_rms_norm(child):
                new_type = bm.RMSNorm
                setattr(module, child_name, _from_hf_rms_norm(child))
            elif new_type is None:
                continue
            else:
                _swap(module, child_name, child, new_type)
            report.replaced[f"{type(child).__module__.split('.')[-1]}.{type(child).__name__} -> "
                            f"qlower.blockops.{new_type.__name__}"] += 1
            report.modules.append(f"{qualified}.{child_name}".lstrip("."))
    if route_sdpa and not getattr(model.forward, "_qlower_sdpa", False):
        forward = model.forward

        @functools.wraps(forward)
        def routed(*args, **kwargs):
            with _SDPAAsBlockOp():
                return forward(*args, **kwargs)
        routed._qlower_sdpa = True
        model.forward = routed
        report.sdpa_routed = True
    return report
