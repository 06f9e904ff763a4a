"""onnx/decompositions.py: each decomposition runs in ONNX Runtime (no fallback)
and equals eager on the values where the ops are special (NaN, ±inf, ±0, ties, empty)."""
from __future__ import annotations

import math

import pytest
import torch

import qlower
from qlower.onnx.decompositions import DECOMPOSITIONS

from conftest import Fn

NAN, INF = math.nan, math.inf
SPECIAL = torch.tensor([NAN, -NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 3e38, 1e-45])


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)   # exact comparisons below: the same inputs every run


def _same(got, want) -> bool:
    if isinstance(want, (tuple, list)):
        return all(_same(g, w) for g, w in zip(got, want))
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if not want.dtype.is_floating_point:
        return torch.equal(got, want)
    close = torch.isclose(got, want, rtol=2e-7, atol=0, equal_nan=True)
    signs = torch.signbit(got) == torch.signbit(want)   # -0.0 and +0.0 told apart
    return bool((close & (signs | torch.isnan(want))).all())


def _check(fn, *xs, summed: bool = False, reference=None):
    """Compiled on onnxruntime: one cluster, no fallback, eager's values. NaN/inf inputs make a
    call run in PyTorch (the NaN policy), so tests of NaN and inf make them inside the cluster
    (`_from_finite`). `summed`: the engine adds or multiplies in another order than eager (a
    convolution for a pooled sum, products for an einsum), so values agree to float32 rounding
    of the sum (rtol 1e-5) instead of to the last bit."""
    cm = qlower.compile(Fn(fn), xs, backend="onnxruntime")
    report = cm.report()
    assert len(report.compiled) == 1 and not report.fallbacks, str(report)
    got, want = cm(*xs), (reference or fn)(*xs)
    if summed:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    else:
        assert _same(got, want)
    return cm


def _pairs():
    a = SPECIAL.repeat_interleave(len(SPECIAL))
    b = SPECIAL.repeat(len(SPECIAL))
    return a, b


def _from_finite(x: torch.Tensor):
    """(finite input, function making x from it inside the cluster): log(0) = -inf, 0/0 = NaN,
    so the engine computes on the special values instead of the NaN policy running PyTorch."""
    code = torch.zeros_like(x)
    code[torch.isnan(x)] = 1
    code[x == INF] = 2
    code[x == -INF] = 3
    plain = torch.where(torch.isfinite(x), x, torch.zeros_like(x))

    def make(p, c):
        nan = torch.zeros_like(p) / torch.zeros_like(p)
        inf = -torch.log(torch.zeros_like(p))
        return torch.where(c == 1, nan, torch.where(c == 2, inf, torch.where(c == 3, -inf, p)))
    return (plain, code), make


@pytest.mark.parametrize("name", ["fmax", "fmin", "hypot", "copysign"])
def test_binary_decompositions_equal_eager_on_special_values(name):
    """Every pair of special values, made inside the cluster. Not compared: the sign of a zero
    that ONNX Runtime's Where picks (fmax/fmin: Where(True, -0.0, x) gives +0.0, a gap of the
    engine's kernel that every `torch.where` shares), and copysign's sign taken from a NaN made
    inside the cluster (ONNX has no reading of a NaN's sign bit; a NaN input runs the call in
    PyTorch: test_copysign_of_a_nan_input_follows_eager)."""
    op = getattr(torch, name)
    a, b = _pairs()
    if name == "copysign":
        a, b = a[~torch.isnan(b)], b[~torch.isnan(b)]
    (pa, ca), make = _from_finite(a)
    (pb, cb), _ = _from_finite(b)
    fn = lambda pa, ca, pb, cb: op(make(pa, ca), make(pb, cb))   # noqa: E731
    cm = qlower.compile(Fn(fn), (pa, ca, pb, cb), backend="onnxruntime")
    report = cm.report()
    assert len(report.compiled) == 1 and not report.fallbacks, str(report)
    got, want = cm(pa, ca, pb, cb), fn(pa, ca, pb, cb)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got.nan_to_num(), want.nan_to_num())   # -0.0 == 0.0 here
    if name in ("hypot", "copysign"):
        assert torch.equal(torch.signbit(got[~torch.isnan(got)]), torch.signbit(want[~torch.isnan(want)]))


def test_copysign_of_a_nan_input_follows_eager():
    x, s = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, 1.0, 1.0])
    cm = _check(lambda x, s: torch.copysign(x, s), x, s)
    nan_sign = torch.tensor([-math.nan, math.nan, -1.0])
    assert _same(cm(x, nan_sign), torch.copysign(x, nan_sign))


