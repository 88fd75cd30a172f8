"""The chat history in SQLite: round trips, crash safety, corrupt files and migrations."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from backends.paths import user_data_dir
from backends.speculation.types import SpeculationStats, TokenOrigin
from gui.chat_store import (
    DEFAULT_TITLE,
    SCHEMA_VERSION,
    ChatStore,
    HistoryError,
    auto_title,
)
from gui.transcript import MessageRecord, TokenSpan, spans_from_json, spans_to_json

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO_ROOT = Path(__file__).resolve().parents[2]
SPANS = (
    TokenSpan(5, TokenOrigin.TARGET),
    TokenSpan(1, TokenOrigin.DRAFT),
    TokenSpan(6, TokenOrigin.DRAFT),
    TokenSpan(2, TokenOrigin.GRAMMAR),
)


class FakeClock:
    """Time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float = 1.0) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "history" / "chats.sqlite3"


@pytest.fixture
def store(db_path: Path, clock: FakeClock) -> Iterator[ChatStore]:
    with ChatStore(db_path, clock=clock) as opened:
        yield opened


def full_stats() -> SpeculationStats:
    return SpeculationStats(
        prompt_tokens=31,
        generated_tokens=120,
        rounds=40,
        total_draft_tokens_count=110,
        accepted_draft_tokens_count=80,
        rejected_draft_tokens_count=25,
        ignored_draft_tokens_count=5,
        verified_at_position=[40, 35, 20],
        accepted_at_position=[35, 25, 20],
        draft_length_counts={1: 3, 3: 30, 16: 7},
        verify_batch_counts={1: 5, 4: 33, 8: 9},
        rounds_by_method={"draft-model": 30, "ngram": 8, "none": 2},
        time_to_first_token_sec=0.25,
        generation_seconds=3.5,
        total_seconds=3.75,
        draft_seconds=0.5,
        verify_seconds=2.5,
        engine_seconds=3.0,
        stop_reason="eos",
    )


# -- conversations ---------------------------------------------------------------------------


def test_default_path_is_in_the_user_data_dir(fresh_data_dir: Path) -> None:
    assert ChatStore.default_path() == fresh_data_dir / "chats.sqlite3"
    assert ChatStore.default_path().parent == user_data_dir()


def test_opening_creates_the_folder_a_wal_database_and_the_schema(db_path: Path) -> None:
    with ChatStore(db_path):
        pass
    assert db_path.is_file()
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
        assert {"conversations", "messages"} <= tables
    finally:
        raw.close()


def test_create_list_rename_and_order(store: ChatStore, clock: FakeClock) -> None:
    first = store.create_conversation()
    clock.advance()
    second = store.create_conversation("Plans")
    summaries = store.list_conversations()
    assert [s.conversation_id for s in summaries] == [second, first]
    assert summaries[0].title == "Plans"
    assert summaries[1].title == DEFAULT_TITLE
    assert summaries[0].created_at == summaries[0].updated_at == clock.now
    assert [s.message_count for s in summaries] == [0, 0]

    store.rename_conversation(first, "Renamed")
    assert store.conversation_title(first) == "Renamed"
    clock.advance()
    store.add_message(first, "user", "hello")
    summaries = store.list_conversations()
    assert [s.conversation_id for s in summaries] == [first, second]
    assert summaries[0].updated_at == clock.now
    assert summaries[0].message_count == 1


def test_unknown_conversation_is_a_key_error(store: ChatStore) -> None:
    with pytest.raises(KeyError):
        store.conversation_title(404)
    with pytest.raises(KeyError):
        store.rename_conversation(404, "x")
    with pytest.raises(KeyError):
        store.delete_conversation(404)
    with pytest.raises(KeyError):
        store.add_message(404, "user", "x")


