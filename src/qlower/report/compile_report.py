"""What a compilation did: clusters, backends, fallbacks (with reasons), rewrites, refusals."""
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
    onnx: bytes | None = field(default=None, repr=False, compare=False)  # the emitted model, if any


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

    @property
    def fallbacks(self) -> list[ClusterInfo]:
        return [c for c in self.clusters if c.status == "fallback"]

    @property
    def compiled(self) -> list[ClusterInfo]:
        return [c for c in self.clusters if c.status == "compiled"]

    def lowered_fraction(self) -> tuple[int, int]:
        """(integer conv/linear/matmul ops, all conv/linear/matmul ops) in the final graph."""
        integer = sum(v for k, v in self.op_counts.items()
                      if k.split(".")[0] in ("qlower::conv1d", "qlower::conv2d", "qlower::linear", "qlower::matmul"))
        floating = sum(v for k, v in self.op_counts.items()
                       if k.split(".")[0] in ("aten::conv1d", "aten::conv2d", "aten::linear", "aten::matmul", "aten::bmm"))
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
        return CompileReport(**d)

    def __str__(self) -> str:
        lines = [f"backend: {self.backend}   numerics profile: {self.profile}   "
                 f"quantized: {'yes' if self.quantized else 'no'}"]
        lowered, total = self.lowered_fraction()
        lines.append(f"integer conv/linear/matmul: {lowered}/{total}")
        lines.append(f"clusters: {len(self.compiled)} compiled   fallbacks: {len(self.fallbacks)}")
        for c in self.clusters:
            ops = ", ".join(f"{k} x{v}" for k, v in Counter(c.ops).most_common(6))
            status = c.status + (f" ({c.reason})" if c.reason else "")
            if c.cache:
                status += f", cache {c.cache}"
            if c.max_abs_diff is not None:
                status += f", worst diff vs PyTorch {c.max_abs_diff:.3g}"
            lines.append(f"  #{c.id} {c.backend}: {c.nodes} nodes, {status}; {ops}")
        if self.rewrites:
            lines.append("rewrites:")
            lines += [f"  {k}: {v}" for k, v in sorted(self.rewrites.items())]
        if self.refusals:
            lines.append("refused (left in float):")
            lines += [f"  {r}" for r in self.refusals]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)
