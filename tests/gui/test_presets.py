"""Presets of the sampling and speculation settings: saved, picked, deleted, in the sidebar."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from backends.errors import SettingsError
from gui.presets import NO_PRESET, PRESET_KEYS, PresetBar, apply_preset, saved_presets
from gui.settings import AppSettings

if TYPE_CHECKING:
    from pathlib import Path

    from pytestqt.qtbot import QtBot


def test_a_preset_keeps_the_sampling_and_speculation_settings(qtbot: QtBot, tmp_path: Path) -> None:
    settings = AppSettings(tmp_path / "settings.json")
    assert {"temperature", "draft_max", "top_p"} <= set(PRESET_KEYS)
    assert "system_prompt" not in PRESET_KEYS
    bar = PresetBar(settings)
    qtbot.addWidget(bar)
    assert bar.picker.currentText() == NO_PRESET
    assert not bar.delete_button.isEnabled()

    settings.set("temperature", 0.8)
    settings.set("draft_max", 6)
    bar.ask_and_save("  Creative   writing ")
    assert bar.picker.currentText() == "Creative writing"  # the settings shown are its
    settings.set("temperature", 0.0)
    settings.set("draft_max", 3)
    bar.ask_and_save("Code")
    assert [bar.picker.itemText(i) for i in range(bar.picker.count())] == [
        NO_PRESET,
        "Code",
        "Creative writing",
    ]
    settings.set("top_p", 0.5)  # no preset holds these settings now
    assert bar.picker.currentText() == NO_PRESET

    bar.picker.setCurrentIndex(2)
    bar.picker.activated.emit(2)  # the user picks "Creative writing"
    assert (settings.get("temperature"), settings.get("draft_max")) == (0.8, 6)
    assert settings.get("top_p") == 1.0
    assert bar.picker.currentText() == "Creative writing"

    # Kept in the settings file: a new start offers them.
    again = AppSettings(tmp_path / "settings.json")
    assert set(saved_presets(again)) == {"Code", "Creative writing"}

    bar.delete_button.click()
    assert set(saved_presets(settings)) == {"Code"}
    with pytest.raises(SettingsError, match="needs a name"):
        bar.ask_and_save("   ")


def test_a_preset_value_this_version_does_not_allow_is_skipped(tmp_path: Path) -> None:
    settings = AppSettings(tmp_path / "settings.json")
    settings.set("presets", '{"Odd": {"temperature": -3, "draft_max": 5, "unknown": 1}}')
    apply_preset(settings, "Odd")
    assert settings.get("draft_max") == 5
    assert settings.get("temperature") == 0.0