def test_copysign_reads_negative_zero_and_scalar_signs():
    x = torch.tensor([1.0, -2.0, 0.0, 3.0])
    _check(lambda x, s: torch.copysign(x, s), x, torch.tensor([-0.0, 0.0, -0.0, -1.0]))
    _check(lambda x: torch.copysign(x, -0.0), x)
    _check(lambda x: torch.copysign(x.to(torch.int64), 2.0), x)   # integers promote to float


@pytest.mark.parametrize("shape", [(), (7,)])
def test_signbit_of_negative_zero_and_0d(shape):
    """torchlib's Less(x, [0]) said False for -0.0 and made a 0-d result 1-d."""
    x = torch.full(shape, -0.0) if shape == () else torch.tensor([-0.0, 0.0, -1.0, 1.0, -3e38, 1e-45, -1e-45])
    _check(torch.signbit, x)
    _check(torch.signbit, x.to(torch.int32))


def test_squeeze_of_several_dims():
    x = torch.randn(1, 3, 1, 1, 2)
    _check(lambda x: x.squeeze((0, 2, -2)), x)
    _check(lambda x: x.squeeze((1, 3)), x)   # dim 1 is not of size 1: left as it is
    _check(lambda x: x.squeeze(()), x)


def test_isin_all_overloads():
    e, t = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([2, 5, 7])
    _check(lambda e, t: torch.isin(e, t), e, t)
    _check(lambda e, t: torch.isin(e, t, invert=True), e, t)
    _check(lambda e: torch.isin(e, 5), e)
    _check(lambda t: torch.isin(5, t), t)
    f = torch.tensor([0.5, -0.0, 2.0])
    _check(lambda f, t: torch.isin(f, t), f, torch.tensor([0.0, 2.0]))   # -0.0 == 0.0


@pytest.mark.parametrize("stable", [True, None])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort_with_ties_and_special_values(descending, stable):
    """Stable (ties in index order) with NaN after +inf, as eager sorts; `stable=None` is
    sort.default, which eager does not promise to be stable: its result is compared all the
    same (eager's CPU sort is stable on these inputs)."""
    x = torch.tensor([[3.0, 1.0, 3.0, -0.0, 0.0, 2.0, 1.0, -5.0]])
    (p, c), make = _from_finite(torch.tensor([[3.0, NAN, 1.0, INF, 3.0, -INF, NAN, 0.0, INF, NAN]]))
    _check(lambda x: torch.sort(x, stable=stable, descending=descending), x)
    _check(lambda x: torch.argsort(x, stable=bool(stable), descending=descending), x)
    _check(lambda p, c: torch.sort(make(p, c), stable=stable, descending=descending), p, c)
    _check(lambda p, c: torch.sort(make(p, c).t(), dim=0, stable=stable, descending=descending), p, c)
    _check(lambda x: torch.sort(x.to(torch.int64), stable=stable, descending=descending), x)
    _check(lambda x: torch.sort(x[0, 0], stable=stable), x)   # 0-d


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_and_bucketize(right):
    seq = torch.tensor([-1.0, 0.0, 0.0, 2.5, 7.0])
    values = torch.tensor([[-2.0, 0.0, 1.0], [2.5, 7.0, 9.0]])
    _check(lambda s, v: torch.searchsorted(s, v, right=right), seq, values)
    _check(lambda s, v: torch.searchsorted(s, v, right=right, out_int32=True), seq, values)
    _check(lambda v, s: torch.bucketize(v, s, right=right), values, seq)
    batched = torch.sort(torch.randn(2, 6), dim=-1)[0]
    _check(lambda s, v: torch.searchsorted(s, v, right=right), batched, values)
    unsorted = torch.tensor([7.0, -1.0, 2.5, 0.0])
    _check(lambda s, v, o: torch.searchsorted(s, v, sorter=o, right=right), unsorted, values, torch.argsort(unsorted))
    (p, c), make = _from_finite(torch.tensor([NAN, 0.0, INF, -INF, 7.0]))   # a NaN value goes last
    (sp, sc), _ = _from_finite(torch.tensor([-INF, -1.0, 0.0, 2.0, 7.0, INF]))
    _check(lambda sp, sc, p, c: torch.searchsorted(make(sp, sc), make(p, c), right=right), sp, sc, p, c)


def test_every_decomposition_is_tested_here():
    """A new entry in DECOMPOSITIONS needs its case in this file."""
    import inspect
    source = inspect.getsource(inspect.getmodule(test_every_decomposition_is_tested_here))
    for op in DECOMPOSITIONS:
        name = op._schema.name.split("::")[-1]
        assert any(pattern in source for pattern in (f"torch.{name}(", f".{name}(", f'"{name}"')), name


