"""The conversation list: its model follows the history, rename/delete/select reach the store."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import pytest
from PySide6.QtCore import QModelIndex, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QLineEdit, QMessageBox

from gui.chat_store import ChatStore
from gui.conversation_list import (
    NEW_CHAT_TOOLTIP,
    ConversationIdRole,
    ConversationList,
    ConversationListModel,
    UpdatedRole,
    relative_date,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pytestqt.qtbot import QtBot


class FakeClock:
    """Time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 1.0  # every write is later than the one before
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ChatStore]:
    with ChatStore(tmp_path / "chats.sqlite3", clock=FakeClock()) as opened:
        yield opened


@pytest.fixture
def chats(store: ChatStore) -> list[int]:
    """Three chats; the list shows them newest first: gamma, beta, alpha."""
    return [store.create_conversation(title) for title in ("alpha", "beta", "gamma")]


@pytest.fixture
def conversation_list(qtbot: QtBot, store: ChatStore, chats: list[int]) -> ConversationList:
    widget = ConversationList(store)
    qtbot.addWidget(widget)
    widget.resize(240, 400)
    widget.show()
    return widget


def titles(model: ConversationListModel) -> list[str]:
    return [str(model.index(row).data()) for row in range(model.rowCount())]


def test_model_rows_follow_the_store(store: ChatStore, chats: list[int]) -> None:
    alpha, beta, gamma = chats
    model = ConversationListModel(store)
    assert titles(model) == ["gamma", "beta", "alpha"]
    assert model.index(0).data(ConversationIdRole) == gamma
    assert model.index(0).data(UpdatedRole) == store.list_conversations()[0].updated_at
    assert model.rowCount(model.index(0)) == 0

    store.add_message(alpha, "user", "bump")
    store.delete_conversation(beta)
    delta = store.create_conversation("delta")
    assert titles(model) == ["gamma", "beta", "alpha"]  # until refreshed
    model.refresh()
    assert titles(model) == ["delta", "alpha", "gamma"]
    assert model.row_of(alpha) == 1
    assert model.row_of(beta) == -1
    assert model.conversation_id(0) == delta
    assert model.conversation_id(2) == gamma


def test_rename_through_set_data_persists(
    store: ChatStore, chats: list[int], tmp_path: Path
) -> None:
    alpha = chats[0]
    model = ConversationListModel(store)
    index = model.index(model.row_of(alpha))
    assert model.flags(index) & Qt.ItemFlag.ItemIsEditable

    changed: list[int] = []
    model.dataChanged.connect(lambda top, _bottom, _roles: changed.append(top.row()))
    assert model.setData(index, "  Renamed   chat ", Qt.ItemDataRole.EditRole)
    assert changed == [index.row()]
    assert index.data(Qt.ItemDataRole.DisplayRole) == "Renamed chat"
    assert store.conversation_title(alpha) == "Renamed chat"

    assert not model.setData(index, "   ", Qt.ItemDataRole.EditRole)
    assert store.conversation_title(alpha) == "Renamed chat"
    assert not model.setData(QModelIndex(), "x", Qt.ItemDataRole.EditRole)

    store.close()
    with ChatStore(tmp_path / "chats.sqlite3") as reopened:
        assert reopened.conversation_title(alpha) == "Renamed chat"


def test_header_has_the_new_chat_button(qtbot: QtBot, conversation_list: ConversationList) -> None:
    button = conversation_list.new_chat_button
    assert button.text() == "New chat"
    assert button.toolTip() == NEW_CHAT_TOOLTIP
    with qtbot.waitSignal(conversation_list.new_chat_requested, timeout=1000):
        QTest.mouseClick(button, Qt.MouseButton.LeftButton)


def test_clicking_a_chat_emits_conversation_selected(
    qtbot: QtBot, conversation_list: ConversationList, chats: list[int]
) -> None:
    view = conversation_list.view
    row = conversation_list.model.row_of(chats[1])
    position = view.visualRect(conversation_list.model.index(row)).center()
    with qtbot.waitSignal(conversation_list.conversation_selected, timeout=1000) as blocker:
        QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=position)
    assert blocker.args == [chats[1]]
    assert conversation_list.selected_conversation_id() == chats[1]
    assert conversation_list.rename_action.isEnabled()
    assert conversation_list.delete_action.isEnabled()


