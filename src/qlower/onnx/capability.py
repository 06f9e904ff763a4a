"""What the onnxruntime backend accepts, derived — never listed by hand:
- qlower's own ops: the ONNX translation table (lowering/), each with its predicate;
- every other op: whatever torch.onnx's translator (torchlib's registry, or a decomposition
  into registered ops) can translate, minus the engine gaps measured below.
"""
from __future__ import annotations

import functools
import operator
from typing import Callable

import torch
from torch.fx import Node

from ..fx import full_args, node_tensors, target_schema_name
from ..partition import Capability, holds_empty_tensor
from ..pool_geometry import pool_geometry, window_entirely_in_padding
from .lowering import PREDICATES, translation_table
from .decompositions import DECOMPOSITIONS, applies_to, decomposes
from . import translate

def _divisor_override(node: Node) -> str | None:
    """with divisor_override and a symbolic channel or spatial size"""
    # torchlib 0.7.2 drops divisor_override (measured: avg_pool2d(x, 2, divisor_override=3) came
    # back as the plain mean, off by 0.9 on randn input; avg_pool3d off by 35 on OpInfo samples).
    # decompositions.py computes it where the sizes are static; the rest stays in PyTorch.
    name = node.target._schema.name.removeprefix("aten::")
    if full_args(node)[6] is not None and not decomposes(node):
        return f"{name} with divisor_override and symbolic sizes is not translated correctly"
    return None


def _shape(node) -> tuple | None:
    v = node.meta.get("val") if isinstance(node, Node) else None
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


# training=True with running stats: output off by up to 64, stats by 2 (OpInfo samples, also via
# torch.onnx.export; without running stats it matches); training=False: save_mean/save_invstd
# come back shape (C,), eager (0,).
def _batch_norm(node: Node) -> str | None:
    args, name = full_args(node), node.target._schema.name.removeprefix("aten::")
    if args[5] and args[3] is not None:
        return f"{name} in training mode with running stats is not translated correctly"
    if not args[5] and any(u.target is operator.getitem and u.args[1] in (1, 2) for u in node.users):
        return f"{name}'s eval-mode saved statistics have the wrong shape"
    return None


# align_corners=True (.vec, scale_factors [0.8, 1.0]) off by 1.9; explicit scales_h/scales_w
# with output_size (1.7, 0.9 -> [3, 3]) off by 8.1 (OpInfo samples).
def _upsample_aa(node: Node) -> str | None:
    """with align_corners or explicit scales on a symbolic or non-4-D input (antialiased_resize.py
    takes the static ones)"""
    if decomposes(node):
        return None
    args = full_args(node)
    if args[2]:
        return "antialiased upsampling with align_corners=True is not translated correctly"
    if len(args) > 3 and not isinstance(args[3], (list, tuple)) and any(a is not None for a in args[3:5]):
        return "antialiased upsampling with explicit scales is not translated correctly"
    return None


# n=0 on a batch of matrices comes back one identity matrix (measured: (3, 2, 2) -> (2, 2)).
def _matrix_power_zero(node: Node) -> str | None:
    args = full_args(node)
    return "linalg_matrix_power with n=0 on a batch is not translated correctly" \
        if args[1] == 0 and len(_shape(args[0]) or ()) > 2 else None


# Empty inputs keep the reduced dim (measured: vecdot of (0, 1) and (0, 1) -> shape (0, 1), eager (0,)).
def _vecdot_empty(node: Node) -> str | None:
    shapes = [_shape(a) for a in full_args(node)[:2]]
    return "linalg_vecdot of an empty input has the wrong shape" \
        if any(s is not None and 0 in s for s in shapes) else None


# torchlib raises NotImplementedError for the default min == max (the range is the data's).
def _histc_data_range(node: Node) -> str | None:
    """with min == max (the data's range)"""
    args = full_args(node)
    return "histc with min == max (a data-dependent range) is not translated" if args[2] == args[3] else None


# An empty reduction gives -0, eager NaN (measured: std/var/var_mean/std_mean of a (0, 5) input).
def _empty_moments(node: Node) -> str | None:
    shape = _shape(full_args(node)[0])
    return f"{node.target._schema.name.removeprefix('aten::')} of an empty input gives 0, eager NaN" \
        if shape is not None and 0 in shape else None


