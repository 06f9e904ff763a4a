"""Subgraph patterns that more than one stage recognizes: the quantizer annotates them and a pass
rewrites them, so the shape of the subgraph is written down once, here."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import Node

aten = torch.ops.aten


@dataclass(frozen=True)
class RmsNorm:
    """x * rsqrt(mean(x^2, -1, keepdim) + eps) [* weight]: an RMSNorm over the last dim written
    out (transformers' LlamaRMSNorm and its LLaMA-family copies, qlower's own decomposition).
    `squared` and `scaled` are the x that pow and the normalizing mul read: the same node in a
    float graph, possibly two dequantizes of one quantized value after PT2E's convert."""
    squared: Node
    scaled: Node
    eps: float
    weight: Node | None
    nodes: tuple[Node, ...]     # pow .. the last mul, in graph order
    output: Node                # the last mul (the weighted one when there is a weight)

    @property
    def normalizing_mul(self) -> Node:
        """x * rsqrt(...): the second reader of x."""
        return self.nodes[4]


def _sole_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _other(node: Node, known: Node):
    """The operand of a binary `node` that is not `known` (None when both are)."""
    a, b = node.args[:2]
    return b if a is known else a if b is known else None


def match_rms_norm(pow_node: Node) -> RmsNorm | None:
    """The RMSNorm that starts at `pow_node` (an aten.pow(x, 2)), or None. Every intermediate has
    one user, so the whole chain can be replaced."""
    if pow_node.op != "call_function" or pow_node.target is not aten.pow.Tensor_Scalar \
            or pow_node.args[1] not in (2, 2.0) or not isinstance(pow_node.args[0], Node):
        return None
    x = pow_node.args[0]
    val = x.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() == 0 or val.dtype != torch.float32:
        return None
    mean = _sole_user(pow_node)
    if mean is None or mean.target is not aten.mean.dim or mean.args[0] is not pow_node \
            or not isinstance(mean.args[1], (list, tuple)) or [d % val.dim() for d in mean.args[1]] != [val.dim() - 1] \
            or not (len(mean.args) > 2 and mean.args[2] or mean.kwargs.get("keepdim")):
        return None
    add = _sole_user(mean)
    if add is None or add.target is not aten.add.Tensor or add.args[0] is not mean \
            or not isinstance(add.args[1], (int, float)) or add.kwargs.get("alpha", 1) != 1:
        return None
    rsqrt = _sole_user(add)
    if rsqrt is None or rsqrt.target is not aten.rsqrt.default:
        return None
    scale = _sole_user(rsqrt)
    if scale is None or scale.target is not aten.mul.Tensor:
        return None
    scaled = _other(scale, rsqrt)
    if not isinstance(scaled, Node) or scaled.meta.get("val") is None \
            or tuple(scaled.meta["val"].shape) != tuple(val.shape):
        return None
    nodes = (pow_node, mean, add, rsqrt, scale)
    weighted, weight = _weight_of(scale, int(val.shape[-1]) if isinstance(val.shape[-1], int) else None)
    if weighted is not None:
        nodes += (weighted,)
    return RmsNorm(x, scaled, float(add.args[1]), weight, nodes, weighted or scale)


def _weight_of(scale: Node, n: int | None) -> tuple[Node | None, Node | None]:
    """(the mul by a 1-D fp32 weight of N entries after `scale`, that weight), or (None, None)."""
    mul = _sole_user(scale)
    if mul is None or mul.target is not aten.mul.Tensor or n is None:
        return None, None
    weight = _other(mul, scale)
    val = weight.meta.get("val") if isinstance(weight, Node) else None
    if weight is None or weight.op != "get_attr" or not isinstance(val, torch.Tensor) \
            or val.dtype != torch.float32 or tuple(val.shape) != (n,):
        return None, None
    return mul, weight
