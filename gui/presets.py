"""Named presets of the sampling and speculation settings: save the ones shown, pick one.

A preset is every setting of the Speculation and Sampling sections, by key, kept in the
settings file (the ``presets`` setting, JSON). :class:`PresetBar` is the sidebar's row: a
picker, Save as… and Delete.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QInputDialog,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from backends.errors import SettingsError
from gui.settings import SETTINGS

if TYPE_CHECKING:
    from gui.settings import AppSettings, SettingValue

log = logging.getLogger(__name__)

PRESET_GROUPS = ("speculation", "sampling")
PRESET_KEYS = tuple(spec.key for spec in SETTINGS if spec.group in PRESET_GROUPS)
NO_PRESET = "No preset"
MAX_NAME_LENGTH = 40
MIN_PICKER_CHARACTERS = 8


def saved_presets(settings: AppSettings) -> dict[str, dict[str, SettingValue]]:
    """Every saved preset, by name ({} when the setting is empty or unreadable)."""
    try:
        presets = json.loads(settings.get_str("presets") or "{}")
    except ValueError:
        log.warning("the saved presets are not JSON; none are offered")
        return {}
    return {str(name): dict(values) for name, values in presets.items() if isinstance(values, dict)}


def save_preset(settings: AppSettings, name: str) -> None:
    """Save the sampling and speculation settings shown now as ``name`` (replacing it)."""
    name = " ".join(name.split())[:MAX_NAME_LENGTH]
    if not name or name == NO_PRESET:
        raise SettingsError("a preset needs a name")
    presets = saved_presets(settings)
    presets[name] = {key: settings.get(key) for key in PRESET_KEYS}
    settings.set("presets", json.dumps(presets, ensure_ascii=False, sort_keys=True))


def apply_preset(settings: AppSettings, name: str) -> None:
    """Set every value ``name`` keeps (a value this SpecDeck does not allow is skipped)."""
    for key, value in saved_presets(settings).get(name, {}).items():
        if key not in PRESET_KEYS:
            continue
        try:
            settings.set(key, value)
        except SettingsError as error:
            log.warning("preset %r: %s is not applied: %s", name, key, error)


def delete_preset(settings: AppSettings, name: str) -> None:
    """Forget a saved preset."""
    presets = saved_presets(settings)
    if presets.pop(name, None) is not None:
        settings.set("presets", json.dumps(presets, ensure_ascii=False, sort_keys=True))


class PresetBar(QWidget):
    """A picker of the saved presets, with Save as… and Delete.

    Picking a preset sets its values; the picker shows the preset whose values are all
    the ones shown, or "No preset".

    Signals: none of its own.
    """

    def __init__(self, settings: AppSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._settings = settings
        self.picker = QComboBox()
        self.picker.setToolTip("A saved set of the Speculation and Sampling settings")
        # Long names must not widen the sidebar.
        self.picker.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.picker.setMinimumContentsLength(MIN_PICKER_CHARACTERS)
        self.picker.activated.connect(self._on_picked)
        self.save_button = QPushButton("Save as…")
        self.save_button.setToolTip("Save the Speculation and Sampling settings shown as a preset")
        self.save_button.clicked.connect(lambda: self.ask_and_save())
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self._delete_current)
        buttons = QHBoxLayout()
        buttons.addWidget(self.save_button)
        buttons.addWidget(self.delete_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)  # two rows: the sidebar is narrow
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.picker)
        layout.addLayout(buttons)
        settings.changed.connect(self._on_setting_changed)
        self.refresh()

    def refresh(self) -> None:
        """List the saved presets and show the one that matches the settings."""
        presets = saved_presets(self._settings)
        self.picker.blockSignals(True)
        self.picker.clear()
        self.picker.addItem(NO_PRESET)
        self.picker.addItems(sorted(presets))
        matching = [
            name
            for name, values in presets.items()
            if all(
                self._settings.get(key) == value
                for key, value in values.items()
                if key in PRESET_KEYS
            )
        ]
        self.picker.setCurrentText(sorted(matching)[0] if matching else NO_PRESET)
        self.picker.blockSignals(False)
        self.delete_button.setEnabled(self.picker.currentText() != NO_PRESET)

    def ask_and_save(self, name: str | None = None) -> None:
        """Save the settings shown as a preset (``name`` None: asked in a dialog)."""
        if name is None:
            name, accepted = QInputDialog.getText(self, "Save preset", "Name of the preset:")
            if not accepted:
                return
        save_preset(self._settings, name)
        self.refresh()

    def _on_picked(self, index: int) -> None:
        name = self.picker.itemText(index)
        if name != NO_PRESET:
            apply_preset(self._settings, name)
        self.refresh()

    def _delete_current(self) -> None:
        delete_preset(self._settings, self.picker.currentText())
        self.refresh()

    def _on_setting_changed(self, key: str) -> None:
        if key in PRESET_KEYS or key == "presets":
            self.refresh()
