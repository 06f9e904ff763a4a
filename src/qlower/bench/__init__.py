"""`qlower bench`: zoo models x stacks, side by side in one process run.

- stacks.py   how each stack (eager, torch.compile, PT2E + Inductor, ONNX Runtime, OpenVINO + NNCF,
              qlower on each backend) is built; a missing peer library is an error row
- harness.py  timing (interleaved rounds, input checks, accuracy, exactness vs the reference backend)
- machine.py  CPU model, ISA features (AVX2 / AVX-512 / VNNI / AMX), threads, library versions
- output.py   bench.json / bench.md / bench.png / bench.log, the terminal table, peer ratios
- suites.py   which models, batches and stacks `--suite default|quick|real` runs
"""
from .harness import StackResult, partition_scaling, run_bench, run_plan
from .machine import machine_info
from .logcapture import LogCapture
from .output import (baseline_warnings, best_peer_ratios, canonical_cell, paired_ratios, ratio_lines, rich_table,
                     write_outputs)
from .stacks import (DEFAULT_STACKS, FORMULATIONS, QUICK_STACKS, STACKS, PeerUnavailable, build_stack,
                     require)
from .suites import SUITES, Suite

__all__ = ["DEFAULT_STACKS", "FORMULATIONS", "QUICK_STACKS", "STACKS", "SUITES", "LogCapture", "PeerUnavailable",
           "StackResult", "Suite", "baseline_warnings", "best_peer_ratios", "build_stack", "canonical_cell",
           "machine_info", "paired_ratios", "partition_scaling", "ratio_lines", "require", "rich_table", "run_bench",
           "run_plan", "write_outputs"]
