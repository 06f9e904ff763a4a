"""Build one MLIR module (TOSA + arith on tensors) for a cluster of qlower integer ops, with the
MLIR Python bindings shipped in iree-base-compiler (no string templates).

Representation: TOSA 1.0 integer ops take signless i8, so a uint8 tensor is held as
`stored = q - 128` in i8 (`Val.offset == 128`); zero points and clamp bounds are shifted by the
same offset, which keeps every subtraction `q - zp` identical. At the function boundary a uint8
input arrives as its bytes viewed as int8 and one XOR with 0x80 turns `q` into `q - 128`
(and back for outputs), so no op ever needs TOSA's unsigned flags.

Dynamic dims (dynamic_shapes=) are `?` in the tensor types and DYN (-1) in `Val.shape`; a tensor
holds at most one (lowerings.tosa_shapes), so every tosa.reshape infers it as -1, and splat
constants of a dynamic shape are `linalg.fill`s of a `tensor.empty` sized like a value at hand.
"""
from __future__ import annotations

import operator

import numpy as np
import torch
from torch.fx import GraphModule, Node

from ...fx import constant_value, schema_name
from . import tosa_ops, torch_import
from .lowerings import DYN, TOSA_LOWERINGS, dims, kind_of
from .values import U8_OFFSET, EmittedModule, Val, offset_of  # noqa: F401  (re-exported)
from .options import IreeOptions

# `main`'s outputs, then the sum of each float32 input in `input_sums`: what the runner calls, so
# the NaN/inf check of a quantized model's inputs happens inside the engine, where the module
# reads them anyway. Measured on the zoo CNN int8 at batch 8 (Intel Xeon AMX, one thread,
# iree-benchmark-module, 3 x 5 repetitions): main 0.538 ms, this entry 0.546 ms, against ~20 us
# for the same check in Python after the call (numpy max - min of a cache-cold input). `main`
# stays as it was (what `qlower.export` runs with iree-run-module).
CHECKED_ENTRY = "main_with_input_sums"


def _is_unit(d) -> bool:
    return isinstance(d, int) and d == 1


def _same_non_unit_dims(a, b) -> bool:
    """Shapes `a` and `b` (symbolic) differ only by static unit dims."""
    return [str(d) for d in a if not _is_unit(d)] == [str(d) for d in b if not _is_unit(d)]


def _unit_groups(shape) -> list[list[int]]:
    """The reassociation of `shape` onto its non-unit dims: each unit dim joins the group of the
    next non-unit dim (trailing ones the last group); none when every dim is a unit."""
    groups, pending = [], []
    for i, d in enumerate(shape):
        pending.append(i)
        if not _is_unit(d):
            groups.append(pending)
            pending = []
    if groups and pending:
        groups[-1] += pending
    return groups


