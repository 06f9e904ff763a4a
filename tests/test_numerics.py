"""Canonical numerics against exact oracles (Python fractions / integers) and the documented
peer-disagreement vectors from NUMERICS-NOTES.md."""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from qlower import numerics as N
from qlower.errors import NumericsError


def fp32_round(fr: Fraction) -> Fraction:
    """Exact round-to-nearest-even of a rational to binary32 (inf on overflow)."""
    if fr == 0:
        return Fraction(0)
    sign = -1 if fr < 0 else 1
    a = abs(fr)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, -126) - 23)
    n = a / ulp
    k = math.floor(n)
    rem = n - k
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and k % 2 == 1):
        k += 1
    r = k * ulp
    if r >= Fraction(2) ** 128:
        return Fraction(sign) * 10**60  # stands for inf; clamps below
    return sign * r


def rne(fr: Fraction) -> int:
    k = math.floor(fr)
    rem = fr - k
    return k + 1 if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and k % 2 == 1) else k


def oracle_quantize(x: float, s: float, zp: int, qmin: int, qmax: int) -> int:
    if math.isnan(x):
        return qmin
    if math.isinf(x):
        return qmax if x > 0 else qmin
    q = fp32_round(Fraction(x) / Fraction(s))
    return max(qmin, min(qmax, rne(q) + zp))


def f32(v) -> float:
    return float(np.float32(v))


def ulps_around(v: float, n: int = 3) -> list[float]:
    out, lo, hi = [v], np.float32(v), np.float32(v)
    for _ in range(n):
        lo, hi = np.nextafter(lo, np.float32(-np.inf)), np.nextafter(hi, np.float32(np.inf))
        out += [float(lo), float(hi)]
    return out


# ------------------------------------------------------------------ documented vectors
def test_e1_division_not_reciprocal():
    x, s = torch.tensor([0.273939937]), 0.00214854861
    assert N.quantize(x, s, 0, 0, 255, torch.uint8).item() == 127
    # PyTorch's decomposed quantize multiplies by the reciprocal and gets 128.
    assert torch.round(x * (1.0 / torch.tensor(s))).item() == 128


def test_e2_ties_to_even_and_e3_zero_point_after_rounding():
    assert N.quantize(torch.tensor([2.5]), 1.0, 0, 0, 255, torch.uint8).item() == 2
    assert N.quantize(torch.tensor([0.5]), 1.0, 1, 0, 255, torch.uint8).item() == 1


def test_e4_fp32_quotient_for_fp16_inputs():
    x = torch.tensor([7.95703125], dtype=torch.float16)
    assert N.quantize(x, 0.1964111328125, 0, -128, 127, torch.int8).item() == 41


def test_special_values():
    x = torch.tensor([0.0, -0.0, 1e-45, -1e-45, float("inf"), float("-inf"), float("nan"), 1e10, -3e38, 3e38])
    got = N.quantize(x, 0.05, 3, -128, 127, torch.int8).tolist()
    want = [oracle_quantize(f32(v), f32(0.05), 3, -128, 127) for v in x.tolist()]
    assert got == want
    assert got[6] == -128  # NaN -> qmin (declared rule)


@pytest.mark.parametrize("scale,zp,dtype", [(0.0213, 128, torch.uint8), (0.00214854861, 0, torch.uint8),
                                            (0.1, -3, torch.int8), (1.7e-5, 0, torch.int8)])
def test_tie_neighbourhoods_for_every_k(scale, zp, dtype):
    qmin, qmax = N.dtype_range(dtype)
    s = f32(scale)
    xs = []
    for k in range(qmin - zp - 1, qmax - zp + 1):
        tie = float(fp32_round((Fraction(k) + Fraction(1, 2)) * Fraction(s)))
        xs += ulps_around(tie, 3)
    got = N.quantize(torch.tensor(xs, dtype=torch.float32), s, zp, qmin, qmax, dtype).tolist()
    want = [oracle_quantize(x, s, zp, qmin, qmax) for x in xs]
    assert got == want


