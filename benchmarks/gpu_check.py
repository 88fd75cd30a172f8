"""The GPU check: SpecDeck's CUDA build, the default pair's shapes on a GPU, what they predict.

Made for a machine with an NVIDIA GPU, CUDA's compiler and no network, to which at most
64 MiB of files travel (the project's H200: 16 cores, about 15 minutes of use), so no
real model goes there. ``pack``, here, puts what it needs in one folder:

- llama-cpp-python's sdist with SpecDeck's patches applied and its version set
  (``build-wheel --prepare``), trimmed of what a CUDA build never reads
  (:data:`UNBUILT_PATHS`);
- the default pair's *shapes*: every metadata key (the tokenizer too) and every tensor's
  name, shape and type, read off the real GGUF files;
- the wheels of the pure-Python packages the check needs there that the image lacks
  (:data:`CARRIED_PACKAGES`).

``run``, there, in one go:

1. builds llama-cpp-python from that patched sdist for CUDA
   (``packaging/llama.cpp/cmake-args --cuda``: the GPU's own architecture, every core);
2. writes GGUF files with random weights of exactly the pair's shapes and tensor types
   (gguf's writer; quantized blocks get random bits and small scales);
3. loads them with all layers on the GPU and measures the main model's batch costs for
   1..32 tokens, the draft's single step, and the exact-batch limit (the largest batch
   whose logits equal single steps bit for bit, probed up to 16);
4. prints the speedup :func:`~backends.service.tuning_prediction.predict_speedup` expects
   there for the acceptance measured on the CPU for ``specdeck-bench --suite``'s prompts
   (``benchmarks/gpu_check_acceptance.json``; at temperature 0 acceptance depends on the
   models, not on the device), and the best fixed draft length for each.

``run --cpu`` skips the build and runs steps 2-4 with the llama-cpp-python installed here
on this machine's backends (the suite runs it so on the small test pair: the check is
never dead code). Results go to stdout as a table, or as JSON with ``--json``.

    .venv/bin/python -m benchmarks.gpu_check pack .gpu-check        (here; 11 MB, git-ignored)
    python3 benchmarks/gpu_check.py run --from .gpu-check [--json]  (there, .gpu-check carried)
    .venv/bin/python -m benchmarks.gpu_check run --cpu [--main FILE --draft FILE] [--json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script on the GPU machine
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

ACCEPTANCE_FILE = ROOT / "benchmarks" / "gpu_check_acceptance.json"
SHAPES_FILE = "pair-shapes.json.gz"
SDIST_FILE = "llama-cpp-python.tar.gz"
WHEELS_FOLDER = "wheels"
# Pure-Python packages the check imports there that the GPU machine's image lacks.
CARRIED_PACKAGES = ("gguf", "diskcache", "platformdirs")
# Folders a CUDA build of llama-cpp-python never reads: llama.cpp's git history, test
# vocabularies, tests, documentation, the server's web page and benches (tests, tools and
# server are off in a subproject),
# and the backends that are built only when named (ggml_add_backend); SpecDeck's patches
# touch the CPU and Vulkan backends, which stay.
UNBUILT_PATHS = (
    ".git",  # the sdist carries llama.cpp's git history (38 MB)
    "vendor/llama.cpp/.git",  # a file naming that history (the patches are in by then)
    "vendor/llama.cpp/models",
    "vendor/llama.cpp/tests",
    "vendor/llama.cpp/docs",
    "vendor/llama.cpp/tools/ui",
    "vendor/llama.cpp/benches",
    *(
        f"vendor/llama.cpp/ggml/src/ggml-{backend}"
        for backend in (
            "cann", "et", "hexagon", "metal", "opencl", "openvino", "sycl", "virtgpu",
            "webgpu", "zdnn", "zendnn",
        )
    ),
)  # fmt: skip
BATCH_SIZES = tuple(range(1, 17)) + (20, 24, 28, 32)
PROBE_SIZE = 16
CACHED_TOKENS = 256  # the batches are timed after this many tokens in the cache (by default)
TIMINGS = 5  # a batch size's cost: the median of this many passes
# Random weights get about this spread, as in trained layers: a 1.5B model's residual stream
# then stays far inside float16's range, which a GPU's kernels may use.
WEIGHT_STD = 0.02


@dataclass(frozen=True)
class RandomBlocks:
    """How random bits become valid blocks of one quantized type (ggml-common.h's layouts).

    A block's weights are ``d * sub_scale * q``, less a minimum in some types. ``d_offset``
    is where the float16 ``d`` sits and ``spread`` the spread of the rest over random bits
    (minimum included), so that ``d = WEIGHT_STD / spread``. A type with a minimum keeps it at
    ``min_offset``, set to ``min_per_d * d``, which centres the weights on zero.
    """

    d_offset: int
    spread: float
    min_offset: int | None = None
    min_per_d: float = 0.0


_RANDOM_BLOCKS: dict[str, RandomBlocks] = {
    "Q4_0": RandomBlocks(0, 4.6),  # d * (q - 8), q in 0..15
    "Q4_1": RandomBlocks(0, 4.6, 2, -7.5),  # d * q + m
    "Q5_0": RandomBlocks(0, 9.2),  # d * (q - 16), q in 0..31
    "Q5_1": RandomBlocks(0, 9.2, 2, -15.5),
    "Q8_0": RandomBlocks(0, 74.0),  # d * q, q an int8
    "Q2_K": RandomBlocks(80, 13.9, 82, 1.5),  # d * scale * q - dmin * min, 4-bit scales, q 0..3
    "Q3_K": RandomBlocks(108, 42.0),  # d * (scale - 32) * (q - 4), 6-bit scales, q 0..7
    "Q4_K": RandomBlocks(0, 260.0, 2, 7.5),  # 6-bit scales and mins, q 0..15
    "Q5_K": RandomBlocks(0, 527.0, 2, 15.5),  # 6-bit scales and mins, q 0..31
    "Q6_K": RandomBlocks(208, 1370.0),  # d * scale * (q - 32), int8 scales, q 0..63
}


# --- the pair's shapes --------------------------------------------------------------------


def read_shapes(path: Path) -> dict[str, Any]:
    """A GGUF file's metadata and tensor list (names, shapes in ggml order, type names)."""
    import gguf

    reader = gguf.GGUFReader(path)
    fields = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or not field.types:
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        fields.append(
            {
                "key": key,
                "type": value_type.name,
                "sub_type": sub_type.name if sub_type is not None else None,
                "value": _plain(field.contents()),
            }
        )
    tensors = [
        {"name": t.name, "shape": [int(n) for n in t.shape], "type": t.tensor_type.name}
        for t in reader.tensors
    ]
    architecture = reader.fields["general.architecture"].contents()
    return {"file": path.name, "architecture": architecture, "fields": fields, "tensors": tensors}


def _plain(value: Any) -> Any:
    """A GGUF value as JSON takes it (numpy scalars and arrays to Python's)."""
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def write_random_gguf(shapes: dict[str, Any], path: Path, seed: int = 0) -> int:
    """Write a GGUF file of ``shapes`` with random weights; its size in bytes.

    Float tensors get normal values of spread :data:`WEIGHT_STD` (norms 1.0); a quantized
    tensor gets random bits with every block's scales (and minimum) set so that its weights
    have about that spread around zero (:data:`_RANDOM_BLOCKS`), so each type's kernels run
    on valid blocks. A type without a known layout stops with its name.
    """
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), shapes["architecture"])
    for field in shapes["fields"]:
        value_type = gguf.GGUFValueType[field["type"]]
        sub_type = gguf.GGUFValueType[field["sub_type"]] if field["sub_type"] else None
        writer.add_key_value(field["key"], field["value"], value_type, sub_type=sub_type)
    for tensor in shapes["tensors"]:
        name, ne, type_name = tensor["name"], tensor["shape"], tensor["type"]
        quant = gguf.GGMLQuantizationType[type_name]
        if quant in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            dtype = np.float32 if quant == gguf.GGMLQuantizationType.F32 else np.float16
            if name.endswith("norm.weight"):
                values = np.ones(tuple(reversed(ne)), dtype=dtype)
            else:
                values = (rng.standard_normal(tuple(reversed(ne))) * WEIGHT_STD).astype(dtype)
            writer.add_tensor(name, values)
            continue
        block_values = gguf.GGML_QUANT_SIZES[quant][0]
        try:
            data = random_blocks(type_name, math.prod(ne) // block_values, rng)
        except ValueError as error:
            raise ValueError(f"{error} ({name})") from None
        row_bytes = ne[0] // block_values * data.shape[1]
        byte_shape = (*reversed(ne[1:]), row_bytes)
        writer.add_tensor(name, data.reshape(byte_shape), raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.stat().st_size


def random_blocks(type_name: str, blocks: int, rng: np.random.Generator) -> np.ndarray:
    """``blocks`` random blocks of a quantized type, one row of bytes each.

    Their weights have a spread of about :data:`WEIGHT_STD` around zero.
    """
    import gguf

    layout = _RANDOM_BLOCKS.get(type_name)
    if layout is None:
        raise ValueError(f"gpu_check cannot write random {type_name} blocks")
    block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][1]
    data = rng.integers(0, 256, size=(blocks, block_bytes), dtype=np.uint8)
    d = WEIGHT_STD / layout.spread
    data[:, layout.d_offset : layout.d_offset + 2] = _float16_bytes(d)
    if layout.min_offset is not None:
        data[:, layout.min_offset : layout.min_offset + 2] = _float16_bytes(layout.min_per_d * d)
    return data


def _float16_bytes(value: float) -> np.ndarray:
    return np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)


