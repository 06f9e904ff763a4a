"""IREE's two data-tiling paths and the programs each one miscompiles (backends/iree/data_tiling.py):
the hazards found in a cluster's graph, the path a cluster is compiled on, and the IREE facts
behind them (if IREE stops miscompiling, the canary tests here say so)."""
import numpy as np
import pytest
import torch

pytest.importorskip("iree.compiler", reason="the iree extra is not installed (pip install 'qlower[iree]')")
pytest.importorskip("iree.runtime", reason="the iree extra is not installed (pip install 'qlower[iree]')")

import qlower  # noqa: E402
from qlower.backends.iree import IreeOptions  # noqa: E402
from qlower.backends.iree.data_tiling import (data_tiling_for, dispatch_path_hazard, global_path_hazard,  # noqa: E402
                                              retry_path)

_BATCH = torch.export.Dim("batch", min=1, max=64)


def _self_product_mlir(m: int, k: int, zp_a: int, zp_b: int) -> str:
    return f"""
func.func @main(%x: tensor<1x{m}x{k}xi8>) -> tensor<1x{m}x{m}xi32> {{
  %t = tosa.transpose %x perms([0, 2, 1]) : (tensor<1x{m}x{k}xi8>) -> tensor<1x{k}x{m}xi8>
  %za = tosa.const values(dense<{zp_a}> : tensor<1xi8>) : () -> tensor<1xi8>
  %zb = tosa.const values(dense<{zp_b}> : tensor<1xi8>) : () -> tensor<1xi8>
  %p = tosa.matmul %x, %t, %za, %zb : (tensor<1x{m}x{k}xi8>, tensor<1x{k}x{m}xi8>, tensor<1xi8>, tensor<1xi8>) \
-> tensor<1x{m}x{m}xi32>
  return %p : tensor<1x{m}x{m}xi32>
}}"""


def _run_mlir(text: str, x: np.ndarray, path: str) -> np.ndarray:
    from qlower.backends.iree.compiler import compile_mlir
    from qlower.backends.iree.vm import load_function
    compiled = compile_mlir(text, "tosa", IreeOptions(data_tiling_path=path, ukernels="default"))
    return load_function(compiled.vmfb, "local-sync")(x)[0]


@pytest.mark.parametrize("zps", [(3, 3), (3, -7), (3, 0), (0, 3)])
def test_iree_global_path_miscompiles_a_self_product_with_both_zero_points(zps):
    """The IREE fact behind `global_path_hazard` (IREE 3.13, llvm-cpu): x @ xᵀ of one int8
    tensor with both zero points non-zero is wrong on the global-optimization path (max error
    in the tens of thousands of the int32 products), exact on the dispatch-creation path; one
    zero point 0 is exact on both. Measured on AVX-512 VNNI CPUs (Intel Xeon with AMX); elsewhere
    (IREE picks other tiles) only the exact cases are asserted: the hazard is kept everywhere.
    A new IREE that computes it right fails this test: then the hazard can go."""
    from qlower.core.cpu import has_vnni
    x = np.random.default_rng(0).integers(-128, 127, size=(1, 8, 16)).astype(np.int8)
    centered_a, centered_b = x.astype(np.int64) - zps[0], x.astype(np.int64) - zps[1]
    want = centered_a @ centered_b.transpose(0, 2, 1)
    text = _self_product_mlir(8, 16, *zps)
    assert np.array_equal(_run_mlir(text, x, "dispatch"), want)
    wrong = not np.array_equal(_run_mlir(text, x, "global"), want)
    if 0 in zps:
        assert not wrong
    elif has_vnni():
        assert wrong


class _Products(torch.nn.Module):
    """Integer products whose operands are, or are not, one value."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.lin = torch.nn.Linear(16, 32)

    def forward(self, x, y):
        h = torch.relu(self.lin(x))
        if self.kind == "x @ x^T":
            return h @ h.transpose(-1, -2)
        if self.kind == "same slices":      # IREE's CSE makes them one value
            return h[..., :16] @ h[..., :16].transpose(-1, -2)
        if self.kind == "q @ k^T":          # two slices of one tensor, as in fused QKV attention
            return h[..., :16] @ h[..., 16:].transpose(-1, -2)
        if self.kind == "x @ y^T":
            return h @ torch.relu(self.lin(y)).transpose(-1, -2)
        return h @ h[..., :16, :].transpose(-1, -2)   # rows of itself: a different value


def _lowered(kind: str, dynamic: bool = False):
    """Static: batch 1 (a batched int8 matmul with batch > 1 is a dispatch-path hazard of its own);
    dynamic: batch 2 as the example."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    b = 2 if dynamic else 1
    ex = (torch.randn(b, 16, 16, generator=g), torch.randn(b, 16, 16, generator=g))
    ds = ({0: _BATCH}, {0: _BATCH}) if dynamic else None
    cal = [(torch.randn(b, 16, 16, generator=g), torch.randn(b, 16, 16, generator=g)) for _ in range(3)]
    program = qlower.quantize(_Products(kind).eval(), ex, cal, dynamic_shapes=ds)
    ref = qlower.compile(program, ex, backend="reference", profile="fixed", dynamic_shapes=ds)
    return program, ex, ds, ref


