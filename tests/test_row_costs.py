"""Tests for benchmarks/row_costs.py's pure parts: the model's matmuls by type, the floor."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from backends.models.gguf_info import TensorInfo, read_tensors
from benchmarks.row_costs import (
    VPDPBUSD_YMM,
    VPDPBUSD_ZMM,
    VPMADDUBSW_YMM,
    MatmulGroup,
    core_name,
    floor_seconds,
    kernel_instruction,
    matmul_groups,
    print_report,
    products_per_row,
    read_machine,
    summarize,
)

# SmolLM2-135M: 30 layers, 576 values per token, 1536 in the feed-forward layer, 3 KV heads
# of 64, a 49152-token vocabulary whose embedding is also the output layer.
SMOL_LAYERS, SMOL_WIDTH, SMOL_FFN, SMOL_KV, SMOL_VOCAB = 30, 576, 1536, 192, 49152

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
cpu MHz\t\t: 2596.148
flags\t\t: fpu avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
cpu MHz\t\t: 1.0
"""


def tensor(name: str, cols: int, rows: int, kind: GGMLQuantizationType) -> TensorInfo:
    """A tensor's header entry (its data's place is irrelevant here)."""
    return TensorInfo(name, cols * rows, kind, 0, (cols, rows), 0)


def test_smollm_matmuls_by_type_and_shape(smollm_path: Path) -> None:
    groups = {group.key: group for group in matmul_groups(read_tensors(smollm_path))}

    assert groups["Q4_1 1536x576"].count == 2 * SMOL_LAYERS
    assert groups["Q4_1 1536x576"].roles == ("ffn_gate", "ffn_up")
    assert groups["Q4_1 576x1536"].roles == ("ffn_down",)
    assert groups["Q4_1 192x576"].roles == ("attn_k", "attn_v")
    # Tied embeddings: the token embedding is the output layer, counted once.
    assert groups["Q8_0 49152x576"].roles == ("output (tied token_embd)",)
    assert groups["Q8_0 49152x576"].count == 1
    assert sum(group.count for group in groups.values()) == 7 * SMOL_LAYERS + 1
    per_layer = 2 * SMOL_WIDTH * SMOL_WIDTH + 2 * SMOL_KV * SMOL_WIDTH + 3 * SMOL_FFN * SMOL_WIDTH
    expected = SMOL_LAYERS * per_layer + SMOL_VOCAB * SMOL_WIDTH
    assert products_per_row(groups.values()) == expected


def test_an_untied_embedding_is_only_looked_up() -> None:
    tensors = [
        tensor("token_embd.weight", 1536, 151936, GGMLQuantizationType.Q4_K),
        tensor("output.weight", 1536, 151936, GGMLQuantizationType.Q6_K),
        TensorInfo("output_norm.weight", 1536, GGMLQuantizationType.F32, 0, (1536,), 0),
        tensor("blk.0.ffn_down.weight", 8960, 1536, GGMLQuantizationType.Q6_K),
        tensor("blk.1.ffn_down.weight", 8960, 1536, GGMLQuantizationType.Q4_K),
        tensor("blk.1.ffn_up.weight", 1536, 8960, GGMLQuantizationType.Q4_K),
    ]
    groups = matmul_groups(tensors)

    assert [(g.key, g.count, g.roles) for g in groups] == [
        ("Q4_K 1536x8960", 1, ("ffn_down",)),
        ("Q4_K 8960x1536", 1, ("ffn_up",)),
        ("Q6_K 151936x1536", 1, ("output",)),
        ("Q6_K 1536x8960", 1, ("ffn_down",)),
    ]


def test_the_floor_of_a_row() -> None:
    products = 1_543_700_000  # Qwen2.5-Coder-1.5B's matmul weights
    clock = 2596.148e6
    zen4_avx2 = floor_seconds(products, VPMADDUBSW_YMM, 2.0, clock, 2)

    assert zen4_avx2 == pytest.approx(products / (32 * 2 * clock * 2))
    assert 1000 * zen4_avx2 == pytest.approx(4.645, abs=0.001)
    # Zen 4 starts one 512-bit vpdpbusd per cycle: as many products as two vpmaddubsw.
    assert floor_seconds(products, VPDPBUSD_ZMM, 1.0, clock, 2) == pytest.approx(zen4_avx2)
    haswell = VPMADDUBSW_YMM.per_cycle["Haswell"]
    assert floor_seconds(products, VPMADDUBSW_YMM, haswell, clock, 2) == pytest.approx(
        2 * zen4_avx2
    )
    assert floor_seconds(products, VPMADDUBSW_YMM, 2.0, clock, 1) == pytest.approx(2 * zen4_avx2)


