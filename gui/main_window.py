"""The main window: conversations, the chat, the comparison, the meter and the model sidebar.

The window owns no model: an :class:`EngineClient` runs them in a child process, and every
answer streams in as signals on the GUI thread. The window lays out its parts and wires
them; two controllers do the work: :class:`LoadController` loads pairs and owns what a
dead engine process or a lost worker leaves behind (the crash banner shows its state), and
:class:`AnswerController` streams the answer under way into the chat, the comparison, the
meter and the history (written before and while it is generated, so a crash of the engine,
or of the app, loses nothing already on screen).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QGuiApplication,
    QKeyEvent,
    QKeySequence,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from backends.engines.hardware import GPU_KINDS
from backends.engines.worker_probe import parse_workers
from backends.errors import SettingsError, SpecDeckError
from backends.models.catalog import CatalogScan
from backends.paths import models_dir, user_data_dir
from backends.service.protocol import LoadRequest
from backends.speculation.estimates import BatchCosts
from gui.about import show_about
from gui.answer_controller import AnswerController
from gui.chat_export import ChatFileError, chat_from_json, chat_to_json, chat_to_markdown
from gui.chat_pane import ChatPane
from gui.chat_store import ChatStore, HistoryError
from gui.compare_view import CompareView
from gui.conversation_list import ConversationList
from gui.crash_banner import CrashBanner
from gui.engine_client import EngineClient
from gui.fastest_setup import FastestSetupFinder
from gui.first_run import FirstRunDialog
from gui.hub_dialog import HubDialog
from gui.load_controller import LoadController, LoadState
from gui.meter import AcceptanceMeter
from gui.settings import AppSettings
from gui.settings_to_backends import extra_model_folders
from gui.sidebar import Sidebar
from gui.status_bar import ResourceStatusBar
from gui.theme import apply_theme

if TYPE_CHECKING:
    from backends.engines.load_guard import CrashRecords
    from gui.answer_controller import Answer
    from gui.engine_client import PairReport

log = logging.getLogger(__name__)

WINDOW_STATE_FILE = "window.ini"
EMPTY_CHAT_HINT = "Load a model pair in the sidebar, then ask something."
READY_CHAT_HINT = "Ask something below; the draft's accepted tokens show in green."
EDITING_MESSAGE = "Editing a sent message: Enter answers it as an alternative, Esc cancels"
# Export kinds: the file suffix and the file dialog's filter.
EXPORT_KINDS = {
    "markdown": (".md", "Markdown (*.md)"),
    "json": (".json", "SpecDeck chat (*.json)"),
}
MAX_FILE_STEM = 60
# Settings each chat keeps for itself: shown in the sidebar while the chat is open.
PER_CHAT_SETTINGS = ("system_prompt", "context_overflow")


def export_file_stem(title: str) -> str:
    """A file name for a chat's title: letters, digits, dashes ("chat" if none are left)."""
    stem = re.sub(r"[^\w-]+", "-", title, flags=re.UNICODE).strip("-")[:MAX_FILE_STEM]
    return stem or "chat"


