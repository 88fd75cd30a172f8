"""Where a verification batch's time goes on a CPU, and how far its extra rows are from the floor.

For the main model (default: the default pair's) and batches of 1, 2, 4 and 8 tokens, with the
CPU library in use named, it reports:

1. the forward pass's cost per batch size, timed as the planner times it
   (``BatchCosts.calibrate``), and the extra cost of each row over a single step;
2. the matmul time per weight type and shape: each distinct (type, output rows, input values)
   of the model once, timed through llama.cpp's CPU backend (``tests/ggml_matmul.py``), its
   weights in llama.cpp's CPU_REPACK buffer where llama.cpp's own check puts them there, and
   in enough copies (:data:`WORKING_SET_BYTES`) that they come from memory as in a pass
   through the whole model; times how many such tensors the model has. What the pass costs
   beyond them is the rest (attention, norms, activations, logits);
3. the compute floor of an extra row: the int8 products it needs (one per matmul weight) over
   the peak of the instruction the library's kernels multiply with (:data:`INSTRUCTIONS`,
   per core per cycle, with their sources), at the clock ``/proc/cpuinfo`` reports, on every
   thread; and, where a C compiler is found, that peak as a loop of independent instructions
   measures it on this machine.

Both measurements run in one child process, alternated round by round (this shared machine's
speed moves from minute to minute). It inherits the caller's variables, which ggml reads once:
``SPECDECK_CPU_VARIANT=haswell`` loads the AVX2 library of a build with every CPU variant,
``GGML_CPU_SPECDECK_KERNELS=0`` gives llama.cpp's own kernels. ``--loop N`` evaluates
batches of N tokens for ``--seconds``, for a profiler (``perf record -e cpu-clock -g --
python -m benchmarks.row_costs --loop 4``).

    .venv/bin/python -m benchmarks.row_costs [--model FILE] [--rounds 10] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.engines.hardware import CPU_VARIANT_ENV, llama_build_info, physical_cores
from backends.engines.weight_placement import cpu_model_name
from backends.models.gguf_info import TensorInfo, read_tensors
from backends.models.provision import DEFAULT_MAIN_KEY, model_path

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
BATCH_SIZES = (1, 2, 4, 8)
# Matmul timings keep this many bytes of weight copies per shape: 4 x the 32 MiB L3 cache of
# the EPYC machines in docs/benchmarks.md, so that they come from memory, as in a pass.
WORKING_SET_BYTES = 128 << 20
# Tensors only looked up by row (ggml_get_rows), never multiplied; a model without
# output.weight multiplies by token_embd.weight for its logits (tied embeddings).
LOOKUP_TENSORS = frozenset({"token_embd.weight", "position_embd.weight", "token_types.weight"})
OUTPUT_TENSOR = "output.weight"
TIED_OUTPUT = "token_embd.weight"
KERNELS_ENV = "GGML_CPU_SPECDECK_KERNELS"


@dataclass(frozen=True)
class Instruction:
    """An int8 multiply-add instruction: its products and how many a core starts per cycle."""

    name: str
    products: int  # u8 x s8 products per instruction
    per_cycle: Mapping[str, float]  # instructions per cycle per core, by core


# Throughputs (instructions per cycle per core) as uops.info measured them, "TP" of the
# register form (https://uops.info/html-instr/VPMADDUBSW_YMM_YMM_YMM.html,
# https://uops.info/html-instr/VPDPBUSD_ZMM_ZMM_ZMM.html, VPDPBUSD_YMM_YMM_YMM.html), and for
# Zen 1 Agner Fog's instruction tables (https://www.agner.org/optimize/instruction_tables.pdf,
# AMD Zen: PMADDUBSW on pipe 0 only, a 256-bit instruction as two 128-bit halves). Haswell and
# Broadwell multiply vector integers on port 0 only (TP 1.0), Skylake and later on ports 0 and
# 1 (TP 0.5); Zen 3 and Zen 4 on two pipes (TP 0.5); Zen 4 runs a 512-bit instruction on both
# 256-bit halves (TP 1.0), Zen 5 has full 512-bit pipes (TP 0.5). ``measured_peak`` checks
# the value for the machine at hand.
VPMADDUBSW_YMM = Instruction(
    "vpmaddubsw ymm (AVX2: 16 int16 lanes, each the sum of 2 products)",
    32,
    {
        "Zen 1": 0.5,
        "Zen 2": 1.0,
        "Zen 3": 2.0,
        "Zen 4": 2.0,
        "Zen 5": 2.0,
        "Haswell": 1.0,
        "Skylake": 2.0,
        "Ice Lake or later": 2.0,
    },
)
VPDPBUSD_YMM = Instruction(
    "vpdpbusd ymm (AVX-VNNI: 8 int32 lanes, each the sum of 4 products)",
    32,
    {"Zen 4": 2.0, "Zen 5": 2.0, "Ice Lake or later": 2.0},
)
VPDPBUSD_ZMM = Instruction(
    "vpdpbusd zmm (AVX-512 VNNI: 16 int32 lanes, each the sum of 4 products)",
    64,
    {"Zen 4": 1.0, "Zen 5": 2.0, "Ice Lake or later": 1.0},
)
INSTRUCTIONS = (VPMADDUBSW_YMM, VPDPBUSD_YMM, VPDPBUSD_ZMM)


@dataclass(frozen=True)
class MatmulGroup:
    """The model's matmul weights of one type and shape: how many there are, and which."""

    type_name: str
    type_id: int
    rows: int  # output values (ggml's ne1)
    cols: int  # input values per row (ne0)
    count: int
    roles: tuple[str, ...]  # the tensors' names less "blk.N.", e.g. ("ffn_gate", "ffn_up")
    first: str  # the first such tensor's name (its weights are the ones timed)
    nbytes: int  # one tensor's bytes

    @property
    def key(self) -> str:
        """The group as the report names it, e.g. "Q4_K 8960x1536"."""
        return f"{self.type_name} {self.rows}x{self.cols}"

    @property
    def products_per_row(self) -> int:
        """The int8 products one batch row needs through all tensors of the group."""
        return self.rows * self.cols * self.count


