"""qlower's PT2E Quantizer: annotates an exported ATen graph for torchao's prepare_pt2e.

Scheme (QuantConfig): activations uint8 asymmetric per-tensor (or int8 symmetric), weights int8
symmetric per-output-channel, bias int32 with scale fp32(sx * sw) (derived, zero point 0).
- conv1d/conv2d/linear: input, weight, bias; output (or the output of a directly following
  relu/hardtanh/clamp, which is then fused).
- matmul/bmm, add/mul (tensor operands): every tensor input, output (relu fused as above).
- ops that cannot widen the range (relu, pools, reshape family, concat): output shares the
  input's qparams, so they run on integers unchanged.
- layer_norm and a written-out RMSNorm, with quantize_add: a float input (an embedding sum, a
  token embedding) is quantized, for integer_layer_norm / integer_rms_norm.
Everything else (softmax, gelu, ...) stays float: its inputs are dequantized.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import HistogramObserver, MinMaxObserver, PerChannelMinMaxObserver
from torchao.quantization.pt2e.quantizer import (DerivedQuantizationSpec, QuantizationAnnotation,
                                                 QuantizationSpec, Quantizer, SharedQuantizationSpec)

from .. import blockops  # noqa: F401  (registers the block ops annotated below)
from .. import numerics
from ..axis import SHAPE_OPS, derive
from ..meta import QParams
from ..patterns import match_rms_norm
from .config import QuantConfig
from .observers import MSEObserver, PercentileObserver

aten = torch.ops.aten
ANNOTATION_KEY = "quantization_annotation"

WEIGHTED_OPS = {aten.conv1d.default: 1, aten.conv2d.default: 1, aten.linear.default: 1}
BINARY_OPS = {aten.matmul.default, aten.bmm.default, aten.add.Tensor, aten.mul.Tensor}
FUSABLE_ACTIVATIONS = {aten.relu.default, aten.relu_.default, aten.hardtanh.default,
                       aten.hardtanh_.default, aten.clamp.default}
RANGE_PRESERVING_OPS = {
    aten.relu.default, aten.relu_.default, aten.hardtanh.default, aten.clamp.default,
    aten.max_pool2d.default, aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default,
    aten.reshape.default, aten.view.default, aten.flatten.using_ints, aten.permute.default,
    aten.transpose.int, aten.squeeze.dim, aten.unsqueeze.default, aten.contiguous.default,
    aten.slice.Tensor, aten.select.int, aten.clone.default,
}
CONCAT_OPS = {aten.cat.default, aten.concat.default}
# Multi-output shape ops: their pieces (getitem nodes) share the input's qparams, as the pieces
# of a reshape do; giving q/k/v of a fused projection their own qparams would requantize each.
SPLIT_OPS = {aten.unbind.int, aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default}
# Block ops are quantized at their boundary only: these inputs and (single) output get activation
# qparams; masks, lengths, weights, tables and recurrent state stay float.
_q = torch.ops.qlower
BLOCK_OP_ACTIVATION_INPUTS = {
    _q.rms_norm.default: (0,), _q.layer_norm.default: (0,), _q.skip_layer_norm.default: (0, 1),
    _q.group_norm.default: (0,), _q.masked_softmax.default: (0,), _q.attention.default: (0, 1, 2),
    _q.rotary_embedding.default: (0,),
}


class QlowerQuantizer(Quantizer):
    """PT2E quantizer implementing the scheme in the module docstring."""

    def __init__(self, config: QuantConfig | None = None):
        super().__init__()
        self.config = config or QuantConfig()
        self.act_spec = self._activation_spec()
        self.act_sym_spec = self._activation_spec(symmetric_int8=True)
        self.weight_spec = self._weight_spec(self.config.weight_bits)
        self.per_token_weight_spec = self._weight_spec(self.config.linear_weight_bits)

    # ---------------------------------------------------------------- specs
    def _activation_spec(self, symmetric_int8: bool = False) -> QuantizationSpec:
        c = self.config
        unsigned = c.activation_dtype == "uint8" and not symmetric_int8
        dtype = torch.uint8 if unsigned else torch.int8
        qmin, qmax = numerics.dtype_range(dtype)
        extra = {"eps": 2**-12}
        if c.observer == "histogram":
            ctor = HistogramObserver
        elif c.observer == "percentile":
            ctor, extra = PercentileObserver, {**extra, "percentile": c.percentile}
        elif c.observer == "mse":
            ctor = MSEObserver
        else:
            ctor = MinMaxObserver
        return QuantizationSpec(
            dtype=dtype, quant_min=qmin, quant_max=qmax,
            qscheme=torch.per_tensor_affine if unsigned else torch.per_tensor_symmetric,
            is_dynamic=False, observer_or_fake_quant_ctr=ctor.with_args(**extra))

    def _weight_spec(self, bits: int) -> QuantizationSpec:
        c = self.config
        bound = (1 << (bits - 1)) - 1
        if c.per_channel:
            return QuantizationSpec(dtype=torch.int8, quant_min=-bound, quant_max=bound,
                                    qscheme=torch.per_channel_symmetric, ch_axis=0, is_dynamic=False,
                                    observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=2**-12))
        return QuantizationSpec(dtype=torch.int8, quant_min=-bound, quant_max=bound,
                                qscheme=torch.per_tensor_symmetric, is_dynamic=False,
                                observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))

    def _bias_spec(self, node: Node, act: Node | None = None, weight: Node | None = None) -> DerivedQuantizationSpec:
        act = act if act is not None else node.args[0]
        weight = weight if weight is not None else node.args[1]

        def derive(observers):
            act_scale, _ = observers[0].calculate_qparams()
            w_scale, _ = observers[1].calculate_qparams()
            scale = numerics.accumulator_scale(act_scale, w_scale).reshape(-1)
            return scale, torch.zeros_like(scale, dtype=torch.int32)

        per_channel = self.config.per_channel
        return DerivedQuantizationSpec(
            derived_from=[(act, node), (weight, node)], derive_qparams_fn=derive, dtype=torch.int32,
            quant_min=numerics.INT32_MIN, quant_max=numerics.INT32_MAX,
            qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
            ch_axis=0 if per_channel else None)

    # ---------------------------------------------------------------- annotation
    def _kept_float(self, node: Node) -> bool:
        """True for nodes produced inside a module listed in config.keep_float."""
        if not self.config.keep_float:
            return False
        stack = node.meta.get("nn_module_stack") or {}
        paths = [str(v[0]) for v in stack.values()]
        return any(p == k or p.startswith(k + ".") for p in paths for k in self.config.keep_float)

    def annotate(self, model: GraphModule) -> GraphModule:
        for node in model.graph.nodes:
            if node.op != "call_function" or _annotated(node):
                continue
            if self._kept_float(node):
                node.meta[ANNOTATION_KEY] = QuantizationAnnotation({}, None, _annotated=True)
                continue
            if node.target in WEIGHTED_OPS:
                self._annotate_weighted(node)
            elif node.target in BINARY_OPS:
                self._annotate_binary(node)
            elif node.target in BLOCK_OP_ACTIVATION_INPUTS:
                self._annotate_block_op(node)
            elif node.target is aten.addmm.default:
                self._annotate_addmm(node)
            elif node.target is aten.layer_norm.default:
                self._annotate_layer_norm(node)
            elif node.target is aten.pow.Tensor_Scalar:
                self._annotate_rms_norm(node)
        for node in model.graph.nodes:  # second sweep: ops sharing their input's qparams
            if node.op != "call_function" or _annotated(node):
                continue
            # Only where the input already carries qparams: sharing them then costs nothing,
            # while annotating a float input would add a quantization step of its own.
            if node.target in RANGE_PRESERVING_OPS and _is_float_tensor(node.args[0]) \
                    and _from_quantized(node.args[0]):
                self._annotate_shared(node, [node.args[0]])
            elif node.target in CONCAT_OPS and all(_is_float_tensor(a) and _from_quantized(a) for a in node.args[0]):
                self._annotate_shared(node, list(node.args[0]))
            elif node.target in SPLIT_OPS and _is_float_tensor(node.args[0]) and _from_quantized(node.args[0]) \
                    and all(u.target is operator.getitem for u in node.users):
                self._annotate_split(node)
        return model

    def _output_node(self, node: Node) -> Node:
        """The node whose output carries `node`'s qparams: a sole following activation if any."""
        users = list(node.users)
        if len(users) == 1 and users[0].target in FUSABLE_ACTIVATIONS and not _annotated(users[0]):
            return users[0]
        return node

    def _finish(self, node: Node, inputs: dict) -> None:
        out = self._output_node(node)
        # Outputs read only by layers kept float (mixed precision) are not quantized either:
        # that rounding would be the kept layer's error, which keeping it float is meant to remove.
        feeds_kept_float = bool(out.users) and all(self._kept_float(u) for u in out.users)
        if (not self.config.requantize_outputs or feeds_kept_float) and \
                not any(self._takes_quantized(u) for u in out.users):
            node.meta[ANNOTATION_KEY] = QuantizationAnnotation(inputs, None, _annotated=True)
            if out is not node:
                out.meta[ANNOTATION_KEY] = QuantizationAnnotation({}, None, _annotated=True)
            return
        if out is node:
            node.meta[ANNOTATION_KEY] = QuantizationAnnotation(inputs, self.act_spec, _annotated=True)
        else:
            node.meta[ANNOTATION_KEY] = QuantizationAnnotation(inputs, None, _annotated=True)
            out.meta[ANNOTATION_KEY] = QuantizationAnnotation({}, self.act_spec, _annotated=True)

    def _takes_quantized(self, user: Node) -> bool:
        """Whether `user` (looking through shape-only ops) would quantize this input itself."""
        if user.op != "call_function":
            return False  # placeholder-free graphs: only the model output, which stays float
        if self._kept_float(user):
            return False
        if user.target in RANGE_PRESERVING_OPS or user.target in CONCAT_OPS or user.target in SPLIT_OPS \
                or user.target is operator.getitem:
            return any(self._takes_quantized(u) for u in user.users)
        if user.target is aten.add.Tensor:
            return self.config.quantize_add
        if user.target is aten.mul.Tensor:
            return self.config.quantize_mul
        if self._per_token(user):
            return False
        if user.target in (aten.matmul.default, aten.bmm.default) and not self.config.quantize_activation_matmul:
            return False
        return user.target in WEIGHTED_OPS or user.target in BINARY_OPS or \
            user.target in BLOCK_OP_ACTIVATION_INPUTS or user.target is aten.addmm.default

    def _per_token(self, node: Node) -> bool:
        """Linear layers whose activation is quantized at run time (per token or per tensor)."""
        return self.config.run_time_activations and node.target in (aten.linear.default, aten.addmm.default)

    def _annotate_per_token(self, node: Node, w: Node, out_axis: int) -> None:
        """Only the weight is annotated: the activation stays float here and is quantized per
        token (or per tensor) after convert (quantize/per_token.py); the output is float (the accumulator
        dequantized with the run-time scale), so consumers quantize their own inputs."""
        spec = self.per_token_weight_spec
        inputs = {} if self._annotate_weight_chain(w, out_axis=out_axis, base=spec) \
            else {w: self._weight_spec_on(out_axis, spec)}
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation(inputs, None, _annotated=True)

    def _annotate_weighted(self, node: Node) -> None:
        x, w = node.args[0], node.args[1]
        bias = node.args[2] if len(node.args) > 2 else None
        if not (_is_float_tensor(x) and _is_float_tensor(w)):
            return
        if self._per_token(node):
            self._annotate_per_token(node, w, 0)
            return
        inputs = {x: self.act_spec}
        if not self._annotate_weight_chain(w, out_axis=0):
            inputs[w] = self.weight_spec
        if isinstance(bias, Node) and _is_float_tensor(bias) and w in inputs:
            inputs[bias] = self._bias_spec(node)
        self._finish(node, inputs)

    def _annotate_weight_chain(self, w: Node, out_axis: int, base: QuantizationSpec | None = None) -> bool:
        """A weight reached through shape ops (w.t(), permute, reshape...) from a parameter:
        quantize the parameter itself, per channel along the axis that the shape ops carry to
        the consumer's output-channel axis `out_axis` (TICO #499). Folding then removes the
        shape ops at compile time. True when annotated that way."""
        chain, src = [], w
        while isinstance(src, Node) and src.op == "call_function" and src.target in SHAPE_OPS:
            chain.append(src)
            src = src.args[0]
        if not chain or not (isinstance(src, Node) and src.op == "get_attr"):
            return False
        chain.reverse()
        shape = tuple(src.meta["val"].shape)
        target_axis = out_axis % w.meta["val"].dim()
        for axis in range(len(shape)):
            qp = QParams((1.0,) * shape[axis], (0,) * shape[axis], -127, 127, torch.int8, axis)
            for op in chain:
                qp = derive(op.target, tuple(op.args[1:]), tuple(op.args[0].meta["val"].shape), qp)
                if isinstance(qp, str):
                    break
            if not isinstance(qp, str) and (qp.axis == target_axis or not self.config.per_channel):
                spec = self._weight_spec_on(axis, base)
                chain[0].meta[ANNOTATION_KEY] = QuantizationAnnotation({src: spec}, None, _annotated=True)
                for op in chain[1:]:
                    op.meta[ANNOTATION_KEY] = QuantizationAnnotation({}, None, _annotated=True)
                return True
        return False

    def _weight_spec_on(self, axis: int, base: QuantizationSpec | None = None) -> QuantizationSpec:
        """`base` (default: the static ops' weight spec) on output-channel axis `axis`."""
        base = base if base is not None else self.weight_spec
        if not self.config.per_channel:
            return base
        from dataclasses import replace
        return replace(base, ch_axis=axis)

    def _annotate_binary(self, node: Node) -> None:
        if node.target in (aten.matmul.default, aten.mm.default) and _is_float_tensor(node.args[0]) and \
                self._annotate_weight_chain(node.args[1], out_axis=-1):
            self._finish(node, {node.args[0]: self.act_spec})
            return
        tensors = [a for a in node.args[:2] if _is_float_tensor(a)]
        if node.target in (aten.matmul.default, aten.bmm.default) and not self.config.quantize_activation_matmul:
            return
        if node.target is aten.mul.Tensor and not self.config.quantize_mul:
            return
        if node.target is aten.add.Tensor and not self.config.quantize_add:
            return
        if node.target is aten.add.Tensor and (len(tensors) < 2 or not any(_from_quantized(a) for a in tensors)):
            return  # x + scalar (a norm's eps), or a sum of float values: quantizing only adds rounding
        if not tensors or (node.target in (aten.matmul.default, aten.bmm.default) and len(tensors) != 2):
            return
        self._finish(node, {a: self._matmul_operand_spec(node, a) for a in tensors})

    def _matmul_operand_spec(self, node: Node, operand: Node) -> QuantizationSpec:
        """int8-symmetric for a matmul of two activations when the config asks for it
        (symmetric_activation_matmul), except softmax outputs, which keep the activation spec."""
        if not self.config.symmetric_activation_matmul or node.target not in (aten.matmul.default, aten.bmm.default):
            return self.act_spec
        if operand.op == "call_function" and operand.target in (aten.softmax.int, aten._softmax.default):
            return self.act_spec
        return self.act_sym_spec

    def _annotate_layer_norm(self, node: Node) -> None:
        """With an integer residual stream (quantize_add), a LayerNorm whose input is a float
        value (an embedding sum: gathers and fp32 adds, the same bits on every engine) has that
        input quantized, so integer_layer_norm computes it: a float LayerNorm's ulps differ
        between engines and flip the codes of the linears it feeds. Inputs that already carry
        qparams (a quantized residual add) are left to share them."""
        x = node.args[0]
        if self.config.quantize_add and _is_float_tensor(x) and not _from_quantized(x):
            node.meta[ANNOTATION_KEY] = QuantizationAnnotation({x: self.act_spec}, None, _annotated=True)

    def _annotate_rms_norm(self, pow_node: Node) -> None:
        """The same for a written-out RMSNorm (patterns.match_rms_norm) whose input is a float
        value (LLaMA's token embedding): both its readers, pow and the normalizing mul, take one
        quantized x, so integer_rms_norm computes it."""
        norm = match_rms_norm(pow_node)
        x = pow_node.args[0]
        if norm is None or norm.scaled is not x or not self.config.quantize_add \
                or not _is_float_tensor(x) or _from_quantized(x):
            return
        pow_node.meta[ANNOTATION_KEY] = QuantizationAnnotation({x: self.act_spec}, None, _annotated=True)
        norm.normalizing_mul.meta[ANNOTATION_KEY] = QuantizationAnnotation(
            {x: SharedQuantizationSpec((x, pow_node))}, None, _annotated=True)

    def _annotate_addmm(self, node: Node) -> None:
        """addmm(bias, x, W) with W [in, out] a parameter (HF GPT-2's Conv1D): W per-channel on
        its output axis 1, bias int32 at fp32(sx * sw)."""
        bias, x, w = node.args[:3]
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return
        if not (_is_float_tensor(x) and _is_float_tensor(w)) or w.op != "get_attr" or w.meta["val"].dim() != 2:
            return
        if self._per_token(node):
            self._annotate_per_token(node, w, 1)
            return
        inputs = {x: self.act_spec, w: self._weight_spec_on(1)}
        if _is_float_tensor(bias):
            inputs[bias] = self._bias_spec(node, x, w)
        self._finish(node, inputs)

    def _annotate_block_op(self, node: Node) -> None:
        inputs = {node.args[i]: self.act_spec for i in BLOCK_OP_ACTIVATION_INPUTS[node.target]
                  if _is_float_tensor(node.args[i])}
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation(inputs, self.act_spec, _annotated=True)

    def _annotate_shared(self, node: Node, inputs: list[Node]) -> None:
        inputs = list(dict.fromkeys(inputs))  # cat([x, x]): one spec per distinct input, else x shares with itself
        first = inputs[0]
        spec = {first: self.act_spec}
        spec.update({a: SharedQuantizationSpec((first, node)) for a in inputs[1:]})
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation(
            spec, SharedQuantizationSpec((first, node)), _annotated=True)

    def _annotate_split(self, node: Node) -> None:
        """The input edge takes activation qparams (shared with the producer's output, which
        carries the same spec); each piece shares that edge's qparams."""
        x = node.args[0]
        node.meta[ANNOTATION_KEY] = QuantizationAnnotation({x: self.act_spec}, None, _annotated=True)
        for piece in node.users:
            piece.meta[ANNOTATION_KEY] = QuantizationAnnotation(
                {}, SharedQuantizationSpec((x, node)), _annotated=True)

    def validate(self, model: GraphModule) -> None:
        pass


def _annotated(node: Node) -> bool:
    a = node.meta.get(ANNOTATION_KEY)
    return a is not None and a._annotated


def _from_quantized(node: Node) -> bool:
    """Whether node's value is the output of an op annotated with output qparams (looking
    through shape-only ops, which are annotated later to share them)."""
    while isinstance(node, Node) and node.op == "call_function" and not _annotated(node):
        if node.target in RANGE_PRESERVING_OPS:
            node = node.args[0]
        elif node.target is operator.getitem and getattr(node.args[0], "target", None) in SPLIT_OPS:
            node = node.args[0].args[0]
        else:
            break
    annotation = node.meta.get(ANNOTATION_KEY) if isinstance(node, Node) else None
    return annotation is not None and annotation._annotated and annotation.output_qspec is not None


def _is_float_tensor(arg) -> bool:
    if not isinstance(arg, Node):
        return False
    val = arg.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point
