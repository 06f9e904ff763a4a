import re

import pytest
import torch
from typer.testing import CliRunner

import qlower
from qlower.cli import app

runner = CliRunner()


def test_demo_prints_table_for_a_model():
    result = runner.invoke(app, ["demo", "--models", "cnn", "--runs", "1"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "cnn" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    # backend "auto" keeps the fastest correct engine, measured: which one wins depends on the
    # machine and its load (iree won once on a loaded CI run), so any engine, one cluster, no fallback
    assert cells[1] in ("onnxruntime", "openvino", "iree") and cells[2:5] == ["1", "0", "10/10"], cells
    sqnr = float(re.findall(r"│\s+([\d.]+)\s+│\s+0\.99", row)[0])
    assert sqnr > 25


def test_demo_unknown_model_is_a_clean_error():
    result = runner.invoke(app, ["demo", "--models", "resnet1000"])
    assert result.exit_code == 2
    assert "unknown zoo model" in result.output and "Traceback" not in result.output


def test_schema_and_inspect(tmp_path, small_net):
    x = torch.randn(1, 3, 8, 8)
    path = qlower.save_pt2(qlower.capture(small_net, (x,)), tmp_path / "m.pt2")
    result = runner.invoke(app, ["schema", str(path)])
    assert result.exit_code == 0
    assert "aten::conv2d(Tensor input, Tensor weight" in result.output
    cm = qlower.compile(small_net, (x,), quantize="int8", calibration=[(x,)], backend="reference")
    art = cm.save(tmp_path / "cm.pt2")
    result = runner.invoke(app, ["inspect", str(art)])
    assert result.exit_code == 0 and "qlower.conv2d" in result.output and "backend: reference" in result.output


@pytest.mark.slow
def test_outputs_into_a_missing_folder(tmp_path):
    """`qlower verify --out` creates its report folder (like `qlower bench --out`); an export
    into a missing folder is a typed ArtifactError naming the path, never a raw
    FileNotFoundError, for every format."""
    import qlower
    from qlower.errors import ArtifactError
    from qlower.zoo import ZOO
    out = tmp_path / "new" / "reports" / "cnn.html"
    result = CliRunner().invoke(app, ["verify", "cnn", "--out", str(out), "--json", str(tmp_path / "j" / "r.json"),
                                      "--inputs", "1", "--calibration", "1", "--suggest", "1"])
    assert result.exit_code == 0, result.output
    assert out.exists() and (tmp_path / "j" / "r.json").exists()
    entry = ZOO["cnn"]
    cm = qlower.compile(entry.model(), entry.inputs(1), backend="onnxruntime")
    for fmt in ("onnx", "pt2"):
        target = tmp_path / "missing" / f"m.{fmt}"
        with pytest.raises(ArtifactError, match="cannot write"):
            qlower.export(cm, target, format=fmt)
        assert not target.parent.exists()


def test_python_dash_m_runs_the_command(monkeypatch, capsys):
    """`python -m qlower` is the `qlower` command (src/qlower/__main__.py)."""
    import runpy
    monkeypatch.setattr("sys.argv", ["qlower", "--help"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("qlower", run_name="__main__", alter_sys=True)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "quantization-aware compiler" in out and "demo" in out and "export" in out


@pytest.mark.slow
def test_wheel_installs_and_its_console_script_runs(tmp_path):
    """`pip install .` from a built wheel (not editable): the wheel holds every file of the
    package (Python modules and package data), installs into a fresh venv (its dependencies taken
    from this environment) and both `qlower --help` and `python -m qlower --help` run from the
    installed copy, not the source tree."""
    import os
    import pathlib
    import site
    import subprocess
    import sys
    import sysconfig
    import zipfile
    root = pathlib.Path(__file__).resolve().parents[1]
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "src/qlower"], cwd=root, check=True,
                             capture_output=True, text=True).stdout.split()
    src = tmp_path / "src-copy"     # built from a copy: the build writes egg-info and build/ next to the sources
    for rel in tracked + ["pyproject.toml", "README.md"]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes((root / rel).read_bytes())
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(wheels), str(src)], check=True, capture_output=True, text=True)
    (wheel,) = wheels.glob("qlower-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package_files = {rel.removeprefix("src/") for rel in tracked if "__pycache__" not in rel}
    assert package_files and package_files <= names, sorted(package_files - names)[:10]
    assert any(n.endswith("entry_points.txt") and "dist-info" in n for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = pathlib.Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                          check=True, capture_output=True, text=True).stdout.strip())
    # this environment's packages (torch, pip, ...) after the venv's own: its editable qlower
    # (a .pth of that folder) is not processed, so `import qlower` finds only the installed wheel
    here = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    (purelib / "zz_host_packages.pth").write_text("\n".join(dict.fromkeys(here)) + "\n")
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   capture_output=True, text=True, env=env)
    where = subprocess.run([python, "-c", "import qlower; print(qlower.__file__)"], check=True,
                           capture_output=True, text=True, env=env, cwd=tmp_path).stdout.strip()
    assert pathlib.Path(where).is_relative_to(purelib), where
    for command in ([str(venv / "bin" / "qlower"), "--help"], [python, "-m", "qlower", "--help"]):
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "quantization-aware compiler" in result.stdout and "demo" in result.stdout