def matmul_groups(tensors: Iterable[TensorInfo]) -> tuple[MatmulGroup, ...]:
    """The 2-D weights a forward pass multiplies by, grouped by (type, rows, columns).

    Lookup tables (the token embedding) are left out, except that without an output.weight
    the token embedding is the output layer (tied embeddings) and counts once.
    """
    listed = list(tensors)
    names = {tensor.name for tensor in listed}
    tied = OUTPUT_TENSOR not in names
    found: dict[tuple[str, int, int], list[TensorInfo]] = {}
    for tensor in listed:
        if len(tensor.shape) != 2:
            continue
        if tensor.name in LOOKUP_TENSORS and not (tied and tensor.name == TIED_OUTPUT):
            continue
        cols, rows = tensor.shape
        found.setdefault((tensor.quant_type.name, rows, cols), []).append(tensor)
    groups = []
    for (type_name, rows, cols), members in found.items():
        roles = dict.fromkeys(_role(tensor.name) for tensor in members)
        if tied and TIED_OUTPUT in {tensor.name for tensor in members}:
            roles = dict.fromkeys(
                "output (tied token_embd)" if role == "token_embd" else role for role in roles
            )
        groups.append(
            MatmulGroup(
                type_name,
                int(members[0].quant_type),
                rows,
                cols,
                len(members),
                tuple(roles),
                members[0].name,
                members[0].nbytes,
            )
        )
    return tuple(sorted(groups, key=lambda g: (g.type_name, -g.products_per_row, g.rows)))


def _role(name: str) -> str:
    parts = name.removesuffix(".weight").split(".")
    return ".".join(parts[2:]) if parts[0] == "blk" and len(parts) > 2 else ".".join(parts)


