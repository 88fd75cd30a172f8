"""One matrix product at a time through the installed llama.cpp's CPU backend, for kernel tests.

Run as a child process, since the CPU backend reads ``$GGML_CPU_SPECDECK_KERNELS`` once:

    python -m tests.ggml_matmul INPUTS.npz OUTPUTS.npz

``INPUTS`` holds, per case NAME, ``NAME.weights`` (raw blocks of one quantized type, one
weight row per line), ``NAME.type`` (its ``ggml_type``), ``NAME.repack`` (whether the weights
go in llama.cpp's CPU_REPACK buffer, as llama.cpp puts them at load) and ``activations``
(float32, one row per batch row). ``OUTPUTS`` gets, per case, ``NAME.batch.N`` (the product
with activation rows 0..N-1 as one batch, N = 1..all) and ``NAME.alone`` (each activation
row as a batch of its own), and ``features``: the CPU backend's feature list.

``benchmarks/row_costs.py`` times the model's matmuls with the same backend
(:class:`WeightCopies`, :class:`ProductGraph`).
"""

from __future__ import annotations

import ctypes
import sys
import time
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
        "ggml_new_graph_custom": (p, [p, size, ctypes.c_bool]),
        "ggml_graph_overhead_custom": (size, [size, ctypes.c_bool]),
        "ggml_backend_dev_supports_op": (ctypes.c_bool, [p, p]),
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

    def __init__(self, threads: int = _THREADS) -> None:
        load_ggml_backends()
        lib = ggml_device_library()
        if lib is None:
            raise RuntimeError("llama.cpp's ggml library cannot be loaded")
        self.lib = _typed(lib)
        self.device = self.lib.ggml_backend_dev_by_type(_GGML_BACKEND_DEVICE_TYPE_CPU)
        registry = self.lib.ggml_backend_dev_backend_reg(self.device)
        self.backend = self.lib.ggml_backend_dev_init(self.device, None)
        set_threads = self._function(registry, b"ggml_backend_set_n_threads", None, ctypes.c_int)
        set_threads(self.backend, threads)
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

    def repacks(self, kind: int, n_out: int, n_in: int) -> bool:
        """Whether llama.cpp puts such weights in CPU_REPACK for a matmul (its own check)."""
        if self.repack is None:
            return False
        with WeightCopies(self, None, kind, n_out, n_in, True, 1) as weights:
            lib = self.lib
            size = lib.ggml_tensor_overhead() * 2 + lib.ggml_graph_overhead()
            context = lib.ggml_init(_InitParams(size, None, True))
            try:
                x = lib.ggml_new_tensor_2d(context, _GGML_TYPE_F32, n_in, 1)
                product = lib.ggml_mul_mat(context, weights.tensors[0], x)
                return bool(lib.ggml_backend_dev_supports_op(self.device, product))
            finally:
                lib.ggml_free(context)

    def matmul(self, weights: np.ndarray, kind: int, repack: bool, rows: np.ndarray) -> np.ndarray:
        """``rows @ W.T`` as llama.cpp computes it: W of ``kind`` (raw blocks, a row a line)."""
        n_out, n_in = weights.shape[0], rows.shape[1]
        with (
            WeightCopies(self, weights, kind, n_out, n_in, repack, 1) as copies,
            ProductGraph(self, copies, rows.shape[0]) as graph,
        ):
            graph.set_rows(rows)
            graph.compute()
            return graph.output(0)


