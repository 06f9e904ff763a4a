"""Calling a compiled IREE module through iree.runtime's VM: numpy arrays in, numpy arrays out.

No torch here: a host that has only numpy and iree-base-runtime runs qlower's exported `.vmfb`
with this file alone — `qlower device-check` copies it into its bundle for a GPU machine without
qlower's dependencies; there, outside the package, its errors are RuntimeErrors."""
from __future__ import annotations

import threading

import numpy as np

try:
    from ...errors import BackendError
except ImportError:   # a copy outside the package (a device-check bundle)
    BackendError = RuntimeError

# iree-runtime flags a driver needs, set before its device is created. CUDA's stream-ordered
# ("async") allocations failed the zoo transformer int8 with batch and sequence dynamic on an
# H200 at 3 of 4 sizes ("memory_pools.c:303: CUDA_ERROR_INVALID_VALUE ... hal.device.queue.
# dealloca"); with them off all four ran and matched (iree-base-runtime 3.13, driver 580).
_DRIVER_FLAGS = {"cuda": ("--cuda_async_allocations=false",)}
_CONFIGS: dict[str, object] = {}      # driver -> iree.runtime.Config (one device per driver)


def runtime_config(driver: str):
    """The one iree.runtime.Config (instance + device) per driver in this process."""
    import iree.runtime as rt
    if driver not in _CONFIGS:
        if driver in _DRIVER_FLAGS:
            rt.flags.parse_flags(*_DRIVER_FLAGS[driver])
        try:
            _CONFIGS[driver] = rt.Config(driver)
        except Exception as exc:  # noqa: BLE001  (iree.runtime raises plain RuntimeError/ValueError)
            raise BackendError(f"IREE runtime driver {driver!r} has no device on this machine: "
                               f"{str(exc).strip()[:200]}",
                               hint="compile for the host CPU here and export the module for the device: "
                                    "`qlower export --format vmfb --iree-target cuda:sm_80` "
                                    "(docs/iree.md, GPU targets)") from exc
    return _CONFIGS[driver]


def load_function(vmfb: bytes, driver: str, entry: str = "main", upload: str | None = None) -> "IreeFunction":
    """The `main` function of a compiled module, in its own VM context on the shared device."""
    import iree.runtime as rt
    config = runtime_config(driver)
    module = rt.VmModule.copy_buffer(config.vm_instance, vmfb)
    context = rt.SystemContext(vm_modules=[module], config=config)
    return IreeFunction(context, module.lookup_function(entry), config.device, driver.startswith("local-"), upload)


_DLPACK_CPU = 1                   # DLPack's device type code of host memory (kDLCPU)
ZERO_COPY_ALIGNMENT = 64          # IREE imports host memory aligned to this only (buffer_heap.c)
GPU_UPLOAD = "auto"   # how a GPU driver's inputs reach the device (IreeFunction._argument)
INLINE_UPLOAD_BYTES = 64 * 1024   # "auto": at most this, "copy"; above it, "pinned-copy"
STAGED_SHAPES = 16                # pinned uploads: buffers kept per thread, one per input shape