class Builder:
    """Small typed helpers over the bindings; every method inserts at the current point."""

    def __init__(self, ir, tosa, arith, math, func):
        self.ir, self.tosa, self.arith, self.math, self.func = ir, tosa, arith, math, func
        self.symbols: dict = {}   # sympy Symbol -> (function argument, dim) that holds it
        self.indices: dict = {}   # sympy expression -> its index value (one per function)

    def elem(self, dtype: torch.dtype):
        ir = self.ir
        if dtype in (torch.int8, torch.uint8):
            return ir.IntegerType.get_signless(8)
        if dtype == torch.int32:
            return ir.IntegerType.get_signless(32)
        if dtype == torch.float32:
            return ir.F32Type.get()
        if dtype == torch.bool:
            return ir.IntegerType.get_signless(1)
        if dtype == torch.int64:
            return ir.IntegerType.get_signless(64)
        raise NotImplementedError(f"dtype {dtype} has no TOSA lowering")

    def ttype(self, shape, dtype: torch.dtype):
        dynamic = self.ir.ShapedType.get_dynamic_size()
        return self.ir.RankedTensorType.get([dynamic if d == DYN else d for d in shape], self.elem(dtype))

    def const(self, array: np.ndarray):
        """tosa.const of a numpy array (dtype decides the element type; uint8 must be offset first)."""
        return self.tosa.const(self.ir.DenseElementsAttr.get(np.ascontiguousarray(array)))

    def splat(self, shape, dtype: torch.dtype, value, like=None):
        """A splat of `value` for elementwise arith on tensors: an arith.constant, or for a
        dynamic shape a linalg.fill of a tensor.empty with `like`'s dynamic sizes (`like`: a
        value of that shape; IREE rejects a dynamic tensor.splat)."""
        ir, t = self.ir, self.ttype(shape, dtype)
        et = self.elem(dtype)
        attr = ir.FloatAttr.get(et, float(value)) if dtype.is_floating_point else ir.IntegerAttr.get(et, int(value))
        if DYN not in shape:
            return self.arith.constant(t, ir.DenseElementsAttr.get_splat(t, attr))
        from iree.compiler.dialects import linalg, tensor
        if like is None:
            raise NotImplementedError("a splat of a dynamic shape needs a value of that shape")
        sizes = [tensor.dim(like, self.arith.constant(ir.IndexType.get(), ir.IntegerAttr.get(ir.IndexType.get(), i)))
                 for i, d in enumerate(shape) if d == DYN]
        empty = tensor.empty([d if d != DYN else sizes.pop(0) for d in shape], et)
        return linalg.fill(self.arith.constant(et, attr), outs=[empty])

    def zp(self, value: int, dtype: torch.dtype):
        """A TOSA zero-point operand (tensor<1xi8> / tensor<1xi32>)."""
        np_dtype = np.int8 if dtype in (torch.int8, torch.uint8) else np.int32
        info = np.iinfo(np_dtype)
        if not info.min <= value <= info.max:
            raise ValueError(f"zero point {value} does not fit {np_dtype.__name__}")
        return self.const(np.array([value], dtype=np_dtype))

    def shape_value(self, values: list[int]):
        """A !tosa.shape operand (reshape target, slice start/size)."""
        ir = self.ir
        shape_t = ir.Type.parse(f"!tosa.shape<{len(values)}>")
        return self.tosa.const_shape(shape_t, ir.DenseElementsAttr.get(np.array(values, dtype=np.int64),
                                                                        type=ir.IndexType.get()))

    def bind_sizes(self, arg, shape) -> None:
        """Record which function argument and dim give each symbolic size (a sympy Symbol) of
        `shape` (a fake tensor's), for reshapes to more than one dynamic dim."""
        for i, d in enumerate(shape):
            expr = getattr(getattr(d, "node", None), "expr", None)
            if expr is not None and getattr(expr, "is_Symbol", False):
                self.symbols.setdefault(expr, (arg, i))

    def index(self, size):
        """An `index` value computing `size` (an int, SymInt or sympy expression of the bound
        symbols: products and sums) at run time from the function's argument dims."""
        import sympy
        expr = sympy.sympify(getattr(getattr(size, "node", None), "expr", size))
        if expr in self.indices:
            return self.indices[expr]
        ir, index_t = self.ir, self.ir.IndexType.get()
        if expr.is_Integer:
            value = self.arith.constant(index_t, ir.IntegerAttr.get(index_t, int(expr)))
        elif expr.is_Symbol:
            if expr not in self.symbols:
                raise NotImplementedError(f"size {expr} is not a dim of the cluster's inputs")
            from iree.compiler.dialects import tensor
            arg, dim = self.symbols[expr]
            value = tensor.dim(arg, self.index(dim))
        elif expr.is_Mul or expr.is_Add:
            combine = self.arith.muli if expr.is_Mul else self.arith.addi
            terms = [self.index(t) for t in expr.args]
            value = terms[0]
            for t in terms[1:]:
                value = combine(value, t)
        else:
            raise NotImplementedError(f"size {expr} is not lowered (products and sums of input dims are)")
        self.indices[expr] = value
        return value

    def reshape(self, v: Val, shape: list[int], sym=None, sym_in=None) -> Val:
        """tosa.reshape (its one -1 dim inferred); to more than one dynamic dim, unit dims added
        or dropped (`sym_in`, v's symbolic shape, shows it) as tensor.collapse_shape /
        expand_shape, else tensor.reshape with the sizes `sym` (the target's symbolic shape)
        computed at run time.

        Why the unit-dim form: IREE cannot see through tensor.reshape's runtime shape operand.
        MPNet int8 (batch and sequence dynamic): its position bias, unsqueezed and expanded
        through tensor.reshape, makes iree-compile fail on the softmax it feeds ("exceeded stack
        allocation limit ... Got 864691128455135936 bytes"); with the same reshape as
        collapse/expand it compiles."""
        if sym is not None and sym_in is not None and list(shape).count(DYN) > 1 and _same_non_unit_dims(sym_in, sym):
            return self._reshape_unit_dims(v, list(shape), sym_in, sym)
        if list(shape).count(DYN) <= 1:
            out = self.tosa.reshape(v.value, self.shape_value(shape), results=[self.ttype(shape, v.dtype)])
            return Val(out, v.dtype, list(shape), v.offset)
        if sym is None or len(sym) != len(shape):
            raise NotImplementedError("reshape to more than one dynamic dim without its symbolic sizes")
        from iree.compiler.dialects import tensor
        index_t = self.ir.IndexType.get()
        sizes = tensor.from_elements(self.ir.RankedTensorType.get([len(shape)], index_t),
                                     [self.index(d) for d in sym])
        out = tensor.reshape(self.ttype(shape, v.dtype), v.value, sizes)
        return Val(out, v.dtype, list(shape), v.offset)

    def _reshape_unit_dims(self, v: Val, shape: list[int], sym_in, sym_out) -> Val:
        """v reshaped by adding / dropping static unit dims only: collapse onto its non-unit
        dims, then expand to `shape`."""
        from iree.compiler.dialects import tensor
        core_shape = [d for d, s in zip(v.shape, sym_in) if not _is_unit(s)]
        core = v.value
        if len(core_shape) != len(v.shape):
            core = tensor.collapse_shape(self.ttype(core_shape, v.dtype), core, _unit_groups(sym_in))
        if len(core_shape) != len(shape):
            index_t = self.ir.IndexType.get()
            dynamic = [tensor.dim(core, self.arith.constant(index_t, self.ir.IntegerAttr.get(index_t, i)))
                       for i, d in enumerate(core_shape) if d == DYN]
            static = [self.ir.ShapedType.get_dynamic_size() if d == DYN else d for d in shape]
            core = tensor.expand_shape(self.ttype(shape, v.dtype), core, _unit_groups(sym_out), dynamic, static)
        return Val(core, v.dtype, list(shape), v.offset)

    def broadcast(self, v: Val, sym_in, sym_out) -> Val:
        """`v` (symbolic shape `sym_in`) expanded to `sym_out`: new leading dims and size-1 dims
        that grow. The kept dims are reshaped out first, then one linalg.broadcast into a
        tensor.empty whose dynamic sizes `index` computes from the argument dims."""
        from iree.compiler.dialects import linalg, tensor
        lead = len(sym_out) - len(sym_in)
        grown = list(range(lead)) + [lead + i for i, d in enumerate(sym_in) if str(d) != str(sym_out[lead + i])]
        if not grown:
            return v
        kept = [d for i, d in enumerate(sym_in) if lead + i not in grown]
        core = self.reshape(v, dims(kept), kept, sym_in) if len(kept) != len(sym_in) else v
        empty = tensor.empty([d if isinstance(d, int) else self.index(d) for d in sym_out], self.elem(v.dtype))
        out = linalg.broadcast(core.value, outs=[empty], dimensions=grown)
        return Val(out, v.dtype, dims(sym_out), v.offset)

    def crop(self, v: Val, size: list[int]) -> Val:
        """The leading `size` block of v (tosa.slice from 0)."""
        if list(size) == v.shape:
            return v
        out = self.tosa.slice(self.ttype(size, v.dtype), v.value, self.shape_value([0] * len(size)),
                              self.shape_value(list(size)))
        return Val(out, v.dtype, list(size), v.offset)

    def transpose(self, v: Val, perm: list[int]) -> Val:
        perm = list(perm)
        if v.transposed_from is not None:   # transpose of a transpose: one transpose of the source
            src, first = v.transposed_from
            return self.transpose(src, [first[p] for p in perm])
        if perm == list(range(len(perm))):
            return v
        shape = [v.shape[p] for p in perm]
        out = self.tosa.transpose(self.ttype(shape, v.dtype), v.value, perm)
        return Val(out, v.dtype, shape, v.offset, (v, perm))

    def ext_i32(self, v: Val) -> Val:
        """i8 -> i32, sign-extending the stored value (offset unchanged)."""
        out = self.arith.extsi(self.ttype(v.shape, torch.int32), v.value)
        return Val(out, torch.int32, v.shape, v.offset)

    def xor_u8(self, value, shape):
        """Flip the top bit of i8 storage: uint8 bytes <-> (q - 128) as signed i8."""
        mask = self.const(np.full([1] * len(shape), -128, dtype=np.int8))
        return self.tosa.bitwise_xor(self.ttype(shape, torch.int8), value, mask)


