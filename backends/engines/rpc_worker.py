"""The worker's side of llama.cpp's RPC backend: this machine serves its devices to others.

:func:`serve_worker` runs llama.cpp's RPC server (``ggml_backend_rpc_start_server``, from
the same llama.cpp build the engine runs) in this process until it ends; ``specdeck
worker`` (:mod:`backends.service.worker_cli`) is its command line.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from backends.engines.hardware import GPU_KINDS, ggml_devices
from backends.engines.llama_native import init_llama_cpp
from backends.engines.rpc import require_rpc_function
from backends.engines.worker_probe import WorkerError
from backends.errors import SettingsError

if TYPE_CHECKING:
    from collections.abc import Sequence


def serve_worker(host: str, port: int, n_threads: int, device_names: Sequence[str] = ()) -> None:
    """Run llama.cpp's RPC server here until the process ends (it blocks in native code).

    Serves the named devices, else every GPU, else the CPU. Raises SettingsError for an
    unknown device and WorkerError when the server cannot start (it returns at once).
    """
    init_llama_cpp()  # the same kernels and exact-batch settings as the engine's own
    start = ctypes.CFUNCTYPE(
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    )(require_rpc_function("ggml_backend_rpc_start_server"))
    available = ggml_devices()
    if device_names:
        by_name = {name: pointer for name, _kind, pointer in available}
        unknown = [name for name in device_names if name not in by_name]
        if unknown:
            names = ", ".join(by_name)
            raise SettingsError(f"no device {unknown[0]!r} here; devices: {names}")
        chosen = [by_name[name] for name in device_names]
    else:
        gpus = [pointer for _name, kind, pointer in available if kind in GPU_KINDS]
        cpus = [pointer for _name, kind, pointer in available if kind == "CPU"]
        chosen = gpus or cpus[:1]
    if not chosen:
        raise WorkerError("llama.cpp found no device to serve")
    pointers = (ctypes.c_void_p * len(chosen))(*chosen)
    start(f"{host}:{port}".encode(), None, n_threads, len(chosen), pointers)
    raise WorkerError(f"llama.cpp's RPC server stopped (could it listen on {host}:{port}?)")
