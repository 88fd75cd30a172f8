"""What this machine offers an engine: CPU cores and the compute backends of the llama.cpp build."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from backends.models.gguf_info import ModelInfo

log = logging.getLogger(__name__)

# ggml_backend_dev_type values (ggml-backend.h)
_DEVICE_TYPE_NAMES = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "accelerator"}
# Load this one CPU variant of a GGML_BACKEND_DL build (e.g. "zen4", "haswell") instead of
# the best for this CPU: how the bundle's check runs a CPU without AMX's kernels here.
CPU_VARIANT_ENV = "SPECDECK_CPU_VARIANT"
# On Vulkan (packaging/llama.cpp/vulkan-exact.patch), batches of up to this many tokens take
# a single step's shaders and attention split, so verification there can be exact (8 is the
# most llama.cpp's mat-vec shaders take). Read when the Vulkan device starts.
VULKAN_EXACT_BATCH = 8
VULKAN_EXACT_BATCH_ENV = "GGML_VK_EXACT_BATCH"
# ggml device kinds that are a GPU of this machine (a worker's devices are never listed).
GPU_KINDS = ("GPU", "iGPU")
# Backend names as the user knows them, matched against ggml's registry names.
_GPU_BACKEND_NAMES = ("CUDA", "ROCm", "HIP", "Vulkan", "Metal", "SYCL", "OpenCL", "CANN", "MUSA")
# The libraries the CUDA backend links to, as NVIDIA's PyPI wheels ship them (scripts/setup
# --cuda installs them where no CUDA toolkit is): loaded first, in this order, so that
# ggml-cuda finds them. The driver's libcuda comes with the GPU's driver.
_CUDA_WHEEL_LIBRARIES = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13")


def physical_cores() -> int:
    """The number of physical cores (llama.cpp runs best with one thread per core)."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


@dataclass(frozen=True)
class ComputeDevice:
    """One device ggml can run on."""

    name: str
    description: str
    kind: str  # "CPU", "GPU", "iGPU", "accelerator"
    memory_free: int | None
    memory_total: int | None


@dataclass(frozen=True)
class LlamaBuildInfo:
    """The compute backends compiled into the installed llama.cpp."""

    backend: str  # "CUDA", "Vulkan", "Metal", ... or "CPU"
    supports_gpu_offload: bool
    devices: tuple[ComputeDevice, ...]
    system_info: str
    # The CPU library a GGML_BACKEND_DL build picked ("sapphirerapids", "zen4", ...).
    cpu_variant: str | None = None
    # Why a GPU backend of the build is not in use, e.g. "Vulkan found no GPU on this
    # machine: running on the CPU" ("" when there is none or it runs).
    gpu_problem: str = ""

    @property
    def backend_label(self) -> str:
        """The backend as a load report names it, e.g. "CPU (zen4)"."""
        if self.backend == "CPU" and self.cpu_variant:
            return f"CPU ({self.cpu_variant})"
        return self.backend

    @property
    def specdeck_kernels(self) -> tuple[str, ...]:
        """The weight types SpecDeck's own CPU kernels serve in this build, e.g. ("Q4_K", ...).

        Empty for a stock llama.cpp, a CPU without AVX2, or with the kernels switched off
        (``GGML_CPU_SPECDECK_KERNELS=0``): llama.cpp's own kernels run then.
        """
        found = _SPECDECK_KERNELS_FEATURE.search(self.system_info)
        return tuple(found.group(1).split()) if found else ()


def ggml_device_library() -> ctypes.CDLL | None:
    """Libggml with the device functions typed (name, kind, memory), or None if unavailable."""
    try:
        from llama_cpp import _ggml
    except Exception as error:  # noqa: BLE001 - an old or odd build: fall back to system info
        log.debug("cannot load libggml for device listing: %s", error)
        return None
    lib: ctypes.CDLL = _ggml.libggml
    try:
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_count.argtypes = []
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_dev_name.restype = ctypes.c_char_p
        lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_description.restype = ctypes.c_char_p
        lib.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_memory.restype = None
        lib.ggml_backend_dev_memory.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.POINTER(ctypes.c_size_t),
        ]
    except AttributeError as error:
        log.debug("libggml lacks device functions: %s", error)
        return None
    return lib


def ggml_devices() -> list[tuple[str, str, int]]:
    """The devices registered with ggml on this machine: (name, kind, ggml_backend_dev_t)."""
    lib = ggml_device_library()
    if lib is None:
        return []
    devices = []
    for index in range(lib.ggml_backend_dev_count()):
        device = lib.ggml_backend_dev_get(index)
        name = (lib.ggml_backend_dev_name(device) or b"").decode(errors="replace")
        kind = _DEVICE_TYPE_NAMES.get(lib.ggml_backend_dev_type(device), "unknown")
        devices.append((name, kind, int(device)))
    return devices


