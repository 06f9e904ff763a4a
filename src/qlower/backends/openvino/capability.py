"""What the openvino backend accepts: the onnxruntime backend's capability (qlower's ONNX
translation table + torchlib), minus ONNX Runtime's own fused ops (qlower_ort::*: QLinearConv /
QGemm / QLinearMatMul, not emitted here) and minus what OpenVINO's CPU plugin was measured NOT
to compute canonically (docs/openvino.md). Refused nodes run in PyTorch (exact).

Measured (one-op graphs against the reference backend), with onnx/exact_forms.py's formulations:
- requantize, add, mul, dequantize, max_pool2d: bit-exact;
- conv1d/conv2d, linear, matmul: OpenVINO accumulates ConvInteger/MatMulInteger in fp32
  (measured: 1-LSB errors once |accumulator| > 2^24), so they are accepted where a bound on
  every partial sum, sum|w - zw| * max|x - zx| + |bias|, stays below 2^24;
- mean: the division by the element count n is a multiply by fp32(1/n); exact when n is a
  power of two, or odd and < 4096 (the quotient is then >= 1/(2n) from a tie), else refused;
- quantize: OpenVINO divides by a constant as a multiply by its fp32 reciprocal, so RNE(x *
  fp32(1/s)) differs from the canonical RNE(fp32(x / s)) by 1 LSB on a few elements per
  million; accepted only where s is a power of two (the reciprocal is exact). The "openvino"
  engine-native profile (Q/DQ form, OpenVINO's own int8 lowering) accepts it always and says
  so in the report.
"""
from __future__ import annotations

import math

import torch
from torch.fx import Node

from ..argument_checks import CHECKED_OPS, checkable

from ...numerics import EXACT_SUM, max_centered
from ...fx import constant_value, full_args, node_tensors, schema_name
from ...partition import Capability, holds_empty_tensor
from .int64_bounds import bounded_op, produces_int64
from ...onnx.capability import onnxruntime_capability
from ...onnx.lowering.integer import u8_first_operand
from ...pool_geometry import (POOLS, ceil_mode, ceil_mode_drops_a_window, ceil_mode_window_overhangs, pool_geometry,
                              window_exceeds_input)

NUMERICS = ("canonical", "openvino")
NATIVE_DEVIATION = ("the Q/DQ program runs on OpenVINO's int8 kernels with OpenVINO's own requantization "
                    "and rounding (quantize as x * fp32(1/s), zero point added before rounding; GEMM outputs "
                    "rescaled in fp32), not qlower's integer ops: outputs differ from the reference backend "
                    "by more than float rounding (measured per model in docs/openvino.md)")


def _refine(base, check):
    """The onnxruntime capability's predicate `base`, then `check`, a measured OpenVINO gap (a
    node -> reason | None function whose docstring's first line is its condition). `qlower ops`
    shows both conditions."""
    def predicate(node: Node) -> str | None:
        why = base(node) if base is not None else None
        return why if why is not None else check(node)
    base_doc = ((getattr(base, "__doc__", None) or "").strip().splitlines() or [""])[0]
    condition = check.__doc__.strip().splitlines()[0]
    predicate.__doc__ = condition if base_doc in ("", "always") else f"{base_doc}; {condition}"
    return predicate


def _power_of_two(values) -> bool:
    for v in values.reshape(-1).tolist():
        m, e = math.frexp(v)
        if m != 0.5 or not -125 <= e - 1 <= 125:   # exact reciprocal, normal fp32 both ways
            return False
    return True


def _canonical_quantize(node: Node) -> str | None:
    """one power-of-two scale only (canonical); any scale with numerics='openvino'"""
    scale = full_args(node)[1]
    gm = node.graph.owning_module
    value = constant_value(gm, scale) if gm is not None else None
    if value is None or value.numel() != 1 or not _power_of_two(value):
        return "OpenVINO quantizes by multiplying with fp32(1/s): exact only for power-of-two scales " \
               "(use OvOptions(numerics='openvino') to accept its rounding)"
    return None


def _val(node):
    return node.meta.get("val") if isinstance(node, Node) else None


