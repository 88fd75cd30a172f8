"""What SpecDeck copies from llama.cpp, checked against the built library, and the patches.

SpecDeck talks to llama.cpp through ctypes and its log, so it holds copies of enum values
(backends/engines/llama_native.py, weight_placement.py), of log lines' shapes
(llama_native.py) and of the RPC protocol version (worker_probe.py). Each is checked here
against the installed build: its headers (installed with it by
packaging/llama.cpp/build-wheel), its libraries' own strings and name functions, and a
worker it serves. The patches themselves: git format-patch output on one recorded base,
applied by build-wheel with no fuzz and refused in one line when they do not apply
(packaging/llama.cpp/README.md).
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from backends.engines import hardware, llama_native, weight_placement, worker_probe
from tests.llama_headers import define_value, enum_values, header
from tests.workers import Worker

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
PATCHES = ROOT / "packaging" / "llama.cpp"

# (module, copied name, header, enum, the enumerator it copies)
COPIED_ENUM_VALUES: tuple[tuple[ModuleType, str, str, str, str], ...] = (
    (llama_native, "GGML_LOG_DEBUG", "ggml.h", "ggml_log_level", "GGML_LOG_LEVEL_DEBUG"),
    (llama_native, "GGML_LOG_WARN", "ggml.h", "ggml_log_level", "GGML_LOG_LEVEL_WARN"),
    (llama_native, "GGML_LOG_CONT", "ggml.h", "ggml_log_level", "GGML_LOG_LEVEL_CONT"),
    (llama_native, "GGML_TYPE_F16", "ggml.h", "ggml_type", "GGML_TYPE_F16"),
    (llama_native, "GGML_TYPE_Q8_0", "ggml.h", "ggml_type", "GGML_TYPE_Q8_0"),
    (llama_native, "GGML_TYPE_Q4_0", "ggml.h", "ggml_type", "GGML_TYPE_Q4_0"),
    (
        llama_native,
        "FLASH_ATTENTION_ENABLED",
        "llama.h",
        "llama_flash_attn_type",
        "LLAMA_FLASH_ATTN_TYPE_ENABLED",
    ),
    (
        llama_native,
        "LLAMA_SPLIT_MODE_LAYER",
        "llama.h",
        "llama_split_mode",
        "LLAMA_SPLIT_MODE_LAYER",
    ),
    (llama_native, "LLAMA_FTYPE_MOSTLY_Q4_0", "llama.h", "llama_ftype", "LLAMA_FTYPE_MOSTLY_Q4_0"),
    (
        weight_placement,
        "_GGML_DEVICE_TYPE_CPU",
        "ggml-backend.h",
        "ggml_backend_dev_type",
        "GGML_BACKEND_DEVICE_TYPE_CPU",
    ),
)


@pytest.mark.parametrize(
    ("module", "name", "header_name", "enum", "enumerator"),
    COPIED_ENUM_VALUES,
    ids=[entry[1] for entry in COPIED_ENUM_VALUES],
)
def test_each_copied_enum_value_is_the_built_headers(
    module: ModuleType, name: str, header_name: str, enum: str, enumerator: str
) -> None:
    built = enum_values(header(header_name), enum)
    assert getattr(module, name) == built[enumerator], (
        f"{module.__name__}.{name} is {getattr(module, name)}, "
        f"but the built {header_name} has {enumerator} = {built[enumerator]}"
    )


def _name_function(library: ctypes.CDLL, function: str) -> Callable[[int], bytes | None]:
    found = getattr(library, function)
    found.restype = ctypes.c_char_p
    found.argtypes = [ctypes.c_int]
    named: Callable[[int], bytes | None] = found
    return named


def test_the_built_libraries_name_the_copied_values_as_expected() -> None:
    # The libraries' own name functions, for the values they can name.
    import llama_cpp
    from llama_cpp import _ggml

    ggml_type_name = _name_function(_ggml.libggml, "ggml_type_name")
    assert ggml_type_name(llama_native.GGML_TYPE_F16) == b"f16"
    assert ggml_type_name(llama_native.GGML_TYPE_Q8_0) == b"q8_0"
    assert ggml_type_name(llama_native.GGML_TYPE_Q4_0) == b"q4_0"
    libllama = llama_cpp.llama_cpp._lib
    ftype_name = _name_function(libllama, "llama_ftype_name")
    assert ftype_name(llama_native.LLAMA_FTYPE_MOSTLY_Q4_0) == b"Q4_0"
    flash_attention = _name_function(libllama, "llama_flash_attn_type_name")
    assert flash_attention(llama_native.FLASH_ATTENTION_ENABLED) == b"enabled"
    lib = hardware.ggml_device_library()
    assert lib is not None
    hardware.load_ggml_backends()
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    cpu = lib.ggml_backend_dev_by_type(weight_placement._GGML_DEVICE_TYPE_CPU)
    assert cpu
    assert lib.ggml_backend_dev_type(cpu) == weight_placement._GGML_DEVICE_TYPE_CPU
    assert lib.ggml_backend_dev_name(cpu) == b"CPU"


# -- log lines ----------------------------------------------------------------------------------

_CONVERSION = re.compile(
    r"%(?P<flags>[-+ #0]*)(?P<width>\d*)(?P<precision>\.\d+)?"
    r"(?:hh|h|ll|l|z|j|t|L)?(?P<kind>[a-zA-Z%])"
)


def _library_strings(needle: bytes) -> list[str]:
    """The NUL-terminated strings in the installed llama.cpp libraries that contain ``needle``."""
    import llama_cpp

    folder = Path(llama_cpp.__file__).resolve().parent / "lib"
    libraries = {path.resolve() for path in folder.glob("lib*.so*")}
    assert libraries, f"no llama.cpp libraries in {folder}"
    found: set[str] = set()
    for library in sorted(libraries):
        data = library.read_bytes()
        at = data.find(needle)
        while at >= 0:
            start = data.rfind(b"\0", 0, at) + 1
            end = data.find(b"\0", at)
            found.add(data[start:end].decode("utf-8", errors="replace"))
            at = data.find(needle, end)
    return sorted(found)


def _render(text: str) -> tuple[str, list[str]]:
    """A printf format filled in as llama.cpp would: the line, and each argument as printed."""
    arguments: list[str] = []

    def fill(match: re.Match[str]) -> str:
        kind = match["kind"]
        if kind == "%":
            return "%"
        spec = f"%{match['flags']}{match['width']}{match['precision'] or ''}"
        if kind == "s":
            value: object = f"ARG{len(arguments)}"
        elif kind in "diu":
            value, kind = 1000 + len(arguments), "d"
        elif kind in "fFeEgG":
            value = 580.25 + len(arguments)
        else:
            raise AssertionError(f"a conversion %{kind} this test cannot fill: {text!r}")
        arguments.append(str(value).strip())
        return (spec + kind) % value

    return _CONVERSION.sub(fill, text), arguments


def test_the_weight_buffer_pattern_reads_the_librarys_own_line() -> None:
    formats = [f for f in _library_strings(b" model buffer size") if "%" in f]
    # "load_tensors: %12s model buffer size = %8.2f MiB": the buffer type's name before it.
    shaped = [f for f in formats if re.search(r"%\d*s model buffer size", f)]
    assert shaped, f"no '<name> model buffer size' line in the built llama.cpp: {formats}"
    for text in shaped:
        line, arguments = _render(text)
        before = _CONVERSION.findall(text[: text.index(" model buffer size")])
        found = llama_native.MODEL_BUFFER_LINE.search(line)
        assert found is not None, f"{llama_native.MODEL_BUFFER_LINE.pattern!r} misses {line!r}"
        assert found.group(1) == arguments[len(before) - 1], line


def test_the_layer_device_pattern_reads_the_librarys_own_line_and_no_other() -> None:
    formats = [f for f in _library_strings(b" assigned to device") if "%" in f]
    # "load_tensors: layer %3d assigned to device %s, is_swa = %d"
    shaped = [f for f in formats if re.search(r"layer %\d*d assigned to device %s", f)]
    assert shaped, f"no 'layer N assigned to device D' line in the built llama.cpp: {formats}"
    for text in formats:
        line, arguments = _render(text)
        found = llama_native.LAYER_DEVICE_LINE.search(line)
        if text not in shaped:
            assert found is None, f"{line!r} is not a layer's assignment"
            continue
        assert found is not None, f"{llama_native.LAYER_DEVICE_LINE.pattern!r} misses {line!r}"
        layer = len(_CONVERSION.findall(text[: text.index(" assigned to device")])) - 1
        assert (found.group(1), found.group(2)) == (arguments[layer], arguments[layer + 1]), line


def test_the_variables_and_features_specdeck_reads_are_the_librarys() -> None:
    import llama_cpp

    for variable in (llama_native.TILED_MIN_ROWS_VARIABLE, "GGML_CPU_SPECDECK_KERNELS"):
        assert variable in _library_strings(variable.encode()), (
            f"the built llama.cpp never reads ${variable}: not SpecDeck's build (scripts/setup)"
        )
    system_info = llama_cpp.llama_print_system_info().decode()
    found = hardware._SPECDECK_KERNELS_FEATURE.search(system_info)
    if "avx2" in weight_placement.cpu_flags():
        assert found is not None, system_info
        assert found.group(1).split() == ["Q4_K", "Q4_0", "Q6_K"], system_info


# -- the RPC protocol ---------------------------------------------------------------------------


def test_the_rpc_protocol_version_is_the_built_headers() -> None:
    built = header("ggml-rpc.h")
    copied = (worker_probe.PROTOCOL_MAJOR, worker_probe.PROTOCOL_MINOR)
    assert copied == (
        define_value(built, "RPC_PROTO_MAJOR_VERSION"),
        define_value(built, "RPC_PROTO_MINOR_VERSION"),
    )


def test_a_worker_of_the_built_library_speaks_that_version() -> None:
    # The hello, device count and memory commands (worker_probe.py's copies of ggml-rpc.cpp's
    # numbers) answered by the installed library's own server.
    built = header("ggml-rpc.h")
    version = ".".join(
        str(define_value(built, f"RPC_PROTO_{part}_VERSION"))
        for part in ("MAJOR", "MINOR", "PATCH")
    )
    worker = Worker()
    try:
        status = worker_probe.probe_worker(worker.address)
    finally:
        worker.kill()
    assert status.reachable, status.problem
    assert status.version == version
    assert status.devices
    assert status.devices[0].memory_total > 0


# -- the patches --------------------------------------------------------------------------------

_BASE_COMMIT = re.compile(r"^base-commit: ([0-9a-f]{40})$", re.MULTILINE)
_PREREQUISITE = re.compile(r"^prerequisite-patch-id: ([0-9a-f]{40})$", re.MULTILINE)


def _patch_id(patch: Path) -> str:
    done = subprocess.run(
        ["git", "patch-id", "--stable"], input=patch.read_bytes(), capture_output=True, check=True
    )
    return done.stdout.split()[0].decode()


def test_the_patches_are_a_format_patch_series_on_one_recorded_llama_cpp_commit() -> None:
    patches = sorted(PATCHES.glob("*.patch"))
    assert patches, f"no patches in {PATCHES}"
    bases = set()
    for index, patch in enumerate(patches):
        text = patch.read_text(encoding="utf-8")
        assert text.startswith("From "), f"{patch.name}: not git format-patch output"
        assert re.search(r"^Subject: \[PATCH\] \S", text, re.MULTILINE), patch.name
        assert "\ndiff --git a/" in text, patch.name
        bases.update(_BASE_COMMIT.findall(text))
        # Each patch is made on the ones before it, in name order, the order build-wheel uses.
        assert _PREREQUISITE.findall(text) == [_patch_id(p) for p in patches[:index]], patch.name
    assert len(bases) == 1, f"the patches name different llama.cpp commits: {bases}"


def _git(folder: Path, *arguments: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *arguments],
        cwd=folder,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def patch_kit(tmp_path: Path) -> tuple[Path, Path, str]:
    """build-wheel with one format-patch patch of its own, and the pristine tree it is for."""
    kit = tmp_path / "kit"
    (kit / "packaging" / "llama.cpp").mkdir(parents=True)
    shutil.copy(PATCHES / "build-wheel", kit / "packaging" / "llama.cpp")
    (kit / "pyproject.toml").write_text('dependencies = ["llama-cpp-python==9.9.9"]\n')
    upstream = tmp_path / "upstream"
    (upstream / "src").mkdir(parents=True)
    source = "".join(f"int value_{i} = {i};\n" for i in range(40))
    (upstream / "src" / "kernel.c").write_text(source)
    _git(upstream, "init", "-q")
    _git(upstream, "add", "-A")
    _git(upstream, "commit", "-qm", "upstream")
    base = _git(upstream, "rev-parse", "HEAD").strip()
    (upstream / "src" / "kernel.c").write_text(source.replace("= 20;", "= 2000;"))
    _git(upstream, "commit", "-qam", "SpecDeck: a hook")
    patch = _git(upstream, "format-patch", "--stdout", f"--base={base}", "-1", "HEAD")
    (kit / "packaging" / "llama.cpp" / "hook.patch").write_text(patch)
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "kernel.c").write_text(source)
    return kit, tree, base


def _apply(kit: Path, tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(kit / "packaging" / "llama.cpp" / "build-wheel"), "--apply", str(tree)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_build_wheel_applies_a_patch_that_fits(patch_kit: tuple[Path, Path, str]) -> None:
    kit, tree, _base = patch_kit
    done = _apply(kit, tree)
    assert (done.returncode, done.stderr) == (0, "")
    assert "int value_20 = 2000;\n" in (tree / "src" / "kernel.c").read_text()


def test_build_wheel_prepares_an_sdist_patched_and_versioned(
    patch_kit: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """--prepare: what the build does before pip, for an sdist built elsewhere (the GPU
    check's): the patches in vendor/llama.cpp and __version__ VERSION+specdeck.DIGEST."""
    kit, tree, _base = patch_kit
    sdist = tmp_path / "llama_cpp_python-9.9.9"
    (sdist / "vendor").mkdir(parents=True)
    tree.rename(sdist / "vendor" / "llama.cpp")
    (sdist / "llama_cpp").mkdir()
    (sdist / "llama_cpp" / "__init__.py").write_text('__version__ = "9.9.9"\n')
    done = subprocess.run(
        [str(kit / "packaging" / "llama.cpp" / "build-wheel"), "--prepare", str(sdist)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, "")
    kernel = (sdist / "vendor" / "llama.cpp" / "src" / "kernel.c").read_text()
    assert "int value_20 = 2000;\n" in kernel
    version = (sdist / "llama_cpp" / "__init__.py").read_text()
    assert re.fullmatch(r'__version__ = "9\.9\.9\+specdeck\.[0-9a-fp]+"\n', version)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda text: text.replace("value_19 = 19", "value_19 = -19"),
            "patch failed: src/kernel.c",
        ),
        (lambda text: "int moved;\n" + text, "src/kernel.c hunk #1 is 1 line(s) off its place"),
    ],
    ids=["a changed context", "a moved hunk"],
)
def test_build_wheel_refuses_a_patch_that_does_not_fit_in_one_line(
    patch_kit: tuple[Path, Path, str], change: object, problem: str
) -> None:
    kit, tree, base = patch_kit
    kernel = tree / "src" / "kernel.c"
    kernel.write_text(change(kernel.read_text()))  # type: ignore[operator]
    before = kernel.read_text()
    done = _apply(kit, tree)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("build-wheel: hook.patch does not apply"), done.stderr
    assert f"made for llama.cpp {base[:12]}" in done.stderr
    assert problem in done.stderr
    assert kernel.read_text() == before  # nothing applied


def test_build_wheel_refuses_a_patch_for_another_llama_cpp_commit(
    patch_kit: tuple[Path, Path, str],
) -> None:
    kit, tree, _base = patch_kit
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-qm", "another llama.cpp")
    other = _git(tree, "rev-parse", "HEAD").strip()
    done = _apply(kit, tree)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"the sdist vendors llama.cpp {other[:12]}" in done.stderr
