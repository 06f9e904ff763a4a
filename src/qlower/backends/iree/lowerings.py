"""The registry of per-op lowerings the IREE backend's capability is derived from.

Two kinds, because a cluster is compiled by one of two routes (docs/iree.md says why):
- "tosa": qlower's integer ops (and shape ops on integer tensors), emitted by qlower itself as
  TOSA (+ arith on tensors where TOSA has no exact form, e.g. IEEE division in quantize);
  each has an emit function (tosa_ops.py) and a check that names what it cannot express.
- "torch": float ATen ops, imported by torch's FX importer (shipped with iree-base-compiler)
  into the torch dialect and lowered by IREE; there is no per-op table for these, only one
  check (float tensors, no data-dependent sizes, no mutation).
- "size": arithmetic on symbolic sizes (dynamic shapes): nothing is emitted for it in a TOSA
  module (emitters read sizes from the graph's shapes); the FX importer imports it.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.fx import Node

from ...fx import full_args, schema_name
from ...partition import holds_empty_tensor
from ..cluster_sizes import is_size
from ...pool_geometry import (POOLS, ceil_mode, ceil_mode_is_noop, ceil_mode_resizes_beside_a_single_window,
                              pool_geometry, window_span)

Check = Callable[[Node], Optional[str]]   # None: lowerable; else the reason it is not
Emit = Callable[..., object]              # emit(emitter, node, args) -> Val


@dataclass(frozen=True)
class Lowering:
    kind: str                 # "tosa" | "torch"
    check: Check
    emit: Emit | None = None  # tosa lowerings only


TOSA_LOWERINGS: dict[str, Lowering] = {}
INTEGER_DTYPES = (torch.int8, torch.uint8, torch.int32)


def tosa_lowering(*names: str, check: Check | None = None, dynamic_dims: bool = False):
    """Register `emit` as the TOSA lowering of op schemas `names` (guarded by `check`).
    `dynamic_dims`: the emitter handles any number of dynamic dims per tensor (elementwise ops,
    and reshapes through Builder.reshape's run-time sizes); otherwise at most one."""
    def register(emit: Emit) -> Emit:
        for name in names:
            TOSA_LOWERINGS[name] = Lowering("tosa", _all_of(data_dependent if dynamic_dims else tosa_shapes, check),
                                            emit)
        return emit
    return register


def _all_of(*checks: Check | None) -> Check:
    def check(node: Node) -> str | None:
        for c in checks:
            why = c(node) if c is not None else None
            if why is not None:
                return why
        return None
    check.__doc__ = next((c.__doc__ for c in reversed(checks) if c is not None and c.__doc__), None)
    return check


def tensor_vals(node: Node) -> list[torch.Tensor]:
    """The (fake) tensors a node reads and produces, from meta['val']."""
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    out = []
    for v in vals:
        out += [t for t in (v if isinstance(v, (tuple, list)) else [v]) if isinstance(t, torch.Tensor)]
    return out


DYN = -1   # a dynamic (symbolic) dim in the emitter's shapes: `?` in MLIR, -1 in tosa.reshape


def dims(shape) -> list[int]:
    """A (fake) tensor's shape with every symbolic dim as DYN."""
    out = []
    for d in shape:
        if not isinstance(d, int):
            d = d.node.maybe_as_int() if hasattr(d, "node") else None
        out.append(DYN if d is None else int(d))
    return out


def data_dependent(node: Node) -> str | None:
    """no data-dependent (unbacked) sizes"""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    for t in tensor_vals(node):
        if free_unbacked_symbols(t):
            return "data-dependent sizes are not lowered by the iree backend"
    return None


def tosa_shapes(node: Node) -> str | None:
    """at most one dynamic dim per tensor"""
    why = data_dependent(node)
    if why is not None:
        return why
    for t in tensor_vals(node):
        if dims(t.shape).count(DYN) > 1:
            return "more than one dynamic dim in a tensor (TOSA reshapes infer one -1 dim only)"
    return None


def static_dims(node: Node, tensor, which, what: str) -> str | None:
    """None when dims `which` of `tensor` (a fake tensor) are static, else the reason."""
    d = dims(tensor.shape)
    if any(d[i] == DYN for i in which):
        return f"{what} must be static"
    return None


def symbolic_size(node: Node) -> str | None:
    """a size computation (dynamic shapes): TOSA emitters read sizes from the graph's shapes,
    the FX importer imports it"""
    return data_dependent(node) if is_size(node) else "not a size computation on SymInts"


def integer_input(node: Node) -> str | None:
    """first input is an int8/uint8/int32 tensor"""
    first = node.all_input_nodes[0].meta.get("val") if node.all_input_nodes else None
    if not isinstance(first, torch.Tensor) or first.dtype not in INTEGER_DTYPES:
        return "not an integer tensor (float shape ops go through the torch importer)"
    return None


def kind_of(node: Node) -> str | None:
    """'tosa', 'torch' or 'size': the route a supported node takes (None when neither accepts
    it); 'size' nodes compute symbolic sizes only (no MLIR value in a TOSA module)."""
    if is_size(node):
        return "size" if data_dependent(node) is None else None
    if node.target is operator.getitem:   # an output pick goes where its producer goes
        producer = node.args[0]
        return kind_of(producer) if isinstance(producer, Node) else None
    lowering = TOSA_LOWERINGS.get(schema_name(node))
    if lowering is not None and lowering.check(node) is None:
        return "tosa"
    return "torch" if float_check(node) is None else None


# Ops torch-mlir leaves as `torch.operator`: iree-compile fails the whole module ("failed to
# legalize operation 'torch.operator' that was explicitly marked illegal"). Measured: the
# recurrent ops on nn.LSTM, nn.GRU and nn.RNN alone and on the zoo LSTM (where the failure took
# the int8 front-end conv with it); index_copy (a static KV cache's update) on the zoo hf-llama-kv;
# diff (SmolLM2's position ids) on hf-real-smollm2-s128. The rest measured one op at a time on a
# [2, 3, 8] input (39 float ops tried, iree-compile 3.13 failed these 16; tests/test_iree.py):
# cummax/cummin, median/nanmedian/mode, searchsorted, histc, lgamma/digamma, i0, hypot, cdist as
# `torch.operator`; kthvalue ("'tm_tensor.topk' op region block must end with a linalg_ext.yield
# i1"); logsumexp and fmod (their scalar arguments: "failed to legalize 'torch.constant.int' /
# 'torch.constant.float'"); erfinv ("failed to legalize 'torch.aten.erfinv'"). upsample_bilinear2d
# (both overloads, static or dynamic): "failed to legalize 'torch.constant.int'"
# (its size list).
_NOT_LEGALIZED = frozenset({"aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu", "aten::index_copy",
                            "aten::diff", "aten::cummax", "aten::cummin", "aten::median", "aten::nanmedian",
                            "aten::mode", "aten::kthvalue", "aten::searchsorted", "aten::histc", "aten::logsumexp",
                            "aten::erfinv", "aten::lgamma", "aten::digamma", "aten::i0", "aten::fmod",
                            "aten::hypot", "aten::cdist", "aten::_cdist_forward",
                            "aten::upsample_bilinear2d",
                            # linear algebra (4x4 float inputs): "failed to
                            # legalize operation 'torch.aten.linalg_qr'" / "'torch.operator'";
                            # linalg_det, linalg_slogdet, linalg_cross and linalg_vector_norm compile
                            *(f"aten::linalg_{op}" for op in ("qr", "cholesky", "cholesky_ex", "inv", "inv_ex", "svd",
                                                              "svdvals", "eigh", "eigvalsh", "eig", "eigvals", "solve",
                                                              "solve_ex", "pinv", "matrix_norm", "norm",
                                                              "solve_triangular", "lu", "lu_factor", "lu_factor_ex",
                                                              "lu_solve", "lstsq", "matrix_rank", "cond",
                                                              "householder_product", "ldl_factor", "ldl_factor_ex",
                                                              "ldl_solve", "tensorinv", "tensorsolve", "matrix_exp")),
                            "aten::_linalg_svd", "aten::_linalg_eigh", "aten::cholesky", "aten::cholesky_solve",
                            "aten::cholesky_inverse", "aten::triangular_solve", "aten::geqrf", "aten::ormqr",
                            "aten::svd", "aten::qr", "aten::lu_unpack", "aten::pinverse", "aten::matrix_exp",
                            # measured: the window functions and the FFTs with a real
                            # result stay `torch.operator` (the complex ones are refused by dtype)
                            *(f"aten::{w}_window" for w in ("hann", "hamming", "blackman", "bartlett", "kaiser")),
                            *(f"aten::fft_{f}{d}" for f in ("irfft", "hfft") for d in ("", "2", "n")),
                            "aten::_fft_c2r"})
# (some decomposed first: backend._decompose_ops_iree_lacks)

# Compiled, reported as compiled, and answered wrongly (PyTorch's OpInfo
# samples through `tests/test_opinfo.py --backend iree`): logcumsumexp inf everywhere;
# grid_sample (torch-mlir's own decomposition of grid_sampler) off by up to 2.6e33, reading
# outside its input; max_unpool with a repeated index kept another write than eager's last one.
_WRONG_ON_IREE = frozenset({"aten::logcumsumexp", "aten::grid_sampler", "aten::grid_sampler_2d",
                            "aten::grid_sampler_3d", "aten::max_unpool2d", "aten::max_unpool3d"})

# Boolean mask arithmetic (transformers' attention masks) imports and matches, measured op by op
# on IREE 3.13 (refused wholesale, it costs 15 PyTorch fallbacks on a
# MiniLM-size encoder): to(bool), ge/gt, ~, logical_not/and, bitwise_and, |, *, expand, index,
# where, masked_fill, to(float) all compile. `&` / `^` and boolean tensors created from a shape
# (new_ones(dtype=bool): "failed to legalize 'torch.vtensor.literal' ... dense<true>") do not as
# they are: the legalizations bitwise_operators.py and boolean_constants.py rewrite them before
# clustering, so nothing here refuses them.

# Float dtypes torch has and numpy (through which the runner hands tensors to IREE) has not.
_NOT_IN_NUMPY = frozenset({torch.bfloat16, torch.complex32} |
                          {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                       "float8_e5m2fnuz") if hasattr(torch, n)})


