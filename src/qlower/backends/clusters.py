"""Pieces every clustering backend shares: clustering and fusing the graph, compiling each
cluster in turn, what replaces a cluster with no runtime inputs, and the report lines for the
nodes left in PyTorch."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from ..fx import constant_value, mutated_attributes, schema_name, torch_deprecation_silenced
from ..partition import Capability, cluster_graph
from ..passes.decompose_block_ops import DECOMPOSED_FROM, recompose_block_ops
from ..passes.functionalize_state import WRITE_BACK
from ..core.types import ClusterInfo
from .cluster_sizes import derive_sizes_of_clusters, one_user_per_size, sizes_with_their_users


def fuse_clusters(gm: GraphModule, capability: Capability, min_cluster_size: int):
    """(fused graph, clustering): every cluster of supported nodes becomes one `cluster_<i>`
    submodule call; `clustering.unsupported` lists what stays in PyTorch. Sizes stay with the
    op that reads them and are computed inside the cluster that needs them (cluster_sizes.py):
    a cluster neither takes nor returns a size it can compute from its tensor inputs."""
    one_user_per_size(gm)
    clustering = cluster_graph(gm.graph, capability, min_cluster_size)
    clustering.clusters = sizes_with_their_users(picks_with_their_producer(clustering.clusters))
    fused = fuse_by_partitions(gm, [dict.fromkeys(c) for c in clustering.clusters], prefix="cluster_")
    derive_sizes_of_clusters(fused)
    fused.recompile()
    return fused, clustering


def picks_with_their_producer(clusters: list[list[Node]]) -> list[list[Node]]:
    """A `getitem` whose multi-output producer is not in its cluster leaves it (PyTorch picks the
    tensor, at no cost): a cluster taking the whole tuple could not be re-captured (OpInfo's
    pca_lowrank: a refused linalg_qr's (Q, R) read by a matmul's cluster). A cluster left with
    picks only is dropped."""
    import operator
    out = []
    for nodes in clusters:
        inside = set(nodes)
        kept = [n for n in nodes if not (n.target is operator.getitem and n.args[0] not in inside)]
        if any(n.target is not operator.getitem for n in kept):
            out.append(kept)
    return out


def compile_each_cluster(fused: GraphModule, compile_one: Callable[[GraphModule, Node, int, set[str]], ClusterInfo]
                         ) -> list[ClusterInfo]:
    """`compile_one(fused, call, index, mutated)` for every cluster call, in graph order."""
    mutated = mutated_attributes(fused)
    infos: list[ClusterInfo] = []
    for node in list(fused.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("cluster_"):
            infos.append(compile_one(fused, node, len(infos), mutated))
    return infos


@dataclass
class ClusterInputs:
    """A fused cluster's placeholders split into constants (bound into the engine's model and kept
    for the PyTorch fallback) and the runtime arguments the outer graph still passes."""
    constants: dict[str, torch.Tensor]      # placeholder name -> value
    by_position: dict[int, torch.Tensor]    # placeholder position -> value
    runtime_args: list                      # outer nodes, in placeholder order
    arity: int                              # placeholders in all

    def evaluate(self, sub: GraphModule):
        """The cluster's value when it has no runtime inputs."""
        with torch.no_grad():
            return sub(*[self.by_position[i] for i in range(self.arity)])


def split_inputs(fused: GraphModule, call: Node, mutated: set[str]) -> ClusterInputs:
    """Constants are get_attr values the graph never writes (module state stays a runtime input)."""
    sub: GraphModule = getattr(fused, call.target)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    constants, by_position, runtime_args = {}, {}, []
    for pos, (ph, outer) in enumerate(zip(placeholders, call.args)):
        value = None if getattr(outer, "op", None) == "get_attr" and outer.target in mutated \
            else constant_value(fused, outer)
        if value is not None:
            constants[ph.name] = by_position[pos] = value
        else:
            runtime_args.append(outer)
    return ClusterInputs(constants, by_position, runtime_args, len(placeholders))


def install_constant(fused: GraphModule, call: Node, inputs: ClusterInputs, info: ClusterInfo) -> None:
    """Replace a cluster without runtime inputs by its value, computed now."""
    setattr(fused, call.target, ConstantCluster(inputs.evaluate(getattr(fused, call.target))))
    call.args = ()
    info.status, info.reason = "constant", "no runtime inputs: evaluated once at compile time"


