"""IREE device targets other than this CPU: options, cross-compiled export, the GPU input
uploads (run here on the CPU driver), and the `qlower device-check` bundle run by its own
torch-free script. The GPU run itself needs a GPU (docs/iree.md, "GPU targets")."""
import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

pytest.importorskip("iree.compiler", reason="the iree extra is not installed (pip install 'qlower[iree]')")
pytest.importorskip("iree.runtime", reason="the iree extra is not installed (pip install 'qlower[iree]')")

import qlower  # noqa: E402
from qlower.backends.iree import IreeOptions  # noqa: E402
from qlower.backends.iree.export import whole_model_cluster  # noqa: E402
from qlower.backends.iree.vm import IreeFunction, load_function  # noqa: E402
from qlower.errors import BackendError  # noqa: E402
from qlower.zoo import ZOO  # noqa: E402


def test_target_options_parse_and_derive_flags_and_driver():
    assert IreeOptions().runtime_driver() == "local-sync"   # measured faster on small models (docs/iree.md)
    cuda = IreeOptions.for_target("cuda:sm_80")
    assert (cuda.target_backend, cuda.target_gpu, cuda.runtime_driver()) == ("cuda", "sm_80", "cuda")
    assert "--iree-cuda-target=sm_80" in cuda.compile_flags()
    assert not any("llvmcpu" in f for f in cuda.compile_flags())
    assert IreeOptions.for_target("rocm:gfx942").runtime_driver() == "hip"
    assert "--iree-vulkan-target=ampere" in IreeOptions.for_target("vulkan-spirv:ampere").compile_flags()
    assert IreeOptions.for_target("cuda").compile_flags()[:1] == ["--iree-opt-data-tiling"]   # IREE's default arch
    znver4 = IreeOptions.for_target("llvm-cpu:znver4")
    assert "--iree-llvmcpu-target-cpu=znver4" in znver4.compile_flags() and znver4.runtime_driver() == "local-sync"
    assert IreeOptions.for_target("cuda", driver="cuda").runtime_driver() == "cuda"
    with pytest.raises(BackendError, match="unknown IREE target backend 'metal'"):
        IreeOptions.for_target("metal")
    with pytest.raises(BackendError, match="needs a GPU target_backend"):
        IreeOptions(target_gpu="sm_80")


def test_microkernels_resolved_per_cluster_by_its_op_mix():
    """"auto": all microkernels where convs outnumber linears/matmuls (zoo CNN 0.87x the time on
    the Intel Xeon), IREE's default elsewhere (transformers 1.07-1.36x slower with them)."""
    cnn_ops = {"qlower::conv2d": 9, "qlower::linear": 1}
    vit_ops = {"aten::conv2d": 1, "aten::linear": 9, "aten::matmul": 4}
    assert "--iree-llvmcpu-enable-ukernels=all" in IreeOptions().resolved_for(cnn_ops).compile_flags()
    assert not any("ukernels" in f for f in IreeOptions().resolved_for(vit_ops).compile_flags())
    assert not any("ukernels" in f for f in IreeOptions().compile_flags())   # unresolved: no flag
    assert not any("ukernels" in f for f in IreeOptions.for_target("cuda:sm_80").resolved_for(cnn_ops).compile_flags())
    pinned = IreeOptions(ukernels="none")
    assert (pinned.resolved_for(cnn_ops).ukernels == "none"
            and "--iree-llvmcpu-enable-ukernels=none" in pinned.compile_flags())
    with pytest.raises(BackendError, match="unknown ukernels setting"):
        IreeOptions(ukernels="fast")


def test_data_tiling_path_resolved_per_cluster_by_its_op_mix():
    """"auto": IREE's dispatch-creation data tiling (`--iree-opt-data-tiling`) where convs
    outnumber linears/matmuls (int8 mobilenet 0.59 vs 0.89 ms) and on GPUs, the
    global-optimization path elsewhere (int8 transformer 0.32 vs 0.40 ms; it compiles masked
    mean pooling over a dynamic sequence and the batched products the other path miscompiles).
    An explicit path is kept; no data tiling, no flag."""
    cnn_ops = {"qlower::conv2d": 9, "qlower::linear": 1}
    vit_ops = {"aten::conv2d": 1, "aten::linear": 9, "aten::matmul": 4}
    assert "--iree-opt-data-tiling" in IreeOptions().resolved_for(cnn_ops).compile_flags()
    assert "--iree-global-opt-data-tiling" in IreeOptions().resolved_for(vit_ops).compile_flags()
    assert "--iree-opt-data-tiling" in IreeOptions.for_target("cuda:sm_80").resolved_for(vit_ops).compile_flags()
    assert "--iree-opt-data-tiling" in IreeOptions(data_tiling_path="dispatch").resolved_for(vit_ops).compile_flags()
    assert ("--iree-global-opt-data-tiling"
            in IreeOptions(data_tiling_path="global").resolved_for(cnn_ops).compile_flags())
    assert not any("data-tiling" in f for f in IreeOptions(data_tiling=False).resolved_for(vit_ops).compile_flags())
    with pytest.raises(BackendError, match="unknown data_tiling_path"):
        IreeOptions(data_tiling_path="late")