@pytest.mark.parametrize("mode", ["circular", "constant", "reflect", "replicate"])
def test_pad_by_mode(mode):
    """circular was Pad(mode="wrap"), which ONNX Runtime rejects at run time; the other modes
    keep torchlib's own translations (constant_pad_nd, reflection_pad*, replication_pad*)."""
    x = torch.randn(2, 3, 5, 6)
    _check(lambda x: torch.nn.functional.pad(x, (1, 2, 2, 1), mode=mode), x)
    _check(lambda x: torch.nn.functional.pad(x[0], (2, 1), mode=mode), x)
    if mode in ("circular", "constant", "replicate"):
        _check(lambda x: torch.nn.functional.pad(x, (-1, 2, 1, -2), mode=mode), x)   # cropping sides
    if mode == "replicate":   # the crop leaves nothing of a side: ONNX Runtime's Pad(edge) failed
        _check(lambda x: torch.nn.functional.pad(x, (-6, 3, 0, 0), mode=mode), x)
        _check(lambda x: torch.nn.functional.pad(x, (5, -6, -4, 3), mode=mode), x)


def test_repeat_interleave_with_tensor_repeats_and_an_output_size():
    x = torch.randn(3, 4)
    _check(lambda x, r: torch.repeat_interleave(x, r, dim=0, output_size=6), x, torch.tensor([2, 1, 3]))
    _check(lambda x, r: torch.repeat_interleave(x, r, dim=1, output_size=8), x, torch.tensor([2]))
    _check(lambda x, r: torch.repeat_interleave(x, r, output_size=24), x, torch.tensor([2]))
    _check(lambda x, r: torch.repeat_interleave(x, r, dim=0, output_size=3), x, torch.tensor([0, 3, 0]))


def _only_when_case(fn, *xs, decomposed: bool, summed: bool = False):
    """One cluster in ONNX Runtime with eager's values; `decomposed` says whether the exporter's
    re-trace ran (a conditional decomposition's other calls keep the op as torchlib translates it)."""
    from qlower.onnx import translate
    from qlower.onnx.decompositions import decomposes
    ep = torch.export.export(Fn(fn), xs)
    picked = [n for n in ep.graph.nodes if n.op == "call_function" and decomposes(n)]
    assert bool(picked) == decomposed and translate._needs_decomposition(ep) == decomposed
    _check(fn, *xs, summed=summed)


def test_topk_of_a_0d_tensor():
    x = torch.randn(5, 4)
    _only_when_case(lambda x: torch.topk(x[0, 0], 1), x, decomposed=True)
    _only_when_case(lambda x: torch.topk(x, 2, dim=0), x, decomposed=False)   # near miss: TopK as it is


def test_scatter_with_reduce_and_scatter_add_of_a_0d_tensor():
    x, src = torch.randn(4, 5), torch.randn(4, 5)
    index = torch.tensor([[0, 1, 2, 0, 0], [2, 0, 0, 1, 2], [1, 1, 1, 1, 1], [3, 3, 0, 0, 0]])
    for reduce in ("add", "multiply"):   # repeated indices accumulate, as in eager
        _check(lambda x, i, s: torch.scatter(x, 0, i, s, reduce=reduce), x, index, src)
        _check(lambda x, i: torch.scatter(x, 1, i, 1.5, reduce=reduce), x, index)
    _only_when_case(lambda x, s: torch.scatter_add(x[0, 0], 0, torch.tensor(0), s[0, 0]), x, src, decomposed=True)
    _only_when_case(lambda x, i, s: torch.scatter_add(x, 0, i, s), x, index, src, decomposed=False)


def test_take_with_negative_indices():
    x = torch.randn(3, 4)
    _check(lambda x, i: torch.take(x, i), x, torch.tensor([[0, -1], [5, -12]]))
    _check(lambda x, i: torch.take(x, i), x, torch.tensor(7))


@pytest.mark.parametrize("offset,dims", [(0, (0, 1)), (2, (0, 1)), (-1, (0, 1)), (1, (2, 0)), (-2, (-1, -2))])
def test_diagonal_scatter(offset, dims):
    x = torch.randn(4, 5, 3)
    src = torch.diagonal(x, offset, *dims).clone().normal_()
    _check(lambda x, s: torch.diagonal_scatter(x, s, offset, *dims), x, src)


