"""The onnxscript rewrite rules qlower runs (onnx/rewrite_rules.py): tried only at
nodes their pattern can start from, with the same rewritten model as the unfiltered rule set."""
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper
from onnxscript import rewriter

from qlower.onnx import rewrite_rules


def _model() -> onnx.ModelProto:
    """Each kind of rule that fires on translated clusters, beside nodes no rule starts from:
    two Slices of one input that make a Split (SlicesSplit, the rule with two output nodes),
    Reshape of a Reshape, Cast to the same type, Transpose of a Transpose, and Relu / Add."""
    ints = lambda name, values: helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
    init = [ints("b0", [0]), ints("e0", [4]), ints("b1", [4]), ints("e1", [8]), ints("ax", [-1]),
            ints("s1", [4, 4]), ints("s2", [16])]
    nodes = [
        helper.make_node("Slice", ["x", "b1", "e1", "ax"], ["hi"]),   # (in this order SlicesSplit fires)
        helper.make_node("Slice", ["x", "b0", "e0", "ax"], ["lo"]),
        helper.make_node("Add", ["lo", "hi"], ["sum"]),
        helper.make_node("Reshape", ["sum", "s1"], ["r1"]),
        helper.make_node("Reshape", ["r1", "s2"], ["r2"]),
        helper.make_node("Cast", ["r2"], ["c1"], to=TensorProto.FLOAT),
        helper.make_node("Relu", ["c1"], ["relu"]),
        helper.make_node("Reshape", ["relu", "s1"], ["r3"]),
        helper.make_node("Transpose", ["r3"], ["t1"], perm=[1, 0]),
        helper.make_node("Transpose", ["t1"], ["y"], perm=[1, 0]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)


def _rewritten(rules) -> tuple[str, list[str]]:
    model = ir.serde.deserialize_model(_model())
    rewriter.RewritePass(list(rules))(model)
    proto = ir.serde.serialize_model(model)
    return onnx.printer.to_text(proto.graph), [n.op_type for n in proto.graph.node]


def test_root_filtered_rules_rewrite_exactly_as_the_unfiltered_ones():
    filtered, ops = _rewritten(rewrite_rules.exact_rewrite_rules())
    unfiltered, _ = _rewritten(rewrite_rules._exact_rules())
    assert filtered == unfiltered
    # the rules did fire (the comparison is not of two untouched graphs)
    assert "Split" in ops and "Transpose" not in ops and ops.count("Reshape") < 3


def test_a_rule_is_tried_only_at_nodes_of_its_root_op(monkeypatch):
    """The near miss: a Reshape rule is never handed a Slice, Relu or Transpose node (the
    unfiltered set hands every rule every node)."""
    rules = rewrite_rules.exact_rewrite_rules()
    seen: dict[int, set[str]] = {}
    for index, rule in enumerate(rules):
        inner = rule.rule
        original = inner.try_rewrite

        def counting(model, graph, node, *, _index=index, _original=original, **kwargs):
            seen.setdefault(_index, set()).add(node.op_type)
            return _original(model, graph, node, **kwargs)
        monkeypatch.setattr(inner, "try_rewrite", counting)
    _rewritten(rules)
    assert len(seen) > 4, "the rules were not tried"
    for index, op_types in seen.items():
        assert op_types == {rules[index]._op.value()}, (str(rules[index]), op_types)


def test_every_exact_rule_has_a_fixed_root_op_and_the_inexact_ones_stay_out():
    """The filter reads the pattern's first output node (onnxscript 0.7.2): a version whose
    patterns look otherwise fails here, not silently. The tolerance-matching no-op rules
    (x + 0 within a tolerance) are not among them."""
    from onnxscript.rewriter.rules.common import _no_op
    rules = rewrite_rules.exact_rewrite_rules()
    assert all(isinstance(rule._op.value(), str) and rule._op.value() for rule in rules)
    kept = {id(rule.rule) for rule in rules}
    inexact = [r for r in _no_op.rules.rules if r not in (_no_op.dropout_zero_rule, _no_op.dropout_inference_rule)]
    assert inexact and not kept & {id(r) for r in inexact}


@pytest.mark.parametrize("x", [np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)])
def test_the_rewritten_model_computes_what_the_original_does(x):
    import onnxruntime as ort
    model = ir.serde.deserialize_model(_model())
    rewriter.RewritePass(list(rewrite_rules.exact_rewrite_rules()))(model)
    run = lambda proto: ort.InferenceSession(proto.SerializeToString(),
                                             providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(run(ir.serde.serialize_model(model)), run(_model()))