def _bounded_accumulator(node: Node) -> str | None:
    """sum|w - zw| * max|x - zx| + |bias| < 2^24 (OpenVINO accumulates in fp32)

    conv / linear, for every output channel."""
    args = full_args(node)
    gm = node.graph.owning_module
    w, w_zp = constant_value(gm, args[2]), constant_value(gm, args[3])
    bias = constant_value(gm, args[4]) if isinstance(args[4], Node) else None
    x = _val(args[0])
    if w is None or w_zp is None or x is None:
        return "weights must be constants"
    centered = (w.to(torch.int64) - w_zp.to(torch.int64).reshape(-1, *([1] * (w.dim() - 1)))).abs()
    per_channel = centered.reshape(w.shape[0], -1).sum(1) * max_centered(x.dtype, int(args[1]))
    if bias is not None:
        per_channel = per_channel + bias.to(torch.int64).abs()
    worst = int(per_channel.max()) if per_channel.numel() else 0
    if worst >= EXACT_SUM:
        return f"OpenVINO accumulates in fp32: |accumulator| may reach {worst} >= 2^24"
    return None


def _bounded_matmul(node: Node) -> str | None:
    """K * max|a - za| * max|b - zb| < 2^24 (OpenVINO accumulates in fp32)"""
    a, a_zp, b, b_zp = full_args(node)[:4]
    av, bv = _val(a), _val(b)
    k = av.shape[-1] if av is not None else None
    if not isinstance(k, int):
        return "matmul over a symbolic inner dimension"
    worst = k * max_centered(av.dtype, int(a_zp)) * max_centered(bv.dtype, int(b_zp))
    return None if worst < EXACT_SUM else f"OpenVINO accumulates in fp32: |accumulator| may reach {worst} >= 2^24"


def _exact_mean(node: Node) -> str | None:
    """element count a power of two, or odd and < 4096"""
    shape, dims = node.args[0].meta["val"].shape, node.args[2]
    n = math.prod(shape[d] for d in dims)
    if n & (n - 1) == 0 or (n % 2 == 1 and n < 4096):
        return None
    return f"OpenVINO divides by {n} as a multiply by fp32(1/{n}): ties are not exact"


def _eight_bit(node: Node) -> str | None:
    """8-bit operands (a 65,536-entry table of canonical results)"""
    args = full_args(node)
    dtypes = {getattr(_val(args[0]), "dtype", None), getattr(_val(args[3]), "dtype", None), args[10]}
    return None if dtypes <= {torch.uint8, torch.int8} else "only 8-bit operands become an exact lookup table"


def _pytorch_ceil_rule(node: Node) -> str | None:
    """ceil_mode only where PyTorch's last-window rule changes nothing (static sizes)

    OpenVINO keeps a last window that starts in the right padding, which PyTorch drops
    (measured: n 6, kernel 1, stride 2, dilation 2 gave 4 windows instead of 3 -- a wrong shape,
    found by the openvino fuzz run)."""
    if not ceil_mode(node):
        return None
    drops = ceil_mode_drops_a_window(node)
    if drops is None:
        return "ceil_mode pool with a dynamic spatial size (OpenVINO sizes some ceil_mode pools differently)"
    return "OpenVINO keeps the last ceil_mode window that PyTorch drops (it starts in the padding)" if drops else None


def _window_fits(node: Node) -> str | None:
    """a pooling window no larger than the padded input

    PyTorch's ceil mode pools a window larger than the padded input into one output (n 2,
    kernel 3, stride 2, ceil_mode); OpenVINO's shape inference rejects the whole model
    ("Check 'cmp::le(kernel, dim.get_length())' failed"). Found by the openvino fuzz run."""
    return "a pooling window larger than the padded input (OpenVINO's shape inference rejects it)" \
        if window_exceeds_input(node) else None


def _divisor_of_overhanging_window(node: Node) -> str | None:
    """not a padded, count_include_pad ceil_mode average whose last window overhangs the padding

    PyTorch divides such a window by the part of it inside input + padding; OpenVINO divides it
    by the whole kernel as soon as any padding is set (measured over 590 avg_pool2d geometries,
    H 1-7 x W 1/3/4, kernel 2-3, stride 1-3, every padding pair: all 69 wrong answers, up to
    1.5x, were exactly these; no padding or count_include_pad=False matched). Found by the
    openvino fuzz run on an Intel Xeon."""
    if schema_name(node) != "aten::avg_pool2d":
        return None
    args = full_args(node)
    padding = pool_geometry(node)[3]
    if not args[5] or not any(padding) or not ceil_mode_window_overhangs(node):
        return None
    return ("OpenVINO divides a padded ceil_mode window that overhangs the padding by the whole kernel "
            "(PyTorch by the part inside the padded input)")


# schema -> [.., K, N]-ish operand
_GEMM_WEIGHT = {"aten::linear": 1, "aten::mm": 1, "aten::addmm": 2, "aten::matmul": 1}