@pytest.fixture(scope="module")
def int8_cnn():
    entry = ZOO["cnn"]
    kw = dict(quantize="int8", calibration=entry.calibration(2), profile="fixed")
    return qlower.compile(entry.model(), entry.inputs(1), backend="iree", **kw)


@pytest.mark.slow
def test_the_compiled_cnn_uses_microkernels(int8_cnn):
    assert "--iree-llvmcpu-enable-ukernels=all" in whole_model_cluster(int8_cnn).command


@pytest.mark.slow
def test_export_cross_compiles_for_a_gpu_target(int8_cnn, tmp_path):
    """The module qlower runs here, compiled for CUDA: a CUDA executable in the .vmfb, and the
    .mlir header names the command and the device that run it. No GPU is needed to compile."""
    vmfb = qlower.export(int8_cnn, tmp_path / "cnn.vmfb", format="vmfb", target="cuda:sm_80")
    data = vmfb.read_bytes()
    assert b"cuda-nvptx-fb" in data and data != whole_model_cluster(int8_cnn).vmfb
    text = qlower.export(int8_cnn, tmp_path / "cnn.mlir", format="mlir", target="cuda:sm_80").read_text()
    assert "--iree-hal-target-backends=cuda --iree-cuda-target=sm_80" in text and "--device=cuda" in text
    here = qlower.export(int8_cnn, tmp_path / "here.mlir", format="mlir").read_text()
    assert "--iree-llvmcpu-target-cpu=host" in here and "--device=local-sync" in here


@pytest.mark.slow
def test_export_to_an_unknown_architecture_or_a_non_iree_format_is_a_typed_error(int8_cnn, tmp_path):
    # IREE 3.13's CUDA table stops at sm_89: sm_90 is refused by iree-compile, not a raw error
    with pytest.raises(BackendError, match="cannot compile the model for 'cuda:sm_90'"):
        qlower.export(int8_cnn, tmp_path / "x.vmfb", format="vmfb", target="cuda:sm_90")
    with pytest.raises(qlower.QlowerError, match="applies to the IREE formats"):
        qlower.export(int8_cnn, tmp_path / "x.onnx", format="onnx", target="cuda:sm_80")
    with pytest.raises(qlower.QlowerError, match="applies to the IREE formats"):
        qlower.export(int8_cnn, tmp_path / "x.pt2", format="pt2", target="cuda:sm_80")
    assert not list(tmp_path.iterdir())


def test_compiling_for_a_driver_without_a_device_is_a_typed_error_with_the_export_hint():
    import iree.runtime as rt
    try:
        rt.Config("cuda")
        pytest.skip("this machine has a CUDA device")
    except Exception:  # noqa: BLE001
        pass
    model = torch.nn.Linear(4, 4).eval()
    with pytest.raises(BackendError, match="driver 'cuda' has no device") as info:
        qlower.compile(model, (torch.randn(2, 4),), backend="iree",
                       backend_options=IreeOptions.for_target("cuda:sm_80"))
    assert "--iree-target cuda:sm_80" in str(info.value)


@pytest.fixture(scope="module")
def cnn_module(int8_cnn):
    return whole_model_cluster(int8_cnn).vmfb


@pytest.mark.parametrize("upload", ["pinned", "pinned-copy", "auto"])
def test_gpu_upload_paths_give_the_copy_path_s_bits_also_from_threads(cnn_module, upload):
    """The pinned uploads (the GPU default, measured on an H200) run here on the CPU driver:
    same outputs as the plain copy, with buffers reused across calls and kept per thread."""
    plain = load_function(cnn_module, "local-sync")
    pinned = load_function(cnn_module, "local-sync", upload=upload)
    assert plain.upload == "copy" and pinned.upload == upload
    xs = [ZOO["cnn"].inputs(1, seed=s)[0].numpy() for s in range(4)]
    wants = [plain(x)[0] for x in xs]
    for x, want in zip(xs, wants):   # reused buffers: each call sees its own input
        np.testing.assert_array_equal(pinned(x)[0], want)
    errors = []

    def worker(i):
        for _ in range(20):
            got = pinned(xs[i])[0]
            if not np.array_equal(got, wants[i]):
                errors.append(i)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # a dynamic model at many sizes: the staged buffers per thread stay bounded
    from qlower.backends.iree import vm
    if upload != "auto":   # "auto" copies inputs this small
        fn = load_function(cnn_module, "local-sync", upload=upload)
        for position in range(vm.STAGED_SHAPES + 5):   # a new staging key each time
            fn._argument(position, xs[0])
        assert len(fn._staging.buffers) == vm.STAGED_SHAPES
    with pytest.raises(ValueError, match="unknown upload"):
        IreeFunction(pinned._context, pinned._function, pinned._device, True, "mmap")