# --- measuring ------------------------------------------------------------------------------


def measure_pair(
    main: Path,
    draft: Path,
    gpu_layers: int,
    sizes: Sequence[int],
    timings: int,
    cached_tokens: int = CACHED_TOKENS,
    probe_size: int = PROBE_SIZE,
) -> dict[str, Any]:
    """Load both (the draft always fully on the GPU), then time and probe them.

    The probe tries batches of 2 .. ``probe_size``. The batch costs are auto's own
    calibration (:meth:`BatchCosts.calibrate`: ``timings`` interleaved rounds, medians,
    outliers dropped), after ``cached_tokens`` in the cache.
    """
    from backends.engines.interface import probe_exact_batch_limit
    from backends.engines.llama import LlamaEngine, LlamaLoadSettings
    from backends.speculation.estimates import BatchCosts

    settings = LlamaLoadSettings(n_ctx=1024, gpu_layers=gpu_layers, probe_exact_batch=False)
    with LlamaEngine(main, settings) as engine:
        report = engine.load_report
        limit = probe_exact_batch_limit(engine, probe_size, probe_size)
        costs = BatchCosts.calibrate(
            engine, sizes, timings, context=cached_tokens, budget_seconds=None
        )
        main_facts = {
            "placement": report.placement,
            "backend": report.backend_in_use,
            "exact_batch_limit": limit,
            "probed_to": probe_size,
            "batch_ms": {str(size): 1000 * s for size, s in sorted(costs.seconds.items())},
        }
    with LlamaEngine(draft, settings, is_draft=True) as engine:
        report = engine.load_report
        step = BatchCosts.calibrate(engine, (1,), timings, context=cached_tokens).cost(1)
        draft_facts = {
            "placement": report.placement,
            "backend": report.backend_in_use,
            "step_ms": 1000 * step,
        }
    return {"main": main_facts, "draft": draft_facts}