def test_delete_conversation_cascades_to_its_messages(store: ChatStore, db_path: Path) -> None:
    doomed = store.create_conversation()
    kept = store.create_conversation()
    store.add_message(doomed, "user", "bye")
    answer = store.begin_answer(doomed, "auto")
    store.finish_answer(answer, "ok", SPANS[:1], None, "complete")
    store.add_message(kept, "user", "stay")

    store.delete_conversation(doomed)

    assert [s.conversation_id for s in store.list_conversations()] == [kept]
    assert store.messages(doomed) == []
    assert [m.content for m in store.messages(kept)] == ["stay"]
    raw = sqlite3.connect(db_path)
    try:
        orphans = raw.execute(
            "SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (doomed,)
        ).fetchone()[0]
    finally:
        raw.close()
    assert orphans == 0


# -- messages --------------------------------------------------------------------------------


def test_messages_round_trip_with_spans_stats_and_extra(db_path: Path) -> None:
    stats = full_stats()
    with ChatStore(db_path) as store:
        cid = store.create_conversation()
        system_id = store.add_message(cid, "system", "Be brief.")
        user_id = store.add_message(cid, "user", "Say hello\nplease")
        answer_id = store.begin_answer(cid, "draft-model")
        store.finish_answer(
            answer_id,
            "Hello, world",
            SPANS,
            stats,
            "complete",
            extra={"compare": {"plain_tps": 12.5, "speedup": 1.8}},
        )
    with ChatStore(db_path) as reopened:
        messages = reopened.messages(cid)

    assert [m.message_id for m in messages] == [system_id, user_id, answer_id]
    assert [m.role for m in messages] == ["system", "user", "assistant"]
    assert [m.content for m in messages] == ["Be brief.", "Say hello\nplease", "Hello, world"]
    assert [m.state for m in messages] == ["complete"] * 3
    answer = messages[2]
    assert answer.spans == SPANS
    assert answer.method == "draft-model"
    assert answer.error is None
    assert answer.extra == {"compare": {"plain_tps": 12.5, "speedup": 1.8}}
    assert answer.stats == stats
    assert answer.stats is not None
    assert answer.stats.draft_length_counts == {1: 3, 3: 30, 16: 7}
    assert answer.stats.verify_batch_counts == {1: 5, 4: 33, 8: 9}
    assert answer.stats.rounds_by_method == {"draft-model": 30, "ngram": 8, "none": 2}
    assert answer.stats.acceptance_rate == pytest.approx(80 / 110)
    assert messages[0].spans == ()
    assert messages[0].stats is None
    assert messages[0].extra == {}


def test_failed_answer_keeps_its_error_and_state(store: ChatStore) -> None:
    cid = store.create_conversation()
    store.add_message(cid, "user", "hi")
    answer = store.begin_answer(cid, None)
    store.update_answer(answer, "Hel", SPANS[:1])
    store.finish_answer(answer, "Hel", SPANS[:1], None, "error", error="llama_decode failed")
    record = store.messages(cid)[-1]
    assert (record.state, record.error, record.content, record.method) == (
        "error",
        "llama_decode failed",
        "Hel",
        None,
    )


def test_add_message_refuses_assistant_messages(store: ChatStore) -> None:
    cid = store.create_conversation()
    with pytest.raises(ValueError, match="assistant"):
        store.add_message(cid, "assistant", "I am not streamed")


def test_streaming_answer_is_saved_as_it_grows(store: ChatStore) -> None:
    cid = store.create_conversation()
    answer = store.begin_answer(cid, "auto")
    record = store.messages(cid)[0]
    assert (record.state, record.content, record.spans) == ("streaming", "", ())
    store.update_answer(answer, "Hello", SPANS[:1])
    store.update_answer(answer, "Hello, world", SPANS)
    record = store.messages(cid)[0]
    assert (record.state, record.content, record.spans) == ("streaming", "Hello, world", SPANS)