class ConstantCluster(torch.nn.Module):
    """A cluster whose inputs are all constants (e.g. arange -> unsqueeze): its value, computed
    once at compile time; no engine call at run time."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self):
        return self.value


def pytorch_infos(unsupported: dict[str, str], fused: GraphModule, start: int) -> list[ClusterInfo]:
    """One ClusterInfo per node the capability refused (name -> reason): "state" for the buffer
    write-backs of FunctionalizeState and the input write-backs of legalization passes (PyTorch
    by design), "fallback" with the reason otherwise."""
    write_backs = {n.name: n.args[0].op for n in fused.graph.nodes if n.meta.get(WRITE_BACK)}
    infos = []
    for name, reason in unsupported.items():
        state = name in write_backs
        what = "input write-back" if write_backs.get(name) == "placeholder" else "module state write-back"
        infos.append(ClusterInfo(start + len(infos), "pytorch", 1, {name: 1}, "state" if state else "fallback",
                                 what if state else reason))
    return infos


# Ops that map float values to integers: what turns a NaN input into an ordinary number.
_FLOAT_TO_INT = ("qlower::quantize", "qlower::quantize_per_token", "qlower::quantize_dynamic",
                 "quantized_decomposed::quantize_per_tensor", "quantized_decomposed::quantize_per_channel")


def as_numpy(t: torch.Tensor):
    """A zero-copy C-contiguous numpy view of a cluster input for an engine (copies only when
    the tensor is not contiguous; detached when it requires grad)."""
    if t.requires_grad:
        t = t.detach()
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def maps_float_to_integers(gm: GraphModule) -> bool:
    """The graph quantizes a float value somewhere (what makes NaN inputs need a check)."""
    return any(n.op == "call_function" and schema_name(n).split(".")[0] in _FLOAT_TO_INT for n in gm.graph.nodes)


def float_inputs(fused: GraphModule, runtime_args: list) -> dict[int, str | None]:
    """Runtime position -> name of each float32 cluster argument the cluster checks for NaN/inf
    on every call: a graph input carries its name (the NaN policy of a quantized model is told
    about those), any other float32 argument (a value PyTorch or another cluster made) None.

    Why every call: engines do not propagate NaN the way PyTorch does (measured: ONNX Runtime's
    MaxPool skips NaN, its TopK-based sort misplaces it; IREE's clamp / maximum / argmax skip it;
    OpenVINO's max-pool and Softmax), so a call whose input holds NaN/inf runs the cluster in
    PyTorch (`nonfinite_positions`), which gives eager's answer."""
    out = {}
    for pos, arg in enumerate(runtime_args):
        val = arg.meta.get("val") if isinstance(arg, Node) else None
        if isinstance(val, torch.Tensor) and val.dtype is torch.float32:
            out[pos] = arg.name if arg.op == "placeholder" else None
    return out


def nonfinite_positions(args, checks: dict[int, str | None], values) -> list[int]:
    """The checked positions whose input holds NaN/inf, given values that NaN/inf in any checked
    input propagate into (one per input, or one for all: the engine's sum of their sums). The
    exact check runs only when one is not finite (NaN/inf, or finite inputs whose sum overflowed,
    which it tells apart)."""
    if all(math.isfinite(float(v)) for v in values):
        return []
    return [pos for pos in checks if not bool(torch.isfinite(args[pos]).all())]


def pytorch_graph(sub: GraphModule) -> GraphModule:
    """The graph a cluster runs in PyTorch (a call with NaN/inf inputs, a failed engine): `sub`
    with every block op an engine's legalization decomposed called as the block op again
    (`recompose_block_ops`), so those calls give eager's bits, not the decomposition's fp32
    roundings. A new GraphModule sharing sub's tensors; `sub` itself when nothing was decomposed
    (sub stays what the engine was given: export and the data-tiling check read it)."""
    if not any(DECOMPOSED_FROM in n.meta for n in sub.graph.nodes):
        return sub
    graph = torch.fx.Graph()
    out = graph.graph_copy(sub.graph, {})
    graph.output(out)
    gm = GraphModule(sub, graph)
    recompose_block_ops(gm)
    return gm


def run_in_pytorch(fallback: GraphModule, args):
    """A cluster's graph run by PyTorch (a call with NaN/inf inputs, a failed engine). The graph
    was legalized for an engine with value semantics, so a `view` in it may meet a value PyTorch
    holds strided (measured: group_norm decomposed for IREE after a permute inside the cluster:
    "view size is not compatible"): inputs go in contiguous, and on that error the graph's views
    become reshapes (the same values; a copy where a view cannot be made) and the call is retried."""
    # (strided tensors only: a sparse input has no contiguous form and raised, sparse.mm in OpInfo)
    args = [a.contiguous() if isinstance(a, torch.Tensor) and a.layout == torch.strided else a for a in args]
    with torch.no_grad():
        try:
            return fallback(*args)
        except RuntimeError as exc:
            if "view size is not compatible" not in str(exc) or not _views_as_reshapes(fallback):
                raise
            return fallback(*args)


def _views_as_reshapes(gm: GraphModule) -> bool:
    views = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.view.default]
    for node in views:
        node.target = torch.ops.aten.reshape.default
    if views:
        gm.recompile()
    return bool(views)