def _list_devices() -> tuple[ComputeDevice, ...]:
    lib = ggml_device_library()
    if lib is None:
        return ()
    devices = []
    for name, kind, device in ggml_devices():
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        devices.append(
            ComputeDevice(
                name=name,
                description=(lib.ggml_backend_dev_description(device) or b"").decode(
                    errors="replace"
                ),
                kind=kind,
                memory_free=free.value or None,
                memory_total=total.value or None,
            )
        )
    return tuple(devices)


def gpu_devices() -> tuple[ComputeDevice, ...]:
    """The GPUs llama.cpp can use, with their memory now (empty on CPU-only builds)."""
    if not llama_build_info().supports_gpu_offload:
        return ()
    return tuple(device for device in _list_devices() if device.kind != "CPU")


# Fault injection: the free bytes every GPU reports (a GPU too small for a model, here).
GPU_FREE_ENV = "SPECDECK_GPU_FREE_BYTES"


def gpu_free_memory() -> tuple[int, str] | None:
    """Free bytes over this machine's GPUs and the first one's label; None without a GPU.

    Vulkan reports its device-local heaps (the budget left where the driver says it).
    """
    build = llama_build_info()
    gpus = [device for device in gpu_devices() if device.kind in GPU_KINDS]
    if not gpus:
        return None
    override = os.environ.get(GPU_FREE_ENV, "")
    free = (
        int(override) * len(gpus)
        if override.isdigit()
        else sum(device.memory_free or 0 for device in gpus)
    )
    return free, gpu_device_label(build, gpus[0].name)


def gpu_device_label(build: LlamaBuildInfo, name: str) -> str:
    """A device as a load report names it: "Vulkan0: llvmpipe", "CUDA0: NVIDIA H200"."""
    for device in build.devices:
        if device.name == name and device.description:
            return f"{name}: {device.description.split(' (')[0]}"
    return name


def _backend_name(devices: tuple[ComputeDevice, ...], system_info: str) -> str:
    haystack = " ".join(d.name for d in devices if d.kind != "CPU") + " " + system_info
    for name in _GPU_BACKEND_NAMES:
        if name.lower() in haystack.lower():
            return name
    return "CPU"


def vulkan_exact_batch() -> int:
    """The batch size up to which Vulkan takes a single step's shaders: the patch's variable.

    0: llama.cpp's own choices. The device reads at most 8 of it; a value that is not a
    number reads as 0 here, so the exactness probe then promises less, never more.
    """
    try:
        return max(0, int(os.environ.get(VULKAN_EXACT_BATCH_ENV, str(VULKAN_EXACT_BATCH))))
    except ValueError:
        return 0


@functools.cache
def load_ggml_backends() -> int:
    """Register ggml's backends if the build keeps them in separate libraries; their count.

    Builds with GGML_BACKEND_DL (the desktop bundle's: one CPU library per instruction set,
    picked at run time) register nothing until their backends are loaded, and llama.cpp only
    looks next to the executable, which in a bundle is not where llama_cpp/lib is.
    ``$SPECDECK_CPU_VARIANT`` loads that one CPU library instead of the best one. A GPU
    backend that is built but cannot load (no Vulkan loader on this machine) is logged in
    one line, and the CPU runs everything.
    """
    os.environ.setdefault(VULKAN_EXACT_BATCH_ENV, str(VULKAN_EXACT_BATCH))  # the user's wins
    lib = ggml_device_library()
    if lib is None:
        return 0
    with contextlib.suppress(AttributeError):  # a build without it logs to stderr
        _route_ggml_log(lib)
    try:
        lib.ggml_backend_reg_count.restype = ctypes.c_size_t
        lib.ggml_backend_reg_count.argtypes = []
        if lib.ggml_backend_reg_count() == 0:
            from llama_cpp import _ggml

            folder = os.path.dirname(_ggml.libggml._name)
            if _backend_libraries(folder, "cuda"):
                preload_cuda_wheel_libraries()
            variant = os.environ.get(CPU_VARIANT_ENV)
            if variant:
                _load_cpu_variant(lib, folder, variant)
            else:
                lib.ggml_backend_load_all_from_path.restype = None
                lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
                lib.ggml_backend_load_all_from_path(os.fsencode(folder))
            if lib.ggml_backend_reg_count() == 0:
                log.warning("no llama.cpp backend could be loaded from %s", folder)
            for problem in unloaded_gpu_backends(folder, _registered_backends(lib)):
                _GPU_PROBLEMS.append(problem)
                log.warning("%s", problem)
        return int(lib.ggml_backend_reg_count())
    except AttributeError as error:
        log.debug("libggml cannot load backends: %s", error)
        return 0