def _on_empty(what: str) -> Callable[[Node], str | None]:
    """A gap of ONNX Runtime 1.31 on empty tensors (measured, tests/test_onnxruntime.py
    `test_empty_tensors_*`): refused where an input has a static zero-size dim (an empty tensor
    costs PyTorch nothing). MatMul with K = 0 returned uninitialized memory (1e35 from
    `x @ x.mT` of a (2, 3, 0) input; with an Add after it ONNX Runtime fuses the pair into a
    kernel that gives zeros); ReduceMean of an empty set gives 0, eager NaN; `any` over an empty
    dim True, eager False; LayerNormalization over an empty dim fails at run time, group_norm's
    Reshape at session creation. (Reductions of empty tensors along negative axes returned their
    input unchanged: translate._nonnegative_axes.)"""
    def predicate(node: Node) -> str | None:
        return f"{node.target._schema.name.removeprefix('aten::')} of an empty input: {what}" \
            if holds_empty_tensor(node) else None
    predicate.__doc__ = f"of an empty input ({what})"
    return predicate


_ANY_EMPTY_OPERAND = _on_empty("ONNX Runtime's MatMul returns uninitialized memory")


def _empty_contraction(node: Node) -> str | None:
    """with an empty contraction dim (K = 0)"""
    args = full_args(node)
    name = node.target._schema.name.removeprefix("aten::")
    first = args[1] if name in ("baddbmm", "addbmm", "addmv") else args[0]
    shape = _shape(first)
    if name in ("einsum", "tensordot", "inner"):   # contraction dims spelled by arguments: any empty input
        return _ANY_EMPTY_OPERAND(node)
    if shape and shape[-1] == 0:
        return f"{name} with an empty contraction dim: ONNX Runtime's MatMul returns uninitialized memory"
    return None
_MEAN_ON_EMPTY = _on_empty("ONNX Runtime's ReduceMean gives 0, eager NaN")
_ANY_ON_EMPTY = _on_empty("the translation gives True, eager False")
_LAYER_NORM_ON_EMPTY = _on_empty("ONNX Runtime's LayerNormalization rejects it at run time")
_GROUP_NORM_ON_EMPTY = _on_empty("ONNX Runtime rejects the translation's Reshape")


# Value-dependent: torchlib's formula overflows or underflows (measured: erfcx(randn * 9) off by
# 0.13, relative 1.0; log_ndtr(-9) = -inf, eager -39.0).
def _inaccurate(node: Node) -> str | None:
    return f"{node.target._schema.name.removeprefix('aten::')} is translated by a formula that overflows"


# A window with no input element, only padding (dilated, on a narrow input): PyTorch -inf,
# ONNX Runtime's MaxPool the lowest float, -3.4e38 (measured; found by the fuzz run, where a
# softmax after it then gave 1 instead of 0).
# Undilated windows never lie in the padding alone (padding <= kernel / 2, and PyTorch drops a
# ceil-mode window that would start there), so a dynamic spatial size is refused only if dilated.
def _window_in_padding(node: Node) -> str | None:
    found = window_entirely_in_padding(node)
    if found is None:
        found = any(d > 1 for d in pool_geometry(node)[4])
    return "a max-pool window entirely in the padding gives -inf in PyTorch, -3.4e38 in ONNX Runtime" \
        if found else None


# Measured gaps of the translator or of ONNX Runtime 1.31 (the op translates, but the result
# is wrong or the session rejects it): schema name -> predicate naming the failing variant.
def _attention_rank(node: Node) -> str | None:
    """query/key/value of rank 4 (`four_d_attention` brings ranks 2 and 3 there), not empty"""
    if holds_empty_tensor(node):   # measured: "Batch size must be greater than 0" at run time
        return "attention on an empty tensor (ONNX Runtime's Attention rejects batch 0 at run time)"
    ranks = {len(s) for s in (_shape(a) for a in node.args[:3]) if s is not None}
    if ranks and ranks != {4}:
        return f"attention on rank-{'/'.join(map(str, sorted(ranks)))} query/key/value (torchlib takes rank 4 only)"
    return None


