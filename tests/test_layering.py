"""The architecture holds: layers only point down (import-linter contract in pyproject.toml), no
import cycles anywhere in the package, optional engines imported only when used, every QLOWER_*
variable read in one place, and ruff clean."""
import ast
import pathlib
import subprocess
import sys

import grimp
from importlinter.cli import lint_imports

from qlower.core.settings import VARIABLES

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "qlower"


def test_layers_only_point_down(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_cycles():
    graph = grimp.build_graph("qlower", cache_dir=None, exclude_type_checking_imports=False)
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_optional_engines_are_imported_only_when_used():
    code = ("import sys, torch, qlower\n"
            "m = torch.nn.Linear(4, 3).eval()\n"
            "cm = qlower.compile(m, (torch.randn(2, 4),), backend='onnxruntime')\n"
            "assert torch.equal(cm(torch.ones(2, 4)), m(torch.ones(2, 4)))\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('openvino', 'iree')"
            " or n.startswith(('qlower.backends.openvino', 'qlower.backends.iree'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"QLOWER_CACHE_DIR": "off", "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]", out.stdout


def test_settings_are_read_in_one_place():
    """os.environ / os.getenv appear in core/settings.py alone, and every QLOWER_* name the
    package mentions is a documented setting (or a constant that is not an environment variable)."""
    readers, names = [], set()
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                    and node.attr in ("environ", "getenv", "putenv"):
                readers.append(str(path.relative_to(SRC)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("QLOWER_"):
                names.add(node.value)
    assert sorted(set(readers)) == ["core/settings.py"]
    assert names <= set(VARIABLES), names - set(VARIABLES)


def test_ruff_clean():
    """ruff is part of the dev extra the test run is installed with."""
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-4000:]
