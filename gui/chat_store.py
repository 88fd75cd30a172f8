"""The conversation history: chats and their messages in one SQLite file, saved as they happen."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Self, cast, get_args

from backends.errors import SpecDeckError
from backends.paths import user_data_dir
from backends.service.protocol import stats_from_wire, stats_to_wire
from gui.transcript import MessageRecord, MessageState, spans_from_json, spans_to_json

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path
    from types import TracebackType

    from backends.engines.interface import Role
    from backends.speculation.types import SpeculationStats
    from gui.transcript import TokenSpan

log = logging.getLogger(__name__)

HISTORY_FILE_NAME = "chats.sqlite3"
DEFAULT_TITLE = "New chat"
AUTO_TITLE_MAX_CHARS = 40
ELLIPSIS = "…"
SCHEMA_VERSION: Final = 2
# SQLite keeps a committed write-ahead log next to the database; it belongs to the file.
_SIDE_FILE_SUFFIXES = ("-wal", "-shm")
_STATES: frozenset[str] = frozenset(get_args(MessageState))
_ROLES: frozenset[str] = frozenset(("system", "user", "assistant"))


class HistoryError(SpecDeckError):
    """The chat history file cannot be opened, read or written (not SQLite, corrupt, newer)."""


@dataclass(frozen=True)
class ConversationSummary:
    """What the conversation list shows of one chat."""

    conversation_id: int
    title: str
    created_at: float  # seconds since the epoch
    updated_at: float
    message_count: int


# -- schema ----------------------------------------------------------------------------------


def _create_version_1(db: sqlite3.Connection) -> None:
    db.execute(
        """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )
        """
    )
    # AUTOINCREMENT: ids never come back after a delete, so id order is message order and a
    # stale id can never name a newer message.
    db.execute(
        """
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL
                REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            spans TEXT,
            stats TEXT,
            method TEXT,
            state TEXT NOT NULL,
            error TEXT,
            extra TEXT,
            created_at REAL NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX messages_by_conversation ON messages (conversation_id, id)")
    db.execute("CREATE INDEX conversations_by_update ON conversations (updated_at)")


def _add_branches_and_chat_settings_version_2(db: sqlite3.Connection) -> None:
    """Messages form a tree (edits and regenerated answers are alternatives: siblings).

    Each message's parent is the one before it in its chat (what version 1 stored is one
    branch); a chat shows the branch that ends at its ``leaf_id``. A chat also keeps its
    own settings (``settings``, JSON: its system prompt, its context policy).
    """
    db.execute("ALTER TABLE conversations ADD COLUMN settings TEXT")
    db.execute(
        "ALTER TABLE messages ADD COLUMN parent_id INTEGER"
        " REFERENCES messages(id) ON DELETE CASCADE"
    )
    db.execute("ALTER TABLE conversations ADD COLUMN leaf_id INTEGER")
    db.execute(
        """
        UPDATE messages SET parent_id = (
            SELECT max(p.id) FROM messages p
            WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id
        )
        """
    )
    db.execute(
        "UPDATE conversations SET leaf_id ="
        " (SELECT max(m.id) FROM messages m WHERE m.conversation_id = conversations.id)"
    )
    db.execute("CREATE INDEX messages_by_parent ON messages (parent_id)")


