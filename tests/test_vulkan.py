"""The GPU branch on a real Vulkan device: Mesa's lavapipe, a Vulkan GPU emulated on the CPU.

llama.cpp takes a CPU-type Vulkan device only when ``GGML_VK_VISIBLE_DEVICES`` names it, so
each test runs its engines in a subprocess that names lavapipe (``VK_DRIVER_FILES`` keeps
any other driver out); the rest of the suite never sees it. Lavapipe is slow (a step of the
135M model takes about half a second), so the texts are short. scripts/setup installs
lavapipe and builds the Vulkan backend on Debian and Ubuntu; where it could not, these
tests are skipped and ``test_setup_builds_vulkan_where_it_can`` says why.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backends.engines.hardware import unloaded_gpu_backends
from backends.models.provision import SMALL_TEST_KEY, ensure_model
from backends.paths import CACHE_DIR_ENV
from tests.prestarted import Command

REPO = Path(__file__).resolve().parent.parent
LAVAPIPE_ICD = sorted(glob.glob("/usr/share/vulkan/icd.d/lvp_icd*.json"))


def _vulkan_library() -> Path | None:
    import llama_cpp

    library = Path(llama_cpp.__file__).parent / "lib" / "libggml-vulkan.so"
    return library if library.exists() else None


def lavapipe_found() -> bool:
    """Whether this llama.cpp build has the Vulkan backend and Mesa's lavapipe is installed."""
    return _vulkan_library() is not None and bool(LAVAPIPE_ICD)


needs_lavapipe = pytest.mark.skipif(
    not lavapipe_found(),
    reason="no Vulkan backend in this llama.cpp build or no lavapipe (mesa-vulkan-drivers)",
)


def lavapipe_env(**extra: str) -> dict[str, str]:
    """The environment of a process that sees lavapipe as its one Vulkan GPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_VK_", "VK_"))}
    env |= {
        "VK_DRIVER_FILES": LAVAPIPE_ICD[0],
        "VK_ICD_FILENAMES": LAVAPIPE_ICD[0],  # the name older Vulkan loaders read
        "GGML_VK_VISIBLE_DEVICES": "0",
    }
    return env | extra


# Loads SmolLM2 as a main model (with the exactness probe) or as a draft and prints its load
# report and exact-batch limit as JSON.
_LOAD_ONE = """
import json, sys
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
path, gpu_layers, is_draft = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "draft"
settings = LlamaLoadSettings(n_ctx=512, gpu_layers=gpu_layers, draft_weights="stored")
with LlamaEngine(path, settings, is_draft=is_draft) as engine:
    report = engine.load_report
    print(json.dumps({"placement": report.placement, "notes": list(report.notes),
                      "backend": report.backend, "exact": engine.exact_batch_limit}))
"""


def load_one(model: Path, gpu_layers: int, role: str, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_ONE, str(model), str(gpu_layers), role],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


FIXED_DRAFTS = ("--method", "draft-model", "--fixed-draft", "--draft-max", "4")


def bench_command(gpu_layers: int, method: tuple[str, ...] = FIXED_DRAFTS) -> Command | None:
    """specdeck-bench on lavapipe, SmolLM2 drafting for itself (by default 4 tokens a draft
    every round); run in the background from the session's start (:mod:`tests.prestarted`),
    a minute of lavapipe each. None where there is no lavapipe (the tests say so)."""
    if not lavapipe_found():
        return None
    model = str(ensure_model(SMALL_TEST_KEY))
    args = [sys.executable, "-m", "backends.service.bench", "--main", model, "--draft", model]
    args += ["--draft-weights", "stored", "--gpu-layers", str(gpu_layers), *method]
    args += ["--ctx", "512", "--max-tokens", "12", "--no-warmup", "--json"]
    # A short system prompt instead of SmolLM2's own: 25 prompt tokens, not 38 (a row takes
    # 0.3-0.4 s on lavapipe, Intel Xeon, 2 cores; a run reads the prompt 3 times).
    args += ["--system", "Be brief.", "--prompt", "Count from one to ten in words."]
    return Command(args, env=lavapipe_env(), timeout=600)


def bench_report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The run\'s JSON report, once it is known to have ended well."""
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@needs_lavapipe
@pytest.mark.heavy
@pytest.mark.prestarted(command_of=lambda _scratch: bench_command(-1))
def test_pair_on_the_gpu_verifies_exactly(prestarted: subprocess.CompletedProcess[str]) -> None:
    """Both models on the Vulkan device, verification batches exact: the text is plain's."""
    result = bench_report(prestarted)
    load = result["load"]
    on_gpu = "Vulkan: all 30 layers on GPU (Vulkan0: llvmpipe), KV cache on GPU"
    assert load["main_placement"] == on_gpu
    assert load["draft_placement"] == on_gpu
    assert load["exact_batch_limit"] == 8
    speculative = result["speculative"]
    assert result["identical"] is True
    assert speculative["accepted_draft_tokens_count"] > 0
    # Drafts were checked in batches of several tokens on the GPU, not one at a time.
    assert max(int(size) for size in speculative["verify_batch_counts"]) > 1


