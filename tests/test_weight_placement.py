"""Weight placement: AMX is never offered to llama.cpp, on a real model, whatever the CPU."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from backends.engines import weight_placement
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.weight_placement import (
    AMX_BUFFER_TYPE,
    CPU_FLAGS_ENV,
    WeightPlan,
    apply_plan,
    cpu_flags,
    has_amx,
    offered_extra_buffer_types,
)

if TYPE_CHECKING:
    from pathlib import Path

SAPPHIRE_RAPIDS_FLAGS = frozenset(
    ["sse4_2", "avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"]
)
ZEN4_FLAGS = frozenset(["sse4_2", "avx2", "avx512f", "avx512_vnni", "avx512_bf16"])


def test_cpu_flags_come_from_the_seam_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CPU_FLAGS_ENV, "avx2 amx_tile amx_int8")
    assert cpu_flags() == {"avx2", "amx_tile", "amx_int8"}
    assert has_amx()
    monkeypatch.setenv(CPU_FLAGS_ENV, "avx2 fma")
    assert not has_amx()


def test_an_amx_cpu_withholds_amx_and_keeps_the_other_repacked_kernels() -> None:
    plan = WeightPlan.choose("on", SAPPHIRE_RAPIDS_FLAGS, allow_amx=False)
    assert plan.repack
    assert plan.withheld == {AMX_BUFFER_TYPE}
    assert "AMX withheld: llama.cpp's AMX kernels crash on this CPU" in plan.note
    auto = WeightPlan.choose("auto", SAPPHIRE_RAPIDS_FLAGS, allow_amx=False)
    assert auto.withheld == {AMX_BUFFER_TYPE}
    assert "(auto)" in auto.note


def test_a_cpu_without_amx_repacks_as_llama_cpp_does() -> None:
    plan = WeightPlan.choose("auto", ZEN4_FLAGS, allow_amx=False)
    assert plan.repack
    assert plan.withheld == {AMX_BUFFER_TYPE}  # whatever the flags say, AMX is never offered
    assert plan.note == "weight repacking on (auto)"
    assert apply_plan(plan).repack


def test_repacking_off_is_off_everywhere_and_says_why() -> None:
    for flags in (SAPPHIRE_RAPIDS_FLAGS, ZEN4_FLAGS):
        plan = WeightPlan.choose("off", flags, allow_amx=False)
        assert not plan.repack
        assert plan.note.startswith("weight repacking off")
    assert "AMX" in WeightPlan.choose("off", SAPPHIRE_RAPIDS_FLAGS, allow_amx=False).note


def test_amx_is_used_only_when_explicitly_allowed() -> None:
    allowed = WeightPlan.choose("on", SAPPHIRE_RAPIDS_FLAGS, allow_amx=True)
    assert allowed.withheld == frozenset()
    assert allowed.note == "weight repacking on (chosen), AMX allowed"


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="weight repacking must be one of"):
        WeightPlan.choose("fast", ZEN4_FLAGS)  # type: ignore[arg-type]


def test_when_amx_cannot_be_withheld_nothing_is_repacked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weight_placement, "withhold_extra_buffer_types", lambda _names: False)
    plan = apply_plan(WeightPlan.choose("on", SAPPHIRE_RAPIDS_FLAGS, allow_amx=False))
    assert not plan.repack
    assert "cannot withhold AMX" in plan.note
    # Without AMX on the CPU, llama.cpp has no AMX to offer: repacking stays.
    assert apply_plan(WeightPlan.choose("on", ZEN4_FLAGS, allow_amx=False)).repack


def test_on_a_cpu_reporting_amx_the_weights_never_go_into_the_amx_buffer(
    monkeypatch: pytest.MonkeyPatch, smollm_path: Path
) -> None:
    # The seam says AMX whatever this CPU is; on a real AMX CPU this is the crash's path.
    monkeypatch.setenv(CPU_FLAGS_ENV, " ".join(SAPPHIRE_RAPIDS_FLAGS))
    with LlamaEngine(smollm_path, LlamaLoadSettings(n_ctx=512, weight_repacking="on")) as engine:
        report = engine.load_report
        assert AMX_BUFFER_TYPE not in offered_extra_buffer_types()
        assert report.weight_buffers, "llama.cpp's load log named no weight buffer"
        assert AMX_BUFFER_TYPE not in report.weight_buffers
        assert any("AMX withheld" in note for note in report.notes)
        assert engine.exact_batch_limit is not None  # the first forward passes ran


def test_repacking_off_loads_weights_into_plain_cpu_buffers(smollm_path: Path) -> None:
    with LlamaEngine(smollm_path, LlamaLoadSettings(n_ctx=512, weight_repacking="off")) as engine:
        assert engine.load_report.weight_buffers
        assert all("REPACK" not in b and b != "AMX" for b in engine.load_report.weight_buffers)
        assert engine.load_report.notes[0].startswith("weight repacking off")


@pytest.mark.skipif(not has_amx(), reason="this CPU has no AMX: llama.cpp offers no AMX buffer")
def test_on_this_amx_cpu_llama_cpp_would_pick_amx_without_the_withholding(
    smollm_path: Path,
) -> None:
    # Loading only (no forward pass: that is what segfaults), in a process of its own.
    code = (
        "import os, sys\n"
        "os.environ['SPECDECK_ALLOW_AMX'] = '1'\n"
        "from backends.engines.llama import LlamaEngine, LlamaLoadSettings\n"
        "settings = LlamaLoadSettings(n_ctx=512, weight_repacking='on', probe_exact_batch=False)\n"
        f"engine = LlamaEngine({str(smollm_path)!r}, settings)\n"
        "print(','.join(engine.load_report.weight_buffers), flush=True)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert AMX_BUFFER_TYPE in done.stdout.strip().split(",")