def test_cumprod_keeps_signed_zeros_and_special_values():
    """Products of each prefix: -0.0 keeps its sign (the mask's 1s are in Where's first branch),
    0 * inf is NaN, integer inputs give int64, a dtype= casts first."""
    (p, c), make = _from_finite(torch.tensor([[2.0, -0.0, 3.0, INF, -1.0], [NAN, 1.0, -2.0, 0.5, 4.0]]))
    _check(lambda p, c: torch.cumprod(make(p, c), 1), p, c)
    _check(lambda p, c: torch.cumprod(make(p, c), 0), p, c)
    x = torch.randn(3, 4, 5)
    _check(lambda x: torch.cumprod(x, -2), x)
    _check(lambda x: torch.cumprod((x * 3).to(torch.int32), 2), x)
    _check(lambda x: torch.cumprod(x, 1, dtype=torch.float64), x)
    _check(lambda x: torch.cumprod(x[0, 0, 0], 0), x)


def test_cumprod_of_a_long_dim_stays_in_pytorch():
    """Near miss: longer than MAX_PAIRWISE the pairwise form would be quadratic in memory."""
    from qlower.onnx.decompositions import MAX_PAIRWISE
    x = torch.randn(2, MAX_PAIRWISE + 1)
    cm = qlower.compile(Fn(lambda x: torch.cumprod(x, 1) * 2), (x,), backend="onnxruntime")
    assert [list(c.ops) for c in cm.report().fallbacks] == [["cumprod"]]
    torch.testing.assert_close(cm(x), torch.cumprod(x, 1) * 2)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_and_cummin_pick_eagers_index(name):
    """Ties go to the later index, a NaN sticks and its last occurrence is the index, a signed
    zero comes back as eager's (the value is read at the index), integers and 0-d tensors."""
    op = getattr(torch, name)
    (p, c), make = _from_finite(torch.tensor([[1.0, 3.0, 3.0, NAN, 2.0, NAN, 5.0],
                                              [0.0, -0.0, 0.0, -INF, -INF, INF, -1.0]]))
    _check(lambda p, c: op(make(p, c), 1), p, c)
    _check(lambda p, c: op(make(p, c), 0), p, c)
    x = torch.randn(3, 4, 5)
    _check(lambda x: op(x, -2), x)
    _check(lambda x: op((x * 2).to(torch.int64), 2), x)
    _check(lambda x: op(x[0, 0, 0], 0), x)


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("kernel,stride,padding", [(3, 1, 1), (3, 2, 1), (2, 3, 0), ((3, 2), (2, 1), (1, 0))])
def test_avg_pool2d_with_a_divisor(kernel, stride, padding, ceil_mode):
    x = torch.randn(2, 3, 9, 8)
    _check(lambda x: torch.nn.functional.avg_pool2d(x, kernel, stride, padding, ceil_mode, True, 2), x, summed=True)
    _check(lambda x: torch.nn.functional.avg_pool2d(x[0], kernel, stride, padding, ceil_mode, False, 5), x,
           summed=True)


def test_avg_pool3d_with_a_divisor():
    x = torch.randn(1, 2, 5, 6, 7)
    _check(lambda x: torch.nn.functional.avg_pool3d(x, 3, 2, 1, True, True, 4), x, summed=True)
    _check(lambda x: torch.nn.functional.avg_pool3d(x, (2, 3, 2), 1, 0, False, False, 3), x, summed=True)


def test_avg_pool_with_a_divisor_and_symbolic_sizes_stays_in_pytorch():
    """Near miss: the divided sum needs static channel and spatial sizes (the convolution's
    groups, the ceil_mode overhang); with a dynamic height the node is refused, not mistranslated."""
    pool = Fn(lambda x: torch.nn.functional.avg_pool2d(torch.relu(x), 2, divisor_override=3) * 2)
    x = torch.randn(1, 2, 6, 6)
    cm = qlower.compile(pool, (x,), backend="onnxruntime",
                        dynamic_shapes=(({2: torch.export.Dim("h", min=4, max=64)},),))
    assert [c.reason for c in cm.report().fallbacks] == \
        ["aten::avg_pool2d: avg_pool2d with divisor_override and symbolic sizes is not translated correctly"]
    for h in (6, 9):
        x = torch.randn(1, 2, h, 6)
        torch.testing.assert_close(cm(x), pool(x))