@pytest.mark.slow
def test_device_check_bundle_runs_with_its_own_script_and_catches_a_wrong_module(tmp_path):
    """The bundle for this CPU (a GPU bundle differs only in its target): its run.py checks and
    times every module with numpy + iree.runtime and no torch, and fails on a wrong answer."""
    from qlower.bench.device_check import prepare
    bundle = tmp_path / "bundle"
    manifest = prepare(bundle, "llvm-cpu", models=["cnn"], batch=2, modes=("int8-fixed", "fp32"),
                       progress=lambda m: None)
    names = [e["name"] for e in manifest["entries"]]
    assert names[:3] == ["cnn-int8-fixed", "cnn-int8-fixed-nodt", "cnn-fp32"] and manifest["driver"] == "local-sync"
    assert sum(n.startswith("numerics-requantize-") for n in names) == 6   # both profiles x 3 outputs
    assert sum(n.startswith("numerics-quantize-") for n in names) == 3
    # batch and sequence dynamic, one module per model checked at 4 sizes; the transformer's
    # batched matmuls with data tiling on the CPU (its global-optimization path, exact: what the
    # backend compiles; a GPU bundle has them only without data tiling) and without
    assert sum(n.startswith("dynamic-linears-") for n in names) == 8
    assert sorted(n for n in names if n.startswith("dynamic-transformer-")) == sorted(
        f"dynamic-transformer-{size}{tag}" for size in ("b2s16", "b1s2", "b3s20", "b2s33") for tag in ("", "-nodt"))
    script = ("import runpy, sys; sys.argv = ['run.py', sys.argv[1], '--runs', '3']\n"
              "try:\n    runpy.run_path(sys.argv[1] + '/run.py', run_name='__main__')\n"
              "finally:\n    print('TORCH-IMPORTED' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", script, str(bundle)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.strip().endswith("NO-TORCH")
    rows = {row["name"]: row for row in json.loads(r.stdout)["results"]}
    assert rows["cnn-int8-fixed"]["ok"] and rows["cnn-int8-fixed"]["differing_bytes"] == 0
    assert rows["cnn-fp32"]["ok"] and rows["cnn-fp32"]["max_abs_err"] <= rows["cnn-fp32"]["atol"]
    assert all(row["equal_to_cpu_module"] and row["device_ms"] > 0 for row in rows.values())
    numerics = [row for name, row in rows.items() if name.startswith(("numerics-", "dynamic-linears-"))]
    assert numerics and all(row["ok"] and row["differing_bytes"] == 0 for row in numerics)
    assert all(row["ok"] for name, row in rows.items() if name.startswith("dynamic-transformer-"))
    # a module that answers wrongly: the expected int8 outputs shifted by one ulp somewhere
    expected = bundle / "cnn-int8-fixed.out0.npy"
    want = np.load(expected)
    want.view(np.int32).reshape(-1)[0] += 1
    np.save(expected, want)
    r = subprocess.run([sys.executable, str(bundle / "run.py"), str(bundle), "--runs", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    rows = {row["name"]: row for row in json.loads(r.stdout)["results"]}
    assert not rows["cnn-int8-fixed"]["ok"] and rows["cnn-int8-fixed"]["differing_bytes"] == 1


def test_cli_device_check_and_export_target(tmp_path):
    from typer.testing import CliRunner
    from qlower.cli import app
    result = CliRunner().invoke(app, ["device-check", str(tmp_path / "b"), "--iree-target", "metal"])
    assert result.exit_code != 0 and "unknown IREE target backend 'metal'" in result.output
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    path = qlower.save_pt2(torch.export.export(model, (x,)), tmp_path / "m.pt2")
    out = tmp_path / "m.vmfb"
    result = CliRunner().invoke(app, ["export", str(path), str(out), "--format", "vmfb", "--iree-target", "cuda:sm_80"])
    assert result.exit_code == 0, result.output
    assert b"cuda-nvptx-fb" in out.read_bytes()


@pytest.mark.slow
def test_export_for_another_target_keeps_the_data_tiling_hazard_rule(tmp_path):
    """A cluster IREE 3.13's data tiling miscompiles (a batched float matmul with a dynamic
    batch) is exported for another target without data tiling, as the backend compiles it."""
    class ProductWithInput(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8, bias=False)

        def forward(self, x):
            return self.lin(x) @ x.transpose(-1, -2)
    torch.manual_seed(0)
    cm = qlower.compile(ProductWithInput().eval(), (torch.randn(2, 4, 8),), backend="iree",
                        dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},))
    assert "--iree-opt-data-tiling" not in whole_model_cluster(cm).command
    text = qlower.export(cm, tmp_path / "m.mlir", format="mlir", target="llvm-cpu:znver4").read_text()
    compile_line = next(ln for ln in text.splitlines() if ln.startswith("// compile:"))
    assert "--iree-llvmcpu-target-cpu=znver4" in compile_line and "--iree-opt-data-tiling" not in compile_line
