"""What a compilation did: clusters, backends, fallbacks (with reasons), rewrites, refusals, and
for backend="auto" which engines were measured and why the winner won."""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class ClusterInfo:
    id: int
    backend: str
    nodes: int
    ops: dict[str, int]
    # compiled | fallback | constant (evaluated once at compile time) | state (buffer write-back)
    status: str = "compiled"
    reason: str | None = None         # why it fell back
    max_abs_diff: float | None = None  # worst |backend - PyTorch| seen with QLOWER_CHECK_CLUSTERS=1
    cache: str | None = None           # memory | disk | miss | rebuilt (a corrupt disk entry was replaced)
    nonfinite_calls: int | None = None   # calls whose NaN/inf inputs ran this cluster in PyTorch (openvino)
    int64_overflow_calls: int | None = None   # calls whose int64 values could leave int32: PyTorch (openvino)
    onnx: bytes | None = field(default=None, repr=False, compare=False)  # the emitted model, if any


@dataclass
class EngineTrial:
    """One engine measured by backend="auto" (engine_choice.py)."""
    backend: str
    # chosen | slower (correct, not the fastest) | not-faster (correct, not faster than the
    # reference backend) | mismatch (outputs differ from the reference backend) | failed (compile or
    # run raised) | less-accurate (its quantized program is less accurate vs float than another
    # candidate's) | abandoned (its compile or check would end past the time budget) | oracle (the
    # reference backend: its outputs are the check, its time the baseline)
    status: str
    median_ms: float | None = None   # median of the timed calls on the example inputs
    runs: int = 0                    # timed calls behind the median
    compile_s: float | None = None
    fallbacks: int = 0               # clusters that run in PyTorch instead of the engine
    check: str | None = None         # "bit-exact" | "float tolerance": how outputs were compared
    max_abs_diff: float | None = None  # worst |engine - reference| over the outputs
    reason: str | None = None        # why it was refused / lost, or the failure message
    program: str | None = None       # the quantized program it ran, where candidates differ
    sqnr_db: float | None = None     # that program's output SQNR vs the float model (example inputs)

    def describe(self) -> str:
        parts = [f"{self.backend}: {self.status}"]
        if self.median_ms is not None:
            parts.append(f"{self.median_ms:.3f} ms (median of {self.runs})")
        if self.compile_s is not None:
            parts.append(f"compile {self.compile_s:.2f} s")
        if self.fallbacks:
            parts.append(f"{self.fallbacks} fallback cluster{'s' if self.fallbacks != 1 else ''}")
        if self.check is not None:
            diff = "" if self.max_abs_diff is None else f", max |diff| {self.max_abs_diff:.3g}"
            parts.append(f"{self.check} vs reference{diff}")
        if self.program:
            parts.append(f"program: {self.program}" + ("" if self.sqnr_db is None else
                                                       f" (SQNR {self.sqnr_db:.1f} dB vs float)"))
        if self.reason:
            parts.append(self.reason)
        return "; ".join(parts)


@dataclass
class CompileReport:
    backend: str
    profile: str
    quantized: bool
    clusters: list[ClusterInfo] = field(default_factory=list)
    rewrites: dict[str, int] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    op_counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # backend="auto": every engine measured (empty when nothing was measured) and why the winner won
    engine_trials: list[EngineTrial] = field(default_factory=list)
    engine_choice: str | None = None
    # the model's own names of its flat inputs and outputs (what an exported engine file calls them)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @property
    def fallbacks(self) -> list[ClusterInfo]:
        return [c for c in self.clusters if c.status == "fallback"]

    @property
    def compiled(self) -> list[ClusterInfo]:
        return [c for c in self.clusters if c.status == "compiled"]

    def lowered_fraction(self) -> tuple[int, int]:
        """(integer conv/linear/matmul ops, all conv/linear/matmul ops) in the final graph."""
        integer = sum(v for k, v in self.op_counts.items()
                      if k.split(".")[0] in ("qlower::conv1d", "qlower::conv2d", "qlower::linear",
                                             "qlower::linear_dynamic", "qlower::matmul"))
        floating = sum(v for k, v in self.op_counts.items()
                       if k.split(".")[0] in ("aten::conv1d", "aten::conv2d", "aten::linear", "aten::matmul",
                                              "aten::bmm"))
        return integer, integer + floating

    def to_dict(self) -> dict:
        d = asdict(self)
        for c in d["clusters"]:
            c.pop("onnx", None)
        return d

    @staticmethod
    def from_dict(d: dict) -> "CompileReport":
        d = dict(d)
        d["clusters"] = [ClusterInfo(**c) for c in d.get("clusters", [])]
        d["engine_trials"] = [EngineTrial(**t) for t in d.get("engine_trials", [])]
        return CompileReport(**d)

    def __str__(self) -> str:
        lines = [f"backend: {self.backend}   numerics profile: {self.profile}   "
                 f"quantized: {'yes' if self.quantized else 'no'}"]
        lowered, total = self.lowered_fraction()
        lines.append(f"integer conv/linear/matmul: {lowered}/{total}")
        if self.inputs or self.outputs:
            lines.append(f"inputs: {', '.join(self.inputs)}   outputs: {', '.join(self.outputs)}")
        lines.append(f"clusters: {len(self.compiled)} compiled   fallbacks: {len(self.fallbacks)}")
        for c in self.clusters:
            ops = ", ".join(f"{k} x{v}" for k, v in Counter(c.ops).most_common(6))
            status = c.status + (f" ({c.reason})" if c.reason else "")
            if c.cache:
                status += f", cache {c.cache}"
            if c.max_abs_diff is not None:
                status += f", worst diff vs PyTorch {c.max_abs_diff:.3g}"
            if c.nonfinite_calls:
                status += f", {c.nonfinite_calls} call(s) with NaN/inf inputs ran in PyTorch"
            if c.int64_overflow_calls:
                status += f", {c.int64_overflow_calls} call(s) with int64 values that could leave int32 ran in PyTorch"
            lines.append(f"  #{c.id} {c.backend}: {c.nodes} nodes, {status}; {ops}")
        if self.rewrites:
            lines.append("rewrites:")
            lines += [f"  {k}: {v}" for k, v in sorted(self.rewrites.items())]
        if self.refusals:
            lines.append("refused (left in float):")
            lines += [f"  {r}" for r in self.refusals]
        if self.engine_choice or self.engine_trials:
            lines.append(f"engine choice: {self.engine_choice or self.backend}")
            lines += [f"  {t.describe()}" for t in self.engine_trials]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)