def products_per_row(groups: Iterable[MatmulGroup]) -> int:
    """The int8 products one batch row needs through every matmul of the model."""
    return sum(group.products_per_row for group in groups)


def floor_seconds(
    products: int, instruction: Instruction, per_cycle: float, clock_hz: float, threads: int
) -> float:
    """Seconds ``products`` int8 products take at the instruction's peak on ``threads`` cores."""
    return products / (instruction.products * per_cycle * clock_hz * threads)


def kernel_instruction(features: Mapping[str, str]) -> Instruction:
    """The instruction the Q4 kernels of a CPU library with these features multiply with."""
    if features.get("AVX512_VNNI") == "1":
        return VPDPBUSD_ZMM
    if features.get("AVX_VNNI") == "1":
        return VPDPBUSD_YMM
    return VPMADDUBSW_YMM


def core_name(vendor: str, family: int, model: int) -> str | None:
    """The core of a CPU by its /proc/cpuinfo family and model, where the table knows it."""
    if vendor == "AuthenticAMD":
        if family == 23:
            return "Zen 1" if model < 0x30 else "Zen 2"
        if family == 25:
            return "Zen 4" if model in _ZEN4_MODELS else "Zen 3"
        if family == 26:
            return "Zen 5"
    if vendor == "GenuineIntel" and family == 6:
        if model in _HASWELL_MODELS:
            return "Haswell"
        if model in _SKYLAKE_MODELS:
            return "Skylake"
        if model >= _ICE_LAKE_FIRST_MODEL:
            return "Ice Lake or later"
    return None


# AMD family 25: Zen 4 (Genoa, Raphael, Phoenix, Bergamo ...), the other models are Zen 3.
_ZEN4_MODELS = (
    frozenset(range(0x10, 0x20)) | frozenset(range(0x60, 0x80)) | frozenset(range(0xA0, 0xB0))
)
# Intel family 6: Haswell and Broadwell (vector integer multiplies on port 0 only).
_HASWELL_MODELS = frozenset({60, 63, 69, 70, 61, 71, 79, 86})
# Skylake, Kaby/Coffee/Comet Lake, Cascade Lake.
_SKYLAKE_MODELS = frozenset({78, 85, 94, 142, 158, 165, 166})
_ICE_LAKE_FIRST_MODEL = 106


@dataclass(frozen=True)
class Machine:
    """The CPU as /proc/cpuinfo reports it."""

    model_name: str
    vendor: str
    family: int
    model: int
    mhz: float  # "cpu MHz": the clock the kernel reports, not necessarily the one running
    flags: frozenset[str]

    @property
    def core(self) -> str | None:
        """The core's name in the throughput table, if known."""
        return core_name(self.vendor, self.family, self.model)

    @property
    def vector_extensions(self) -> str:
        """The vector extensions the kernels care about, as /proc/cpuinfo names them."""
        wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")
        return " ".join(flag for flag in (*wanted, "avx_vnni") if flag in self.flags)


def read_machine(cpuinfo: str | None = None) -> Machine:
    """The CPU of this machine (or the one a /proc/cpuinfo text describes)."""
    if cpuinfo is None:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if not key.strip() and fields:
            break  # the first processor is enough
        fields.setdefault(key.strip(), value.strip())
    return Machine(
        fields.get("model name", cpu_model_name()),
        fields.get("vendor_id", ""),
        int(fields.get("cpu family", "0") or 0),
        int(fields.get("model", "0") or 0),
        float(fields.get("cpu MHz", "0") or 0),
        frozenset(fields.get("flags", "").split()),
    )


