"""The app entry point: the About box facts, a bundle's build record, no display."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib.metadata import version
from typing import TYPE_CHECKING

from backends.engines.load_guard import CRASH_AT_ENV
from backends.engines.weight_placement import CPU_FLAGS_ENV, cpu_model_name
from gui.about import about_lines, build_info

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def test_checkout_shows_version_and_development_build() -> None:
    rows = dict(about_lines("CPU"))
    assert rows["Version"] == version("specdeck")
    assert rows["Build"] == "development checkout"
    assert rows["Engine backend"] == "CPU"
    assert build_info() == {}
    assert rows["CPU"].startswith(cpu_model_name())
    assert rows["Weights"].startswith("weight repacking on (auto)")


def test_about_box_says_what_is_done_with_weights_on_an_amx_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CPU_FLAGS_ENV, "avx2 avx512f amx_tile amx_int8")
    rows = dict(about_lines())
    assert rows["CPU"].endswith("with AMX")
    assert rows["Weights"] == (
        "weight repacking on (auto), AMX withheld: llama.cpp's AMX kernels crash on this CPU"
    )
    monkeypatch.setenv(CPU_FLAGS_ENV, "avx2")
    assert dict(about_lines(weights="weight repacking off (chosen)"))["Weights"] == (
        "weight repacking off (chosen)"
    )


def test_self_test_fails_within_seconds_of_the_engine_dying(
    smollm_path: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    done = _self_test(smollm_path, tmp_path, "main-probe")
    assert done.returncode == 1, done.stdout + done.stderr
    assert time.monotonic() - started < SELF_TEST_FAIL_FAST_S
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("self-test: FAILED: the models did not load:")
    assert "SIGSEGV" in last
    assert "Nothing safer is left to try" in last


def test_self_test_passes_after_a_safe_retry_and_says_so(smollm_path: Path, tmp_path: Path) -> None:
    done = _self_test(smollm_path, tmp_path, "main-probe:unless-safe")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("self-test: ok:")
    assert "Loaded again with the safest settings" in done.stderr


SELF_TEST_FAIL_FAST_S = 60  # two engine starts and loads of a small model, then the verdict


def _self_test(model: Path, tmp_path: Path, crash_at: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, CRASH_AT_ENV: crash_at, "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run(
        [sys.executable, "-m", "gui.app", "--self-test", "--main", str(model)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )


def test_bundle_shows_its_build_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = {"version": "9.9.9", "commit": "abc123", "built": "2026-11-30 04:00 UTC"}
    record |= {"llama_cpp_python": "0.3.36", "llama_backend": "Vulkan"}
    (tmp_path / "build_info.json").write_text(json.dumps(record), encoding="utf-8")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    rows = dict(about_lines())
    assert rows["Build"] == "abc123, 2026-11-30 04:00 UTC"
    assert rows["llama.cpp"] == "llama-cpp-python 0.3.36, Vulkan build"


def test_app_without_a_display_says_so_instead_of_aborting() -> None:
    environment = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    environment.pop("QT_QPA_PLATFORM", None)
    result = subprocess.run(
        [sys.executable, "-m", "gui.app"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("specdeck: error: no display")
    assert "\n" not in result.stderr.strip()
