"""The whole window against the real engine process: SmolLM2-135M as main and draft model."""

from __future__ import annotations

import json
import os
import signal
from typing import TYPE_CHECKING

import pytest
from PySide6.QtCore import QElapsedTimer, Qt, QTimer
from PySide6.QtGui import QGuiApplication, QTextCursor
from PySide6.QtTest import QTest

from backends.service.protocol import LoadRequest
from backends.speculation.types import TokenOrigin
from gui.chat_pane import left_out_note
from gui.chat_store import ChatStore
from gui.main_window import READY_CHAT_HINT, MainWindow, MessageInput
from gui.settings import AppSettings
from gui.transcript import MessageRecord
from tests.gui.conftest import (
    assert_partial_answer_kept,
    engine_wait,
    shown_on,
    shown_runs,
    shown_text,
    smollm_pair_settings,
)
from tests.gui.thread_clock import ThreadClock

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pytestqt.qtbot import QtBot

    from backends.speculation.types import EmittedToken, SpeculationStats

LOAD_TIMEOUT_MS = 120_000
ANSWER_TIMEOUT_MS = 180_000
MAX_EVENT_LOOP_STALL_MS = 100
QUESTION = "Write a Python function that returns the squares of a list of numbers."


@pytest.fixture
def settings(smollm_path: Path) -> AppSettings:
    return smollm_pair_settings(smollm_path, max_tokens=40)


def _open_window(qtbot: QtBot, settings: AppSettings) -> MainWindow:
    window = MainWindow(settings, offer_first_run=False)
    qtbot.addWidget(window)
    window.show()
    with engine_wait(qtbot, window.client, window.models_loaded, LOAD_TIMEOUT_MS):
        window.load_when_scanned()
    return window


@pytest.fixture
def window(qtbot: QtBot, settings: AppSettings) -> Iterator[MainWindow]:
    window = _open_window(qtbot, settings)
    yield window
    window.shutdown()


class _Recorder:
    """Every token and the final stats of the speculative run, as the engine sent them."""

    def __init__(self, window: MainWindow) -> None:
        self.tokens: list[EmittedToken] = []
        self.stats: SpeculationStats | None = None
        window.client.tokens_arrived.connect(self._tokens)
        window.client.run_finished.connect(self._finished)

    def _tokens(self, _id: int, run: str, tokens: list[EmittedToken], _stats: object) -> None:
        if run == "speculative":
            self.tokens.extend(tokens)

    def _finished(
        self, _id: int, run: str, tokens: list[EmittedToken], stats: SpeculationStats
    ) -> None:
        if run == "speculative":
            self.tokens.extend(tokens)
            self.stats = stats


def _ask(qtbot: QtBot, window: MainWindow, text: str) -> str:
    window.input.setPlainText(text)
    with engine_wait(qtbot, window.client, window.answer_finished, ANSWER_TIMEOUT_MS) as finished:
        QTest.keyClick(window.input, Qt.Key.Key_Return)
    state = finished.args[0]
    assert isinstance(state, str)
    return state


def test_answer_highlights_exactly_the_accepted_draft_tokens(
    qtbot: QtBot, window: MainWindow
) -> None:
    recorder = _Recorder(window)
    captions: list[str] = []
    # Connected after the window's own slot: sees the meter as the run starts, before tokens.
    window.client.run_started.connect(
        lambda *_: captions.append(window.meter.value_texts()["caption"])
    )
    placement = window.sidebar.placement_text()
    assert "CPU" in placement or "GPU" in placement
    assert "draft requantized to Q4_0 for speed" in placement  # on the CPU, by default
    assert window.chat.browser.placeholderText() == READY_CHAT_HINT  # loaded: no "Load…" hint
    assert _ask(qtbot, window, QUESTION) == "complete"
    stats = recorder.stats
    assert stats is not None
    assert captions == [f"draft-model · reading the prompt ({stats.prompt_tokens} tokens)…"]
    text = "".join(token.text for token in recorder.tokens)
    pairs = [(token.text, token.origin) for token in recorder.tokens]
    assert stats.accepted_draft_tokens_count > 0
    assert window.chat.answer_source() == text
    # Shown as Markdown, each character on its origin's background (line breaks aside).
    assert window.chat.answer_text() == shown_text(pairs)
    assert window.chat.answer_origins() == shown_runs(pairs)
    assert window.chat.highlighted_text() == shown_on(pairs, TokenOrigin.DRAFT) != ""
    # The meter shows the answer's own figures.
    assert window.meter.state == "done"
    assert window.meter.overall_acceptance == pytest.approx(stats.acceptance_rate)
    assert f"{stats.acceptance_rate:.0%}" in window.meter.value_texts()["overall"]
    assert str(stats.accepted_draft_tokens_count) in window.meter.value_texts()["counts"]
    footer = window.chat.footer_text()
    assert f"{stats.generated_tokens} tokens" in footer
    # What is on screen is what was stored.
    assert window.conversation_id is not None
    stored = window.store.messages(window.conversation_id)
    assert [r.role for r in stored] == ["user", "assistant"]
    assert stored[1].content == text
    assert stored[1].stats is not None
    assert stored[1].stats.accepted_draft_tokens_count == stats.accepted_draft_tokens_count


PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_structured_output_follows_the_schema_and_shows_the_grammar_s_tokens_on_blue(
    qtbot: QtBot, window: MainWindow
) -> None:
    """The sidebar's Structured output is the API's response_format: the answer is JSON that
    follows the schema, and the tokens the schema allowed alone (braces, quotes, the keys)
    are a third origin, on their own colour, counted in the meter and stored."""
    window.settings.set("structured_output", "json_schema")
    window.settings.set("json_schema", json.dumps(PERSON_SCHEMA))
    recorder = _Recorder(window)
    assert _ask(qtbot, window, "Describe a person as JSON.") == "complete"
    stats = recorder.stats
    assert stats is not None
    text = window.chat.answer_source()
    person = json.loads(text)  # follows PERSON_SCHEMA:
    assert set(person) == {"name", "age"}
    assert isinstance(person["name"], str)
    assert len(person["name"]) <= 12
    assert isinstance(person["age"], int)
    assert 0 <= person["age"] <= 120
    by_grammar = "".join(t.text for t in recorder.tokens if t.origin is TokenOrigin.GRAMMAR)
    assert stats.grammar_tokens_count == sum(
        1 for t in recorder.tokens if t.origin is TokenOrigin.GRAMMAR
    )
    assert "name" in by_grammar  # the keys cost no drafting
    assert "age" in by_grammar
    assert window.chat.highlighted_text(origin=TokenOrigin.GRAMMAR) == by_grammar
    assert f"grammar {stats.grammar_tokens_count}" in window.meter.value_texts()["counts"]
    # Stored with their origin: the chat read back shows them on blue again.
    assert window.conversation_id is not None
    window.chat.set_messages(window.store.messages(window.conversation_id))
    assert window.chat.highlighted_text(origin=TokenOrigin.GRAMMAR) == by_grammar
    # A schema that is not JSON is a one-line error; the question stays in the chat.
    window.settings.set("json_schema", '{"type": "object",')
    window.input.setPlainText("Another person?")
    window.send_message()
    assert "the JSON schema is not JSON" in window.sidebar.error_text()
    assert "\n" not in window.sidebar.error_text()
    assert window.store.messages(window.conversation_id)[-1].content == "Another person?"
    assert not window.answers.busy
    # Off again: free text, no grammar tokens.
    window.settings.set("structured_output", "off")
    window.settings.set("max_tokens", 6)
    recorder = _Recorder(window)
    assert _ask(qtbot, window, "Say hello.") == "complete"
    assert recorder.stats is not None
    assert recorder.stats.grammar_tokens_count == 0
    assert "grammar" not in window.meter.value_texts()["counts"]


def test_visualize_toggle_removes_and_restores_the_highlight(
    qtbot: QtBot, window: MainWindow
) -> None:
    assert _ask(qtbot, window, QUESTION) == "complete"
    highlighted = window.chat.highlighted_text()
    assert highlighted
    window.visualize_toggle.setChecked(False)
    assert window.chat.highlighted_text() == ""
    assert window.settings.get("visualize_drafts") is False
    window.visualize_toggle.setChecked(True)
    assert window.chat.highlighted_text() == highlighted