@needs_lavapipe
@pytest.mark.heavy
@pytest.mark.prestarted(command_of=lambda _scratch: bench_command(-1, method=("--method", "auto")))
def test_auto_measures_its_costs_on_the_gpu_and_says_where(
    prestarted: subprocess.CompletedProcess[str],
) -> None:
    """auto's cost table is timed on the device the models run on, and the line that says
    what speculation can gain at best there names it: the tuner's explanations use both."""
    result = bench_report(prestarted)
    load = result["load"]
    calibration = load["calibration"]
    assert isinstance(calibration, list)
    assert any(line.startswith("at best on this GPU (Vulkan0: llvmpipe): ") for line in calibration)
    # A software GPU: the calibration is cut to its budget, and says so.
    assert any(line.endswith("to keep within 10 s on a slow device") for line in calibration)
    costs = load["batch_costs_ms"]
    main_costs = costs["at_load"]["main"]
    assert len(main_costs) >= 2
    assert all(ms > 0 for ms in main_costs.values())
    assert result["identical"] is True


@needs_lavapipe
@pytest.mark.heavy
@pytest.mark.prestarted(command_of=lambda _scratch: bench_command(10))
def test_split_main_keeps_the_draft_whole_on_the_gpu(
    prestarted: subprocess.CompletedProcess[str],
) -> None:
    result = bench_report(prestarted)
    load = result["load"]
    # llama.cpp counts the output layer among the 10 it offloads: 9 repeating layers go,
    # and the report says what llama.cpp did, not what was asked.
    assert load["main_placement"].startswith(
        "Vulkan: 9 of 30 layers on GPU (Vulkan0: llvmpipe), 21 on CPU ("
    )
    assert load["main_placement"].endswith("threads), KV cache beside its layers")
    assert load["draft_placement"] == (
        "Vulkan: all 30 layers on GPU (Vulkan0: llvmpipe), KV cache on GPU"
    )
    assert result["identical"] is True


@needs_lavapipe
@pytest.mark.heavy
def test_main_on_the_cpu_and_draft_on_the_gpu(smollm_path: Path) -> None:
    """A small GPU: the main model stays on the CPU (0 layers), the draft goes to the GPU."""
    main = load_one(smollm_path, 0, "main", lavapipe_env())
    draft = load_one(smollm_path, 0, "draft", lavapipe_env())
    assert str(main["placement"]).startswith("Vulkan: all 30 layers on CPU (")
    assert main["exact"] == 63  # the CPU's exact path, as without a GPU
    assert draft["placement"] == (
        "Vulkan: all 30 layers on GPU (Vulkan0: llvmpipe), KV cache on GPU"
    )


@needs_lavapipe
@pytest.mark.heavy
def test_exactness_on_vulkan_comes_from_the_patch(smollm_path: Path) -> None:
    """Without GGML_VK_EXACT_BATCH llama.cpp's own choices differ from a single step at once:
    the probe finds it and verification goes one token at a time, never a false promise."""
    stock = load_one(smollm_path, -1, "main", lavapipe_env(GGML_VK_EXACT_BATCH="0"))
    assert stock["exact"] == 1


# Loads SmolLM2 as a main model on every layer of the GPU and prints the exactness probes
# it ran (batch sizes probed, the limit assumed when all are exact) and the limit found.
_PROBES = """
import json, sys
import backends.engines.llama as llama
probes = []
probe = llama.probe_exact_batch_limit
def recorded(engine, size, ceiling):
    probes.append([size, ceiling])
    return probe(engine, size, ceiling)
llama.probe_exact_batch_limit = recorded
settings = llama.LlamaLoadSettings(n_ctx=512, gpu_layers=-1)
with llama.LlamaEngine(sys.argv[1], settings) as engine:
    print(json.dumps({"probes": probes, "exact": engine.exact_batch_limit}))
"""