def tell_policy(handler, checks: dict[int, str | None], args, positions) -> None:
    """`handler(name, tensor)` (a quantized model's NaN policy: warn or raise) for the graph
    inputs among `positions`."""
    if handler is None:
        return
    for pos in positions:
        if checks[pos] is not None:
            handler(checks[pos], args[pos])


def policy_inputs(checks: dict[int, str | None]) -> frozenset:
    """The graph-input names among a cluster's checks (what the NaN policy hears about)."""
    return frozenset(name for name in checks.values() if name is not None)


def worst_abs_diff(got, want) -> float:
    """Largest |engine - PyTorch| over every output element (QLOWER_CHECK_CLUSTERS=1)."""
    leaves = torch.utils._pytree.tree_leaves
    return max(((g.to(torch.float64) - w.to(torch.float64)).abs().max().item() if g.numel() else 0.0)
               for g, w in zip(leaves(got), leaves(want)))


_SCALAR_KIND = {torch.SymInt: int, torch.SymBool: bool, torch.SymFloat: float, int: int, bool: bool, float: float}


def scalar_kinds(sub: GraphModule) -> tuple | None:
    """Per cluster output, the Python type it has in PyTorch where that is a scalar (a size, a
    size check, `item()`): ONNX returns 0-d tensors, and the PyTorch code after the cluster
    (export's `_assert_scalar` on a size) needs the scalar. None when every output is a tensor."""
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    outs = out if isinstance(out, (tuple, list)) else (out,)
    kinds = tuple(_SCALAR_KIND.get(type(o.meta.get("val"))) if hasattr(o, "meta") else None for o in outs)
    return kinds if any(kinds) else None


def as_scalars(result, kinds: tuple, single: bool):
    items = (result,) if single else result
    items = tuple(kind(t.item()) if kind is not None else t for t, kind in zip(items, kinds))
    return items[0] if single else items


def graph_copy(gm: GraphModule) -> GraphModule:
    """A GraphModule with its own copy of gm's graph, sharing gm's tensors and submodules
    (clustering rewrites the graph it is given)."""
    import copy
    with torch_deprecation_silenced():
        return GraphModule(gm, copy.deepcopy(gm.graph))


def compile_isolating_rejected(gm: GraphModule, capability: Capability, min_cluster_size: int, compile_cluster,
                               log, max_refused: int = 64):
    """Cluster gm and compile each cluster with `compile_cluster(fused, call, index, mutated,
    rejected=...)`, which adds to `rejected` (FX node name -> reason) the nodes its engine's
    error names. Those are refused and the graph clustered again from a copy, until no failure
    names a new node (or `max_refused` nodes are refused; the clusters left failing then fall
    back whole). Only the final round's fallbacks are logged. (onnxruntime and openvino: the
    engine names an ONNX node, mapped back by `translate.fx_nodes_of`.)
    Returns (fused graph, clustering, infos)."""
    pristine, refused = graph_copy(gm), {}
    names = {n.name for n in gm.graph.nodes}
    while True:
        rejected: dict[str, str] = {}
        fused, clustering = fuse_clusters(gm, capability.refusing(refused), min_cluster_size)
        infos = compile_each_cluster(fused, functools.partial(compile_cluster, rejected=rejected))
        more = {name: why for name, why in rejected.items() if name in names and name not in refused}
        if not more or len(refused) >= max_refused:
            break
        refused.update(more)
        gm = graph_copy(pristine)
    for info in infos:   # the final round's (an earlier round's failure was retried)
        if info.status == "fallback":
            log.warning("cluster #%d fell back to PyTorch: %s", info.id, info.reason)
    return fused, clustering, infos
