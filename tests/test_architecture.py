"""House rules that keep the layers apart, checked on every module of every sub-package.

backends/ never imports Qt or the GUI; its packages import only downwards in the declared
order of ``BACKEND_LAYERS`` (and the modules of engines/, speculation/ and service/ in
theirs, ``PACKAGE_ORDERS``); no import cycle inside backends/ or inside gui/; a module
docstring in every Python file.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Sequence

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ROOT / "backends"
FORBIDDEN = ("PySide6", "PyQt5", "PyQt6", "shiboken6", "gui")
CHECKED_FOLDERS = ("backends", "gui", "tests", "benchmarks", "packaging")

# The layers of backends/, lowest first, as in an import-linter "layers" contract: a module
# imports only from its own package, from packages of lower layers, or from nothing of
# backends/. Names in one layer are independent: neither imports the other. A name stands for
# the module and everything under it; a module belongs to the longest name that covers it.
BACKEND_LAYERS: tuple[tuple[str, ...], ...] = (
    ("backends.errors", "backends.paths", "backends.version"),  # errors, folders, the version
    ("backends.models.gguf_info",),  # reading a GGUF file's metadata (engines load with it)
    ("backends.models.mlx_info",),  # reading an MLX model folder's
    ("backends.engines",),  # a loaded model behind one engine-neutral interface
    # The speculative loop on any engine; the models on disk: catalog, provisioning,
    # compatibility, which draft suits which main model (it needs the hardware's facts).
    ("backends.speculation", "backends.models"),
    ("backends.service",),  # the pair service and its front ends: engine process, API, CLIs
)
# The modules of backends/engines/, lowest first: the engine-neutral interface knows no
# engine, no engine knows the selection that picks it.
ENGINE_ORDER = (
    "interface",
    "pass_delay",
    "hardware",
    "weight_placement",
    "load_guard",
    "worker_probe",
    "layer_split",
    "rpc",
    "draft_weights",
    "exactness_memory",
    "chat_template",
    "base",
    "llama_native",
    "llama",
    "mlx",
    "rpc_worker",
    "selection",
)
# The modules of backends/speculation/, lowest first: the vocabulary (types), the pure parts
# of a round, the drafters, then the planner that chooses among them, the loop that drives a
# round, and the methods that assemble a decoder.
SPECULATION_ORDER = (
    "grammar",
    "sampling",
    "types",
    "rounds",
    "estimates",
    "earnings",
    "target_rows",
    "text_stream",
    "verification",
    "drafters",
    "ngram",
    "edit_copy",
    "planner",
    "loop",
    "methods",
)
# The modules of backends/service/, lowest first; a name covers a sub-package (api).
SERVICE_ORDER = (
    "context_fit",  # what a conversation that outgrew the context keeps (the protocol's)
    "protocol",
    "generation_options",
    "suite_prompts",
    "tuning_prediction",
    "tuning",
    "tuning_memory",
    "pair_runs",
    "pair_tuning",
    "loaded_pair",  # the pair service, with the load flags its command lines share
    "api",
    "engine_server",
    "hub_drafts",  # drafts to suggest from the hub (models.hub, ranked by speculation's theory)
    # The command lines and their parts: no module above imports them.
    "bench_watch",
    "bench_suite",
    "bench_report",
    "tune_bench",
    "bench",
    "serve_cli",
    "worker_cli",
    "models_cli",
)
PACKAGE_ORDERS = {
    "backends.engines": ENGINE_ORDER,
    "backends.speculation": SPECULATION_ORDER,
    "backends.service": SERVICE_ORDER,
}


def backend_modules(top: str = "backends") -> dict[str, Path]:
    """Every module of a top-level package (backends/ unless told), recursively, by name."""
    modules = {}
    for path in sorted((ROOT / top).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_names(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, at any depth of the file, as dotted names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(top: str = "backends") -> dict[str, set[str]]:
    """Module → the modules of the same package it imports (lazily or not, typing or not)."""
    modules = backend_modules(top)
    return {
        name: {imported for imported in imported_names(path, name) if imported in modules} - {name}
        for name, path in modules.items()
    }


def test_every_sub_package_is_seen() -> None:
    modules = backend_modules()
    for package in ("engines", "speculation", "models", "service"):
        assert f"backends.{package}" in modules
        assert sum(name.startswith(f"backends.{package}.") for name in modules) >= 3
    assert len(modules) > 30


def test_backends_source_never_imports_qt() -> None:
    offenders = {
        name: sorted({n.split(".")[0] for n in imported_names(path, name)} & set(FORBIDDEN))
        for name, path in backend_modules().items()
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_backends_and_the_window_have_no_import_cycle() -> None:
    assert _cycles(import_graph("backends")) == []
    assert _cycles(import_graph("gui")) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def rank_in(package: str, order: Sequence[str], module: str) -> int | None:
    """The index in ``order`` of the name covering ``module`` (None: not of ``package``)."""
    if not module.startswith(package + "."):
        return None
    name = module.removeprefix(package + ".")
    covering = [
        index for index, part in enumerate(order) if name == part or name.startswith(part + ".")
    ]
    return max(covering, key=lambda index: len(order[index]), default=None)


def order_violations(graph: dict[str, set[str]], package: str, order: Sequence[str]) -> list[str]:
    """Each import inside ``package`` that goes up ``order`` (its modules, lowest first)."""
    found = []
    for module, targets in sorted(graph.items()):
        level = rank_in(package, order, module)
        if level is None:
            continue
        for target in sorted(targets):
            target_level = rank_in(package, order, target)
            if target_level is not None and target_level > level:
                found.append(f"{module} imports {target}")
    return found


def test_the_modules_of_each_package_only_import_downwards() -> None:
    graph = import_graph()
    for package, order in PACKAGE_ORDERS.items():
        assert order_violations(graph, package, order) == [], package


def test_the_order_check_sees_an_upward_import() -> None:
    graph = {
        "backends.service.loaded_pair": {
            "backends.service.worker_cli",
            "backends.service.protocol",
        },
        "backends.service.api.worker": {"backends.service.loaded_pair"},
        "backends.service.protocol": {"backends.service.api.jobs"},
    }
    assert order_violations(graph, "backends.service", SERVICE_ORDER) == [
        "backends.service.loaded_pair imports backends.service.worker_cli",
        "backends.service.protocol imports backends.service.api.jobs",
    ]


def layer_of(module: str) -> tuple[int, str]:
    """The index in BACKEND_LAYERS of the layer ``module`` belongs to, and the name covering it."""
    covering = [
        (index, name)
        for index, layer in enumerate(BACKEND_LAYERS)
        for name in layer
        if module == name or module.startswith(name + ".")
    ]
    assert covering, f"{module} belongs to no layer: declare it in BACKEND_LAYERS"
    return max(covering, key=lambda found: len(found[1]))


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import of ``graph`` that goes up BACKEND_LAYERS or across one of its layers."""
    found = []
    for module, targets in sorted(graph.items()):
        if module == "backends":
            continue
        level, name = layer_of(module)
        for target in sorted(targets - {"backends"}):
            target_level, target_name = layer_of(target)
            if target_level > level or (target_level == level and target_name != name):
                found.append(f"{module} imports {target}")
    return found


