"""Run a `qlower device-check` bundle on the device's host: numpy and iree-base-runtime only.

    python run.py BUNDLE --driver cuda [--runs 100] > results.json

Per module: load it on the driver's device, call it on the bundled inputs, compare with the
bundled outputs (every bit, or within the bundled tolerance) and with the module's outputs on
the CPU it was compiled on, then time it (median of
`--runs` calls after 10 warm-ups, host arrays in and out, as qlower's runner calls it). Prints
one JSON object; exits 1 if any module failed its check. This file is copied into the bundle
beside vm.py (qlower's VM caller) and imports nothing else of qlower.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _check(got: np.ndarray, want: np.ndarray, entry: dict) -> dict:
    if got.shape != want.shape or got.dtype != want.dtype:
        return {"ok": False, "why": f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"}
    if entry["exact"]:
        differ = int(np.count_nonzero(got.view(np.uint8) != want.view(np.uint8))) if got.size else 0
        return {"ok": differ == 0, "differing_bytes": differ}
    err = float(np.nanmax(np.abs(got.astype(np.float64) - want))) if got.size else 0.0
    ok = bool(np.allclose(got, want, atol=entry["atol"], rtol=entry["rtol"], equal_nan=True))
    return {"ok": ok, "max_abs_err": err, "atol": entry["atol"]}


def _merge(checks: list[dict]) -> dict:
    """One row for all outputs: ok if every output is; counts summed, errors maximized."""
    row = {"ok": all(c["ok"] for c in checks)}
    for c in checks:
        for k, v in c.items():
            if k == "differing_bytes":
                row[k] = row.get(k, 0) + v
            elif k in ("max_abs_err", "atol"):
                row[k] = max(row.get(k, 0.0), v)
            elif k == "why":
                row[k] = v
    return row


def _time_ms(fn, runs: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(bundle: Path, driver: str, runs: int, upload: str | None = None) -> dict:
    sys.path.insert(0, str(bundle))
    from vm import load_function   # the bundle's copy of qlower.backends.iree.vm
    manifest = json.loads((bundle / "manifest.json").read_text())
    results = []
    for entry in manifest["entries"]:
        row = {"name": entry["name"], "cpu_ms_compiled_on": entry["cpu_ms"]}
        try:
            start = time.perf_counter()
            fn = load_function((bundle / entry["vmfb"]).read_bytes(), driver, upload=upload)
            row["upload"] = fn.upload
            row["load_s"] = round(time.perf_counter() - start, 3)
            arrays = [np.load(bundle / f) for f in entry["inputs"]]
            outs = fn(*arrays)
            if len(outs) != len(entry["expected"]):
                raise RuntimeError(f"{len(outs)} outputs, {len(entry['expected'])} expected")
            checks = [_check(o, np.load(bundle / f), entry) for o, f in zip(outs, entry["expected"])]
            row.update(_merge(checks))
            cpus = [np.load(bundle / f) for f in entry["cpu_output"]]
            row["equal_to_cpu_module"] = all(o.shape == c.shape and np.array_equal(o, c, equal_nan=o.dtype.kind == "f")
                                             for o, c in zip(outs, cpus))
            row["device_ms"] = _time_ms(lambda: fn(*arrays), runs)
        except Exception as exc:  # noqa: BLE001  (reported per module; the run goes on)
            row.update({"ok": False, "why": f"{type(exc).__name__}: {str(exc)[:300]}"})
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return {"target": manifest["target"], "driver": driver, "batch": manifest["batch"],
            "compiled_on": manifest["compiled_on"], "results": results, "skipped": manifest["skipped"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--driver", default=None, help="iree-runtime driver (default: the bundle's)")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--upload", default=None, help="copy | pinned | pinned-copy (IreeFunction._argument)")
    args = parser.parse_args()
    driver = args.driver or json.loads((args.bundle / "manifest.json").read_text())["driver"]
    report = run(args.bundle, driver, args.runs, args.upload)
    print(json.dumps(report, indent=1))
    sys.exit(0 if all(r["ok"] for r in report["results"]) else 1)


if __name__ == "__main__":
    main()
