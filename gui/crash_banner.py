"""The line over the chat after the engine process died or lost a worker, with Reload."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from gui.theme import ERROR_TEXT_STYLE, keep_styled

if TYPE_CHECKING:
    from gui.load_controller import LoadState

RELOAD_TEXT = "Reload models"


class CrashBanner(QWidget):
    """Shows what the load controller's state says went wrong (hidden when nothing did).

    ``reload_button`` offers the last pair again, or without the worker that went away.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        self.label = QLabel()
        self.label.setWordWrap(True)
        keep_styled(self.label, ERROR_TEXT_STYLE)
        self.reload_button = QPushButton(RELOAD_TEXT)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.reload_button)
        self.hide()

    def show_state(self, state: LoadState) -> None:
        """The banner's line, its Reload button, or nothing, as ``state`` has them."""
        if state.banner:  # a hidden banner keeps its last line
            self.label.setText(f"⚠ {state.banner}")
        worker = state.lost_worker
        self.reload_button.setText(f"Reload without {worker}" if worker else RELOAD_TEXT)
        self.reload_button.setVisible(state.offer_reload)
        self.setVisible(bool(state.banner))
