"""backends/onnxruntime/linear_algebra.py: LU, triangular solves, Cholesky and Householder QR
unrolled into ATen ops torchlib translates. Each case compiles on onnxruntime into one cluster
with no fallback and compares with eager evaluated in float64 and rounded (the decompositions
compute in float64; eager's float32 LAPACK is within cond·6e-8 of that), pivots and info exactly.
Several ops share one compile (one ORT session each costs ~1 s)."""
from __future__ import annotations

import pytest
import torch

import qlower
from qlower.onnx.linear_algebra import DECOMPOSITIONS, MAX_UNROLLED

from conftest import Fn


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def _flat(value):
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _flat(v)]
    return [value]


def _compiled(fn, *xs):
    cm = qlower.compile(Fn(fn), xs, backend="onnxruntime")
    report = cm.report()
    assert len(report.compiled) == 1 and not report.fallbacks, str(report)
    return cm


def _check(fn, *xs, skip=()):
    """One ORT cluster; floats within 1e-5 of eager in float64, integers exact. `skip`: positions
    (in the flattened outputs) whose values torch leaves unspecified (a singular input's factor)."""
    got = _flat(_compiled(fn, *xs)(*xs))
    want = _flat(fn(*(x.double() if x.is_floating_point() else x for x in xs)))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, (i, g.shape, w.shape)
        if i in skip:
            continue
        if w.is_floating_point():
            assert g.dtype == torch.float32, (i, g.dtype)
            torch.testing.assert_close(g, w.float(), rtol=1e-5, atol=1e-5, equal_nan=True, msg=f"output {i}")
        else:
            assert torch.equal(g, w), (i, g, w)


# square, tall, wide; a batch. The default suite runs the batched tall one (each case is an
# unrolled graph of ~1-3k ONNX nodes, ~5 s to compile); `-m slow` runs all three.
SHAPES = [pytest.param((3, 3), marks=pytest.mark.slow), (2, 4, 3), pytest.param((2, 3, 4), marks=pytest.mark.slow)]


@pytest.mark.parametrize("shape", SHAPES)
def test_lu_factor_lu_and_unpack(shape):
    a = torch.randn(shape)

    def fn(a):
        lu, pivots, info = torch.linalg.lu_factor_ex(a)
        p, l, u = torch.lu_unpack(lu, pivots)
        _, l_only, u_only = torch.lu_unpack(lu, pivots, unpack_pivots=False)
        p_only, _, _ = torch.lu_unpack(lu, pivots, unpack_data=False)
        return lu, pivots, info, torch.linalg.lu(a), (p, l, u), l_only, u_only, p_only, torch.lu(a, get_infos=True)
    _check(fn, a)


def test_lu_of_singular_matrices_reports_info_and_keeps_going():
    """A zero column: pivot 0, info = its 1-based index, the other columns factored as LAPACK does."""
    a = torch.randn(2, 5, 5)
    a[0, :, 2] = 0
    a[1, :, 4] = 0
    _check(lambda a: torch.linalg.lu_factor_ex(a), a)


