"""A chat as Markdown and as JSON, and the JSON back; exported and imported from the window."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from backends.speculation.types import SpeculationStats, TokenOrigin
from gui.chat_export import ChatFileError, chat_from_json, chat_to_json, chat_to_markdown
from gui.chat_store import ChatStore
from gui.main_window import MainWindow, export_file_stem
from gui.settings import AppSettings
from gui.transcript import MessageRecord, TokenSpan

if TYPE_CHECKING:
    from pathlib import Path

    from pytestqt.qtbot import QtBot

D, T, G = TokenOrigin.DRAFT, TokenOrigin.TARGET, TokenOrigin.GRAMMAR

ANSWER = "Use `sorted`:\n\n```python\nsorted(xs)\n```"
SPANS = (TokenSpan(4, T), TokenSpan(9, D), TokenSpan(3, G), TokenSpan(len(ANSWER) - 16, D))
STATS = SpeculationStats(
    prompt_tokens=12,
    generated_tokens=9,
    total_draft_tokens_count=8,
    accepted_draft_tokens_count=6,
    rejected_draft_tokens_count=2,
    generation_seconds=0.5,
    stop_reason="eos",
)
CHAT = [
    MessageRecord(role="system", content="Be brief."),
    MessageRecord(role="user", content="How do I sort a list?"),
    MessageRecord(
        role="assistant",
        content=ANSWER,
        spans=SPANS,
        stats=STATS,
        method="auto",
        extra={"models": {"main": "Qwen2.5 Coder 1.5B"}, "settings": {"temperature": 0.0}},
    ),
    MessageRecord(role="user", content="And reversed?"),
    MessageRecord(role="assistant", content="Add", spans=(TokenSpan(3, T),), state="cancelled"),
]


def test_json_keeps_every_message_token_origin_stat_and_setting() -> None:
    exported = chat_to_json("Sorting", CHAT)
    text = json.dumps(exported)
    answer = exported["messages"][2]
    assert answer["tokens"] == [
        ["Use ", "target"],
        ["`sorted`:", "draft"],
        ["\n\n`", "grammar"],
        [
            ANSWER[16:],
            "draft",
        ],
    ]
    assert answer["stats"]["accepted_draft_tokens_count"] == 6
    assert answer["extra"]["models"]["main"] == "Qwen2.5 Coder 1.5B"
    title, messages = chat_from_json(text)
    assert title == "Sorting"
    for read, written in zip(messages, CHAT, strict=True):
        assert (read.role, read.content, read.spans, read.state, read.method) == (
            written.role,
            written.content,
            written.spans,
            written.state,
            written.method,
        )
        assert read.stats == written.stats
        assert read.extra == written.extra


def test_markdown_is_for_people_with_each_answers_figures() -> None:
    text = chat_to_markdown("Sorting", CHAT)
    assert text.startswith("# Sorting\n\n## System\n\nBe brief.\n\n## You\n\nHow do I sort")
    assert "## Assistant · auto\n\n" + ANSWER + "\n\n*" in text
    assert "75% accepted" in text
    assert "## Assistant\n\nAdd\n\n*Stopped" in text


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "not a chat file: not JSON"),
        ('{"format": "other"}', 'no "format": "specdeck-chat"'),
        (
            '{"format": "specdeck-chat", "version": 9}',
            "of version 9; this SpecDeck reads version 1",
        ),
        ('{"format": "specdeck-chat", "version": 1, "title": 3}', 'needs a "title" text'),
        (
            '{"format": "specdeck-chat", "version": 1, "title": "t", "messages": [{"role": "x"}]}',
            "messages[0] needs a role",
        ),
        (
            '{"format": "specdeck-chat", "version": 1, "title": "t", "messages": '
            '[{"role": "assistant", "content": "ab", "tokens": [["a", "draft"]]}]}',
            "messages[0]: its tokens do not make up its content",
        ),
        (
            '{"format": "specdeck-chat", "version": 1, "title": "t", "messages": '
            '[{"role": "assistant", "content": "a", "tokens": [["a", "oracle"]]}]}',
            "is not [text, origin]",
        ),
        (
            '{"format": "specdeck-chat", "version": 1, "title": "t", "messages": '
            '[{"role": "assistant", "content": "a", "state": "lost"}]}',
            "messages[0].state must be one of",
        ),
    ],
)
def test_a_file_that_is_not_a_chat_is_one_line_naming_why(text: str, words: str) -> None:
    with pytest.raises(ChatFileError) as refused:
        chat_from_json(text)
    assert words in str(refused.value)
    assert "\n" not in str(refused.value)


def test_file_names_come_from_the_title() -> None:
    assert export_file_stem("Sort a list: fast?") == "Sort-a-list-fast"
    assert export_file_stem("???") == "chat"
    assert len(export_file_stem("x" * 200)) == 60


def test_the_window_exports_imports_and_searches_chats(qtbot: QtBot, tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.sqlite3")
    original = store.import_conversation("Sorting", CHAT)
    store.import_conversation("Soup", [MessageRecord(role="user", content="Leek soup?")])
    window = MainWindow(AppSettings(), store, offer_first_run=False)
    qtbot.addWidget(window)
    window.open_conversation(original)
    shown_green = window.chat.highlighted_text(0)
    assert shown_green

    markdown = window.export_conversation(original, "markdown", tmp_path / "sorting.md")
    assert markdown is not None
    assert markdown.read_text(encoding="utf-8") == chat_to_markdown(
        "Sorting", store.messages(original)
    )
    exported = window.export_conversation(original, "json", tmp_path / "sorting.json")
    assert exported is not None

    imported = window.import_chat(exported)
    assert imported is not None
    assert imported != original
    assert window.conversation_id == imported  # shown at once
    assert window.chat.answer_source(0) == ANSWER
    assert window.chat.highlighted_text(0) == shown_green  # the origins came back
    assert window.conversations.model.rowCount() == 3

    (tmp_path / "broken.json").write_text('{"format": "specdeck-chat"}', encoding="utf-8")
    assert window.import_chat(tmp_path / "broken.json") is None
    assert "Could not import broken.json: a chat file of version None" in (
        window.statusBar().currentMessage()
    )
    assert window.conversations.model.rowCount() == 3

    window.conversations.search.setText("leek")
    assert window.conversations.model.rowCount() == 1
    window.conversations.search.setText("SORTED(")
    assert window.conversations.model.rowCount() == 2  # the chat and its import
    window.conversations.search.clear()
    assert window.conversations.model.rowCount() == 3
    window.shutdown()


def test_each_chat_keeps_its_system_prompt_and_context_policy(qtbot: QtBot, tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.sqlite3")
    window = MainWindow(AppSettings(), store, offer_first_run=False)
    qtbot.addWidget(window)
    window.new_chat()
    terse = window.conversation_id
    assert terse is not None
    window.settings.set("system_prompt", "Be terse.")
    window.settings.set("context_overflow", "rolling-window")
    window.new_chat()  # starts with the settings shown, then keeps its own
    other = window.conversation_id
    assert other is not None
    window.settings.set("system_prompt", "Answer in French.")
    assert store.chat_settings(terse)["system_prompt"] == "Be terse."
    window.open_conversation(terse)
    assert window.settings.get_str("system_prompt") == "Be terse."
    assert window.settings.get_str("context_overflow") == "rolling-window"
    window.open_conversation(other)
    assert window.settings.get_str("system_prompt") == "Answer in French."
    assert window.settings.get_str("context_overflow") == "rolling-window"
    # A chat that keeps a value this SpecDeck does not know opens with the one shown.
    store.set_chat_setting(terse, "context_overflow", "forget-everything")
    window.open_conversation(terse)
    assert window.settings.get_str("context_overflow") == "rolling-window"
    window.shutdown()
