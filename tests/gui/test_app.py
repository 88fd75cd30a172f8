"""The app entry point: the About box facts, a bundle's build record, no display."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from typing import TYPE_CHECKING

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
    import os
    import subprocess

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
