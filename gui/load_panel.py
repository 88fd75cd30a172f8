"""The sidebar's load panel: Load/Unload, the progress of a load, where the models went, errors.

A view only: the sidebar decides what the button does and tells the panel what to show.

Signals:
    clicked(): the Load/Unload button was pressed.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from gui.form_widgets import ROW_SPACING, muted_label
from gui.theme import keep_styled, text_colour

PROGRESS_STEPS = 1000
NOTE_BULLET = "• "


class LoadPanel(QWidget):
    """The Load button with the load's progress, result and errors under it.

    Signals:
        clicked(): the button was pressed.
    """

    clicked = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(ROW_SPACING)
        self.button = QPushButton("Load")
        self.button.setObjectName("loadButton")
        self.button.setDefault(True)
        self.button.clicked.connect(self.clicked)
        layout.addWidget(self.button)
        self._progress_bar = QProgressBar()
        self._progress_bar.setObjectName("loadProgress")
        self._progress_bar.setRange(0, PROGRESS_STEPS)
        self._progress_bar.setTextVisible(False)
        self._progress_bar.setMaximumHeight(8)
        self._progress_bar.hide()
        layout.addWidget(self._progress_bar)
        self._progress_label = muted_label()
        self._progress_label.setObjectName("loadProgressMessage")
        layout.addWidget(self._progress_label)
        self._status_label = QLabel()
        self._status_label.setObjectName("loadStatus")
        keep_styled(self._status_label, text_colour("good", "font-weight: bold;"))
        self._status_label.hide()
        layout.addWidget(self._status_label)
        self._placement_label = _selectable_label()
        layout.addWidget(self._placement_label)
        self._error_label = _selectable_label()
        self._error_label.setObjectName("errorLabel")
        layout.addWidget(self._error_label)

    def set_button(self, text: str, tooltip: str, enabled: bool) -> None:
        """What the button says and whether it can be pressed."""
        self.button.setText(text)
        self.button.setToolTip(tooltip)
        self.button.setEnabled(enabled)

    def show_loading(self) -> None:
        """A load began: an empty progress bar, nothing loaded shown."""
        self.clear_error()
        self._status_label.hide()
        self._placement_label.hide()
        self._progress_bar.setRange(0, PROGRESS_STEPS)
        self._progress_bar.setValue(0)
        self._progress_bar.show()
        self._progress_label.setText("Loading…")
        self._progress_label.show()

    def show_progress(self, fraction: float, message: str) -> None:
        """Move the progress bar to ``fraction`` (0..1; negative: busy without a fraction)."""
        if fraction < 0:
            self._progress_bar.setRange(0, 0)
        else:
            self._progress_bar.setRange(0, PROGRESS_STEPS)
            self._progress_bar.setValue(round(min(fraction, 1.0) * PROGRESS_STEPS))
        self._progress_bar.show()
        self._progress_label.setText(message)
        self._progress_label.setVisible(bool(message))

    def hide_progress(self) -> None:
        """The load ended."""
        self._progress_bar.hide()
        self._progress_label.hide()

    def show_loaded(
        self, seconds: float, placement: list[str], notes: list[str], tooltip: str
    ) -> None:
        """A loaded pair: how long the load took, where the layers went, and why."""
        self.hide_progress()
        self.clear_error()
        self._status_label.setText(f"● Loaded in {seconds:.1f} s")
        self._status_label.show()
        # A note both models share is said once; a bullet each keeps wrapped notes apart.
        lines = [*placement, *(f"{NOTE_BULLET}{note}" for note in dict.fromkeys(notes))]
        self._placement_label.setText("\n".join(lines))
        self._placement_label.setToolTip(tooltip)
        self._placement_label.show()

    def show_unloaded(self) -> None:
        """Nothing loaded."""
        self.hide_progress()
        self._status_label.hide()
        self._placement_label.hide()
        self._placement_label.clear()

    def show_error(self, message: str) -> None:
        """Show ``message`` in red under the button."""
        self._error_label.setText(message)
        self._error_label.show()

    def clear_error(self) -> None:
        """Hide the error message."""
        self._error_label.clear()
        self._error_label.hide()

    def error_text(self) -> str:
        """The error shown, or "" when none is."""
        return self._error_label.text() if self._error_label.isVisibleTo(self) else ""

    def placement_text(self) -> str:
        """The placement lines shown after a load, or "" when nothing is loaded."""
        return self._placement_label.text() if self._placement_label.isVisibleTo(self) else ""


def _selectable_label() -> QLabel:
    label = QLabel()
    label.setWordWrap(True)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.hide()
    return label