def test_unfinished_answer_becomes_interrupted_on_reopen(db_path: Path) -> None:
    with ChatStore(db_path) as store:
        cid = store.create_conversation()
        store.add_message(cid, "user", "tell me a story")
        answer = store.begin_answer(cid, "auto")
        store.update_answer(answer, "Once upon", SPANS[:2])
        # no finish_answer: the app died here
    with ChatStore(db_path) as reopened:
        user, assistant = reopened.messages(cid)
    assert (user.state, user.content) == ("complete", "tell me a story")
    assert (assistant.state, assistant.content, assistant.spans) == (
        "interrupted",
        "Once upon",
        SPANS[:2],
    )


CRASHING_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from backends.speculation.types import TokenOrigin
    from gui.chat_store import ChatStore
    from gui.transcript import TokenSpan

    store = ChatStore(Path(sys.argv[1]))
    cid = store.create_conversation()
    store.add_message(cid, "user", "Explain speculative decoding")
    answer = store.begin_answer(cid, "auto")
    store.update_answer(answer, "A small model drafts", [TokenSpan(20, TokenOrigin.DRAFT)])
    if sys.argv[2] == "exit":
        os._exit(1)
    print("streaming", flush=True)
    time.sleep(60)
    """
)


def run_crashing_writer(db_path: Path, how: str) -> None:
    db_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-c", CRASHING_WRITER, str(db_path), how]
    if how == "exit":
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        return
    with subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as writer:
        assert writer.stdout is not None
        line = writer.stdout.readline()
        assert line.strip() == "streaming", writer.stderr.read() if writer.stderr else ""
        writer.kill()  # SIGKILL: no atexit, no close, no commit of anything pending
        writer.wait(timeout=30)
        assert writer.returncode != 0


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_crashed_process_loses_nothing_already_shown(db_path: Path, how: str) -> None:
    run_crashing_writer(db_path, how)
    with ChatStore(db_path) as reopened:
        (summary,) = reopened.list_conversations()
        user, assistant = reopened.messages(summary.conversation_id)
    assert summary.title == "Explain speculative decoding"
    assert (user.role, user.content, user.state) == (
        "user",
        "Explain speculative decoding",
        "complete",
    )
    assert (assistant.role, assistant.content, assistant.state) == (
        "assistant",
        "A small model drafts",
        "interrupted",
    )
    assert assistant.spans == (TokenSpan(20, TokenOrigin.DRAFT),)
    assert assistant.method == "auto"


def test_delete_messages_from_removes_that_message_and_later_ones_only(
    store: ChatStore,
) -> None:
    cid = store.create_conversation()
    other = store.create_conversation()
    store.add_message(cid, "user", "one")
    first_answer = store.begin_answer(cid, "auto")
    store.finish_answer(first_answer, "two", (), None, "complete")
    store.add_message(cid, "user", "three")
    second_answer = store.begin_answer(cid, "auto")
    store.finish_answer(second_answer, "four", (), None, "complete")
    store.add_message(other, "user", "elsewhere")
    elsewhere_answer = store.begin_answer(other, "auto")  # a later id, in another chat

    store.delete_messages_from(second_answer)
    assert [m.content for m in store.messages(cid)] == ["one", "two", "three"]
    store.delete_messages_from(first_answer)
    assert [m.content for m in store.messages(cid)] == ["one"]
    assert [m.message_id for m in store.messages(other)][-1] == elsewhere_answer
    assert len(store.messages(other)) == 2


# -- titles ----------------------------------------------------------------------------------


def test_first_user_message_titles_a_new_chat(store: ChatStore) -> None:
    cid = store.create_conversation()
    store.add_message(cid, "system", "You are a helpful assistant.")
    assert store.conversation_title(cid) == DEFAULT_TITLE
    store.add_message(cid, "user", "\n  How does   rejection sampling work?\nDetails please")
    assert store.conversation_title(cid) == "How does rejection sampling work?"
    store.add_message(cid, "user", "A second question")
    assert store.conversation_title(cid) == "How does rejection sampling work?"


def test_long_first_message_title_is_shortened(store: ChatStore) -> None:
    cid = store.create_conversation()
    store.add_message(cid, "user", "x" * 100)
    assert store.conversation_title(cid) == "x" * 40 + "…"


def test_chosen_title_is_not_replaced(store: ChatStore) -> None:
    named = store.create_conversation("My notes")
    store.add_message(named, "user", "first words")
    assert store.conversation_title(named) == "My notes"


def test_chat_renamed_back_to_new_chat_keeps_its_name_after_the_first_message(
    store: ChatStore,
) -> None:
    cid = store.create_conversation()
    store.add_message(cid, "user", "original question")
    store.rename_conversation(cid, DEFAULT_TITLE)
    store.add_message(cid, "user", "follow-up")
    assert store.conversation_title(cid) == DEFAULT_TITLE


def test_auto_title() -> None:
    assert auto_title("   \n\t\n") is None
    assert auto_title("Hello\nworld") == "Hello"
    assert auto_title("a" * 40) == "a" * 40
    assert auto_title("word " * 20) == ("word " * 8).rstrip() + "…"


# -- bad files -------------------------------------------------------------------------------


def test_garbage_file_raises_history_error_naming_the_file(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"this is not sqlite at all \x00\xff" * 200)
    with pytest.raises(HistoryError) as caught:
        ChatStore(db_path)
    message = str(caught.value)
    assert str(db_path) in message
    assert "\n" not in message


def test_damaged_database_raises_history_error(db_path: Path) -> None:
    with ChatStore(db_path) as store:
        cid = store.create_conversation()
        for number in range(300):
            store.add_message(cid, "user", f"message {number} " + "text " * 40)
    raw = sqlite3.connect(db_path)
    raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw.close()
    data = bytearray(db_path.read_bytes())
    page_size = 4096
    assert len(data) > 10 * page_size
    for offset in range(2 * page_size, len(data) - page_size, page_size):
        data[offset : offset + 64] = b"\xa5" * 64
    db_path.write_bytes(bytes(data))
    with pytest.raises(HistoryError, match=str(db_path).replace("\\", "\\\\")):
        ChatStore(db_path)


def test_newer_schema_is_refused(db_path: Path) -> None:
    with ChatStore(db_path):
        pass
    raw = sqlite3.connect(db_path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.commit()
    raw.close()
    with pytest.raises(HistoryError, match="newer SpecDeck"):
        ChatStore(db_path)


def test_move_aside_renames_the_file_and_its_wal(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"garbage")
    with pytest.raises(HistoryError):
        ChatStore(db_path)
    wal = db_path.with_name(db_path.name + "-wal")
    wal.write_bytes(b"log")

    moved = ChatStore.move_aside(db_path)

    assert not db_path.exists()
    assert not wal.exists()
    assert moved.parent == db_path.parent
    assert moved.name.startswith("chats.sqlite3.broken-")
    assert moved.read_bytes() == b"garbage"
    assert moved.with_name(moved.name + "-wal").read_bytes() == b"log"
    with ChatStore(db_path) as fresh:
        assert fresh.list_conversations() == []

    db_path.unlink()
    db_path.write_bytes(b"more garbage")
    second = ChatStore.move_aside(db_path)
    assert second != moved
    assert second.read_bytes() == b"more garbage"


def test_recent_user_messages_are_the_newest_over_every_chat(store: ChatStore) -> None:
    first, second = store.create_conversation(), store.create_conversation()
    store.add_message(first, "user", "Write a parser.")
    store.add_message(second, "system", "Be brief.")
    store.add_message(second, "user", "Add docstrings.")
    store.add_message(first, "user", "   ")
    store.add_message(first, "user", "Write a parser.")  # asked again: listed once, as newest
    assert store.recent_user_messages(5) == ["Write a parser.", "Add docstrings."]
    assert store.recent_user_messages(1) == ["Write a parser."]


def test_spans_stored_before_grammars_read_as_they_were() -> None:
    """Answers stored before the grammar's origin: [length, 1 if drafted else 0]."""
    assert spans_from_json([[5, 0], [1, 1], [2, 2]]) == (
        TokenSpan(5, TokenOrigin.TARGET),
        TokenSpan(1, TokenOrigin.DRAFT),
        TokenSpan(2, TokenOrigin.GRAMMAR),
    )
    assert spans_to_json(SPANS) == [[5, 0], [1, 1], [6, 1], [2, 2]]


