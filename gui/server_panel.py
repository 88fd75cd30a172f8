"""The sidebar's Local server panel: serve the loaded pair to other programs, and their log.

A view only: the switch asks for the API to open or close (the main window tells the engine
process, which serves the pair the window loaded: nothing is loaded twice); the panel shows
where it listens, how many requests wait, and a line per served request (tokens, tok/s,
acceptance).

Signals:
    serve_requested(int): the switch was turned on; the port to listen on (127.0.0.1).
    stop_requested(): the switch was turned off.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QListWidget, QVBoxLayout, QWidget

from backends.service.protocol import DEFAULT_API_PORT
from gui.form_widgets import ROW_SPACING, CalmSpinBox, caption, muted_label

if TYPE_CHECKING:
    from backends.speculation.types import SpeculationStats

LOG_LINES_KEPT = 200
PORT_TOOLTIP = "The port of http://127.0.0.1:PORT/v1, the OpenAI-compatible API"


def request_line(stats: SpeculationStats, when: float | None = None) -> str:
    """One served request, e.g. "14:02:11 · 96 tokens · 17.3 tok/s · 62% accepted"."""
    stamp = time.strftime("%H:%M:%S", time.localtime(when))
    parts = [stamp, f"{stats.generated_tokens} tokens", f"{stats.tokens_per_second:.1f} tok/s"]
    if stats.acceptance_rate is not None:
        parts.append(f"{stats.acceptance_rate:.0%} accepted")
    if stats.stop_reason == "cancelled":
        parts.append("client left")
    return " · ".join(parts)


class ServerPanel(QWidget):
    """The Local server switch, its port, status and request log."""

    serve_requested = Signal(int)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(ROW_SPACING)
        self.switch = QCheckBox("Serve the loaded models to other programs")
        self.switch.setObjectName("serverSwitch")
        self.switch.setToolTip(
            "An OpenAI-compatible API on 127.0.0.1 (chat and completions, streamed), answered "
            "by the models loaded here with speculative decoding; requests take turns with "
            "the chat."
        )
        self.switch.toggled.connect(self._on_toggled)
        layout.addWidget(self.switch)
        row = QHBoxLayout()
        row.addWidget(caption("Port", PORT_TOOLTIP))
        self.port = CalmSpinBox()
        self.port.setObjectName("serverPort")
        self.port.setRange(1024, 65535)
        self.port.setValue(DEFAULT_API_PORT)
        self.port.setToolTip(PORT_TOOLTIP)
        row.addWidget(self.port, 1)
        layout.addLayout(row)
        self.status = muted_label("Off")
        self.status.setObjectName("serverStatus")
        layout.addWidget(self.status)
        self.log = QListWidget()
        self.log.setObjectName("serverLog")
        self.log.setMaximumHeight(120)
        self.log.setWordWrap(True)
        self.log.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.log.hide()
        layout.addWidget(self.log)
        self._url = ""
        self._waiting = 0

    def _on_toggled(self, on: bool) -> None:
        self.port.setEnabled(not on)
        if on:
            self.status.setText("Starting…")
            self.serve_requested.emit(self.port.value())
        else:
            self.stop_requested.emit()

    def set_serving(self, listening: bool, url: str, error: str) -> None:
        """What the engine process says: listening at ``url``, or not (``error`` says why)."""
        self._url = url if listening else ""
        if not listening and self.switch.isChecked():
            self.switch.blockSignals(True)
            self.switch.setChecked(False)
            self.switch.blockSignals(False)
            self.port.setEnabled(True)
        self._show_status(error)

    def set_waiting(self, waiting: int) -> None:
        """How many API requests wait or run now."""
        self._waiting = waiting
        self._show_status("")

    def add_request(self, stats: SpeculationStats) -> None:
        """A served request, newest on top."""
        self.log.insertItem(0, request_line(stats))
        while self.log.count() > LOG_LINES_KEPT:
            self.log.takeItem(self.log.count() - 1)
        self.log.show()

    def add_failure(self, message: str) -> None:
        """A request that ended with an error (its client got it too)."""
        stamp = time.strftime("%H:%M:%S")
        self.log.insertItem(0, f"{stamp} · error: {message}")
        self.log.show()

    def _show_status(self, error: str) -> None:
        if error:
            text = f"Not serving: {error}"
        elif self._url:
            text = f"Listening on {self._url}"
            if self._waiting:
                text += f" · {self._waiting} in the queue"
        else:
            text = "Off"
        self.status.setText(text)
        self.status.show()
