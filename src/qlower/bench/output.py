"""What a bench run leaves behind: bench.json (results + machine), bench.md (machine header and
table), bench.png (chart), bench.log (everything third-party libraries print or warn while stacks
are prepared and timed), and the terminal table."""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

from .harness import StackResult
from .machine import describe, machine_info
from ..timing import NOISY_SPREAD, noisy


# ------------------------------------------------------------------------------ ratios
def _ours(r: StackResult) -> bool:
    """qlower's stacks that keep the canonical numerics (the Q/DQ-form and engine-native stacks
    do not)."""
    return r.stack.startswith("qlower-") and r.stack != "qlower-reference" and "-qdq" not in r.stack \
        and not r.stack.endswith("-native")


def _native(r: StackResult) -> bool:
    """qlower's engine-native stacks (the engine's own int8 arithmetic, declared in the report)."""
    return r.stack.startswith("qlower-") and r.stack.endswith("-native")


def _peer(r: StackResult) -> bool:
    return not r.stack.startswith("qlower-") and r.stack != "eager-fp32"


def precision(stack: str) -> str:
    """'fp32' or 'int8': what a stack computes in. Ratios compare like with like (measured: on
    the small zoo models qlower's fp32 stack often beats every int8 peer, and a best-of-all-stacks
    ratio then reported an int8 gap as a lead)."""
    return "fp32" if stack.endswith("-fp32") else "int8"


def _qlower_kind(native: bool):
    return _native if native else _ours


def _groups(results: list[StackResult]):
    """(label, rows) per model, batch and precision: 'hf-llama b1 int8'."""
    for model, batch, prec in sorted({(r.model, r.batch, precision(r.stack)) for r in results}):
        yield f"{model} b{batch} {prec}", [r for r in results if (r.model, r.batch) == (model, batch)
                                           and precision(r.stack) == prec and r.ok and r.median_ms]


def best_peer_ratios(results: list[StackResult], native: bool = False) -> dict[str, float]:
    """Per model/batch/precision: best qlower latency / best non-qlower, non-eager peer latency of
    the same precision (<1 is faster). Only qlower stacks that keep the canonical numerics count
    as qlower's (native=True: only its engine-native stacks)."""
    out = {}
    for label, rows in _groups(results):
        ours = [r.median_ms for r in rows if _qlower_kind(native)(r)]
        peers = [r.median_ms for r in rows if _peer(r)]
        if ours and peers:
            out[label] = min(ours) / min(peers)
    return out


def paired_ratios(results: list[StackResult], native: bool = False) -> dict[str, dict[str, float]]:
    """Per model/batch/precision: qlower's best canonical (native=True: engine-native) stack
    against each non-eager peer of the same precision, as the median over rounds of (qlower's
    block time / the peer's block time in the same round). Stacks of a round run back to back,
    so slow phases of a noisy machine hit both sides of each ratio; this is steadier than a ratio
    of medians (measured: one lstm run 1.62 as a ratio of medians, 1.07 paired; reruns 0.85 / 0.98)."""
    out: dict[str, dict[str, float]] = {}
    for label, rows in _groups(results):
        rows = [r for r in rows if r.samples]
        ours = [r for r in rows if _qlower_kind(native)(r)]
        if not ours:
            continue
        best = min(ours, key=lambda r: r.median_ms)
        peers = {r.stack: statistics.median(a / b for a, b in zip(best.samples, r.samples))
                 for r in rows if _peer(r)}
        if peers:
            out[label] = peers
    return out


def ratio_lines(results: list[StackResult]) -> list[str]:
    """The ratio summary (terminal and bench.md): qlower's canonical stacks, then its
    engine-native ones, against the best peer of the same precision and paired per round
    against each such peer."""
    lines = []
    for native, who in ((False, "qlower"), (True, "qlower engine-native")):
        lines += [f"{key}: {who} best / best peer latency = {ratio:.2f}"
                  for key, ratio in best_peer_ratios(results, native).items()]
        lines += [f"{key}: {who} / peer, paired per round: " + ", ".join(f"{peer} {r:.2f}" for peer, r in peers.items())
                  for key, peers in paired_ratios(results, native).items()]
    return lines


def baseline_warnings(results: list[StackResult]) -> list[str]:
    """One line per eager-fp32 row (the baseline of every 'vs eager' ratio) whose samples'
    interquartile range is over NOISY_SPREAD of their median: its ratios say more about the
    machine's load than about the stacks, and are flagged instead of taken as headlines."""
    lines = []
    for r in results:
        if r.stack != "eager-fp32" or not r.ok or len(r.samples) < 2:
            continue
        q = statistics.quantiles(r.samples, n=4)
        if noisy(statistics.median(r.samples), q[2] - q[0]):
            lines.append(f"{r.model} b{r.batch}: the eager-fp32 baseline is noisy ({r.median_ms:.3f} ms median, "
                         f"interquartile range {q[2] - q[0]:.3f} ms, over {NOISY_SPREAD:.0%} of the median): its "
                         "'vs eager' ratios are unreliable; rerun on an idle machine, with more --rounds or "
                         "fewer --threads")
    return lines