def test_select_does_not_emit_and_survives_refresh(
    qtbot: QtBot, store: ChatStore, conversation_list: ConversationList, chats: list[int]
) -> None:
    alpha = chats[0]
    with qtbot.assertNotEmitted(conversation_list.conversation_selected):
        conversation_list.select(alpha)
        store.add_message(alpha, "user", "moves alpha to the top")
        conversation_list.refresh()
    assert conversation_list.model.row_of(alpha) == 0
    assert conversation_list.selected_conversation_id() == alpha
    assert conversation_list.view.currentIndex().row() == 0

    conversation_list.select(None)
    assert conversation_list.selected_conversation_id() is None
    assert not conversation_list.delete_action.isEnabled()


def test_delete_without_confirmation_emits_and_selects_the_neighbour(
    qtbot: QtBot, store: ChatStore, conversation_list: ConversationList, chats: list[int]
) -> None:
    alpha, beta, gamma = chats
    conversation_list.select(beta)
    emitted: list[tuple[str, int]] = []
    conversation_list.conversation_deleted.connect(lambda cid: emitted.append(("deleted", cid)))
    conversation_list.conversation_selected.connect(lambda cid: emitted.append(("selected", cid)))
    assert conversation_list.delete_conversation(beta, confirm=False)
    assert emitted == [("deleted", beta), ("selected", alpha)]  # alpha took beta's row
    assert conversation_list.selected_conversation_id() == alpha
    assert titles(conversation_list.model) == ["gamma", "alpha"]
    assert [s.conversation_id for s in store.list_conversations()] == [gamma, alpha]


def test_deleting_an_unselected_chat_keeps_the_selection(
    qtbot: QtBot, conversation_list: ConversationList, chats: list[int]
) -> None:
    alpha, beta, gamma = chats
    conversation_list.select(gamma)
    with (
        qtbot.assertNotEmitted(conversation_list.conversation_selected),
        qtbot.waitSignal(conversation_list.conversation_deleted, timeout=1000) as blocker,
    ):
        conversation_list.delete_conversation(alpha, confirm=False)
    assert blocker.args == [alpha]
    assert conversation_list.selected_conversation_id() == gamma


def test_delete_asks_first_and_no_keeps_the_chat(
    qtbot: QtBot,
    monkeypatch: pytest.MonkeyPatch,
    store: ChatStore,
    conversation_list: ConversationList,
    chats: list[int],
) -> None:
    questions: list[str] = []

    def answer(_parent: object, _title: str, text: str, *_args: object) -> object:
        questions.append(text)
        return QMessageBox.StandardButton.No

    monkeypatch.setattr(QMessageBox, "question", answer)
    with qtbot.assertNotEmitted(conversation_list.conversation_deleted):
        assert not conversation_list.delete_conversation(chats[0])
    assert questions
    assert "alpha" in questions[0]
    assert len(store.list_conversations()) == 3

    monkeypatch.setattr(QMessageBox, "question", lambda *_: QMessageBox.StandardButton.Yes)
    with qtbot.waitSignal(conversation_list.conversation_deleted, timeout=1000):
        assert conversation_list.delete_conversation(chats[0])
    assert len(store.list_conversations()) == 2


def test_deleting_the_last_chat_leaves_nothing_selected(qtbot: QtBot, store: ChatStore) -> None:
    only = store.create_conversation()
    widget = ConversationList(store)
    qtbot.addWidget(widget)
    widget.select(only)
    with qtbot.assertNotEmitted(widget.conversation_selected):
        widget.delete_conversation(only, confirm=False)
    assert widget.model.rowCount() == 0
    assert widget.selected_conversation_id() is None


def test_inline_rename_from_the_editor_reaches_the_store(
    qtbot: QtBot, store: ChatStore, conversation_list: ConversationList, chats: list[int]
) -> None:
    gamma = chats[2]
    conversation_list.select(gamma)
    conversation_list.rename_action.trigger()
    editor = conversation_list.view.findChild(QLineEdit)
    assert editor is not None
    assert editor.text() == "gamma"
    editor.setText("Edited inline")
    QTest.keyClick(editor, Qt.Key.Key_Return)
    QApplication.processEvents()
    assert store.conversation_title(gamma) == "Edited inline"


def test_relative_date() -> None:
    now = datetime(2024, 5, 15, 18, 30).timestamp()
    assert relative_date(datetime(2024, 5, 15, 14, 3).timestamp(), now) == "today 14:03"
    assert relative_date(datetime(2024, 5, 14, 23, 59).timestamp(), now) == "yesterday"
    assert relative_date(datetime(2024, 5, 11, 9, 0).timestamp(), now) == "Saturday"
    assert relative_date(datetime(2024, 3, 2, 9, 0).timestamp(), now) == "2 Mar"
    assert relative_date(datetime(2023, 12, 24, 9, 0).timestamp(), now) == "24 Dec 2023"