def cuda_wheel_library_folders() -> list[str]:
    """The folders of NVIDIA's CUDA 13 wheels (``nvidia/cu13/lib``) on this Python's path."""
    try:
        import nvidia  # type: ignore[import-not-found]  # a namespace package of NVIDIA's wheels
    except ImportError:
        return []
    folders = (os.path.join(path, "cu13", "lib") for path in getattr(nvidia, "__path__", []))
    return [folder for folder in folders if os.path.isdir(folder)]


def preload_cuda_wheel_libraries() -> list[str]:
    """Load the CUDA runtime and cuBLAS from NVIDIA's wheels, if installed; the paths loaded.

    ggml-cuda links to them by name, and the dynamic loader does not look in site-packages:
    loaded first (RTLD_GLOBAL), they are the ones it finds. One that does not load is logged
    and skipped; the CUDA backend then says why it is not used.
    """
    loaded = []
    for folder in cuda_wheel_library_folders():
        for name in _CUDA_WHEEL_LIBRARIES:
            path = os.path.join(folder, name)
            if not os.path.exists(path):
                continue
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError as error:
                log.warning("cannot load %s for the CUDA backend: %s", path, error)
            else:
                loaded.append(path)
    return loaded


_GGML_LOG_WARN = 3  # enum ggml_log_level
_GgmlLogCallback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_ggml_log_callback: list[object] = []  # kept alive while ggml may call it


def _route_ggml_log(lib: ctypes.CDLL) -> None:
    """Send ggml's log to Python logging, as the engine's llama.cpp log goes later on.

    Loading the backends logs each library it loads (and Vulkan what it finds) to stderr
    otherwise, before any engine has routed the log: a command's one-line error would not
    be one line.
    """

    def on_log(level: int, text: bytes | None, _user_data: ctypes.c_void_p) -> None:
        line = (text or b"").decode(errors="replace").rstrip()
        if line:
            log.log(logging.WARNING if level >= _GGML_LOG_WARN else logging.DEBUG, "%s", line)

    if not _ggml_log_callback:
        _ggml_log_callback.append(_GgmlLogCallback(on_log))
    lib.ggml_log_set.restype = None
    lib.ggml_log_set.argtypes = [_GgmlLogCallback, ctypes.c_void_p]
    lib.ggml_log_set(_ggml_log_callback[0], None)


# Why a GPU backend the build has is not in use (one line each), for the load report.
_GPU_PROBLEMS: list[str] = []


def _registered_backends(lib: ctypes.CDLL) -> set[str]:
    """The names of the backends ggml has registered, lower case ("cpu", "vulkan", "rpc")."""
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    names = set()
    for index in range(lib.ggml_backend_reg_count()):
        name = lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(index)) or b""
        names.add(name.decode(errors="replace").lower())
    return names


def unloaded_gpu_backends(folder: str, registered: set[str]) -> list[str]:
    """A line for each GPU backend library in ``folder`` that ggml did not register, and why.

    A Vulkan backend whose loader (``libvulkan.so.1``) is missing fails to load: the
    dynamic loader's message says so. One that loads but registers nothing found no Vulkan
    driver (and so no GPU).
    """
    problems = []
    for name in _GPU_BACKEND_NAMES:
        if name.lower() in registered:
            continue
        for path in _backend_libraries(folder, name.lower()):
            try:
                ctypes.CDLL(path)
            except OSError as error:
                reason = str(error).replace(f"{path}: ", "")
                problems.append(f"the {name} backend is not loaded ({reason}): running on the CPU")
            else:  # it loads, but found no driver to register with
                problems.append(f"{name} found no GPU on this machine: running on the CPU")
    return problems


def _backend_libraries(folder: str, name: str) -> list[str]:
    suffix = {"win32": ".dll", "darwin": ".so"}.get(sys.platform, ".so")
    prefix = "" if sys.platform == "win32" else "lib"
    path = os.path.join(folder, f"{prefix}ggml-{name}{suffix}")
    return [path] if os.path.exists(path) else []


def gpu_problems() -> tuple[str, ...]:
    """Why the GPU backends this build has are not in use, one line each (empty if they are)."""
    load_ggml_backends()
    return tuple(_GPU_PROBLEMS)


