"""OpInfo conformance of the onnxruntime backend, on a suite qlower did not write: PyTorch's own
OpInfo database (`op_db`), float32 CPU sample inputs, 3 samples per op spread over its first 12.

Per sample: the op wrapped in an nn.Module (tensor leaves of the sample are forward inputs,
everything else is baked in); a sample torch.export cannot capture is skipped ("not capturable");
the rest is compiled with `qlower.compile(..., backend="onnxruntime")`, run, and compared with
eager (same structure, dtype and shape; floats within tolerance with NaNs in the same places;
integers and bools exact). Per op, the worst of its samples:

  mismatch        any wrong answer (must never happen: an op that cannot be matched falls back)
  error: <Class>  compile or run raised (a QlowerError subclass; a raw exception is a finding)
  fallback: <why> some cluster ran in PyTorch; results match
  onnxruntime     every sample ran entirely in ONNX Runtime and matches
  not capturable  torch.export captured none of its samples (or eager ran none)

The outcome class of every op is checked in (tests/opinfo_expected.json). The default suite runs
a deterministic sample of it; `-m slow` runs all of it. Regenerate the file with
`QLOWER_UPDATE_OPINFO=1 .venv/bin/python -m pytest tests/test_opinfo.py -m slow` (or run this
file as a script: `.venv/bin/python tests/test_opinfo.py --out results.jsonl`, which runs every op
with a per-op timeout, appends one JSON line per op, resumes where it stopped, and with
`--expected` rewrites the expectation file and prints the numbers of docs/coverage.md).
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import math
import os
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

EXPECTED = Path(__file__).with_name("opinfo_expected.json")
UPDATE_ENV = "QLOWER_UPDATE_OPINFO"
SAMPLES_PER_OP = 3
SAMPLE_POOL = 12          # ... picked evenly from the first SAMPLE_POOL samples of each op
DEFAULT_OPS = 40          # ops in the default (fast) run, GAP_REGRESSIONS included
RTOL, ATOL = 1e-4, 1e-4   # float32: ORT's vectorized kernels (exp, tanh, erf, reductions) differ in the last bits
# Ops whose output values are undefined (uninitialized memory): only structure, dtype and shape compare.
UNDEFINED_VALUES = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}
# Ops whose samples hit a measured GAP (capability.GAPS; they mismatched before it): always in
# the default run, so a GAP narrowed too far shows as a mismatch at once.
GAP_REGRESSIONS = ("_native_batch_norm_legit", "_upsample_bilinear2d_aa", "addmm", "linalg.matrix_power",
                   "linalg.vecdot", "nn.functional.avg_pool3d", "nn.functional.batch_norm", "special.erfcx",
                   "std.unbiased", "var_mean.unbiased")
CLASSES = ("onnxruntime", "fallback", "not capturable", "error", "mismatch")
# Wrong answers and raw exceptions in qlower itself (not in torchlib or ONNX Runtime, so not a GAP):
# reported, expected (xfail) until fixed. Every other op must match and raise only QlowerErrors.
QLOWER_BUGS: dict[str, str] = {
    # (empty: nn.functional.embedding with max_norm, the last one, is fixed: partition/cluster.py
    # orders readers after an in-place write through a view; tests/test_partition.py)
}


def op_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def float32_ops() -> dict:
    """op name -> OpInfo, for every op in op_db with float32 CPU support."""
    pytest.importorskip("expecttest")   # torch.testing._internal needs it
    from torch.testing._internal.common_methods_invocations import op_db
    return {op_name(op): op for op in op_db if torch.float32 in op.supported_dtypes("cpu")}


class _OpModule(torch.nn.Module):
    """One sample as a module: forward(*tensors) rebuilds (input, args, kwargs) and calls the op."""

    def __init__(self, fn, leaves: list, spec, tensor_positions: list[int]):
        super().__init__()
        self.fn, self.leaves, self.spec, self.positions = fn, leaves, spec, tensor_positions

    def forward(self, *tensors):
        leaves = list(self.leaves)
        for i, t in zip(self.positions, tensors):
            leaves[i] = t
        inp, args, kwargs = torch.utils._pytree.tree_unflatten(leaves, self.spec)
        return self.fn(inp, *args, **kwargs)


def _as_module(op, sample) -> tuple[_OpModule, tuple]:
    leaves, spec = torch.utils._pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    tensors = tuple(leaves[i].detach() for i in positions)
    baked = [None if isinstance(v, torch.Tensor) else v for v in leaves]
    return _OpModule(op.op, baked, spec, positions), tensors


def _clone(tensors: tuple) -> tuple:
    return tuple(t.clone() for t in tensors)


def _upcast(t: torch.Tensor) -> torch.Tensor:
    """Types some comparisons lack kernels for (complex32, float16, bfloat16) widened."""
    if t.dtype == torch.complex32:
        return t.to(torch.complex64)
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _equal(a, b) -> bool:
    la, lb = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            x, y = _upcast(x.detach()), _upcast(y.detach())
            if not bool(((x == y) | ((x != x) & (y != y))).all()):
                return False
        elif x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
            return False
    return True


def compare(got, want, values: bool = True) -> str | None:
    """None if `got` matches eager's `want`, else what differs."""
    lg, sg = torch.utils._pytree.tree_flatten(got)
    lw, sw = torch.utils._pytree.tree_flatten(want)
    if len(lg) != len(lw):
        return f"{len(lg)} outputs, eager has {len(lw)}"
    for i, (g, w) in enumerate(zip(lg, lw)):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                return f"output {i}: {type(g).__name__}, eager has a tensor"
            if g.dtype != w.dtype:
                return f"output {i}: dtype {g.dtype}, eager {w.dtype}"
            if g.shape != w.shape:
                return f"output {i}: shape {tuple(g.shape)}, eager {tuple(w.shape)}"
            if not values or w.numel() == 0:
                continue
            g, w = _upcast(g.detach()), _upcast(w.detach())
            exact = not (w.is_floating_point() or w.is_complex())
            try:
                torch.testing.assert_close(g, w, rtol=0 if exact else RTOL, atol=0 if exact else ATOL,
                                           equal_nan=True, check_stride=False)
            except AssertionError as exc:
                lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
                return f"output {i}: " + "; ".join(lines)[:240]
        elif isinstance(w, float):
            if not (isinstance(g, (float, int)) and (math.isclose(g, w, rel_tol=RTOL, abs_tol=ATOL)
                                                     or (math.isnan(g) and math.isnan(w)))):
                return f"output {i}: {g!r}, eager {w!r}"
        elif g != w:
            return f"output {i}: {g!r}, eager {w!r}"
    return None