@pytest.mark.parametrize("equation,shapes", [
    ("...ik,...j->ij", [(1, 2, 3), (3,)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("b...i,...i->b", [(2, 1, 3, 4), (3, 4)]),
    ("...i,...i", [(2, 1, 4), (3, 4)]),          # implicit output: the ellipsis dims
])
def test_einsum_with_a_broadcast_ellipsis(equation, shapes):
    """ONNX Runtime's Einsum rejects an ellipsis that stands for different shapes."""
    xs = [torch.randn(s) for s in shapes]
    _only_when_case(lambda *xs: torch.einsum(equation, *xs), *xs, decomposed=True, summed=True)


def test_einsum_near_misses_keep_onnx_einsum():
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    _only_when_case(lambda a, b: torch.einsum("...ij,...jk->...ik", a, b), a, b, decomposed=False, summed=True)
    _only_when_case(lambda a, b: torch.einsum("bij,bjk->bik", a, b), a, b, decomposed=False, summed=True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_class_probabilities(reduction):
    """aten "cross_entropy_loss" with a float target; class indices keep torchlib's translation."""
    x = torch.randn(4, 5, 3)
    target = torch.softmax(torch.randn(4, 5, 3), 1)
    weight = torch.rand(5)
    _only_when_case(lambda x, t: torch.nn.functional.cross_entropy(x, t, reduction=reduction), x, target,
                    decomposed=True, summed=True)
    _check(lambda x, t, w: torch.nn.functional.cross_entropy(x, t, w, reduction=reduction, label_smoothing=0.2),
           x, target, weight, summed=True)
    _check(lambda x, t: torch.nn.functional.cross_entropy(x[0, :, 0], t[0, :, 0], reduction=reduction), x, target,
           summed=True)
    labels = torch.tensor([[0, 4, 2], [1, 1, 3], [4, 0, 0], [2, 2, 2]])   # near miss: class indices
    _only_when_case(lambda x, t: torch.nn.functional.cross_entropy(x, t, reduction=reduction), x, labels,
                    decomposed=False, summed=True)
    # class indices with label smoothing: torchlib dropped the smoothing (the same loss for 0.1
    # and 0.9, a silent wrong answer); written out here, with weights and an ignored index
    _check(lambda x, t, w: [torch.nn.functional.cross_entropy(x, t, w, ignore_index=1, reduction=reduction,
                                                              label_smoothing=e)
                            for e in (0.1, 0.9)] +
           [torch.nn.functional.cross_entropy(x[0, :, 0], t[0, 0], reduction=reduction, label_smoothing=0.3)],
           x, labels, weight, summed=True)


@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0])
def test_addmm_over_an_empty_contraction(beta):
    """K = 0: beta * c, and zeros for beta = 0 even where c is NaN (BLAS never reads c then)."""
    (p, c), make = _from_finite(torch.tensor([[NAN, 1.0, -2.0], [INF, 0.5, -0.0]]))
    a, b = torch.randn(2, 0), torch.randn(0, 3)
    _only_when_case(lambda p, c, a, b: torch.addmm(make(p, c), a, b, beta=beta, alpha=2.0), p, c, a, b,
                    decomposed=True)
    x, w = torch.randn(2, 4), torch.randn(4, 3)
    _only_when_case(lambda p, c, x, w: torch.addmm(p, x, w, beta=beta), p, c, x, w, decomposed=False, summed=True)


@pytest.mark.parametrize("out", [(2, 3), (1, 1), (5, 7), (3, None)])
def test_adaptive_max_pool2d_values_and_indices(out):
    """"adaptive_max_pool2d": uneven windows; ties (the first maximum in row-major order), NaN (the last one), -0.0
    beside 0.0 (the first of them); adaptive_max_pool1d reaches the same decomposition."""
    x = torch.randn(2, 3, 5, 7)
    x[0, 0, :2, :3] = 1.0                                    # ties across rows and columns
    x[0, 1] = -5.0
    x[0, 1, 1:3, 2:5] = torch.tensor([[-0.0, 0.0, -0.0], [0.0, -0.0, 0.0]])   # the maximum, either sign
    code = torch.zeros_like(x)
    code[1, 0, 0, 0] = code[1, 0, 3, 6] = code[1, 2, 2, 2] = 1   # NaN made inside the cluster
    pool = torch.nn.AdaptiveMaxPool2d(out, return_indices=True)
    fn = lambda x, c: pool(torch.where(c == 1, torch.zeros_like(x) / torch.zeros_like(x), x))   # noqa: E731
    _check(fn, x, code)
    _check(lambda x: torch.nn.functional.adaptive_max_pool1d(x[0], 3, return_indices=True), x)


def test_adaptive_max_pool3d_and_avg_pool3d():
    """adaptive_avg_pool3d decomposes through "_adaptive_avg_pool3d" (torch's table): both covered."""
    x = torch.randn(2, 3, 5, 6, 7)
    _check(lambda x: torch.nn.functional.adaptive_max_pool3d(x, (2, 4, 3), return_indices=True), x)
    _check(lambda x: torch.nn.functional.adaptive_avg_pool3d(x, (2, 4, 3)), x, summed=True)
    _check(lambda x: torch.nn.functional.adaptive_avg_pool3d(x[0], (5, None, 1)), x, summed=True)


def test_adaptive_pools_with_symbolic_sizes_stay_in_pytorch():
    """Near miss: the windows are computed from static sizes."""
    pool = Fn(lambda x: torch.nn.functional.adaptive_avg_pool3d(x, 2) * 2)
    x = torch.randn(1, 2, 6, 6, 6)
    cm = qlower.compile(pool, (x,), backend="onnxruntime",
                        dynamic_shapes=(({2: torch.export.Dim("d", min=4, max=64)},),))
    assert [list(c.ops) for c in cm.report().fallbacks] == [["adaptive_avg_pool3d"]]
    x = torch.randn(1, 2, 9, 6, 6)
    torch.testing.assert_close(cm(x), pool(x))


@pytest.mark.parametrize("reduce", ["prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    x, source = torch.randn(5, 4, 3), torch.randn(5, 6, 3)
    index = torch.tensor([0, 3, 0, 1, 3, 3])   # repeated
    _check(lambda x, s: x.index_reduce(1, index, s, reduce, include_self=include_self), x, source)
    _check(lambda x, s: x[0, 0].index_reduce(0, torch.tensor([1, 1]), s[0, :2, 0], reduce), x, source)


@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_mean_as_a_sum_over_a_count(include_self):
    """Repeated indices, slots nothing lands in (kept as they are), the element itself counted
    where include_self; an integer mean (eager floor-divides) stays in PyTorch."""
    x, source = torch.randn(5, 4), torch.randn(5, 6)
    fn = lambda x, s: x.index_reduce(1, torch.tensor([0, 3, 0, 1, 3, 3]), s, "mean", include_self=include_self)  # noqa: E731
    _check(fn, x, source, summed=True)
    ints = lambda x, s: (x * 10).long().index_reduce(1, torch.tensor([0, 3, 0]), (s[:, :3] * 10).long(), "mean")  # noqa: E731
    cm = qlower.compile(Fn(ints), (x, source), backend="onnxruntime")
    assert "index_reduce" in str(cm.report().fallbacks)
    assert torch.equal(cm(x, source), ints(x, source))


def test_empty_permuted_and_put():
    """aten "empty_permuted" (uninitialized: only shape and dtype compare) and put with
    accumulation over repeated and negative indices."""
    cm = qlower.compile(Fn(lambda x: torch.empty_permuted((2, 3, 4), (2, 0, 1)) * 0 + x), (torch.randn(4),),
                        backend="onnxruntime")
    assert not cm.report().fallbacks and cm(torch.ones(4)).shape == (2, 3, 4)
    x, source = torch.randn(3, 4), torch.randn(5)
    _check(lambda x, s: x.put(torch.tensor([0, -1, 5, 0, 11]), s, accumulate=True), x, source, summed=True)
    _check(lambda x, s: x.put(torch.tensor([0, -1, 5, 7, 2]), s), x, source)
    _check(lambda x, s: x[0, 0].put(torch.tensor(0), s[0]), x, source)


@pytest.mark.parametrize("size", [1, 3, 8, 20])
def test_nonzero_static(size):
    x = torch.tensor([[0.0, 1.5, 0.0, -2.0], [0.0, 0.0, 3.0, -0.0], [7.0, 0.0, 0.0, 1.0]])
    _check(lambda x: torch.nonzero_static(x, size=size), x)
    _check(lambda x: torch.nonzero_static(x > 1, size=size, fill_value=-7), x)
    _check(lambda x: torch.nonzero_static(x[1], size=size), x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_of_one_unbatched_sample(reduction):
    x, weight = torch.randn(5), torch.rand(5)
    for target in (torch.tensor(3), torch.tensor(-100)):   # -100: ignored (eager's mean: NaN)
        _check(lambda x, t: torch.nn.functional.cross_entropy(x, t, reduction=reduction), x, target, summed=True)
        _check(lambda x, t, w: torch.nn.functional.cross_entropy(x, t, w, reduction=reduction), x, target, weight,
               summed=True)


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, math.inf])
def test_cdist_and_pdist(p):
    """Both of eager's forms: direct differences, and for p = 2 beyond 25 rows (or when asked)
    the matrix-product form, built as eager builds it (aten "_cdist_forward", "_pdist_forward")."""
    a, b = torch.randn(2, 5, 3), torch.randn(2, 4, 3)
    a[0, 1] = b[0, 2]   # a zero distance
    _check(lambda a, b: torch.cdist(a, b, p), a, b, summed=True)
    big = torch.randn(30, 3)
    _check(lambda a, b: torch.cdist(a, b, p), big, b[0], summed=True)
    _check(lambda a, b: torch.cdist(a, b, p, compute_mode="use_mm_for_euclid_dist"), a, b, summed=True)
    _check(lambda a: torch.nn.functional.pdist(a, p), a[0], summed=True)
    _check(lambda a: torch.nn.functional.pdist(a, p), big, summed=True)


def test_frexp_on_special_values():
    """Powers of two (log2 rounding across them), subnormals, ±0, ±inf, NaN, the largest float."""
    x = torch.tensor([0.0, -0.0, 1.0, -3.0, 0.5, 0.75, 1e-45, 1.1754942e-38, 3.4028235e38, 1024.0, 1023.9999, -7e-3])
    _check(lambda x: torch.frexp(x), x)
    _check(lambda x: torch.frexp(x), torch.randn(256) * 1e3)
    (p, c), make = _from_finite(torch.tensor([INF, -INF, NAN, 2.0]))
    _check(lambda p, c: torch.frexp(make(p, c)), p, c)


def test_nextafter_across_powers_of_two_subnormals_and_infinities():
    """Every pair of special values (±0, the least subnormal, the least normal and the value
    below it, powers of two, the largest finite, ±inf; NaN and inf made inside the cluster)
    and random magnitudes over 1e±17: bit for bit, -0.0 included (aten "nextafter")."""
    points = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, 1e-45, -1e-45, 1.1754944e-38, 1.1754942e-38,
                           3.4028235e38, -3.4028235e38, 123.456, -7.25, INF, -INF, NAN])
    (xp, xc), make = _from_finite(points.repeat_interleave(len(points)))
    (yp, yc), _ = _from_finite(points.repeat(len(points)))
    _check(lambda xp, xc, yp, yc: torch.nextafter(make(xp, xc), make(yp, yc)), xp, xc, yp, yc)
    r = torch.randn(512) * torch.exp(torch.randn(512) * 20)
    _check(lambda a, b: torch.nextafter(a, b), r, torch.randn(512) * 1e10)