@pytest.mark.parametrize("scale", [0.0078125, 0.01, 0.3, 17.0])
def test_fp16_exhaustive(scale):
    x16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    x = x16.to(torch.float32)
    got = N.quantize(x16, scale, 5, -128, 127, torch.int8).to(torch.int64).numpy()
    # Independent path: fp32 division is correctly rounded via float64 (53 >= 2*24 + 2).
    xn, s = x.numpy().astype(np.float64), np.float64(np.float32(scale))
    q = np.rint(np.float32(xn / s).astype(np.float64))
    q = np.where(np.isnan(q), -128 - 5, q)
    want = np.clip(q + 5, -128, 127).astype(np.int64)
    assert np.array_equal(got, want)


def test_dequantize_and_roundtrip():
    q = torch.arange(0, 256, dtype=torch.int32).to(torch.uint8)
    x = N.dequantize(q, 0.02, 128)
    assert torch.equal(x, (q.to(torch.int32) - 128).to(torch.float32) * torch.tensor(0.02))
    assert torch.equal(N.quantize(x, 0.02, 128, 0, 255, torch.uint8), q)


def test_per_channel_quantize_axis():
    x = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    q = N.quantize(x, torch.tensor([0.5, 0.25]), torch.tensor([0, 1]), -128, 127, torch.int8, axis=0)
    assert q.tolist() == [[2, 2], [5, 5]]


def test_bias_quantization_and_overflow():
    assert N.quantize_bias(torch.tensor([0.5, -0.25]), torch.tensor([0.25, 0.5])).tolist() == [2, 0]
    with pytest.raises(NumericsError):
        N.quantize_bias(torch.tensor([1e6]), torch.tensor([1e-6]))


# ------------------------------------------------------------------ requantize: float profile
def oracle_requant_float(acc: int, acc_scale: float, out_scale: float, zp: int, qmin: int, qmax: int) -> int:
    m = fp32_round(Fraction(f32(acc_scale)) / Fraction(f32(out_scale)))
    v = fp32_round(fp32_round(Fraction(acc)) * m)
    return max(qmin, min(qmax, rne(v) + zp))


def test_float_profile_multiplier_order_matches_onnxruntime():
    sx, sw, sy = f32(0.0123), f32(0.00071), f32(0.0457)
    acc_scale = N.accumulator_scale(sx, sw)
    assert acc_scale.item() == float(fp32_round(Fraction(sx) * Fraction(sw)))
    m = N.float_multiplier(acc_scale, sy).item()
    assert m == float(fp32_round(Fraction(acc_scale.item()) / Fraction(sy)))


def test_float_profile_ties_solved_near_half():
    rng = np.random.default_rng(0)
    accs, scales = [], []
    for _ in range(300):
        m = f32(rng.uniform(1e-4, 0.5))
        k = int(rng.integers(-100, 100))
        acc = round((k + 0.5) / m)  # lands within a fraction of an LSB of a tie
        for a in (acc - 1, acc, acc + 1):
            accs.append(a)
            scales.append(m)
    for a, m in zip(accs, scales):
        got = N.requantize(torch.tensor([a], dtype=torch.int32), m, 1.0, 3, -128, 127, torch.int8).item()
        assert got == oracle_requant_float(a, m, 1.0, 3, -128, 127)


def test_requant_accumulators_solved_onto_ties():
    """Solve (acc, M) so that acc * M is exactly k + 1/2 (distance 0 <= 1e-9): acc = +-2^a,
    M = (2k+1) * 2^-(a+1), exact in fp32. Check both profiles against integer / rational oracles
    and the tie rule each profile declares (float: half to even; fixed: half toward +inf)."""
    rng = np.random.default_rng(7)
    for a in range(0, 31):
        for k in rng.integers(0, 127, size=6).tolist():
            m = (2 * k + 1) * 2.0 ** -(a + 1)
            assert f32(m) == m
            for sign in (1, -1):
                acc = sign * 2**a if not (sign == 1 and a == 31) else 2**31 - 1
                assert Fraction(acc) * Fraction(m) == sign * (k + Fraction(1, 2))
                t = torch.tensor([acc], dtype=torch.int32)
                got_float = N.requantize(t, m, 1.0, 0, -128, 127, torch.int8).item()
                assert got_float == oracle_requant_float(acc, m, 1.0, 0, -128, 127)
                assert got_float == max(-128, min(127, rne(sign * (k + Fraction(1, 2)))))
                fm = N.fixed_multiplier(m)
                got_fixed = N.requantize(t, m, 1.0, 0, -128, 127, torch.int8, profile="fixed").item()
                want = (acc * fm.multiplier + (1 << (fm.shift - 1))) >> fm.shift
                assert got_fixed == max(-128, min(127, want))
                assert got_fixed == max(-128, min(127, math.floor(sign * (k + Fraction(1, 2)) + Fraction(1, 2))))