# --- predicting -----------------------------------------------------------------------------


def predict(measured: dict[str, Any], acceptance: dict[str, Any]) -> list[dict[str, Any]]:
    """Per suite prompt, what these costs predict.

    What predict_speedup expects from the CPU run's rounds, and the best fixed draft length
    with these costs (E(k) / (k·c + verify(k+1)), Leviathan et al. eq. 1).
    """
    from backends.service.tuning_prediction import expected_tokens, predict_speedup
    from backends.speculation.types import SpeculationStats

    batch_ms = {int(size): ms for size, ms in measured["main"]["batch_ms"].items()}
    step_ms = batch_ms[1]
    verify_cost = verify_cost_from(batch_ms)
    draft_step = measured["draft"]["step_ms"] / 1000
    rows = []
    for prompt in acceptance["prompts"]:
        stats = SpeculationStats.from_dict(prompt["stats"])
        # Drafting as it would run there: the drafted tokens at the draft's measured step.
        stats = replace(stats, draft_seconds=stats.total_draft_tokens_count * draft_step)
        prediction = predict_speedup(
            stats,
            step_ms / 1000,
            verify_cost,
            draft_name=acceptance.get("draft", "draft"),
            draft_step_seconds=draft_step,
            draft_forward_cost=draft_step / (step_ms / 1000),
            device=measured["main"]["backend"],
        )
        rates = [rate if rate is not None else 0.0 for rate in stats.acceptance_by_position]
        step_cost = draft_step / (step_ms / 1000)
        best_length, best = 0, 1.0
        for length in range(1, len(rates) + 1):
            if length + 1 not in batch_ms:
                break
            speedup = expected_tokens(rates, length) / (
                length * step_cost + verify_cost(length + 1)
            )
            if speedup > best:
                best_length, best = length, speedup
        rows.append(
            {
                "prompt": prompt["name"],
                "acceptance_rate": stats.acceptance_rate,
                "predicted_speedup": round(prediction.speedup, 3) if prediction else None,
                "explanation": prediction.explanation if prediction else "nothing drafted",
                "best_draft_length": best_length,
                "best_fixed_speedup": round(best, 3),
            }
        )
    return rows