@pytest.mark.parametrize("left", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_solves_through_lu(left):
    a = torch.randn(2, 4, 4) + 3 * torch.eye(4)
    b = torch.randn(2, 4, 2) if left else torch.randn(2, 2, 4)

    def fn(a, b):
        lu, pivots = torch.linalg.lu_factor_ex(a)[:2]
        outs = [torch.linalg.lu_solve(lu, pivots, b, left=left, adjoint=adjoint) for adjoint in (False, True)]
        return outs, torch.linalg.solve_ex(a, b, left=left)[0]
    _check(fn, a, b)


def test_solve_ex_with_vectors_inverse_and_slogdet():
    a = torch.randn(3, 3, 3) + 2 * torch.eye(3)
    a[1] = -a[1]   # some negative determinants

    def fn(a, b, v):
        return (torch.linalg.solve_ex(a, b), torch.linalg.solve_ex(a, v), torch.linalg.inv_ex(a),
                torch.linalg.slogdet(a), torch.lu_solve(b, *torch.linalg.lu_factor_ex(a)[:2]))
    _check(fn, a, torch.randn(3, 3, 2), torch.randn(3, 3))


def test_singular_inputs_report_info_sign_zero_and_minus_inf():
    """inv_ex / solve_ex of a singular matrix: info as eager's, the values left unspecified by
    torch (eager's are LAPACK's partial work) not compared; slogdet: sign 0, logabsdet -inf."""
    a = torch.randn(2, 4, 4)
    a[1, 3] = a[1, 0]
    a[1, 2] = 0
    _check(lambda a: (torch.linalg.inv_ex(a), torch.linalg.slogdet(a)), a, skip=(0,))


@pytest.mark.parametrize("upper", [True, False])
def test_triangular_solves_read_only_their_triangle(upper):
    """The other triangle holds large values that must not leak in; right-hand solves, unit
    diagonals, triangular_solve's broadcast batch and transpose."""
    t = torch.randn(2, 4, 4) + 4 * torch.eye(4)
    other = torch.triu(torch.full((4, 4), 1e6), 1) if not upper else torch.tril(torch.full((4, 4), 1e6), -1)
    t = (torch.triu(t) if upper else torch.tril(t)) + other

    def fn(t, b, r):
        return ([torch.linalg.solve_triangular(t, b, upper=upper, unitriangular=u) for u in (False, True)],
                torch.linalg.solve_triangular(t, r, upper=upper, left=False),
                [torch.triangular_solve(b[0], t, upper=upper, transpose=tr) for tr in (False, True)])
    _check(fn, t, torch.randn(2, 4, 3), torch.randn(2, 3, 4))


@pytest.mark.parametrize("upper", [True, False])
def test_cholesky_and_its_solves(upper):
    a = torch.randn(2, 4, 4)
    pd = a @ a.mT + torch.eye(4)

    def fn(pd, b):
        factor, info = torch.linalg.cholesky_ex(pd, upper=upper)
        return factor, info, torch.cholesky_solve(b, factor, upper=upper), torch.cholesky_inverse(factor[0], upper=upper)
    _check(fn, pd, torch.randn(2, 4, 2))


def test_cholesky_of_a_matrix_that_is_not_positive_definite_reports_info():
    a = torch.randn(2, 4, 4)
    pd = a @ a.mT + torch.eye(4)
    pd[1, 2, 2] = -1.0
    _check(lambda pd: torch.linalg.cholesky_ex(pd), pd, skip=(0,))


@pytest.mark.parametrize("shape", SHAPES)
def test_householder_qr_geqrf_and_ormqr(shape):
    """LAPACK's reflector signs (R's diagonal negative where the column's head is positive), a
    zero column below the diagonal (tau = 0), Q·c, Qᵀ·c, c·Q, c·Qᵀ."""
    a = torch.randn(shape)
    a[..., 1:, 0] = 0   # the first reflector is the identity
    m = shape[-2]
    batch = shape[:-2]

    def fn(a, left_c, right_c):
        v, tau = torch.geqrf(a)
        outs = [v, tau, [torch.linalg.qr(a, mode=mode) for mode in ("reduced", "complete", "r")], torch.linalg.qr(a)]
        outs += [torch.ormqr(v, tau, left_c, left=True, transpose=tr) for tr in (False, True)]
        outs += [torch.ormqr(v, tau, right_c, left=False, transpose=tr) for tr in (False, True)]
        if shape[-2] >= shape[-1]:
            outs.append(torch.linalg.householder_product(v, tau))
        return outs
    _check(fn, a, torch.randn(*batch, m, 3), torch.randn(*batch, 3, m))


def test_near_misses_stay_in_pytorch_with_their_reason():
    """A matrix beyond MAX_UNROLLED; an op that raises in eager on singular input, on a symbolic
    size (its check is moved out only on static shapes: an ONNX graph cannot raise)."""
    big = torch.randn(MAX_UNROLLED + 1, MAX_UNROLLED + 1)
    cm = qlower.compile(Fn(lambda a: torch.linalg.lu_factor_ex(a)[0] * 2), (big,), backend="onnxruntime")
    assert [list(c.ops) for c in cm.report().fallbacks] == [["linalg_lu_factor_ex"]]
    batch = torch.export.Dim("batch", min=2)
    cm = qlower.compile(Fn(lambda a: torch.linalg.inv(a) * 2), (torch.randn(2, 3, 3),), backend="onnxruntime",
                        dynamic_shapes=(({0: batch},),))
    (fallback,) = cm.report().fallbacks
    assert "raises in eager on a singular" in fallback.reason


def _raising(a, b, spd, t):
    """Every op MoveErrorChecksOutside rewrites, each reading its own input."""
    lu, piv = torch.linalg.lu_factor(a)
    return (torch.linalg.inv(a), torch.linalg.solve(a, b), torch.linalg.cholesky(spd), torch.cholesky(spd, upper=True),
            lu, piv, torch.linalg.tensorinv(t, ind=1), torch.linalg.tensorsolve(t, b[:, 0].repeat(2)))


def _raising_inputs():
    a = torch.randn(3, 3)
    spd = a @ a.mT + torch.eye(3)
    return a, torch.randn(3, 2), spd, torch.randn(6, 2, 3)


def test_error_checks_outside_contract():
    """MoveErrorChecksOutside: each raising op becomes its `_ex` form + eager's check (positive), the
    values stay identical, a second run changes nothing (idempotent); a symbolic shape and the
    `_ex` forms themselves are left alone (near misses)."""
    from qlower.passes.onnxruntime.move_error_checks_outside import RAISING, MoveErrorChecksOutside
    from qlower.passes import PassContext
    args = _raising_inputs()
    gm = torch.export.export(Fn(_raising), args).module()
    before = gm(*args)
    raising = lambda: [n for n in gm.graph.nodes if n.target in RAISING]
    checks = lambda: [n for n in gm.graph.nodes if n.target is torch.ops.aten._linalg_check_errors.default]
    assert len(raising()) == 7 and not checks()
    assert MoveErrorChecksOutside().run(gm, PassContext()) is True
    assert not raising() and len(checks()) == 7
    assert MoveErrorChecksOutside().run(gm, PassContext()) is False
    for got, want in zip(gm(*args), before):
        assert torch.equal(got, want)
    batch = torch.export.Dim("batch", min=2)
    gm = torch.export.export(Fn(torch.linalg.inv), (torch.randn(2, 3, 3),), dynamic_shapes=(({0: batch},),)).module()
    assert MoveErrorChecksOutside().run(gm, PassContext()) is False


def test_ops_that_raise_in_eager_run_in_onnxruntime_and_raise_there_too():
    """One cluster, no fallback, eager's values; on singular / not positive-definite inputs the
    same error (type and message) as eager, the first op's in program order."""
    args = _raising_inputs()
    cm = _compiled(_raising, *args)
    for got, want in zip(cm(*args), _raising(*(x.double() for x in args))):
        if want.is_floating_point():
            torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-4)
        else:
            assert torch.equal(got, want)
    bad = [(torch.zeros(3, 3), *args[1:]), (args[0], args[1], -args[2], args[3]),
           (*args[:3], torch.zeros(6, 2, 3))]
    for inputs in bad:
        with pytest.raises(RuntimeError) as eager:
            _raising(*inputs)
        with pytest.raises(type(eager.value)) as ours:
            cm(*inputs)
        assert str(ours.value) == str(eager.value)


