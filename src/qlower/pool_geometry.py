"""Output-size rules of 2-D pools, shared by the backends whose engines size ceil_mode pools
differently from PyTorch (iree: torch-mlir; openvino: its ONNX frontend).

PyTorch's rule with ceil_mode=True: ceil((n + 2p - d(k-1) - 1) / s) + 1 windows, minus the last
one when it would start in the right padding. ONNX's MaxPool/AveragePool text has no such
correction; ONNX Runtime applies it, OpenVINO does not (measured: n 6, kernel 1, stride 2,
dilation 2: PyTorch 3 windows, OpenVINO 4; found by the openvino fuzz run)."""
from __future__ import annotations

import torch
from torch.fx import Node

from .fx import full_args, schema_name

POOLS = {"aten::max_pool2d": 5, "aten::max_pool2d_with_indices": 5, "aten::avg_pool2d": 4,
         "qlower::max_pool2d": 5}   # schema -> position of ceil_mode


def _size(d) -> int | None:
    return int(d) if isinstance(d, int) else None   # a symbolic dim: None


def pool_geometry(node: Node):
    """(spatial sizes (None where symbolic), kernel, stride, padding, dilation) of a 2-D pool."""
    a = full_args(node)
    pos = POOLS[schema_name(node)]
    pair = (lambda v, default: [int(x) for x in (list(v) * (2 // len(v)) if v else default)])
    kernel = pair(a[1], None)
    stride = pair(a[2], kernel)
    padding = pair(a[3] if not isinstance(a[3], int) else [a[3]], [0, 0])
    dilation = pair(a[4], [1, 1]) if pos == 5 else [1, 1]
    return [_size(d) for d in a[0].meta["val"].shape[-2:]], kernel, stride, padding, dilation


def ceil_mode(node: Node) -> bool:
    """A 2-D pool with ceil_mode=True."""
    return schema_name(node) in POOLS and bool(full_args(node)[POOLS[schema_name(node)]])


def window_span(n: int, k: int, p: int, d: int) -> int:
    """How far the first window's start can move: n + 2p - d(k - 1) - 1 (floor mode has
    span // stride + 1 windows)."""
    return n + 2 * p - d * (k - 1) - 1


def _windows(n: int, k: int, s: int, p: int, d: int) -> tuple[int, int, int]:
    """(floor-mode windows, ceil-mode windows as ONNX's formula gives them, PyTorch's ceil-mode)."""
    span = window_span(n, k, p, d)
    onnx_ceil = -(-span // s) + 1
    torch_ceil = onnx_ceil - 1 if (onnx_ceil - 1) * s >= n + p else onnx_ceil
    return span // s + 1, onnx_ceil, torch_ceil


def _any_spatial_dim(node: Node, differs) -> bool | None:
    """Whether `differs(floor, onnx_ceil, torch_ceil)` holds for some spatial dim (None: a
    dynamic spatial dim, unknown)."""
    sizes, *geometry = pool_geometry(node)
    if any(n is None for n in sizes):
        return None
    return any(differs(*_windows(n, *kspd)) for n, *kspd in zip(sizes, *geometry))


def window_exceeds_input(node: Node) -> bool | None:
    """Whether a (dilated) pooling window is larger than the padded input in some spatial dim
    (window_span < 0; PyTorch's ceil mode still makes one window of it). None: a dynamic
    spatial dim, unknown."""
    return _any_spatial_dim(node, lambda floor, onnx_ceil, torch_ceil: floor < 1)


def window_entirely_in_padding(node: Node) -> bool | None:
    """Whether some window of the pool (PyTorch's count, ceil_mode included) covers no input
    element at all, only padding (a dilated window on a narrow input): PyTorch's max-pool gives
    -inf there. None: a dynamic spatial dim, unknown."""
    sizes, *geometry = pool_geometry(node)
    if any(n is None for n in sizes):
        return None
    for n, k, s, p, d in zip(sizes, *geometry):
        floor, _, torch_ceil = _windows(n, k, s, p, d)
        for i in range(max(torch_ceil if ceil_mode(node) else floor, 0)):
            if not any(0 <= i * s - p + j * d < n for j in range(k)):
                return True
    return False


def ceil_mode_window_overhangs(node: Node) -> bool | None:
    """Whether the last window PyTorch's ceil rule keeps reaches past the padded input in some
    spatial dim (PyTorch's avg_pool2d divides such a window by the part inside input + padding).
    None: a dynamic spatial dim, unknown."""
    if not ceil_mode(node):
        return False

    def overhangs(n, k, s, p, d):
        torch_ceil = _windows(n, k, s, p, d)[2]
        return (torch_ceil - 1) * s + d * (k - 1) + 1 > n + 2 * p
    sizes, *geometry = pool_geometry(node)
    if any(n is None for n in sizes):
        return None
    return any(overhangs(n, *kspd) for n, *kspd in zip(sizes, *geometry))


def ceil_mode_resizes_beside_a_single_window(node: Node) -> bool | None:
    """Whether ceil_mode changes the output size of one spatial dim while another has a single
    window (None: a dynamic spatial dim, unknown)."""
    if not ceil_mode(node):
        return False
    sizes, *geometry = pool_geometry(node)
    if any(n is None for n in sizes):
        return None
    windows = [_windows(n, *kspd) for n, *kspd in zip(sizes, *geometry)]
    return any(torch_ceil != floor for floor, _, torch_ceil in windows) \
        and any(torch_ceil == 1 for _, _, torch_ceil in windows)


def ceil_mode_is_noop(node: Node) -> bool | None:
    """Whether a ceil_mode=True pool has the same output size as with ceil_mode=False (None:
    unknown, a dynamic spatial dim)."""
    changes = _any_spatial_dim(node, lambda floor, onnx_ceil, torch_ceil: torch_ceil != floor)
    return None if changes is None else not changes


def ceil_mode_drops_a_window(node: Node) -> bool | None:
    """Whether PyTorch's ceil rule drops the last window that ONNX's formula keeps (None:
    unknown, a dynamic spatial dim)."""
    return _any_spatial_dim(node, lambda floor, onnx_ceil, torch_ceil: onnx_ceil != torch_ceil)


def drop_noop_ceil_mode(gm: torch.fx.GraphModule) -> int:
    """Set ceil_mode=False on every 2-D pool where it does not change the output (an identical
    computation). torch-mlir's ceil-mode pool lowering mis-sizes exactly these and iree-compile
    rejects the module ("'linalg.generic' op inferred input/output operand ... dimension"):
    measured over max/avg pools (count_include_pad False and True) with n in 3..9, kernel 1-4,
    stride 1-4, padding 0..k//2, all 42 failures of 376 were such no-op cases. Returns how many
    pools changed."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or not ceil_mode(node) or not ceil_mode_is_noop(node):
            continue
        pos = POOLS[schema_name(node)]
        if len(node.args) > pos:
            node.update_arg(pos, False)
        else:
            node.update_kwarg("ceil_mode", False)
        changed += 1
    if changed:
        gm.recompile()
    return changed