def test_comparison_answers_twice_and_reports_speedup(
    qtbot: QtBot, settings: AppSettings, smollm_path: Path
) -> None:
    settings.set("compare", True)
    window = _open_window(qtbot, settings)
    assert window.compare_view.isVisible()
    assert _ask(qtbot, window, QUESTION) == "complete"
    speculative = window.compare_view.column_text("speculative")
    plain = window.compare_view.column_text("plain")
    assert speculative
    assert speculative == plain  # temperature 0: lossless
    assert window.compare_view.badge_text() == "Identical text"
    assert "×" in window.compare_view.speedup_text()
    assert window.chat.answer_text() == speculative
    assert window.conversation_id is not None
    answer = window.store.messages(window.conversation_id)[-1]
    comparison = answer.extra["compare"]
    assert isinstance(comparison, dict)
    assert comparison["identical"] is True
    assert comparison["speedup"] > 0
    # What it was generated with stays with it (and goes into an exported chat).
    assert answer.extra["models"] == {
        "main": window.loaded.main.model_name if window.loaded else None,
        "draft": window.loaded.draft.model_name if window.loaded and window.loaded.draft else None,
        "method": "draft-model",
    }
    used = answer.extra["settings"]
    assert isinstance(used, dict)
    assert (used["max_tokens"], used["temperature"], used["structured_output"]) == (40, 0.0, False)
    window.shutdown()


CONTROL_SHIFT = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier


def test_history_survives_a_restart(qtbot: QtBot, settings: AppSettings) -> None:
    first = _open_window(qtbot, settings)
    assert _ask(qtbot, first, QUESTION) == "complete"
    text, highlighted = first.chat.answer_text(), first.chat.highlighted_text()
    conversation = first.conversation_id
    first.close()

    second = MainWindow(AppSettings(), ChatStore(ChatStore.default_path()), offer_first_run=False)
    qtbot.addWidget(second)
    assert second.conversation_id == conversation
    assert second.chat.answer_text() == text
    assert second.chat.highlighted_text() == highlighted
    assert second.conversations.model.rowCount() == 1
    # Ctrl+Shift+C copies the last code block of the chat shown.
    code_answer = "Run:\n\n```sh\nls -l\n```"
    second.chat.set_messages(
        [
            MessageRecord(role="user", content="How?"),
            MessageRecord(role="assistant", content=code_answer),
        ]
    )
    second.show()
    with qtbot.waitActive(second):
        second.activateWindow()
    QTest.keyClick(second, Qt.Key.Key_C, CONTROL_SHIFT)
    assert QGuiApplication.clipboard().text() == "ls -l"
    assert second.statusBar().currentMessage() == "Copied 1 line of code"
    second.shutdown()


def test_killing_the_engine_mid_answer_keeps_the_chat_and_offers_reload(
    qtbot: QtBot, window: MainWindow
) -> None:
    window.settings.set("max_tokens", 2000)
    window.input.setPlainText("Tell a very long story about a lighthouse keeper.")
    window.send_message()
    answer = window.answer
    assert answer is not None
    qtbot.waitUntil(lambda: len(answer.tokens) >= 8, timeout=ANSWER_TIMEOUT_MS)
    pid = window.client.pid
    assert pid is not None
    with qtbot.waitSignal(window.answer_finished, timeout=30_000) as finished:
        os.kill(pid, signal.SIGKILL)
    assert finished.args == ["error"]
    assert window.crash_banner.isVisible()
    assert "engine process" in window.crash_label.text()
    assert_partial_answer_kept(window)
    assert not window.send_button.isEnabled()

    with engine_wait(qtbot, window.client, window.models_loaded, LOAD_TIMEOUT_MS):
        QTest.mouseClick(window.reload_button, Qt.MouseButton.LeftButton)
    assert not window.crash_banner.isVisible()
    window.settings.set("max_tokens", 8)
    assert _ask(qtbot, window, "Say hello.") == "complete"


def test_escape_stops_and_keeps_the_partial_answer(qtbot: QtBot, window: MainWindow) -> None:
    window.settings.set("max_tokens", 2000)
    window.input.setPlainText("Tell a very long story about the sea.")
    window.send_message()
    answer = window.answer
    assert answer is not None
    qtbot.waitUntil(lambda: len(answer.tokens) >= 4, timeout=ANSWER_TIMEOUT_MS)
    with engine_wait(qtbot, window.client, window.answer_finished, 30_000) as finished:
        QTest.keyClick(window, Qt.Key.Key_Escape)
    assert finished.args == ["cancelled"]
    assert window.conversation_id is not None
    stored = window.store.messages(window.conversation_id)[-1]
    assert stored.state == "cancelled"
    assert stored.content == window.chat.answer_source() != ""
    assert stored.stats is not None
    assert stored.stats.generated_tokens < 2000