# _MIGRATIONS[n] brings a database from user_version n to n + 1; version 0 is an empty file.
_MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _create_version_1,
    _add_branches_and_chat_settings_version_2,
)
assert len(_MIGRATIONS) == SCHEMA_VERSION


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring ``db`` up to :data:`SCHEMA_VERSION`, one version per transaction."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise HistoryError(
            f"the chat history {path} was written by a newer SpecDeck "
            f"(schema {version}, this version reads up to {SCHEMA_VERSION})"
        )
    for current in range(version, SCHEMA_VERSION):
        db.execute("BEGIN IMMEDIATE")
        try:
            _MIGRATIONS[current](db)
            db.execute(f"PRAGMA user_version = {current + 1}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        log.info("chat history %s migrated to schema %d", path, current + 1)


# -- the store -------------------------------------------------------------------------------


def auto_title(message: str) -> str | None:
    """A chat title from its first user message: the first line, shortened (None if blank)."""
    for line in message.splitlines():
        line = " ".join(line.split())
        if line:
            if len(line) > AUTO_TITLE_MAX_CHARS:
                return line[:AUTO_TITLE_MAX_CHARS].rstrip() + ELLIPSIS
            return line
    return None


class ChatStore:
    """Conversations and messages in SQLite; every call is one committed transaction.

    Used from the GUI thread only. The user's message is saved before generation starts and
    the answer while it streams, so a crash loses nothing that was already on screen.
    """

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryError(
                f"cannot create the folder for the chat history {path}: {exc}"
            ) from exc
        try:
            # isolation_level=None: no implicit transactions; each write method opens its own.
            self._db = sqlite3.connect(path, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot open the chat history {path}: {exc}") from exc
        try:
            self._open()
        except HistoryError:
            self._db.close()
            raise
        except sqlite3.Error as exc:
            self._db.close()
            raise HistoryError(
                f"the chat history {path} is not a readable SQLite database: {exc}"
            ) from exc

    def _open(self) -> None:
        db = self._db
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise HistoryError(f"the chat history {self.path} is corrupt: {check}")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = ON")
        migrate(db, self.path)
        interrupted = db.execute(
            "UPDATE messages SET state = 'interrupted' WHERE state = 'streaming'"
        ).rowcount
        if interrupted:
            log.info("%d answer(s) were cut off when SpecDeck last stopped", interrupted)

    @staticmethod
    def default_path() -> Path:
        """``<user data dir>/chats.sqlite3``."""
        return user_data_dir() / HISTORY_FILE_NAME

    @staticmethod
    def move_aside(path: Path) -> Path:
        """Rename a bad history file to ``<name>.broken-<timestamp>`` and return the new path.

        Its ``-wal``/``-shm`` companions move with it, so a fresh history starts clean.
        """
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = path.with_name(f"{path.name}.broken-{stamp}")
        attempt = 1
        while target.exists():
            attempt += 1
            target = path.with_name(f"{path.name}.broken-{stamp}-{attempt}")
        try:
            path.rename(target)
            for suffix in _SIDE_FILE_SUFFIXES:
                side = path.with_name(path.name + suffix)
                if side.exists():
                    side.rename(target.with_name(target.name + suffix))
        except OSError as exc:
            raise HistoryError(f"cannot move the chat history {path} aside: {exc}") from exc
        return target

    def close(self) -> None:
        """Close the database (everything is already committed)."""
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise HistoryError(f"the chat history {self.path} could not be saved: {exc}") from exc

    def _query(self, sql: str, parameters: Sequence[object] = ()) -> list[Any]:
        try:
            return self._db.execute(sql, parameters).fetchall()
        except sqlite3.Error as exc:
            raise HistoryError(f"the chat history {self.path} could not be read: {exc}") from exc

    # -- conversations -----------------------------------------------------------------------

    def create_conversation(self, title: str = DEFAULT_TITLE) -> int:
        """A new, empty conversation; returns its id."""
        now = self._clock()
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO conversations (title, created_at, updated_at) VALUES (?, ?, ?)",
                (title, now, now),
            )
        return _row_id(cursor)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        """Give a conversation a new title (its place in the list stays)."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id)
            )
            _require_row(cursor, "conversation", conversation_id)

    def delete_conversation(self, conversation_id: int) -> None:
        """Delete a conversation and all its messages."""
        with self._transaction() as db:
            cursor = db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            _require_row(cursor, "conversation", conversation_id)

    def list_conversations(self) -> list[ConversationSummary]:
        """Every conversation, the most recently updated first."""
        rows = self._query(
            """
            SELECT c.id, c.title, c.created_at, c.updated_at,
                   (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id)
            FROM conversations c
            ORDER BY c.updated_at DESC, c.id DESC
            """
        )
        return _summaries(rows)

    def search_conversations(self, text: str) -> list[ConversationSummary]:
        """The conversations whose title or a message holds ``text`` (any case), newest first."""
        needle = text.strip()
        if not needle:
            return self.list_conversations()
        pattern = "%" + needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._query(
            """
            SELECT c.id, c.title, c.created_at, c.updated_at,
                   (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id)
            FROM conversations c
            WHERE c.title LIKE ?1 ESCAPE '\\'
               OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id
                          AND m.role != 'system' AND m.content LIKE ?1 ESCAPE '\\')
            ORDER BY c.updated_at DESC, c.id DESC
            """,
            (pattern,),
        )
        return _summaries(rows)

    def import_conversation(self, title: str, messages: Sequence[MessageRecord]) -> int:
        """A new conversation holding ``messages`` as they are (one transaction); its id."""
        now = self._clock()
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO conversations (title, created_at, updated_at) VALUES (?, ?, ?)",
                (title, now, now),
            )
            conversation_id = _row_id(cursor)
            parent: int | None = None
            for record in messages:
                if record.role not in _ROLES or record.state not in _STATES:
                    raise ValueError(f"a message of role {record.role!r}, state {record.state!r}")
                inserted = db.execute(
                    "INSERT INTO messages (conversation_id, role, content, spans, stats, method,"
                    " state, error, extra, created_at, parent_id)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        conversation_id,
                        record.role,
                        record.content,
                        _to_json(spans_to_json(record.spans))
                        if record.role == "assistant"
                        else None,
                        None if record.stats is None else _to_json(stats_to_wire(record.stats)),
                        record.method,
                        record.state,
                        record.error,
                        None if not record.extra else _to_json(record.extra),
                        now,
                        parent,
                    ),
                )
                parent = _row_id(inserted)
            db.execute(
                "UPDATE conversations SET leaf_id = ? WHERE id = ?", (parent, conversation_id)
            )
        return conversation_id

    def chat_settings(self, conversation_id: int) -> dict[str, object]:
        """The settings a chat keeps for itself ({} when it keeps none)."""
        try:
            return _chat_settings(self._db, conversation_id)
        except sqlite3.Error as exc:
            raise HistoryError(f"the chat history {self.path} could not be read: {exc}") from exc

    def set_chat_setting(self, conversation_id: int, key: str, value: object) -> None:
        """Keep ``key`` = ``value`` as one of a chat's own settings."""
        with self._transaction() as db:
            stored = _chat_settings(db, conversation_id)
            stored[key] = value
            db.execute(
                "UPDATE conversations SET settings = ? WHERE id = ?",
                (_to_json(stored), conversation_id),
            )

    def conversation_title(self, conversation_id: int) -> str:
        """The title of a conversation."""
        rows = self._query("SELECT title FROM conversations WHERE id = ?", (conversation_id,))
        if not rows:
            raise KeyError(f"no conversation {conversation_id}")
        return str(rows[0][0])

    # -- messages ----------------------------------------------------------------------------

    def add_message(self, conversation_id: int, role: Role, content: str) -> int:
        """Save a complete user or system message; the first user message titles a new chat."""
        if role not in ("user", "system"):
            raise ValueError(f"add_message saves user and system messages, not {role!r}")
        now = self._clock()
        with self._transaction() as db:
            title_rows = db.execute(
                "SELECT title FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchall()
            if not title_rows:
                raise KeyError(f"no conversation {conversation_id}")
            retitle = None
            if role == "user" and title_rows[0][0] == DEFAULT_TITLE:
                earlier_user_message = db.execute(
                    "SELECT 1 FROM messages WHERE conversation_id = ? AND role = 'user' LIMIT 1",
                    (conversation_id,),
                ).fetchone()
                if earlier_user_message is None:
                    retitle = auto_title(content)
            cursor = db.execute(
                "INSERT INTO messages"
                " (conversation_id, role, content, state, created_at, parent_id)"
                " VALUES (?, ?, ?, 'complete', ?,"
                " (SELECT leaf_id FROM conversations WHERE id = ?))",
                (conversation_id, role, content, now, conversation_id),
            )
            db.execute(
                "UPDATE conversations SET updated_at = ?, title = COALESCE(?, title),"
                " leaf_id = ? WHERE id = ?",
                (now, retitle, _row_id(cursor), conversation_id),
            )
        return _row_id(cursor)

    def begin_answer(self, conversation_id: int, method: str | None) -> int:
        """An empty assistant message in state "streaming"; returns its id."""
        now = self._clock()
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO messages"
                " (conversation_id, role, content, spans, method, state, created_at, parent_id)"
                " VALUES (?, 'assistant', '', '[]', ?, 'streaming', ?,"
                " (SELECT leaf_id FROM conversations WHERE id = ?))",
                (conversation_id, method, now, conversation_id),
            )
            db.execute(
                "UPDATE conversations SET updated_at = ?, leaf_id = ? WHERE id = ?",
                (now, _row_id(cursor), conversation_id),
            )
        return _row_id(cursor)

    def update_answer(self, message_id: int, content: str, spans: Sequence[TokenSpan]) -> None:
        """Save the text streamed so far (one UPDATE: called every half second or so)."""
        with self._transaction() as db:
            db.execute(
                "UPDATE messages SET content = ?, spans = ? WHERE id = ?",
                (content, _to_json(spans_to_json(spans)), message_id),
            )

    def finish_answer(
        self,
        message_id: int,
        content: str,
        spans: Sequence[TokenSpan],
        stats: SpeculationStats | None,
        state: MessageState,
        error: str | None = None,
        extra: dict[str, object] | None = None,
    ) -> None:
        """Save the final answer with its stats and how it ended."""
        if state not in _STATES:
            raise ValueError(f"unknown message state {state!r}")
        now = self._clock()
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE messages SET content = ?, spans = ?, stats = ?, state = ?, error = ?,"
                " extra = ? WHERE id = ?",
                (
                    content,
                    _to_json(spans_to_json(spans)),
                    None if stats is None else _to_json(stats_to_wire(stats)),
                    state,
                    error,
                    None if not extra else _to_json(extra),
                    message_id,
                ),
            )
            _require_row(cursor, "message", message_id)
            db.execute(
                "UPDATE conversations SET updated_at = ?"
                " WHERE id = (SELECT conversation_id FROM messages WHERE id = ?)",
                (now, message_id),
            )

    def messages(self, conversation_id: int) -> list[MessageRecord]:
        """The messages of the conversation's branch shown, in order.

        Each record says which of its alternatives it is (``branch``: its place among the
        messages that follow the same one, and how many there are).
        """
        rows = self._query(
            """
            WITH RECURSIVE branch(id) AS (
                SELECT leaf_id FROM conversations WHERE id = ?1
                UNION ALL
                SELECT m.parent_id FROM messages m JOIN branch ON m.id = branch.id
                WHERE m.parent_id IS NOT NULL
            )
            SELECT m.id, m.role, m.content, m.spans, m.stats, m.method, m.state, m.error,
                   m.extra,
                   (SELECT COUNT(*) FROM messages s WHERE s.conversation_id = ?1
                    AND s.parent_id IS m.parent_id AND s.id <= m.id),
                   (SELECT COUNT(*) FROM messages s WHERE s.conversation_id = ?1
                    AND s.parent_id IS m.parent_id)
            FROM messages m WHERE m.id IN branch ORDER BY m.id
            """,
            (conversation_id,),
        )
        return [self._record(*row) for row in rows]

    def branch_before(self, message_id: int) -> None:
        """Show the branch up to the message before ``message_id``.

        The next message added is then an alternative to it (an edited question, a
        regenerated answer).
        """
        with self._transaction() as db:
            _require_row(_show_branch_before(db, message_id), "message", message_id)

    def switch_branch(self, message_id: int, step: int) -> int:
        """Show the alternative ``step`` places from ``message_id`` and its latest continuation.

        ``step`` -1 is the alternative before it. Returns the alternative's id (the same
        one at either end).
        """
        with self._transaction() as db:
            row = db.execute(
                "SELECT conversation_id, parent_id FROM messages WHERE id = ?", (message_id,)
            ).fetchone()
            if row is None:
                raise KeyError(f"no message {message_id}")
            conversation_id, parent_id = row
            siblings = [
                int(sibling)
                for (sibling,) in db.execute(
                    "SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ?"
                    " ORDER BY id",
                    (conversation_id, parent_id),
                )
            ]
            place = min(max(siblings.index(message_id) + step, 0), len(siblings) - 1)
            chosen = leaf = siblings[place]
            while True:  # down the newest children to the end of that branch
                child = db.execute(
                    "SELECT max(id) FROM messages WHERE parent_id = ?", (leaf,)
                ).fetchone()[0]
                if child is None:
                    break
                leaf = int(child)
            db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (leaf, conversation_id))
        return chosen

    def recent_user_messages(self, limit: int) -> list[str]:
        """The user's last ``limit`` messages over every chat, newest first, one per text."""
        rows = self._query(
            "SELECT content FROM messages WHERE role = 'user' AND trim(content) != ''"
            " GROUP BY content ORDER BY max(id) DESC LIMIT ?",
            (limit,),
        )
        return [str(row[0]) for row in rows]

    def delete_messages_from(self, message_id: int) -> None:
        """Delete a message and everything that follows it.

        Its chat then shows the branch up to the message before it.
        """
        with self._transaction() as db:
            _show_branch_before(db, message_id)
            db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def _record(
        self,
        message_id: int,
        role: str,
        content: str,
        spans: str | None,
        stats: str | None,
        method: str | None,
        state: str,
        error: str | None,
        extra: str | None,
        branch_place: int = 1,
        branch_count: int = 1,
    ) -> MessageRecord:
        if role not in _ROLES or state not in _STATES:
            raise HistoryError(
                f"the chat history {self.path} has a message with role {role!r} and state "
                f"{state!r}, which this SpecDeck does not know"
            )
        try:
            return MessageRecord(
                role=cast("Role", role),
                content=content,
                spans=spans_from_json(json.loads(spans)) if spans else (),
                stats=stats_from_wire(json.loads(stats)) if stats else None,
                method=method,
                state=cast("MessageState", state),
                error=error,
                message_id=int(message_id),
                extra=dict(json.loads(extra)) if extra else {},
                branch=(int(branch_place), int(branch_count)),
            )
        except (ValueError, TypeError) as exc:
            raise HistoryError(
                f"the chat history {self.path} has an unreadable message {message_id}: {exc}"
            ) from exc