def float_check(node: Node) -> str | None:
    """float ATen op (static or symbolic sizes), through torch's FX importer"""
    if node.target is operator.getitem:
        producer = node.args[0]
        return None if isinstance(producer, Node) and float_check(producer) is None else "getitem of a non-float op"
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.name.startswith(("aten::", "prims::")):
        return "no IREE lowering (not an ATen op)"
    if schema.is_mutable:
        return "mutates its input (module state stays in PyTorch)"
    if schema.name in _NOT_LEGALIZED:
        return f"{schema.name} is not legalized by torch-mlir in iree-compile"
    if schema.name in _WRONG_ON_IREE:
        return f"{schema.name} compiles but answers wrongly on IREE (measured on PyTorch's OpInfo samples)"
    if schema.name in ("aten::index_put", "aten::_unsafe_index_put") and _accumulates(node):
        # measured: index_put(accumulate=True) with a repeated index off by
        # 1.5 on a 4x5 input, in silence (IREE keeps one of the repeated writes)
        return "index_put with accumulate=True loses repeated indices in IREE"
    vals = tensor_vals(node)
    if any(t.dtype in (torch.int8, torch.uint8) for t in vals):
        return "reads or produces a quantized integer tensor outside qlower's integer ops"
    if any(t.dtype.is_complex for t in vals):
        # measured: fft / stft / abs of a complex tensor fail in
        # iree-compile ("failed to legalize operation 'torch.constant...'", "'math.absf' op
        # operand ... complex"): refused here instead of accepted and then dropped by the compiler
        return "complex tensors are not lowered by iree-compile's torch input"
    unheld = next((t.dtype for t in vals if t.dtype in _NOT_IN_NUMPY), None)
    if unheld is not None:   # measured: a bfloat16 model's call raised "unsupported ScalarType BFloat16"
        return f"dtype {unheld} has no numpy equivalent to hand to IREE"
    pool = _noop_ceil_pool(node) or _ceil_pool_beside_a_single_window(node) or _short_single_window_pool(node) \
        or _short_single_window_conv(node)
    if pool is not None:
        return pool
    if holds_empty_tensor(node):
        # measured: var / std of nothing 0 (eager NaN), iree-compile failing
        # on multi-dim sums, nansum, group_norm and K = 0 matmuls of empty tensors
        return "an empty tensor (IREE computes some ops on one wrongly and fails to compile others)"
    return data_dependent(node)


