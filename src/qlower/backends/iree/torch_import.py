"""Float clusters through the ecosystem's importer: torch's FX importer (shipped with
iree-base-compiler as iree.compiler.extras.fx_importer) turns the cluster's FX graph into the
torch dialect, which IREE lowers itself (`--iree-input-type=torch`). qlower keeps no ATen->MLIR
table: whatever the importer and IREE cannot handle makes the cluster fall back, with the
compiler's message as the reason."""
from __future__ import annotations

from torch.fx import GraphModule

from .tosa_emit import EmittedModule


def import_float_cluster(sub: GraphModule) -> EmittedModule:
    """torch-dialect MLIR of `sub` (constants are get_attr nodes, imported as literals)."""
    from iree.compiler.extras.fx_importer import FxImporter
    importer = FxImporter()
    importer.import_stateless_graph(sub.graph, func_name="main")
    inputs = [n.meta["val"] for n in sub.graph.nodes if n.op == "placeholder"]
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    single = not isinstance(out, (tuple, list))
    outs = [out] if single else list(out)
    return EmittedModule(str(importer.module_op), [v.dtype for v in inputs],
                         [o.meta["val"].dtype for o in outs], single)
