"""The sidebar's settings form: an editor for every declared setting, grouped in sections.

Editors write through to :class:`~gui.settings.AppSettings` as they change and follow the
settings when they change elsewhere; the system prompt is saved when typing pauses.

Signals:
    write_failed(str): a value was refused; the one-line reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from backends.errors import SettingsError
from gui.form_widgets import (
    ROW_SPACING,
    CalmComboBox,
    CalmDoubleSpinBox,
    CalmSpinBox,
    Section,
    caption,
    select_data,
)
from gui.settings import SETTINGS

if TYPE_CHECKING:
    from gui.settings import AppSettings, SettingSpec

FORM_GROUPS: tuple[tuple[str, str], ...] = (
    ("speculation", "Speculation"),
    ("sampling", "Sampling"),
    ("generation", "Generation"),
    ("workers", "Workers (other machines)"),
    ("view", "View"),
)
SHOWN_WITH_THE_MODELS = frozenset({"speculation_method"})
FLOAT_DECIMALS = 2
SYSTEM_PROMPT_LINES = 4
SYSTEM_PROMPT_SAVE_DELAY_MS = 400
TEXT_BOX_PADDING = 12


class SettingsForm(QWidget):
    """Every setting of the form groups, one foldable section per group.

    Signals:
        write_failed(str): a value was refused; the one-line reason.
    """

    write_failed = Signal(str)

    def __init__(self, settings: AppSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._settings = settings
        self.editors: dict[str, QWidget] = {}
        self._captions: list[QLabel] = []
        self._prompt_timer = QTimer(self)
        self._prompt_timer.setSingleShot(True)
        self._prompt_timer.setInterval(SYSTEM_PROMPT_SAVE_DELAY_MS)
        self._prompt_timer.timeout.connect(self._save_system_prompt)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for group, title in FORM_GROUPS:
            layout.addWidget(Section(title, self._build_group(group), self))
        # One caption width for every section, so that the fields line up down the form.
        width = max((label.sizeHint().width() for label in self._captions), default=0)
        for label in self._captions:
            label.setMinimumWidth(width)
        settings.changed.connect(self.show_value)

    def flush_pending_edits(self) -> None:
        """Save a system prompt still waiting for typing to pause (call before quitting)."""
        if self._prompt_timer.isActive():
            self._prompt_timer.stop()
            self._save_system_prompt()

    def show_value(self, key: str) -> None:
        """Show a setting's value in its editor (when it changed somewhere else)."""
        editor = self.editors.get(key)
        if editor is not None:
            show_setting(editor, self._settings, key)

    def write(self, key: str, value: str | int | float | bool) -> None:
        """Store a value; a refused one is reported with ``write_failed``."""
        try:
            self._settings.set(key, value)
        except SettingsError as error:
            self.write_failed.emit(str(error))

    def _build_group(self, group: str) -> QWidget:
        box = QWidget()
        form = QFormLayout(box)
        form.setContentsMargins(0, 0, 0, 0)
        form.setVerticalSpacing(ROW_SPACING + 2)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        for spec in SETTINGS:
            if spec.group != group or spec.key in SHOWN_WITH_THE_MODELS:
                continue
            editor = self._make_editor(spec)
            editor.setObjectName(f"setting_{spec.key}")
            editor.setToolTip(spec.tooltip)
            self.editors[spec.key] = editor
            if isinstance(editor, QCheckBox):
                form.addRow(editor)
            elif isinstance(editor, QPlainTextEdit):
                form.addRow(caption(spec.title, spec.tooltip))
                form.addRow(editor)
            else:
                label = caption(spec.title, spec.tooltip)
                self._captions.append(label)
                form.addRow(label, editor)
        return box

    def _make_editor(self, spec: SettingSpec) -> QWidget:
        key = spec.key
        if spec.kind is bool:
            check = QCheckBox(spec.title)
            check.setChecked(self._settings.get_bool(key))
            check.toggled.connect(lambda on: self.write(key, on))
            return check
        if spec.kind is int:
            spin = CalmSpinBox()
            _prepare_spin(spin, spec)
            spin.setRange(int(spec.minimum or 0), int(spec.maximum or 0))
            if spec.step is not None:
                spin.setSingleStep(int(spec.step))
            spin.setValue(self._settings.get_int(key))
            spin.valueChanged.connect(lambda value: self.write(key, int(value)))
            return spin
        if spec.kind is float:
            double = CalmDoubleSpinBox()
            _prepare_spin(double, spec)
            double.setDecimals(FLOAT_DECIMALS)
            double.setRange(spec.minimum or 0.0, spec.maximum or 0.0)
            if spec.step is not None:
                double.setSingleStep(spec.step)
            double.setValue(self._settings.get_float(key))
            double.valueChanged.connect(lambda value: self.write(key, float(value)))
            return double
        if spec.choices:
            combo = CalmComboBox()
            for choice in spec.choices:
                combo.addItem(spec.title_of(choice), choice)
            select_data(combo, self._settings.get_str(key), fallback=0)
            combo.currentIndexChanged.connect(
                lambda _index: self.write(key, str(combo.currentData()))
            )
            return combo
        if not spec.multiline:
            line = QLineEdit(self._settings.get_str(key))
            line.setCursorPosition(0)  # the start of a long list, not its end
            line.setPlaceholderText(spec.placeholder)
            line.setClearButtonEnabled(True)
            line.editingFinished.connect(lambda: self.write(key, line.text().strip()))
            return line
        text = QPlainTextEdit()
        text.setPlaceholderText(spec.placeholder or "None")
        text.setTabChangesFocus(True)
        text.setPlainText(self._settings.get_str(key))
        line_height = text.fontMetrics().lineSpacing()
        text.setFixedHeight(line_height * SYSTEM_PROMPT_LINES + 2 * TEXT_BOX_PADDING)
        # Only the system prompt is a text box; it is saved when typing pauses.
        text.textChanged.connect(self._prompt_timer.start)
        return text

    def _save_system_prompt(self) -> None:
        editor = self.editors.get("system_prompt")
        if isinstance(editor, QPlainTextEdit):
            self.write("system_prompt", editor.toPlainText())


def show_setting(editor: QWidget, settings: AppSettings, key: str) -> None:
    """Put the setting's current value into ``editor`` without it announcing a change."""
    with QSignalBlocker(editor):
        if isinstance(editor, QCheckBox):
            editor.setChecked(settings.get_bool(key))
        elif isinstance(editor, QSpinBox):
            editor.setValue(settings.get_int(key))
        elif isinstance(editor, QDoubleSpinBox):
            editor.setValue(settings.get_float(key))
        elif isinstance(editor, QComboBox):
            if editor.currentData() != settings.get_str(key):
                select_data(editor, settings.get_str(key))
        elif isinstance(editor, QPlainTextEdit):
            value = settings.get_str(key)
            if editor.toPlainText() != value:
                editor.setPlainText(value)
        elif isinstance(editor, QLineEdit) and editor.text() != settings.get_str(key):
            editor.setText(settings.get_str(key))


def _prepare_spin(spin: QSpinBox | QDoubleSpinBox, spec: SettingSpec) -> None:
    # Commit on Enter, arrows or focus loss, not on every digit typed.
    spin.setKeyboardTracking(False)
    spin.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
    spin.setAlignment(Qt.AlignmentFlag.AlignRight)
    if spec.special_text:
        spin.setSpecialValueText(spec.special_text)