class TosaEmitter:
    """Emits a cluster GraphModule (constants bound as get_attr) as func.func @main."""

    def __init__(self, sub: GraphModule, options=None):
        self.sub = sub
        self.options = options or IreeOptions()
        self.env: dict[Node, Val] = {}
        self.private_functions = 0

    def constant(self, node) -> torch.Tensor | None:
        return constant_value(self.sub, node)

    def value(self, node: Node) -> Val:
        if node not in self.env:   # a constant tensor used as a value (e.g. a matmul operand)
            t = self.constant(node)
            if t is None:
                raise NotImplementedError(f"{node.name}: neither emitted nor a constant")
            self.env[node] = self.constant_val(t)
        return self.env[node]

    def constant_val(self, t: torch.Tensor) -> Val:
        off, t = offset_of(t.dtype), t.detach()   # a parameter used as a value requires grad
        stored = (t.to(torch.int32) - off).to(torch.int8) if t.dtype == torch.uint8 else t
        return Val(self.b.const(stored.contiguous().numpy()), t.dtype, list(t.shape), off)

    def emit(self, sum_inputs: tuple[int, ...] = ()) -> EmittedModule:
        """The cluster as `main`, plus CHECKED_ENTRY when `sum_inputs` (float32 input positions)
        is not empty."""
        from iree.compiler import ir
        from iree.compiler.dialects import arith, func, math, tosa
        self.b = Builder(ir, tosa, arith, math, func)
        self.float_functions: list[str] = []
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.create()
            inputs = [n for n in self.sub.graph.nodes if n.op == "placeholder"]
            in_vals = [n.meta["val"] for n in inputs]
            out_node = next(n for n in self.sub.graph.nodes if n.op == "output")
            single = not isinstance(out_node.args[0], (tuple, list))
            outs = [out_node.args[0]] if single else list(out_node.args[0])
            if not all(isinstance(v, torch.Tensor) for v in in_vals):
                raise NotImplementedError("a cluster input is not a tensor")
            arg_types = [self.b.ttype(dims(v.shape), v.dtype) for v in in_vals]
            self.module_ip = ir.InsertionPoint(module.body)
            with ir.InsertionPoint(module.body):
                fn = func.FuncOp("main", (arg_types, [self.b.ttype(dims(o.meta["val"].shape), o.meta["val"].dtype)
                                                      for o in outs]))
                with ir.InsertionPoint(fn.add_entry_block()):
                    self._bind_inputs(inputs, fn.arguments)
                    self._import_float_nodes()
                    self._emit_nodes()
                    func.ReturnOp([self._boundary_out(self.value(o)) for o in outs])
                if sum_inputs:
                    self._emit_checked_entry(fn, arg_types, sum_inputs)
            if not module.operation.verify():
                raise RuntimeError("emitted TOSA module does not verify")
            op_names = [op.operation.name for op in fn.entry_block.operations]
            return EmittedModule(str(module), [v.dtype for v in in_vals],
                                 [o.meta["val"].dtype for o in outs], single, op_names, tuple(sum_inputs))

    def _emit_checked_entry(self, main, arg_types: list, sum_inputs: tuple[int, ...]) -> None:
        """func.func @CHECKED_ENTRY(args) = (main(args)..., sum(args[i]) for i in sum_inputs):
        each sum a tensor<1xf32>, reduced one axis at a time (dims of any size, dynamic too)."""
        from iree.compiler.dialects import func
        b, ir = self.b, self.b.ir
        result_types = list(main.type.results) + [b.ttype([1], torch.float32)] * len(sum_inputs)
        fn = func.FuncOp(CHECKED_ENTRY, (arg_types, result_types))
        with ir.InsertionPoint(fn.add_entry_block()):
            args = list(fn.arguments)
            outs = func.CallOp(main, args).results
            sums = []
            for pos in sum_inputs:
                t = ir.RankedTensorType(arg_types[pos])
                shape = [DYN if t.is_dynamic_dim(d) else t.get_dim_size(d) for d in range(t.rank)]
                value = args[pos]
                for axis in range(t.rank):
                    shape[axis] = 1
                    value = b.tosa.reduce_sum(value, axis, results=[b.ttype(shape, torch.float32)])
                sums.append(b.tosa.reshape(value, b.shape_value([1]), results=[b.ttype([1], torch.float32)]))
            func.ReturnOp(list(outs) + sums)

    def _bind_inputs(self, inputs: list[Node], args) -> None:
        for node, arg in zip(inputs, args):
            val = node.meta["val"]
            shape = dims(val.shape)
            self.b.bind_sizes(arg, val.shape)
            if val.dtype == torch.uint8:
                self.env[node] = Val(self.b.xor_u8(arg, shape), val.dtype, shape, U8_OFFSET)
            else:
                self.env[node] = Val(arg, val.dtype, shape, 0)

    def _boundary_out(self, v: Val):
        if v.dtype == torch.uint8:
            return self.b.xor_u8(v.value, v.shape)
        return v.value

    def _emit_nodes(self) -> None:
        for node in self.sub.graph.nodes:
            if node.op != "call_function":
                continue
            kind = kind_of(node)
            if kind == "size":   # a size computation: emitters read sizes from the graph's shapes
                continue
            if node.target is operator.getitem and kind is not None:   # a pick of a multi-result op
                self.env[node] = self.env[node.args[0]][node.args[1]]
            elif kind == "tosa":
                self.env[node] = TOSA_LOWERINGS[schema_name(node)].emit(self, node)
            elif kind == "torch":
                self.env[node] = self._emit_float(node)
            else:
                raise NotImplementedError(f"{schema_name(node)} is lowered neither to TOSA nor by the importer")

    def call_text_function(self, text: str, name: str, args: list, result_types: list):
        """Parse `text` (one `func.func private @name`), move it into the module and call it with
        `args` (ir.Values); IREE inlines the call. Returns the call's results."""
        from iree.compiler import ir
        parsed = ir.Module.parse(text)
        fn = next(op for op in parsed.body.operations if op.operation.name == "func.func")
        self.module_ip.insert(fn.operation.detach_from_parent())
        self.private_functions += 1
        return self.b.func.CallOp(result_types, name, args).results

    def _argument(self, node: Node):
        """A lone float function's argument: a tensor's value, or a symbolic size it cannot
        compute itself as an i64 computed from this module's argument dims."""
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return self.value(node).value
        i64 = self.b.ir.IntegerType.get_signless(64)
        return self.b.arith.index_cast(i64, self.b.index(val))

    def _import_float_nodes(self) -> None:
        """Import every float op `_emit_float` will import (all but the reshapes and expands
        qlower emits itself) at once: one torch-mlir pipeline run for the whole cluster
        (torch_import.float_node_functions), named in graph order."""
        nodes = [n for n in self.sub.graph.nodes if n.op == "call_function" and kind_of(n) == "torch"
                 and n.target is not operator.getitem and schema_name(n) not in tosa_ops.FLOAT_SHAPE_OPS]
        named = [(n, f"float_{i}") for i, n in enumerate(nodes)]
        functions, self._imported_module = torch_import.float_node_functions(self.sub, named) if named else ({}, None)
        self.imported = {n: (name, functions[n]) for n, name in named}

    def _emit_float(self, node: Node):
        """A float op inside an integer cluster: imported alone (FX importer), lowered to linalg
        by torch-mlir's pipeline, moved into this module as a private function and called.

        A float view/reshape is emitted here instead, like an integer one: imported alone,
        torch-mlir lowers `view(x, [-1, 64])` of x [?, ?, 64] (also with the size written as
        s0*s1) as a cast of x to [?, 1, 64], and IREE then asserts at every call that the
        sequence is 1 (GPT-2 / OPT int8 with batch and sequence dynamic: three clusters failed at
        their first call and ran in PyTorch)."""
        reshaped = tosa_ops.float_shape_op(self, node)
        if reshaped is not None:
            return reshaped
        if node in self.imported:
            name, (fn, runtime) = self.imported.pop(node)
        else:   # a float reshape / expand float_shape_op could not size
            name = f"float_lone_{len(self.float_functions)}"
            fn, runtime, _ = torch_import.float_node_function(self.sub, node, name)
        self.module_ip.insert(fn.operation.detach_from_parent())
        self.float_functions.append(name)
        results = list(fn.type.results)
        call = self.b.func.CallOp(results, name, [self._argument(a) for a in runtime])
        vals = node.meta["val"]
        many = isinstance(vals, (tuple, list))
        outs = [Val(r, v.dtype, dims(v.shape)) for r, v in zip(call.results, vals if many else [vals])]
        return outs if many else outs[0]