def test_the_packages_of_backends_only_import_downwards() -> None:
    assert layering_violations(import_graph()) == []


def test_the_layer_check_sees_an_upward_and_a_sideways_import() -> None:
    graph = {
        "backends.engines.selection": {"backends.service.protocol", "backends.errors"},
        "backends.models.catalog": {"backends.speculation.types", "backends.models.gguf_info"},
        "backends.service.bench": {"backends.engines.llama", "backends.models.catalog"},
    }
    assert layering_violations(graph) == [
        "backends.engines.selection imports backends.service.protocol",
        "backends.models.catalog imports backends.speculation.types",
    ]


def test_every_backend_module_belongs_to_a_layer() -> None:
    assert all(layer_of(module) for module in backend_modules() if module != "backends")
    for package, order in PACKAGE_ORDERS.items():
        undeclared = [
            name
            for name in backend_modules()
            if name.startswith(package + ".") and rank_in(package, order, name) is None
        ]
        assert undeclared == [], f"declare every module of {package} in its order"
        assert all(f"{package}.{name}" in backend_modules() for name in order), package


def test_the_engine_interface_imports_no_engine_module() -> None:
    graph = import_graph()
    # The interface is the floor: an engine-neutral layer above it never sees an engine's types.
    assert not {
        name for name in graph["backends.engines.interface"] if name.startswith("backends.engines")
    }


def test_a_test_that_needs_the_default_pair_must_say_so(pytester: pytest.Pytester) -> None:
    # tests/conftest.py refuses the run, so that scripts/test --quick never loads the pair.
    pytester.makeconftest(
        "from tests.conftest import pytest_collection_modifyitems, qwen_main_path, qwen_draft_path"
    )
    pytester.makepyfile(
        test_pair="""
        import pytest

        @pytest.fixture
        def through(qwen_draft_path):
            return qwen_draft_path

        def test_asks(qwen_main_path): ...
        def test_through_a_fixture(through): ...
        @pytest.mark.parametrize("name", ["qwen_main_path", "other"])
        def test_by_name(request, name): ...
        @pytest.mark.default_pair
        def test_marked(qwen_main_path): ...
        def test_without_the_pair(): ...
        """
    )
    refused = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    named = re.findall(r"test_pair\.py::(\S+)", refused.stderr.str())
    assert named == ["test_asks", "test_through_a_fixture", "test_by_name[qwen_main_path]"]


def test_importing_every_backend_module_loads_no_qt() -> None:
    modules = [name for name in backend_modules() if not name.endswith(".mlx")]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'gui')]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_python_file_has_a_module_docstring() -> None:
    missing = [
        str(path.relative_to(ROOT))
        for folder in CHECKED_FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if "build" not in path.relative_to(ROOT).parts
        and path.stat().st_size
        and ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) is None
    ]
    assert missing == []


def test_the_installed_package_holds_every_sub_package() -> None:
    import fnmatch
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("backends", "gui")
        for init in (ROOT / top).rglob("__init__.py")
    }
    left_out = {name for name in on_disk if not any(fnmatch.fnmatch(name, p) for p in include)}
    assert left_out == set()
    assert {"backends.engines", "backends.speculation", "backends.models"} <= on_disk