def test_search_finds_chats_by_title_or_message_text(store: ChatStore, clock: FakeClock) -> None:
    soup = store.create_conversation("Soup recipes")
    store.add_message(soup, "user", "Leek and potato?")
    clock.advance()
    code = store.create_conversation("Code")
    store.add_message(code, "user", "Sort a list in Python")
    answer = store.begin_answer(code, "auto")
    store.finish_answer(
        answer, "Use sorted(xs) or 100% in-place xs.sort()", SPANS, None, "complete"
    )
    clock.advance()
    store.create_conversation("Empty")

    def found(text: str) -> list[str]:
        return [summary.title for summary in store.search_conversations(text)]

    assert found("soup") == ["Soup recipes"]  # the title, any case
    assert found("POTATO") == ["Soup recipes"]  # a user message
    assert found("sorted(") == ["Code"]  # an answer
    assert found("100%") == ["Code"]  # % and _ are text, not wildcards
    assert found("1_0") == []
    assert found("") == ["Empty", "Code", "Soup recipes"]  # nothing typed: every chat
    assert found("nowhere") == []


def test_an_imported_chat_is_a_new_chat_with_everything_kept(store: ChatStore) -> None:
    stats = SpeculationStats(generated_tokens=4, accepted_draft_tokens_count=2)
    records = [
        MessageRecord(role="system", content="Be brief."),
        MessageRecord(role="user", content="Hi"),
        MessageRecord(
            role="assistant",
            content="Hello, there",
            spans=SPANS,
            stats=stats,
            method="auto",
            state="cancelled",
            extra={"models": {"main": "m"}},
        ),
    ]
    conversation = store.import_conversation("Imported", records)
    assert store.conversation_title(conversation) == "Imported"
    read = store.messages(conversation)
    assert [(r.role, r.content, r.state) for r in read] == [
        (r.role, r.content, r.state) for r in records
    ]
    assert read[2].spans == SPANS
    assert read[2].stats == stats
    assert read[2].extra == {"models": {"main": "m"}}
    assert read[2].method == "auto"