def verify_cost_from(batch_ms: dict[int, float]) -> Callable[[int], float]:
    """Evaluating n tokens in main model steps, from measured batch costs (interpolated)."""
    from backends.speculation.estimates import BatchCosts

    costs = BatchCosts(seconds={size: ms / 1000 for size, ms in batch_ms.items()})
    return lambda rows: costs.cost(rows) / costs.cost(1)


def measure_acceptance(draft_max: int) -> dict[str, Any]:
    """The default pair's acceptance on the suite prompts, here, drafting ``draft_max`` a round.

    Temperature 0, the draft model alone at a fixed length with no confidence cut (p-min 0),
    so that every position up to ``draft_max`` is measured: what the prediction needs.
    """
    from backends.engines.interface import ChatMessage
    from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
    from backends.service.loaded_pair import open_pair
    from backends.service.pair_runs import timed_run
    from backends.service.protocol import LoadRequest
    from backends.service.suite_prompts import SUITE_PROMPTS
    from backends.speculation.methods import build_decoder
    from backends.speculation.sampling import SamplingSettings
    from backends.speculation.types import GenerationSettings
    from benchmarks.row_costs import read_machine

    main, draft = model_path(DEFAULT_MAIN_KEY), model_path(DEFAULT_DRAFT_KEY)
    request = LoadRequest(str(main), str(draft), method="draft-model")
    prompts = []
    with open_pair(request) as pair:
        assert pair.draft is not None
        decoder = build_decoder("draft-model", pair.main, pair.draft, adaptive=False, p_min=0.0)
        for prompt in SUITE_PROMPTS:
            tokens = decoder.prompt_tokens([ChatMessage("user", prompt.text)])
            settings = GenerationSettings(
                max_tokens=prompt.max_tokens,
                sampling=SamplingSettings(temperature=0.0),
                draft_max=draft_max,
                p_min=0.0,
            )
            stats = timed_run(decoder, (pair.main, pair.draft), tokens, settings).stats
            prompts.append({"name": prompt.key, "stats": stats.as_dict()})
    machine = read_machine()
    core = machine.core or f"family {machine.family}"
    cpu = f"{machine.model_name} ({core}: {machine.vector_extensions})"
    return {
        "measured_on": f"{cpu}, {time.strftime('%Y-%m-%d')}",
        "command": f"python -m benchmarks.gpu_check acceptance --draft-max {draft_max}",
        "main": main.name,
        "draft": draft.name,
        "prompts": prompts,
    }


# --- pack and build -------------------------------------------------------------------------


