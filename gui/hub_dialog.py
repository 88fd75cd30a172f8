"""Download models from the Hugging Face hub, with each file's draft verdict before a byte of it.

:class:`HubDialog` searches the hub (:mod:`backends.models.hub`), lists a repo's GGUF files
(or an MLX repo's folder) with their quantization, size and whether they fit here, and, for
the main model picked in the sidebar, whether each can draft for it (read from the file's
header alone). It suggests drafts from the main model's family, downloads with progress,
pauses and resumes, and logs in with huggingface_hub's own token storage. Every failure is
one line under the table. The work runs off the GUI thread
(:class:`gui.background.BackgroundTask`); its results reach bound methods here, which drop
those of work that was replaced meanwhile.
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

from backends.engines.hardware import available_memory
from backends.engines.interface import DEFAULT_CONTEXT_SIZE
from backends.errors import SpecDeckError
from backends.models import hub
from backends.models.draft_verdict import draft_verdict
from backends.models.hub import HubEngine, HubFile, HubRepo, fits_here
from backends.service import hub_drafts
from backends.service.hub_drafts import DraftSuggestion
from gui.background import BackgroundTask
from gui.status_bar import format_bytes
from gui.theme import ERROR_TEXT_STYLE, MUTED_TEXT_STYLE, keep_styled

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from backends.models.gguf_info import ModelInfo
    from backends.speculation.estimates import BatchCosts

ENGINES: tuple[tuple[str, HubEngine], ...] = (("GGUF (llama.cpp)", "llama.cpp"), ("MLX", "mlx"))
COLUMNS = ("File", "Quant", "Size", "Fits here", "As draft")
FILE_COLUMN, QUANT_COLUMN, SIZE_COLUMN, FITS_COLUMN, VERDICT_COLUMN = range(len(COLUMNS))
CHECKING_TEXT = "reading its header…"
REPO_ROLE = Qt.ItemDataRole.UserRole + 1
PROGRESS_STEPS = 1000  # the progress bar's range
DIALOG_SIZE = (1120, 640)
FILE_COLUMN_WIDTH = 330
REPO_LIST_WIDTH, FILE_TABLE_WIDTH = 280, 840
DOWNLOAD_TEXT, RESUME_TEXT = "Download", "Resume"

# What a listing reports as it goes: the files, then for each file read its fit (from its
# header) and its verdict.
ListingEvent = tuple[str, object, object]


class HubDialog(QDialog):
    """Search, check and download models from the hub.

    Signals:
        model_downloaded(str): a model file or folder (or the Hugging Face cache's copy) is
            here now.
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
        self.resize(*DIALOG_SIZE)
        self.main = main
        self.main_costs: BatchCosts | None = None
        self.gpu_free: tuple[int, str] | None = None
        self.context_size = DEFAULT_CONTEXT_SIZE
        self.models_dir = models_dir
        self._token: str | None = None
        self._task: BackgroundTask | None = None  # searching, listing, checking
        self._task_cancel = threading.Event()
        self._login_task: BackgroundTask | None = None
        self._download_task: BackgroundTask | None = None
        self._pause = threading.Event()
        self._listed_files: list[HubFile] = []
        self._listed_engine: HubEngine = "llama.cpp"
        self._listing_repo = ""

        self.query_edit = QLineEdit()
        self.query_edit.setPlaceholderText("Search the hub, e.g. qwen2.5 coder")
        self.engine_combo = QComboBox()
        for title, engine in ENGINES:
            self.engine_combo.addItem(title, engine)
        self.search_button = QPushButton("Search")
        self.search_button.setDefault(True)
        self.suggest_button = QPushButton("Suggest drafts")
        search_row = QHBoxLayout()
        search_row.addWidget(self.query_edit, 1)
        search_row.addWidget(self.engine_combo)
        search_row.addWidget(self.search_button)
        search_row.addWidget(self.suggest_button)

        self.main_label = QLabel()
        self.main_label.setWordWrap(True)
        keep_styled(self.main_label, MUTED_TEXT_STYLE)
        self.repo_list = QListWidget()
        self.file_table = QTableWidget(0, len(COLUMNS))
        self.file_table.setHorizontalHeaderLabels(list(COLUMNS))
        self.file_table.setWordWrap(True)
        self.file_table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.file_table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.file_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.file_table.verticalHeader().hide()
        header = self.file_table.horizontalHeader()
        header.setSectionResizeMode(FILE_COLUMN, QHeaderView.ResizeMode.Interactive)
        header.resizeSection(FILE_COLUMN, FILE_COLUMN_WIDTH)
        for column in (QUANT_COLUMN, SIZE_COLUMN, FITS_COLUMN):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(VERDICT_COLUMN, QHeaderView.ResizeMode.Stretch)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.repo_list)
        split.addWidget(self.file_table)
        split.setSizes([REPO_LIST_WIDTH, FILE_TABLE_WIDTH])

        self.progress = QProgressBar()
        self.progress.setRange(0, PROGRESS_STEPS)
        self.progress.hide()
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.download_button = QPushButton(DOWNLOAD_TEXT)
        self.download_button.setEnabled(False)
        self.pause_button = QPushButton("Pause")
        self.pause_button.setEnabled(False)
        close_button = QPushButton("Close")
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("Hugging Face token (gated repos)")
        self.login_button = QPushButton("Log in")
        self.login_button.setToolTip("Kept by huggingface_hub, where `hf auth login` keeps it")
        buttons = QHBoxLayout()
        buttons.addWidget(self.token_edit, 1)
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
        self.query_edit.returnPressed.connect(self.search)
        self.suggest_button.clicked.connect(self.suggest_drafts)
        self.repo_list.currentItemChanged.connect(self._on_repo_chosen)
        self.file_table.itemSelectionChanged.connect(self._update_buttons)
        self.download_button.clicked.connect(self.download)
        self.pause_button.clicked.connect(self._pause.set)
        self.login_button.clicked.connect(self.log_in)
        close_button.clicked.connect(self.reject)
        self.set_main(main)

    # -- what the user does --------------------------------------------------------------

    def set_main(
        self,
        main: ModelInfo | None,
        main_costs: BatchCosts | None = None,
        gpu_free: tuple[int, str] | None = None,
        context_size: int = DEFAULT_CONTEXT_SIZE,
    ) -> None:
        """Judge files as drafts for ``main`` from the next listing on (None: no verdicts).

        What the loaded pair's engine measured of this machine, when there is one:
        ``main_costs``, the main model's batch costs (suggested drafts are ranked with
        them), and ``gpu_free``, the GPUs' free bytes and the first one's name ("Fits
        here" says GPU only then; the window itself never loads llama.cpp's GPU code).
        ``context_size``: the context a file's fit is judged at once its header is read.
        """
        self.main = main
        self.main_costs = main_costs
        self.gpu_free = gpu_free
        self.context_size = context_size
        self.main_label.setText(
            f"Main model: <b>{main.display_name}</b>, {main.size_label}: each file says "
            "whether it can draft for it, from its header (a few MB), before it is downloaded"
            if main is not None
            else "Pick a main model in the sidebar to see which files can draft for it"
        )
        self.suggest_button.setEnabled(main is not None)
        self.suggest_button.setToolTip(
            "Drafts for the main model from its family on the hub, checked by their headers"
            if main is not None
            else "Pick a main model in the sidebar first"
        )

    def search(self) -> None:
        """Search the hub for the query, with the chosen engine's files."""
        query = self.query_edit.text().strip()
        engine: HubEngine = self.engine_combo.currentData()
        token = self._token

        def work(_report: Callable[[object], None], _cancel: threading.Event) -> object:
            return hub.search(query, engine, token=token)

        self._listed_engine = engine
        self._say(f"Searching for {query!r}…")
        self._run(work, self._show_repos)

    def suggest_drafts(self) -> None:
        """List drafts for the main model from its family, best expected speed-up first."""
        main, main_costs = self.main, self.main_costs
        if main is None:
            return
        token = self._token

        def work(_report: Callable[[object], None], _cancel: threading.Event) -> object:
            return hub_drafts.suggest_drafts(main, main_costs=main_costs, token=token)

        family = hub_drafts.family_query(main)
        self._say(f"Looking for drafts of {main.display_name} ({family})…")
        self._run(work, self._show_suggestions)

    def download(self) -> None:
        """Download the chosen file (or resume it) into the models folder."""
        file = self.chosen_file()
        if file is None or self._running(self._download_task):
            return
        self._pause.clear()
        pause, token, models_dir = self._pause, self._token, self.models_dir

        def work(report: Callable[[object], None]) -> object:
            return hub.download(
                file,
                models_dir,
                progress=lambda done, total: report((done, total)),
                cancel=pause,
                token=token,
            )

        task = self._download_task = BackgroundTask(work, self)
        task.progress.connect(self._show_progress)
        task.succeeded.connect(self._downloaded)
        task.failed.connect(self._download_failed)
        self.progress.setValue(0)
        self.progress.show()
        self._say(f"Downloading {file.filename}…")
        task.start()
        self._update_buttons()

    def log_in(self) -> None:
        """Keep the token with huggingface_hub's own login; use it for what follows."""
        token = self.token_edit.text().strip()
        if not token:
            self._fail("Paste a token from huggingface.co/settings/tokens first")
            return
        if self._running(self._login_task):
            return

        def work(_report: Callable[[object], None]) -> object:
            hub.login(token)
            return token

        task = self._login_task = BackgroundTask(work, self)
        task.succeeded.connect(self._logged_in)
        task.failed.connect(self._fail)
        task.start()

    # -- reading the dialog (tests) -------------------------------------------------------

    def repo_ids(self) -> list[str]:
        """The repos listed, in order."""
        items = (self.repo_list.item(row) for row in range(self.repo_list.count()))
        return [str(item.data(REPO_ROLE)) for item in items]

    def cell(self, row: int, column: int) -> str:
        """The text of a cell of the files table."""
        item = self.file_table.item(row, column)
        return item.text() if item is not None else ""

    def chosen_file(self) -> HubFile | None:
        """The file selected in the table."""
        rows = self.file_table.selectionModel().selectedRows()
        return self._listed_files[rows[0].row()] if rows else None

    def busy(self) -> bool:
        """Whether a search, listing, check, login or download is under way.

        A download is until its result has been shown (its thread may end first).
        """
        tasks = (self._task, self._login_task)
        return self._download_task is not None or any(self._running(task) for task in tasks)

    def status_text(self) -> str:
        """The line under the table."""
        return self.status.text()

    # -- results -------------------------------------------------------------------------

    def _show_repos(self, result: object) -> None:
        if self.sender() is not self._task:
            return  # replaced meanwhile
        assert isinstance(result, list)
        self._clear_repos()
        for repo in result:
            assert isinstance(repo, HubRepo)
            words = f"{repo.downloads:,} downloads" + (" · gated" if repo.gated else "")
            item = QListWidgetItem(f"{repo.repo_id}\n{words}")
            item.setData(REPO_ROLE, repo.repo_id)
            self.repo_list.addItem(item)
        self._say(f"{len(result)} repos" if result else "Nothing found")

    def _on_repo_chosen(self, item: QListWidgetItem | None) -> None:
        if item is None:
            return
        repo_id = self._listing_repo = str(item.data(REPO_ROLE))
        token, main, gpu, n_ctx = self._token, self.main, self.gpu_free, self.context_size
        list_files = hub.mlx_folders if self._listed_engine == "mlx" else hub.gguf_files

        def work(report: Callable[[object], None], cancel: threading.Event) -> object:
            files = list_files(repo_id, token=token)
            ram = available_memory()
            report(("files", files, [fits_here(file.size, ram, gpu) for file in files]))
            for row, file in enumerate(files if main is not None else ()):
                if cancel.is_set():
                    break
                assert main is not None
                try:
                    info = hub.remote_model_info(file, token=token)
                except SpecDeckError as error:
                    report(("verdict", row, str(error)))
                    continue
                # The header says what the model needs at this context: the fit, again.
                report(("fits", row, hub_drafts.fits_at_context(info, n_ctx, ram, gpu)))
                report(("verdict", row, draft_verdict(main, info).summary))
            return len(files)

        self._say(f"Listing {repo_id}…")
        self._run(work, self._listing_done, self._listing_progress)

    def _listing_progress(self, event: object) -> None:
        if self.sender() is not self._task:
            return
        assert isinstance(event, tuple)
        kind, first, second = event
        if kind == "files":
            assert isinstance(first, list)
            assert isinstance(second, list)
            self._fill_files(first, second, CHECKING_TEXT if self.main else "")
        elif kind in ("verdict", "fits"):
            assert isinstance(first, int)
            column = VERDICT_COLUMN if kind == "verdict" else FITS_COLUMN
            self.file_table.setItem(first, column, QTableWidgetItem(str(second)))
            self.file_table.resizeRowToContents(first)

    def _listing_done(self, count: object) -> None:
        if self.sender() is not self._task:
            return
        what = "MLX folder" if self._listed_engine == "mlx" else "GGUF model"
        self._say(f"{self._listing_repo}: {count} {what}{'' if count == 1 else 's'}")

    def _show_suggestions(self, result: object) -> None:
        if self.sender() is not self._task:
            return
        assert isinstance(result, list)
        suggestions = [s for s in result if isinstance(s, DraftSuggestion)]
        self._clear_repos()
        ram, gpu, n_ctx = available_memory(), self.gpu_free, self.context_size
        files = [suggestion.file for suggestion in suggestions]
        fits = [hub_drafts.fits_at_context(s.info, n_ctx, ram, gpu) for s in suggestions]
        self._fill_files(files, fits, "")
        for row, suggestion in enumerate(suggestions):
            self.file_table.setItem(row, FILE_COLUMN, QTableWidgetItem(suggestion.file.repo_id))
            verdict = QTableWidgetItem(
                f"can draft · ≤ {suggestion.best_speedup:.2f}× at best "
                f"({suggestion.info.size_label})"
            )
            verdict.setToolTip(suggestion.explanation)
            self.file_table.setItem(row, VERDICT_COLUMN, verdict)
        self.file_table.resizeRowsToContents()
        main = self.main.display_name if self.main else ""
        self._say(
            f"{len(suggestions)} drafts for {main}"
            if suggestions
            else "No compatible draft found in its family on the hub"
        )

    def _fill_files(self, files: list[HubFile], fits: list[str], verdict: str) -> None:
        self._listed_files = list(files)
        self.file_table.setRowCount(len(files))
        for row, (file, fit) in enumerate(zip(files, fits, strict=True)):
            cells = (file.filename, file.quantization, format_bytes(file.size), fit, verdict)
            for column, text in enumerate(cells):
                self.file_table.setItem(row, column, QTableWidgetItem(text))
        self.file_table.resizeRowsToContents()
        self._update_buttons()

    def _show_progress(self, event: object) -> None:
        assert isinstance(event, tuple)
        done, total = event
        self.progress.setValue(int(PROGRESS_STEPS * done / max(total, 1)))
        self._say(f"Downloading: {format_bytes(done)} of {format_bytes(total)}")

    def _downloaded(self, path: object) -> None:
        self._download_task = None  # ended (its thread may still be returning)
        self.progress.setValue(PROGRESS_STEPS)
        self._say(f"Downloaded and checked: {path}")
        self.model_downloaded.emit(str(path))
        self._update_buttons()

    def _download_failed(self, message: str) -> None:
        self._download_task = None
        if self._pause.is_set():
            self._say(f"Paused: {message}. {RESUME_TEXT} goes on from there.")
        else:
            self._fail(message)
        self._update_buttons()

    def _logged_in(self, token: object) -> None:
        self._token = str(token)
        self.token_edit.clear()
        self._say("Logged in: the token is kept and used for gated repos")

    # -- helpers -------------------------------------------------------------------------

    def _run(
        self,
        work: Callable[[Callable[[object], None], threading.Event], object],
        on_done: Callable[[object], None],
        on_progress: Callable[[object], None] | None = None,
    ) -> None:
        """Run ``work`` instead of the search or listing under way (whose results are dropped)."""
        self._task_cancel.set()
        cancel = self._task_cancel = threading.Event()
        task = self._task = BackgroundTask(lambda report: work(report, cancel), self)
        task.succeeded.connect(on_done)
        task.failed.connect(self._task_failed)
        if on_progress is not None:
            task.progress.connect(on_progress)
        task.start()

    def _task_failed(self, message: str) -> None:
        if self.sender() is self._task:
            self._fail(message)

    def _clear_repos(self) -> None:
        # Removing the current item makes the next one current: no listing for it.
        self.repo_list.blockSignals(True)
        self.repo_list.clear()
        self.repo_list.blockSignals(False)

    def _say(self, text: str) -> None:
        keep_styled(self.status, MUTED_TEXT_STYLE)
        self.status.setText(text)

    def _fail(self, message: str) -> None:
        keep_styled(self.status, ERROR_TEXT_STYLE)
        self.status.setText(message)
        self._update_buttons()

    def _update_buttons(self) -> None:
        downloading = self._running(self._download_task)
        chosen = self.chosen_file()
        self.download_button.setEnabled(not downloading and chosen is not None)
        self.pause_button.setEnabled(downloading)
        resumable = chosen is not None and hub.partial_download(chosen, self.models_dir)
        self.download_button.setText(RESUME_TEXT if resumable else DOWNLOAD_TEXT)

    @staticmethod
    def _running(task: BackgroundTask | None) -> bool:
        return task is not None and task.running()

    def reject(self) -> None:
        """Close: a download under way pauses (what arrived is kept), a listing stops."""
        self._pause.set()
        self._task_cancel.set()
        super().reject()