# -- branches --------------------------------------------------------------------------------


def test_a_regenerated_answer_and_an_edited_question_are_alternatives(store: ChatStore) -> None:
    cid = store.create_conversation()
    question = store.add_message(cid, "user", "Name a colour")
    first = store.begin_answer(cid, "auto")
    store.finish_answer(first, "Red", SPANS[:1], SpeculationStats(generated_tokens=1), "complete")
    store.add_message(cid, "user", "Another?")
    follow_up = store.begin_answer(cid, "auto")
    store.finish_answer(follow_up, "Blue", (), None, "complete")

    # Regenerate the first answer: the first stays, as alternative 1 of 2.
    store.branch_before(first)
    second = store.begin_answer(cid, "off")
    store.finish_answer(second, "Green", (), None, "complete")
    shown = store.messages(cid)
    assert [(m.content, m.branch) for m in shown] == [("Name a colour", (1, 1)), ("Green", (2, 2))]

    # Back to the first answer: the rest of the chat follows it, stats and all.
    assert store.switch_branch(second, -1) == first
    shown = store.messages(cid)
    assert [m.content for m in shown] == ["Name a colour", "Red", "Another?", "Blue"]
    assert shown[1].branch == (1, 2)
    assert shown[1].stats == SpeculationStats(generated_tokens=1)
    assert shown[1].spans == SPANS[:1]
    assert store.switch_branch(first, -1) == first  # no alternative before the first

    # Edit the question: a new branch from the start; the old question is alternative 1.
    store.branch_before(question)
    edited = store.add_message(cid, "user", "Name a fruit")
    store.finish_answer(store.begin_answer(cid, "auto"), "Pear", (), None, "complete")
    assert [(m.content, m.branch) for m in store.messages(cid)] == [
        ("Name a fruit", (2, 2)),
        ("Pear", (1, 1)),
    ]
    assert store.switch_branch(edited, -1) == question
    # The old question's newest continuation: the regenerated answer.
    assert [m.content for m in store.messages(cid)] == ["Name a colour", "Green"]
    assert store.switch_branch(question, +1) == edited
    assert [m.content for m in store.messages(cid)][-1] == "Pear"


