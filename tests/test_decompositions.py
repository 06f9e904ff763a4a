"""backends/onnxruntime/decompositions.py: each decomposition runs in ONNX Runtime (no fallback)
and equals eager on the values where the ops are special (NaN, ±inf, ±0, ties, empty)."""
from __future__ import annotations

import math

import pytest
import torch

import qlower
from qlower.backends.onnxruntime.decompositions import DECOMPOSITIONS

from conftest import Fn

NAN, INF = math.nan, math.inf
SPECIAL = torch.tensor([NAN, -NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 3e38, 1e-45])


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


def _check(fn, *xs):
    """Compiled on onnxruntime: one cluster, no fallback, eager's values. NaN/inf inputs make a
    call run in PyTorch (the NaN policy), so tests of NaN and inf make them inside the cluster
    (`_from_finite`)."""
    cm = qlower.compile(Fn(fn), xs, backend="onnxruntime")
    report = cm.report()
    assert len(report.compiled) == 1 and not report.fallbacks, str(report)
    assert _same(cm(*xs), fn(*xs))
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
        name = op._schema.name.removeprefix("aten::")
        assert any(pattern in source for pattern in (f"torch.{name}(", f".{name}(", f'"{name}"')), name


@pytest.mark.parametrize("mode", ["circular", "constant", "reflect", "replicate"])
def test_pad_by_mode(mode):
    """circular was Pad(mode="wrap"), which ONNX Runtime rejects at run time; the other modes
    keep torchlib's own translations (constant_pad_nd, reflection_pad*, replication_pad*)."""
    x = torch.randn(2, 3, 5, 6)
    _check(lambda x: torch.nn.functional.pad(x, (1, 2, 2, 1), mode=mode), x)
    _check(lambda x: torch.nn.functional.pad(x[0], (2, 1), mode=mode), x)
    if mode in ("circular", "constant"):
        _check(lambda x: torch.nn.functional.pad(x, (-1, 2, 1, -2), mode=mode), x)   # cropping sides


def test_repeat_interleave_with_tensor_repeats_and_an_output_size():
    x = torch.randn(3, 4)
    _check(lambda x, r: torch.repeat_interleave(x, r, dim=0, output_size=6), x, torch.tensor([2, 1, 3]))
    _check(lambda x, r: torch.repeat_interleave(x, r, dim=1, output_size=8), x, torch.tensor([2]))
    _check(lambda x, r: torch.repeat_interleave(x, r, output_size=24), x, torch.tensor([2]))
    _check(lambda x, r: torch.repeat_interleave(x, r, dim=0, output_size=3), x, torch.tensor([0, 3, 0]))