def _not_one_by_one(node: Node) -> str | None:
    """not with a 1x1 weight (OpenVINO fails to compile it after another FC layer)

    A float GEMM whose weight is 1x1 (K = N = 1): OpenVINO's CPU plugin fails to compile it
    after another fully-connected layer ("Layout rank can't be larger than tensor rank", with
    INFERENCE_NUM_THREADS=1; measured: Linear(5, 1) -> Linear(1, 1) at M 1, 2, 8; (K, N) =
    (1, 2), (2, 1), (1, 8) compile). Found by the openvino fuzz run; a scalar multiply-add costs
    nothing in PyTorch."""
    w = _val(full_args(node)[_GEMM_WEIGHT[schema_name(node)]])
    if w is not None and w.dim() >= 2 and tuple(w.shape[-2:]) == (1, 1):
        return "a 1x1 weight after another fully-connected layer fails to compile in OpenVINO's CPU plugin"
    return None


# schema -> (weight position, stride position, padding position)
_CONVS = {"aten::conv2d": (1, 3, 4), "aten::conv1d": (1, 3, 4), "aten::convolution": (1, 3, 4),
          "qlower::conv2d": (2, 5, 6), "qlower::conv1d": (2, 5, 6)}


def _no_strided_padded_pointwise(node: Node) -> str | None:
    """not a 1x1 kernel with padding and stride > 1 or padding > 1 (OpenVINO gets it wrong)

    Fed by another conv, OpenVINO's CPU plugin returns the wrong output size for a padded 1x1 conv
    with stride > 1 (measured over 192 two-conv chains: all 24 wrong ones were exactly these,
    e.g. 3x3 conv -> 1x1 stride 2 padding 1 on 6x6 gave 3x3 where PyTorch gives 2x2; the same
    conv on a model input was right). Found by the openvino fuzz run. On an AVX2-only AMD EPYC
    (no AVX-512) a 1x1 conv with padding 2 or 3 and one input and one output channel writes
    unread memory into the padded border (13 of 242 outputs off by up to 6e19, at 7x7, 9x9 and
    16x16; padding 1, or 2 channels either side, measured right): found by the openvino fuzz
    run, refused for every padding > 1 (a padded 1x1 conv only adds a border of
    biases; ResNet-style 1x1 convs have no padding and are unaffected)."""
    args = full_args(node)
    w_at, stride_at, pad_at = _CONVS[schema_name(node)]
    w = _val(args[w_at])
    stride, padding = args[stride_at], args[pad_at]
    if w is None or isinstance(padding, str) or w.dim() < 3 or any(k != 1 for k in w.shape[2:]):
        return None
    strides = [int(v) for v in ([stride] if isinstance(stride, int) else stride)]
    pads = [int(v) for v in ([padding] if isinstance(padding, int) else padding)]
    if max(strides) > 1 and max(pads) > 0:
        return "OpenVINO mis-sizes a 1x1 conv with stride > 1 and padding after another conv"
    if max(pads) > 1:
        return "OpenVINO writes garbage into the border of a 1x1 conv padded by more than 1 (AVX2)"
    return None


def openvino_capability(numerics: str = "canonical") -> Capability:
    """The onnxruntime capability without ONNX Runtime's own fused ops, each measured OpenVINO
    gap refining the predicate of the op it concerns."""
    base = onnxruntime_capability()
    cap = Capability("openvino")
    for name, predicate in base.ops.items():
        if not name.startswith("qlower_ort::"):
            cap.register(name, predicate)

    def refine(names, check):
        for name in names:
            cap.register(name, _refine(cap.ops.get(name, base.ops.get("*")), check))

    refine(("qlower::conv2d", "qlower::conv1d", "qlower::linear"), _bounded_accumulator)
    # ONNX Runtime's refusal of u8 x s8 activations without VNNI (its AVX2 kernels saturate) is
    # not OpenVINO's: it accumulates in fp32, exact under _bounded_matmul's 2^24 on AVX2 too
    # (measured on an AVX2-only AMD EPYC, tests/test_openvino.py::test_activation_matmul_bit_exact)
    cap.register("qlower::matmul", _refine(u8_first_operand, _bounded_matmul))
    refine(("qlower::mean",), _exact_mean)
    refine(("qlower::add", "qlower::mul"), _eight_bit)
    refine(_CONVS, _no_strided_padded_pointwise)
    refine(_GEMM_WEIGHT, _not_one_by_one)
    refine(POOLS, _pytorch_ceil_rule)
    refine(POOLS, _window_fits)
    refine(("aten::avg_pool2d",), _divisor_of_overhanging_window)
    refine(("qlower::attention",), _ieee_attention)
    if numerics == "canonical":
        refine(("qlower::quantize",), _canonical_quantize)
    for name in ("qlower::token_scale", "qlower::quantize_per_token", "qlower::dequantize_per_token_acc",
                 "qlower::quantize_dynamic", "qlower::dequantize_dynamic", "qlower::linear_dynamic",
                 "qlower::layer_norm_integer", "qlower::rms_norm_integer", "qlower::softmax_integer"):
        cap.register(name, _divides_at_run_time)
    # qlower ops make no int64
    refine([name for name in cap.ops if not name.startswith("qlower::")], _int64_values_stay_int32)
    refine(list(cap.ops), _no_empty_tensor)
    refine(list(cap.ops), _measured_wrong_in_openvino)
    refine(list(cap.ops), _no_data_dependent_size)
    refine(list(cap.ops), _no_float64)
    refine(list(cap.ops), _no_bfloat16)
    # eager's IndexError / division by zero: checked on the host, or the op stays in PyTorch
    for name in CHECKED_OPS:   # (most of them under "*": refined from what "*" now is)
        predicate = cap.ops.get(name, cap.ops.get("*"))
        if predicate is not None:
            cap.register(name, _refine(predicate, checkable))
    return cap