def _show_branch_before(db: sqlite3.Connection, message_id: int) -> sqlite3.Cursor:
    """Make the chat of ``message_id`` show the branch up to the message before it."""
    return db.execute(
        "UPDATE conversations SET leaf_id = (SELECT parent_id FROM messages WHERE id = ?1)"
        " WHERE id = (SELECT conversation_id FROM messages WHERE id = ?1)",
        (message_id,),
    )


def _chat_settings(db: sqlite3.Connection, conversation_id: int) -> dict[str, object]:
    """A chat's own settings ({} when it keeps none or they cannot be read)."""
    row = db.execute(
        "SELECT settings FROM conversations WHERE id = ?", (conversation_id,)
    ).fetchone()
    if row is None:
        raise KeyError(f"no conversation {conversation_id}")
    try:
        stored = json.loads(row[0]) if row[0] else {}
    except ValueError:
        log.warning("chat %d has unreadable settings; they are ignored", conversation_id)
        return {}
    return dict(stored) if isinstance(stored, dict) else {}


def _summaries(rows: Sequence[Sequence[Any]]) -> list[ConversationSummary]:
    """Rows of (id, title, created, updated, message count) as summaries."""
    return [
        ConversationSummary(int(cid), str(title), float(created), float(updated), int(count))
        for cid, title, created, updated, count in rows
    ]


def _to_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _row_id(cursor: sqlite3.Cursor) -> int:
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _require_row(cursor: sqlite3.Cursor, kind: str, row_id: int) -> None:
    if cursor.rowcount == 0:
        raise KeyError(f"no {kind} {row_id}")


__all__ = [
    "DEFAULT_TITLE",
    "HISTORY_FILE_NAME",
    "SCHEMA_VERSION",
    "ChatStore",
    "ConversationSummary",
    "HistoryError",
    "auto_title",
    "migrate",
]