def test_every_linear_algebra_decomposition_is_tested_here():
    import inspect
    source = inspect.getsource(inspect.getmodule(test_every_linear_algebra_decomposition_is_tested_here))
    for op in DECOMPOSITIONS:
        name = op._schema.name.removeprefix("aten::").removeprefix("_").removeprefix("linalg_")
        assert name in source, name


def test_eigenvalues_singular_values_and_what_is_built_on_them():
    """Jacobi in float64 (odd sizes, padded; a batch; small, as the unrolled graph grows as n²):
    eigvalsh of the upper triangle, svdvals of a tall matrix, matrix_rank with a tolerance (the
    rank-deficient case: eager's default tolerance depends on the dtype, and the reference runs
    in float64), cond (2), the nuclear norm with keepdim. The rest in the slow variant below."""
    a = torch.randn(2, 3, 3)
    low_rank = torch.randn(2, 3, 1) @ torch.randn(2, 1, 3)

    def fn(a, low, tall):
        return (torch.linalg.eigvalsh(a, UPLO="U"), torch.linalg.svdvals(tall), torch.linalg.matrix_rank(low, rtol=1e-4),
                torch.linalg.cond(a), torch.linalg.matrix_norm(a, "nuc", keepdim=True))
    _check(fn, a, low_rank, torch.randn(2, 4, 2))


@pytest.mark.slow
def test_eigenvalues_and_singular_values_every_entry_point():
    """The aten entry points one by one (_linalg_eigh and _linalg_svd called directly, the
    lower triangle), matrix_rank's default, hermitian and atol/rtol tolerances, the spectral norm
    over other dims, -2, and "fro" (torch's own decomposition: `otherwise_torch`)."""
    a = torch.randn(2, 3, 3)
    low_rank = torch.randn(2, 3, 1) @ torch.randn(2, 1, 3)

    def fn(a, low, tall):
        return (torch.linalg.eigvalsh(a), torch.ops.aten._linalg_eigh(a, "L", False)[0],
                torch.ops.aten._linalg_svd(tall, compute_uv=False)[1], torch.linalg.matrix_rank(a),
                torch.linalg.matrix_rank(low + low.mT, hermitian=True, rtol=1e-4),
                torch.linalg.matrix_rank(a, atol=1.0, rtol=0.1), torch.linalg.cond(a, -2),
                torch.linalg.matrix_norm(tall, 2, dim=(0, -1)), torch.linalg.matrix_norm(a, -2),
                torch.linalg.matrix_norm(a, "fro"))
    _check(fn, a, low_rank, torch.randn(2, 4, 2))


def test_pseudo_inverses_by_rank():
    """pinv is unique whatever the eigenvectors' signs: full rank, rank-deficient (rank 1 of 3,
    with a tolerance: eager's default one depends on the dtype, and the reference runs in
    float64), hermitian; wide matrices, rtol = 1 (drops everything) and pinverse in the slow
    variant."""
    a = torch.randn(2, 3, 2)
    low_rank = torch.randn(3, 1) @ torch.randn(1, 3)
    symmetric = low_rank + low_rank.mT

    def fn(a, low, sym):
        return torch.linalg.pinv(a), torch.linalg.pinv(low, rtol=1e-4), torch.linalg.pinv(sym, hermitian=True, atol=1e-3)
    _check(fn, a, low_rank, symmetric)


@pytest.mark.slow
def test_pseudo_inverses_of_wide_matrices_with_every_tolerance():
    a = torch.randn(2, 3, 2)
    low_rank = torch.randn(3, 1) @ torch.randn(1, 3)
    _check(lambda a, low: (torch.linalg.pinv(a.mT), torch.linalg.pinv(low, rtol=1.0), torch.pinverse(a)), a, low_rank)
