"""The main window: conversations, the chat, the comparison, the meter and the model sidebar.

The window owns no model: an :class:`EngineClient` runs them in a child process, and every
answer streams in as signals on the GUI thread. The chat history is written to SQLite
before and while an answer is generated, so a crash of the engine (or of the app) loses
nothing already on screen. A crash while loading is recorded (backends.engines.load_guard) and the
load is tried once more with the safest settings; the record keeps the next start, and
"Reload models", from walking into the same crash.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from backends.engines.interface import LOCAL_CPU_PLACE, ChatMessage
from backends.engines.load_guard import (
    SAFEST,
    SAFEST_DESCRIPTION,
    CrashRecords,
    LoadRefusedError,
    avoided_crash_note,
    crash_message,
)
from backends.engines.rpc import parse_workers
from backends.errors import SettingsError, SpecDeckError
from backends.models.catalog import CatalogScan, default_model_folders, scan_models
from backends.paths import user_data_dir
from backends.service.protocol import GenerateRequest, LoadRequest
from gui.about import show_about
from gui.background import BackgroundTask
from gui.chat_pane import ChatPane
from gui.chat_store import ChatStore, HistoryError
from gui.compare_view import CompareView
from gui.conversation_list import ConversationList
from gui.engine_client import EngineClient, EngineDeath, LoadedPair
from gui.fastest_setup import FastestSetupFinder
from gui.first_run import FirstRunDialog
from gui.meter import AcceptanceMeter
from gui.settings import AppSettings, extra_model_folders, generation_settings
from gui.sidebar import Sidebar
from gui.status_bar import ResourceStatusBar, format_bytes
from gui.style import ERROR_TEXT
from gui.transcript import spans_from_tokens
from gui.worker_loss import WorkerProbe, mentions_rpc_failure

if TYPE_CHECKING:
    from backends.service.protocol import RunKind
    from backends.speculation.types import EmittedToken, SpeculationStats
    from gui.transcript import MessageState

log = logging.getLogger("gui")

SAVE_ANSWER_INTERVAL_MS = 500  # how often a streaming answer is written to the history
WINDOW_STATE_FILE = "window.ini"
EMPTY_CHAT_HINT = "Load a model pair in the sidebar, then ask something."
READY_CHAT_HINT = "Ask something below; the draft's accepted tokens show in green."
RELOAD_TEXT = "Reload models"


class MessageInput(QPlainTextEdit):
    """The message box: Enter sends, Shift+Enter starts a new line.

    Signals:
        submitted(): Enter was pressed.
    """

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        """Enter submits unless Shift is held."""
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class _Answer:
    """The answer being generated: where it is stored and what has arrived."""

    def __init__(self, request_id: int, message_id: int, conversation_id: int, compare: bool):
        self.request_id = request_id
        self.message_id = message_id
        self.conversation_id = conversation_id
        self.compare = compare
        self.tokens: list[EmittedToken] = []
        self.stats: SpeculationStats | None = None
        self.plain_stats: SpeculationStats | None = None
        self.speculative_done = False
        self.dirty = False

    @property
    def text(self) -> str:
        return "".join(token.text for token in self.tokens)


class MainWindow(QMainWindow):
    """SpecDeck's window.

    Signals:
        answer_finished(str): an answer ended; its state ("complete", "cancelled", "error").
        models_loaded(): the engine reported a loaded pair.
        load_gave_up(str): a load ended without models and nothing more will be tried
            (an error, a refusal, or a crash with the safest settings); the one-line reason.
    """

    answer_finished = Signal(str)
    models_loaded = Signal()
    load_gave_up = Signal(str)

    def __init__(
        self,
        settings: AppSettings | None = None,
        store: ChatStore | None = None,
        *,
        offer_first_run: bool = True,
    ) -> None:
        super().__init__()
        self.setWindowTitle("SpecDeck")
        self.settings = settings or AppSettings()
        self.store = store or _open_history(self)
        self.client = EngineClient(self)
        self.offer_first_run = offer_first_run
        self.catalog: CatalogScan | None = None
        self.loaded: LoadedPair | None = None
        self.last_load: LoadRequest | None = None  # as the user asked for it
        self.crash_records = CrashRecords()
        self._load_notes: tuple[str, ...] = ()  # why the load differs from what was asked
        self._retried_crash = ""  # the crash the load under way retries after
        # A llama.cpp RPC worker of the last load that went away: Reload offers the pair
        # without it, in a fresh engine process.
        self._lost_worker: str | None = None
        self._worker_probe: WorkerProbe | None = None
        # The engine process lost a worker: it keeps llama.cpp's leftovers of that link, so
        # the next load starts a fresh one.
        self._restart_engine_before_load = False
        self.answer: _Answer | None = None
        self.conversation_id: int | None = None
        self._scan_task: BackgroundTask | None = None
        self._load_after_scan = False

        self._build()
        self._connect()
        self._restore_window_state()
        self.conversations.refresh()
        summaries = self.store.list_conversations()
        if summaries:
            self.open_conversation(summaries[0].conversation_id)
        else:
            self.new_chat()
        self._update_controls()
        self.rescan_models()

    # -- construction ------------------------------------------------------------------------

    def _build(self) -> None:
        """The window's areas: chats | conversation | meter and sidebar; menus; timers."""
        self.conversations = ConversationList(self.store)
        self.chat = ChatPane()
        self.chat.set_visualize_drafts(bool(self.settings.get("visualize_drafts")))
        self.chat.browser.setPlaceholderText(EMPTY_CHAT_HINT)
        self.compare_view = CompareView()
        self.compare_view.set_visualize_drafts(bool(self.settings.get("visualize_drafts")))
        self.meter = AcceptanceMeter()
        self.sidebar = Sidebar(self.settings)
        self.status = ResourceStatusBar()
        self.setStatusBar(self.status)
        self.main_split = QSplitter(Qt.Orientation.Horizontal)
        self.main_split.addWidget(self.conversations)
        self.main_split.addWidget(self._build_conversation_area())
        self.main_split.addWidget(self._build_right_column())
        self.main_split.setStretchFactor(1, 1)
        self.main_split.setSizes([210, 760, 330])
        self.setCentralWidget(self.main_split)
        self.resize(1360, 860)
        self._build_menus()
        self._save_timer = QTimer(self)
        self._save_timer.setInterval(SAVE_ANSWER_INTERVAL_MS)
        self._save_timer.timeout.connect(self._save_streaming_answer)

    def _build_crash_banner(self) -> QWidget:
        self.crash_banner = QWidget()
        banner_layout = QHBoxLayout(self.crash_banner)
        banner_layout.setContentsMargins(8, 4, 8, 4)
        self.crash_label = QLabel()
        self.crash_label.setWordWrap(True)
        self.crash_label.setStyleSheet(f"color: {ERROR_TEXT.name()}")
        self.reload_button = QPushButton(RELOAD_TEXT)
        banner_layout.addWidget(self.crash_label, 1)
        banner_layout.addWidget(self.reload_button)
        self.crash_banner.hide()
        return self.crash_banner

    def _build_conversation_area(self) -> QWidget:
        """The crash banner, the chat over the comparison, the toggles and the message box."""
        self.input = MessageInput()
        self.input.setPlaceholderText("Ask something… (Enter sends, Shift+Enter new line)")
        self.input.setMaximumHeight(96)
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Answer the last message again")
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the last answer")
        self.compare_toggle = QCheckBox("Compare side by side")
        self.compare_toggle.setToolTip(
            "Answer each message twice from the same state, with speculative decoding and "
            "with the main model alone, one after the other, and show the speedup"
        )
        self.compare_toggle.setChecked(bool(self.settings.get("compare")))
        self.visualize_toggle = QCheckBox("Visualize accepted draft tokens")
        self.visualize_toggle.setToolTip(
            "Show tokens that were drafted and accepted by the main model on a green background"
        )
        self.visualize_toggle.setChecked(bool(self.settings.get("visualize_drafts")))

        toggles = QHBoxLayout()
        toggles.addWidget(self.compare_toggle)
        toggles.addWidget(self.visualize_toggle)
        toggles.addStretch()
        toggles.addWidget(self.copy_button)
        toggles.addWidget(self.regenerate_button)
        entry = QHBoxLayout()
        entry.addWidget(self.input, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        entry.addLayout(buttons)

        self.center_split = QSplitter(Qt.Orientation.Vertical)
        self.center_split.addWidget(self.chat)
        self.center_split.addWidget(self.compare_view)
        self.center_split.setStretchFactor(0, 3)
        self.center_split.setStretchFactor(1, 2)
        self.compare_view.setVisible(self.compare_toggle.isChecked())

        center = QWidget()
        center_layout = QVBoxLayout(center)
        center_layout.setContentsMargins(4, 4, 4, 4)
        center_layout.addWidget(self._build_crash_banner())
        center_layout.addWidget(self.center_split, 1)
        center_layout.addLayout(toggles)
        center_layout.addLayout(entry)
        return center

    def _build_right_column(self) -> QWidget:
        """The live meter over the sidebar."""
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.meter)
        right.addWidget(self.sidebar)
        right.setStretchFactor(1, 1)
        return right

    def _build_menus(self) -> None:
        stop = QAction("Stop", self)
        stop.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        stop.triggered.connect(self.stop_generation)
        self.addAction(stop)  # Ctrl+N belongs to the conversation list's "New chat"
        chat_menu = self.menuBar().addMenu("&Chat")
        chat_menu.addAction(self.conversations.new_chat_action)
        chat_menu.addAction(stop)
        chat_menu.addSeparator()
        quit_action = chat_menu.addAction("&Quit")
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        help_menu = self.menuBar().addMenu("&Help")
        forget = help_menu.addAction("&Forget load crashes")
        forget.setToolTip("Let SpecDeck try settings that crashed the engine while loading again")
        forget.triggered.connect(self.forget_load_crashes)
        about = help_menu.addAction(f"&About {self.windowTitle()}")
        about.triggered.connect(self.show_about)

    def _connect(self) -> None:
        client = self.client
        client.load_progress.connect(self.sidebar.set_load_progress)
        client.loaded.connect(self._on_loaded)
        client.unloaded.connect(self._on_unloaded)
        client.run_started.connect(self._on_run_started)
        client.tokens_arrived.connect(self._on_tokens)
        client.run_finished.connect(self._on_run_finished)
        client.compared.connect(self._on_compared)
        client.failed.connect(self._on_engine_error)
        client.crashed.connect(self._on_engine_crashed)
        client.workers.connect(self._on_workers)
        server = self.sidebar.server_panel
        server.port.setValue(self.settings.get_int("server_port"))
        server.api_key.setText(self.settings.get_str("server_api_key"))
        server.set_host(self.settings.get_str("server_host"))
        server.serve_requested.connect(self._serve)
        server.stop_requested.connect(self.client.stop_serving)
        client.serving.connect(server.set_serving)
        client.crashed.connect(lambda *_: server.set_serving(False, "", ""))
        client.api_started.connect(self._on_api_started)
        client.api_tokens.connect(self._on_api_tokens)
        client.api_finished.connect(self._on_api_finished)
        client.api_failed.connect(lambda _id, message: server.add_failure(message))
        client.api_queue.connect(server.set_waiting)

        self.fastest_setup = FastestSetupFinder(
            client,
            self.sidebar,
            self.store,
            self,
            is_answering=lambda: self.answer is not None,
            loaded_request=lambda: self.last_load if self.loaded is not None else None,
            loaded_main=lambda: self.loaded.main if self.loaded is not None else None,
        )
        self.fastest_setup.running_changed.connect(lambda _running: self._update_controls())
        self.sidebar.tune_requested.connect(self.fastest_setup.open)
        self.sidebar.load_requested.connect(self.load_models)
        self.sidebar.unload_requested.connect(self.unload_models)
        self.sidebar.pair_changed.connect(self._update_estimate)
        self.sidebar.open_folder_requested.connect(self._show_first_run)
        self.sidebar.fetch_default_pair_requested.connect(self._show_first_run)
        self.settings.changed.connect(self._on_setting_changed)

        self.conversations.conversation_selected.connect(self.open_conversation)
        self.conversations.new_chat_requested.connect(self.new_chat)
        self.conversations.conversation_deleted.connect(self._on_conversation_deleted)

        self.input.submitted.connect(self.send_message)
        self.send_button.clicked.connect(self.send_message)
        self.stop_button.clicked.connect(self.stop_generation)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.copy_button.clicked.connect(lambda: self.chat.copy_answer(-1))
        self.compare_toggle.toggled.connect(lambda on: self.settings.set("compare", on))
        self.visualize_toggle.toggled.connect(lambda on: self.settings.set("visualize_drafts", on))
        self.reload_button.clicked.connect(self.reload_models)

    # -- models ------------------------------------------------------------------------------

    def rescan_models(self) -> None:
        """Read the model folders on a worker thread and fill the pickers."""
        folders = default_model_folders()
        for path in extra_model_folders(self.settings):
            if path.is_dir() and path not in folders:
                folders.append(path)
        task = self._scan_task = BackgroundTask(lambda _report: scan_models(folders), self)
        task.succeeded.connect(self._on_scanned)
        task.failed.connect(self.sidebar.show_error)
        task.start()

    def load_when_scanned(self) -> None:
        """Load the sidebar's selected pair as soon as the model folders have been read."""
        if self.catalog is not None:
            self._load_selected_pair()
        else:
            self._load_after_scan = True

    def _load_selected_pair(self) -> None:
        try:
            request = self.sidebar.load_request()
        except SpecDeckError as error:
            self.sidebar.show_error(str(error))
            return
        self.load_models(request)

    def _on_scanned(self, scan: object) -> None:
        assert isinstance(scan, CatalogScan)
        self.catalog = scan
        self.sidebar.set_catalog(scan)
        self._update_estimate()
        if self._load_after_scan and scan.models:
            self._load_after_scan = False
            self._load_selected_pair()
        if not scan.models and self.offer_first_run:
            self.offer_first_run = False
            QTimer.singleShot(0, self._show_first_run)

    def _show_first_run(self) -> None:
        dialog = FirstRunDialog(self)
        if dialog.exec() and dialog.chosen_folder is not None:
            folders = [*map(str, extra_model_folders(self.settings)), str(dialog.chosen_folder)]
            self.settings.set("extra_model_folders", os.pathsep.join(dict.fromkeys(folders)))
        else:
            self.rescan_models()

    def load_models(self, request: object, *, keep_banner: bool = False) -> None:
        """Load the pair the sidebar asked for in the engine process.

        Settings that crashed the engine for one of these models on this CPU are replaced
        by the safest ones (and the load report says why); a pair that crashed even so is
        refused with a one-line message.
        """
        assert isinstance(request, LoadRequest)
        self.last_load = request
        if not keep_banner:
            self.crash_banner.hide()
            self._lost_worker = None
            self.reload_button.setText(RELOAD_TEXT)
        self._worker_probe = None  # a probe still running speaks of the last load
        self.status.set_workers(())
        if self._restart_engine_before_load:
            self._restart_engine_before_load = False
            self.client.stop()
        self.loaded = None
        self.sidebar.clear_error()
        try:
            settings, crash = self.crash_records.choose(request.models, request.risky)
        except LoadRefusedError as error:
            self.crash_banner.hide()
            self.sidebar.set_loading(False)
            self.sidebar.set_unloaded()
            self.sidebar.show_error(str(error))
            self._update_controls()
            self.load_gave_up.emit(str(error))
            return
        self._load_notes = (avoided_crash_note(crash),) if crash is not None else ()
        self.sidebar.set_loading(True, request)
        self.client.load(request.with_risky(settings))
        self.status.set_engine_pid(self.client.pid)
        self._update_controls()

    def forget_load_crashes(self) -> None:
        """Drop the crash records, so that settings that crashed may be tried again."""
        count = self.crash_records.forget()
        self.statusBar().showMessage(f"Forgot {count} load crash{'es' if count != 1 else ''}", 4000)

    def unload_models(self) -> None:
        """Free the models (the engine process stays, empty)."""
        if self.answer is not None:
            self.stop_generation()
        self.client.unload()

    def reload_models(self) -> None:
        """After a crash: start a fresh engine process and load the last pair again.

        After a lost worker: the pair without that worker (the Workers setting follows), in
        a fresh engine process (the old one holds what llama.cpp kept of the lost link).
        """
        self.crash_banner.hide()
        if self.last_load is None:
            return
        request = self.last_load
        if self._lost_worker is not None:
            request = request.without_worker(self._lost_worker)
            self._lost_worker = None
            self.reload_button.setText(RELOAD_TEXT)
            self.settings.set("workers", ", ".join(request.workers))
            self.settings.set("layer_split", "")
        self.load_models(request)

    # -- workers (llama.cpp RPC) -------------------------------------------------------------

    def _on_workers(self, reports: object) -> None:
        """The engine says how the main model's workers are: status bar, and a lost one."""
        assert isinstance(reports, tuple)
        self.status.set_workers(reports)
        lost = [report for report in reports if not report.reachable]
        if lost and self.last_load is not None:
            self._offer_reload_without(
                lost[0].address,
                f"Worker {lost[0].address} is {lost[0].problem}: the main model cannot answer "
                "without it.",
            )

    def _offer_reload_without(self, worker: str, text: str) -> None:
        self._lost_worker = worker
        self._restart_engine_before_load = True
        self.crash_label.setText(f"⚠ {text}")
        self.reload_button.setText(f"Reload without {worker}")
        self.reload_button.show()
        self.crash_banner.show()

    def _find_lost_worker(self, message: str, while_loading: bool) -> None:
        """The engine died with its main model on workers: name the one that went away."""
        assert self.last_load is not None
        self.crash_label.setText(f"⚠ {message}. Checking the workers…")
        self.reload_button.hide()
        self.crash_banner.show()
        probe = WorkerProbe(self.last_load.workers, self)
        self._worker_probe = probe

        def found(worker: str, problem: str) -> None:
            if self._worker_probe is not probe:
                return  # another load began meanwhile
            self._worker_probe = None
            if worker:
                what = "while loading" if while_loading else "mid-answer"
                text = f"Worker {worker} stopped answering {what} ({problem})"
                self._offer_reload_without(worker, f"{text}.")
            else:  # every worker answers: the engine died of something else
                text = f"{message[0].upper()}{message[1:]}"
                self.crash_label.setText(f"⚠ {text}")
                self.reload_button.setVisible(self.last_load is not None)
            if self.answer is not None:
                if self.answer.compare:
                    self.compare_view.cancel()
                self._end_answer("error", error=f"{text}. The text above was kept.")
            self._update_controls()

        probe.finished.connect(found)
        probe.start()

    def _on_loaded(self, pair: object) -> None:
        assert isinstance(pair, LoadedPair)
        self.loaded = pair
        self.sidebar.set_loaded(
            pair.main, pair.draft, pair.load_seconds or None, extra_notes=self._load_notes
        )
        if self._retried_crash:
            self.crash_label.setText(
                f"⚠ {self._retried_crash}. Loaded again with the safest settings "
                f"({SAFEST_DESCRIPTION})."
            )
            self.reload_button.hide()  # the retry worked: nothing to reload
        self._retried_crash = ""
        self.status.set_engine_pid(self.client.pid)
        self.status.set_gpu(_gpu_summary(pair))
        self._update_controls()
        self.models_loaded.emit()

    def _on_unloaded(self) -> None:
        self.loaded = None
        self.status.set_workers(())
        self.sidebar.set_unloaded()
        self.status.set_gpu("No model loaded")
        self._update_controls()

    def _update_estimate(self) -> None:
        main = self.sidebar.selected_main()
        draft = self.sidebar.selected_draft()
        try:
            workers = len(parse_workers(self.settings.get_str("workers")))
        except SettingsError:
            workers = 0  # the load will say what is wrong with the list
        self.status.set_pair_estimate(
            main, draft, int(self.settings.get("context_size")), workers=workers
        )

    # -- conversations -----------------------------------------------------------------------

    def new_chat(self) -> None:
        """Start an empty conversation (Ctrl+N)."""
        if self.answer is not None:
            return
        conversation_id = self.store.create_conversation()
        self.conversations.refresh()
        self.open_conversation(conversation_id)

    def open_conversation(self, conversation_id: int) -> None:
        """Show a stored conversation."""
        if self.answer is not None and conversation_id != self.conversation_id:
            self.conversations.select(self.conversation_id or conversation_id)
            self.statusBar().showMessage("Wait for the answer to finish, or stop it (Esc)", 4000)
            return
        self.conversation_id = conversation_id
        self.chat.set_messages(self.store.messages(conversation_id))
        self.conversations.select(conversation_id)
        self._update_controls()

    def _on_conversation_deleted(self, conversation_id: int) -> None:
        answer = self.answer
        if answer is not None and answer.conversation_id == conversation_id:
            # Its rows are gone with the conversation: stop and forget the answer.
            self.answer = None
            self._save_timer.stop()
            self.client.cancel()
            self.meter.reset()
            self._update_controls()
        if conversation_id != self.conversation_id:
            return
        self.conversation_id = None
        summaries = self.store.list_conversations()
        if summaries:
            self.open_conversation(summaries[0].conversation_id)
        else:
            self.new_chat()

    def _history(self) -> list[ChatMessage]:
        assert self.conversation_id is not None
        messages: list[ChatMessage] = []
        system = str(self.settings.get("system_prompt") or "").strip()
        if system:
            messages.append(ChatMessage("system", system))
        for record in self.store.messages(self.conversation_id):
            if record.role == "assistant" and not record.content:
                continue
            messages.append(ChatMessage(record.role, record.content))
        return messages

    # -- generation --------------------------------------------------------------------------

    def send_message(self) -> None:
        """Save the typed message, then ask the engine to answer it."""
        text = self.input.toPlainText().strip()
        if not text or self.answer is not None:
            return
        if self.loaded is None:
            self.sidebar.show_error("Load a main model first (Load in the sidebar)")
            return
        if self.conversation_id is None:
            self.new_chat()
        assert self.conversation_id is not None
        self.store.add_message(self.conversation_id, "user", text)
        self.conversations.refresh()
        self.conversations.select(self.conversation_id)
        self.input.clear()
        self.chat.append_user_message(text)
        self._start_answer()

    def regenerate(self) -> None:
        """Drop the last answer and answer the last user message again."""
        if self.answer is not None or self.conversation_id is None or self.loaded is None:
            return
        records = self.store.messages(self.conversation_id)
        if not records or records[-1].role != "assistant" or records[-1].message_id is None:
            return
        self.store.delete_messages_from(records[-1].message_id)
        self.chat.set_messages(self.store.messages(self.conversation_id))
        self._start_answer()

    def _start_answer(self) -> None:
        assert self.conversation_id is not None
        try:
            settings = generation_settings(self.settings)
            request = GenerateRequest(
                self.client.new_request_id(),
                tuple(self._history()),
                settings,
                compare=self.compare_toggle.isChecked(),
            )
        except SpecDeckError as error:
            self.sidebar.show_error(str(error))
            return
        method = request.method or (self.loaded.method if self.loaded else None)
        message_id = self.store.begin_answer(self.conversation_id, method)
        self.answer = _Answer(request.request_id, message_id, self.conversation_id, request.compare)
        self.chat.begin_answer(method)
        self.meter.start(method or "")
        if request.compare:
            self.compare_view.begin(method or "")
        self._save_timer.start()
        self.client.generate(request)
        self._update_controls()

    def stop_generation(self) -> None:
        """Stop the running answer (Esc); what was generated stays."""
        if self.answer is not None:
            self.client.cancel()

    def _is_current(self, request_id: int) -> bool:
        return self.answer is not None and self.answer.request_id == request_id

    def _on_run_started(self, request_id: int, run: str, prompt_tokens: int) -> None:
        if self._is_current(request_id) and run == "speculative":
            self.meter.prompt_started(prompt_tokens)

    def _on_tokens(
        self, request_id: int, run: str, tokens: list[EmittedToken], stats: SpeculationStats
    ) -> None:
        if not self._is_current(request_id):
            return
        assert self.answer is not None
        if run == "speculative":
            self.answer.tokens.extend(tokens)
            self.answer.stats = stats
            self.answer.dirty = True
            self.chat.append_tokens(tokens)
            self.meter.update_stats(stats)
        if self.answer.compare:
            self.compare_view.append_tokens(_run_kind(run), tokens)
            self.compare_view.update_stats(_run_kind(run), stats)

    def _on_run_finished(
        self, request_id: int, run: str, tokens: list[EmittedToken], stats: SpeculationStats
    ) -> None:
        if not self._is_current(request_id):
            return
        answer = self.answer
        assert answer is not None
        if answer.compare:
            self.compare_view.append_tokens(_run_kind(run), tokens)
            self.compare_view.finish_run(_run_kind(run), stats)
        if run == "plain":
            answer.plain_stats = stats
            if stats.stop_reason == "cancelled":
                self._end_answer("cancelled")
            return
        answer.tokens.extend(tokens)
        answer.stats = stats
        answer.speculative_done = True
        self.chat.append_tokens(tokens)
        self.meter.finish(stats)
        cancelled = stats.stop_reason == "cancelled"
        if cancelled and answer.compare:
            self.compare_view.cancel()
        if not answer.compare or cancelled:
            self._end_answer("cancelled" if cancelled else "complete")

    # -- answers for other programs (the local API) ------------------------------------------

    def _serve(self, host: str, port: int, api_key: str) -> None:
        self.settings.set("server_host", host)
        self.settings.set("server_port", port)
        self.settings.set("server_api_key", api_key)
        self.client.serve(port, host=host, api_key=api_key or None)

    def _on_api_started(self, _api_id: int, prompt_tokens: int, queued: int) -> None:
        self.sidebar.server_panel.set_waiting(queued)
        if self.answer is None:  # the meter follows API answers while the chat is idle
            method = self.loaded.method if self.loaded is not None else ""
            self.meter.start(f"{method} · API" if method else "API")
            self.meter.prompt_started(prompt_tokens)

    def _on_api_tokens(self, _api_id: int, _tokens: object, stats: SpeculationStats) -> None:
        if self.answer is None:
            self.meter.update_stats(stats)

    def _on_api_finished(self, _api_id: int, _tokens: object, stats: SpeculationStats) -> None:
        self.sidebar.server_panel.add_request(stats)
        if self.answer is None:
            self.meter.finish(stats)

    def _on_compared(self, request_id: int, speedup: object, identical: object) -> None:
        if not self._is_current(request_id):
            return
        assert self.answer is not None
        self.compare_view.set_result(
            float(speedup) if isinstance(speedup, (int, float)) else None,
            identical if isinstance(identical, bool) else None,
        )
        self.answer_extra = {"speedup": speedup, "identical": identical}
        self._end_answer(
            "complete", extra={"compare": {"speedup": speedup, "identical": identical}}
        )

    def _end_answer(
        self, state: MessageState, error: str | None = None, extra: dict[str, object] | None = None
    ) -> None:
        answer = self.answer
        if answer is None:
            return
        self.answer = None
        self._save_timer.stop()
        self.store.finish_answer(
            answer.message_id,
            answer.text,
            spans_from_tokens(answer.tokens),
            answer.stats,
            state,
            error,
            extra,
        )
        if answer.conversation_id == self.conversation_id:
            self.chat.finish_answer(answer.stats, state, error)
        if state != "complete":
            self.meter.reset() if answer.stats is None else self.meter.finish(answer.stats)
        self.conversations.refresh()
        self._update_controls()
        self.answer_finished.emit(state)

    def _save_streaming_answer(self) -> None:
        answer = self.answer
        if answer is None or not answer.dirty:
            return
        answer.dirty = False
        self.store.update_answer(answer.message_id, answer.text, spans_from_tokens(answer.tokens))

    def _on_engine_error(self, message: str, request_id: object) -> None:
        if self.fastest_setup.owns(request_id):
            return  # the trials' dialog shows it
        if isinstance(request_id, int) and self._is_current(request_id):
            if self.answer is not None and self.answer.compare:
                self.compare_view.cancel()
            self._end_answer("error", error=message)
            return
        if self.loaded is None:
            self.sidebar.set_loading(False)
            self.sidebar.set_unloaded()
            self.load_gave_up.emit(message)
        self.sidebar.show_error(message)
        self._update_controls()

    def _on_engine_crashed(self, message: str, death: object) -> None:
        assert isinstance(death, EngineDeath)
        self.status.set_workers(())
        on_workers = self.last_load is not None and bool(self.last_load.workers)
        lost_link = on_workers and mentions_rpc_failure(self.client.last_log_lines())
        if death.loading is not None and not lost_link:
            self._on_load_crashed(death)
            return
        self._forget_dead_engine()
        self.sidebar.set_loading(False)
        self.sidebar.set_unloaded()
        if on_workers:
            # No load crash to remember: a worker went away (or may have); say which.
            self._find_lost_worker(message, while_loading=death.loading is not None)
            return
        if self.answer is not None:
            if self.answer.compare:
                self.compare_view.cancel()
            self._end_answer("error", error=f"{message}. The text above was kept.")
        self.crash_label.setText(f"⚠ {message}")
        self.reload_button.setVisible(self.last_load is not None)
        self.crash_banner.show()
        self._update_controls()

    def _forget_dead_engine(self) -> None:
        self.loaded = None
        self.status.set_engine_pid(None)
        self.status.set_gpu("No model loaded")

    def _on_load_crashed(self, death: EngineDeath) -> None:
        """Record the crash; retry once with the safest settings unless those crashed."""
        loading = death.loading
        assert loading is not None
        self._forget_dead_engine()
        settings = loading.request.risky
        self.crash_records.record(loading.model_path, settings, loading.stage, death.cause)
        crash = crash_message(loading.model_path, loading.stage, settings, death.cause)
        crash = crash[0].upper() + crash[1:]
        retry = settings != SAFEST and self.last_load is not None
        self._retried_crash = crash if retry else ""
        if retry:
            text = f"{crash}. Retrying once with the safest settings ({SAFEST_DESCRIPTION})."
        else:
            text = (
                f"{crash}. Nothing safer is left to try: SpecDeck will not load it this way again."
            )
        self.crash_label.setText(f"⚠ {text}")
        self.reload_button.hide()
        self.crash_banner.show()
        if retry and self.last_load is not None:
            # The records now hold the crash: the same request loads with the safest settings.
            self.load_models(self.last_load, keep_banner=True)
            return
        self.sidebar.set_loading(False)
        self.sidebar.set_unloaded()
        self._update_controls()
        self.load_gave_up.emit(text)

    # -- settings and state ------------------------------------------------------------------

    def _on_setting_changed(self, key: str) -> None:
        value = self.settings.get(key)
        if key == "visualize_drafts":
            self.chat.set_visualize_drafts(bool(value))
            self.compare_view.set_visualize_drafts(bool(value))
            if self.visualize_toggle.isChecked() != bool(value):
                self.visualize_toggle.setChecked(bool(value))
        elif key == "compare":
            self.compare_view.setVisible(bool(value))
            if self.compare_toggle.isChecked() != bool(value):
                self.compare_toggle.setChecked(bool(value))
        elif key in ("context_size", "workers"):
            self._update_estimate()
        elif key == "extra_model_folders":
            self.rescan_models()

    def _update_controls(self) -> None:
        answering = self.answer is not None
        generating = answering or self.fastest_setup.running  # the engine is busy
        self.send_button.setEnabled(not generating and self.loaded is not None)
        self.stop_button.setEnabled(answering)
        has_answer = self.chat.answer_count() > 0
        self.regenerate_button.setEnabled(not generating and self.loaded is not None and has_answer)
        self.copy_button.setEnabled(has_answer)
        self.sidebar.set_busy(generating)
        self.chat.browser.setPlaceholderText(
            EMPTY_CHAT_HINT if self.loaded is None else READY_CHAT_HINT
        )

    def _restore_window_state(self) -> None:
        state = QSettings(str(user_data_dir() / WINDOW_STATE_FILE), QSettings.Format.IniFormat)
        geometry = state.value("geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        splitter = state.value("main_split")
        if isinstance(splitter, QByteArray):
            self.main_split.restoreState(splitter)

    def _save_window_state(self) -> None:
        state = QSettings(str(user_data_dir() / WINDOW_STATE_FILE), QSettings.Format.IniFormat)
        state.setValue("geometry", self.saveGeometry())
        state.setValue("main_split", self.main_split.saveState())

    def show_about(self) -> None:
        """The About box (version, build, engine backend, data folders)."""
        if self.loaded is None:
            show_about(self)
            return
        notes = (note for note in self.loaded.main.notes if note.startswith("weight repacking"))
        show_about(self, self.loaded.main.backend, next(notes, None))

    def shutdown(self) -> None:
        """Save what streams, stop the engine, close the history (idempotent)."""
        self.sidebar.flush_pending_edits()
        if self.answer is not None:
            self._save_streaming_answer()
            self.client.cancel()
        self.client.stop()
        if self._scan_task is not None:
            self._scan_task.wait(5)
        self._save_window_state()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt's name
        """Quit cleanly: the answer so far is in the history already."""
        self.shutdown()
        super().closeEvent(event)


def _run_kind(run: str) -> RunKind:
    if run == "plain":
        return "plain"
    return "speculative"


def _gpu_summary(pair: LoadedPair) -> str:
    """Where the layers went, and the GPU memory left where the backend reports it."""
    main = pair.main
    if main.layer_placement:
        workers = sum(1 for where, _count in main.layer_placement if where.startswith("worker "))
        here = dict(main.layer_placement).get(LOCAL_CPU_PLACE, 0)
        text = f"Main model on {workers} worker{'s' if workers != 1 else ''}"
        text += f" and {here} layers here" if here else ""
        return text + (", draft here" if pair.draft is not None else "")
    if main.gpu_layers <= 0:
        return f"{main.backend} build: no GPU offload"
    text = f"{main.backend}: main {main.gpu_layers}/{main.n_layers} layers on GPU"
    if pair.draft is not None and pair.draft.gpu_layers >= pair.draft.n_layers:
        text += ", draft all layers on GPU"
    for gpu in pair.gpus:
        if gpu.memory_free is not None and gpu.memory_total is not None:
            free, total = format_bytes(gpu.memory_free), format_bytes(gpu.memory_total)
            text += f" · {gpu.description or gpu.name}: {free} free of {total}"
    return text


def _open_history(parent: QWidget) -> ChatStore:
    """Open the chat history; a corrupt file is moved aside after telling the user."""
    path = ChatStore.default_path()
    try:
        return ChatStore(path)
    except HistoryError as error:
        moved = ChatStore.move_aside(path)
        QMessageBox.warning(
            parent,
            "Chat history unreadable",
            f"{error}\n\nIt was moved to {moved.name}; SpecDeck starts with an empty history.",
        )
        return ChatStore(path)
