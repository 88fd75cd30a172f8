"""Where llama.cpp may put CPU weights: repacked kernels where they are safe, never AMX.

llama.cpp "repacks" CPU weights into extra buffer types whose matmul kernels are faster:
``CPU_REPACK`` (AVX2/AVX-512/NEON layouts) and, on Intel Xeons of the Sapphire Rapids class
and later, ``AMX``. The AMX kernels of the llama.cpp SpecDeck pins segfault on the first
forward pass (llama.cpp #20824; ollama #17205 on AWS m7i), so SpecDeck withholds the AMX
buffer type from llama.cpp's weight placement before any model loads, and keeps the other
repacked kernels. Whether to repack at all is the ``weight_repacking`` setting: repacked
kernels decode faster, while unrepacked ones keep batched logits bit-identical to
single-token logits up to larger batches (what exact verification needs).

The CPU's flags are read through :func:`cpu_flags`, which ``$SPECDECK_CPU_FLAGS`` overrides,
so that the AMX path can be tested on any CPU.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

WeightRepacking = Literal["auto", "on", "off"]
WEIGHT_REPACKING_MODES: tuple[WeightRepacking, ...] = ("auto", "on", "off")
# What "auto" means on every CPU, measured on the default pair (docs/benchmarks.md,
# "Exactness"): repacked weights decode about a third faster; unrepacked ones keep bigger batches
# bit-exact, which does not make up for it.
AUTO_REPACKING: Literal["on", "off"] = "on"

CPU_FLAGS_ENV = "SPECDECK_CPU_FLAGS"  # space-separated flags: a test seam, and for diagnosis
# Only for a llama.cpp build whose AMX kernels were shown safe on this CPU.
ALLOW_AMX_ENV = "SPECDECK_ALLOW_AMX"
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16", "amx_fp16"})
AMX_BUFFER_TYPE = "AMX"
AMX_CRASH_REASON = "llama.cpp's AMX kernels crash on this CPU"

_GGML_DEVICE_TYPE_CPU = 0


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux names them (``$SPECDECK_CPU_FLAGS`` wins)."""
    override = os.environ.get(CPU_FLAGS_ENV)
    if override is not None:
        return frozenset(override.split())
    return _cpuinfo_flags()


@functools.cache
def _cpuinfo_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()  # macOS / Windows: no AMX question there (Apple has no AMX tiles)


@functools.cache
def cpu_model_name() -> str:
    """The CPU's marketing name, e.g. "Intel(R) Xeon(R) Platinum 8488C"."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def has_amx(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU reports Intel AMX (tile registers and int8 tiles)."""
    return bool((cpu_flags() if flags is None else flags) & AMX_FLAGS)


@dataclass(frozen=True)
class WeightPlan:
    """How weights are to be placed: repacked or not, which buffer types are withheld, why."""

    repack: bool  # llama_model_params.use_extra_bufts
    withheld: frozenset[str]  # extra buffer types llama.cpp must not put weights in
    note: str  # one line for the load report
    amx_cpu: bool = False  # the CPU reports AMX

    @classmethod
    def choose(
        cls,
        mode: WeightRepacking,
        flags: frozenset[str] | None = None,
        *,
        allow_amx: bool | None = None,
    ) -> WeightPlan:
        """The plan for ``mode`` on a CPU with ``flags`` (this CPU's when None).

        AMX is withheld on every CPU unless allowed (where the CPU has none, llama.cpp
        offers none and withholding changes nothing); the note names it where it matters.
        """
        if mode not in WEIGHT_REPACKING_MODES:
            choices = ", ".join(WEIGHT_REPACKING_MODES)
            raise ValueError(f"weight repacking must be one of {choices}, got {mode!r}")
        amx = has_amx(flags)
        if allow_amx is None:
            allow_amx = os.environ.get(ALLOW_AMX_ENV) == "1"
        repack = (AUTO_REPACKING if mode == "auto" else mode) == "on"
        chosen = "auto" if mode == "auto" else "chosen"
        if not repack:
            note = f"weight repacking off ({chosen})"
            if amx:
                note += f"; AMX unused: {AMX_CRASH_REASON}"
            return cls(False, frozenset(), note, amx)
        withheld = frozenset() if allow_amx else frozenset({AMX_BUFFER_TYPE})
        note = f"weight repacking on ({chosen})"
        if amx:
            note += f", AMX withheld: {AMX_CRASH_REASON}" if withheld else ", AMX allowed"
        return cls(True, withheld, note, amx)


