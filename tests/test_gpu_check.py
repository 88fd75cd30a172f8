"""The GPU check (benchmarks/gpu_check.py) on this machine: random models of a real model's
shapes, the measurements and the prediction, on the CPU and on lavapipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.engines.hardware import VULKAN_EXACT_BATCH
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.models.provision import SMALL_TEST_KEY, ensure_model
from benchmarks import gpu_check
from tests.prestarted import Command
from tests.test_vulkan import lavapipe_env, lavapipe_found, needs_lavapipe

REPO = Path(__file__).resolve().parent.parent


def test_a_random_model_has_the_real_one_s_shapes_types_and_metadata(
    smollm_path: Path, tmp_path: Path
) -> None:
    """Every tensor's name, shape and type and every metadata value (the tokenizer's too) as
    in the real file, about its size, and llama.cpp loads it and computes finite logits."""
    real = gpu_check.read_shapes(smollm_path)
    written = tmp_path / "random.gguf"
    size = gpu_check.write_random_gguf(real, written)
    copy = gpu_check.read_shapes(written)
    assert copy["tensors"] == real["tensors"]
    assert copy["fields"] == real["fields"]
    assert copy["architecture"] == real["architecture"]
    assert abs(size - smollm_path.stat().st_size) < 0.01 * size
    settings = LlamaLoadSettings(n_ctx=256, probe_exact_batch=False)
    with LlamaEngine(written, settings) as engine:
        rows = engine.evaluate([1, 2, 3], 2).copy()  # valid only until the engine closes
    assert rows.shape[0] == 2
    assert np.isfinite(rows).all(), "non-finite logits"
    assert 0.1 < float(np.abs(rows).max()) < 1e3, f"largest logit {np.abs(rows).max()}"


@pytest.mark.parametrize("type_name", sorted(gpu_check._RANDOM_BLOCKS))
def test_random_blocks_are_weights_of_a_trained_layer_s_spread(type_name: str) -> None:
    """Each type's random blocks decode (gguf's own dequantization) to weights centred on
    zero with about WEIGHT_STD of spread: a random model's activations stay where a real
    one's are, inside float16's range on any device."""
    import gguf

    data = gpu_check.random_blocks(type_name, 2048, np.random.default_rng(1))
    weights = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[type_name])
    assert abs(float(weights.mean())) < 0.15 * gpu_check.WEIGHT_STD
    assert 0.8 < float(weights.std()) / gpu_check.WEIGHT_STD < 1.25


def test_a_block_type_it_cannot_fill_stops_with_its_name(tmp_path: Path) -> None:
    shapes = {
        "file": "x.gguf",
        "architecture": "llama",
        "fields": [],
        "tensors": [{"name": "blk.0.ffn_up.weight", "shape": [256, 4], "type": "IQ2_XXS"}],
    }
    with pytest.raises(ValueError, match=r"cannot write random IQ2_XXS blocks \(blk.0.ffn_up"):
        gpu_check.write_random_gguf(shapes, tmp_path / "x.gguf")


def measured(batch_ms: dict[int, float], draft_ms: float) -> dict[str, Any]:
    return {
        "main": {"backend": "a device", "batch_ms": {str(n): ms for n, ms in batch_ms.items()}},
        "draft": {"step_ms": draft_ms},
    }


def test_cheap_batches_predict_more_speed_and_longer_drafts() -> None:
    """With the acceptance measured on the CPU, a GPU-like device (a batch of 16 costs one
    step, a draft step 10 %) predicts more than a CPU-like one (each row a third of a step,
    a draft step 35 %) for every suite prompt, and drafts at least as long."""
    acceptance = json.loads(gpu_check.ACCEPTANCE_FILE.read_text(encoding="utf-8"))
    sizes = range(1, 17)
    gpu = gpu_check.predict(measured({n: 10.0 for n in sizes}, 1.0), acceptance)
    cpu = gpu_check.predict(measured({n: 10.0 + 3.3 * (n - 1) for n in sizes}, 3.5), acceptance)
    assert [row["prompt"] for row in gpu] == [p["name"] for p in acceptance["prompts"]]
    for on_gpu, on_cpu in zip(gpu, cpu, strict=True):
        assert on_gpu["predicted_speedup"] > on_cpu["predicted_speedup"]
        assert on_gpu["best_fixed_speedup"] > on_cpu["best_fixed_speedup"] >= 1.0
        assert on_gpu["best_draft_length"] >= on_cpu["best_draft_length"]
        assert "a device" in on_gpu["explanation"]
    # At flat costs the best fixed length is the longest measured where acceptance is high.
    best = max(gpu, key=lambda row: row["acceptance_rate"])
    assert best["best_draft_length"] >= 4


def check_command(env: dict[str, str] | None, *extra: str) -> Command:
    """``gpu_check run --cpu`` on random models of SmolLM2's shapes, as JSON; run in the
    background from the session's start (:mod:`tests.prestarted`)."""
    model = str(ensure_model(SMALL_TEST_KEY))
    args = [sys.executable, "-m", "benchmarks.gpu_check", "run", "--cpu"]
    args += ["--main", model, "--draft", model, "--json", *extra]
    return Command(args, env=env, timeout=500)


