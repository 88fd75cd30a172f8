"""Find my fastest setup, in the window: the dialog, the engine process's trials, the result.

The main window owns one :class:`FastestSetupFinder`. It opens the dialog for the loaded
main model with every local model's verdict as a draft, offers the result remembered for
this model and machine, starts the trials in the engine process (on the user's last
messages, else the suite's prompts), passes their progress and result to the dialog, and
applies the chosen setup through the sidebar (which loads it). While trials run the
window counts as busy: no answer can start and the pair cannot change.

Signals:
    running_changed(bool): trials started or ended.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from backends.service.tuning import MAX_TRIAL_PROMPTS, SUITE_TRIAL_KEYS
from backends.service.tuning_memory import TuningMemory, machine_key
from backends.speculation.methods import parse_method
from gui.tuning_dialog import TuningDialog

if TYPE_CHECKING:
    from collections.abc import Callable

    from PySide6.QtWidgets import QWidget

    from backends.engines.interface import LoadReport
    from backends.models.draft_verdict import DraftVerdict
    from backends.service.protocol import LoadRequest
    from backends.service.tuning_memory import Recall, RememberedTuning
    from gui.chat_store import ChatStore
    from gui.engine_client import EngineClient
    from gui.sidebar import Sidebar


def tuning_hint(recall: Recall | None) -> str:
    """The sidebar's line: "Fastest here: ngram-mod, 1.34× plain (measured 2026-12-01)"."""
    if recall is None:
        return ""
    when = time.strftime("%Y-%m-%d", time.localtime(recall.tuning.measured_at))
    if recall.changes:
        return f"Fastest setup measured {when} with {'; '.join(recall.changes)}: find it again"
    best = recall.tuning.winner
    if best is None:
        return ""
    if best.method == "off":
        return f"Fastest here: plain decoding (measured {when})"
    speedup = f"{best.speedup:.2f}× plain" if best.speedup is not None else ""
    return f"Fastest here: {best.label}, {speedup} (measured {when})"


NO_PAIR_LOADED = "no model is loaded (the engine stopped?): load the pair again, then start"
NO_ANSWER_WHILE = "an answer is being written: wait for it (or stop it), then start"