def test_float_profile_documented_disagreements():
    acc = torch.tensor([5, 5279], dtype=torch.int32)
    assert N.requantize(acc[:1], 0.5, 1.0, 0, -128, 127, torch.int8).item() == 2
    assert N.requantize(acc[1:], 0.0050196624, 1.0, 0, -128, 127, torch.int8).item() == 26
    # |acc| > 2^24: fp32(acc) drops the low bit, 2^24+1 times 2^-25 gives 0, not the exact 1.
    big = torch.tensor([2**24 + 1], dtype=torch.int32)
    assert N.requantize(big, 2.0**-25, 1.0, 0, -128, 127, torch.int8).item() == 0
    assert N.requantize(big, 2.0**-25, 1.0, 0, -128, 127, torch.int8, profile="fixed").item() == 1


# ------------------------------------------------------------------ requantize: fixed profile
def oracle_fixed(scale: float):
    mant, e = math.frexp(scale)
    m = math.floor(Fraction(mant) * 2**31 + Fraction(1, 2))
    if m == 2**31:
        m //= 2
        e += 1
    shift = 31 - e
    if shift > 62:
        m >>= min(31, shift - 62)
        shift = 62
    return m, shift


@pytest.mark.parametrize("scale,shift", [(2.0**28 * 1.5, 2), (0.75, 31), (0.3, 32), (2.0**-32 * 1.3, 62)])
def test_fixed_multiplier_shift_boundaries(scale, shift):
    fm = N.fixed_multiplier(scale)
    assert (fm.multiplier, fm.shift) == oracle_fixed(scale)
    assert fm.shift == shift and 2**30 <= fm.multiplier < 2**31


def test_fixed_multiplier_renormalises_m_equal_2_pow_31():
    fm = N.fixed_multiplier(1.0 - 2.0**-40)
    assert fm == N.FixedMultiplier(2**30, 30)


def test_fixed_multiplier_folds_large_shift_and_rejects_huge_scale():
    fm = N.fixed_multiplier(2.0**-40)
    assert fm.shift == 62 and fm.multiplier == 2**30 >> 8  # 2^22 * 2^-62 == 2^-40
    with pytest.raises(NumericsError):
        N.fixed_multiplier(2.0**30)


def test_fixed_rescale_against_integer_oracle():
    rng = np.random.default_rng(1)
    for _ in range(50):
        scale = float(rng.uniform(1e-6, 1.0))
        fm = N.fixed_multiplier(scale)
        accs = rng.integers(-2**31, 2**31 - 1, size=64).tolist() + [0, 1, -1, 2**31 - 1, -2**31]
        got = N.requantize_fixed(torch.tensor(accs, dtype=torch.int32), [fm], 7, -128, 127, torch.int8).tolist()
        want = [max(-128, min(127, ((a * fm.multiplier + (1 << (fm.shift - 1))) >> fm.shift) + 7)) for a in accs]
        assert got == want


def test_fixed_profile_half_rounds_up():
    acc = torch.tensor([5, -5], dtype=torch.int32)
    assert N.requantize(acc, 0.5, 1.0, 0, -128, 127, torch.int8, profile="fixed").tolist() == [3, -2]


def test_unknown_profile_is_typed_error():
    with pytest.raises(NumericsError):
        N.requantize(torch.tensor([1], dtype=torch.int32), 0.5, 1.0, 0, -128, 127, torch.int8, profile="x")


def test_integer_mean_rounds_half_to_even_exactly():
    rng = np.random.default_rng(3)
    for n in (2, 4, 49, 64):
        q = torch.tensor(rng.integers(0, 256, size=(3, n)), dtype=torch.uint8)
        # n/2 elements +1: tie at .5 when n/2 odd
        q[0] = torch.tensor([10 + (i % 2) for i in range(n)], dtype=torch.uint8)
        got = N.mean_integer(q, 7, [1], False, 0, 255, torch.uint8).tolist()
        want = [max(0, min(255, rne(Fraction(sum(int(v) - 7 for v in row), n)) + 7)) for row in q.tolist()]
        assert got == want
