"""Building blocks for translations: the ONNX opsets qlower emits into, schemas for the
non-standard ops (com.microsoft contrib kernels, qlower-domain block ops), and constants."""
from __future__ import annotations

import contextlib
import contextvars

import numpy as np
import onnx_ir as ir
from onnx.defs import OpSchema
from onnxscript import opset23 as op  # noqa: F401  (re-exported: the standard opset)
from onnxscript.values import Op, Opset

OPSET = 23               # RMSNormalization and Attention (block ops) are standard from 23 on
MS = Opset("com.microsoft", 1)
QLOWER_DOMAIN = "qlower"
QLOWER = Opset(QLOWER_DOMAIN, 1)

_TYPES = ["tensor(float)", "tensor(uint8)", "tensor(int8)", "tensor(int32)", "tensor(int64)", "tensor(bool)"]
_ATTR = {int: OpSchema.AttrType.INT, float: OpSchema.AttrType.FLOAT, str: OpSchema.AttrType.STRING}
_NP = {ir.DataType.UINT8: np.uint8, ir.DataType.INT8: np.int8, ir.DataType.INT32: np.int32,
       ir.DataType.FLOAT: np.float32, ir.DataType.INT64: np.int64}


def contrib_op(opset: Opset, name: str, inputs: list[str], attrs: dict[str, type] | None = None,
               optional: tuple[str, ...] = ()) -> Op:
    """An op onnx's schema registry does not know (ONNX Runtime contrib kernels): a schema with
    one output and one type variable per input (those in `optional` may be left out at the
    end), so the tracer can record the node."""
    option = OpSchema.FormalParameterOption
    schema = OpSchema(
        name, opset.domain, opset.version, "",
        inputs=[OpSchema.FormalParameter(n, f"T{i}", param_option=option.Optional if n in optional else option.Single)
                for i, n in enumerate(inputs)],
        outputs=[OpSchema.FormalParameter("Y", "TY")],
        type_constraints=[(f"T{i}", _TYPES, "") for i in range(len(inputs))] + [("TY", _TYPES, "")],
        attributes=[OpSchema.Attribute(a, _ATTR[t], "") for a, t in (attrs or {}).items()])
    return Op(opset, name, schema)


QLinearAdd = contrib_op(MS, "QLinearAdd", ["A", "A_scale", "A_zero_point", "B", "B_scale", "B_zero_point",
                                           "C_scale", "C_zero_point"])
QGemm = contrib_op(MS, "QGemm", ["A", "a_scale", "a_zero_point", "B", "b_scale", "b_zero_point", "C",
                                 "y_scale", "y_zero_point"], optional=("y_scale", "y_zero_point"))
MatMulIntegerToFloat = contrib_op(MS, "MatMulIntegerToFloat", ["A", "B", "a_scale", "b_scale", "a_zero_point",
                                                               "b_zero_point", "bias"], optional=("bias",))
QLinearGlobalAveragePool = contrib_op(MS, "QLinearGlobalAveragePool",
                                      ["X", "x_scale", "x_zero_point", "y_scale", "y_zero_point"],
                                      {"channels_last": int})


def const(value, dtype=None) -> ir.Value:
    """A Constant node holding `value` (numpy-convertible; 0-d stays 0-d)."""
    arr = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if dtype is not None:
        arr = arr.astype(dtype)
    return op.Constant(value=ir.tensor(np.array(arr, order="C")))  # keeps 0-d scalars 0-d


def first_output(out):
    """The first output of an op the tracer records with all its optional outputs (MaxPool's
    indices, Attention's present key/value)."""
    return out[0] if isinstance(out, (tuple, list)) else out


def i64(values) -> ir.Value:
    return const(np.array(values, np.int64))


def np_dtype(value: ir.Value):
    """The numpy dtype of an ONNX value (uint8 / int8 / int32 / float32 / int64)."""
    return _NP[value.dtype]


def np_of(onnx_dtype) -> type:
    """numpy dtype of an ONNX data type passed as an attribute (torch.dtype arguments)."""
    return _NP[ir.DataType(int(onnx_dtype))]


# torch.onnx attaches initializer contents only after the whole graph is translated; the
# translations that need a constant's value (weights to re-encode, scales to combine) read it
# from the cluster's constants, bound here for the duration of one export.
_BOUND: contextvars.ContextVar[dict] = contextvars.ContextVar("qlower_onnx_constants", default={})


@contextlib.contextmanager
def bound_constants(values: dict[str, np.ndarray]):
    """Make `values` (ONNX value name -> array) visible to value_of() within the block."""
    token = _BOUND.set(values)
    try:
        yield
    finally:
        _BOUND.reset(token)


# Engines other than ONNX Runtime (OpenVINO) read standard ONNX only: within this block the
# translations emit no com.microsoft kernels (QLinearAdd, QLinearGlobalAveragePool), only their
# standard-op formulations. (QLinearConv/QGemm/QLinearMatMul come only from FuseRequantize's
# fused ops, which such a backend does not run.)
_STANDARD_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("qlower_onnx_standard_only", default=False)


@contextlib.contextmanager
def standard_onnx_only():
    """Translate without ONNX Runtime contrib ops within the block."""
    token = _STANDARD_ONLY.set(True)
    try:
        yield
    finally:
        _STANDARD_ONLY.reset(token)


def contrib_ops_allowed() -> bool:
    return not _STANDARD_ONLY.get()


def value_of(v) -> np.ndarray | None:
    """The constant behind an ONNX value (a constant input of the cluster), else None."""
    if v is None:
        return None
    if getattr(v, "const_value", None) is not None:
        return np.asarray(v.const_value.numpy())
    return _BOUND.get().get(getattr(v, "name", None))