def check_report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The run\'s JSON report, once it is known to have ended well."""
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.heavy
@pytest.mark.prestarted(
    command_of=lambda _scratch: check_command(None, "--timings", "1", "--cached-tokens", "32")
)
def test_the_check_runs_on_this_machine_s_cpu(
    prestarted: subprocess.CompletedProcess[str], smollm_path: Path
) -> None:
    """``run --cpu``: random models of SmolLM2's shapes, every batch size timed, the probe,
    and a prediction for every suite prompt."""
    result = check_report(prestarted)
    main, draft = result["measured"]["main"], result["measured"]["draft"]
    assert list(main["batch_ms"]) == [str(n) for n in gpu_check.BATCH_SIZES]
    assert all(ms > 0 for ms in main["batch_ms"].values())
    assert 1 <= main["exact_batch_limit"] <= gpu_check.PROBE_SIZE
    assert main["probed_to"] == gpu_check.PROBE_SIZE
    assert draft["step_ms"] > 0
    assert "layers on CPU" in main["placement"]
    assert result["main_file"]["shapes_of"] == smollm_path.name
    predicted = result["predicted"]
    assert len(predicted) == len(json.loads(gpu_check.ACCEPTANCE_FILE.read_text())["prompts"])
    assert all(row["predicted_speedup"] > 0 for row in predicted)


def lavapipe_check_command(_scratch: Path) -> Command | None:
    """The check on lavapipe, probing one size past SpecDeck's Vulkan limit (to 16 it took
    85 s more on lavapipe, Intel Xeon, 2 cores)."""
    if not lavapipe_found():
        return None
    probe_max = str(VULKAN_EXACT_BATCH + 1)
    return check_command(
        lavapipe_env(),  # without GGML_VK_EXACT_BATCH: the patch's default
        *("--timings", "1", "--batch-max", "4", "--cached-tokens", "16", "--probe-max", probe_max),
    )


@pytest.mark.heavy
@needs_lavapipe
@pytest.mark.prestarted(command_of=lavapipe_check_command)
def test_the_check_on_lavapipe_puts_both_on_the_gpu_and_finds_the_exact_batches(
    prestarted: subprocess.CompletedProcess[str],
) -> None:
    """On a Vulkan device both random models go fully onto it, and with SpecDeck's Vulkan
    patch batches of up to 8 (its default) are exact: the probe goes one size past, as the
    engine's own probe does on Vulkan."""
    result = check_report(prestarted)
    main, draft = result["measured"]["main"], result["measured"]["draft"]
    assert "layers on GPU (Vulkan0: llvmpipe" in main["placement"]
    assert "layers on GPU (Vulkan0: llvmpipe" in draft["placement"]
    assert main["exact_batch_limit"] == VULKAN_EXACT_BATCH == 8
    assert main["probed_to"] == VULKAN_EXACT_BATCH + 1
    assert list(main["batch_ms"]) == ["1", "2", "3", "4"]


def test_a_probe_of_less_than_two_tokens_is_one_line(smollm_path: Path) -> None:
    command = [sys.executable, "-m", "benchmarks.gpu_check", "run", "--cpu", "--probe-max", "1"]
    command += ["--main", str(smollm_path), "--draft", str(smollm_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith(
        "--probe-max must be at least 2 (a batch of 1 is a single step): 1"
    )
