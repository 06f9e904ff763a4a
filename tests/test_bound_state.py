"""Module state written by the ONNX Runtime session itself (backends/onnxruntime/bound_state.py):
bit for bit what the PyTorch write-backs stored, call after call, through a buffer replaced from
outside, a fallback to PyTorch, save/load; left to the write-back where something else reads
the value."""
import copy

import pytest
import torch

import qlower
import qlower.backends.onnxruntime as ort_backend
from qlower.backends.onnxruntime import OrtCluster
from qlower.passes.functionalize_state import WRITE_BACK
from qlower.zoo.block_lm import BlockDecoderLM


def _compile(model, bound: bool, monkeypatch):
    with monkeypatch.context() as m:
        if not bound:   # the write-backs as FunctionalizeState made them, run in PyTorch
            m.setattr(ort_backend, "bind_state", lambda fused, cluster_type: [])
        return qlower.compile(copy.deepcopy(model), (torch.tensor([[1]]), torch.tensor(0)), backend="onnxruntime")


def _cluster(cm) -> OrtCluster:
    return next(m for m in cm._executable.module.children() if isinstance(m, OrtCluster))


def _buffers(cm) -> dict[str, torch.Tensor]:
    return dict(cm._executable.module.named_buffers())


def _steps(bound, plain, start: int, steps: int) -> None:
    token = torch.tensor([[3]])
    for step in range(start, start + steps):
        pos = torch.tensor(step)
        got, want = bound(token, pos), plain(token, pos)
        assert torch.equal(got, want), step
        b, p = _buffers(bound), _buffers(plain)
        assert all(torch.equal(b[n], p[n]) for n in p), step
        token = want.argmax(-1)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return BlockDecoderLM().eval()


def test_session_writes_the_state_the_write_backs_wrote(model, monkeypatch):
    bound, plain = _compile(model, True, monkeypatch), _compile(model, False, monkeypatch)
    assert _cluster(bound).bound is not None and _cluster(plain).bound is None
    assert not [n for n in bound._executable.module.graph.nodes if n.meta.get(WRITE_BACK)]
    assert len([n for n in plain._executable.module.graph.nodes if n.meta.get(WRITE_BACK)]) == 4
    states = [c for c in bound.report().clusters if c.status == "state"]
    assert len(states) == 4 and all(c.backend == "onnxruntime" for c in states), str(bound.report())
    before = {n: t for n, t in _buffers(bound).items() if "cache" in n}
    _steps(bound, plain, 0, 5)
    after = _buffers(bound)
    assert any(after[n].abs().sum() > 0 for n in before)   # the steps wrote the caches
    # the module's buffers are the tensors the session last wrote (swapped, never copied)
    assert all(after[n] is t for n, t in zip(before, _cluster(bound).bound.sets[_cluster(bound).bound.parity]))


def test_replaced_buffer_fallback_and_save_load_keep_the_state(model, monkeypatch, tmp_path):
    bound, plain = _compile(model, True, monkeypatch), _compile(model, False, monkeypatch)
    _steps(bound, plain, 0, 2)
    # a buffer replaced from outside (not written in place) is read and written from then on
    for cm in (bound, plain):
        layer = cm._executable.module.get_submodule("layers.0.cache")
        layer._buffers["k"] = layer.k.clone() + 0.5
    _steps(bound, plain, 2, 2)
    loaded = qlower.load(bound.save(tmp_path / "lm.pt2"))
    assert _cluster(loaded).bound is not None
    _steps(loaded, plain, 4, 2)   # continues from the saved state
    # a session that stops answering: PyTorch runs the cluster and writes the state in place
    for cm in (loaded, plain):
        _cluster(cm).session = None
    _steps(loaded, plain, 6, 3)


class Counter(torch.nn.Module):
    """Its new state is also its output: the value has a reader besides the write-back."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x, position):
        self.total.add_(x[0, 0] * 1.0 + position)
        return self.total


def test_state_also_returned_stays_a_pytorch_write_back():
    cm = qlower.compile(Counter().eval(), (torch.ones(1, 3), torch.tensor(0)), backend="onnxruntime")
    states = [c for c in cm.report().clusters if c.status == "state"]
    assert [c.backend for c in states] == ["pytorch"], str(cm.report())
    outs = [cm(torch.full((1, 3), float(i)), torch.tensor(i)).clone() for i in range(1, 4)]
    assert [o[0].item() for o in outs] == [2.0, 6.0, 12.0]


def test_float_transformers_cache_held_as_constants_is_bound_too(monkeypatch):
    """A float transformers model's static cache reaches the program as tensor constants (plain
    attributes, not registered buffers): the session writes them as well, bit for bit."""
    from qlower.zoo import hf
    eager = hf.build("llama-kv")
    steps = hf.decode_steps(3, steps=4)
    compiled = {}
    for bound in (True, False):
        with monkeypatch.context() as m:
            if not bound:
                m.setattr(ort_backend, "bind_state", lambda fused, cluster_type: [])
            compiled[bound] = qlower.compile(copy.deepcopy(eager), steps[0], backend="onnxruntime")
    states = [c for c in compiled[True].report().clusters if c.status == "state"]
    assert states and all(c.backend == "onnxruntime" for c in states), str(compiled[True].report())
    for token, position in steps:
        assert torch.equal(compiled[True](token, position), compiled[False](token, position))
