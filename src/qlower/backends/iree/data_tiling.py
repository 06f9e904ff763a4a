"""Which of IREE 3.13's data-tiling paths compiles a cluster: the one that does not miscompile it.

IREE packs matmul operands into its micro-kernels' tiled layout ("data tiling"; int8 products
~3x faster with it) along one of two paths: "dispatch" (`--iree-opt-data-tiling`, from dispatch
creation, IREE's suggested one) and "global" (`--iree-global-opt-data-tiling`, from global
optimization). Each silently computes some programs wrongly (measured, below); neither is wrong
on the other's. So a cluster takes its preferred path (IreeOptions.resolved_for) unless that path
has a hazard in the cluster, then the other path, then no data tiling (every program measured
exact); a compile failure that data tiling causes retries along the same ladder. The report says
which path a cluster took when it is not the preferred one.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch.fx import GraphModule, Node

from ...fx import constant_value, schema_name
from .lowerings import DYN, dims
from .options import IreeOptions

# iree-compile errors that come from data tiling (measured: gone with --iree-opt-data-tiling off)
# ("tiling factors must be less than or equal to the input rank for pack": a 1x2 input through
# a width-1 linear, found by the IREE fuzz run)
DATA_TILING_FAILURES = ("iree_codegen.load_from_buffer", "iree_encoding", "linalg.pack", "rank for pack",
                        "no basis element may be statically non-positive",
                        # the global-optimization path on an fp32 x[:, 0:1:2] -> linear -> RMSNorm
                        # of a 1x2 input (IREE fuzz; the dispatch path compiles it)
                        "expected rank to be smaller or equal to the other rank",
                        # iree-compile crashed (SIGSEGV in dispatch creation's BubbleUpExtract) on the
                        # global path, fp32 linear -> layer_norm -> x[:, 1:4] of a [1, 1] input (IREE
                        # fuzz; the dispatch path compiles it). Any crash is worth
                        # the other path: "Please report issues" heads every iree-compile backtrace.
                        "BubbleUpExtract", "Please report issues to https://github.com/iree-org/iree/issues",
                        # the dispatch path on an fp32 conv -> conv beside softmax -> linear of a
                        # [B, 2, 3, 3] input, B dynamic (IREE fuzz; the global
                        # path and no data tiling compile it)
                        "all stack allocations need to be hoisted")
PATH_NAMES = {"dispatch": "dispatch-creation", "global": "global-optimization"}

_BATCHED_FLOAT_PRODUCTS = ("aten::matmul", "aten::bmm", "aten::baddbmm")


def dispatch_path_hazard(sub: GraphModule) -> str | None:
    """Why the dispatch-creation path must not compile `sub`, or None: it computes these wrongly,
    without any error, at sizes other than the compile-time example's (measured; the
    global-optimization path and no data tiling are exact on all four):
    - a batched int8 matmul (batch > 1) with a dynamic M, K or N ([2,4,S,16] @ [2,4,16,8]: max
      error 8.7 after requantization at S = 2, 17, 20); batch-1 matmuls (every linear, dynamic
      rows included) are exact with it;
    - a batched int8 matmul with a dynamic batch, even with M, K, N static: uint8 activations
      [B,8,16] @ [B,16,8] gave 64 and 111 wrong outputs at B = 2 (the compiled size) and 3,
      [B,3,4] @ [B,4,3] (x @ xᵀ) 6 and 17 — found by the IREE fuzz run with dynamic
      shapes ([B,16,32] @ [B,32,16] and int8 activations are exact, a
      static batch always);
    - any batched int8 matmul (batch > 1), static shapes too: uint8 (x xᵀ) x of x [2, 6, 9] gave
      46 of 108 outputs wrong (max 1.8; exact without data tiling and on the global path; found
      by the IREE fuzz run, with the grammar's `matmul_b`), while x xᵀ alone
      was exact;
    - a float matmul of two batched (rank >= 3) operands with any dynamic dim (linear(x) @ xᵀ
      with only the batch dynamic: max error 6.2 at batches 2 and 3);
    - a float matmul of a batched activation with a dynamic dim by a 2-D weight, followed by
      another product (`x @ W1 @ W2`, `linear(x @ W)`, x [B, 2, 5], B dynamic: max error 10.1
      and 0.74 at batches 2 and 3, exact at 1; found by the IREE fuzz run with dynamic
      shapes; each product alone is exact).
    (The four on both paths: max errors 6.1 / 8.4 / 0.16 / 0 on the
    dispatch path, 0 on the global one.)"""
    for node in sub.graph.nodes:
        if node.op != "call_function":
            continue
        name = schema_name(node)
        tensors = [a.meta.get("val") for a in node.all_input_nodes[:2]]
        if name == "aten::matmul" and len(tensors) == 2 and all(isinstance(t, torch.Tensor) for t in tensors) \
                and tensors[0].dim() >= 3 and tensors[1].dim() == 2 and DYN in dims(tensors[0].shape):
            return "a float matmul of a batched activation with a dynamic dim by a 2-D weight"
        if not all(isinstance(t, torch.Tensor) and t.dim() >= 3 for t in tensors):
            continue
        if name == "qlower::matmul":
            a, b = (dims(t.shape) for t in tensors)
            batch = a[:-2]
            if DYN in batch:
                return "a batched int8 matmul with a dynamic batch"
            if math.prod(batch) != 1 and DYN in (a[-2], a[-1], b[-1]):
                return "a batched int8 matmul with a dynamic M, K or N"
            if math.prod(batch) != 1:
                return "a batched int8 matmul"
        elif name in _BATCHED_FLOAT_PRODUCTS and any(DYN in dims(t.shape) for t in tensors):
            return "a batched float matmul with a dynamic dim"
    return None


# ops that pass their first operand's values through unchanged (only the layout or the shape
# differs): IREE sees through them when it compares a product's operands
_SAME_VALUES = {"aten::transpose", "aten::permute", "aten::t", "aten::view", "aten::reshape", "aten::_unsafe_view",
                "aten::clone", "aten::contiguous", "aten::alias", "aten::unsqueeze", "aten::squeeze",
                "aten::flatten", "aten::expand", "aten::numpy_T", "aten::mT", "aten::mH"}


def global_path_hazard(sub: GraphModule) -> str | None:
    """Why the global-optimization path must not compile `sub`, or None: an integer matmul of a
    value by (a transpose of) itself — x @ xᵀ, or two identical slices of one tensor — with
    both zero points non-zero comes out wrong, silently, on that path (IREE 3.13, static shapes:
    i8 [1,8,16] @ its transpose with zero points 3 and 3, max error 46650 in the int32 products;
    zero points 3 and 0, x @ yᵀ of two tensors, x @ x, and q = x[..., :16] @ (x[..., 16:])ᵀ are
    exact; so are the dispatch path and no data tiling). Found by the IREE fuzz run (an
    RMSNorm then x @ xᵀ, 4 quantization steps off). The check is on the operands'
    values only, not the zero points (uint8 activations are stored as int8 with the zero point
    moved by 128, so nearly always non-zero)."""
    number = _value_numbers(sub)
    for node in sub.graph.nodes:
        if node.op == "call_function" and schema_name(node) == "qlower::matmul":
            a, b = node.args[0], node.args[2]   # qlower::matmul(a, a_zp, b, b_zp)
            if isinstance(a, Node) and isinstance(b, Node) and number[a] == number[b]:
                return "an int8 matmul of a value by its own transpose"
    return None


def _value_numbers(sub: GraphModule) -> dict[Node, int]:
    """A number per node, equal for nodes that compute the same values: through `_SAME_VALUES`
    ops, and for the same op on the same operands (global value numbering, what IREE's CSE
    finds)."""
    numbers: dict[Node, int] = {}
    table: dict[tuple, int] = {}
    for node in sub.graph.nodes:
        if node.op == "call_function" and node.args and isinstance(node.args[0], Node) \
                and schema_name(node).split(".")[0] in _SAME_VALUES:
            numbers[node] = numbers[node.args[0]]
            continue
        if node.op == "call_function":
            key = (str(node.target), _operand_key(node.args, numbers),
                   _operand_key(tuple(node.kwargs.items()), numbers))
        elif node.op == "get_attr":
            key = _constant_key(sub, node)
        else:   # placeholders, the output
            key = (node.op, node.name)
        numbers[node] = table.setdefault(key, len(table))
    return numbers


def _constant_key(sub: GraphModule, node: Node) -> tuple:
    """Small constants (scales, zero points) by value — IREE folds equal ones into one — larger
    ones (weights) by name."""
    value = constant_value(sub, node)
    if isinstance(value, torch.Tensor) and value.numel() <= 16:
        return ("const", str(value.dtype), tuple(value.shape), tuple(value.detach().reshape(-1).tolist()))
    return ("get_attr", node.target)


def _operand_key(args, numbers: dict[Node, int]):
    if isinstance(args, Node):
        return ("node", numbers[args])
    if isinstance(args, (list, tuple)):
        return tuple(_operand_key(a, numbers) for a in args)
    return repr(args)


def _hazard(path: str, sub: GraphModule) -> str | None:
    return dispatch_path_hazard(sub) if path == "dispatch" else global_path_hazard(sub)


def data_tiling_for(options: IreeOptions, sub: GraphModule) -> tuple[IreeOptions, str | None]:
    """`options` (resolved for `sub`'s cluster) changed so that they do not miscompile `sub`, and
    the report's note when they changed: the preferred path, else the other one (on the CPU;
    the global path was never measured on a GPU), else no data tiling."""
    if not options.data_tiling:
        return options, None
    hazard = _hazard(options.data_tiling_path, sub)
    if hazard is None:
        return options, None
    path = options.data_tiling_path
    other = _other(path)
    if not options.is_gpu and _hazard(other, sub) is None:
        return dataclasses.replace(options, data_tiling_path=other), \
            f"with {PATH_NAMES[other]} data tiling ({hazard}: the {PATH_NAMES[path]} path miscompiles it)"
    return dataclasses.replace(options, data_tiling=False), \
        f"without data tiling ({hazard}: IREE 3.13's {PATH_NAMES[path]} path miscompiles it)"


def retry_path(options: IreeOptions, sub: GraphModule, tried: set[str]) -> str | None:
    """The data-tiling path to retry a compile that failed on `options.data_tiling_path` with,
    or None (then: no data tiling): the other path, on the CPU, if not yet tried and it does not
    miscompile `sub`."""
    other = _other(options.data_tiling_path)
    if options.is_gpu or other in tried or _hazard(other, sub) is not None:
        return None
    return other


def _other(path: str) -> str:
    return "global" if path == "dispatch" else "dispatch"
