"""The answer controller against a scripted engine client: streaming, ending, the history.

No engine process runs here: the tests emit the client's signals as the engine process
would. The real engine's answers are in test_main_window.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from backends.speculation.types import EmittedToken, SpeculationStats, TokenOrigin
from gui.answer_controller import AnswerController
from gui.chat_pane import ChatPane
from gui.chat_store import ChatStore
from gui.compare_view import CompareView
from gui.engine_client import EngineClient
from gui.meter import AcceptanceMeter
from gui.settings import AppSettings

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pytestqt.qtbot import QtBot

    from backends.service.protocol import GenerateRequest

NO_STATS = SpeculationStats()
HELLO = [EmittedToken(1, "Hel", TokenOrigin.TARGET), EmittedToken(2, "lo", TokenOrigin.DRAFT)]
WORLD = [EmittedToken(3, " world", TokenOrigin.DRAFT)]


class _ScriptedClient(EngineClient):
    """An engine client without a process: it records what it is asked to do."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[GenerateRequest] = []
        self.cancels = 0

    def generate(self, request: GenerateRequest) -> None:
        self.requests.append(request)

    def cancel(self) -> None:
        self.cancels += 1


class _Answers:
    def __init__(self, qtbot: QtBot, tmp_path: Path) -> None:
        self.client = _ScriptedClient()
        self.store = ChatStore(tmp_path / "chats.sqlite")
        self.settings = AppSettings()
        self.chat, self.compare_view, self.meter = ChatPane(), CompareView(), AcceptanceMeter()
        for widget in (self.chat, self.compare_view, self.meter):
            qtbot.addWidget(widget)
        self.conversation = self.store.create_conversation()
        self.store.add_message(self.conversation, "user", "Say hello.")
        self.answers = AnswerController(
            self.client,
            self.store,
            self.settings,
            (self.chat, self.compare_view, self.meter),
            shown_conversation=lambda: self.conversation,
            loaded_method=lambda: "draft-model",
        )
        self.finished: list[str] = []
        self.answers.finished.connect(self.finished.append)

    def request_id(self) -> int:
        return self.client.requests[-1].request_id


@pytest.fixture
def answers(qtbot: QtBot, tmp_path: Path) -> Iterator[_Answers]:
    answers = _Answers(qtbot, tmp_path)
    yield answers
    answers.answers.drop_if_in(answers.conversation)  # no save timer outlives the store
    answers.store.close()


def test_an_answer_streams_into_the_chat_and_is_stored_when_it_ends(
    qtbot: QtBot, answers: _Answers
) -> None:
    controller = answers.answers
    answers.settings.set("system_prompt", "Be brief.")
    controller.start(answers.conversation, compare=False)
    assert controller.busy
    (request,) = answers.client.requests
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("user", "Say hello."),
    ]
    answers.client.tokens_arrived.emit(request.request_id, "speculative", HELLO, NO_STATS)
    assert controller.answer is not None
    assert controller.answer.text == "Hello"
    qtbot.waitUntil(lambda: answers.chat.answer_text() == "Hello")  # drawn on the pane's timer
    controller._save_streaming_answer()  # what the save timer does every half second
    stored = answers.store.messages(answers.conversation)[-1]
    assert (stored.content, stored.state) == ("Hello", "streaming")
    answers.client.tokens_arrived.emit(request.request_id + 1, "speculative", WORLD, NO_STATS)
    assert controller.answer.text == "Hello"  # another request's tokens are not this answer's
    final = SpeculationStats(generated_tokens=3, stop_reason="eos")
    answers.client.run_finished.emit(request.request_id, "speculative", WORLD, final)
    assert not controller.busy
    assert answers.finished == ["complete"]
    stored = answers.store.messages(answers.conversation)[-1]
    assert (stored.content, stored.state) == ("Hello world", "complete")
    assert answers.chat.answer_text() == "Hello world"
    assert answers.meter.state == "done"


def test_a_comparison_ends_with_the_speedup_stored(answers: _Answers) -> None:
    controller = answers.answers
    controller.start(answers.conversation, compare=True)
    request_id = answers.request_id()
    done = SpeculationStats(generated_tokens=2, stop_reason="eos")
    answers.client.run_finished.emit(request_id, "speculative", HELLO, done)
    assert controller.busy  # the plain run is still to come
    answers.client.run_finished.emit(request_id, "plain", HELLO, done)
    assert controller.busy
    answers.client.compared.emit(request_id, 1.5, True)
    assert answers.finished == ["complete"]
    stored = answers.store.messages(answers.conversation)[-1]
    assert stored.extra["compare"] == {"speedup": 1.5, "identical": True}
    assert answers.compare_view.badge_text() == "Identical text"


def test_a_failed_answer_keeps_its_text_and_the_error(answers: _Answers) -> None:
    controller = answers.answers
    controller.start(answers.conversation, compare=False)
    answers.client.tokens_arrived.emit(answers.request_id(), "speculative", HELLO, NO_STATS)
    controller.fail("the engine process was killed. The text above was kept.")
    assert answers.finished == ["error"]
    stored = answers.store.messages(answers.conversation)[-1]
    assert (stored.content, stored.state) == ("Hello", "error")
    assert "The text above was kept" in answers.chat.footer_text()
    controller.fail("again")  # nothing is under way: nothing happens
    assert answers.finished == ["error"]


def test_an_answer_dropped_with_its_conversation_is_cancelled_not_finished(
    answers: _Answers,
) -> None:
    controller = answers.answers
    controller.start(answers.conversation, compare=False)
    controller.drop_if_in(answers.conversation + 1)
    assert controller.busy
    controller.drop_if_in(answers.conversation)
    assert not controller.busy
    assert answers.client.cancels == 1
    assert answers.finished == []


def test_the_meter_follows_the_api_only_while_the_chat_is_idle(answers: _Answers) -> None:
    client, meter = answers.client, answers.meter
    client.api_started.emit(7, 12, 0)
    assert meter.value_texts()["caption"].startswith("draft-model · API")
    answers.answers.start(answers.conversation, compare=False)
    caption = meter.value_texts()["caption"]
    client.api_started.emit(8, 30, 0)
    assert meter.value_texts()["caption"] == caption