def test_event_loop_never_stalls_while_tokens_stream(qtbot: QtBot, window: MainWindow) -> None:
    """No gap between two 5 ms ticks of the event loop is the GUI thread's own for 100 ms.

    A gap is charged to the GUI thread less the time it waited, runnable, for a CPU that
    other processes held (the engine's threads, and whatever else shares CI's 2 cores):
    running and blocking (rendering, SQLite, a synchronous call) are the window's.
    """
    window.settings.set("max_tokens", 120)
    window.compare_toggle.setChecked(True)
    clock = QElapsedTimer()
    thread_clock = ThreadClock()
    gaps: list[tuple[int, float]] = []  # (wall ms, ms of it spent waiting for a CPU)
    waited_before = thread_clock.waited_ns()
    ticker = QTimer()
    ticker.setInterval(5)

    def tick() -> None:
        nonlocal waited_before
        waited_now = thread_clock.waited_ns()
        gaps.append((clock.restart(), (waited_now - waited_before) / 1e6))
        waited_before = waited_now

    ticker.timeout.connect(tick)
    clock.start()
    ticker.start()
    try:
        assert _ask(qtbot, window, QUESTION) == "complete"
    finally:
        ticker.stop()
        thread_clock.close()
    assert len(gaps) > 50
    wall, waited = max(gaps[1:], key=lambda gap: gap[0] - gap[1])
    longest_wall, its_wait = max(gaps[1:])
    print(
        f"longest event-loop stall of the GUI thread's own: {wall - waited:.0f} ms "
        f"({wall} ms, {waited:.0f} ms of it waiting for a CPU); longest gap {longest_wall} ms "
        f"({its_wait:.0f} ms waiting) over {len(gaps)} ticks"
    )
    assert wall - waited < MAX_EVENT_LOOP_STALL_MS, (
        f"the GUI thread held its event loop for {wall - waited:.0f} ms "
        f"(a {wall} ms gap, {waited:.0f} ms of it waiting for a CPU)"
    )