# Independent chains of each instruction, in assembly so that nothing else runs in the loop:
# 12 chains (more than latency x throughput on any core in the table), `n` rounds of 12.
_PEAK_CHAINS = 12
_PEAK_LOOP = """__attribute__((target("{target}"))) long {name}(long n) {{
    __asm__ volatile("1: {body} dec %0; jnz 1b; vzeroupper" : "+r"(n) : : {clobbers}, "cc");
    return n;
}}
"""
_PEAK_CLOBBERS = ", ".join(f'"xmm{i}"' for i in range(_PEAK_CHAINS + 2))
_PEAK_SOURCE = _PEAK_LOOP.format(
    target="avx2",
    name="maddubs_ymm",
    body=" ".join(f"vpmaddubsw %%ymm12, %%ymm{i}, %%ymm{i};" for i in range(_PEAK_CHAINS)),
    clobbers=_PEAK_CLOBBERS,
) + _PEAK_LOOP.format(
    target="avx512f,avx512vnni",
    name="dpbusd_zmm",
    body=" ".join(f"vpdpbusd %%zmm13, %%zmm12, %%zmm{i};" for i in range(_PEAK_CHAINS)),
    clobbers=_PEAK_CLOBBERS,
)
# The loop of each instruction, and the /proc/cpuinfo flag it needs.
_PEAK_FUNCTIONS = {
    VPMADDUBSW_YMM.name: ("maddubs_ymm", "avx2"),
    VPDPBUSD_ZMM.name: ("dpbusd_zmm", "avx512_vnni"),
}
_PEAK_ROUNDS = 20_000_000  # rounds of 12 instructions per thread: about 0.1-0.5 s