def _touches_dtype(node: Node, dtypes: tuple) -> bool:
    """The node reads or makes a tensor of one of `dtypes` (from the meta values)."""
    return any(t.dtype in dtypes for t in node_tensors(node))


def _no_bfloat16(node: Node) -> str | None:
    """no bfloat16 value

    The onnxruntime capability compiles bfloat16 (its runner crosses the boundary in float32,
    onnxruntime/bfloat16_values.py); the OpenVINO runner has no such crossing (measured: "Got
    unsupported ScalarType BFloat16" at the first call, the cluster in PyTorch) and OpenVINO's
    own bfloat16 arithmetic is not verified against eager's."""
    if _touches_dtype(node, (torch.bfloat16,)):
        return "bfloat16 is not verified on OpenVINO"
    return None


def _no_float64(node: Node) -> str | None:
    """no float64 value

    OpenVINO's CPU plugin holds float64 as float32: a float64 model came back rounded to float32
    (measured, openvino 2026.4.1: a reshape / cat / transpose of float64 values 1.2e-7 off,
    (x @ x) * 0.1 + exp(x) 4e-7 off), with float64 outputs, silently. Such nodes run in PyTorch
    (or ONNX Runtime, which keeps float64)."""
    if _touches_dtype(node, (torch.float64, torch.complex128)):
        return "OpenVINO's CPU plugin computes float64 in float32 (results rounded to float32)"
    return None


def _no_data_dependent_size(node: Node) -> str | None:
    """no output size that depends on input values

    ONNX Runtime sizes NonZero's output at run time (nonzero, unique, masked_select run there);
    on OpenVINO those are not verified (its int64 gap refused nonzero and unique anyway)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    produced = free_unbacked_symbols(node.meta.get("val"))
    consumed = set().union(*(free_unbacked_symbols(a.meta.get("val")) for a in node.all_input_nodes))
    if produced - consumed:
        return "output size depends on input values (data-dependent shapes stay in PyTorch on OpenVINO)"
    return None


# Measured (PyTorch's OpInfo samples through `tests/test_opinfo.py --backend
# openvino`): each compiled, was reported as compiled, and answered wrongly.
_SORTS = ("aten::sort", "aten::sort.stable", "aten::argsort", "aten::argsort.stable", "aten::msort")


def _measured_wrong_in_openvino(node: Node) -> str | None:
    """not a sort, an FFT, antialiased upsampling, segment_reduce, a 0-d random draw, or a spatially varying
    constant multiply into a padded convolution

    Sorts (decompositions.py's two stable TopK passes): the CPU plugin's TopK breaks ties in no
    fixed order, so the second pass (by "is NaN", all ties) scrambled sort(randn(100)). FFTs:
    irfft / hfft and their 2-D / n-D forms came back without their last dim (shape (5, 10),
    eager (5, 10, 7)). _upsample_bilinear2d_aa: every value off (by up to 7.4) also with
    align_corners=False, which ONNX Runtime gets right. normal / rand_like / randn_like of a 0-d
    tensor: shape (1,), eager (). segment_reduce: an empty segment's max -3.4e38, eager -inf."""
    name = schema_name(node)
    if name in _SORTS:
        return "OpenVINO's TopK breaks ties in no fixed order (a sort came back scrambled)"
    if name.startswith(("aten::fft_", "aten::_fft_")):
        if "irfft" in name or "hfft" in name or "c2r" in name:
            return "OpenVINO's DFT gave the wrong output shape for inverse real FFTs"
        return "FFTs are not verified on OpenVINO (its DFT gave the wrong output shape for inverse real FFTs)"
    if name.startswith("aten::_upsample_bilinear2d_aa"):
        return "antialiased upsampling is computed wrongly by OpenVINO"
    if name == "aten::segment_reduce":
        # measured: segments.py's max of an empty segment comes back -3.4e38, eager -inf
        return "OpenVINO's ReduceMax of values that are all -inf gives -3.4e38 (an empty segment's max is -inf)"
    val = node.meta.get("val")
    if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()) \
            and isinstance(val, torch.Tensor) and val.dim() == 0:
        return "a 0-d random draw comes back 1-d from OpenVINO"
    if name == "aten::mul.Tensor" and _varying_constant_into_padded_conv(node):
        return ("OpenVINO folds a spatially varying constant multiply into the next padded "
                "convolution wrongly (its border came back with interior values)")
    return None