class MessageInput(QPlainTextEdit):
    """The message box: Enter sends, Shift+Enter starts a new line.

    With ``send_with_ctrl`` Ctrl+Enter sends and Enter starts a new line instead.

    Signals:
        submitted(): the key that sends was pressed.
        edit_last_requested(): Up was pressed in the empty box.
    """

    submitted = Signal()
    edit_last_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.send_with_ctrl = False
        self._update_hint()

    def set_send_with_ctrl(self, on: bool) -> None:
        """Ctrl+Enter sends (and Enter starts a new line), or Enter sends."""
        self.send_with_ctrl = on
        self._update_hint()

    def _update_hint(self) -> None:
        if self.send_with_ctrl:
            self.setPlaceholderText("Ask something… (Ctrl+Enter sends, Enter new line)")
        else:
            self.setPlaceholderText("Ask something… (Enter sends, Shift+Enter new line)")

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        """The send key submits; Up in the empty box edits the last message."""
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        modifiers = event.modifiers()
        if self.send_with_ctrl:
            sends = enter and bool(modifiers & Qt.KeyboardModifier.ControlModifier)
        else:
            sends = enter and not modifiers & Qt.KeyboardModifier.ShiftModifier
        if sends:
            self.submitted.emit()
            return
        if enter and self.send_with_ctrl:
            self.insertPlainText("\n")
            return
        if event.key() == Qt.Key.Key_Up and not self.toPlainText():
            self.edit_last_requested.emit()
            return
        super().keyPressEvent(event)


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
        self.conversation_id: int | None = None
        self.editing_message_id: int | None = None  # a sent message being edited in the box
        self.hub_dialog: HubDialog | None = None  # Download models, once opened

        # Before the widgets: they are built in the theme's colours.
        apply_theme(_application(), self.settings.get_str("theme"))
        self._build()
        self.loads = LoadController(self.client, self.settings, self.sidebar, self.status, self)
        self.answers = AnswerController(
            self.client,
            self.store,
            self.settings,
            (self.chat, self.compare_view, self.meter),
            shown_conversation=lambda: self.conversation_id,
            loaded_method=lambda: self.loaded.method if self.loaded is not None else None,
            loaded_models=self._loaded_models,
            parent=self,
        )
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

    @property
    def loaded(self) -> PairReport | None:
        """The pair the engine process holds, as it reported it (None: none)."""
        return self.loads.pair

    @property
    def last_load(self) -> LoadRequest | None:
        """The last load, as the user asked for it."""
        return self.loads.last_load

    @property
    def crash_records(self) -> CrashRecords:
        """The load crashes seen on this machine."""
        return self.loads.crash_records

    @property
    def answer(self) -> Answer | None:
        """The answer under way (None: none)."""
        return self.answers.answer

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

    def _build_conversation_area(self) -> QWidget:
        """The crash banner, the chat over the comparison, the toggles and the message box."""
        self.input = MessageInput()
        self.input.set_send_with_ctrl(self.settings.get_str("send_key") == "ctrl-enter")
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
        self.crash_banner = CrashBanner()
        self.crash_label = self.crash_banner.label
        self.reload_button = self.crash_banner.reload_button
        center_layout.addWidget(self.crash_banner)
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
        import_chat = chat_menu.addAction("&Import chat…")
        import_chat.triggered.connect(lambda: self.import_chat())
        export_markdown = chat_menu.addAction("Export chat as &Markdown…")
        export_markdown.triggered.connect(lambda: self._export_shown("markdown"))
        export_json = chat_menu.addAction("Export chat as &JSON…")
        export_json.triggered.connect(lambda: self._export_shown("json"))
        copy_code = chat_menu.addAction("Copy last &code block")
        copy_code.setShortcut(QKeySequence("Ctrl+Shift+C"))
        copy_code.triggered.connect(self.copy_last_code_block)
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
        # "System" follows the desktop when it switches between light and dark.
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._on_colour_scheme_changed)
        client.failed.connect(self._on_engine_error)
        self.loads.scanned.connect(self._on_scanned)
        self.loads.state_changed.connect(self._show_load_state)
        self.loads.loaded.connect(lambda _pair: self.models_loaded.emit())
        self.loads.gave_up.connect(self.load_gave_up)
        self.loads.engine_lost.connect(self.answers.fail)
        self.answers.started.connect(self._update_controls)
        self.answers.finished.connect(self._on_answer_finished)
        self.answers.dropped.connect(self._update_controls)
        server = self.sidebar.server_panel
        server.port.setValue(self.settings.get_int("server_port"))
        server.api_key.setText(self.settings.get_str("server_api_key"))
        server.set_host(self.settings.get_str("server_host"))
        server.serve_requested.connect(self._serve)
        server.stop_requested.connect(self.client.stop_serving)
        client.serving.connect(server.set_serving)
        client.crashed.connect(lambda *_: server.set_serving(False, "", ""))
        client.api_started.connect(lambda _id, _prompt, queued: server.set_waiting(queued))
        client.api_finished.connect(lambda _id, _tokens, stats: server.add_request(stats))
        client.api_failed.connect(lambda _id, message: server.add_failure(message))
        client.api_queue.connect(server.set_waiting)

        self.fastest_setup = FastestSetupFinder(
            client,
            self.sidebar,
            self.store,
            self,
            is_answering=lambda: self.answers.busy,
            loaded_request=lambda: self.last_load if self.loaded is not None else None,
            loaded_main=lambda: self.loaded.main if self.loaded is not None else None,
        )
        self.fastest_setup.running_changed.connect(lambda _running: self._update_controls())
        self.sidebar.tune_requested.connect(self.fastest_setup.open)
        self.sidebar.load_requested.connect(self.load_models)
        self.sidebar.unload_requested.connect(self.unload_models)
        self.sidebar.pair_changed.connect(self._update_estimate)
        self.sidebar.open_folder_requested.connect(self._show_first_run)
        self.sidebar.download_requested.connect(self.open_hub_dialog)
        self.sidebar.fetch_default_pair_requested.connect(self._show_first_run)
        self.settings.changed.connect(self._on_setting_changed)

        self.conversations.conversation_selected.connect(self.open_conversation)
        self.conversations.new_chat_requested.connect(self.new_chat)
        self.conversations.conversation_deleted.connect(self._on_conversation_deleted)
        self.conversations.export_requested.connect(self.export_conversation)

        self.input.submitted.connect(self.send_message)
        self.input.edit_last_requested.connect(self.edit_last_message)
        self.chat.branch_requested.connect(self.switch_branch)
        self.chat.edit_requested.connect(self.edit_message)
        self.send_button.clicked.connect(self.send_message)
        self.stop_button.clicked.connect(self.stop_generation)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.copy_button.clicked.connect(lambda: self.chat.copy_answer(-1))
        self.compare_toggle.toggled.connect(lambda on: self.settings.set("compare", on))
        self.visualize_toggle.toggled.connect(lambda on: self.settings.set("visualize_drafts", on))
        self.reload_button.clicked.connect(self.loads.reload)

    # -- models ------------------------------------------------------------------------------

    def open_hub_dialog(self) -> HubDialog:
        """Show the Download models dialog (one, kept) for the main model picked."""
        main = self.sidebar.selected_main()
        if self.hub_dialog is None:
            self.hub_dialog = HubDialog(main, models_dir(), self)
            self.hub_dialog.model_downloaded.connect(self._on_model_downloaded)
        loaded, load = self.loaded, self.last_load
        # The loaded main model's own batch costs, when it is the one the dialog judges for.
        measured = (
            BatchCosts(seconds=dict(loaded.main_batch_seconds))
            if loaded is not None
            and load is not None
            and loaded.main_batch_seconds
            and main is not None
            and Path(load.main_path) == Path(main.path)
            else None
        )
        # The GPUs the engine found at the load (the window loads no GPU code itself).
        gpus = [gpu for gpu in (loaded.gpus if loaded else ()) if gpu.kind in GPU_KINDS]
        gpu_free = (
            (sum(gpu.memory_free or 0 for gpu in gpus), gpus[0].description or gpus[0].name)
            if gpus
            else None
        )
        context_size = self.settings.get_int("context_size")
        self.hub_dialog.set_main(main, measured, gpu_free, context_size)
        self.hub_dialog.show()
        self.hub_dialog.raise_()
        return self.hub_dialog

    def _on_model_downloaded(self, _path: str) -> None:
        self.rescan_models()

    def rescan_models(self) -> None:
        """Read the model folders on a worker thread and fill the pickers."""
        self.loads.rescan()

    def load_when_scanned(self) -> None:
        """Load the sidebar's selected pair as soon as the model folders have been read."""
        self.loads.load_when_scanned()

    def _on_scanned(self, scan: object) -> None:
        assert isinstance(scan, CatalogScan)
        self._update_estimate()
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

    def load_models(self, request: object) -> None:
        """Load the pair the sidebar asked for in the engine process (see LoadController)."""
        assert isinstance(request, LoadRequest)
        self.loads.load(request)

    def reload_models(self) -> None:
        """After a crash or a lost worker: load the last pair again (see LoadController)."""
        self.loads.reload()

    def copy_last_code_block(self) -> None:
        """Copy the conversation's last code block, and say so in the status bar."""
        code = self.chat.copy_last_code_block()
        if code is None:
            self.statusBar().showMessage("No code block to copy", 3000)
            return
        lines = code.count("\n") + 1
        self.statusBar().showMessage(
            f"Copied {lines} line{'s' if lines != 1 else ''} of code", 3000
        )

    def forget_load_crashes(self) -> None:
        """Drop the crash records, so that settings that crashed may be tried again."""
        count = self.loads.crash_records.forget()
        self.statusBar().showMessage(f"Forgot {count} load crash{'es' if count != 1 else ''}", 4000)

    def unload_models(self) -> None:
        """Free the models (the engine process stays, empty)."""
        if self.answers.busy:
            self.stop_generation()
        self.client.unload()

    def _show_load_state(self, state: object) -> None:
        assert isinstance(state, LoadState)
        self.crash_banner.show_state(state)
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
        if self.answers.busy:
            return
        conversation_id = self.store.create_conversation()
        for key in PER_CHAT_SETTINGS:  # a new chat starts with the settings shown now
            self.store.set_chat_setting(conversation_id, key, self.settings.get(key))
        self.conversations.refresh()
        self.open_conversation(conversation_id)

    def open_conversation(self, conversation_id: int) -> None:
        """Show a stored conversation."""
        if self.answers.busy and conversation_id != self.conversation_id:
            self.conversations.select(self.conversation_id or conversation_id)
            self.statusBar().showMessage("Wait for the answer to finish, or stop it (Esc)", 4000)
            return
        if conversation_id != self.conversation_id:
            self.editing_message_id = None  # an edit belongs to the chat it began in
        self.conversation_id = conversation_id
        # The chat's own system prompt and context policy become the sidebar's.
        for key, value in self.store.chat_settings(conversation_id).items():
            if key in PER_CHAT_SETTINGS:
                try:
                    self.settings.set(key, value)  # type: ignore[arg-type]
                except (SettingsError, TypeError, ValueError):
                    log.warning("chat %d keeps a bad %s: %r", conversation_id, key, value)
        self.chat.set_messages(self.store.messages(conversation_id))
        self.conversations.select(conversation_id)
        self._update_controls()

    def export_conversation(
        self, conversation_id: int, kind: str, path: Path | None = None
    ) -> Path | None:
        """Write a chat as Markdown or JSON to ``path`` (None: asked); where it went."""
        title = self.store.conversation_title(conversation_id)
        if path is None:
            suffix, filter_text = EXPORT_KINDS[kind]
            suggested = str(Path.home() / f"{export_file_stem(title)}{suffix}")
            chosen, _ = QFileDialog.getSaveFileName(self, "Export chat", suggested, filter_text)
            if not chosen:
                return None
            path = Path(chosen)
        messages = self.store.messages(conversation_id)
        if kind == "markdown":
            text = chat_to_markdown(title, messages)
        else:
            text = json.dumps(chat_to_json(title, messages), ensure_ascii=False, indent=1)
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as error:
            self.statusBar().showMessage(f"Could not export the chat: {error}", 8000)
            return None
        self.statusBar().showMessage(f"Exported “{title}” to {path}", 5000)
        return path

    def import_chat(self, path: Path | None = None) -> int | None:
        """Read a chat exported as JSON into a new chat and show it; its id."""
        if path is None:
            chosen, _ = QFileDialog.getOpenFileName(
                self, "Import chat", str(Path.home()), EXPORT_KINDS["json"][1]
            )
            if not chosen:
                return None
            path = Path(chosen)
        try:
            title, messages = chat_from_json(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ChatFileError) as error:
            self.statusBar().showMessage(f"Could not import {path.name}: {error}", 8000)
            return None
        conversation_id = self.store.import_conversation(title, messages)
        self.conversations.refresh()
        self.open_conversation(conversation_id)
        self.statusBar().showMessage(f"Imported “{title}”: {len(messages)} messages", 5000)
        return conversation_id

    def _loaded_models(self) -> dict[str, object]:
        """The loaded pair's model names and speculation method ({} when none is loaded)."""
        pair = self.loaded
        if pair is None:
            return {}
        draft = pair.draft.model_name if pair.draft is not None else None
        return {"main": pair.main.model_name, "draft": draft, "method": pair.method}

    def _export_shown(self, kind: str) -> None:
        if self.conversation_id is None:
            self.statusBar().showMessage("No chat to export", 3000)
            return
        self.export_conversation(self.conversation_id, kind)

    def _on_conversation_deleted(self, conversation_id: int) -> None:
        self.answers.drop_if_in(conversation_id)
        if conversation_id != self.conversation_id:
            return
        self.conversation_id = None
        summaries = self.store.list_conversations()
        if summaries:
            self.open_conversation(summaries[0].conversation_id)
        else:
            self.new_chat()

    # -- generation --------------------------------------------------------------------------

    def send_message(self) -> None:
        """Save the typed message, then ask the engine to answer it."""
        text = self.input.toPlainText().strip()
        if not text or self.answers.busy:
            return
        if self.loaded is None:
            self.sidebar.show_error("Load a main model first (Load in the sidebar)")
            return
        if self.conversation_id is None:
            self.new_chat()
        assert self.conversation_id is not None
        editing, self.editing_message_id = self.editing_message_id, None
        if editing is not None:
            # An edited message is an alternative to the one it replaces: both are kept.
            self.store.branch_before(editing)
        message_id = self.store.add_message(self.conversation_id, "user", text)
        self.conversations.refresh()
        self.conversations.select(self.conversation_id)
        self.input.clear()
        if editing is not None:
            self.chat.set_messages(self.store.messages(self.conversation_id))
        else:
            self.chat.append_user_message(text, message_id)
        self._start_answer()

    def regenerate(self) -> None:
        """Answer the last user message again; the last answer stays, as an alternative."""
        if self.answers.busy or self.conversation_id is None or self.loaded is None:
            return
        records = self.store.messages(self.conversation_id)
        if not records or records[-1].role != "assistant" or records[-1].message_id is None:
            return
        self.store.branch_before(records[-1].message_id)
        self.chat.set_messages(self.store.messages(self.conversation_id))
        self._start_answer()

    def switch_branch(self, message_id: int, step: int) -> None:
        """Show another alternative of a message (‹ or ›); the rest of the chat follows it."""
        if self.conversation_id is None:
            return
        if self.answers.busy:
            self.statusBar().showMessage("Wait for the answer to finish, or stop it (Esc)", 4000)
            return
        self.store.switch_branch(message_id, step)
        self.chat.set_messages(self.store.messages(self.conversation_id))
        self._update_controls()

    def edit_message(self, message_id: int, text: str) -> None:
        """Put a sent message in the box; sending it answers it as an alternative."""
        if self.answers.busy:
            self.statusBar().showMessage("Wait for the answer to finish, or stop it (Esc)", 4000)
            return
        self.editing_message_id = message_id
        self.input.setPlainText(text)
        self.input.moveCursor(QTextCursor.MoveOperation.End)
        self.input.setFocus()
        self.statusBar().showMessage(EDITING_MESSAGE, 8000)

    def edit_last_message(self) -> None:
        """Up in the empty box: edit the last message the user sent in this chat."""
        if self.conversation_id is None:
            return
        for record in reversed(self.store.messages(self.conversation_id)):
            if record.role == "user" and record.message_id is not None:
                self.edit_message(record.message_id, record.content)
                return

    def _start_answer(self) -> None:
        assert self.conversation_id is not None
        self.sidebar.flush_pending_edits()  # a schema typed just now is the one answered with
        try:
            self.answers.start(self.conversation_id, compare=self.compare_toggle.isChecked())
        except SpecDeckError as error:
            self.sidebar.show_error(str(error))

    def stop_generation(self) -> None:
        """Stop the running answer (Esc); what was generated stays. Or stop editing."""
        if not self.answers.busy and self.editing_message_id is not None:
            self.editing_message_id = None
            self.input.clear()
            self.statusBar().clearMessage()
            return
        self.answers.stop()

    def _on_answer_finished(self, state: str) -> None:
        if self.conversation_id is not None:
            records = self.store.messages(self.conversation_id)
            if records and records[-1].branch[1] > 1:  # a regenerated answer: show ‹ n/n ›
                self.chat.set_messages(records)
        self.conversations.refresh()
        self._update_controls()
        self.answer_finished.emit(state)

    # -- answers for other programs (the local API) ------------------------------------------

    def _serve(self, host: str, port: int, api_key: str) -> None:
        self.settings.set("server_host", host)
        self.settings.set("server_port", port)
        self.settings.set("server_api_key", api_key)
        self.client.serve(port, host=host, api_key=api_key or None)

    def _on_engine_error(self, message: str, request_id: object) -> None:
        if self.fastest_setup.owns(request_id):
            return  # the trials' dialog shows it
        if isinstance(request_id, int) and self.answers.owns(request_id):
            self.answers.fail(message)
            return
        self.loads.report_error(message)
        self._update_controls()

    # -- settings and state ------------------------------------------------------------------

    def _on_setting_changed(self, key: str) -> None:
        value = self.settings.get(key)
        if key in PER_CHAT_SETTINGS and self.conversation_id is not None:
            self.store.set_chat_setting(self.conversation_id, key, value)
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
            if key == "context_size" and self.hub_dialog is not None:
                self.hub_dialog.context_size = self.settings.get_int(key)  # the next listing
        elif key == "send_key":
            self.input.set_send_with_ctrl(value == "ctrl-enter")
        elif key == "theme":
            self.follow_theme()
        elif key == "extra_model_folders":
            self.rescan_models()

    def _on_colour_scheme_changed(self, _scheme: Qt.ColorScheme) -> None:
        self.follow_theme()

    def follow_theme(self) -> None:
        """Use the theme the settings name (or the desktop's, for "system") everywhere."""
        if apply_theme(_application(), self.settings.get_str("theme")):
            self.chat.rerender()
            self.compare_view.rerender()
            self.conversations.view.viewport().update()
            if (tuning := self.fastest_setup.dialog) is not None:
                tuning.recolour()

    def _update_controls(self) -> None:
        answering = self.answers.busy
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
        show_about(self, self.loaded.main.backend_in_use, next(notes, None))

    def shutdown(self) -> None:
        """Save what streams, stop the engine, close the history (idempotent)."""
        self.sidebar.flush_pending_edits()
        self.answers.save_and_cancel()
        self.client.stop()
        self.loads.wait_for_scan(5)
        self._save_window_state()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt's name
        """Quit cleanly: the answer so far is in the history already."""
        self.shutdown()
        super().closeEvent(event)


def _application() -> QApplication:
    """The running QApplication (the window cannot exist without one)."""
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    return app


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
