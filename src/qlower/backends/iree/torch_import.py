"""Float clusters through the ecosystem's importer: torch's FX importer (shipped with
iree-base-compiler as iree.compiler.extras.fx_importer) turns the cluster's FX graph into the
torch dialect, which IREE lowers itself (`--iree-input-type=torch`). qlower keeps no ATen->MLIR
table: whatever the importer and IREE cannot handle makes the cluster fall back, with the
compiler's message as the reason."""
from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from ...fx import constant_value


def import_float_cluster(sub: GraphModule):
    """torch-dialect MLIR of `sub` (constants are get_attr nodes, imported as literals)."""
    from iree.compiler.extras.fx_importer import FxImporter
    from .tosa_emit import EmittedModule
    importer = FxImporter()
    importer.import_stateless_graph(sub.graph, func_name="main")
    inputs = [n.meta["val"] for n in sub.graph.nodes if n.op == "placeholder"]
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    single = not isinstance(out, (tuple, list))
    outs = [out] if single else list(out)
    return EmittedModule(str(importer.module_op), [v.dtype for v in inputs],
                         [o.meta["val"].dtype for o in outs], single)


# torch-mlir's own lowering of the torch dialect to linalg on builtin tensors (registered in
# iree-base-compiler's Python PassManager): how a float op joins a TOSA module (see docs/iree.md).
_TO_LINALG = ("builtin.module(torch-function-to-torch-backend-pipeline,"
              "torch-backend-to-linalg-on-tensors-backend-pipeline)")


def _one_node_graph(sub: GraphModule, node: Node) -> tuple[GraphModule, list[Node]]:
    """`node` alone as a GraphModule: its constant inputs as get_attr (imported as literals),
    the others as placeholders. Returns it and the runtime inputs, in placeholder order."""
    owner = torch.nn.Module()
    graph = torch.fx.Graph()
    env: dict[Node, Node] = {}
    runtime: list[Node] = []
    for i, arg in enumerate(node.all_input_nodes):
        value = constant_value(sub, arg)
        if value is not None:
            owner.register_buffer(f"c{i}", value)
            env[arg] = graph.get_attr(f"c{i}")
        else:
            env[arg] = graph.placeholder(f"in{i}")
            runtime.append(arg)
        env[arg].meta["val"] = arg.meta["val"]
    copy = graph.node_copy(node, lambda a: env[a])
    copy.meta["val"] = node.meta["val"]
    if isinstance(node.meta["val"], (tuple, list)):   # a list result (unbind, split): a tuple of
        picks = []                                    # tensors, which the linalg pipeline takes
        for i, v in enumerate(node.meta["val"]):
            picks.append(graph.call_function(operator.getitem, (copy, i)))
            picks[-1].meta["val"] = v
        graph.output(tuple(picks))
    else:
        graph.output(copy)
    return GraphModule(owner, graph), runtime


def float_node_function(sub: GraphModule, node: Node, name: str):
    """A private func.func `name` computing `node` on builtin tensors, in the current MLIR
    context (parsed and ready to move into the caller's module), and its runtime inputs."""
    from iree.compiler import ir, passmanager
    from iree.compiler.extras.fx_importer import FxImporter
    gm, runtime = _one_node_graph(sub, node)
    importer = FxImporter(context=ir.Context.current, config_check=False)
    importer.import_stateless_graph(gm.graph, func_name=name)
    module = importer.module
    passmanager.PassManager.parse(_TO_LINALG).run(module.operation)
    fn = next(op for op in module.body.operations if op.operation.name == "func.func")
    fn.operation.attributes["sym_visibility"] = ir.StringAttr.get("private")
    return fn, runtime, module