def _varying_constant_into_padded_conv(node: Node) -> bool:
    """x * c, c a constant that varies along the dims a convolution with padding reads as
    spatial, feeding that convolution. Measured (from the OpenVINO fuzz
    run's log): conv2d(x * c, w, padding=1) with c of shape (2, 2) came back
    off by 890 on values of 535, for plain and grouped convs; c per channel ((C, 1, 1)),
    padding 0, an added constant or x * x are right."""
    constants = [a for a in node.args if isinstance(a, Node) and a.op == "get_attr"]
    if not constants:
        return False
    for user in node.users:
        if not schema_name(user).startswith(("aten::conv", "aten::convolution")):
            continue
        args = list(user.args)
        padding = args[4] if len(args) > 4 else user.kwargs.get("padding", 0)
        padded = padding not in ("valid",) and (any(p != 0 for p in padding) if isinstance(padding, (list, tuple))
                                                 else padding != 0)
        weight = args[1].meta.get("val") if isinstance(args[1], Node) else None
        spatial = weight.dim() - 2 if isinstance(weight, torch.Tensor) else 2
        for c in constants:
            shape = tuple(getattr(c.meta.get("val"), "shape", ()))
            if padded and any(d > 1 for d in shape[-spatial:]):
                return True
    return False


def _no_empty_tensor(node: Node) -> str | None:
    """no statically empty input or result

    OpenVINO 2026.4's CPU plugin fails to compile MatMul, MaxPool, AvgPool and Broadcast on a
    tensor with a zero-size dim (measured: "object is not initialized",
    "Model wasn't fully converted")."""
    return "an empty tensor (OpenVINO's CPU plugin fails to compile several ops on one)" \
        if holds_empty_tensor(node) else None


def _int64_values_stay_int32(node: Node) -> str | None:
    """int64 results boundable from the operands (int64_bounds.py)

    OpenVINO's CPU plugin computes int64 in int32 (openvinotoolkit/openvino#35823). Each cluster
    bounds its int64 values from the actual arguments on every call and runs a call that could
    leave int32 in PyTorch (int64_bounds.RangeCheck); an op it cannot bound (one it does not
    know, a float -> int64 cast: OpenVINO returns INT32_MIN for large floats, #35896) runs in
    PyTorch always."""
    if produces_int64(node) and not bounded_op(node):
        return "OpenVINO's CPU plugin computes int64 in int32 and qlower cannot bound this op's values"
    return None


def _ieee_attention(node: Node) -> str | None:
    """never as one op: decomposed into MatMul / Softmax / MatMul"""
    # Measured (openvino 2026.4.1, causal [1, 1, 3, 2]): the fused attention the ONNX Attention
    # op becomes returns 0 where PyTorch returns NaN -- an inf in q or k, an inf in v, a row of
    # -inf scores (fully masked) -- while the decomposition gives PyTorch's NaN in all of them
    # (found by the fuzz run: a causal attention over a max-pool's -inf padding).
    return "OpenVINO's fused attention returns 0 where PyTorch returns NaN (non-finite scores, " \
           "fully masked rows): decomposed into MatMul / Softmax / MatMul, which keep IEEE semantics"


def _divides_at_run_time(node: Node) -> str | None:
    """never: run-time scales (per-token and dynamic quantization, integer LayerNorm and softmax)"""
    # Measured on a two-linear per-token model against the reference backend: with these ops in
    # OpenVINO the outputs differed (its graph transformations turn a division by a run-time
    # value into a multiply by the reciprocal, and regroup the products of the accumulator and the two scales);
    # refusing the three made the same model bit-exact (tests/test_openvino.py).
    return "OpenVINO rewrites division by / multiplication with run-time scales (reciprocal, regrouped " \
           "products): run-time (per-token, dynamic) quantization is not exact there"