def measured_peak(instruction: Instruction, threads: int, machine: Machine) -> float | None:
    """Instructions per second on ``threads`` threads, measured; None without a C compiler."""
    if instruction.name not in _PEAK_FUNCTIONS:
        return None
    function_name, flag = _PEAK_FUNCTIONS[instruction.name]
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or flag not in machine.flags:
        return None
    with tempfile.TemporaryDirectory() as folder:
        source, library = Path(folder, "peak.c"), Path(folder, "peak.so")
        source.write_text(_PEAK_SOURCE, encoding="utf-8")
        built = subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            return None
        function = getattr(ctypes.CDLL(str(library)), function_name)
        function.restype = ctypes.c_long
        function.argtypes = [ctypes.c_long]
        function(_PEAK_ROUNDS // 10)
        with ThreadPoolExecutor(threads) as pool:
            began = time.perf_counter()
            list(pool.map(function, [_PEAK_ROUNDS] * threads))
            seconds = time.perf_counter() - began
    return threads * _PEAK_ROUNDS * _PEAK_CHAINS / seconds


# --- the child processes -------------------------------------------------------------------


def library_facts() -> dict[str, Any]:
    """The CPU library this process loaded and whether SpecDeck's kernels run in it."""
    info = llama_build_info()
    return {
        "library": f"{info.backend_label}, {_cpu_library_file() or 'its file unknown'}",
        "variant": info.cpu_variant,
        "specdeck_kernels": list(info.specdeck_kernels),
    }


def _cpu_library_file() -> str | None:
    """The path of the ggml CPU library this process loaded (Linux), else None."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if Path(path).name.startswith("libggml-cpu"):
            return path
    return None


CALIBRATION_TEXT = "def measure(batch):\n    return sum(x * x for x in batch)  # calibration\n"
CACHED_TOKENS = 16  # as BatchCosts.calibrate: batches after a short context


def measure(model: Path, rounds: int) -> dict[str, Any]:
    """The pass costs and the matmul times, in one process, alternated round by round.

    The pass is timed as ``BatchCosts.calibrate`` times it (one untimed pass of the largest
    batch, then each size after :data:`CACHED_TOKENS` cached tokens, outliers dropped,
    medians); each matmul group's graphs once per round after the passes, in an order that
    rotates, so that a neighbour's burst on this shared machine lands on both alike.
    """
    from backends.engines.llama import LlamaEngine, LlamaLoadSettings
    from backends.speculation.estimates import BatchCosts
    from tests.ggml_matmul import CpuBackend, ProductGraph, WeightCopies

    threads = physical_cores()  # as the engine takes them (n_threads None)
    settings = LlamaLoadSettings(n_ctx=2048, n_threads=threads, probe_exact_batch=False)
    groups = matmul_groups(read_tensors(model))
    tensors = {tensor.name: tensor for tensor in read_tensors(model)}
    random = np.random.default_rng(0)
    repacked: dict[str, bool] = {}
    copies: dict[str, int] = {}
    pass_timings: dict[int, list[float]] = {size: [] for size in BATCH_SIZES}
    timings: dict[str, dict[int, list[float]]] = {}
    held: list[WeightCopies | ProductGraph] = []
    graphs: dict[tuple[str, int], ProductGraph] = {}
    with LlamaEngine(model, settings) as engine:
        # After the engine started llama.cpp as SpecDeck does (the tiled K-quant matmul only
        # from 64 rows on), so that these products take the kernels a pass takes.
        cpu = CpuBackend(threads)
        words = engine.tokenize(CALIBRATION_TEXT * 8, add_special=False, parse_special=False)
        engine.truncate(0)
        engine.evaluate(words[:CACHED_TOKENS], 1)

        def timed_pass(size: int) -> float:
            engine.truncate(CACHED_TOKENS)
            began = time.perf_counter()
            engine.evaluate(words[CACHED_TOKENS : CACHED_TOKENS + size], size)
            return time.perf_counter() - began

        try:
            for group in groups:
                tensor = tensors[group.first]
                weights = np.memmap(
                    model, dtype=np.uint8, mode="r", offset=tensor.offset, shape=(tensor.nbytes,)
                ).reshape(group.rows, -1)
                repacked[group.key] = cpu.repacks(group.type_id, group.rows, group.cols)
                copies[group.key] = max(1, math.ceil(WORKING_SET_BYTES / group.nbytes))
                stored = WeightCopies(
                    cpu,
                    weights,
                    group.type_id,
                    group.rows,
                    group.cols,
                    repacked[group.key],
                    copies[group.key],
                )
                held.append(stored)
                for size in BATCH_SIZES:
                    graph = ProductGraph(cpu, stored, size)
                    held.append(graph)
                    graph.set_rows(random.standard_normal((size, group.cols), dtype=np.float32))
                    graph.compute()  # pages the weights and the work buffer in
                    graphs[group.key, size] = graph
                timings[group.key] = {size: [] for size in BATCH_SIZES}
            timed_pass(max(BATCH_SIZES))
            order = list(graphs)
            for round_index in range(rounds):
                shift = round_index % len(BATCH_SIZES)
                for size in [*BATCH_SIZES[shift:], *BATCH_SIZES[:shift]]:
                    pass_timings[size].append(timed_pass(size))
                shift = round_index * len(BATCH_SIZES) % len(order)
                for key, size in [*order[shift:], *order[:shift]]:
                    timings[key][size].append(graphs[key, size].compute() / copies[key])
        finally:
            for item in reversed(held):
                item.__exit__()
    costs = BatchCosts.from_timings(pass_timings)
    facts = library_facts()
    return {
        "passes": {
            **facts,
            "threads": threads,
            "seconds": {str(size): costs.seconds[size] for size in BATCH_SIZES},
            "spread": {str(size): costs.spread[size] for size in BATCH_SIZES},
            "dropped": costs.dropped,
        },
        "matmuls": {
            **facts,
            "features": cpu.features,
            "threads": threads,
            "repacked": repacked,
            "copies": copies,
            "seconds_per_tensor": {
                key: {str(size): statistics.median(samples) for size, samples in by_size.items()}
                for key, by_size in timings.items()
            },
        },
    }


def evaluate_loop(model: Path, size: int, seconds: float) -> dict[str, Any]:
    """Batches of ``size`` tokens after 16 cached ones, again and again (for a profiler)."""
    from backends.engines.llama import LlamaEngine, LlamaLoadSettings

    settings = LlamaLoadSettings(n_ctx=2048, probe_exact_batch=False)
    with LlamaEngine(model, settings) as engine:
        words = engine.tokenize(
            "def merge(left, right):\n    return left + right\n" * 8,
            add_special=False,
            parse_special=False,
        )
        engine.evaluate(words[:16], 1)
        batches, began = 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            engine.truncate(16)
            engine.evaluate(words[16 : 16 + size], size)
            batches += 1
        spent = time.perf_counter() - began
    return {**library_facts(), "batches": batches, "ms_per_batch": 1000 * spent / batches}


def run_child(arguments: Sequence[str]) -> dict[str, Any]:
    """The JSON answer of this module run in a fresh process with these arguments."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.row_costs", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the measuring process failed (exit {done.returncode}): {tail}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- the report ----------------------------------------------------------------------------


def type_label(group: MatmulGroup, repacked: Mapping[str, bool]) -> str:
    """A group's weight type as the report sums it: "Q4_K repacked", "Q6_K"."""
    return f"{group.type_name} repacked" if repacked.get(group.key) else group.type_name


def summarize(
    groups: Sequence[MatmulGroup],
    passes: Mapping[str, Any],
    matmuls: Mapping[str, Any],
    machine: Machine,
    peak: float | None,
) -> dict[str, Any]:
    """Every figure of the report, from the two children's measurements."""
    pass_s = {size: float(passes["seconds"][str(size)]) for size in BATCH_SIZES}
    per_tensor = matmuls["seconds_per_tensor"]
    by_type: dict[str, dict[int, float]] = {}
    products_by_type: dict[str, int] = {}
    for group in groups:
        label = type_label(group, matmuls["repacked"])
        products_by_type[label] = products_by_type.get(label, 0) + group.products_per_row
        totals = by_type.setdefault(label, dict.fromkeys(BATCH_SIZES, 0.0))
        for size in BATCH_SIZES:
            totals[size] += group.count * float(per_tensor[group.key][str(size)])
    matmul_s = {size: sum(t[size] for t in by_type.values()) for size in BATCH_SIZES}
    rest_s = {size: pass_s[size] - matmul_s[size] for size in BATCH_SIZES}

    def extra(costs: Mapping[int, float], size: int) -> float:
        return (costs[size] - costs[1]) / (size - 1)

    instruction = kernel_instruction(matmuls["features"])
    threads = int(passes["threads"])
    core = machine.core
    per_cycle = instruction.per_cycle.get(core or "", 1.0)
    products = products_per_row(groups)
    clock_hz = machine.mhz * 1e6
    floor = floor_seconds(products, instruction, per_cycle, clock_hz, threads)
    measured_floor = products / (instruction.products * peak) if peak else None
    weight_bytes = sum(group.nbytes * group.count for group in groups)
    return {
        "machine": {**asdict(machine), "flags": machine.vector_extensions, "core": core},
        "model_products_per_row": products,
        "matmul_weight_bytes": weight_bytes,
        "library": passes["library"],
        "specdeck_kernels": passes["specdeck_kernels"],
        "threads": threads,
        "pass_ms": _ms(pass_s),
        "pass_extra_ms_per_row": {str(s): 1000 * extra(pass_s, s) for s in BATCH_SIZES[1:]},
        "matmul_ms": _ms(matmul_s),
        "rest_ms": _ms(rest_s),
        "by_type_ms": {label: _ms(totals) for label, totals in by_type.items()},
        "by_type_extra_ms_per_row": {
            label: {str(s): 1000 * extra(totals, s) for s in BATCH_SIZES[1:]}
            for label, totals in by_type.items()
        },
        "matmul_extra_ms_per_row": {str(s): 1000 * extra(matmul_s, s) for s in BATCH_SIZES[1:]},
        "floor_ms_per_row_by_type": {
            label: 1000 * floor_seconds(count, instruction, per_cycle, clock_hz, threads)
            for label, count in products_by_type.items()
        },
        "groups": [
            {
                "key": group.key,
                "type": type_label(group, matmuls["repacked"]),
                "count": group.count,
                "roles": list(group.roles),
                "copies_timed": matmuls["copies"][group.key],
                "ms_per_tensor": {
                    str(s): 1000 * float(per_tensor[group.key][str(s)]) for s in BATCH_SIZES
                },
            }
            for group in groups
        ],
        "floor": {
            "instruction": instruction.name,
            "products_per_instruction": instruction.products,
            "per_cycle_per_core": per_cycle,
            "core": core,
            "core_known": core in instruction.per_cycle,
            "reported_mhz": machine.mhz,
            "threads": threads,
            "ms_per_row": 1000 * floor,
            "measured_instructions_per_s": peak,
            "measured_ms_per_row": 1000 * measured_floor if measured_floor else None,
        },
        "single_step_weight_gb_s": weight_bytes / pass_s[1] / 1e9,
    }


def _ms(seconds: Mapping[int, float]) -> dict[str, float]:
    return {str(size): 1000 * value for size, value in seconds.items()}


def print_report(model: Path, report: Mapping[str, Any]) -> None:
    """The report as markdown tables."""
    machine = report["machine"]
    sizes = " / ".join(str(s) for s in BATCH_SIZES)
    extras = " / ".join(str(s) for s in BATCH_SIZES[1:])
    kernels = " ".join(report["specdeck_kernels"]) or "off (llama.cpp's own)"
    print(
        f"{model.name} on {machine['model_name']} (family {machine['family']}, model "
        f"{machine['model']}, {machine['core'] or 'core not in the table'}; "
        f"{machine['flags']}), {report['threads']} threads; CPU library {report['library']}, "
        f"SpecDeck's kernels: {kernels}"
    )
    print()

    def row(values: Mapping[str, float], keys: Sequence[int], digits: int = 1) -> str:
        return " / ".join(f"{values[str(k)]:.{digits}f}" for k in keys)

    floor_ms = report["floor"]["ms_per_row"]
    largest = str(BATCH_SIZES[-1])

    def line(
        name: str, totals: Mapping[str, float], extra: Mapping[str, float], floor: float
    ) -> str:
        return (
            f"| {name} | {row(totals, BATCH_SIZES)} | {row(extra, BATCH_SIZES[1:], 2)} | "
            f"{floor:.2f} | {extra[largest] / floor:.2f} |"
        )

    print(
        f"| ms | batch of {sizes} tokens | extra per row over 1 ({extras}) | "
        f"floor per row | extra row of {largest} / floor |"
    )
    print("|---|---|---|---|---|")
    print(line("forward pass", report["pass_ms"], report["pass_extra_ms_per_row"], floor_ms))
    for label, totals in report["by_type_ms"].items():
        extra = report["by_type_extra_ms_per_row"][label]
        print(line(f"matmuls {label}", totals, extra, report["floor_ms_per_row_by_type"][label]))
    print(line("all matmuls", report["matmul_ms"], report["matmul_extra_ms_per_row"], floor_ms))
    rest_extra = {
        str(s): report["pass_extra_ms_per_row"][str(s)] - report["matmul_extra_ms_per_row"][str(s)]
        for s in BATCH_SIZES[1:]
    }
    print(
        f"| the rest (pass less matmuls) | {row(report['rest_ms'], BATCH_SIZES)} | "
        f"{row(rest_extra, BATCH_SIZES[1:], 2)} | | |"
    )
    print()
    print(f"| matmul group | tensors | ms per tensor, batch of {sizes} | times count, batch of 1 |")
    print("|---|---|---|---|")
    for group in report["groups"]:
        per = group["ms_per_tensor"]
        print(
            f"| {group['key']} ({group['type']}) | {group['count']}: {', '.join(group['roles'])} | "
            f"{' / '.join(f'{per[str(s)]:.3f}' for s in BATCH_SIZES)} | "
            f"{group['count'] * per['1']:.2f} |"
        )
    floor = report["floor"]
    print()
    known = "" if floor["core_known"] else " (core not in the table: 1 per cycle assumed)"
    print(
        f"Compute floor of an extra row: {report['model_products_per_row'] / 1e6:.0f} M int8 "
        f"products (every matmul weight once) with {floor['instruction']}: "
        f"{floor['products_per_instruction']} products x {floor['per_cycle_per_core']:g} per "
        f"cycle per core{known} x {floor['reported_mhz']:.0f} MHz (reported by /proc/cpuinfo) "
        f"x {floor['threads']} threads = {floor['ms_per_row']:.2f} ms per row."
    )
    if floor["measured_instructions_per_s"]:
        print(
            f"Measured peak on {floor['threads']} threads: "
            f"{floor['measured_instructions_per_s'] / 1e9:.2f} G instructions/s, "
            f"a floor of {floor['measured_ms_per_row']:.2f} ms per row."
        )
    for name, peak in report.get("measured_peaks_per_s", {}).items():
        per_cycle = peak / (floor["threads"] * floor["reported_mhz"] * 1e6)
        print(
            f"Measured: {name}: {peak / 1e9:.2f} G/s on {floor['threads']} threads, "
            f"{per_cycle:.2f} per cycle per core at the reported clock."
        )
    measured = floor["measured_ms_per_row"]
    for size in BATCH_SIZES[1:]:
        pass_extra = report["pass_extra_ms_per_row"][str(size)]
        matmul_extra = report["matmul_extra_ms_per_row"][str(size)]
        against_measured = (
            f", {pass_extra / measured:.2f} / {matmul_extra / measured:.2f} x the measured one"
            if measured
            else ""
        )
        print(
            f"Batch of {size}: extra row {pass_extra:.2f} ms (pass), {matmul_extra:.2f} ms "
            f"(matmuls) = {pass_extra / floor['ms_per_row']:.2f} / "
            f"{matmul_extra / floor['ms_per_row']:.2f} x the floor{against_measured}."
        )
    print(
        f"A single step reads {report['matmul_weight_bytes'] / 1e9:.2f} GB of matmul weights: "
        f"{report['single_step_weight_gb_s']:.1f} GB/s."
    )


def main() -> None:
    """Both measurements in child processes, then the report (a table or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the default main")
    parser.add_argument("--rounds", type=int, default=10, help="timings per size, medians kept")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--loop", type=int, default=0, help="evaluate batches of N (profiling)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long --loop runs")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model: Path = args.model or model_path(DEFAULT_MAIN_KEY)
    if args.loop:
        print(json.dumps(evaluate_loop(model, args.loop, args.seconds)))
        return
    if args.child:
        print(json.dumps(measure(model, args.rounds)))
        return
    measured = run_child(["--child", "--model", str(model), "--rounds", str(args.rounds)])
    passes, matmuls = measured["passes"], measured["matmuls"]
    machine = read_machine()
    threads = int(passes["threads"])
    peaks = {item.name: measured_peak(item, threads, machine) for item in INSTRUCTIONS}
    instruction = kernel_instruction(matmuls["features"])
    report = summarize(
        matmul_groups(read_tensors(model)), passes, matmuls, machine, peaks[instruction.name]
    )
    report["measured_peaks_per_s"] = {
        name: peak for name, peak in peaks.items() if peak is not None
    }
    report["variables"] = {
        name: os.environ[name] for name in (CPU_VARIANT_ENV, KERNELS_ENV) if name in os.environ
    }
    if args.json:
        print(json.dumps({"model": model.name, **report}, indent=2))
        return
    print_report(model, report)


if __name__ == "__main__":
    main()
