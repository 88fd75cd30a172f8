"""The CMake arguments of SpecDeck's llama.cpp build (packaging/llama.cpp/cmake-args)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "packaging" / "llama.cpp" / "cmake-args"

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the native build names x86 instruction sets"
)


# SpecDeck's cache, where scripts/setup keeps the Vulkan headers (fetched there once).
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdeck"


def cmake_args(
    kind: str,
    flags: str,
    *options: str,
    cache: Path = CACHE,
    env: dict[str, str] | None = None,
) -> tuple[set[str], str]:
    """cmake-args' arguments for a CPU of these flags (and its one-line notes on stderr)."""
    env = os.environ | {"SPECDECK_CPU_FLAGS": flags} | (env or {})
    done = subprocess.run(
        [str(SCRIPT), kind, str(cache), *options],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return set(done.stdout.split()), done.stderr


# A Zen 3 (AVX2, no AVX-512) and a Zen 4, as /proc/cpuinfo names their flags.
ZEN3 = "fpu sse4_1 sse4_2 avx f16c fma bmi2 avx2 popcnt"
ZEN4 = ZEN3 + " avx512f avx512dq avx512cd avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16"


def test_the_native_build_names_this_cpu_s_instruction_sets() -> None:
    """GGML_NATIVE cannot build a loadable CPU library, so the flags are named one by one."""
    zen3, _ = cmake_args("native", ZEN3)
    assert {"-DGGML_BACKEND_DL=ON", "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON"} <= zen3
    assert {"-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AMX_INT8=OFF"} <= zen3
    zen4, _ = cmake_args("native", ZEN4)
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON"} <= zen4
    # AVX512 needs all five of F, CD, VL, DQ and BW: without BW it stays off.
    no_bw, _ = cmake_args("native", ZEN4.replace("avx512bw", ""))
    assert "-DGGML_AVX512=OFF" in no_bw


def test_the_portable_build_takes_every_cpu_variant() -> None:
    portable, _ = cmake_args("portable", ZEN3)
    assert {"-DGGML_BACKEND_DL=ON", "-DGGML_CPU_ALL_VARIANTS=ON", "-DGGML_RPC=ON"} <= portable
    assert not any(arg.startswith("-DGGML_AVX") for arg in portable)


def test_vulkan_is_built_only_with_its_tools_and_says_why_not() -> None:
    args, why = cmake_args("native", ZEN3)
    if "-DGGML_VULKAN=ON" in args:
        headers = next(a for a in args if a.startswith("-DVulkan_INCLUDE_DIR="))
        assert Path(headers.split("=", 1)[1], "vulkan", "vulkan.hpp").is_file()
        assert why == ""
    else:
        assert why.startswith("cmake-args: building without the Vulkan backend (")


def fake_toolkit(root: Path, *, with_cublas: bool) -> Path:
    """A folder laid out as a CUDA toolkit: bin/nvcc and the headers the build looks for."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (root / "bin" / "nvcc").chmod(0o755)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    if with_cublas:
        (root / "include" / "cublas_v2.h").write_text("")
    return root


def test_cuda_takes_an_installed_toolkit_the_gpu_s_architecture_and_no_vulkan(
    tmp_path: Path,
) -> None:
    """--cuda: CUDA_HOME's toolkit when it has nvcc and cuBLAS, and never Vulkan beside it."""
    toolkit = fake_toolkit(tmp_path / "cuda", with_cublas=True)
    cuda = ("--cuda", "python3")
    cache = tmp_path / "cache"
    env = {"CUDA_HOME": str(toolkit), "SPECDECK_CUDA_ARCHS": "90;120a-real"}
    args, _ = cmake_args("native", ZEN4, *cuda, cache=cache, env=env)
    assert {"-DGGML_CUDA=ON", "-DGGML_BACKEND_DL=ON", "-DGGML_AVX512=ON"} <= args
    assert f"-DCUDAToolkit_ROOT={toolkit}" in args
    assert f"-DCMAKE_CUDA_COMPILER={toolkit}/bin/nvcc" in args
    assert "-DCMAKE_CUDA_ARCHITECTURES=90;120a-real" in args
    assert not any("VULKAN" in arg.upper() for arg in args)
    if shutil.which("nvidia-smi", path="/usr/bin:/bin"):
        return  # a GPU here names its architecture
    # Without a GPU (no nvidia-smi) nor the variable: llama.cpp's own list of architectures.
    env = {"CUDA_HOME": str(toolkit), "PATH": "/usr/bin:/bin"}
    args, _ = cmake_args("native", ZEN4, *cuda, cache=cache, env=env)
    assert not any(arg.startswith("-DCMAKE_CUDA_ARCHITECTURES") for arg in args)


def test_a_toolkit_without_cublas_is_passed_over_and_a_failed_fetch_says_so(
    tmp_path: Path,
) -> None:
    """A toolkit that lacks cuBLAS's headers is not taken; PyPI's wheels are fetched instead,
    and when pip cannot get them the build stops with one line that names the file."""
    if Path("/usr/local/cuda/include/cublas_v2.h").exists():
        pytest.skip("a complete CUDA toolkit in /usr/local/cuda is taken before PyPI's")
    toolkit = fake_toolkit(tmp_path / "cuda", with_cublas=False)
    failing_python = tmp_path / "python"  # a Python whose pip cannot install anything
    failing_python.write_text("#!/bin/sh\nexit 1\n")
    failing_python.chmod(0o755)
    done = subprocess.run(
        [str(SCRIPT.parent / "cuda-toolkit"), str(failing_python), str(tmp_path / "cache")],
        env=os.environ | {"CUDA_HOME": str(toolkit), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1] == (
        f"cuda-toolkit: pip could not install {SCRIPT.parent}/cuda-requirements.txt"
    )
    assert not (tmp_path / "cache" / "cuda-13.0").exists()


def fake_cublas_wheel(site: Path, major: int) -> Path:
    """NVIDIA's cuBLAS wheel as pip lays it out: nvidia/cu<major>/{include,lib}."""
    folder = site / "nvidia" / f"cu{major}"
    (folder / "include").mkdir(parents=True)
    (folder / "include" / "cublas_v2.h").write_text("/* the wheel's */\n")
    (folder / "lib").mkdir()
    (folder / "lib" / f"libcublas.so.{major}").write_text("")
    return folder


def test_a_toolkit_without_cublas_is_joined_with_the_python_s_cublas_wheel(
    tmp_path: Path,
) -> None:
    """nvcc and the runtime from the toolkit, cuBLAS from the Python's wheel of the same CUDA
    major version (PyTorch brings one): a root of links in the cache joins them, with a stub
    libcuda that defines the driver's functions; a wheel of another major version is not
    taken."""
    if Path("/usr/local/cuda/include/cublas_v2.h").exists():
        pytest.skip("a complete CUDA toolkit in /usr/local/cuda is taken before any join")
    if shutil.which("cc") is None or shutil.which("nm") is None:
        pytest.skip("the stub libcuda needs a C compiler and nm")
    toolkit = fake_toolkit(tmp_path / "cuda", with_cublas=False)
    (toolkit / "include" / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 13000\n")
    (toolkit / "include" / "cuda.h").write_text("int cuMemCreate(void);\nint cuInit(int);\n")
    (toolkit / "lib64").mkdir()
    (toolkit / "lib64" / "libcudart.so.13").write_text("")
    site = tmp_path / "site"
    wheel = fake_cublas_wheel(site, 13)
    env = os.environ | {
        "CUDA_HOME": str(toolkit),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(site),
        "PIP_NO_INDEX": "1",
    }
    tool = SCRIPT.parent / "cuda-toolkit"
    cache = tmp_path / "cache"
    done = subprocess.run(
        [str(tool), sys.executable, str(cache)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    root = Path(done.stdout.strip())
    assert root.parent == cache
    assert root.name.startswith("cuda-joined-")
    assert (root / "bin" / "nvcc").resolve() == (toolkit / "bin" / "nvcc").resolve()
    assert (root / "include" / "cuda_runtime.h").resolve() == toolkit / "include/cuda_runtime.h"
    assert (root / "include" / "cublas_v2.h").resolve() == wheel / "include" / "cublas_v2.h"
    assert (root / "lib64" / "libcublas.so").resolve() == wheel / "lib" / "libcublas.so.13"
    assert (root / "lib64" / "libcudart.so").resolve() == toolkit / "lib64" / "libcudart.so.13"
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(root / "lib" / "stubs" / "libcuda.so")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert {"cuMemCreate", "cuInit"} <= set(symbols)
    # Again: the joined root is kept and found as it is.
    again = subprocess.run(
        [str(tool), sys.executable, str(cache)], env=env, capture_output=True, text=True
    )
    assert again.stdout == done.stdout

    # A CUDA 12 wheel does not join a CUDA 13 compiler: PyPI's toolkit is fetched instead
    # (here pip may not reach an index, so the one-line error says it could not).
    shutil.rmtree(site / "nvidia")
    fake_cublas_wheel(site, 12)
    other = subprocess.run(
        [str(tool), sys.executable, str(tmp_path / "cache2")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert other.returncode == 1
    assert other.stderr.splitlines()[-1] == (
        f"cuda-toolkit: pip could not install {SCRIPT.parent}/cuda-requirements.txt"
    )
