"""llama.cpp in this process: started once, its log read, and the values copied from its headers.

:func:`init_llama_cpp` loads ggml's backends, sets SpecDeck's exact-batch threshold and
routes llama.cpp's log through :class:`NativeLog`, which also reads from it where a load
put its weights and layers. The enum values and log patterns below are copied from the
built llama.cpp; ``tests/test_llama_build.py`` checks each against the installed library
(``packaging/llama.cpp/README.md``, "Upgrading").
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import threading
from typing import TYPE_CHECKING

from backends.engines.hardware import load_ggml_backends
from backends.errors import ModelFileError

if TYPE_CHECKING:
    from pathlib import Path

native_log = logging.getLogger("backends.engines.llama.native")

# SpecDeck's llama.cpp build (packaging/llama.cpp/exact-batches.patch) sums repacked Q4_K
# batches the way single steps do, and takes the tiled K-quant matmul only from this many
# batch rows on (llama.cpp: 8): smaller batches then run the kernels of a single step, so
# every verification batch below it can reproduce single-token logits bit for bit.
TILED_MATMUL_MIN_ROWS = 64
TILED_MIN_ROWS_VARIABLE = "GGML_CPU_TILED_MM_MIN_ROWS"

# Copied from the built llama.cpp's ggml.h and llama.h, as the log lines' shapes below are
# from its log: tests/test_llama_build.py checks each against the installed build
# (packaging/llama.cpp/README.md, "Upgrading").
GGML_LOG_DEBUG = 1  # enum ggml_log_level
GGML_LOG_WARN = 3
GGML_LOG_CONT = 5
GGML_TYPE_F16 = 1  # enum ggml_type
GGML_TYPE_Q4_0 = 2
GGML_TYPE_Q8_0 = 8
FLASH_ATTENTION_ENABLED = 1  # enum llama_flash_attn_type
LLAMA_SPLIT_MODE_LAYER = 1  # enum llama_split_mode
LLAMA_FTYPE_MOSTLY_Q4_0 = 2  # enum llama_ftype

# llama.cpp logs where each model's weights went: "load_tensors: CPU_REPACK model buffer size
# = 580.00 MiB" (the buffer type's name, then its size).
MODEL_BUFFER_LINE = re.compile(r"(\S+) model buffer size\s*=")
# ... and, at debug level, each layer's device: "load_tensors: layer  12 assigned to device
# RPC0, is_swa = 0".
LAYER_DEVICE_LINE = re.compile(r"layer\s+(\d+) assigned to device (\S+?),")


class NativeLog:
    """Routes llama.cpp's log to Python logging and remembers the last errors for messages."""

    def __init__(self) -> None:
        import llama_cpp

        self.recent_errors: list[str] = []
        self.weight_buffers: list[str] = []  # "<type> model buffer size" lines of a load
        self.layer_devices: dict[int, str] = {}  # "layer N assigned to device D" of a load
        self._lock = threading.Lock()
        self._line = ""
        self._line_level = GGML_LOG_DEBUG
        # Keep the ctypes callback alive for as long as llama.cpp may call it.
        self.callback = llama_cpp.llama_log_callback(self._on_log)
        llama_cpp.llama_log_set(self.callback, ctypes.c_void_p(0))

    def _on_log(self, level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        message = text.decode("utf-8", errors="replace")
        with self._lock:
            if level != GGML_LOG_CONT:
                self._line_level = level
            level = self._line_level
            self._line += message
            if not self._line.endswith("\n"):
                return
            line, self._line = self._line.strip(), ""
            buffer = MODEL_BUFFER_LINE.search(line)
            if buffer is not None:
                self.weight_buffers.append(buffer.group(1))
            assigned = LAYER_DEVICE_LINE.search(line)
            if assigned is not None:
                self.layer_devices[int(assigned.group(1))] = assigned.group(2)
        if level >= GGML_LOG_WARN:
            with self._lock:
                self.recent_errors = [*self.recent_errors[-9:], line]
            native_log.warning("%s", line)
        else:
            native_log.debug("%s", line)

    def take_weight_buffers(self) -> tuple[str, ...]:
        """The buffer types weights were loaded into since the last call, e.g. CPU_REPACK."""
        with self._lock:
            buffers, self.weight_buffers = self.weight_buffers, []
        return tuple(dict.fromkeys(buffers))

    def take_layer_devices(self) -> dict[int, str]:
        """Which device each layer of the last load went to (llama.cpp's device names)."""
        with self._lock:
            devices, self.layer_devices = self.layer_devices, {}
        return devices

    def take_errors(self) -> str:
        with self._lock:
            errors, self.recent_errors = self.recent_errors, []
        return "; ".join(e for e in errors if e)


_native_log: NativeLog | None = None
_native_lock = threading.Lock()


def init_llama_cpp() -> NativeLog:
    """Start llama.cpp once per process: backends loaded, exact-batch kernels, log routed."""
    global _native_log
    with _native_lock:
        if _native_log is None:
            # Read by ggml once, at the first matmul; a value set by the user wins.
            os.environ.setdefault(TILED_MIN_ROWS_VARIABLE, str(TILED_MATMUL_MIN_ROWS))
            import llama_cpp

            load_ggml_backends()
            llama_cpp.llama_backend_init()
            _native_log = NativeLog()
        return _native_log


def recent_native_errors() -> str:
    """llama.cpp's warnings and errors since they were last taken ("" before it started)."""
    return _native_log.take_errors() if _native_log is not None else ""


def exact_batch_ceiling() -> int:
    """The batch size assumed exact when every probed size is: below the tiled threshold.

    The probe tries batches up to 17 tokens; bigger ones up to the threshold take the same
    kernels (single-step ``vec_dot``, whole GEMM groups), from it on the tiled one.
    """
    value = os.environ.get(TILED_MIN_ROWS_VARIABLE, "")
    rows = int(value) if value.isdigit() else 8
    return max(rows, 8) - 1


def requantize_q4_0(source: Path, target: Path) -> None:
    """Write ``source`` with every quantized tensor in Q4_0 (embedding and output too).

    Written beside ``target`` and renamed, so a crash or a full disk never leaves half a
    model where a later load would find it. A one-line ModelFileError if llama.cpp refuses.
    """
    import llama_cpp

    native = init_llama_cpp()
    native.take_errors()
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE_MOSTLY_Q4_0
    params.token_embedding_type = GGML_TYPE_Q4_0
    params.output_tensor_type = GGML_TYPE_Q4_0
    params.allow_requantize = True
    params.nthread = 0  # all cores
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        status = llama_cpp.llama_model_quantize(
            str(source).encode(), str(partial).encode(), ctypes.byref(params)
        )
        if status != 0 or not partial.is_file():
            detail = native.take_errors() or f"llama_model_quantize returned {status}"
            raise ModelFileError(f"cannot requantize draft {source.name} to Q4_0: {detail}")
        os.replace(partial, target)
    except OSError as error:
        raise ModelFileError(
            f"cannot write the Q4_0 copy of draft {source.name} to {target.parent}: "
            f"{error.strerror or error}"
        ) from error
    finally:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