def _accumulates(node: Node) -> bool:
    accumulate = node.kwargs.get("accumulate", node.args[3] if len(node.args) > 3 else False)
    return bool(accumulate)


def not_in_a_float_module(node: Node) -> str | None:
    """Why float op `node` cannot be part of an all-float (torch-dialect) module, or None:
    advanced indexing with two or more 1-D index tensors of dynamic length (CLIP's pooled output
    `h[arange(batch), ids.argmax(-1)]` with the batch dynamic): IREE's torch input pipeline fails
    to legalize `torch.aten.index.Tensor_hacked_twin` and the whole cluster would fall back
    (found by a model sweep). Measured: one index tensor, several of static length, broadcast-shaped
    ones (GPT-2's mask: [B, 1, 1, 1] with [1, 1, S, 1]), and the same op imported alone into an
    int8 (TOSA) module compile."""
    if getattr(node.target, "_schema", None) is None or node.target._schema.name != "aten::index":
        return None
    indices = [i.meta.get("val") for i in (node.args[1] if len(node.args) > 1 else []) if isinstance(i, Node)]
    flat = [t for t in indices if isinstance(t, torch.Tensor) and t.dim() == 1 and DYN in dims(t.shape)]
    if len(flat) < 2:
        return None
    return "advanced indexing with several 1-D index tensors of dynamic length (torch-mlir fails to legalize it)"