def canonical_cell(r: StackResult) -> str:
    """'0' (bit-exact), '12 (3.1e-07)' (elements differing, largest difference), '-' for peers."""
    if r.canonical_diff is None:
        return "-"
    return "0" if r.canonical_diff == 0 else f"{r.canonical_diff} ({r.canonical_max:.1e})"


def gops_cell(r: StackResult) -> str:
    """Achieved arithmetic rate, counting the model's fp32 FLOPs (2 per multiply-add) per call."""
    if not r.gflop or not r.median_ms:
        return "-"
    return f"{r.gflop / (r.median_ms / 1e3):.0f}"


# ------------------------------------------------------------------------------ files
def write_outputs(results: list[StackResult], out: Path, command: str, machine: dict | None = None,
                  chart: bool = True) -> None:
    machine = machine or machine_info()
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"command": command, "machine": machine,
                                                "results": [asdict(r) for r in results],
                                                "qlower_vs_best_peer": best_peer_ratios(results),
                                                "qlower_vs_peers_paired": paired_ratios(results),
                                                "qlower_native_vs_best_peer": best_peer_ratios(results, native=True),
                                                "qlower_native_vs_peers_paired": paired_ratios(results, native=True)},
                                               indent=1))
    lines = [f"Command: `{command}`", ""] + [f"{line}  " for line in describe(machine)] + [
        "",
        "| model | batch | stack | median ms | spread ms | vs eager | GFLOP/s | SQNR dB | cosine | != canonical (max) "
        "| prepare s | RSS +MB | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.ok and r.median_ms is not None:
            ratio = f"{r.vs_eager:.2f}x" if r.vs_eager else "-"
            lines.append(f"| {r.model} | {r.batch} | {r.stack} | {r.median_ms:.3f} | {r.spread_ms:.3f} | "
                         f"{ratio} | {gops_cell(r)} | {r.sqnr_db:.1f} | {r.cosine:.5f} | {canonical_cell(r)} | "
                         f"{r.prepare_s:.1f} | {r.rss_mb:.0f} | {r.peak_rss_mb:.0f} |")
        else:
            lines.append(f"| {r.model} | {r.batch} | {r.stack} | failed: {r.error} | | | | | | | | | |")
    flops = {f"{r.model} b{r.batch}": r.gflop for r in results if r.gflop}
    if flops:
        lines += ["", "GFLOP per call (fp32 count, eager, 2 per multiply-add): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in flops.items())]
    warnings = baseline_warnings(results)
    if warnings:
        lines += ["", "Warnings:", ""] + [f"- {line}" for line in warnings]
    lines += ["", "Latency ratios, qlower / peer (below 1: qlower faster; paired: the median over rounds of "
              "qlower's block time / the peer's in the same round; engine-native stacks run the engine's own "
              "int8 arithmetic, not the canonical numerics):", ""]
    lines += [f"- {line}" for line in ratio_lines(results)]
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    if chart:
        _chart(results, out / "bench.png")


def _chart(results: list[StackResult], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:   # the chart is optional: pip install 'qlower[bench]'
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r.model, r.batch) for r in results})
    stacks = list(dict.fromkeys(r.stack for r in results))
    width = 0.8 / max(len(stacks), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4))
    for i, stack in enumerate(stacks):
        values = [next((r.vs_eager or 0.0 for r in results if (r.model, r.batch) == g and r.stack == stack), 0.0)
                  for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], values, width, label=stack)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
    ax.set_xticklabels([f"{m} b{b}" for m, b in groups], rotation=20, fontsize=7)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylabel("speed-up vs eager fp32 (median)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rich_table(results: list[StackResult], machine: dict):
    """The terminal table, titled with the machine."""
    from rich.table import Table
    table = Table(title="qlower bench (medians per call)", caption="\n".join(describe(machine)))
    for col in ("model", "batch", "stack", "median ms", "spread ms", "vs eager", "GFLOP/s", "SQNR dB", "cosine",
                "!= canonical", "prepare s"):
        table.add_column(col, justify="left" if col in ("model", "stack") else "right")
    for r in results:
        if r.ok and r.median_ms is not None:
            table.add_row(r.model, str(r.batch), r.stack, f"{r.median_ms:.3f}", f"{r.spread_ms:.3f}",
                          f"{r.vs_eager:.2f}x" if r.vs_eager else "-", gops_cell(r), f"{r.sqnr_db:.1f}",
                          f"{r.cosine:.5f}", canonical_cell(r), f"{r.prepare_s:.1f}")
        else:
            table.add_row(r.model, str(r.batch), r.stack, "failed", r.error or "", "", "", "", "", "", "")
    return table
