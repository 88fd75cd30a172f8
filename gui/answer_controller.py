"""The chat's answer under way: it streams into the chat pane, the comparison and the meter.

:class:`AnswerController` starts one answer at a time in the engine process and follows its
events: the speculative run's tokens go to the chat pane and the meter, both runs' to the
comparison when it is on. The answer is written to the chat store when it begins, every
``SAVE_ANSWER_INTERVAL_MS`` while it streams and when it ends, so a crash of the engine (or
of the app) loses nothing already on screen. While the chat is idle the meter follows the
local API's answers instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal

from backends.engines.interface import ChatMessage
from backends.service.context_fit import parse_policy
from backends.service.protocol import GenerateRequest
from gui.settings_to_backends import generation_settings
from gui.transcript import LEFT_OUT_KEY, spans_from_tokens

if TYPE_CHECKING:
    from collections.abc import Callable

    from backends.service.protocol import RunKind
    from backends.speculation.types import EmittedToken, GenerationSettings, SpeculationStats
    from gui.chat_pane import ChatPane
    from gui.chat_store import ChatStore
    from gui.compare_view import CompareView
    from gui.engine_client import EngineClient
    from gui.meter import AcceptanceMeter
    from gui.settings import AppSettings
    from gui.transcript import MessageState

SAVE_ANSWER_INTERVAL_MS = 500  # how often a streaming answer is written to the history


class Answer:
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
        self.dirty = False  # tokens arrived since the history was last written
        self.used: dict[str, object] = {}  # the models and settings it is generated with
        # The history id of each message sent (None: the system prompt), in order.
        self.sent_ids: list[int | None] = []

    @property
    def text(self) -> str:
        """What has arrived of the speculative run."""
        return "".join(token.text for token in self.tokens)

    def left_out(self) -> list[int]:
        """The ids of the earlier messages its context left out (its stats say which)."""
        stats = self.stats
        if stats is None or not stats.dropped_messages:
            return []
        run = self.sent_ids[stats.dropped_from : stats.dropped_from + stats.dropped_messages]
        return [message_id for message_id in run if message_id is not None]


def settings_used(settings: GenerationSettings, method: str | None) -> dict[str, object]:
    """What an answer is generated with, as its record keeps it (JSON-safe)."""
    sampling = settings.sampling
    return {
        "method": method,
        "max_tokens": settings.max_tokens,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "seed": sampling.seed,
        "draft_max": settings.draft_max,
        "draft_min": settings.draft_min,
        "p_min": settings.p_min,
        "verification": settings.verification,
        "structured_output": settings.grammar is not None,
    }


class AnswerController(QObject):
    """Starts the chat's answers, streams them into the views and the history, ends them.

    ``shown_conversation`` says which conversation the chat pane shows (an answer that
    ends in another one is stored but not drawn); ``loaded_method`` the loaded pair's
    speculation method (shown when the settings name none).

    Signals:
        started(): an answer began.
        finished(str): an answer ended; its state ("complete", "cancelled", "error").
        dropped(): the answer was forgotten with its conversation (no ``finished``).
    """

    started = Signal()
    finished = Signal(str)
    dropped = Signal()

    def __init__(
        self,
        client: EngineClient,
        store: ChatStore,
        settings: AppSettings,
        views: tuple[ChatPane, CompareView, AcceptanceMeter],
        shown_conversation: Callable[[], int | None],
        loaded_method: Callable[[], str | None],
        loaded_models: Callable[[], dict[str, object]] = dict,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.client = client
        self.store = store
        self.settings = settings
        self.chat, self.compare_view, self.meter = views
        self._shown_conversation = shown_conversation
        self._loaded_method = loaded_method
        self._loaded_models = loaded_models
        self.answer: Answer | None = None
        self._save_timer = QTimer(self)
        self._save_timer.setInterval(SAVE_ANSWER_INTERVAL_MS)
        self._save_timer.timeout.connect(self._save_streaming_answer)
        client.run_started.connect(self._on_run_started)
        client.tokens_arrived.connect(self._on_tokens)
        client.run_finished.connect(self._on_run_finished)
        client.compared.connect(self._on_compared)
        client.api_started.connect(self._on_api_started)
        client.api_tokens.connect(self._on_api_tokens)
        client.api_finished.connect(self._on_api_finished)

    @property
    def busy(self) -> bool:
        """Whether an answer is under way."""
        return self.answer is not None

    def owns(self, request_id: object) -> bool:
        """Whether ``request_id`` is the answer under way's."""
        return self.answer is not None and self.answer.request_id == request_id

    # -- starting and stopping -------------------------------------------------------------

    def start(self, conversation_id: int, *, compare: bool) -> None:
        """Answer the conversation's last message (raises SpecDeckError for bad settings)."""
        history = self._history(conversation_id)
        request = GenerateRequest(
            self.client.new_request_id(),
            tuple(message for message, _id in history),
            generation_settings(self.settings),
            compare=compare,
            context_policy=parse_policy(self.settings.get_str("context_overflow")),
        )
        method = request.method or self._loaded_method()
        message_id = self.store.begin_answer(conversation_id, method)
        self.answer = Answer(request.request_id, message_id, conversation_id, request.compare)
        self.answer.sent_ids = [message_id for _message, message_id in history]
        # Kept with the answer (and in an exported chat): what it was generated with.
        self.answer.used = {
            "models": self._loaded_models(),
            "settings": settings_used(request.settings, method),
        }
        self.chat.begin_answer(method)
        self.meter.start(method or "")
        if request.compare:
            self.compare_view.begin(method or "")
        self._save_timer.start()
        self.client.generate(request)
        self.started.emit()

    def stop(self) -> None:
        """Stop the answer under way; what was generated stays (``finished`` follows)."""
        if self.answer is not None:
            self.client.cancel()

    def fail(self, error: str) -> None:
        """End the answer under way with ``error`` (what arrived is kept)."""
        if self.answer is None:
            return
        if self.answer.compare:
            self.compare_view.cancel()
        self._end("error", error=error)

    def drop_if_in(self, conversation_id: int) -> None:
        """Stop and forget the answer if it belongs to ``conversation_id`` (being deleted)."""
        answer = self.answer
        if answer is None or answer.conversation_id != conversation_id:
            return
        # Its rows are gone with the conversation: nothing is left to store.
        self.answer = None
        self._save_timer.stop()
        self.client.cancel()
        self.meter.reset()
        self.dropped.emit()

    def save_and_cancel(self) -> None:
        """On quitting: write what has arrived and stop the engine's run."""
        if self.answer is not None:
            self._save_streaming_answer()
            self.client.cancel()

    def _history(self, conversation_id: int) -> list[tuple[ChatMessage, int | None]]:
        """The messages to send, each with its id in the history (None: the system prompt)."""
        messages: list[tuple[ChatMessage, int | None]] = []
        system = str(self.settings.get("system_prompt") or "").strip()
        if system:
            messages.append((ChatMessage("system", system), None))
        for record in self.store.messages(conversation_id):
            if record.role == "assistant" and not record.content:
                continue
            messages.append((ChatMessage(record.role, record.content), record.message_id))
        return messages

    # -- the engine's events ---------------------------------------------------------------

    def _on_run_started(self, request_id: int, run: str, prompt_tokens: int) -> None:
        if self.owns(request_id) and run == "speculative":
            self.meter.prompt_started(prompt_tokens)

    def _on_tokens(
        self, request_id: int, run: str, tokens: list[EmittedToken], stats: SpeculationStats
    ) -> None:
        if not self.owns(request_id):
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
        if not self.owns(request_id):
            return
        answer = self.answer
        assert answer is not None
        if answer.compare:
            self.compare_view.append_tokens(_run_kind(run), tokens)
            self.compare_view.finish_run(_run_kind(run), stats)
        if run == "plain":
            answer.plain_stats = stats
            if stats.stop_reason == "cancelled":
                self._end("cancelled")
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
            self._end("cancelled" if cancelled else "complete")

    def _on_compared(self, request_id: int, speedup: object, identical: object) -> None:
        if not self.owns(request_id):
            return
        self.compare_view.set_result(
            float(speedup) if isinstance(speedup, (int, float)) else None,
            identical if isinstance(identical, bool) else None,
        )
        self._end("complete", extra={"compare": {"speedup": speedup, "identical": identical}})

    # -- answers for other programs (the local API) ----------------------------------------

    def _on_api_started(self, _api_id: int, prompt_tokens: int, _queued: int) -> None:
        if self.answer is None:  # the meter follows API answers while the chat is idle
            method = self._loaded_method() or ""
            self.meter.start(f"{method} · API" if method else "API")
            self.meter.prompt_started(prompt_tokens)

    def _on_api_tokens(self, _api_id: int, _tokens: object, stats: SpeculationStats) -> None:
        if self.answer is None:
            self.meter.update_stats(stats)

    def _on_api_finished(self, _api_id: int, _tokens: object, stats: SpeculationStats) -> None:
        if self.answer is None:
            self.meter.finish(stats)

    # -- ending ----------------------------------------------------------------------------

    def _end(
        self, state: MessageState, error: str | None = None, extra: dict[str, object] | None = None
    ) -> None:
        answer = self.answer
        if answer is None:
            return
        self.answer = None
        self._save_timer.stop()
        left_out = answer.left_out()
        if left_out:
            extra = {**(extra or {}), LEFT_OUT_KEY: left_out}
        self.store.finish_answer(
            answer.message_id,
            answer.text,
            spans_from_tokens(answer.tokens),
            answer.stats,
            state,
            error,
            {**answer.used, **(extra or {})},
        )
        if answer.conversation_id == self._shown_conversation():
            self.chat.finish_answer(answer.stats, state, error, left_out)
        if state != "complete":
            self.meter.reset() if answer.stats is None else self.meter.finish(answer.stats)
        self.finished.emit(state)

    def _save_streaming_answer(self) -> None:
        answer = self.answer
        if answer is None or not answer.dirty:
            return
        answer.dirty = False
        self.store.update_answer(answer.message_id, answer.text, spans_from_tokens(answer.tokens))


def _run_kind(run: str) -> RunKind:
    if run == "plain":
        return "plain"
    return "speculative"
