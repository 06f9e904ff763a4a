"""grid_sampler_3d for ONNX Runtime: the generic `aten.grid_sampler`, which torchlib translates
to ONNX's GridSample (N-D since opset 20; ONNX Runtime 1.31 runs 5-D inputs), where torchlib has
no entry for the 3-D-specific op (OpInfo: grid_sampler_3d ran in PyTorch while
nn.functional.grid_sample on the same 5-D input ran in ONNX Runtime). Measured against eager:
within 3e-7 for bilinear and nearest, zeros / border / reflection padding, both corner modes.
Bicubic is not defined for 5-D inputs (eager refuses it too).
"""
from __future__ import annotations

import torch

from .conditional import only_when

A = torch.ops.aten


@only_when(lambda x, grid, interpolation_mode, padding_mode, align_corners:
           x.dim() == 5 and interpolation_mode in (0, 1) and x.dtype.is_floating_point)
def grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    return A.grid_sampler.default(x, grid, interpolation_mode, padding_mode, align_corners)


DECOMPOSITIONS = {A.grid_sampler_3d.default: grid_sampler_3d}