GAPS: dict[str, Callable[[Node], str | None]] = {
    "aten::scaled_dot_product_attention": _attention_rank,
    "aten::avg_pool2d": _divisor_override,
    "aten::max_pool2d": _window_in_padding,
    "aten::max_pool2d_with_indices": _window_in_padding,
    "aten::_native_batch_norm_legit": _batch_norm,
    "aten::native_batch_norm": _batch_norm,
    "aten::batch_norm": _batch_norm,
    "aten::_upsample_bilinear2d_aa": _upsample_aa,
    "aten::_upsample_bilinear2d_aa.vec": _upsample_aa,
    "aten::avg_pool3d": _divisor_override,
    "aten::linalg_matrix_power": _matrix_power_zero,
    "aten::linalg_vecdot": _vecdot_empty,
    "aten::histc": _histc_data_range,
    **{f"aten::{op}{overload}": _empty_moments for op in ("std", "var", "std_mean", "var_mean")
       for overload in ("", ".dim", ".correction")},
    **{f"aten::{op}": _empty_contraction for op in ("matmul", "mm", "bmm", "mv", "dot", "vdot", "einsum", "tensordot",
                                                   "inner", "baddbmm", "addbmm", "addmv", "linear")},
    **{f"aten::{op}": _MEAN_ON_EMPTY for op in ("mean", "mean.dim", "nanmean")},
    **{f"aten::{op}": _ANY_ON_EMPTY for op in ("any", "any.dim", "any.dims")},
    **{f"aten::{op}": _LAYER_NORM_ON_EMPTY for op in ("layer_norm", "native_layer_norm")},
    **{f"aten::{op}": _GROUP_NORM_ON_EMPTY for op in ("group_norm", "native_group_norm")},
    "aten::special_erfcx": _inaccurate,
    "aten::special_log_ndtr": _inaccurate,
}
# dtypes ONNX Runtime's CPU kernels cover for (nearly) every op, and those they cover only in
# part (float64 Conv / Erf have none): a node lacking its kernel is refused when the session
# says so (backends/onnxruntime/__init__.py, _nodes_without_kernels)
FULL_KERNEL_DTYPES = {torch.float32, torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool}
PARTLY_COVERED_DTYPES = {torch.float64, torch.float16, torch.int16, torch.bfloat16}   # bfloat16: bfloat16_values.py
_SUPPORTED_DTYPES = FULL_KERNEL_DTYPES | PARTLY_COVERED_DTYPES   # complex: PyTorch


def _translator():
    """translate.py, imported on first use (it builds torchlib's registry)."""
    return translate


def _torchlib():
    return _translator()._registry()


def _composite(target) -> bool:
    """CompositeImplicitAutograd ops (aten.batch_norm, ...) decompose during export."""
    return isinstance(target, torch._ops.OpOverload) and \
        torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd")


def _dtypes_ok(node: Node) -> str | None:
    for t in node_tensors(node):
        if t.dtype not in _SUPPORTED_DTYPES:
            return f"dtype {t.dtype} is not compiled for ONNX Runtime"
    return None


def translatable(node: Node) -> str | None:
    """translated by torch.onnx (torchlib; special functions and linear algebra are not), not a random draw"""
    target = node.target
    if target is operator.getitem:
        return None
    if _draws_random_numbers(node):
        # ONNX Runtime's random ops draw from their own generator, seeded per session (two
        # processes gave different randn_like after the same torch.manual_seed), and its Bernoulli
        # kernel draws 1 with probability 1 - p (measured, ORT 1.31, at opset 21)
        return ("a random op: its values come from PyTorch's generator (torch.manual_seed), which ONNX Runtime "
                "cannot follow")
    gap = GAPS.get(target_schema_name(target))
    if gap is not None and gap(node) is not None:
        return gap(node)
    if _torchlib().is_registered(target) and (target not in DECOMPOSITIONS or _ours_leaves(node)):
        return _dtypes_ok(node)
    if _ours_applies(node):   # written in translatable ops (tests/test_decompositions.py): no re-trace
        return _dtypes_ok(node)
    if not (target in _translator().exporter_decompositions() or _composite(target)):
        return "torch.onnx has no translation for it"
    missing = _untranslatable_in_decomposition(node)
    if missing == str(target):
        return "no translation for this call of it (qlower's decomposition covers other sizes or arguments)"
    if missing is not None:
        return f"torch.onnx decomposes it into {missing}, which it cannot translate"
    return _dtypes_ok(node)