@contextlib.contextmanager
def _quiet():
    loggers = [logging.getLogger(n) for n in ("qlower", "torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def run_sample(op, sample, backend: str = "onnxruntime") -> str:
    """The outcome of one sample (see the module docstring), or 'skip: <why>'. `backend`: the
    checked-in expectation is onnxruntime's; the script's --backend sweeps another engine for
    wrong answers (its "onnxruntime" outcome then means "entirely in that engine")."""
    import qlower
    from qlower.errors import QlowerError
    module, tensors = _as_module(op, sample)
    try:
        torch.manual_seed(1)
        want = module(*_clone(tensors))
        torch.manual_seed(2)
        again = module(*_clone(tensors))
    except Exception as exc:
        return f"skip: eager raised {type(exc).__name__}"
    try:
        ep = torch.export.export(module, _clone(tensors), strict=False)
    except Exception as exc:
        return f"not capturable: {type(exc).__name__}"
    random = any(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()) for n in ep.graph.nodes)
    # random ops (and uninitialized memory): structure, dtype and shape only
    values = not random and op.name not in UNDEFINED_VALUES and _equal(want, again)
    try:
        cm = qlower.compile(module, _clone(tensors), backend=backend)
        got = cm(*_clone(tensors))
    except QlowerError as exc:
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    except Exception as exc:  # untyped: itself a finding
        return f"error: raw {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    diff = compare(got, want, values)
    if diff is not None:
        return f"mismatch: {diff}"
    fallbacks = cm.report().fallbacks
    if fallbacks:
        f = fallbacks[0]
        return f"fallback: {', '.join(f.ops)}: {f.reason}"
    return "onnxruntime"


_RANK = {"mismatch": 0, "error": 1, "fallback": 2, "onnxruntime": 3, "not capturable": 4, "skip": 5}


def outcome_class(outcome: str) -> str:
    return outcome.split(":")[0]


def run_op(op, samples_per_op: int = SAMPLES_PER_OP, backend: str = "onnxruntime") -> tuple[str, list[str]]:
    """(the op's outcome: the worst of its samples', every sample's outcome)."""
    torch.manual_seed(0)
    outcomes = []
    with _quiet(), torch.no_grad():
        try:
            first = list(itertools.islice(op.sample_inputs("cpu", torch.float32), SAMPLE_POOL))
        except Exception as exc:
            return f"not capturable: sample_inputs raised {type(exc).__name__}", []
        # spread over the first SAMPLE_POOL samples (the first few are often one variant)
        picks = sorted({round(i * (len(first) - 1) / max(samples_per_op - 1, 1)) for i in range(samples_per_op)})
        for sample in [first[i] for i in picks if first]:
            try:
                outcomes.append(run_sample(op, sample, backend))
            except Exception as exc:  # the harness itself (a comparison with no kernel): not a finding
                outcomes.append(f"skip: harness raised {type(exc).__name__}: {str(exc)[:100]}")
    ran = [o for o in outcomes if outcome_class(o) not in ("skip", "not capturable")]
    if not ran:
        return (next((o for o in outcomes if outcome_class(o) == "not capturable"), None)
                or f"not capturable: no sample eager runs ({len(outcomes)} samples)"), outcomes
    return min(ran, key=lambda o: _RANK[outcome_class(o)]), outcomes


# ---------------------------------------------------------------- the tests

def _expected() -> dict[str, str]:
    return json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}


