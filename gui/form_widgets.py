"""Small widgets the sidebar's panels share: calm editors, a foldable section, label styles.

The editors turn with the mouse wheel only when they have the focus, so that the wheel
scrolls the sidebar past them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QLabel,
    QSizePolicy,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from gui.theme import MUTED_TEXT_STYLE, keep_styled

if TYPE_CHECKING:
    from collections.abc import Callable

    from PySide6.QtGui import QWheelEvent

ROW_SPACING = 4


def _wheel_unless_focused(
    widget: QWidget, event: QWheelEvent, handle: Callable[[QWheelEvent], None]
) -> None:
    """Let a focused editor take the wheel; otherwise pass it on, so the sidebar scrolls."""
    if widget.hasFocus():
        handle(event)
    else:
        event.ignore()


class CalmSpinBox(QSpinBox):
    """A spin box that turns with the wheel only when it has the focus."""

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802 (Qt's name)
        _wheel_unless_focused(self, event, super().wheelEvent)


class CalmDoubleSpinBox(QDoubleSpinBox):
    """A double spin box that turns with the wheel only when it has the focus."""

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802 (Qt's name)
        _wheel_unless_focused(self, event, super().wheelEvent)


class CalmComboBox(QComboBox):
    """A combo box that changes with the wheel only when it has the focus."""

    def wheelEvent(self, event: QWheelEvent) -> None:  # noqa: N802 (Qt's name)
        _wheel_unless_focused(self, event, super().wheelEvent)


class Section(QWidget):
    """A titled group whose body folds away when its header is clicked."""

    def __init__(self, title: str, body: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._header = QToolButton(self)
        self._header.setText(title)
        self._header.setCheckable(True)
        self._header.setChecked(True)
        self._header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self._header.setArrowType(Qt.ArrowType.DownArrow)
        self._header.setAutoRaise(True)
        self._header.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        font = self._header.font()
        font.setBold(True)
        self._header.setFont(font)
        self._body = body
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(ROW_SPACING)
        layout.addWidget(self._header)
        layout.addWidget(body)
        self._header.toggled.connect(self._update_expanded)

    @property
    def header(self) -> QToolButton:
        """The button that folds and unfolds the section."""
        return self._header

    def _update_expanded(self, expanded: bool) -> None:
        self._header.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self._body.setVisible(expanded)


def heading(text: str) -> QLabel:
    """A panel's bold title."""
    label = QLabel(text)
    font = label.font()
    font.setBold(True)
    font.setPointSizeF(font.pointSizeF() * 1.1)
    label.setFont(font)
    return label


def caption(text: str, tooltip: str) -> QLabel:
    """A field's caption, with the field's tooltip."""
    label = QLabel(text)
    label.setToolTip(tooltip)
    return label


def muted_label(text: str = "") -> QLabel:
    """Grey, wrapping text (hidden while empty)."""
    label = QLabel(text)
    label.setWordWrap(True)
    keep_styled(label, MUTED_TEXT_STYLE)
    if not text:
        label.hide()
    return label


def select_data(combo: QComboBox, data: str, fallback: int | None = None) -> None:
    """Select the item whose data is ``data`` (or the ``fallback`` index when none is)."""
    index = combo.findData(data)
    if index >= 0:
        combo.setCurrentIndex(index)
    elif fallback is not None:
        combo.setCurrentIndex(fallback)
