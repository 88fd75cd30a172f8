"""One matrix product at a time through the installed llama.cpp's CPU backend, for kernel tests.

Run as a child process, since the CPU backend reads ``$GGML_CPU_SPECDECK_KERNELS`` once:

    python -m tests.ggml_matmul INPUTS.npz OUTPUTS.npz

``INPUTS`` holds, per case NAME, ``NAME.weights`` (raw blocks of one quantized type, one
weight row per line), ``NAME.type`` (its ``ggml_type``), ``NAME.repack`` (whether the weights
go in llama.cpp's CPU_REPACK buffer, as llama.cpp puts them at load) and ``activations``
(float32, one row per batch row). ``OUTPUTS`` gets, per case, ``NAME.batch.N`` (the product
with activation rows 0..N-1 as one batch, N = 1..all) and ``NAME.alone`` (each activation
row as a batch of its own), and ``features``: the CPU backend's feature list.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.engines.hardware import ggml_device_library, load_ggml_backends

if TYPE_CHECKING:
    from collections.abc import Callable

_GGML_BACKEND_DEVICE_TYPE_CPU = 0
_GGML_TYPE_F32 = 0
_GGML_STATUS_SUCCESS = 0
_THREADS = 2
_REPACK_BUFFER = b"CPU_REPACK"


class _InitParams(ctypes.Structure):
    _fields_ = (
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    )


class _Feature(ctypes.Structure):
    _fields_ = (("name", ctypes.c_char_p), ("value", ctypes.c_char_p))


def _typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, size, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64
    signatures: dict[str, tuple[object, list[object]]] = {
        "ggml_init": (p, [_InitParams]),
        "ggml_free": (None, [p]),
        "ggml_tensor_overhead": (size, []),
        "ggml_graph_overhead": (size, []),
        "ggml_new_tensor_2d": (p, [p, ctypes.c_int, i64, i64]),
        "ggml_mul_mat": (p, [p, p, p]),
        "ggml_new_graph": (p, [p]),
        "ggml_build_forward_expand": (None, [p, p]),
        "ggml_row_size": (size, [ctypes.c_int, i64]),
        "ggml_backend_dev_by_type": (p, [ctypes.c_int]),
        "ggml_backend_dev_backend_reg": (p, [p]),
        "ggml_backend_dev_buffer_type": (p, [p]),
        "ggml_backend_dev_init": (p, [p, ctypes.c_char_p]),
        "ggml_backend_reg_get_proc_address": (p, [p, ctypes.c_char_p]),
        "ggml_backend_buft_name": (ctypes.c_char_p, [p]),
        "ggml_backend_alloc_ctx_tensors_from_buft": (p, [p, p]),
        "ggml_backend_buffer_free": (None, [p]),
        "ggml_backend_tensor_set": (None, [p, p, size, size]),
        "ggml_backend_tensor_get": (None, [p, p, size, size]),
        "ggml_backend_graph_compute": (ctypes.c_int, [p, p]),
        "ggml_backend_free": (None, [p]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


class CpuBackend:
    """llama.cpp's CPU backend, its plain buffer type and its CPU_REPACK one."""

    def __init__(self) -> None:
        load_ggml_backends()
        lib = ggml_device_library()
        if lib is None:
            raise RuntimeError("llama.cpp's ggml library cannot be loaded")
        self.lib = _typed(lib)
        self.device = self.lib.ggml_backend_dev_by_type(_GGML_BACKEND_DEVICE_TYPE_CPU)
        registry = self.lib.ggml_backend_dev_backend_reg(self.device)
        self.backend = self.lib.ggml_backend_dev_init(self.device, None)
        set_threads = self._function(registry, b"ggml_backend_set_n_threads", None, ctypes.c_int)
        set_threads(self.backend, _THREADS)
        self.plain = self.lib.ggml_backend_dev_buffer_type(self.device)
        self.repack = self._repack_buffer_type(registry)
        get_features = self._function(
            registry, b"ggml_backend_get_features", ctypes.POINTER(_Feature)
        )
        features = get_features(registry)
        self.features: dict[str, str] = {}
        index = 0
        while features[index].name:
            self.features[features[index].name.decode()] = features[index].value.decode()
            index += 1

    def _function(
        self, registry: int, name: bytes, restype: object, *arguments: object
    ) -> Callable[..., Any]:
        address = self.lib.ggml_backend_reg_get_proc_address(registry, name)
        if not address:
            raise RuntimeError(f"the CPU backend has no {name.decode()}")
        prototype = ctypes.CFUNCTYPE(restype, ctypes.c_void_p, *arguments)  # type: ignore[arg-type]
        return prototype(address)

    def _repack_buffer_type(self, registry: int) -> int | None:
        get_extra = self._function(registry, b"ggml_backend_dev_get_extra_bufts", ctypes.c_void_p)
        first = get_extra(self.device)
        if not first:
            return None
        entries = ctypes.cast(first, ctypes.POINTER(ctypes.c_void_p))
        index = 0
        while entries[index]:
            if self.lib.ggml_backend_buft_name(entries[index]) == _REPACK_BUFFER:
                return int(entries[index])
            index += 1
        return None

    def matmul(self, weights: np.ndarray, kind: int, repack: bool, rows: np.ndarray) -> np.ndarray:
        """``rows @ W.T`` as llama.cpp computes it: W of ``kind`` (raw blocks, a row a line)."""
        lib = self.lib
        n_out, n_in = weights.shape[0], rows.shape[1]
        buffer_type = self.repack if repack else self.plain
        if buffer_type is None:
            raise RuntimeError("this CPU backend has no CPU_REPACK buffer type")
        overhead = lib.ggml_tensor_overhead() * 4 + lib.ggml_graph_overhead()
        weight_context = lib.ggml_init(_InitParams(overhead, None, True))
        context = lib.ggml_init(_InitParams(overhead, None, True))
        buffers = []
        try:
            w = lib.ggml_new_tensor_2d(weight_context, kind, n_in, n_out)
            assert lib.ggml_row_size(kind, n_in) == weights.shape[1], "a weight row's size"
            x = lib.ggml_new_tensor_2d(context, _GGML_TYPE_F32, n_in, rows.shape[0])
            product = lib.ggml_mul_mat(context, w, x)
            graph = lib.ggml_new_graph(context)
            lib.ggml_build_forward_expand(graph, product)
            buffers.append(
                lib.ggml_backend_alloc_ctx_tensors_from_buft(weight_context, buffer_type)
            )
            buffers.append(lib.ggml_backend_alloc_ctx_tensors_from_buft(context, self.plain))
            if not all(buffers):
                raise RuntimeError("cannot allocate the tensors")
            w_data = np.ascontiguousarray(weights)
            x_data = np.ascontiguousarray(rows, dtype=np.float32)
            lib.ggml_backend_tensor_set(w, w_data.ctypes.data, 0, w_data.nbytes)
            lib.ggml_backend_tensor_set(x, x_data.ctypes.data, 0, x_data.nbytes)
            if lib.ggml_backend_graph_compute(self.backend, graph) != _GGML_STATUS_SUCCESS:
                raise RuntimeError("the CPU backend failed the product")
            out = np.empty((rows.shape[0], n_out), dtype=np.float32)
            lib.ggml_backend_tensor_get(product, out.ctypes.data, 0, out.nbytes)
            return out
        finally:
            for buffer in buffers:
                if buffer:
                    lib.ggml_backend_buffer_free(buffer)
            lib.ggml_free(context)
            lib.ggml_free(weight_context)


def main(inputs_path: Path, outputs_path: Path) -> None:
    inputs = np.load(inputs_path)
    activations = inputs["activations"]
    names = sorted({key.split(".")[0] for key in inputs.files if key.endswith(".weights")})
    cpu = CpuBackend()
    outputs: dict[str, np.ndarray] = {
        "features": np.array([f"{key} = {value}" for key, value in cpu.features.items()])
    }
    for name in names:
        weights = inputs[f"{name}.weights"]
        kind, repack = int(inputs[f"{name}.type"]), bool(inputs[f"{name}.repack"])
        for n in range(1, len(activations) + 1):
            outputs[f"{name}.batch.{n}"] = cpu.matmul(weights, kind, repack, activations[:n])
        outputs[f"{name}.alone"] = np.concatenate(
            [cpu.matmul(weights, kind, repack, row[None, :]) for row in activations]
        )
    np.savez(outputs_path, **outputs)  # type: ignore[arg-type]
    cpu.lib.ggml_backend_free(cpu.backend)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
