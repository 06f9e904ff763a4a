"""WeightOnlyLinear: linears with constant float weights become weight-only quantized ops.

Run by weight-only quantization (`quantize/weight_only.py`) on the captured float graph, before
the program is exported again; the codes come from round-to-nearest with the numerics' group
qparams, or are given per weight (GPTQ chooses its own roundings: `codes=`).

Preconditions: the graph is float (no Q/DQ); weights are `get_attr` constants ([N, K] fp32).
BEFORE:  y = aten.linear(x, w, b)                       # w: get_attr, b: get_attr or None
AFTER:   y = qlower.linear_weight_only(x, w_codes, w_scale, w_zero_point, b, bits, group_size)
         with w_codes uint8 [N, K], w_scale fp32 [N, G], w_zero_point uint8 [N, G] new buffers
         next to w (numerics.weight_only_qparams / quantize_weight_groups); w itself is removed
         from the module (under each of its names) once nothing reads it.
With `embeddings`: e = aten.embedding(w, ids) ⇒ qlower.embedding_weight_only(ids, w_codes, ...)
         and a linear sharing w (a tied lm_head) reads the same codes, quantized in `table`'s
         scheme (bits, group size, symmetric; default the linears').
Not fired: a weight that is not a 2-D fp32 get_attr (a computed weight, a parameter of another
dtype); a weight an embedding also reads, unless `embeddings` (a tied lm_head stays float by
default, and so does its embedding); a linear inside a module listed in `keep_float`.
Postconditions: every rewritten op computes numerics.linear_weight_only of its codes, equal to
aten.linear on the dequantized weight bit for bit. Idempotent: the rewritten ops are not linears.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .. import numerics
from .base import Pass, PassContext

aten = torch.ops.aten
_q = torch.ops.qlower
Codes = tuple[torch.Tensor, torch.Tensor, torch.Tensor]   # (codes uint8 [N, K], scale [N, G], zero point [N, G])


def constant(gm: GraphModule, target: str) -> torch.Tensor:
    *path, name = target.split(".")
    return getattr(gm.get_submodule(".".join(path)), name)


def round_to_nearest(w: torch.Tensor, bits: int, group_size: int, symmetric: bool) -> Codes:
    """The round-to-nearest codes of a float weight [N, K] with the numerics' group qparams."""
    scale, zp = numerics.weight_only_qparams(w, bits, group_size, symmetric)
    return numerics.quantize_weight_groups(w.detach().float(), scale, zp, bits, group_size), scale, zp


def in_kept_module(node: Node, keep_float: tuple[str, ...]) -> bool:
    stack = node.meta.get("nn_module_stack") or {}
    paths = [str(v[0]) for v in stack.values()]
    return any(p == k or p.startswith(k + ".") for p in paths for k in keep_float)


def weight_targets(gm: GraphModule, embeddings: bool, keep_float: tuple[str, ...] = ()) -> dict[str, list[Node]]:
    """get_attr target -> the linear / embedding nodes that read it and are rewritten."""
    readers: dict[str, list[Node]] = {}
    embedded: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is aten.linear.default:
            w = node.args[1]
        elif node.target is aten.embedding.default:
            w = node.args[0]
        else:
            continue
        if not (isinstance(w, Node) and w.op == "get_attr"):
            continue
        value = constant(gm, w.target)
        if not (isinstance(value, torch.Tensor) and value.dim() == 2 and value.dtype == torch.float32):
            continue
        if node.target is aten.embedding.default:
            embedded.add(w.target)
        if keep_float and in_kept_module(node, keep_float):
            readers.setdefault(w.target, []).append(None)   # a kept reader keeps the weight float
            continue
        readers.setdefault(w.target, []).append(node)
    out = {}
    for target, nodes in readers.items():
        if any(n is None for n in nodes) or (target in embedded and not embeddings):
            continue
        out[target] = nodes
    return out


def embedded_weights_kept(gm: GraphModule) -> int:
    """Embedding tables (with the linears sharing them) that stay float without `embeddings`."""
    return len(set(weight_targets(gm, True)) - set(weight_targets(gm, False)))


