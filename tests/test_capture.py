import pytest
import torch

import qlower
from qlower.errors import CaptureError, InputError


class DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot capture it
            return x * 2
        return x - 1


def test_capture_returns_exported_program(small_net):
    ep = qlower.capture(small_net, (torch.randn(1, 3, 8, 8),))
    assert isinstance(ep, torch.export.ExportedProgram)
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.conv2d.default in targets


def test_capture_dynamic_batch(small_net):
    batch = torch.export.Dim("batch", min=1, max=32)
    ep = qlower.capture(small_net, (torch.randn(2, 3, 8, 8),), dynamic_shapes={"x": {0: batch}})
    assert ep.module()(torch.randn(5, 3, 8, 8)).shape == (5, 5)


def test_pt2_save_load_roundtrip(small_net, tmp_path):
    x = torch.randn(1, 3, 8, 8)
    ep = qlower.capture(small_net, (x,))
    path = qlower.save_pt2(ep, tmp_path / "m.pt2")
    assert torch.equal(qlower.load_pt2(path).module()(x), ep.module()(x))


def test_capture_failure_is_typed_and_names_source_line():
    with pytest.raises(CaptureError) as info:
        qlower.capture(DataDependent(), (torch.randn(3),))
    err = info.value
    assert "DataDependent" in err.cause
    assert err.source is not None and "test_capture.py" in err.source
    assert err.hint


def test_non_module_and_bare_tensor_inputs_are_typed_errors(small_net):
    with pytest.raises(CaptureError, match="nn.Module"):
        qlower.capture(lambda x: x, (torch.randn(1),))
    with pytest.raises(InputError, match="tuple"):
        qlower.capture(small_net, torch.randn(1, 3, 8, 8))


def test_load_pt2_missing_file_is_typed(tmp_path):
    with pytest.raises(qlower.ArtifactError):
        qlower.load_pt2(tmp_path / "nope.pt2")


class _KeywordOnly(torch.nn.Module):
    def forward(self, *, x):
        return x + 1


def test_keyword_only_forward_is_a_typed_error_with_an_honest_hint():
    with pytest.raises(CaptureError) as info:
        qlower.compile(_KeywordOnly(), (torch.randn(2),), backend="reference")
    assert "positionally" in str(info.value) and "rewrite the unsupported" not in info.value.hint
    assert "x" in info.value.hint