class IreeFunction:
    """A module's function called through IREE's VM directly: numpy arrays in, numpy copies out.

    iree.runtime's FunctionInvoker does the same through ABI-driven packing and DeviceArray
    wrappers; building the argument buffers with `allocate_buffer_copy` (what its packing calls)
    and invoking `VmContext.invoke` saved 44 us per call on the zoo CNN int8 at batch 8 (0.84 ->
    0.80 ms, Intel Xeon, 1 thread, paired over 21 rounds). Results are copied out of the mapped
    result buffers at once: IREE reuses that memory once the buffer views are released."""

    UPLOADS = ("copy", "pinned", "pinned-copy", "auto")

    def __init__(self, context, function, device, host_local: bool = True, upload: str | None = None):
        import json
        import iree.runtime as rt
        from iree.runtime.array_interop import map_dtype_to_element_type
        self._context = context                  # the SystemContext owns the module
        self._vm_context, self._function, self._device = context.vm_context, function, device
        self._allocator = device.allocator
        self._rt = rt
        self._element_type = map_dtype_to_element_type
        abi = json.loads(function.reflection.get("iree.abi", "{}") or "{}")
        self._results = max(1, len(abi.get("r", ())))   # the result list's initial capacity
        self._memory = int(rt.MemoryType.DEVICE_LOCAL)
        self._usage = int(rt.BufferUsage.DEFAULT)
        self._host_local = host_local
        self.upload = upload or ("copy" if host_local else GPU_UPLOAD)
        if self.upload not in self.UPLOADS:
            raise ValueError(f"unknown upload {self.upload!r}: one of {self.UPLOADS}")
        self._staging = threading.local()   # per calling thread: (position, shape, dtype) -> buffers

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        rt = self._rt
        args = rt.VmVariantList(len(arrays))
        for i, a in enumerate(arrays):
            args.push_ref(self._argument(i, a))
        results = rt.VmVariantList(self._results)
        self._vm_context.invoke(self._function, args, results)
        return [self._host_copy(results.get_as_object(i, rt.HalBufferView)) for i in range(len(results))]

    def call_zero_copy(self, *tensors) -> list:
        """On the local (CPU) drivers: inputs given as DLPack producers (torch tensors, dense and
        64-byte aligned, in dtypes the module takes) read by IREE in place, results returned as
        DLPack capsules of IREE's own result buffers (each kept alive by its capsule, so IREE
        does not reuse the memory). No copy either way: on the zoo CNN int8 at batch 8 (Intel
        Xeon, one thread, 5 rounds of 300 calls) 0.540 ms per call against 0.565 for `__call__`
        (numpy in, copies out); `iree-benchmark-module` on the same module 0.531."""
        rt = self._rt
        args = rt.VmVariantList(len(tensors))
        for t in tensors:
            args.push_ref(self._device.from_dlpack_capsule(t.__dlpack__()))
        results = rt.VmVariantList(self._results)
        self._vm_context.invoke(self._function, args, results)
        return [self._device.create_dlpack_capsule(results.get_as_object(i, rt.HalBufferView), _DLPACK_CPU, 0)
                for i in range(len(results))]

    def _argument(self, position: int, a: np.ndarray):
        """One input as a buffer view on the device. "copy": a new device buffer filled from the
        array (IREE's allocate_buffer_copy; 4 us on the CPU drivers). On CUDA it took 1.34 ms for
        the zoo CNN's 96 KiB input on an H200, against 0.04 ms for the transformer's 32 KiB (IREE
        writes updates of up to 64 KiB inline into the command stream; larger ones take a slow path).
        "pinned": the array is copied into a pinned host buffer kept per thread and input, which
        the kernels read over the bus; "pinned-copy": that buffer is then copied into a device
        buffer kept likewise, before the call (H200: zoo CNN int8 2.6 -> 0.8-1.06 ms per call,
        MobileNet 2.3 -> 0.56 ms; on 2-32 KiB inputs it costs 0.05-0.15 ms more than "copy").
        "auto" (the GPU default): "copy" up to INLINE_UPLOAD_BYTES, "pinned-copy" above."""
        element_type = self._element_type(a.dtype)
        upload = self.upload
        if upload == "auto":
            upload = "copy" if a.nbytes <= INLINE_UPLOAD_BYTES else "pinned-copy"
        if upload == "copy":
            return self._allocator.allocate_buffer_copy(memory_type=self._memory, allowed_usage=self._usage,
                                                        device=self._device, buffer=a, element_type=element_type)
        rt = self._rt
        buffers = getattr(self._staging, "buffers", None)
        if buffers is None:
            buffers = self._staging.buffers = {}
        key = (position, a.shape, a.dtype.str)
        if key not in buffers and len(buffers) >= STAGED_SHAPES:   # a dynamic model at many sizes
            del buffers[next(iter(buffers))]                         # oldest first: memory stays bounded
        if key not in buffers:
            pinned = self._allocator.allocate_buffer(
                int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
                int(rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING), max(a.nbytes, 1))
            target = (self._allocator.allocate_buffer(self._memory, self._usage, max(a.nbytes, 1))
                      if upload == "pinned-copy" else pinned)
            buffers[key] = (pinned, pinned.map().asarray(a.shape, a.dtype), target,
                            rt.HalBufferView(target, a.shape, element_type), self._device.create_semaphore(0))
        pinned, host, target, view, semaphore = buffers[key]
        np.copyto(host, a)
        if target is not pinned:
            value = semaphore.query() + 1
            self._device.queue_copy(pinned, target, [], [(semaphore, value)])
            semaphore.wait(value)
        return view

    def _host_copy(self, view) -> np.ndarray:
        """The local (CPU) drivers' buffers are host memory: mapped, then copied. A GPU's are
        device memory: transferred to the host."""
        if not self._host_local:
            return self._rt.DeviceArray(self._device, view, implicit_host_transfer=True).to_host()
        dtype = self._rt.HalElementType.map_to_dtype(view.element_type)
        return np.array(view.map().asarray(view.shape, dtype), copy=True)
