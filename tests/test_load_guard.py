"""Fault injection kills a real process with SIGSEGV; crash records pick the next settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from backends.engines.load_guard import (
    CRASH_AT_ENV,
    SAFEST,
    CrashRecords,
    LoadRefusedError,
    RiskySettings,
    add_stage_listener,
    avoided_crash_note,
    checkpoint,
    crash_message,
    remove_stage_listener,
)
from backends.engines.weight_placement import CPU_FLAGS_ENV

if TYPE_CHECKING:
    from pathlib import Path

REQUESTED = RiskySettings("auto", -1, None)


def _checkpoint_in_child(crash_at: str, *, safe: bool) -> subprocess.CompletedProcess[str]:
    code = (
        "from backends.engines.load_guard import add_stage_listener, checkpoint\n"
        "add_stage_listener(lambda stage, model: print('reached', stage, model, flush=True))\n"
        f"checkpoint('main-probe', 'model.gguf', safe={safe})\n"
        "print('survived')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, CRASH_AT_ENV: crash_at},
    )


def test_fault_injection_dies_with_a_real_sigsegv_after_telling_the_listeners() -> None:
    done = _checkpoint_in_child("main-probe", safe=True)
    assert done.returncode == -signal.SIGSEGV
    assert done.stdout.strip() == "reached main-probe model.gguf"


def test_unless_safe_spares_the_safest_load_only() -> None:
    assert _checkpoint_in_child("main-probe:unless-safe", safe=True).stdout.endswith("survived\n")
    assert _checkpoint_in_child("main-probe:unless-safe", safe=False).returncode == -signal.SIGSEGV


def test_other_stages_and_no_switch_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    def listener(stage: str, model: str) -> None:
        seen.append((stage, model))

    add_stage_listener(listener)
    try:
        monkeypatch.setenv(CRASH_AT_ENV, "draft-model")
        checkpoint("main-model", "a.gguf")
        monkeypatch.delenv(CRASH_AT_ENV)
        checkpoint("draft-model", "b.gguf")
    finally:
        remove_stage_listener(listener)
    assert seen == [("main-model", "a.gguf"), ("draft-model", "b.gguf")]


def test_records_choose_the_safest_settings_after_a_crash(tmp_path: Path) -> None:
    model = tmp_path / "main.gguf"
    model.write_bytes(b"GGUF")
    records = CrashRecords(tmp_path / "crashes.json")
    assert records.choose([model], REQUESTED) == (REQUESTED, None)
    records.record(model, REQUESTED, "main-probe", "SIGSEGV: Segmentation fault")
    settings, crash = CrashRecords(tmp_path / "crashes.json").choose([model], REQUESTED)
    assert settings == SAFEST
    assert crash is not None
    assert crash.stage == "main-probe"
    assert crash.model_name == "main.gguf"
    note = avoided_crash_note(crash)
    assert note.startswith("safest settings: main.gguf crashed the engine on ")
    assert note.endswith(
        "with weight repacking auto, GPU layers all, default threads "
        "(while running the main model's first forward pass)"
    )
    # Other settings that never crashed are used as asked.
    other = RiskySettings("off", -1, 2)
    assert records.choose([model], other) == (other, None)


def test_a_crash_with_the_safest_settings_refuses_the_model(tmp_path: Path) -> None:
    model = tmp_path / "main.gguf"
    model.write_bytes(b"GGUF")
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    records = CrashRecords(tmp_path / "crashes.json")
    records.record(draft, SAFEST, "draft-model", "SIGSEGV")
    with pytest.raises(LoadRefusedError, match="draft.gguf crashed the engine") as refused:
        records.choose([model, draft], REQUESTED)
    assert "\n" not in str(refused.value)
    assert records.forget() == 1
    assert records.choose([model, draft], REQUESTED) == (REQUESTED, None)


def test_records_are_per_cpu_and_per_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "main.gguf"
    model.write_bytes(b"GGUF")
    records = CrashRecords(tmp_path / "crashes.json")
    monkeypatch.setenv(CPU_FLAGS_ENV, "avx2 amx_tile amx_int8")
    records.record(model, REQUESTED, "main-probe", "SIGSEGV")
    assert records.find(model, REQUESTED) is not None
    monkeypatch.setenv(CPU_FLAGS_ENV, "avx2")
    assert records.find(model, REQUESTED) is None  # another CPU
    monkeypatch.setenv(CPU_FLAGS_ENV, "avx2 amx_tile amx_int8")
    model.write_bytes(b"GGUF, another file now")
    assert records.find(model, REQUESTED) is None  # another file at the same path


def test_an_unreadable_record_file_counts_as_none(tmp_path: Path) -> None:
    path = tmp_path / "crashes.json"
    path.write_text("{not json", encoding="utf-8")
    records = CrashRecords(path)
    assert records.all() == []
    records.record(tmp_path / "m.gguf", REQUESTED, "main-model", "SIGSEGV")
    assert json.loads(path.read_text(encoding="utf-8"))["crashes"][0]["stage"] == "main-model"


def test_the_crash_message_is_one_line_naming_stage_model_and_settings() -> None:
    line = crash_message("/x/qwen.gguf", "main-probe", REQUESTED, "SIGSEGV: Segmentation fault")
    assert line == (
        "the engine crashed while running the main model's first forward pass (qwen.gguf; "
        "weight repacking auto, GPU layers all, default threads): SIGSEGV: Segmentation fault"
    )
    assert "no weight repacking" in crash_message("m.gguf", "main-model", SAFEST, "")