def _draws_random_numbers(node: Node) -> bool:
    """A `nondeterministic_seeded` op that draws in this call: dropout in eval mode or with p = 0,
    and attention with dropout_p = 0 (every transformers model in eval mode), are deterministic."""
    target = node.target
    if torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ()):
        return False
    names = [a.name for a in target._schema.arguments]
    args = dict(zip(names, full_args(node)))
    if args.get("train", args.get("training", True)) is False:
        return False
    rate = args.get("dropout_p", args.get("p"))
    return not (isinstance(rate, (int, float)) and rate == 0 and ("dropout_p" in args or "train" in args))


def _ours_leaves(node: Node) -> bool:
    """A conditional decomposition certainly leaves this call to torchlib's translation of the op
    (its predicate says no, and the op is not handed to torch's decomposition instead): no
    re-trace."""
    decomposition = DECOMPOSITIONS.get(node.target)
    if applies_to(decomposition) is None or getattr(decomposition, "otherwise_torch", False):
        return False
    return not decomposes(node, undecided=True)


def _ours_applies(node: Node) -> bool:
    """One of qlower's decompositions (decompositions.py) certainly takes this call."""
    decomposition = DECOMPOSITIONS.get(node.target)
    if decomposition is None:
        return False
    return applies_to(decomposition) is None or decomposes(node, undecided=False)


def _untranslatable_in_decomposition(node: Node) -> str | None:
    """The first op of torch.onnx's decomposition of `node` (its table, applied as the exporter
    does) that torchlib does not translate, or None. Measured on OpInfo: 65 ops passed the
    registry check and then failed inside the exporter (svd -> _linalg_svd, lgamma ->
    prims.lgamma, cdist -> _cdist_forward, ...), each taking its whole cluster to PyTorch."""
    def meta(a):
        v = a.meta.get("val") if isinstance(a, Node) else a
        if isinstance(v, torch.Tensor):
            return ("T", tuple(_hint(d) for d in v.shape), v.dtype)
        if isinstance(v, (list, tuple)):
            return tuple(meta(x) for x in v)
        return ("V", v if isinstance(v, (int, float, bool, str, type(None), torch.dtype)) else repr(v))
    try:
        key = (node.target, meta(list(node.args)), tuple((k, meta(v)) for k, v in node.kwargs.items()))
        hash(key)
    except (TypeError, AttributeError):
        return None
    return _decomposition_gap(key)


def _hint(d) -> int:
    return d if isinstance(d, int) else (d.node.hint if d.node.hint is not None else 2)


@functools.lru_cache(maxsize=4096)
def _decomposition_gap(key) -> str | None:
    """Decompose one op on meta tensors of the recorded shapes (a few ms, once per signature)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    target, args, kwargs = key

    def build(m):
        if isinstance(m, tuple) and m and m[0] == "T":
            return torch.empty(m[1], dtype=m[2], device="meta")
        if isinstance(m, tuple) and m and m[0] == "V":
            return m[1]
        return [build(x) for x in m]
    try:
        graph = make_fx(lambda *a: target(*a, **{k: build(v) for k, v in kwargs}),
                        decomposition_table=_translator().exporter_decompositions())(*[build(a) for a in args]).graph
    except Exception:   # no meta kernel, data-dependent decomposition, ...: let the exporter decide
        return None
    # in-place ops (copy_, squeeze_) are functionalized away by export before translation; a
    # complex value inside the decomposition needs torchlib's complex translation of its reader
    return next((str(n.target) for n in graph.nodes if n.op == "call_function"
                 and isinstance(n.target, torch._ops.OpOverload) and not n.target._schema.is_mutable
                 and not (_torchlib().is_registered(n.target)
                          and (not _complex_inputs(n) or _translator().has_complex_translation(n.target)))), None)


def _complex_inputs(node: Node) -> bool:
    return any(isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].dtype.is_complex
               for a in node.all_input_nodes)


def onnxruntime_capability() -> Capability:
    cap = Capability("onnxruntime")
    for target in translation_table():
        cap.register(target_schema_name(target), PREDICATES.get(target))
    cap.register("*", translatable)
    for name, gap in GAPS.items():   # listed by `qlower ops` with the variant they refuse
        cap.register(name, _translatable_except(gap))
    return cap


def _translatable_except(gap) -> Callable[[Node], str | None]:
    def predicate(node: Node) -> str | None:
        return translatable(node)
    what = (gap.__doc__ or gap.__name__.strip("_").replace("_", " ")).strip().splitlines()[0]
    predicate.__doc__ = f"translated by torch.onnx (torchlib), except (a measured gap) {what}"
    return predicate