def probes_command(scratch: Path) -> Command | None:
    """The probes of a load on lavapipe with ``GGML_VK_EXACT_BATCH=3``, from an empty
    exactness memory (``scratch``): the probe runs, not an answer from an earlier load."""
    if not lavapipe_found():
        return None
    args = [sys.executable, "-c", _PROBES, str(ensure_model(SMALL_TEST_KEY))]
    env = lavapipe_env(GGML_VK_EXACT_BATCH="3", **{CACHE_DIR_ENV: str(scratch)})
    return Command(args, env=env, timeout=300)


@needs_lavapipe
@pytest.mark.heavy
@pytest.mark.prestarted(command_of=probes_command)
def test_the_probe_on_vulkan_stops_one_size_past_the_patch_s_limit(
    prestarted: subprocess.CompletedProcess[str],
) -> None:
    """Batches past GGML_VK_EXACT_BATCH take other shaders: the probe tries one size more
    (a single step of the probe costs 0.41 s on lavapipe) and promises only what it saw."""
    assert prestarted.returncode == 0, prestarted.stderr[-3000:]
    result = json.loads(prestarted.stdout.strip().splitlines()[-1])
    assert result["probes"] == [[4, 4]]
    assert result["exact"] == 3


@needs_lavapipe
@pytest.mark.heavy
def test_without_a_vulkan_device_it_runs_on_the_cpu_and_says_why(smollm_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_VK_", "VK_"))}
    env["VK_DRIVER_FILES"] = env["VK_ICD_FILENAMES"] = "/nonexistent/icd.json"
    main = load_one(smollm_path, -1, "main", env)
    assert main["backend"] == "CPU"
    assert str(main["placement"]).startswith("CPU: all 30 layers on CPU (")
    notes = main["notes"]
    assert isinstance(notes, list)
    assert "Vulkan found no GPU on this machine: running on the CPU" in notes


@needs_lavapipe
@pytest.mark.heavy
def test_a_gpu_too_small_for_the_draft_leaves_it_on_the_cpu(smollm_path: Path) -> None:
    """The GPU's free memory (made 1 MB here) is checked before loading: one line, the CPU."""
    draft = load_one(smollm_path, -1, "draft", lavapipe_env(SPECDECK_GPU_FREE_BYTES="1000000"))
    assert str(draft["placement"]).startswith("Vulkan: all 30 layers on CPU (")
    notes = draft["notes"]
    assert isinstance(notes, list)
    (note,) = (line for line in notes if "GB free" in line)
    assert note.startswith("Vulkan0: llvmpipe has 0.00 GB free, the model needs about 0.")
    assert note.endswith("GB there: loaded on the CPU")


@needs_lavapipe
@pytest.mark.heavy
def test_a_failed_gpu_allocation_loads_the_model_on_the_cpu(smollm_path: Path) -> None:
    """A load on the GPU that fails (made to fail here) is retried on the CPU, never a crash."""
    main = load_one(smollm_path, -1, "main", lavapipe_env(SPECDECK_GPU_LOAD_FAILS="1"))
    assert str(main["placement"]).startswith("Vulkan: all 30 layers on CPU (")
    notes = main["notes"]
    assert isinstance(notes, list)
    assert any(
        line.startswith("the GPU could not hold the model (") and line.endswith("on the CPU")
        for line in notes
    )
    assert main["exact"] == 63


def test_a_backend_that_cannot_load_is_one_line(tmp_path: Path) -> None:
    """A Vulkan backend library whose loader is missing (here: a broken file) is named, with
    the dynamic loader's reason, and the CPU runs."""
    (tmp_path / "libggml-vulkan.so").write_bytes(b"not a shared library")
    (problem,) = unloaded_gpu_backends(str(tmp_path), {"cpu", "rpc"})
    assert problem.startswith("the Vulkan backend is not loaded (")
    assert problem.endswith("): running on the CPU")
    assert "\n" not in problem
    assert unloaded_gpu_backends(str(tmp_path), {"cpu", "vulkan"}) == []


def test_setup_builds_vulkan_where_it_can() -> None:
    """Where the build tools are installed (scripts/setup installs them on Debian), the
    installed llama.cpp has the Vulkan backend: the GPU tests above are not skipped."""
    tools = shutil.which("glslc") and glob.glob("/usr/lib/*/libvulkan.so.1")
    if not tools or not os.path.isdir("/usr/share/cmake/SPIRV-Headers"):
        pytest.skip("no Vulkan build tools here (glslc, libvulkan1, spirv-headers)")
    assert _vulkan_library() is not None, "scripts/setup built llama.cpp without Vulkan"
    assert LAVAPIPE_ICD, "lavapipe (mesa-vulkan-drivers) is missing"