class FastestSetupFinder(QObject):
    """Runs "Find my fastest setup" for the window."""

    running_changed = Signal(bool)

    def __init__(
        self,
        client: EngineClient,
        sidebar: Sidebar,
        store: ChatStore,
        window: QWidget,
        is_answering: Callable[[], bool],
        loaded_request: Callable[[], LoadRequest | None],
        loaded_main: Callable[[], LoadReport | None],
    ) -> None:
        super().__init__(window)
        self._client = client
        self._sidebar = sidebar
        self._store = store
        self._window = window
        self._dialog: TuningDialog | None = None
        self._request_id: int | None = None
        self._verdicts: list[DraftVerdict] = []
        self._prompts: list[str] = []
        self._is_answering = is_answering
        self._loaded_request = loaded_request
        self._loaded_main = loaded_main
        client.tune_progress.connect(self._on_progress)
        client.tuned.connect(self._on_tuned)
        client.failed.connect(self._on_failed)
        client.crashed.connect(self._on_crashed)
        client.loaded.connect(lambda _pair: self.refresh_hint())
        client.unloaded.connect(lambda: sidebar.set_tuning_hint(""))
        client.crashed.connect(lambda *_: sidebar.set_tuning_hint(""))

    @property
    def dialog(self) -> TuningDialog | None:
        """The dialog, once it was opened."""
        return self._dialog

    @property
    def running(self) -> bool:
        """Whether trials are under way in the engine process."""
        return self._request_id is not None

    def owns(self, request_id: object) -> bool:
        """Whether an engine error with ``request_id`` belongs to the trials."""
        return request_id is not None and request_id == self._request_id

    def open(self) -> None:
        """Show the dialog for the loaded main model, with the remembered result if any."""
        request = self._loaded_request()
        if request is None:
            return
        dialog = self._dialog
        if dialog is None:
            dialog = self._dialog = TuningDialog(self._window)
            dialog.start_requested.connect(self.start)
            dialog.cancel_requested.connect(self._client.cancel)
            dialog.apply_requested.connect(self._apply)
        main = self._sidebar.catalog_model(request.main_path)
        self._verdicts = [
            verdict
            for verdict in self._sidebar.draft_verdicts(main, main_loaded=True)
            if Path(verdict.draft.path) != Path(request.main_path)
        ]
        self._prompts = self._store.recent_user_messages(MAX_TRIAL_PROMPTS)
        if self._prompts:
            count = len(self._prompts)
            source = f"your last {count} message{'s' if count != 1 else ''}"
        else:
            source = f"the suite's {len(SUITE_TRIAL_KEYS)} prompts (new code, a rewrite, prose)"
        name = main.display_name if main is not None else Path(request.main_path).name
        dialog.set_context(name, source, self._verdicts)
        dialog.show()
        dialog.raise_()
        dialog.activateWindow()
        if not self.running:
            self._send(recall_only=True, budget=0.0)

    def refresh_hint(self) -> None:
        """Say under the draft picker what was measured fastest for the loaded main model."""
        request, report = self._loaded_request(), self._loaded_main()
        if request is None or report is None:
            self._sidebar.set_tuning_hint("")
            return
        recall = TuningMemory().recall(machine_key(request.main_path, report, request.engine))
        self._sidebar.set_tuning_hint(tuning_hint(recall))

    def start(self, budget: float) -> None:
        """Run the trials with this time budget."""
        if self.running:
            return
        problem = ""
        if self._loaded_request() is None:
            problem = NO_PAIR_LOADED
        elif self._is_answering():
            problem = NO_ANSWER_WHILE
        if problem:
            if self._dialog is not None:
                self._dialog.show_error(problem)
            return
        self._send(recall_only=False, budget=budget)
        if self._dialog is not None:
            self._dialog.set_running(True)
        self.running_changed.emit(True)

    def _send(self, *, recall_only: bool, budget: float) -> None:
        request_id = self._client.new_request_id()
        if not recall_only:
            self._request_id = request_id
        self._client.tune(
            request_id,
            budget_seconds=budget,
            drafts=[str(verdict.draft.path) for verdict in self._verdicts if verdict.can_draft],
            prompts=self._prompts,
            again=not recall_only,
            recall_only=recall_only,
        )

    def _finish(self) -> None:
        if self._request_id is not None:
            self._request_id = None
            self.running_changed.emit(False)

    def _on_progress(self, fraction: float, message: str) -> None:
        if self._dialog is not None:
            self._dialog.set_progress(fraction, message)

    def _on_tuned(
        self, tuning: RememberedTuning | None, recalled: bool, cancelled: bool, changes: list[str]
    ) -> None:
        if recalled and self.running:
            return  # a recall answered while trials were asked for: the trials' result follows
        self._finish()
        if not recalled and not cancelled:
            self.refresh_hint()
        if self._dialog is not None:
            self._dialog.show_result(
                tuning, recalled=recalled, cancelled=cancelled, changes=changes
            )

    def _on_failed(self, message: str, request_id: object) -> None:
        if self.owns(request_id):
            self._finish()
            if self._dialog is not None:
                self._dialog.show_error(message)

    def _on_crashed(self, message: str, _death: object) -> None:
        if self.running:
            self._finish()
            if self._dialog is not None:
                self._dialog.show_error(f"{message}; the chats are safe, reload the models")

    def _apply(self, method: str, draft_path: object) -> None:
        self._sidebar.apply_setup(
            parse_method(method), draft_path if isinstance(draft_path, str) else None
        )
        if self._dialog is not None:
            self._dialog.close()
