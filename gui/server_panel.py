"""The sidebar's Local server panel: serve the loaded pair to other programs, and their log.

A view only: the switch asks for the API to open or close (the main window tells the engine
process, which serves the pair the window loaded: nothing is loaded twice); the panel shows
where it listens, how many requests wait, and a line per served request (tokens, tok/s,
acceptance).

Safe by default: it listens on 127.0.0.1; another address (every network, or one of this
machine's own) lets other machines in, so it needs an API key, which the panel makes when
none is typed. The engine process checks the same rule and refuses without a key.

Signals:
    serve_requested(str, int, str): the switch was turned on; address, port and API key
        ("" for none).
    stop_requested(): the switch was turned off.
"""

from __future__ import annotations

import secrets
import socket
import time
from typing import TYPE_CHECKING

import psutil
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QGridLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from backends.service.protocol import (
    ALL_ADDRESSES_HOST,
    DEFAULT_API_HOST,
    DEFAULT_API_PORT,
    is_loopback_host,
)
from gui.form_widgets import (
    ROW_SPACING,
    CalmComboBox,
    CalmSpinBox,
    caption,
    muted_label,
    select_data,
)

if TYPE_CHECKING:
    from backends.speculation.types import SpeculationStats

LOG_LINES_KEPT = 200
PORT_TOOLTIP = "The port of http://ADDRESS:PORT/v1, the OpenAI-compatible API"
ADDRESS_TOOLTIP = (
    "Where the API listens. This computer only (127.0.0.1) is the safe default; every other "
    "choice lets other machines on that network in, so it needs an API key"
)
KEY_TOOLTIP = (
    "Clients send it as 'Authorization: Bearer KEY' (the openai package's api_key); requests "
    "without it get 401. Needed when other machines may connect; optional on 127.0.0.1"
)
NEEDS_KEY = "other machines may connect on {host}: give an API key (New makes one)"


def listen_addresses() -> list[tuple[str, str]]:
    """The addresses the API can listen on, as (words shown, address): loopback first."""
    choices = [
        (f"This computer only · {DEFAULT_API_HOST}", DEFAULT_API_HOST),
        (f"Every network · {ALL_ADDRESSES_HOST}", ALL_ADDRESSES_HOST),
    ]
    try:
        interfaces = psutil.net_if_addrs()
    except (OSError, psutil.Error):
        interfaces = {}
    for name, addresses in sorted(interfaces.items()):
        for address in addresses:
            if address.family == socket.AF_INET and not is_loopback_host(address.address):
                choices.append((f"{name} · {address.address}", address.address))
    return choices


def new_api_key() -> str:
    """A fresh random key, e.g. "sd-…" (32 URL-safe characters after the prefix)."""
    return "sd-" + secrets.token_urlsafe(24)


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
    """The Local server switch, its address, port and API key, status and request log."""

    serve_requested = Signal(str, int, str)
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
        grid = QGridLayout()
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setVerticalSpacing(ROW_SPACING)
        self.address = CalmComboBox()
        self.address.setObjectName("serverAddress")
        self.address.setToolTip(ADDRESS_TOOLTIP)
        for words, host in listen_addresses():
            self.address.addItem(words, host)
        self.address.currentIndexChanged.connect(self._on_address_changed)
        grid.addWidget(caption("Address", ADDRESS_TOOLTIP), 0, 0)
        grid.addWidget(self.address, 0, 1)
        self.port = CalmSpinBox()
        self.port.setObjectName("serverPort")
        self.port.setRange(1024, 65535)
        self.port.setValue(DEFAULT_API_PORT)
        self.port.setToolTip(PORT_TOOLTIP)
        grid.addWidget(caption("Port", PORT_TOOLTIP), 1, 0)
        grid.addWidget(self.port, 1, 1)
        key_row = QHBoxLayout()
        key_row.setSpacing(ROW_SPACING)
        self.api_key = QLineEdit()
        self.api_key.setObjectName("serverApiKey")
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("none (this computer only)")
        self.api_key.setToolTip(KEY_TOOLTIP)
        key_row.addWidget(self.api_key, 1)
        self.new_key = QToolButton()
        self.new_key.setText("New")
        self.new_key.setToolTip("Make a new random API key")
        self.new_key.clicked.connect(self._make_key)
        key_row.addWidget(self.new_key)
        self.copy_key = QToolButton()
        self.copy_key.setText("Copy")
        self.copy_key.setToolTip("Copy the API key to the clipboard, for the client's settings")
        self.copy_key.clicked.connect(self._copy_key)
        key_row.addWidget(self.copy_key)
        grid.addWidget(caption("API key", KEY_TOOLTIP), 2, 0)
        grid.addLayout(key_row, 2, 1)
        grid.setColumnStretch(1, 1)
        layout.addLayout(grid)
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
        self._keyed = False
        self._waiting = 0

    def host(self) -> str:
        """The address chosen to listen on."""
        return str(self.address.currentData())

    def set_host(self, host: str) -> None:
        """Choose ``host`` again (a saved one); this computer only when it is gone."""
        select_data(self.address, host, fallback=0)

    def _on_address_changed(self) -> None:
        if not is_loopback_host(self.host()) and not self.api_key.text().strip():
            self._make_key()

    def _make_key(self) -> None:
        self.api_key.setText(new_api_key())

    def _copy_key(self) -> None:
        key = self.api_key.text().strip()
        if key:
            QApplication.clipboard().setText(key)

    def _set_editable(self, editable: bool) -> None:
        for field in (self.address, self.port, self.api_key, self.new_key):
            field.setEnabled(editable)

    def _on_toggled(self, on: bool) -> None:
        if not on:
            self._set_editable(True)
            self.stop_requested.emit()
            return
        host, key = self.host(), self.api_key.text().strip()
        if not key and not is_loopback_host(host):
            self._switch_back_off()
            self._show_status(NEEDS_KEY.format(host=host))
            return
        self._set_editable(False)
        self.status.setText("Starting…")
        self.serve_requested.emit(host, self.port.value(), key)

    def _switch_back_off(self) -> None:
        self.switch.blockSignals(True)
        self.switch.setChecked(False)
        self.switch.blockSignals(False)
        self._set_editable(True)

    def set_serving(self, listening: bool, url: str, error: str) -> None:
        """What the engine process says: listening at ``url``, or not (``error`` says why)."""
        self._url = url if listening else ""
        self._keyed = listening and bool(self.api_key.text().strip())
        if not listening and self.switch.isChecked():
            self._switch_back_off()
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
            if self._keyed:
                text += " · API key required"
            if self._waiting:
                text += f" · {self._waiting} in the queue"
        else:
            text = "Off"
        self.status.setText(text)
        self.status.show()