def _load_cpu_variant(lib: ctypes.CDLL, folder: str, variant: str) -> None:
    suffix = {"win32": ".dll", "darwin": ".so"}.get(sys.platform, ".so")
    prefix = "" if sys.platform == "win32" else "lib"
    path = os.path.join(folder, f"{prefix}ggml-cpu-{variant}{suffix}")
    if not os.path.exists(path):
        raise OSError(f"{CPU_VARIANT_ENV}={variant}: no CPU variant library {path}")
    lib.ggml_backend_load.restype = ctypes.c_void_p
    lib.ggml_backend_load.argtypes = [ctypes.c_char_p]
    if not lib.ggml_backend_load(os.fsencode(path)):
        raise OSError(f"{CPU_VARIANT_ENV}={variant}: {path} does not load on this CPU")
    log.info("loaded the CPU variant %s as asked", path)
    rpc = os.path.join(folder, f"{prefix}ggml-rpc{suffix}")
    if os.path.exists(rpc) and not lib.ggml_backend_load(os.fsencode(rpc)):
        log.warning("the RPC backend %s does not load", rpc)


@functools.cache
def llama_build_info() -> LlamaBuildInfo:
    """Detect the installed llama.cpp build's backend (CUDA / Vulkan / Metal / CPU) and devices."""
    import llama_cpp

    load_ggml_backends()
    llama_cpp.llama_backend_init()
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace")
    devices = _list_devices()
    # llama.cpp says it can offload whenever the RPC backend is built in; SpecDeck means a
    # GPU of this machine (workers are not registered, so they are not among the devices).
    supports_offload = bool(llama_cpp.llama_supports_gpu_offload()) and any(
        device.kind in GPU_KINDS for device in devices
    )
    backend = _backend_name(devices, system_info) if supports_offload else "CPU"
    return LlamaBuildInfo(
        backend,
        supports_offload,
        devices,
        system_info.strip(),
        _loaded_cpu_variant(),
        "; ".join(gpu_problems() + _deviceless_backends(devices)),
    )


def _deviceless_backends(devices: tuple[ComputeDevice, ...]) -> tuple[str, ...]:
    """A line for each GPU backend that loaded but found no device of its own."""
    lib = ggml_device_library()
    if lib is None:
        return ()
    try:
        registered = _registered_backends(lib)
    except AttributeError:
        return ()
    return tuple(
        f"{name} found no GPU on this machine: running on the CPU"
        for name in _GPU_BACKEND_NAMES
        if name.lower() in registered
        and not any(d.name.lower().startswith(name.lower()) for d in devices)
    )


# The CPU backend lists "SPECDECK_KERNELS = Q4_K Q4_0 Q6_K" among its features (the patch).
_SPECDECK_KERNELS_FEATURE = re.compile(r"SPECDECK_KERNELS = ([\w ]+?) \|")
_CPU_VARIANT_LIBRARY = re.compile(r"ggml-cpu-([\w-]+)\.(?:so|dll|dylib)")


def _loaded_cpu_variant() -> str | None:
    """Which CPU variant library this process has loaded (Linux; None elsewhere or unknown)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            found = _CPU_VARIANT_LIBRARY.search(maps.read())
    except OSError:
        return None
    return found.group(1) if found else None


# Beyond weights and KV cache: compute buffers, the runtime, Python (measured ~150 MB with
# the small models; scaled a little with the model).
_RUNTIME_OVERHEAD_BYTES = 160 << 20
_FALLBACK_KV_SHARE = 0.12  # KV cache as a share of the weights when the file does not say


def estimate_model_memory(info: ModelInfo, n_ctx: int) -> int:
    """Bytes a model is expected to need loaded with an ``n_ctx`` context (weights + KV cache)."""
    if info.kv_width and info.n_layers:
        # K in F16 and V in Q8_0 or F16: at most 2 bytes per value each.
        kv_cache = info.n_layers * n_ctx * info.kv_width * 2 * 2
    else:
        kv_cache = int(info.file_size * _FALLBACK_KV_SHARE)
    return info.file_size + kv_cache + _RUNTIME_OVERHEAD_BYTES // 2


def estimate_pair_memory(main: ModelInfo, draft: ModelInfo | None, n_ctx: int) -> int:
    """Bytes the main model (and draft) are expected to need, runtime included."""
    total = estimate_model_memory(main, n_ctx) + _RUNTIME_OVERHEAD_BYTES
    if draft is not None and draft.path != main.path:
        total += estimate_model_memory(draft, n_ctx)
    elif draft is not None:
        total += estimate_model_memory(draft, n_ctx) - draft.file_size  # weights are mapped once
    return total


def available_memory() -> int:
    """Bytes of system memory available to a new process now (psutil's ``available``)."""
    return int(psutil.virtual_memory().available)
