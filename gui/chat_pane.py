"""The conversation view: user messages and streamed answers with their accepted draft tokens."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from PySide6.QtCore import QPoint, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QGuiApplication,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import QMenu, QVBoxLayout, QWidget

from backends.speculation.types import TokenOrigin
from gui.answer_text import (
    AnswerWriter,
    highlighted_text,
    text_runs,
)
from gui.chat_format import (
    DOCUMENT_MARGIN,
    FOOTER_SEPARATOR,
    ChatBrowser,
    ChatStyles,
    footer_parts,
)
from gui.style import TOKEN_FLUSH_MS
from gui.transcript import LEFT_OUT_KEY, MessageRecord, MessageState, TokenSpan

if TYPE_CHECKING:
    from collections.abc import Sequence

    from PySide6.QtGui import QTextDocument

    from backends.speculation.types import EmittedToken, SpeculationStats
    from gui.answer_text import TextRun

log = logging.getLogger(__name__)

USER_LABEL = "You"
ASSISTANT_LABEL = "Assistant"
LABEL_SEPARATOR = " · "
COPY_ANSWER_ACTION = "Copy answer"
EDIT_MESSAGE_ACTION = "Edit and send again"
# A message with alternatives shows "‹ 2/3 ›" after its label; the arrows are links.
BRANCH_SCHEME = "specdeck-branch"
BRANCH_PREVIOUS = "‹"
BRANCH_NEXT = "›"
AUTO_SCROLL_SLACK_PX = 24  # this close to the bottom still counts as "at the bottom"


def left_out_note(count: int) -> str:
    """The line shown where the last answer's context left messages out."""
    return (
        f"The next {count} message{'s were' if count != 1 else ' was'} left out of the"
        " last answer's context: the chat outgrew it (Context overflow)"
    )


@dataclass(frozen=True)
class _Notice:
    """An inline notice between messages ("Engine restarted")."""

    text: str


@dataclass
class _AnswerPlacement:
    """Where one answer lies in the document (positions; the document only ever grows)."""

    region_start: int  # its label
    content_start: int
    content_end: int | None = None  # None while it streams: the write cursor marks the end
    footer_start: int | None = None
    region_end: int | None = None


@dataclass
class _LiveAnswer:
    """The answer being streamed: its record, the text so far and where it is written."""

    record: MessageRecord
    writer: AnswerWriter
    placement: _AnswerPlacement
    parts: list[str] = field(default_factory=list)
    spans: list[TokenSpan] = field(default_factory=list)

    def sync_record(self) -> None:
        self.record.content = "".join(self.parts)
        self.record.spans = tuple(self.spans)