# -- the CPU backend's list of extra buffer types --------------------------------------------
#
# llama.cpp places weights in the first extra buffer type of the CPU device that supports
# them; the list is the NULL-terminated array ggml_backend_dev_get_extra_bufts returns (a
# static vector inside ggml-cpu). Withholding a type rewrites that array without it, before
# any model loads; the original entries are kept so that a later plan can put them back.

_original_extra_types: list[int] | None = None


def _extra_types_array() -> ctypes.Array[ctypes.c_void_p] | None:
    """The CPU device's extra buffer type array (None when this build has no such list)."""
    from backends.engines.hardware import load_ggml_backends

    load_ggml_backends()
    try:
        from llama_cpp import _ggml
    except Exception as error:  # noqa: BLE001 - an odd build: nothing to withhold
        log.debug("cannot load libggml: %s", error)
        return None
    lib = _ggml.libggml
    try:
        lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
        lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
        lib.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        lib.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
        lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    except AttributeError as error:
        log.debug("libggml lacks the backend registry: %s", error)
        return None
    device = lib.ggml_backend_dev_by_type(_GGML_DEVICE_TYPE_CPU)
    if not device:
        return None
    registry = lib.ggml_backend_dev_backend_reg(device)
    address = lib.ggml_backend_reg_get_proc_address(registry, b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return None
    get_extra = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(address)
    first = get_extra(device)
    if not first:
        return None
    count = 0
    pointers = ctypes.cast(first, ctypes.POINTER(ctypes.c_void_p))
    while pointers[count]:
        count += 1
    return (ctypes.c_void_p * (count + 1)).from_address(first)


def _buffer_type_name(buffer_type: int) -> str:
    from llama_cpp import _ggml

    lib = _ggml.libggml
    lib.ggml_backend_buft_name.restype = ctypes.c_char_p
    lib.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    return (lib.ggml_backend_buft_name(buffer_type) or b"?").decode(errors="replace")


def offered_extra_buffer_types() -> tuple[str, ...]:
    """The extra buffer types llama.cpp may put weights in now, in its order of preference."""
    array = _extra_types_array()
    if array is None:
        return ()
    return tuple(_buffer_type_name(entry) for entry in array if entry)


def withhold_extra_buffer_types(names: frozenset[str]) -> bool:
    """Offer llama.cpp every extra buffer type of this build except ``names``.

    Returns False when this build's list cannot be found or rewritten.
    """
    global _original_extra_types
    array = _extra_types_array()
    if array is None:
        return not names
    if _original_extra_types is None:
        _original_extra_types = [int(entry) for entry in array if entry]
    kept = [entry for entry in _original_extra_types if _buffer_type_name(entry) not in names]
    if len(array) - 1 < len(kept):
        return False  # the array is shorter than the original: not ours to rewrite
    for index in range(len(array)):
        array[index] = kept[index] if index < len(kept) else None
    if len(kept) != len(_original_extra_types):
        log.info("withheld from llama.cpp's weight placement: %s", ", ".join(sorted(names)))
    return True


def apply_plan(plan: WeightPlan) -> WeightPlan:
    """Make llama.cpp's buffer types follow ``plan``; the plan actually in force.

    If the withheld types cannot be removed from this build's list on a CPU with AMX,
    weights are not repacked at all: never load weights into the AMX buffer type. (A CPU
    without AMX cannot have llama.cpp offer it.)
    """
    if not plan.repack:
        return plan
    if withhold_extra_buffer_types(plan.withheld) or not plan.amx_cpu:
        return plan
    note = f"weight repacking off: {AMX_CRASH_REASON} (cannot withhold AMX)"
    return WeightPlan(False, frozenset(), note, plan.amx_cpu)


__all__ = [
    "ALLOW_AMX_ENV",
    "AMX_BUFFER_TYPE",
    "AUTO_REPACKING",
    "CPU_FLAGS_ENV",
    "WEIGHT_REPACKING_MODES",
    "WeightPlan",
    "WeightRepacking",
    "apply_plan",
    "cpu_flags",
    "cpu_model_name",
    "has_amx",
    "offered_extra_buffer_types",
    "withhold_extra_buffer_types",
]