def _other_uses(gm: GraphModule, target: str, rewritten: list[Node]) -> bool:
    """True when some node other than the rewritten ones reads the weight (it stays as well)."""
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target == target:
            if any(u not in rewritten for u in node.users):
                return True
    return False


class WeightOnlyLinear(Pass):
    name = "weight_only_linear"

    def __init__(self, bits: int = 4, group_size: int | None = 128, symmetric: bool = False,
                 embeddings: bool = False, codes: dict[str, Codes] | None = None,
                 keep_float: tuple[str, ...] = (), table: tuple[int, int | None, bool] | None = None):
        self.bits, self.group_size, self.symmetric = bits, group_size, symmetric
        self.embeddings, self.codes, self.keep_float = embeddings, codes or {}, keep_float
        self.table = table or (bits, group_size, symmetric)

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        kept = 0 if self.embeddings else embedded_weights_kept(gm)
        if kept:
            ctx.rewrites["embedding tables (and a tied lm_head) kept float; WeightOnly(embeddings=True) "
                         "quantizes them"] += kept
        for target, nodes in weight_targets(gm, self.embeddings, self.keep_float).items():
            w = constant(gm, target)
            is_table = any(n.target is aten.embedding.default for n in nodes)
            bits, group_size, symmetric = self.table if is_table else (self.bits, self.group_size, self.symmetric)
            group = group_size or w.shape[1]
            codes, scale, zp = self.codes.get(target) or round_to_nearest(w, bits, group, symmetric)
            *path, name = target.split(".")
            owner = gm.get_submodule(".".join(path))
            names = []
            for suffix, value in (("codes", codes), ("scale", scale), ("zero_point", zp)):
                attr = f"{name}_wo_{suffix}"
                owner.register_buffer(attr, value.contiguous())
                names.append(".".join([*path, attr]))
            keep = _other_uses(gm, target, nodes)
            for node in nodes:
                with gm.graph.inserting_before(node):
                    c, s, z = (gm.graph.get_attr(n) for n in names)
                    for attr, value in zip((c, s, z), (codes, scale, zp)):
                        attr.meta["val"] = _fake_like(node, value)
                    if node.target is aten.linear.default:
                        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
                        new = gm.graph.call_function(_q.linear_weight_only.default,
                                                     (node.args[0], c, s, z, bias, bits, group))
                        ctx.rewrites[f"linear -> {bits}-bit weight-only linear"] += 1
                    else:
                        new = gm.graph.call_function(_q.embedding_weight_only.default,
                                                     (node.args[1], c, s, z, bits, group))
                        ctx.rewrites[f"embedding -> {bits}-bit weight-only embedding"] += 1
                new.meta = {k: v for k, v in node.meta.items() if k in ("val", "nn_module_stack", "stack_trace")}
                node.replace_all_uses_with(new)
                gm.graph.erase_node(node)
            if not keep:
                _drop_float_weight(gm, w)
            changed = True
        if changed:
            gm.graph.lint()
            gm.recompile()
        return changed


def _drop_float_weight(gm: GraphModule, w: torch.Tensor) -> None:
    """Remove the float weight (under every name it has: a tied weight has several) once no
    node reads it, so the program does not hold it next to its codes."""
    names = [n for n, t in [*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)]
             if t is w]
    readers = [n for n in gm.graph.nodes if n.op == "get_attr" and n.target in names]
    if any(n.users for n in readers):
        return
    for node in readers:
        gm.graph.erase_node(node)
    for name in names:
        *path, attr = name.split(".")
        owner = gm.get_submodule(".".join(path))
        owner._parameters.pop(attr, None)
        owner._buffers.pop(attr, None)


def _fake_like(node: Node, value: torch.Tensor):
    """A fake tensor of `value`'s shape and dtype in the fake mode of `node`'s value, if any."""
    val = node.meta.get("val")
    mode = getattr(val, "fake_mode", None)
    if mode is None:
        return value
    return mode.from_tensor(value)