class ChatPane(QWidget):
    """The conversation of the main window, in a read-only QTextBrowser.

    Tokens are buffered by :meth:`append_tokens` and written every ``TOKEN_FLUSH_MS`` in one
    document edit. The readback methods (:meth:`answer_text`, :meth:`answer_origins`,
    :meth:`highlighted_text`, :meth:`footer_text`) read the rendered document.

    Signals:
        branch_requested(int, int): a message's ‹ or › was clicked: the message's id and
            the step (-1 or +1) to the alternative wanted.
        edit_requested(int, str): "Edit and send again" on a user message: its id and text.
    """

    branch_requested = Signal(int, int)
    edit_requested = Signal(int, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._browser = ChatBrowser(self)
        self._browser.setReadOnly(True)
        self._browser.setOpenLinks(False)
        self._browser.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self._browser.customContextMenuRequested.connect(self._show_context_menu)
        self._browser.anchorClicked.connect(self._on_anchor)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._browser)

        self._document = self._browser.document()
        self._document.setUndoRedoEnabled(False)
        self._document.setDocumentMargin(DOCUMENT_MARGIN)
        self._cursor = QTextCursor(self._document)  # always at the end: the chat only grows
        self._fresh_block = True  # the block at the end is empty and not yet part of anything

        self._visualize_drafts = True
        self._styles = ChatStyles(self._document.defaultFont(), self._visualize_drafts)
        self._items: list[MessageRecord | _Notice] = []
        self._answers: list[_AnswerPlacement] = []
        # Where each user message's bubble lies (document positions), for its context menu.
        self._user_messages: list[tuple[int, int, MessageRecord]] = []
        self._live: _LiveAnswer | None = None
        self._pending: list[EmittedToken] = []
        self._deferred_notices: list[str] = []
        self._left_out_shown = False  # a note says where the last answer's context left out

        self._flush_timer = QTimer(self)
        self._flush_timer.setSingleShot(True)
        self._flush_timer.setInterval(TOKEN_FLUSH_MS)
        self._flush_timer.timeout.connect(self._flush_pending_tokens)

    @property
    def browser(self) -> ChatBrowser:
        """The text browser showing the chat (for coordinates in tests and the main window)."""
        return self._browser

    @property
    def document(self) -> QTextDocument:
        """The rendered chat."""
        return self._document

    # --- conversation -------------------------------------------------------------------

    def clear(self) -> None:
        """Show an empty conversation."""
        self._drop_live_answer()
        self._items.clear()
        self._render_all(None)

    def set_messages(self, records: Sequence[MessageRecord]) -> None:
        """Show a stored conversation; a last answer still "streaming" stays open for tokens."""
        self._drop_live_answer()
        self._items = [replace(record) for record in records if record.role != "system"]
        last = self._items[-1] if self._items else None
        live_record = None
        if isinstance(last, MessageRecord) and last.role == "assistant":
            live_record = last if last.state == "streaming" else None
        self._render_all(live_record)
        self._scroll_to_bottom()

    def append_user_message(self, text: str, message_id: int | None = None) -> None:
        """Add the user's message at the end (``message_id``: its id in the history)."""
        self._close_live_answer_early()
        record = MessageRecord(role="user", content=text, message_id=message_id)
        self._items.append(record)
        self._render_user(record)
        self._scroll_to_bottom()

    def show_notice(self, text: str) -> None:
        """An inline muted notice; during an answer it is shown once the answer ends."""
        if self._live is not None:
            self._deferred_notices.append(text)
            return
        notice = _Notice(text)
        self._items.append(notice)
        follow = self._is_at_bottom()
        self._render_notice(notice)
        if follow:
            self._scroll_to_bottom()

    def records(self) -> list[MessageRecord]:
        """The messages shown, the answer being streamed included (as far as it is flushed)."""
        if self._live is not None:
            self._live.sync_record()
        return [replace(item) for item in self._items if isinstance(item, MessageRecord)]

    # --- streaming ----------------------------------------------------------------------

    def is_streaming(self) -> bool:
        """Is an answer open for tokens?"""
        return self._live is not None

    def begin_answer(self, method: str | None) -> None:
        """Start a new assistant answer, generated with ``method`` ("auto", "off", ...)."""
        self._close_live_answer_early()
        record = MessageRecord(role="assistant", content="", method=method, state="streaming")
        self._items.append(record)
        self._live = self._render_answer(record, live=True)
        self._scroll_to_bottom()

    def append_tokens(self, tokens: Sequence[EmittedToken]) -> None:
        """Buffer tokens of the open answer; they are written on the next flush."""
        if self._live is None:
            log.warning("tokens arrived with no answer open; dropped %d", len(tokens))
            return
        self._pending.extend(tokens)
        if not self._flush_timer.isActive():
            self._flush_timer.start()

    def flush(self) -> None:
        """Write the buffered tokens now instead of at the next timer tick."""
        self._flush_pending_tokens()

    def finish_answer(
        self,
        stats: SpeculationStats | None,
        state: MessageState = "complete",
        error: str | None = None,
        left_out: Sequence[int] = (),
    ) -> None:
        """Write what is buffered and close the open answer with its footer.

        ``left_out``: the ids of the earlier messages its context left out; a note is
        shown where they begin (and the last answer's note, if any, goes).
        """
        live = self._live
        if live is None:
            log.warning("finish_answer with no answer open")
            return
        self._flush_pending_tokens()
        follow = self._is_at_bottom()
        live.sync_record()
        live.record.stats = stats
        live.record.state = state
        live.record.error = error
        if left_out:
            live.record.extra[LEFT_OUT_KEY] = list(left_out)
        self._live = None
        self._cursor.beginEditBlock()
        self._close_answer(live.record, live.placement)
        self._cursor.endEditBlock()
        if left_out or self._left_out_shown:  # the note moves to the last answer's drop
            scroll_value = self._browser.verticalScrollBar().value()
            self._render_all(None)
            self._browser.verticalScrollBar().setValue(scroll_value)
        notices, self._deferred_notices = self._deferred_notices, []
        for text in notices:
            self.show_notice(text)
        if follow:
            self._scroll_to_bottom()

    def set_visualize_drafts(self, on: bool) -> None:
        """Show accepted draft tokens on green (re-renders the whole conversation)."""
        if on == self._visualize_drafts:
            return
        self._visualize_drafts = on
        self._browser.set_origin_tooltips(on)
        self.rerender()

    def rerender(self) -> None:
        """Render the conversation again, where the reader is (after a theme change)."""
        self._flush_pending_tokens()
        live_record = None
        if self._live is not None:
            self._live.sync_record()
            live_record = self._live.record
        scroll_bar = self._browser.verticalScrollBar()
        was_at_bottom = self._is_at_bottom()
        scroll_value = scroll_bar.value()
        self._render_all(live_record)
        if was_at_bottom:
            self._scroll_to_bottom()
        else:
            scroll_bar.setValue(scroll_value)

    def visualize_drafts(self) -> bool:
        """Are accepted draft tokens shown on green?"""
        return self._visualize_drafts

    # --- readback -----------------------------------------------------------------------

    def answer_count(self) -> int:
        """How many assistant answers are shown (the open one included)."""
        return len(self._answers)

    def answer_text(self, index: int = -1) -> str:
        """The text of an answer as rendered (Markdown shown), without its label and footer."""
        return "".join(run.text for run in self._answer_runs(index))

    def answer_source(self, index: int = -1) -> str:
        """The generated text of an answer as the model wrote it (its Markdown)."""
        if self._live is not None:
            self._live.sync_record()
        answers = [item for item in self._items if isinstance(item, MessageRecord)]
        return [record for record in answers if record.role == "assistant"][index].content

    def answer_origins(self, index: int = -1) -> list[tuple[str, TokenOrigin]]:
        """The rendered answer as runs of text with one origin (adjacent runs merged)."""
        merged: list[tuple[str, TokenOrigin]] = []
        for run in self._answer_runs(index):
            who = run.origin if run.origin is not None else TokenOrigin.TARGET
            if merged and merged[-1][1] is who:
                merged[-1] = (merged[-1][0] + run.text, who)
            else:
                merged.append((run.text, who))
        return merged

    def highlighted_text(self, index: int = -1, origin: TokenOrigin = TokenOrigin.DRAFT) -> str:
        """The text of an answer shown on ``origin``'s background (line breaks aside).

        The accepted draft's green by default.
        """
        return highlighted_text(self._answer_runs(index), origin)

    def footer_text(self, index: int = -1) -> str:
        """The footer line under an answer ("" while it streams or when it has none)."""
        placement = self._answers[index]
        if placement.footer_start is None:
            return ""
        return self._document.findBlock(placement.footer_start).text()

    def origin_at(self, point: QPoint) -> TokenOrigin | None:
        """Who produced the answer character under ``point`` (viewport coordinates)."""
        return self._browser.origin_at(point)

    def answer_index_at(self, point: QPoint) -> int | None:
        """The index of the answer under ``point`` (viewport coordinates), if any."""
        position = self._browser.cursorForPosition(point).position()
        for index, placement in enumerate(self._answers):
            end = placement.region_end
            if end is None:
                end = self._cursor.position()
            if placement.region_start <= position <= end:
                return index
        return None

    def copy_answer(self, index: int = -1) -> None:
        """Put an answer's Markdown on the clipboard (nothing when there is no such answer)."""
        if not -len(self._answers) <= index < len(self._answers):
            return
        QGuiApplication.clipboard().setText(self.answer_source(index))

    def copy_last_code_block(self) -> str | None:
        """Put the conversation's last code block on the clipboard (None: there is none)."""
        self._flush_pending_tokens()
        boxes = self._browser.code_boxes()
        return self._browser.copy_code(boxes[-1].first_block) if boxes else None

    def context_menu(self, point: QPoint) -> QMenu:
        """The menu for a right click at ``point``: the browser's own, plus "Copy answer"."""
        scroll = QPoint(
            self._browser.horizontalScrollBar().value(), self._browser.verticalScrollBar().value()
        )
        menu = self._browser.createStandardContextMenu(point + scroll)
        index = self.answer_index_at(point)
        if index is not None:
            menu.addSeparator()
            action = menu.addAction(COPY_ANSWER_ACTION)
            action.triggered.connect(lambda: self.copy_answer(index))
        user = self.user_message_at(point)
        if user is not None and user.message_id is not None:
            menu.addSeparator()
            edit = menu.addAction(EDIT_MESSAGE_ACTION)
            message_id, text = user.message_id, user.content
            edit.triggered.connect(lambda: self.edit_requested.emit(message_id, text))
        return menu

    # --- Qt -----------------------------------------------------------------------------

    def _show_context_menu(self, point: QPoint) -> None:
        menu = self.context_menu(point)
        menu.exec(self._browser.viewport().mapToGlobal(point))
        menu.deleteLater()

    # --- streaming internals ------------------------------------------------------------

    def _flush_pending_tokens(self) -> None:
        self._flush_timer.stop()
        live = self._live
        if live is None or not self._pending:
            self._pending.clear()
            return
        tokens, self._pending = self._pending, []
        follow = self._is_at_bottom()
        self._cursor.beginEditBlock()
        for token in tokens:
            if token.text:
                live.writer.write(token.text, token.origin)
                live.parts.append(token.text)
                live.spans.append(TokenSpan(len(token.text), token.origin))
        live.writer.render()  # once per flush: only the answer's open part is laid out again
        self._cursor.endEditBlock()
        if follow:
            self._scroll_to_bottom()

    def _close_live_answer_early(self) -> None:
        if self._live is not None:
            log.warning("a new message arrived while an answer was open; closing it as stopped")
            self.finish_answer(None, "cancelled")

    def _drop_live_answer(self) -> None:
        self._flush_timer.stop()
        self._pending.clear()
        self._deferred_notices.clear()
        self._live = None

    def _is_at_bottom(self) -> bool:
        scroll_bar = self._browser.verticalScrollBar()
        return scroll_bar.value() >= scroll_bar.maximum() - AUTO_SCROLL_SLACK_PX

    def _scroll_to_bottom(self) -> None:
        scroll_bar = self._browser.verticalScrollBar()
        scroll_bar.setValue(scroll_bar.maximum())

    # --- rendering ----------------------------------------------------------------------

    def _render_all(self, live_record: MessageRecord | None) -> None:
        """Render every item; ``live_record`` is left open as the answer being streamed."""
        self._live = None
        self._document.clear()
        self._browser.update_column_margins()
        self._cursor = QTextCursor(self._document)
        self._fresh_block = True
        self._answers.clear()
        self._user_messages.clear()
        self._styles = ChatStyles(self._document.defaultFont(), self._visualize_drafts)
        note_before, left_out = self._left_out_place()
        self._left_out_shown = note_before is not None
        self._cursor.beginEditBlock()
        for item in self._items:
            if item is note_before:
                self._render_notice(_Notice(left_out_note(left_out)))
            if isinstance(item, _Notice):
                self._render_notice(item)
            elif item.role == "user":
                self._render_user(item)
            else:
                opened = self._render_answer(item, live=item is live_record)
                if opened is not None:
                    self._live = opened
        self._cursor.endEditBlock()

    def _left_out_place(self) -> tuple[MessageRecord | None, int]:
        """The message the last finished answer's context left out first, and how many."""
        last_answer = next(
            (
                item
                for item in reversed(self._items)
                if isinstance(item, MessageRecord)
                and item.role == "assistant"
                and item.state != "streaming"
            ),
            None,
        )
        ids = last_answer.extra.get(LEFT_OUT_KEY) if last_answer is not None else None
        if not isinstance(ids, list) or not ids:
            return None, 0
        first = next(
            (
                item
                for item in self._items
                if isinstance(item, MessageRecord) and item.message_id in ids
            ),
            None,
        )
        return first, len(ids)

    def _open_block(self, block_format: QTextBlockFormat, char_format: QTextCharFormat) -> None:
        self._cursor.movePosition(QTextCursor.MoveOperation.End)
        if self._fresh_block:
            self._cursor.setBlockFormat(block_format)
            self._cursor.setBlockCharFormat(char_format)
            self._fresh_block = False
        else:
            self._cursor.insertBlock(block_format, char_format)

    def _render_user(self, record: MessageRecord) -> None:
        self._cursor.movePosition(QTextCursor.MoveOperation.End)
        if self._fresh_block:
            # A frame never starts a document: the empty block before it must take no room.
            self._cursor.setBlockFormat(self._styles.collapsed_block)
        start = self._cursor.position()
        self._cursor.insertFrame(self._styles.bubble)
        self._cursor.setBlockFormat(self._styles.bubble_label_block)
        self._cursor.insertText(USER_LABEL, self._styles.label)
        self._insert_branch_switcher(record)
        self._cursor.insertBlock(self._styles.prose_block, self._styles.body)
        self._cursor.insertText(record.content, self._styles.body)
        self._cursor.movePosition(QTextCursor.MoveOperation.End)
        self._user_messages.append((start, self._cursor.position(), record))
        self._fresh_block = True

    def _insert_branch_switcher(self, record: MessageRecord) -> None:
        """``  ‹ 2/3 ›`` after a label, for a message with alternatives (arrows are links)."""
        place, count = record.branch
        if count < 2 or record.message_id is None:
            return
        muted = self._styles.label_method
        self._cursor.insertText("   ", muted)
        for arrow, step, enabled in (
            (BRANCH_PREVIOUS, -1, place > 1),
            (BRANCH_NEXT, +1, place < count),
        ):
            if arrow == BRANCH_NEXT:
                self._cursor.insertText(f" {place}/{count} ", muted)
            link = QTextCharFormat(muted)
            if enabled:
                link.setAnchor(True)
                link.setAnchorHref(f"{BRANCH_SCHEME}:{record.message_id}/{step}")
                link.setForeground(self._styles.label.foreground())
                link.setToolTip("Previous alternative" if step < 0 else "Next alternative")
            self._cursor.insertText(arrow, link)

    def branch_switcher_text(self, index: int) -> str:
        """What follows the label of message ``index`` (user and assistant messages alike)."""
        records = [item for item in self._items if isinstance(item, MessageRecord)]
        place, count = records[index].branch
        return f"{BRANCH_PREVIOUS} {place}/{count} {BRANCH_NEXT}" if count > 1 else ""

    def branch_link(self, message_id: int, step: int) -> QUrl:
        """The link of a message's ‹ (step -1) or › (+1), as the chat shows it."""
        return QUrl(f"{BRANCH_SCHEME}:{message_id}/{step}")

    def _on_anchor(self, url: QUrl) -> None:
        if url.scheme() != BRANCH_SCHEME:
            return
        message_id, _, step = url.path().partition("/")
        try:
            self.branch_requested.emit(int(message_id), int(step))
        except ValueError:
            log.warning("a branch link that names no message: %s", url.toString())

    def scroll_to_answer(self, index: int = -1) -> None:
        """Scroll so that an answer's label line is at the top."""
        block = self._document.findBlock(self._answers[index].region_start)
        top = self._document.documentLayout().blockBoundingRect(block).top()
        self._browser.verticalScrollBar().setValue(int(top))

    def user_message_at(self, point: QPoint) -> MessageRecord | None:
        """The user message under ``point`` (viewport coordinates), if any."""
        position = self._browser.cursorForPosition(point).position()
        for start, end, record in self._user_messages:
            if start <= position <= end:
                return record
        return None

    def _render_notice(self, notice: _Notice) -> None:
        self._open_block(self._styles.notice_block, self._styles.notice)
        self._cursor.insertText(notice.text, self._styles.notice)

    def _render_answer(self, record: MessageRecord, *, live: bool) -> _LiveAnswer | None:
        self._open_block(self._styles.label_block, self._styles.label)
        region_start = self._cursor.block().position()
        self._cursor.insertText(ASSISTANT_LABEL, self._styles.label)
        if record.method:
            self._cursor.insertText(LABEL_SEPARATOR + record.method, self._styles.label_method)
        self._insert_branch_switcher(record)
        self._open_block(self._styles.prose_block, self._styles.body)
        placement = _AnswerPlacement(region_start, self._cursor.position())
        self._answers.append(placement)
        writer = AnswerWriter(self._cursor, self._styles)
        written = 0
        for span in record.spans:
            text = record.content[written : written + span.length]
            writer.write(text, span.origin)
            written += len(text)
        if written < len(record.content):
            writer.write(record.content[written:], TokenOrigin.TARGET)
        writer.render()
        if live:
            return _LiveAnswer(record, writer, placement, [record.content], list(record.spans))
        self._close_answer(record, placement)
        return None

    def _close_answer(self, record: MessageRecord, placement: _AnswerPlacement) -> None:
        placement.content_end = self._cursor.position()
        error_text, muted_text = footer_parts(record.stats, record.state, record.error)
        if error_text or muted_text:
            self._open_block(self._styles.footer_block, self._styles.footer)
            placement.footer_start = self._cursor.block().position()
            if error_text:
                self._cursor.insertText(error_text, self._styles.footer_error)
            if error_text and muted_text:
                self._cursor.insertText(FOOTER_SEPARATOR, self._styles.footer)
            if muted_text:
                self._cursor.insertText(muted_text, self._styles.footer)
        placement.region_end = self._cursor.position()

    def _answer_runs(self, index: int) -> list[TextRun]:
        placement = self._answers[index]
        end = placement.content_end
        if end is None:
            end = self._cursor.position()
        return text_runs(self._document, placement.content_start, end)