def llama_cpp_version() -> str:
    """The pinned llama-cpp-python version (pyproject.toml)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    marker = '"llama-cpp-python=='
    start = text.index(marker) + len(marker)
    return text[start : text.index('"', start)]


def pack(folder: Path) -> dict[str, int]:
    """Put the trimmed sdist, the default pair's shapes and the carried wheels in ``folder``."""
    from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path

    folder.mkdir(parents=True, exist_ok=True)
    version = llama_cpp_version()
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
             ":all:", f"llama-cpp-python=={version}", "-d", work],
            check=True,
        )  # fmt: skip
        with tarfile.open(Path(work) / f"llama_cpp_python-{version}.tar.gz") as archive:
            archive.extractall(work, filter="data")
        source = Path(work) / f"llama_cpp_python-{version}"
        # Patched and versioned here: the GPU machine may have no git to apply them with.
        subprocess.run(
            [str(ROOT / "packaging/llama.cpp/build-wheel"), "--prepare", str(source)], check=True
        )
        for unbuilt in map(source.joinpath, UNBUILT_PATHS):
            if unbuilt.is_dir():
                shutil.rmtree(unbuilt)
            else:
                unbuilt.unlink()
        with tarfile.open(folder / SDIST_FILE, "w:gz", compresslevel=9) as archive:
            archive.add(source, arcname=source.name)
    shapes = {
        "main": read_shapes(model_path(DEFAULT_MAIN_KEY)),
        "draft": read_shapes(model_path(DEFAULT_DRAFT_KEY)),
    }
    with gzip.open(folder / SHAPES_FILE, "wt", encoding="utf-8") as handle:
        json.dump(shapes, handle)
    wheels = folder / WHEELS_FOLDER
    wheels.mkdir(exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "-d", str(wheels), *CARRIED_PACKAGES],
        check=True,
    )  # fmt: skip
    return {path.name: path.stat().st_size for path in sorted(folder.rglob("*")) if path.is_file()}


def build_cuda_wheel(folder: Path, work: Path) -> Path:
    """Build llama-cpp-python for CUDA from the carried sdist (patched by pack); the wheel."""
    with tarfile.open(folder / SDIST_FILE) as archive:
        archive.extractall(work, filter="data")
    source = next(work.glob("llama_cpp_python-*"))  # patched by pack
    arguments = subprocess.run(
        [str(ROOT / "packaging/llama.cpp/cmake-args"), "native", str(work / "cache"), "--cuda",
         sys.executable],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    environment = {
        **os.environ,
        "CMAKE_ARGS": arguments,
        "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2),
    }
    wheels = work / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(source)],
        check=True, env=environment,
    )  # fmt: skip
    return next(wheels.glob("llama_cpp_python-*.whl"))


def install_for_this_run(wheel: Path, folder: Path) -> None:
    """Install the built wheel (as scripts/setup does) and the carried ones into this Python."""
    subprocess.run(
        [str(ROOT / "packaging/llama.cpp/install-wheel"), sys.executable, str(wheel)], check=True
    )
    carried = sorted(str(path) for path in (folder / WHEELS_FOLDER).glob("*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", *carried],
        check=True,
    )


# --- the command ------------------------------------------------------------------------


def run(arguments: argparse.Namespace) -> dict[str, Any]:
    """Steps 1-4 (1 only without ``--cpu``); the figures as one dict."""
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="specdeck-gpu-check-") as scratch:
        work = Path(scratch)
        if not arguments.cpu:
            began = time.perf_counter()
            wheel = build_cuda_wheel(arguments.from_folder, work)
            result["build_seconds"] = round(time.perf_counter() - began, 1)
            install_for_this_run(wheel, arguments.from_folder)
        if arguments.main and arguments.draft:
            shapes = {"main": read_shapes(arguments.main), "draft": read_shapes(arguments.draft)}
        else:
            with gzip.open(arguments.from_folder / SHAPES_FILE, "rt", encoding="utf-8") as handle:
                shapes = json.load(handle)
        files = {}
        for role in ("main", "draft"):
            files[role] = work / f"random-{role}.gguf"
            size = write_random_gguf(shapes[role], files[role], seed=len(role))
            result[f"{role}_file"] = {"shapes_of": shapes[role]["file"], "bytes": size}
        sizes = [size for size in BATCH_SIZES if size <= arguments.batch_max]
        result["cached_tokens"] = arguments.cached_tokens
        result["measured"] = measure_pair(
            files["main"],
            files["draft"],
            arguments.gpu_layers,
            sizes,
            arguments.timings,
            arguments.cached_tokens,
            arguments.probe_max,
        )
    acceptance = json.loads(arguments.acceptance.read_text(encoding="utf-8"))
    result["acceptance_from"] = acceptance["measured_on"]
    result["predicted"] = predict(result["measured"], acceptance)
    return result