def test_a_history_written_by_the_last_release_opens_with_everything_intact(
    db_path: Path,
) -> None:
    """A schema-1 file (as SpecDeck wrote it until branches came) is migrated in place."""
    db_path.parent.mkdir(parents=True)
    raw = sqlite3.connect(db_path)
    raw.executescript(
        """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
            created_at REAL NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL, content TEXT NOT NULL, spans TEXT, stats TEXT, method TEXT,
            state TEXT NOT NULL, error TEXT, extra TEXT, created_at REAL NOT NULL);
        CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
        CREATE INDEX conversations_by_update ON conversations (updated_at);
        INSERT INTO conversations VALUES (1, 'First', 10, 20), (2, 'Second', 30, 40);
        INSERT INTO messages VALUES
            (1, 1, 'system', 'Be brief.', NULL, NULL, NULL, 'complete', NULL, NULL, 11),
            (2, 1, 'user', 'Hi', NULL, NULL, NULL, 'complete', NULL, NULL, 12),
            (3, 2, 'user', 'Other chat', NULL, NULL, NULL, 'complete', NULL, NULL, 31),
            (4, 1, 'assistant', 'Hello!', '[[5, 0], [1, 1]]',
             '{"generated_tokens": 2, "accepted_draft_tokens_count": 1}', 'auto', 'complete',
             NULL, '{"compare": {"speedup": 1.5}}', 13),
            (5, 1, 'user', 'Bye', NULL, NULL, NULL, 'complete', NULL, NULL, 14),
            (6, 1, 'assistant', 'Cut', '[[3, 2]]', NULL, 'auto', 'cancelled', NULL, NULL, 15);
        PRAGMA user_version = 1;
        """
    )
    raw.commit()
    raw.close()

    with ChatStore(db_path) as store:
        assert [c.title for c in store.list_conversations()] == ["Second", "First"]
        first = store.messages(1)
        assert [(m.message_id, m.role, m.content, m.state) for m in first] == [
            (1, "system", "Be brief.", "complete"),
            (2, "user", "Hi", "complete"),
            (4, "assistant", "Hello!", "complete"),
            (5, "user", "Bye", "complete"),
            (6, "assistant", "Cut", "cancelled"),
        ]
        assert first[2].spans == (TokenSpan(5, TokenOrigin.TARGET), TokenSpan(1, TokenOrigin.DRAFT))
        assert first[2].stats == SpeculationStats(generated_tokens=2, accepted_draft_tokens_count=1)
        assert first[2].extra == {"compare": {"speedup": 1.5}}
        assert first[4].spans == (TokenSpan(3, TokenOrigin.GRAMMAR),)
        assert all(m.branch == (1, 1) for m in first)
        assert [m.content for m in store.messages(2)] == ["Other chat"]
        # The chats go on where they stopped.
        store.add_message(2, "user", "More")
        assert [m.content for m in store.messages(2)] == ["Other chat", "More"]
    raw = sqlite3.connect(db_path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    raw.close()