class _Attention(torch.nn.Module):
    """An attention block: quantizing it decomposes SDPA through torch.export's
    run_decompositions, where torch deep-copies pytree specs (a LeafSpec FutureWarning each)."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(x).view(1, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(a.transpose(1, 2).reshape(1, 8, 16))


def test_compile_save_and_load_emit_no_third_party_warnings(tmp_path, capfd):
    """What torch and its ecosystem warn from inside their own code during qlower's calls
    (core/quiet.py) stays off the user's terminal: a plain int8 compile, save and load emit no
    warning and no log record at WARNING or above, and print nothing (stderr is not a terminal
    here: no progress line); the user's own warnings filters are restored."""
    import logging
    import warnings
    torch.manual_seed(0)
    model = _Attention().eval()
    x = torch.randn(1, 8, 16)
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger().addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            filters = list(warnings.filters)
            cm = qlower.compile(model, (x,), quantize="int8", calibration=[(torch.randn(1, 8, 16),)],
                                backend="reference")
            path = cm.save(tmp_path / "m.pt2")
            loaded = qlower.load(path)
            assert warnings.filters == filters
    finally:
        logging.getLogger().removeHandler(handler)
    assert [str(w.message)[:120] for w in caught] == []
    assert [r.getMessage()[:120] for r in records] == []
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert cm.report().rewrites and torch.equal(loaded(x), cm(x))


def test_quiet_filters_only_the_named_messages():
    """Another warning of the same category, or another record of the same logger, passes."""
    import logging
    import warnings
    from qlower.core.quiet import third_party_quiet
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("torch.utils._pytree")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with third_party_quiet():
                warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
                warnings.warn("something else is deprecated", FutureWarning)
                logger.warning("<enum 'X'> is an Enum subclass and is now natively supported by torch.compile")
                logger.warning("another pytree message")
    finally:
        logger.removeHandler(handler)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]
    assert [r.getMessage() for r in records] == ["another pytree message"]


def test_demo_times_eager_and_qlower_on_the_stated_threads():
    """`qlower demo --threads 1`: eager PyTorch and the engine on one thread, stated in the title;
    torch's own count is restored afterwards."""
    before = torch.get_num_threads()
    result = runner.invoke(app, ["demo", "--models", "cnn", "--runs", "3", "--threads", "1",
                                 "--backend", "onnxruntime"])
    assert result.exit_code == 0, result.output
    assert "1 thread for both" in result.output
    assert torch.get_num_threads() == before


def test_paired_timing_flags_a_noisy_baseline():
    """A baseline whose calls vary (a busy machine) is noisy; its speed-up is flagged."""
    import itertools
    import time
    from qlower.timing import noisy, paired_latency_ms
    delays = itertools.cycle([0.0, 0.02])
    times = paired_latency_ms({"eager": lambda: time.sleep(next(delays)), "qlower": lambda: None}, warmup=0, runs=8)
    (eager, eager_iqr), (ours, ours_iqr) = times["eager"], times["qlower"]
    assert noisy(eager, eager_iqr) and eager_iqr > 10 and ours_iqr < 5 and ours < 5
    assert not noisy(1.0, 0.1)


def test_missing_engine_hints_name_the_published_extras(monkeypatch):
    """A backend that is not installed points at `pip install 'qlower[<extra>]'`, the published
    extras of pyproject.toml, never at an editable source install."""
    import tomllib
    from pathlib import Path
    from qlower.backends import registry
    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for name in ("iree", "openvino"):
        backend = registry.make_backend(name)
        monkeypatch.setattr(type(backend), "available", lambda self: False)
        with pytest.raises(qlower.BackendError) as info:
            registry.get_backend(name)
        assert f"pip install 'qlower[{name}]'" in info.value.hint and name in extras
        assert "-e ." not in info.value.hint