def _short_single_window_pool(node: Node) -> str | None:
    """A float pool with ONE window per spatial dim that stops short of the input's end: torch-
    mlir mis-sizes it and iree-compile rejects the module. Measured over max/avg pools with n in
    5..8, kernel 1-3, stride 1-4 (tests/test_iree.py): the 8 failures were exactly these
    (e.g. n 5, kernel 2, stride 4); one window that ends at the input's end, or two windows
    with a remainder (n 7, kernel 2, stride 3), compile and match. Found by the IREE fuzz run."""
    if schema_name(node) not in POOLS or node.target is torch.ops.qlower.max_pool2d.default or ceil_mode(node):
        return None
    sizes, kernel, stride, padding, dilation = pool_geometry(node)
    for n, k, s, p, d in zip(sizes, kernel, stride, padding, dilation):
        if n is not None and 0 < window_span(n, k, p, d) < s:
            return "a pool whose single window stops short of the input's end is mis-sized by torch-mlir"
    return None


def _short_single_window_conv(node: Node) -> str | None:
    """A float 2-D conv (kernel > 1) with ONE window in a spatial dim that stops short of the
    input's end: the pool mis-sizing above, in torch-mlir's conv lowering ("'linalg.generic' op
    inferred input/output operand #1 has shape's dimension #1 to be 4, but found 3"). Measured
    over conv2d with H 3-8 x W 6, kernel 1-3, stride 1-4, padding 0-1: the 19 compile failures
    of 144 were exactly these (1x1 kernels compile). Found by the IREE fuzz run.
    The PadSingleWindowConvs legalization rewrites aten.conv2d of this kind (all 144 compile and
    match with it); this refuses what it leaves (other conv forms)."""
    if schema_name(node) not in ("aten::conv2d", "aten::convolution"):
        return None
    x, w, _, stride, padding, dilation = full_args(node)[:6]
    if isinstance(padding, str) or len(x.meta["val"].shape) != 4:
        return None
    for n, k, s, p, d in zip(x.meta["val"].shape[-2:], w.meta["val"].shape[-2:], stride, padding, dilation):
        if isinstance(n, int) and k > 1 and 0 < window_span(n, k, p, d) < s:
            return "a conv whose single window stops short of the input's end is mis-sized by torch-mlir"
    return None


def _ceil_pool_beside_a_single_window(node: Node) -> str | None:
    """A float ceil_mode pool that adds a window in one spatial dim while the other has a single
    window: torch-mlir mis-sizes it and iree-compile rejects the module ("'linalg.generic' op
    inferred input/output operand #1 has shape's dimension #1 to be 6, but found 3"). Measured over
    avg pools with H 1-7 x W 1/3/4, kernel 2-3, stride 1-3, every padding pair, both
    count_include_pad: all 86 compile failures (of 198 pools where ceil mode resizes one dim
    but not the other) were exactly these; pools where it resizes both compile and match.
    Found by the openvino fuzz program replayed on IREE."""
    if node.target is torch.ops.qlower.max_pool2d.default or not ceil_mode_resizes_beside_a_single_window(node):
        return None
    return "a ceil_mode pool that adds a window beside a single-window dim is mis-sized by torch-mlir"


def _noop_ceil_pool(node: Node) -> str | None:
    """A pool whose ceil_mode=True changes nothing: the backend's compile sets it to False first
    (pool_geometry.drop_noop_ceil_mode), as torch-mlir mis-sizes these; left as is, they are refused."""
    if not ceil_mode(node):
        return None
    noop = ceil_mode_is_noop(node)
    if noop is None:
        return "ceil_mode pool with a dynamic spatial size (torch-mlir mis-sizes some ceil_mode pools)"
    if noop:
        return "ceil_mode that does not change the output size is mis-lowered by torch-mlir (iree-compile rejects it)"
    return None