class WeightCopies:
    """``copies`` tensors holding one weight matrix, in the plain or the CPU_REPACK buffer.

    Copies let a timing read its weights from memory, not from a cache, as a forward pass
    through a whole model does. ``weights`` None leaves the tensors unset.
    """

    def __init__(
        self,
        cpu: CpuBackend,
        weights: np.ndarray | None,
        kind: int,
        n_out: int,
        n_in: int,
        repack: bool,
        copies: int,
    ) -> None:
        self.cpu, self.n_out, self.n_in = cpu, n_out, n_in
        lib = cpu.lib
        buffer_type = cpu.repack if repack else cpu.plain
        if buffer_type is None:
            raise RuntimeError("this CPU backend has no CPU_REPACK buffer type")
        self.context = lib.ggml_init(_InitParams(lib.ggml_tensor_overhead() * copies, None, True))
        self.tensors = [
            lib.ggml_new_tensor_2d(self.context, kind, n_in, n_out) for _ in range(copies)
        ]
        self.buffer = lib.ggml_backend_alloc_ctx_tensors_from_buft(self.context, buffer_type)
        if not self.buffer:
            lib.ggml_free(self.context)
            raise RuntimeError("cannot allocate the weight tensors")
        if weights is not None:
            assert lib.ggml_row_size(kind, n_in) == weights.shape[1], "a weight row's size"
            data = np.ascontiguousarray(weights)
            for tensor in self.tensors:
                lib.ggml_backend_tensor_set(tensor, data.ctypes.data, 0, data.nbytes)

    def __enter__(self) -> WeightCopies:
        return self

    def __exit__(self, *_: object) -> None:
        self.cpu.lib.ggml_backend_buffer_free(self.buffer)
        self.cpu.lib.ggml_free(self.context)


class ProductGraph:
    """One graph: every copy of some weights times the same batch of ``n_rows`` rows."""

    def __init__(self, cpu: CpuBackend, weights: WeightCopies, n_rows: int) -> None:
        self.cpu, self.n_rows, self.n_out = cpu, n_rows, weights.n_out
        lib = cpu.lib
        copies = len(weights.tensors)
        nodes = max(16, 2 * copies + 2)
        size = lib.ggml_tensor_overhead() * (copies + 1) + lib.ggml_graph_overhead_custom(
            nodes, False
        )
        self.context = lib.ggml_init(_InitParams(size, None, True))
        self.rows = lib.ggml_new_tensor_2d(self.context, _GGML_TYPE_F32, weights.n_in, n_rows)
        self.products = [lib.ggml_mul_mat(self.context, w, self.rows) for w in weights.tensors]
        self.graph = lib.ggml_new_graph_custom(self.context, nodes, False)
        for product in self.products:
            lib.ggml_build_forward_expand(self.graph, product)
        self.buffer = lib.ggml_backend_alloc_ctx_tensors_from_buft(self.context, cpu.plain)
        if not self.buffer:
            lib.ggml_free(self.context)
            raise RuntimeError("cannot allocate the products")

    def set_rows(self, rows: np.ndarray) -> None:
        """The batch's activations, one row per batch row."""
        data = np.ascontiguousarray(rows, dtype=np.float32)
        assert data.shape[0] == self.n_rows, "the batch's row count"
        self.cpu.lib.ggml_backend_tensor_set(self.rows, data.ctypes.data, 0, data.nbytes)

    def compute(self) -> float:
        """Compute every product once; the seconds it took."""
        began = time.perf_counter()
        status = self.cpu.lib.ggml_backend_graph_compute(self.cpu.backend, self.graph)
        seconds = time.perf_counter() - began
        if status != _GGML_STATUS_SUCCESS:
            raise RuntimeError("the CPU backend failed the product")
        return seconds

    def output(self, index: int) -> np.ndarray:
        """The product with copy ``index`` of the weights (batch rows × output values)."""
        out = np.empty((self.n_rows, self.n_out), dtype=np.float32)
        self.cpu.lib.ggml_backend_tensor_get(self.products[index], out.ctypes.data, 0, out.nbytes)
        return out

    def __enter__(self) -> ProductGraph:
        return self

    def __exit__(self, *_: object) -> None:
        self.cpu.lib.ggml_backend_buffer_free(self.buffer)
        self.cpu.lib.ggml_free(self.context)


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