def print_report(result: dict[str, Any]) -> None:
    """The figures as a short text report."""
    measured = result["measured"]
    if "build_seconds" in result:
        print(f"CUDA build: {result['build_seconds']:.0f} s")
    for role in ("main", "draft"):
        facts = measured[role]
        made = result[f"{role}_file"]
        megabytes = made["bytes"] / 1e6
        print(f"{role}: random weights shaped as {made['shapes_of']} ({megabytes:.0f} MB)")
        print(f"  {facts['placement']}")
    main = measured["main"]
    print(f"exact batches up to {main['exact_batch_limit']} tokens (probed to {main['probed_to']})")
    costs = main["batch_ms"]
    step = costs["1"]
    print(f"main model, a batch of n tokens after {result['cached_tokens']}: ms (in single steps)")
    print("  " + "  ".join(f"{n}: {ms:.2f} ({ms / step:.2f})" for n, ms in costs.items()))
    draft_ms = measured["draft"]["step_ms"]
    print(f"draft step: {draft_ms:.2f} ms ({draft_ms / step:.0%} of a main step)")
    print(f"predicted, with the acceptance measured on {result['acceptance_from']}:")
    for row in result["predicted"]:
        print(
            f"  {row['prompt']}: {row['predicted_speedup']}x as the CPU run's rounds would go; "
            f"best fixed draft {row['best_draft_length']} tokens: {row['best_fixed_speedup']}x"
        )
        print(f"    {row['explanation']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="gather what the GPU machine needs (here)")
    packing.add_argument("folder", type=Path)
    running = commands.add_parser("run", help="build, write, measure, predict")
    running.add_argument("--from", dest="from_folder", type=Path, default=None)
    running.add_argument("--cpu", action="store_true", help="no build: this machine's library")
    running.add_argument("--main", type=Path, default=None, help="shapes of this GGUF file")
    running.add_argument("--draft", type=Path, default=None, help="shapes of this GGUF file")
    running.add_argument("--gpu-layers", type=int, default=-1)
    running.add_argument("--acceptance", type=Path, default=ACCEPTANCE_FILE)
    running.add_argument("--timings", type=int, default=TIMINGS, help="passes a batch size")
    running.add_argument("--batch-max", type=int, default=BATCH_SIZES[-1])
    running.add_argument(
        "--probe-max", type=int, default=PROBE_SIZE, help="largest batch probed for exactness"
    )
    running.add_argument(
        "--cached-tokens", type=int, default=CACHED_TOKENS, help="in the cache when timed"
    )
    running.add_argument("--json", action="store_true")
    accepting = commands.add_parser("acceptance", help="measure the default pair's acceptance here")
    accepting.add_argument("--draft-max", type=int, default=8)
    arguments = parser.parse_args()
    if arguments.command == "acceptance":
        measured = measure_acceptance(arguments.draft_max)
        ACCEPTANCE_FILE.write_text(json.dumps(measured, indent=1) + "\n", encoding="utf-8")
        for prompt in measured["prompts"]:
            print(f"{prompt['name']}: {prompt['stats']['acceptance_rate']:.0%} accepted")
        return
    if arguments.command == "pack":
        for name, size in pack(arguments.folder).items():
            print(f"{size / 1e6:8.1f} MB  {name}")
        return
    if not arguments.cpu and arguments.from_folder is None:
        parser.error("run needs --from FOLDER (made by pack), or --cpu")
    if arguments.probe_max < 2:
        parser.error(
            f"--probe-max must be at least 2 (a batch of 1 is a single step): {arguments.probe_max}"
        )
    if (arguments.main is None) != (arguments.draft is None):
        parser.error("--main and --draft go together")
    if arguments.from_folder is None and arguments.main is None:
        parser.error("run --cpu needs --main and --draft, or --from FOLDER")
    result = run(arguments)
    if arguments.json:
        print(json.dumps(result, indent=1))
    else:
        print_report(result)


if __name__ == "__main__":
    main()
