"""House rules that keep the layers apart: backends/ never imports Qt or the GUI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

BACKENDS = Path(__file__).resolve().parent.parent / "backends"
FORBIDDEN = ("PySide6", "PyQt5", "PyQt6", "shiboken6", "gui")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_backends_source_never_imports_qt() -> None:
    offenders = {
        path.name: sorted(imported_modules(path) & set(FORBIDDEN)) for path in BACKENDS.glob("*.py")
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_importing_every_backend_module_loads_no_qt() -> None:
    modules = [f"backends.{p.stem}" for p in BACKENDS.glob("*.py") if p.stem != "__init__"]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'gui')]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_python_file_has_a_module_docstring() -> None:
    root = BACKENDS.parent
    missing = [
        str(path.relative_to(root))
        for folder in ("backends", "gui", "tests", "benchmarks")
        for path in (root / folder).glob("*.py")
        if path.stat().st_size and ast.get_docstring(ast.parse(path.read_text())) is None
    ]
    assert missing == []
