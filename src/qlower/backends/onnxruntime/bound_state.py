"""Module state written by ONNX Runtime itself (KV caches, counters), not by write-backs in
PyTorch.

FunctionalizeState ends the program with one write-back per buffer, `copy_(buffer, value)`,
which runs in PyTorch after the engine returned `value`: per call and per buffer a session
output allocated, converted and copied (SmolLM2-135M's decode step: 90 buffers, 6 MB). Where
`value` is an output of an ONNX Runtime cluster that itself reads the buffer, and nothing else
reads the buffer, the write-back is removed and the session writes the new state directly:

- each such buffer gets a twin of its shape and dtype; a call reads the state from one and
  ONNX Runtime writes the new state into the other (an I/O binding whose output is the twin's
  memory), then the module's buffer attribute is pointed at the one just written (the next
  call reads it: the graph's get_attr finds it). The two swap roles on every call; one binding
  per direction is made once, and only the cluster's other inputs and outputs are bound per call.
- never in place: an input and an output of one run never share memory, so the result does not
  depend on the order in which ONNX Runtime's kernels read and write. Values are those the
  write-back stored, bit for bit (the same session computes them).
- a call the session does not answer (a run that failed, NaN/inf in a checked input: the
  cluster runs in PyTorch) writes the new state into the current buffer in place, as the
  write-back did.

A buffer replaced from outside (an attribute set to another tensor, not written in place) is
noticed at the next call (the graph passes the current tensor) and bound anew.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from ..clusters import as_numpy

# dtypes an I/O binding takes as a buffer of its element type (numpy has them all)
_BINDABLE = frozenset({torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int16,
                       torch.int32, torch.int64, torch.bool})


@dataclass(frozen=True)
class StateSlot:
    """One buffer the session writes: the cluster's runtime input `position` reads it, session
    output `output` is its new value; `owner`'s `name` holds it, in `owner._buffers` or, for a
    tensor constant of the exported program (a float program's cache: torch.export lifts a
    tensor attribute that is not a registered buffer as a constant), as a plain attribute."""
    position: int
    output: int
    owner: torch.nn.Module
    name: str

    def get(self) -> torch.Tensor:
        return self.owner._buffers[self.name] if self.name in self.owner._buffers else self.owner.__dict__[self.name]

    def set(self, tensor: torch.Tensor) -> None:
        (self.owner._buffers if self.name in self.owner._buffers else self.owner.__dict__)[self.name] = tensor


def bind_state(fused: GraphModule, cluster_type: type) -> list[str]:
    """Move every eligible write-back of `fused` into its cluster (`cluster_type` instances
    with a session); returns the names of the write-back nodes removed. Eligible: `copy_(b, v)`
    into a buffer b, read by nobody, where v is output i of a cluster call that takes b's
    get_attr as a runtime input, v has no other reader, no node but that call and the write-back
    reads b (so nothing can tell when b changes), and v's shape and dtype are b's (static)."""
    readers: dict[str, set[Node]] = {}
    for node in fused.graph.nodes:
        if node.op == "get_attr":
            readers.setdefault(str(node.target), set()).update(node.users)
    slots: dict[Node, list[StateSlot]] = {}
    removed: list[Node] = []
    for node in list(fused.graph.nodes):
        slot = _slot(fused, node, cluster_type, readers)
        if slot is not None:
            call = node.args[1].args[0]
            slots.setdefault(call, []).append(slot)
            removed.append(node)
    for call, found in slots.items():
        getattr(fused, str(call.target)).bind_state(found)
    names = [n.name for n in removed]
    for node in removed:
        value = node.args[1]
        fused.graph.erase_node(node)
        if not value.users:
            fused.graph.erase_node(value)
    return names


def _slot(fused: GraphModule, node: Node, cluster_type: type, readers: dict[str, set[Node]]) -> StateSlot | None:
    # FunctionalizeState's write-backs, or torch.export's own in a loaded program (the same
    # final copy_, without the flag): what makes one safe to move is checked below
    if not (node.op == "call_function" and node.target is torch.ops.aten.copy_.default and not node.users):
        return None
    buffer, value = node.args[0], node.args[1]
    if getattr(buffer, "op", None) != "get_attr" or not isinstance(value, Node) \
            or value.target is not operator.getitem or len(value.users) != 1:
        return None
    call, index = value.args
    if not (isinstance(call, Node) and call.op == "call_module"):
        return None
    cluster = getattr(fused, str(call.target))
    if not isinstance(cluster, cluster_type) or not cluster.can_bind_state():
        return None
    target = str(buffer.target)
    positions = [j for j, a in enumerate(call.args) if getattr(a, "op", None) == "get_attr" and a.target == target]
    if len(positions) != 1 or readers.get(target, set()) - {call, node}:
        return None
    *path, name = target.split(".")
    owner = fused.get_submodule(".".join(path))
    tensor = owner._buffers.get(name, owner.__dict__.get(name))
    val = value.meta.get("val")
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in _BINDABLE or not tensor.is_contiguous() \
            or not isinstance(val, torch.Tensor) or val.dtype != tensor.dtype \
            or tuple(val.shape) != tuple(tensor.shape):
        return None
    return StateSlot(positions[0], index, owner, name)


class BoundState:
    """The state of one cluster's session, held in two sets of tensors that swap roles every
    call (module docstring); `run` binds the other inputs and outputs and runs the session."""

    def __init__(self, session, input_names: list[str], output_names: list[str], slots: list[StateSlot]):
        from onnxruntime.capi import _pybind_state as C
        self._C = C
        self._device = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
        self.session, self.slots = session, slots
        self.input_names, self.output_names = input_names, output_names
        positions = {s.position for s in slots}
        self.free_inputs = [(j, n) for j, n in enumerate(input_names) if j not in positions]
        written = {s.output: k for k, s in enumerate(slots)}
        self.written = written                  # session output -> slot
        self.free_outputs = [n for i, n in enumerate(output_names) if i not in written]
        self._adopt([s.get() for s in slots])

    def _adopt(self, current: list[torch.Tensor]) -> None:
        """Bind the state anew: `current` read first, twins written."""
        self.sets = [list(current), [torch.empty_like(t) for t in current]]
        self.arrays = [[t.detach().numpy() for t in tensors] for tensors in self.sets]
        self.bindings = [self._binding(p) for p in (0, 1)]
        self.parity = 0

    def _binding(self, parity: int):
        binding = self._C.SessionIOBinding(self.session)
        reads, writes = self.arrays[parity], self.arrays[1 - parity]
        for slot, array in zip(self.slots, reads):
            binding.bind_input(self.input_names[slot.position], array)
        for i, name in enumerate(self.output_names):   # in the session's order: get_outputs follows it
            k = self.written.get(i)
            if k is None:
                binding.bind_output(name, self._device)
            else:
                array = writes[k]
                binding.bind_output(name, self._device, array.dtype, list(array.shape), array.ctypes.data)
        return binding

    def run(self, args) -> list:
        """The session's outputs for this call (state outputs as the tensors just written, the
        others as numpy arrays); the module still reads the old state until `commit`."""
        reads = self.sets[self.parity]
        if any(args[s.position] is not t for s, t in zip(self.slots, reads)):
            self._adopt([args[s.position] for s in self.slots])
        binding = self.bindings[self.parity]
        held = []   # the binding reads these arrays' memory: alive until the run returns
        for j, name in self.free_inputs:
            array = as_numpy(args[j])
            binding.bind_input(name, array)
            held.append(array)
        for name in self.free_outputs:   # a fresh output per call: a returned array is never overwritten
            binding.bind_output(name, self._device)
        self.session.run_with_iobinding(binding, None)
        outs = binding.get_outputs()
        writes = self.sets[1 - self.parity]
        return [writes[self.written[i]] if i in self.written else outs[i].numpy() for i in range(len(outs))]

    def commit(self) -> None:
        """The module's buffers become the state the last `run` wrote."""
        self.parity = 1 - self.parity
        for slot, tensor in zip(self.slots, self.sets[self.parity]):
            slot.set(tensor)

    def write_in_place(self, args, result) -> None:
        """A call answered in PyTorch: its new state into the current buffers (the write-back's
        semantics)."""
        with torch.no_grad():
            for slot in self.slots:
                args[slot.position].copy_(result[slot.output])