def test_enter_sends_and_shift_enter_starts_a_new_line(qtbot: QtBot, window: MainWindow) -> None:
    window.settings.set("max_tokens", 6)
    QTest.keyClicks(window.input, "first line")
    QTest.keyClick(window.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    QTest.keyClicks(window.input, "second line")
    assert window.input.toPlainText() == "first line\nsecond line"
    with engine_wait(qtbot, window.client, window.answer_finished, ANSWER_TIMEOUT_MS):
        QTest.keyClick(window.input, Qt.Key.Key_Return)
    assert window.input.toPlainText() == ""
    assert window.conversation_id is not None
    assert window.store.messages(window.conversation_id)[0].content == "first line\nsecond line"


def test_regenerate_and_edit_keep_the_earlier_versions_as_alternatives(
    qtbot: QtBot, window: MainWindow
) -> None:
    assert _ask(qtbot, window, QUESTION) == "complete"
    first = window.chat.answer_source()
    first_footer = window.chat.footer_text()
    window.settings.set("max_tokens", 12)  # so that the two answers differ
    with engine_wait(qtbot, window.client, window.answer_finished, ANSWER_TIMEOUT_MS):
        QTest.mouseClick(window.regenerate_button, Qt.MouseButton.LeftButton)
    assert window.chat.answer_count() == 1
    second = window.chat.answer_source()
    assert first.startswith(second)  # temperature 0: the same start, cut at 12 tokens
    assert second != first
    assert window.chat.branch_switcher_text(1) == "‹ 2/2 ›"
    assert window.conversation_id is not None
    assert [r.role for r in window.store.messages(window.conversation_id)] == ["user", "assistant"]
    QTest.mouseClick(window.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == second  # the answer's Markdown

    # ‹ shows the first answer again, with its own figures.
    answer_id = window.store.messages(window.conversation_id)[-1].message_id
    assert answer_id is not None
    window.chat.browser.anchorClicked.emit(window.chat.branch_link(answer_id, -1))
    assert window.chat.answer_source() == first
    assert window.chat.footer_text() == first_footer
    assert window.chat.branch_switcher_text(1) == "‹ 1/2 ›"

    # Up in the empty box edits the last question; sending it answers it as an alternative.
    window.input.setFocus()
    QTest.keyClick(window.input, Qt.Key.Key_Up)
    assert window.input.toPlainText() == QUESTION
    assert window.editing_message_id is not None
    window.input.setPlainText("Say hello.")
    with engine_wait(qtbot, window.client, window.answer_finished, ANSWER_TIMEOUT_MS):
        QTest.keyClick(window.input, Qt.Key.Key_Return)
    shown = window.store.messages(window.conversation_id)
    assert [(r.role, r.branch) for r in shown] == [("user", (2, 2)), ("assistant", (1, 1))]
    assert shown[0].content == "Say hello."
    assert window.chat.branch_switcher_text(0) == "‹ 2/2 ›"
    # Back to the first question: it comes back with its newest answer.
    assert shown[0].message_id is not None
    window.switch_branch(shown[0].message_id, -1)
    assert window.chat.answer_source() == second
    assert [r.content for r in window.store.messages(window.conversation_id)][0] == QUESTION


def test_a_prompt_beyond_the_context_is_an_error_in_the_chat(
    qtbot: QtBot, settings: AppSettings
) -> None:
    settings.set("context_size", 512)
    window = _open_window(qtbot, settings)
    assert _ask(qtbot, window, "word " * 700) == "error"
    assert "context holds 512" in window.chat.footer_text()
    assert window.send_button.isEnabled()  # the engine lives on
    window.settings.set("max_tokens", 4)
    QTest.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.chat.answer_count() == 0
    assert _ask(qtbot, window, "Hi") == "complete"
    # A chat that outgrows the context goes on (truncate the middle, the default), and the
    # answer's footer says what was left out.
    for _ in range(3):
        assert _ask(qtbot, window, "word " * 200) == "complete"
    footer = window.chat.footer_text()
    assert "2 earlier messages left out to fit the context" in footer, footer
    # And a line in the chat says where: before the first long question (after "Hi" and
    # its answer, which truncate-middle keeps).
    shown = window.chat.document.toPlainText()
    note = shown.index(left_out_note(2))
    assert shown.index("Hi") < note < shown.index("word word")
    assert shown.count(left_out_note(2)) == 1
    window.shutdown()


@pytest.mark.parametrize("case", ["missing", "incompatible"])
def test_bad_model_choices_end_in_one_line_sidebar_errors(
    qtbot: QtBot, window: MainWindow, smollm_path: Path, gemma_path: Path, tmp_path: Path, case: str
) -> None:
    if case == "missing":
        request = LoadRequest(str(tmp_path / "gone.gguf"))
        expected = "gone.gguf"
    else:
        request = LoadRequest(str(smollm_path), str(gemma_path))
        expected = "draft"
    with engine_wait(qtbot, window.client, window.client.failed, LOAD_TIMEOUT_MS):
        window.load_models(request)
    qtbot.waitUntil(lambda: expected in window.sidebar.error_text())
    assert "\n" not in window.sidebar.error_text()
    assert window.loaded is None
    assert not window.send_button.isEnabled()


def test_deleting_the_chat_being_answered_stops_the_answer(
    qtbot: QtBot, window: MainWindow
) -> None:
    window.settings.set("max_tokens", 2000)
    window.input.setPlainText("Tell a very long story about a mountain.")
    window.send_message()
    answer = window.answer
    assert answer is not None
    qtbot.waitUntil(lambda: len(answer.tokens) >= 4, timeout=ANSWER_TIMEOUT_MS)
    deleted = answer.conversation_id
    assert window.conversations.delete_conversation(deleted, confirm=False)
    assert window.answer is None
    assert window.conversation_id not in (None, deleted)
    assert deleted not in [c.conversation_id for c in window.store.list_conversations()]
    window.settings.set("max_tokens", 6)
    # The cancelled generation's late events are ignored; the next answer works.
    assert _ask(qtbot, window, "Say hello.") == "complete"


def test_the_send_key_is_the_users_choice(qtbot: QtBot) -> None:
    box = MessageInput()
    qtbot.addWidget(box)
    sent: list[bool] = []
    box.submitted.connect(lambda: sent.append(True))
    box.setPlainText("line")
    box.moveCursor(QTextCursor.MoveOperation.End)
    QTest.keyClick(box, Qt.Key.Key_Return)
    assert sent == [True]  # Enter sends by default
    box.set_send_with_ctrl(True)
    assert "Ctrl+Enter sends" in box.placeholderText()
    QTest.keyClick(box, Qt.Key.Key_Return)
    assert sent == [True]
    assert box.toPlainText() == "line\n"  # Enter starts a new line
    QTest.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert sent == [True, True]
