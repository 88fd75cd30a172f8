"""Download models from the Hugging Face hub, with each file's draft verdict before a byte of it.

:class:`HubDialog` searches the hub (:mod:`backends.models.hub`), lists a repo's GGUF files
with their quantization, size and whether they fit here, and, for the main model picked in
the sidebar, whether each can draft for it (read from the file's header alone). It
suggests drafts from the main model's family, downloads with progress, pauses and resumes,
and logs in with huggingface_hub's own token storage. Every failure is one line under the
table; the work runs off the GUI thread (:class:`gui.background.BackgroundTask`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from backends.errors import SpecDeckError
from backends.models import hub
from backends.models.draft_verdict import draft_verdict
from backends.models.hub import HubEngine, HubFile, HubRepo
from backends.service import hub_drafts
from backends.service.hub_drafts import DraftSuggestion
from gui.background import BackgroundTask
from gui.status_bar import format_bytes
from gui.theme import ERROR_TEXT_STYLE, MUTED_TEXT_STYLE, keep_styled

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from backends.models.gguf_info import ModelInfo

ENGINES: tuple[tuple[str, HubEngine], ...] = (("GGUF (llama.cpp)", "llama.cpp"), ("MLX", "mlx"))
COLUMNS = ("File", "Quant", "Size", "Fits here", "As draft")
FILE_COLUMN, QUANT_COLUMN, SIZE_COLUMN, FITS_COLUMN, VERDICT_COLUMN = range(len(COLUMNS))
MEMORY_OVERHEAD = 1.2  # a model needs about its file and a fifth more (context, buffers)
CHECKING_TEXT = "reading its header…"
FILE_COLUMN_WIDTH = 330
REPO_ROLE = Qt.ItemDataRole.UserRole + 1


def fits_here(size: int, ram_free: int, gpu_free: tuple[int, str] | None) -> str:
    """Whether a model file of ``size`` bytes fits in the free RAM (and GPU memory)."""
    needed = size * MEMORY_OVERHEAD
    ram = "RAM ✓" if needed <= ram_free else "RAM ✗"
    if gpu_free is None:
        return ram
    return f"{ram} · GPU {'✓' if needed <= gpu_free[0] else '✗'}"


class HubDialog(QDialog):
    """Search, check and download models from the hub.

    Signals:
        model_downloaded(str): a model file (or the Hugging Face cache's copy) is here now.
    """

    model_downloaded = Signal(str)

    def __init__(
        self,
        main: ModelInfo | None,
        models_dir: Path,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Download models from Hugging Face")
        self.resize(1120, 640)
        self.main = main
        self.models_dir = models_dir
        self._token: str | None = None
        self._task: BackgroundTask | None = None  # searching, listing, checking
        self._download: BackgroundTask | None = None
        self._pause = threading.Event()
        self._files: list[HubFile] = []
        self._engine: HubEngine = "llama.cpp"

        self.query = QLineEdit()
        self.query.setPlaceholderText("Search the hub, e.g. qwen2.5 coder")
        self.engine = QComboBox()
        for title, engine in ENGINES:
            self.engine.addItem(title, engine)
        self.search_button = QPushButton("Search")
        self.search_button.setDefault(True)
        self.suggest_button = QPushButton("Suggest drafts")
        self.suggest_button.setEnabled(main is not None)
        self.suggest_button.setToolTip(
            "Drafts for the main model from its family on the hub, checked by their headers"
            if main is not None
            else "Pick a main model in the sidebar first"
        )
        search_row = QHBoxLayout()
        search_row.addWidget(self.query, 1)
        search_row.addWidget(self.engine)
        search_row.addWidget(self.search_button)
        search_row.addWidget(self.suggest_button)

        self.repos = QListWidget()
        self.files = QTableWidget(0, len(COLUMNS))
        self.files.setHorizontalHeaderLabels(list(COLUMNS))
        self.files.setWordWrap(True)
        self.files.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.files.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.files.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.files.verticalHeader().hide()
        header = self.files.horizontalHeader()
        header.setSectionResizeMode(FILE_COLUMN, QHeaderView.ResizeMode.Interactive)
        header.resizeSection(FILE_COLUMN, FILE_COLUMN_WIDTH)
        for column in (QUANT_COLUMN, SIZE_COLUMN, FITS_COLUMN):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(VERDICT_COLUMN, QHeaderView.ResizeMode.Stretch)
        self.main_label = QLabel(
            f"Main model: <b>{main.display_name}</b>, {main.size_label}: each file says "
            "whether it can draft for it, from its header (a few MB), before it is downloaded"
            if main is not None
            else "Pick a main model in the sidebar to see which files can draft for it"
        )
        self.main_label.setWordWrap(True)
        keep_styled(self.main_label, MUTED_TEXT_STYLE)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.repos)
        split.addWidget(self.files)
        split.setSizes([280, 840])

        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.hide()
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.download_button = QPushButton("Download")
        self.download_button.setEnabled(False)
        self.pause_button = QPushButton("Pause")
        self.pause_button.setEnabled(False)
        close_button = QPushButton("Close")
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("Hugging Face token (gated repos)")
        self.login_button = QPushButton("Log in")
        self.login_button.setToolTip("Saved by huggingface_hub, as `hf auth login` does")
        buttons = QHBoxLayout()
        buttons.addWidget(self.token, 1)
        buttons.addWidget(self.login_button)
        buttons.addStretch()
        buttons.addWidget(self.download_button)
        buttons.addWidget(self.pause_button)
        buttons.addWidget(close_button)

        layout = QVBoxLayout(self)
        layout.addLayout(search_row)
        layout.addWidget(self.main_label)
        layout.addWidget(split, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addLayout(buttons)

        self.search_button.clicked.connect(self.search)
        self.query.returnPressed.connect(self.search)
        self.suggest_button.clicked.connect(self.suggest_drafts)
        self.repos.currentItemChanged.connect(self._on_repo_chosen)
        self.files.itemSelectionChanged.connect(self._update_buttons)
        self.download_button.clicked.connect(self.download)
        self.pause_button.clicked.connect(self._pause.set)
        self.login_button.clicked.connect(self.log_in)
        close_button.clicked.connect(self.reject)

    # -- what the user does --------------------------------------------------------------

    def search(self) -> None:
        """Search the hub for the query, with the chosen engine's files."""
        query = self.query.text().strip()
        engine: HubEngine = self.engine.currentData()
        self._engine = engine  # the repos listed are this engine's
        token = self._token
        self._say(f"Searching for {query!r}…")
        self._run(
            lambda _report: hub.search(query, engine, token=token),
            self._show_repos,
        )

    def suggest_drafts(self) -> None:
        """List drafts for the main model from its family, best expected speed-up first."""
        main = self.main
        if main is None:
            return
        token = self._token
        self._say(f"Looking for drafts of {main.display_name} ({hub_drafts.family_query(main)})…")
        self._run(
            lambda _report: hub_drafts.suggest_drafts(main, token=token), self._show_suggestions
        )

    def download(self) -> None:
        """Download the chosen file (or resume its part) into the models folder."""
        file = self.chosen_file()
        if file is None or (self._download is not None and self._download.running()):
            return
        self._pause.clear()
        pause, token, models_dir = self._pause, self._token, self.models_dir

        def work(report: Callable[[object], None]) -> Path:
            return hub.download(
                file,
                models_dir,
                progress=lambda done, total: report((done, total)),
                cancel=pause,
                token=token,
            )

        task = self._download = BackgroundTask(work, self)
        task.progress.connect(self._show_progress)
        task.succeeded.connect(self._downloaded)
        task.failed.connect(self._download_failed)
        self.progress.setValue(0)
        self.progress.show()
        self._say(f"Downloading {file.filename}…")
        task.start()
        self._update_buttons()

    def log_in(self) -> None:
        """Save the token with huggingface_hub's own login; use it for what follows."""
        token = self.token.text().strip()
        if not token:
            self._fail("Paste a token from huggingface.co/settings/tokens first")
            return

        def work(_report: Callable[[object], None]) -> str:
            from huggingface_hub import login

            try:
                login(token=token, add_to_git_credential=False)
            except Exception as error:  # the client's refusal, in one line
                raise SpecDeckError(f"login failed: {str(error).splitlines()[0]}") from None
            return token

        self._run(work, self._logged_in)

    # -- reading the dialog (tests) -------------------------------------------------------

    def repo_ids(self) -> list[str]:
        """The repos listed, in order."""
        return [str(self.repos.item(row).data(REPO_ROLE)) for row in range(self.repos.count())]

    def cell(self, row: int, column: int) -> str:
        """The text of a cell of the files table."""
        item = self.files.item(row, column)
        return item.text() if item is not None else ""

    def chosen_file(self) -> HubFile | None:
        """The file selected in the table."""
        rows = self.files.selectionModel().selectedRows()
        return self._files[rows[0].row()] if rows else None

    def busy(self) -> bool:
        """Whether a search, listing, check or download is under way."""
        return any(task is not None and task.running() for task in (self._task, self._download))

    def status_text(self) -> str:
        """The line under the table."""
        return self.status.text()

    # -- results -------------------------------------------------------------------------

    def _show_repos(self, result: object) -> None:
        assert isinstance(result, list)
        self._clear_repos()
        for repo in result:
            assert isinstance(repo, HubRepo)
            words = f"{repo.downloads:,} downloads" + (" · gated" if repo.gated else "")
            item = QListWidgetItem(f"{repo.repo_id}\n{words}")
            item.setData(REPO_ROLE, repo.repo_id)
            self.repos.addItem(item)
        self._say(f"{len(result)} repos" if result else "Nothing found")

    def _on_repo_chosen(self, item: QListWidgetItem | None) -> None:
        if item is None:
            return
        repo_id = str(item.data(REPO_ROLE))
        token = self._token
        main = self.main
        list_files = hub.mlx_folders if self._engine == "mlx" else hub.gguf_files
        self._say(f"Listing {repo_id}…")

        def work(report: Callable[[object], None]) -> None:
            import psutil

            from backends.engines.hardware import gpu_free_memory

            files = list_files(repo_id, token=token)
            ram, gpu = psutil.virtual_memory().available, gpu_free_memory()
            report(("files", files, [fits_here(f.size, ram, gpu) for f in files]))
            if main is None:
                return
            for row, file in enumerate(files):
                try:
                    verdict = draft_verdict(main, hub.remote_model_info(file, token=token))
                    report(("verdict", row, verdict.summary))
                except SpecDeckError as error:
                    report(("verdict", row, str(error)))

        what = "MLX folder" if self._engine == "mlx" else "GGUF file"
        self._run(work, lambda _none: self._say(f"{repo_id}: {len(self._files)} {what}s"))
        assert self._task is not None
        self._task.progress.connect(self._listing_progress)

    def _listing_progress(self, event: object) -> None:
        assert isinstance(event, tuple)
        if event[0] == "files":
            _kind, files, fits = event
            self._fill_files(files, fits, CHECKING_TEXT if self.main else "")
        elif event[0] == "verdict":
            _kind, row, summary = event
            self.files.setItem(row, VERDICT_COLUMN, QTableWidgetItem(summary))
            self.files.resizeRowToContents(row)

    def _show_suggestions(self, result: object) -> None:
        assert isinstance(result, list)
        suggestions = [s for s in result if isinstance(s, DraftSuggestion)]
        self._clear_repos()
        import psutil

        ram = psutil.virtual_memory().available
        files = [suggestion.file for suggestion in suggestions]
        self._fill_files(files, [fits_here(file.size, ram, None) for file in files], "")
        for row, suggestion in enumerate(suggestions):
            self.files.setItem(row, FILE_COLUMN, QTableWidgetItem(suggestion.file.repo_id))
            verdict = QTableWidgetItem(
                f"can draft · ≤ {suggestion.best_speedup:.2f}× at best "
                f"({suggestion.info.size_label})"
            )
            verdict.setToolTip(suggestion.explanation)
            self.files.setItem(row, VERDICT_COLUMN, verdict)
        self.files.resizeRowsToContents()
        self._say(
            f"{len(suggestions)} drafts that fit {self.main.display_name if self.main else ''}"
            if suggestions
            else "No compatible draft found in its family on the hub"
        )

    def _fill_files(self, files: list[HubFile], fits: list[str], verdict: str) -> None:
        self._files = list(files)
        self.files.setRowCount(len(files))
        for row, (file, fit) in enumerate(zip(files, fits, strict=True)):
            cells = (file.filename, file.quantization, format_bytes(file.size), fit, verdict)
            for column, text in enumerate(cells):
                self.files.setItem(row, column, QTableWidgetItem(text))
        self.files.resizeRowsToContents()
        self._update_buttons()

    def _show_progress(self, event: object) -> None:
        assert isinstance(event, tuple)
        done, total = event
        self.progress.setValue(int(1000 * done / max(total, 1)))
        self._say(f"Downloading: {format_bytes(done)} of {format_bytes(total)}")

    def _downloaded(self, path: object) -> None:
        self._download = None  # ended (its thread may still be returning)
        self.progress.setValue(1000)
        self._say(f"Downloaded and checked: {path}")
        self.model_downloaded.emit(str(path))
        self._update_buttons()

    def _download_failed(self, message: str) -> None:
        self._download = None
        if message.endswith("(resumes where it stopped)") or self._pause.is_set():
            self._say(f"Paused: {message}. Download resumes it.")
            self.download_button.setText("Resume")
        else:
            self._fail(message)
        self._update_buttons()

    def _logged_in(self, token: object) -> None:
        self._token = str(token)
        self.token.clear()
        self._say("Logged in: the token is saved and used for gated repos")

    # -- helpers -------------------------------------------------------------------------

    def _run(
        self, work: Callable[[Callable[[object], None]], object], done: Callable[[object], None]
    ) -> None:
        if self._task is not None and self._task.running():
            self._task.cancelled.set()  # its results are ignored from here
            self._task.progress.disconnect()
            self._task.succeeded.disconnect()
            self._task.failed.disconnect()
        task = self._task = BackgroundTask(work, self)
        task.succeeded.connect(done)
        task.failed.connect(self._fail)
        task.start()

    def _clear_repos(self) -> None:
        # Removing the current item makes the next one current: no listing for it.
        self.repos.blockSignals(True)
        self.repos.clear()
        self.repos.blockSignals(False)

    def _say(self, text: str) -> None:
        keep_styled(self.status, MUTED_TEXT_STYLE)
        self.status.setText(text)

    def _fail(self, message: str) -> None:
        keep_styled(self.status, ERROR_TEXT_STYLE)
        self.status.setText(message)
        self._update_buttons()

    def _update_buttons(self) -> None:
        downloading = self._download is not None and self._download.running()
        self.download_button.setEnabled(not downloading and self.chosen_file() is not None)
        self.pause_button.setEnabled(downloading)
        if not downloading and self.download_button.text() == "Resume":
            chosen = self.chosen_file()
            part = (
                hub.download_folder(self.models_dir, chosen.repo_id)
                / (chosen.filename + hub.PART_SUFFIX)
                if chosen
                else None
            )
            if part is None or not part.exists():
                self.download_button.setText("Download")

    def reject(self) -> None:
        """Close; a download under way pauses (its part is kept for the next time)."""
        self._pause.set()
        for task in (self._task, self._download):
            if task is not None and task.running():
                task.cancelled.set()
                task.wait(5)
        super().reject()
