"""MoveErrorChecksOutside (onnxruntime legalization): a linear-algebra op that raises in eager on a
singular or not positive-definite input becomes its `_ex` form, which returns `info` instead
of raising, plus eager's own check of that `info` — a call that returns nothing, so clustering
leaves it in PyTorch (a graph assertion), where it raises exactly as eager does.

Why: an ONNX graph cannot raise, so these ops would stay in PyTorch whole (OpInfo: linalg.inv,
linalg.solve, linalg.cholesky, cholesky, linalg.lu_factor, linalg.tensorinv and
linalg.tensorsolve fall back). Their `_ex` forms are decomposed for ONNX Runtime
(linear_algebra.py); the check costs one int32 tensor out of the cluster and a test of it.

Preconditions: meta['val'] on the op's inputs, static shapes (the `_ex` decompositions unroll
over the matrix size: a symbolic size stays in PyTorch anyway).
BEFORE:  y = aten.linalg_inv(a)
AFTER:   r = aten.linalg_inv_ex(a);  y = r[0];  aten._linalg_check_errors(r[1], "linalg.inv", is_matrix)
         (torch's own CompositeImplicitAutograd decomposition of the op, traced on the node's
         shapes: the same `_ex` call and the same check, so the same error message;
         tensorinv / tensorsolve keep their views around it; `cholesky`, a kernel of its own,
         becomes linalg_cholesky_ex and a check named "cholesky")
Near misses left alone: every other op; these ops on symbolic shapes.
Postconditions: values identical; the same inputs raise the same error. Idempotent: the `_ex`
forms and the check are not rewritten.
"""
from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.experimental.proxy_tensor import make_fx

from ...fx import call, replace_results, splice
from ..base import Pass, PassContext

A = torch.ops.aten


def _cholesky(a, upper=False):
    """torch.cholesky as linalg_cholesky_ex + the check (the kernel raises with this name)."""
    factor, info = A.linalg_cholesky_ex.default(a, upper=upper)
    A._linalg_check_errors.default(info, "cholesky", is_matrix=a.dim() == 2)
    return factor


# the op -> what to trace for it (torch's CompositeImplicitAutograd decomposition where it has one)
RAISING = {
    A.linalg_inv.default: A.linalg_inv.default,
    A.linalg_solve.default: A.linalg_solve.default,
    A.linalg_cholesky.default: A.linalg_cholesky.default,
    A.linalg_lu_factor.default: A.linalg_lu_factor.default,
    A.linalg_tensorinv.default: A.linalg_tensorinv.default,
    A.linalg_tensorsolve.default: A.linalg_tensorsolve.default,
    A.cholesky.default: _cholesky,
}


def _static_tensor_inputs(node: Node) -> list[Node] | None:
    inputs = node.all_input_nodes
    vals = [a.meta.get("val") for a in inputs]
    if all(isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape) for v in vals):
        return inputs
    return None


def _traced(node: Node, inputs: list[Node]) -> torch.fx.Graph:
    """The op's decomposition on meta tensors of the inputs' shapes (nothing computed; the
    check's meta kernel does nothing)."""
    positions = [i for i, a in enumerate(node.args) if isinstance(a, Node)]

    def bound(*tensors):
        args = list(node.args)
        for i, t in zip(positions, tensors):
            args[i] = t
        return RAISING[node.target](*args, **node.kwargs)
    examples = [torch.empty(a.meta["val"].shape, dtype=a.meta["val"].dtype, device="meta") for a in inputs]
    return make_fx(bound)(*examples).graph


class MoveErrorChecksOutside(Pass):
    name = "move_error_checks_outside"

    def run(self, gm: GraphModule, ctx: PassContext) -> bool:
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in RAISING:
                continue
            inputs = _static_tensor_inputs(node)
            if inputs is None or any(isinstance(a, Node) for a in node.kwargs.values()):
                continue
            graph = _traced(node, inputs)
            if not any(n.target is A._linalg_check_errors.default for n in graph.nodes):
                continue
            result = splice(gm, graph, inputs, node, lambda n, env: _copy(gm, n, env, node))
            replace_results(node, result)
            gm.graph.erase_node(node)
            ctx.rewrites[f"{node.target.name()} -> _ex + check"] += 1
            changed = True
        if changed:
            gm.recompile()
        return changed


def _copy(gm: GraphModule, n: Node, env: dict, like: Node) -> Node:
    args = torch.fx.node.map_arg(n.args, env.__getitem__)
    kwargs = torch.fx.node.map_arg(n.kwargs, env.__getitem__)
    return call(gm, n.target, args, kwargs, like=like)