@pytest.mark.parametrize(
    ("vendor", "family", "model", "core"),
    [
        ("AuthenticAMD", 25, 17, "Zen 4"),  # EPYC Genoa: the "EPYC Zen 4" machine
        ("AuthenticAMD", 25, 1, "Zen 3"),  # EPYC Milan
        ("AuthenticAMD", 23, 1, "Zen 1"),  # EPYC Naples: the "EPYC Zen 1 (AVX2)" machine
        ("AuthenticAMD", 26, 2, "Zen 5"),
        ("GenuineIntel", 6, 63, "Haswell"),
        ("GenuineIntel", 6, 85, "Skylake"),
        ("GenuineIntel", 6, 143, "Ice Lake or later"),  # Sapphire Rapids
        ("GenuineIntel", 15, 4, None),
        ("HygonGenuine", 24, 0, None),
    ],
)
def test_cores(vendor: str, family: int, model: int, core: str | None) -> None:
    assert core_name(vendor, family, model) == core


def test_the_machine_from_cpuinfo() -> None:
    machine = read_machine(CPUINFO)

    assert (machine.vendor, machine.family, machine.model) == ("AuthenticAMD", 25, 17)
    assert machine.mhz == pytest.approx(2596.148)
    assert machine.core == "Zen 4"
    assert machine.vector_extensions == "avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni"


def test_the_instruction_of_a_library() -> None:
    assert kernel_instruction({"AVX2": "1", "AVX512_VNNI": "1"}) is VPDPBUSD_ZMM
    assert kernel_instruction({"AVX2": "1", "AVX_VNNI": "1"}) is VPDPBUSD_YMM
    assert kernel_instruction({"AVX2": "1", "AVX512": "1"}) is VPMADDUBSW_YMM


def test_the_report_splits_a_pass_into_matmuls_and_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    groups = (
        MatmulGroup("Q4_K", 12, 8960, 1536, 2, ("ffn_up",), "blk.0.ffn_up.weight", 1000),
        MatmulGroup("Q6_K", 14, 1536, 8960, 1, ("ffn_down",), "blk.0.ffn_down.weight", 500),
    )
    passes = {
        "library": "CPU (haswell)",
        "specdeck_kernels": ["Q4_K"],
        "threads": 2,
        "seconds": {"1": 0.020, "2": 0.030, "4": 0.050, "8": 0.090},
    }
    matmuls = {
        "features": {"AVX2": "1"},
        "repacked": {"Q4_K 8960x1536": True, "Q6_K 1536x8960": False},
        "copies": {"Q4_K 8960x1536": 3, "Q6_K 1536x8960": 5},
        "seconds_per_tensor": {
            "Q4_K 8960x1536": {"1": 0.004, "2": 0.005, "4": 0.008, "8": 0.014},
            "Q6_K 1536x8960": {"1": 0.002, "2": 0.004, "4": 0.006, "8": 0.010},
        },
    }
    machine = read_machine(CPUINFO)

    report = summarize(groups, passes, matmuls, machine, None)

    assert report["by_type_ms"]["Q4_K repacked"]["4"] == pytest.approx(16.0)
    assert report["by_type_ms"]["Q6_K"]["4"] == pytest.approx(6.0)
    assert report["matmul_ms"]["1"] == pytest.approx(10.0)
    assert report["rest_ms"]["8"] == pytest.approx(90.0 - 38.0)
    assert report["pass_extra_ms_per_row"]["4"] == pytest.approx(10.0)
    assert report["matmul_extra_ms_per_row"]["8"] == pytest.approx((38.0 - 10.0) / 7)
    assert report["floor"]["instruction"] == VPMADDUBSW_YMM.name
    assert report["floor"]["per_cycle_per_core"] == 2.0
    products = 2 * 8960 * 1536 + 1536 * 8960
    assert report["floor"]["ms_per_row"] == pytest.approx(
        1000 * products / (32 * 2.0 * 2596.148e6 * 2)
    )
    assert report["floor_ms_per_row_by_type"]["Q6_K"] == pytest.approx(
        1000 * 1536 * 8960 / (32 * 2.0 * 2596.148e6 * 2)
    )
    print_report(Path("model.gguf"), report)
    printed = capsys.readouterr().out
    assert "| matmuls Q4_K repacked | 8.0 / 10.0 / 16.0 / 28.0 | 2.00 / 2.67 / 2.86 |" in printed
    assert "| the rest (pass less matmuls) | 10.0 / 16.0 / 28.0 / 52.0 |" in printed


def test_this_machine_is_read() -> None:
    if platform.system() != "Linux":
        pytest.skip("/proc/cpuinfo is Linux's")
    machine = read_machine()

    assert machine.model_name
    if platform.machine() == "x86_64":
        assert machine.family > 0
        assert machine.mhz > 0
        assert "avx2" in machine.flags or machine.core is None
