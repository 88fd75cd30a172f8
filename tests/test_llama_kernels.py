"""SpecDeck's CPU kernels (packaging/llama.cpp/fast-kernels.patch) against llama.cpp's own path.

Random blocks of each type a SpecDeck kernel serves go through one matrix product of the
installed llama.cpp's CPU backend, as batches of 1..17 rows (a verification batch: 16 drafted
tokens and one more) with the kernels on, and every row alone with them off: llama.cpp's own
single-token path (the repacked GEMV for Q4_K and Q4_0, ``vec_dot`` for Q6_K). Every row of
every batch must be that row's single-token result, bit for bit. The kernels are switched by
``GGML_CPU_SPECDECK_KERNELS``, read once per process: each side runs in a child process
(tests/ggml_matmul.py).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from tests.llama_headers import enum_values, header

if TYPE_CHECKING:
    from collections.abc import Mapping

ROOT = Path(__file__).resolve().parents[1]
BATCH_ROWS = 17
N_IN = 2048  # 8 superblocks of 256, 64 blocks of 32
N_OUT = 40  # 5 groups of 8 repacked rows; not a multiple of 16 (the chunk size)
SEED = 20261203


# (case, ggml type, bytes per block, values per block, fp16 scale offsets, repacked)
CASES = (
    ("q4_K", "GGML_TYPE_Q4_K", 144, 256, (0, 2), True),  # d, dmin, scales[12], qs[128]
    ("q4_0", "GGML_TYPE_Q4_0", 18, 32, (0,), True),  # d, qs[16]
    ("q6_K", "GGML_TYPE_Q6_K", 210, 256, (208,), False),  # ql[128], qh[64], scales[16], d
)
# The repacked cases' blocks again, in llama.cpp's plain buffer: their vec_dot rounds unlike
# the repacked GEMV, which shows that the repacked cases really take the repacked path.
UNPACKED = tuple(f"{case[0]}_plain" for case in CASES if case[-1])
KERNEL_TYPES = "Q4_K Q4_0 Q6_K"

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or sys.platform != "linux",
    reason="SpecDeck's kernels are x86 (AVX2 / AVX-512) code in the Linux build",
)


def _random_blocks(
    rng: np.random.Generator, block_bytes: int, block_values: int, scales: tuple[int, ...]
) -> np.ndarray:
    """Weight rows of random blocks: every quant and sub-scale byte random, finite fp16 scales."""
    blocks = N_IN // block_values
    raw = rng.integers(0, 256, size=(N_OUT, blocks, block_bytes), dtype=np.uint8)
    for offset in scales:  # d (either sign), then Q4_K's dmin
        magnitude = rng.uniform(1e-4, 4e-2, size=(N_OUT, blocks))
        sign = np.where(rng.random((N_OUT, blocks)) < 0.5, -1.0, 1.0) if offset == scales[0] else 1
        raw[:, :, offset : offset + 2] = (
            (magnitude * sign).astype(np.float16).view(np.uint8).reshape(N_OUT, blocks, 2)
        )
    return raw.reshape(N_OUT, blocks * block_bytes)


def _inputs(path: Path) -> None:
    rng = np.random.default_rng(SEED)
    ggml_types = enum_values(header("ggml.h"), "ggml_type")
    arrays: dict[str, np.ndarray] = {}
    for name, kind, block_bytes, block_values, scales, repack in CASES:
        arrays[f"{name}.weights"] = _random_blocks(rng, block_bytes, block_values, scales)
        arrays[f"{name}.type"] = np.array(ggml_types[kind])
        arrays[f"{name}.repack"] = np.array(repack)
    for name in UNPACKED:
        repacked = name.removesuffix("_plain")
        arrays[f"{name}.weights"] = arrays[f"{repacked}.weights"]
        arrays[f"{name}.type"] = arrays[f"{repacked}.type"]
        arrays[f"{name}.repack"] = np.array(False)
    # Activation rows of different sizes, a few large values among them.
    scale = 10.0 ** rng.uniform(-2, 2, size=(BATCH_ROWS, 1))
    activations = rng.standard_normal((BATCH_ROWS, N_IN)) * scale
    activations[rng.random((BATCH_ROWS, N_IN)) < 0.002] *= 50
    arrays["activations"] = activations.astype(np.float32)
    np.savez(path, **arrays)  # type: ignore[arg-type]


def _products(inputs: Path, outputs: Path, kernels: str) -> Mapping[str, np.ndarray]:
    env = {
        **os.environ,
        "GGML_CPU_SPECDECK_KERNELS": kernels,
        # As SpecDeck runs llama.cpp (backends/engines/llama.py): the tiled K-quant matmul
        # only from 64 rows on, so that these batches take the kernels under test.
        "GGML_CPU_TILED_MM_MIN_ROWS": "64",
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.ggml_matmul", str(inputs), str(outputs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(np.load(outputs))


@pytest.fixture(scope="module")
def products(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Mapping[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("kernels")
    _inputs(folder / "inputs.npz")
    return {
        kernels: _products(folder / "inputs.npz", folder / f"{kernels}.npz", kernels)
        for kernels in ("0", "1")
    }


def _kernels_listed(features: np.ndarray) -> str | None:
    for feature in features:
        name, _, value = str(feature).partition(" = ")
        if name == "SPECDECK_KERNELS":
            return value
    return None


def _has_avx2() -> bool:
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        return any(line.startswith("flags") and " avx2" in line for line in cpuinfo)


def test_the_cpu_backend_runs_specdecks_kernels_only_when_asked(
    products: dict[str, Mapping[str, np.ndarray]],
) -> None:
    if not _has_avx2():
        pytest.skip("SpecDeck's kernels need AVX2, which this CPU lacks")
    assert _kernels_listed(products["1"]["features"]) == KERNEL_TYPES, (
        "the installed llama.cpp is not SpecDeck's build: run scripts/setup"
    )
    assert _kernels_listed(products["0"]["features"]) is None


@pytest.mark.parametrize("unpacked", UNPACKED)
def test_repacked_weights_take_llama_cpps_repacked_path(
    products: dict[str, Mapping[str, np.ndarray]], unpacked: str
) -> None:
    if not _has_avx2():
        pytest.skip("llama.cpp repacks Q4_K and Q4_0 on x86 only with AVX2")
    stock = products["0"]
    case = unpacked.removesuffix("_plain")
    repacked, plain = stock[f"{case}.alone"], stock[f"{unpacked}.alone"]
    assert np.allclose(repacked, plain, rtol=1e-4, atol=1e-3 * np.abs(plain).max())
    assert not np.array_equal(repacked.view(np.uint32), plain.view(np.uint32)), (
        f"{case} weights in CPU_REPACK computed as unpacked ones: were they repacked?"
    )


def _differing(rows: np.ndarray, expected: np.ndarray) -> list[str]:
    """The rows whose float32 bits differ, and by how much at most."""
    found = []
    for index, (row, want) in enumerate(zip(rows, expected, strict=True)):
        if not np.array_equal(row.view(np.uint32), want.view(np.uint32)):
            worst = float(np.max(np.abs(row.astype(np.float64) - want)))
            found.append(f"row {index} (largest difference {worst:g})")
    return found


@pytest.mark.parametrize("case", [case[0] for case in CASES])
def test_every_row_of_every_batch_is_llama_cpps_single_token_result(
    products: dict[str, Mapping[str, np.ndarray]], case: str
) -> None:
    if not _has_avx2():
        pytest.skip("SpecDeck's kernels need AVX2, which this CPU lacks")
    single_steps = products["0"][f"{case}.alone"]  # llama.cpp's own path, a row at a time
    assert single_steps.shape == (BATCH_ROWS, N_OUT)
    assert np.isfinite(single_steps).all()
    assert np.count_nonzero(single_steps) == single_steps.size
    kernels = products["1"]
    problems = [
        f"batch of {n}: {', '.join(rows)}"
        for n in range(1, BATCH_ROWS + 1)
        if (rows := _differing(kernels[f"{case}.batch.{n}"], single_steps[:n]))
    ]
    assert not problems, f"{case} rows differ from single-token steps: " + "; ".join(problems)