def _data_dependent(x, mask):
    return (torch.nonzero(x > 0), torch.argwhere(x[0] > 0.5), torch.nonzero(x[0, 0] > 0), torch.argwhere(x.sum() > 0),
            torch.masked_select(x, mask), torch.unique(x.round(), return_inverse=True, return_counts=True),
            x[x > 1].sum())


def test_data_dependent_sizes_run_in_onnxruntime_at_every_count():
    """Output sizes that depend on the values (ONNX Runtime sizes them at run time): nonzero and
    argwhere (of a 0-d tensor too: (n, 0), where ONNX's NonZero of a scalar is (1, n)),
    masked_select with a broadcast mask, unique with its inverse and counts, boolean indexing;
    one compile, then inputs that select some, none and all."""
    x, mask = torch.randn(3, 4), torch.tensor([True, False, True, True])
    cm = _check(_data_dependent, x, mask)
    for x in (torch.randn(3, 4), -torch.rand(3, 4) - 2, torch.rand(3, 4) + 2):
        assert _same(cm(x, mask), _data_dependent(x, mask))


def _segments(x, lengths, offsets):
    return [torch.segment_reduce(x, reduce, lengths=lengths, initial=initial)
            for reduce in ("sum", "mean", "prod", "max", "min") for initial in (None, 1.5)] + \
        [torch.segment_reduce(x[:, 0], "mean", offsets=offsets),
         torch.segment_reduce(x, "max", offsets=offsets, initial=0)]