@pytest.mark.parametrize("kind,hazard", [("x @ x^T", True), ("same slices", True), ("q @ k^T", False),
                                         ("x @ y^T", False), ("rows of itself", False)])
def test_global_path_hazard_is_a_product_of_one_value_by_itself(kind, hazard):
    """Positive: x @ xᵀ and two identical slices (IREE merges them); near misses: q @ kᵀ from
    two slices of one tensor, two tensors, different rows of one tensor."""
    _, _, _, ref = _lowered(kind)
    assert any(n.target == torch.ops.qlower.matmul.default for n in ref.graph_module.graph.nodes)
    found = global_path_hazard(ref.graph_module)
    assert (found is not None) == hazard, found
    assert global_path_hazard(ref.graph_module) == found   # a pure check: asking again changes nothing


def test_data_tiling_path_follows_the_hazards_of_each():
    """The preferred path unless it has a hazard, then the other path unless that one has one
    too, then none; on a GPU no switch (the global path was never measured there)."""
    _, _, _, self_product = _lowered("x @ x^T")
    _, _, _, dynamic_self_product = _lowered("x @ x^T", dynamic=True)
    _, _, _, plain = _lowered("x @ y^T")
    _, _, _, dynamic_plain = _lowered("x @ y^T", dynamic=True)
    assert dispatch_path_hazard(dynamic_plain.graph_module) is not None   # a batched int8 matmul, batch dynamic
    cpu = {p: IreeOptions(data_tiling_path=p) for p in ("dispatch", "global")}
    for path in ("dispatch", "global"):   # no hazard: kept, no note
        assert data_tiling_for(cpu[path], plain.graph_module) == (cpu[path], None)
    options, note = data_tiling_for(cpu["global"], self_product.graph_module)
    assert options.data_tiling_path == "dispatch" and options.data_tiling and "by its own transpose" in note
    options, note = data_tiling_for(cpu["dispatch"], dynamic_plain.graph_module)
    assert options.data_tiling_path == "global" and options.data_tiling and "dynamic batch" in note
    for path in ("dispatch", "global"):   # hazards on both paths: no data tiling
        options, note = data_tiling_for(cpu[path], dynamic_self_product.graph_module)
        assert not options.data_tiling and note.startswith("without data tiling")
    gpu = IreeOptions.for_target("cuda:sm_80", data_tiling_path="dispatch")
    options, note = data_tiling_for(gpu, dynamic_plain.graph_module)
    assert not options.data_tiling and note.startswith("without data tiling")
    # a compile failure on one path retries on the other unless that one miscompiles the cluster
    assert retry_path(cpu["dispatch"], plain.graph_module, {"dispatch"}) == "global"
    assert retry_path(cpu["global"], plain.graph_module, {"global"}) == "dispatch"
    assert retry_path(cpu["dispatch"], self_product.graph_module, {"dispatch"}) is None
    assert retry_path(cpu["global"], plain.graph_module, {"global", "dispatch"}) is None
    assert retry_path(gpu, plain.graph_module, {"dispatch"}) is None


@pytest.mark.parametrize("kind", ["x @ x^T", "same slices", "q @ k^T"])
def test_products_compile_on_a_path_that_computes_them_bit_exactly(kind):
    """End to end, default options (a product cluster prefers the global path): a self-product
    is compiled on the dispatch-creation path (said in the report), the rest on the global one;
    every output equal to the reference backend's."""
    program, ex, ds, ref = _lowered(kind)
    cm = qlower.compile(program, ex, backend="iree", profile="fixed")
    report = cm.report()
    assert not report.fallbacks
    (cluster,) = [m for m in cm._executable.module.modules() if getattr(m, "command", None)]
    self_product = kind != "q @ k^T"
    assert ("--iree-opt-data-tiling" in cluster.command) == self_product
    assert ("--iree-global-opt-data-tiling" in cluster.command) == (not self_product)
    assert any("by its own transpose: the global-optimization path miscompiles it" in n
               for n in report.notes) == self_product
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        x = (torch.randn(1, 16, 16, generator=g) * 3, torch.randn(1, 16, 16, generator=g))
        assert torch.equal(ref(*x), cm(*x))