def default_ops(expected: dict[str, str]) -> list[str]:
    """A deterministic sample of the capturable ops (by hash of the name), plus the GAP regressions."""
    capturable = sorted((n for n, c in expected.items() if c != "not capturable"),
                        key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    gaps = [n for n in GAP_REGRESSIONS if n in expected]
    picked = [n for n in capturable if n not in gaps and n not in QLOWER_BUGS][:DEFAULT_OPS - len(gaps)]
    return sorted(picked + gaps)


_RESULTS: dict[str, str] = {}


@pytest.fixture(scope="module")
def ops():
    yield float32_ops()
    if os.environ.get(UPDATE_ENV) == "1" and _RESULTS:
        merged = {**_expected(), **{n: outcome_class(o) for n, o in _RESULTS.items()}}
        EXPECTED.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")


def _check(ops, name: str) -> None:
    expected = _expected()
    if name not in ops:
        pytest.fail(f"{name} is in {EXPECTED.name} but no longer in op_db with float32 samples")
    outcome, samples = run_op(ops[name])
    _RESULTS[name] = outcome
    got, want = outcome_class(outcome), expected.get(name)
    if name in QLOWER_BUGS and (got == "mismatch" or outcome.startswith("error: raw")):
        pytest.xfail(f"known qlower bug: {QLOWER_BUGS[name]}: {outcome}")
    assert got != "mismatch", f"{name}: wrong answer: {outcome} (samples: {samples})"
    assert not outcome.startswith("error: raw"), f"{name}: untyped exception: {outcome} (samples: {samples})"
    if os.environ.get(UPDATE_ENV) == "1":
        return
    if want == "onnxruntime" or got in ("error", "not capturable") or want is None:
        assert got == want, f"{name}: expected {want}, got {outcome} (samples: {samples}); " \
                            f"if intended, regenerate with {UPDATE_ENV}=1"
    elif got != want:   # an improvement (fallback -> onnxruntime): record it
        warnings.warn(f"{name}: {want} -> {got}; regenerate {EXPECTED.name} with {UPDATE_ENV}=1")


@pytest.mark.parametrize("name", default_ops(_expected()))
def test_opinfo_sample(ops, name):
    _check(ops, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_expected()))
def test_opinfo_full(ops, name):
    _check(ops, name)


@pytest.mark.slow
def test_opinfo_expected_covers_op_db(ops):
    """Every float32 op of op_db has a checked-in outcome (new ops in a torch upgrade show here)."""
    missing = sorted(set(ops) - set(_expected()))
    assert not missing, f"ops without an expected outcome: {missing}; regenerate with {UPDATE_ENV}=1"


def test_expected_has_no_mismatch():
    """Mismatches are checked in only for the known qlower bugs (GAPS make every other one fall back)."""
    assert all(c in CLASSES[:4] or n in QLOWER_BUGS for n, c in _expected().items())


# ---------------------------------------------------------------- full run as a script

class _Timeout(Exception):
    pass


