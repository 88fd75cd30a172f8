"""The sidebar's settings form: an editor for every declared setting, grouped in sections.

Editors write through to :class:`~gui.settings.AppSettings` as they change and follow the
settings when they change elsewhere; a text box (the system prompt, the JSON schema) is saved
when typing pauses. A setting that only matters for one choice of another (the JSON schema
for Structured output's "JSON schema") is shown only then.

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
from gui.style import monospace_font

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
TEXT_BOX_LINES = 4
TEXT_BOX_SAVE_DELAY_MS = 400
MONOSPACED_TEXTS = frozenset({"json_schema"})  # text boxes that hold code, not prose
# A setting shown only while another has one value: {setting: (other setting, its value)}.
SHOWN_ONLY_FOR: dict[str, tuple[str, str]] = {"json_schema": ("structured_output", "json_schema")}
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
        self._rows: dict[str, tuple[QFormLayout, list[QWidget]]] = {}  # each editor's row(s)
        self._unsaved_texts: set[str] = set()  # text boxes typed in since the last save
        self._text_timer = QTimer(self)
        self._text_timer.setSingleShot(True)
        self._text_timer.setInterval(TEXT_BOX_SAVE_DELAY_MS)
        self._text_timer.timeout.connect(self._save_texts)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for group, title in FORM_GROUPS:
            layout.addWidget(Section(title, self._build_group(group), self))
        # One caption width for every section, so that the fields line up down the form.
        width = max((label.sizeHint().width() for label in self._captions), default=0)
        for label in self._captions:
            label.setMinimumWidth(width)
        settings.changed.connect(self.show_value)
        self._show_only_what_matters()

    def flush_pending_edits(self) -> None:
        """Save text still waiting for typing to pause (call before quitting or sending)."""
        if self._text_timer.isActive():
            self._text_timer.stop()
        self._save_texts()

    def show_value(self, key: str) -> None:
        """Show a setting's value in its editor (when it changed somewhere else)."""
        editor = self.editors.get(key)
        if editor is not None:
            show_setting(editor, self._settings, key)
        if any(other == key for other, _value in SHOWN_ONLY_FOR.values()):
            self._show_only_what_matters()

    def _show_only_what_matters(self) -> None:
        for key, (other, value) in SHOWN_ONLY_FOR.items():
            if key in self._rows:
                form, widgets = self._rows[key]
                for widget in widgets:
                    form.setRowVisible(widget, self._settings.get_str(other) == value)

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
            rows: list[QWidget]
            if isinstance(editor, QCheckBox):
                form.addRow(editor)
                rows = [editor]
            elif isinstance(editor, QPlainTextEdit):
                label = caption(spec.title, spec.tooltip)
                form.addRow(label)
                form.addRow(editor)
                rows = [label, editor]
            else:
                label = caption(spec.title, spec.tooltip)
                self._captions.append(label)
                form.addRow(label, editor)
                rows = [editor]
            self._rows[spec.key] = (form, rows)
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
        if key in MONOSPACED_TEXTS:
            text.setFont(monospace_font())
        text.setPlainText(self._settings.get_str(key))
        line_height = text.fontMetrics().lineSpacing()
        text.setFixedHeight(line_height * TEXT_BOX_LINES + 2 * TEXT_BOX_PADDING)
        text.textChanged.connect(lambda: self._typed_in(key))
        return text

    def _typed_in(self, key: str) -> None:
        self._unsaved_texts.add(key)
        self._text_timer.start()

    def _save_texts(self) -> None:
        keys, self._unsaved_texts = sorted(self._unsaved_texts), set()
        for key in keys:
            editor = self.editors.get(key)
            if isinstance(editor, QPlainTextEdit):
                self.write(key, editor.toPlainText())


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