def test_segment_reduce_by_lengths_and_offsets():
    """Every reduction with and without `initial`, empty segments included (the identity, NaN for
    a mean, or `initial`), by lengths and by offsets; then other lengths at run time."""
    x, lengths = torch.randn(6, 3), torch.tensor([0, 2, 1, 3])
    offsets = torch.tensor([0, 0, 2, 3, 6])
    cm = _check(_segments, x, lengths, offsets, summed=True)
    lengths, offsets = torch.tensor([3, 0, 0, 3]), torch.tensor([0, 1, 1, 5, 6])
    torch.testing.assert_close(cm(x, lengths, offsets), _segments(x, lengths, offsets), rtol=1e-5, atol=1e-6,
                               equal_nan=True)


def test_chunked_linear_cross_entropy():
    """F.linear_cross_entropy with batch chunking calls torch.nn's custom ops
    "_linear_cross_entropy_batch_chunked" / "_linear_cross_entropy_batch_chunked_no_reduction",
    which torch.onnx cannot see into: as the unchunked linear + cross_entropy, with class
    weights, an ignored index and label smoothing; the empty gradient slots as eager's."""
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions
    options = LinearCrossEntropyOptions(batch_chunk_size=2)
    x, w, b, cw = torch.randn(6, 5), torch.randn(4, 5), torch.randn(4), torch.rand(4)
    target = torch.tensor([0, 3, 1, 2, 3, 1])

    def losses(x, w, b, cw, target):
        return [torch.nn.functional.linear_cross_entropy(x, w, target, linear_bias=b, weight=cw, reduction=r,
                                                         ignore_index=1, label_smoothing=s, options=options)
                for r, s in (("mean", 0.0), ("sum", 0.1), ("none", 0.0))]
    cm = _check(losses, x, w, b, cw, target, summed=True)
    graph = cm.report()
    assert graph.fallbacks == []