def main(argv: list[str] | None = None) -> None:
    import argparse
    import signal
    p = argparse.ArgumentParser(description="OpInfo conformance: run every op, one JSON line each")
    p.add_argument("--out", default="opinfo_results.jsonl")
    p.add_argument("--timeout", type=int, default=120, help="seconds per op")
    p.add_argument("--only", nargs="*", help="op names (default: every float32 op in op_db)")
    p.add_argument("--backend", default="onnxruntime", help="the engine to sweep (the expectation is onnxruntime's)")
    p.add_argument("--samples", type=int, default=SAMPLES_PER_OP,
                   help="samples per op (fewer for a slow engine's sweep)")
    p.add_argument("--expected", action="store_true", help=f"write {EXPECTED.name} from --out, print the numbers")
    args = p.parse_args(argv)
    os.environ.setdefault("QLOWER_CACHE_DIR", "off")
    torch.set_num_threads(1)   # a shared machine (ORT sessions follow torch's thread count)
    out = Path(args.out)
    done = {json.loads(ln)["op"] for ln in out.read_text().splitlines()} if out.exists() else set()
    ops = float32_ops()
    if not args.expected:
        def alarm(*_):
            raise _Timeout()
        signal.signal(signal.SIGALRM, alarm)
        for name in (args.only or sorted(ops)):
            if name in done and not args.only:
                continue
            t = time.time()
            signal.alarm(args.timeout)
            try:
                outcome, samples = run_op(ops[name], args.samples, backend=args.backend)
            except _Timeout:
                outcome, samples = f"error: timeout after {args.timeout} s", []
            finally:
                signal.alarm(0)
            line = {"op": name, "outcome": outcome, "samples": samples, "seconds": round(time.time() - t, 2)}
            with out.open("a") as f:
                f.write(json.dumps(line) + "\n")
            print(f"{name:40s} {time.time() - t:6.1f}s {outcome[:150]}", flush=True)
        return
    results = {}
    for ln in out.read_text().splitlines():
        r = json.loads(ln)
        results[r["op"]] = r
    summarize(results, len(ops))
    EXPECTED.write_text(json.dumps({n: outcome_class(r["outcome"]) for n, r in sorted(results.items())},
                                   indent=1) + "\n")


def _bucket(outcome: str) -> str:
    """A fallback / error outcome's reason, grouped (docs/coverage.md's table)."""
    import re
    parts = outcome.split(": ", 2)
    why = parts[-1] if outcome.startswith("fallback") and len(parts) == 3 else outcome.split(": ", 1)[-1]
    rules = [(r"dtype (torch\.\w+) is not compiled",
              r"dtype \1 is not compiled for ONNX Runtime (qlower's dtype list)"),
             (r"No ONNX function found for <OpOverload\(op='([\w.]+)'", r"translation failed: torchlib has no \1"),
             (r"Could not find an implementation for (\w+)", r"ONNX Runtime has no CPU kernel for \1"),
             (r"view Float as Byte", "qlower: cluster cache key fails on a 0-d constant (cache.py view(uint8))"),
             (r"^(aten::\w+): torch.onnx has no translation", r"not in torchlib: \1"),
             (r"torch.onnx has no translation", "not in torchlib"),
             (r"Required parameter '(\w+)' is not provided.*torch_lib::(\w+)",
              r"translation failed: torchlib \2 requires \1"),
             (r"(INVALID_GRAPH|INVALID_ARGUMENT|FAIL) : .*?(Op \(\w+\)|Optype \(\w+\)|\(\"node_(\w+?)_\d+)",
              r"ONNX Runtime rejects the model (\1)"),
             (r"^run failed", "ONNX Runtime run failed"),
             (r"GuardOnDataDependent|data-dependent", "translation failed: data-dependent shape"),
             (r"^compile failed: (\w+)", r"translation failed: \1")]
    for pattern, repl in rules:
        m = re.search(pattern, why)
        if m:
            return m.expand(repl)
    return why[:120]


def summarize(results: dict, n_ops: int) -> None:
    from collections import Counter
    classes = Counter(outcome_class(r["outcome"]) for r in results.values())
    capturable = len(results) - classes["not capturable"]
    print(f"ops in op_db with float32 samples: {n_ops}; run: {len(results)}")
    print(f"export-capturable: {capturable}")
    for c in CLASSES:
        print(f"  {c}: {classes[c]}" + (f" ({100 * classes[c] / max(capturable, 1):.1f}% of capturable)"
                                         if c != "not capturable" else ""))
    for kind in ("fallback", "error", "mismatch", "not capturable"):
        buckets = Counter(_bucket(r["outcome"]) for r in results.values() if outcome_class(r["outcome"]) == kind)
        print(f"{kind} reasons:")
        for why, n in buckets.most_common():
            ops = sorted(name for name, r in results.items()
                         if outcome_class(r["outcome"]) == kind and _bucket(r["outcome"]) == why)
            print(f"  {n:4d}  {why}  [{', '.join(ops[:8])}{', ...' if len(ops) > 8 else ''}]")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