@pytest.mark.parametrize("shape,size,stride,offset", [((3, 3), (2, 2), (1, 2), 1),
                                                      ((16,), (2, 1, 1, 2), (1, 2, 4, 8), 0),
                                                      ((2, 3, 4), (3, 2), (4, 7), 2)])
def test_as_strided_scatter(shape, size, stride, offset):
    """src written through a strided view of a contiguous input (transposed strides, an offset)."""
    x, src = torch.randn(shape), torch.randn(size)
    _check(lambda x, s: torch.as_strided_scatter(x, s, size, stride, offset), x, src)


@pytest.mark.parametrize("align_corners", [True, False])
def test_antialiased_resize_where_torchlib_was_wrong(align_corners):
    """_upsample_bilinear2d_aa with align_corners=True and with explicit scales beside an output
    size (torchlib's Resize was off by 1.9 and 8.1): down- and upsampling by sizes and by scale
    factors, eager's values to float32 rounding of the weights."""
    A = torch.ops.aten
    x = torch.randn(2, 3, 10, 20)

    def fn(x):
        return (A._upsample_bilinear2d_aa.vec(x, None, align_corners, [0.8, 1.7]),
                A._upsample_bilinear2d_aa.vec(x, [17, 6], align_corners, None),
                A._upsample_bilinear2d_aa(x, [3, 3], align_corners, 1.7, 0.9))
    cm = qlower.compile(Fn(fn), (x,), backend="onnxruntime")
    assert len(cm.report().compiled) == 1 and not cm.report().fallbacks, str(cm.report())
    for got, want in zip(cm(x), fn(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("mode,padding", [("bilinear", "zeros"), ("nearest", "border"), ("bilinear", "reflection")])
def test_grid_sampler_3d(mode, padding):
    """aten "grid_sampler_3d" called directly (torchlib has no entry; nn.functional.grid_sample's
    generic op translates to GridSample), both corner settings, points outside the volume."""
    x, grid = torch.randn(2, 3, 4, 5, 6), torch.rand(2, 3, 4, 2, 3) * 2.4 - 1.2
    codes = {"bilinear": 0, "nearest": 1, "zeros": 0, "border": 1, "reflection": 2}

    def fn(x, g):
        return [torch.grid_sampler_3d(x, g, codes[mode], codes[padding], a) for a in (False, True)]
    _check(fn, x, grid, summed=True)


def test_resize_to_the_same_count():
    """aten "resize" (what export makes of resize_ on a temporary) to as many elements, of a
    contiguous tensor: the elements in order. Near misses: growing (uninitialized memory) and
    resize_ of the caller's tensor (its shape changes: it stays in PyTorch, the caller sees it)."""
    x = torch.randn(5, 5, 5)
    _check(lambda x: (torch.ops.aten.resize(x * 2, [25, 5]), torch.ops.aten.resize(x[0, 0, 0], [1, 1, 1])), x)
    cm = qlower.compile(Fn(lambda x: torch.ops.aten.resize(x * 2, [30, 5])[:25] * 3), (x,), backend="onnxruntime")
    assert any("resize" in op for c in cm.report().fallbacks for op in c.ops)
    cm = qlower.compile(Fn(lambda x: x.resize_(25, 5)), (x.clone(),), backend="onnxruntime")
    caller = x.clone()
    assert torch.equal(cm(caller), x.reshape(25, 5)) and caller.shape == (25, 5)

