"""The conversation view: user messages and streamed answers with their accepted draft tokens."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from enum import Enum, auto
from typing import TYPE_CHECKING, cast

from PySide6.QtCore import QEvent, QObject, QPoint, QPointF, QRect, QRectF, Qt, QTimer
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetrics,
    QGuiApplication,
    QPainter,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextFormat,
    QTextFrameFormat,
)
from PySide6.QtWidgets import QMenu, QTextBrowser, QToolTip, QVBoxLayout, QWidget

from backends.speculative import TokenOrigin
from gui.style import (
    CODE_BACKGROUND,
    DRAFT_BACKGROUND,
    DRAFT_BACKGROUND_IN_CODE,
    DRAFT_TOOLTIP,
    ERROR_TEXT,
    MUTED_TEXT,
    TARGET_TOOLTIP,
    TOKEN_FLUSH_MS,
    USER_BUBBLE_BACKGROUND,
    monospace_font,
)
from gui.transcript import MessageRecord, MessageState, TokenSpan

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from PySide6.QtGui import QHelpEvent, QPaintEvent, QResizeEvent, QTextBlock, QTextDocument

    from backends.speculative import EmittedToken, SpeculationStats

log = logging.getLogger(__name__)

# Who produced a character is kept in its format, so what is read back is what is rendered.
ORIGIN_PROPERTY = QTextFormat.Property.UserProperty.value + 1
# Lines of a fenced code block (fences included) are marked, for the box painted behind them.
CODE_LINE_PROPERTY = QTextFormat.Property.UserProperty.value + 2

USER_LABEL = "You"
ASSISTANT_LABEL = "Assistant"
LABEL_SEPARATOR = " · "
FOOTER_SEPARATOR = " · "
COPY_ANSWER_ACTION = "Copy answer"
CANCELLED_TEXT = "Stopped"
INTERRUPTED_TEXT = "Interrupted (the app closed while answering)"
ERROR_TITLE = "Error"
ERROR_PREFIX = f"{ERROR_TITLE}: "
NO_DRAFTS_TEXT = "no drafts"

STOP_REASON_WORDS = {
    "eos": "end of answer",
    "max_tokens": "max tokens",
    "cancelled": "stopped",
    "stop_string": "stop string",
    "context_full": "context full",
}

USER_BUBBLE_BORDER = QColor("#d2e3fc")
LABEL_TEXT = QColor("#374151")

DOCUMENT_MARGIN = 18
MAX_COLUMN_WIDTH = 880  # wider lines are hard to read
MESSAGE_TOP_MARGIN = 18  # space between one message and the next
LABEL_BOTTOM_MARGIN = 4
BUBBLE_PADDING = 10
BUBBLE_BORDER_WIDTH = 1
BUBBLE_BOTTOM_MARGIN = 14
FOOTER_TOP_MARGIN = 8
NOTICE_TOP_MARGIN = 14
CODE_PADDING = 12
CODE_BOX_RADIUS = 6.0
LINE_HEIGHT_PERCENT = 125
CODE_LINE_HEIGHT_PERCENT = 115
SMALL_POINT_SCALE = 0.88
CODE_POINT_SCALE = 0.95
AUTO_SCROLL_SLACK_PX = 24  # this close to the bottom still counts as "at the bottom"

MAX_FENCE_INDENT = 3  # CommonMark: four spaces make an indented block, not a fence
MIN_FENCE_RUN = 3
FENCE_CHARACTERS = "`~"
INLINE_CODE_SPLIT = re.compile("(`)")


class _Kind(Enum):
    """What a run of answer text is, for its look."""

    PROSE = auto()
    INLINE_CODE = auto()
    CODE = auto()
    FENCE = auto()


class _FenceState(Enum):
    """Whether the line being written is a code fence, as far as its text so far tells."""

    UNDECIDED = auto()
    FENCE = auto()
    NOT_FENCE = auto()


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


def _fence_state(line: str, open_fence: str) -> _FenceState:
    """Is ``line`` (a line's text so far) a fence? Decided by its prefix, so never revised."""
    stripped = line.lstrip(" ")
    if len(line) - len(stripped) > MAX_FENCE_INDENT:
        return _FenceState.NOT_FENCE
    if not stripped:
        return _FenceState.UNDECIDED
    if open_fence:
        allowed, needed = open_fence[0], len(open_fence)
    else:
        allowed, needed = FENCE_CHARACTERS, MIN_FENCE_RUN
    first = stripped[0]
    if first not in allowed:
        return _FenceState.NOT_FENCE
    run = len(stripped) - len(stripped.lstrip(first))
    if run >= needed:
        return _FenceState.FENCE
    if run == len(stripped):
        return _FenceState.UNDECIDED
    return _FenceState.NOT_FENCE


def _fence_run(line: str) -> str:
    """The fence characters that open a code block (``"```"`` of ``"```python"``)."""
    stripped = line.lstrip(" ")
    first = stripped[0]
    return first * (len(stripped) - len(stripped.lstrip(first)))


def _origin_of(char_format: QTextCharFormat) -> TokenOrigin | None:
    value = char_format.property(ORIGIN_PROPERTY)
    return TokenOrigin(value) if isinstance(value, str) and value else None


@dataclass(frozen=True)
class _Fragment:
    """A run of one format in a block; position and length count UTF-16 units, as Qt does."""

    position: int
    length: int
    text: str
    char_format: QTextCharFormat


def _fragments(block: QTextBlock) -> Iterator[_Fragment]:
    """The fragments of ``block``, in order."""
    iterator = block.begin()
    while not iterator.atEnd():
        fragment = iterator.fragment()
        if fragment.isValid():
            yield _Fragment(
                fragment.position(), fragment.length(), fragment.text(), fragment.charFormat()
            )
        iterator += 1


def _scaled_point_size(base: QFont, scale: float) -> float:
    return max(1.0, base.pointSizeF() * scale)


def stats_summary(stats: SpeculationStats) -> str:
    """One line of figures: speed, first token, tokens, drafts, acceptance, why it stopped."""
    parts = [f"{stats.tokens_per_second:.1f} tok/s"]
    if stats.time_to_first_token_sec is not None:
        parts.append(f"{stats.time_to_first_token_sec:.2f} s to first token")
    parts.append(f"{stats.generated_tokens} tokens")
    rate = stats.acceptance_rate
    if rate is None:
        parts.append(NO_DRAFTS_TEXT)
    else:
        parts.append(
            f"drafted {stats.total_draft_tokens_count} / "
            f"accepted {stats.accepted_draft_tokens_count} / "
            f"rejected {stats.rejected_draft_tokens_count}"
        )
        parts.append(f"{rate * 100:.0f}% accepted")
    if stats.stop_reason is not None:
        parts.append(STOP_REASON_WORDS.get(stats.stop_reason, stats.stop_reason))
    return FOOTER_SEPARATOR.join(parts)


def footer_parts(
    stats: SpeculationStats | None, state: MessageState, error: str | None
) -> tuple[str, str]:
    """(error text, muted text) of an answer's footer; either may be empty."""
    error_text = ""
    if state == "error":
        error_text = f"{ERROR_PREFIX}{error}" if error else ERROR_TITLE
    muted: list[str] = []
    if state == "cancelled":
        muted.append(CANCELLED_TEXT)
    elif state == "interrupted":
        muted.append(INTERRUPTED_TEXT)
    if stats is not None:
        summary = stats_summary(stats)
        if state == "cancelled" and stats.stop_reason == "cancelled":
            summary = summary.removesuffix(FOOTER_SEPARATOR + STOP_REASON_WORDS["cancelled"])
        muted.append(summary)
    return error_text, FOOTER_SEPARATOR.join(muted)


class _Styles:
    """The character and block formats of the chat, built once per visualization setting."""

    def __init__(self, base_font: QFont, visualize_drafts: bool) -> None:
        self.visualize_drafts = visualize_drafts
        self._base_font = base_font
        self._char_formats: dict[tuple[_Kind, TokenOrigin | None], QTextCharFormat] = {}
        mono = monospace_font()
        self._mono_family = mono.family()

        self.prose_block = QTextBlockFormat()
        self.prose_block.setLineHeight(
            LINE_HEIGHT_PERCENT, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value
        )
        self.code_block = QTextBlockFormat()
        self.code_block.setProperty(CODE_LINE_PROPERTY, True)
        self.code_block.setLeftMargin(CODE_PADDING)
        self.code_block.setRightMargin(CODE_PADDING)
        self.code_block.setLineHeight(
            CODE_LINE_HEIGHT_PERCENT, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value
        )

        self.label_block = QTextBlockFormat()
        self.label_block.setTopMargin(MESSAGE_TOP_MARGIN)
        self.label_block.setBottomMargin(LABEL_BOTTOM_MARGIN)
        self.bubble_label_block = QTextBlockFormat()
        self.bubble_label_block.setBottomMargin(LABEL_BOTTOM_MARGIN)
        self.footer_block = QTextBlockFormat()
        self.footer_block.setTopMargin(FOOTER_TOP_MARGIN)
        self.collapsed_block = QTextBlockFormat()
        self.collapsed_block.setLineHeight(0, QTextBlockFormat.LineHeightTypes.FixedHeight.value)
        self.notice_block = QTextBlockFormat()
        self.notice_block.setTopMargin(NOTICE_TOP_MARGIN)
        self.notice_block.setAlignment(Qt.AlignmentFlag.AlignHCenter)

        self.label = QTextCharFormat()
        self.label.setFontWeight(QFont.Weight.DemiBold)
        self.label.setForeground(LABEL_TEXT)
        self.label_method = QTextCharFormat()
        self.label_method.setForeground(MUTED_TEXT)
        self.body = QTextCharFormat()
        self.footer = QTextCharFormat()
        self.footer.setForeground(MUTED_TEXT)
        self.footer.setFontPointSize(_scaled_point_size(base_font, SMALL_POINT_SCALE))
        self.footer_error = QTextCharFormat(self.footer)
        self.footer_error.setForeground(ERROR_TEXT)
        self.notice = QTextCharFormat(self.footer)
        self.notice.setFontItalic(True)

        self.bubble = QTextFrameFormat()
        self.bubble.setBackground(USER_BUBBLE_BACKGROUND)
        self.bubble.setPadding(BUBBLE_PADDING)
        self.bubble.setTopMargin(MESSAGE_TOP_MARGIN)
        # A block's top margin is not kept after a frame, so the bubble keeps the distance.
        self.bubble.setBottomMargin(BUBBLE_BOTTOM_MARGIN)
        self.bubble.setBorder(BUBBLE_BORDER_WIDTH)
        self.bubble.setBorderBrush(USER_BUBBLE_BORDER)
        self.bubble.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)

    def char_format(self, kind: _Kind, origin: TokenOrigin | None) -> QTextCharFormat:
        """The format of answer text of ``kind`` produced by ``origin``."""
        key = (kind, origin)
        cached = self._char_formats.get(key)
        if cached is not None:
            return cached
        char_format = QTextCharFormat()
        if kind is not _Kind.PROSE:
            char_format.setFontFamilies([self._mono_family])
            char_format.setFontFixedPitch(True)
            char_format.setFontStyleHint(QFont.StyleHint.Monospace)
            char_format.setFontPointSize(_scaled_point_size(self._base_font, CODE_POINT_SCALE))
        if kind is _Kind.FENCE:
            char_format.setForeground(MUTED_TEXT)
        if kind is _Kind.INLINE_CODE:
            char_format.setBackground(CODE_BACKGROUND)
        if origin is not None:
            char_format.setProperty(ORIGIN_PROPERTY, origin.value)
            if self.visualize_drafts and origin is TokenOrigin.DRAFT:
                in_code = kind is not _Kind.PROSE
                char_format.setBackground(DRAFT_BACKGROUND_IN_CODE if in_code else DRAFT_BACKGROUND)
        self._char_formats[key] = char_format
        return char_format

    @staticmethod
    def is_draft_background(char_format: QTextCharFormat) -> bool:
        """Is this text shown on the accepted-draft green?"""
        if char_format.background().style() == Qt.BrushStyle.NoBrush:
            return False
        colour = char_format.background().color()
        return colour in (DRAFT_BACKGROUND, DRAFT_BACKGROUND_IN_CODE)


class _AnswerWriter:
    """Appends one answer's text at a cursor, following fenced code blocks as the text grows.

    Whether a character is in a code block is a function of the answer text before it; a
    token may hold part of a fence, so a line is restyled once its prefix shows it is one.
    """

    def __init__(self, cursor: QTextCursor, styles: _Styles) -> None:
        self._cursor = cursor
        self._styles = styles
        self._open_fence = ""  # the fence of the code block we are in, "" outside code
        self._line_head = ""  # the current line's text while it may still be a fence
        self._line_state = _FenceState.UNDECIDED
        self._inline_code = False

    def write(self, text: str, origin: TokenOrigin) -> None:
        """Append ``text`` produced by ``origin``."""
        for index, piece in enumerate(text.split("\n")):
            if index > 0:
                self._end_line(origin)
            if piece:
                self._write_on_line(piece, origin)

    def _end_line(self, origin: TokenOrigin) -> None:
        if self._line_state is _FenceState.FENCE:
            self._open_fence = "" if self._open_fence else _fence_run(self._line_head)
        self._line_head = ""
        self._line_state = _FenceState.UNDECIDED
        self._inline_code = False
        if self._open_fence:
            block_format, kind = self._styles.code_block, _Kind.CODE
        else:
            block_format, kind = self._styles.prose_block, _Kind.PROSE
        # The separator carries the newline's origin, so it can be read back.
        self._cursor.insertBlock(block_format, self._styles.char_format(kind, origin))

    def _write_on_line(self, piece: str, origin: TokenOrigin) -> None:
        if self._line_state is _FenceState.UNDECIDED:
            self._line_head += piece
            self._line_state = _fence_state(self._line_head, self._open_fence)
            if self._line_state is _FenceState.FENCE:
                self._restyle_line_as_fence()
                if not self._open_fence:
                    self._cursor.setBlockFormat(self._styles.code_block)
            elif self._line_state is _FenceState.NOT_FENCE:
                self._line_head = ""
        elif self._line_state is _FenceState.FENCE:
            self._line_head += piece
        if self._line_state is _FenceState.FENCE:
            self._insert(piece, _Kind.FENCE, origin)
        elif self._open_fence:
            self._insert(piece, _Kind.CODE, origin)
        else:
            self._write_prose(piece, origin)

    def _write_prose(self, piece: str, origin: TokenOrigin) -> None:
        for part in INLINE_CODE_SPLIT.split(piece):
            if part == "`":
                self._insert(part, _Kind.INLINE_CODE, origin)
                self._inline_code = not self._inline_code
            elif part:
                kind = _Kind.INLINE_CODE if self._inline_code else _Kind.PROSE
                self._insert(part, kind, origin)

    def _insert(self, text: str, kind: _Kind, origin: TokenOrigin) -> None:
        self._cursor.insertText(text, self._styles.char_format(kind, origin))

    def _restyle_line_as_fence(self) -> None:
        block = self._cursor.block()
        runs = [
            (fragment.position, fragment.length, _origin_of(fragment.char_format))
            for fragment in _fragments(block)
        ]
        editor = QTextCursor(self._cursor.document())
        for position, length, origin in runs:
            editor.setPosition(position)
            editor.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
            editor.setCharFormat(self._styles.char_format(_Kind.FENCE, origin))


@dataclass
class _LiveAnswer:
    """The answer being streamed: its record, the text so far and where it is written."""

    record: MessageRecord
    writer: _AnswerWriter
    placement: _AnswerPlacement
    parts: list[str] = field(default_factory=list)
    spans: list[TokenSpan] = field(default_factory=list)

    def sync_record(self) -> None:
        self.record.content = "".join(self.parts)
        self.record.spans = tuple(self.spans)


class _ChatBrowser(QTextBrowser):
    """A read-only text browser that paints a rounded box behind each fenced code block.

    On wide windows the text stays a readable column in the middle.
    """

    def resizeEvent(self, event: QResizeEvent) -> None:
        """Keep the text column centred and at most ``MAX_COLUMN_WIDTH`` wide."""
        self.update_column_margins()
        super().resizeEvent(event)

    def update_column_margins(self) -> None:
        """Centre the text column of the current width."""
        width = self.viewport().width()
        side = max(DOCUMENT_MARGIN, (width - MAX_COLUMN_WIDTH) // 2)
        root = self.document().rootFrame()
        frame_format = root.frameFormat()
        if frame_format.leftMargin() == side and frame_format.rightMargin() == side:
            return
        frame_format.setLeftMargin(side)
        frame_format.setRightMargin(side)
        root.setFrameFormat(frame_format)

    def paintEvent(self, event: QPaintEvent) -> None:
        """Paint the code boxes, then the text over them."""
        offset = QPointF(self.horizontalScrollBar().value(), self.verticalScrollBar().value())
        boxes = self._code_boxes(QRectF(event.rect()).translated(offset))
        if boxes:
            painter = QPainter(self.viewport())
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(CODE_BACKGROUND)
            for box in boxes:
                painter.drawRoundedRect(box.translated(-offset), CODE_BOX_RADIUS, CODE_BOX_RADIUS)
            painter.end()
        super().paintEvent(event)

    def _code_boxes(self, visible: QRectF) -> list[QRectF]:
        """The boxes (document coordinates) of the code blocks that reach into ``visible``."""
        document = self.document()
        layout = document.documentLayout()
        right = document.size().width() - document.rootFrame().frameFormat().rightMargin()
        position = layout.hitTest(visible.topLeft(), Qt.HitTestAccuracy.FuzzyHit)
        block = document.findBlock(max(0, position))
        while block.previous().isValid() and _is_code_line(block.previous()):
            block = block.previous()
        boxes: list[QRectF] = []
        box: QRectF | None = None
        while block.isValid():
            rect = layout.blockBoundingRect(block)
            rect.setRight(right)  # the block's rectangle stops short of its right margin
            if _is_code_line(block):
                box = rect if box is None else box.united(rect)
            elif box is not None:
                boxes.append(box)
                box = None
            if rect.top() > visible.bottom():
                break
            block = block.next()
        if box is not None:
            boxes.append(box)
        return boxes


def _is_code_line(block: QTextBlock) -> bool:
    return bool(block.blockFormat().property(CODE_LINE_PROPERTY))


class ChatPane(QWidget):
    """The conversation of the main window, in a read-only QTextBrowser.

    Tokens are buffered by :meth:`append_tokens` and written every ``TOKEN_FLUSH_MS`` in one
    document edit. The readback methods (:meth:`answer_text`, :meth:`answer_origins`,
    :meth:`highlighted_text`, :meth:`footer_text`) read the rendered document.

    Signals: none.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._browser = _ChatBrowser(self)
        self._browser.setReadOnly(True)
        self._browser.setOpenLinks(False)
        self._browser.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self._browser.customContextMenuRequested.connect(self._show_context_menu)
        self._browser.viewport().installEventFilter(self)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._browser)

        self._document = self._browser.document()
        self._document.setUndoRedoEnabled(False)
        self._document.setDocumentMargin(DOCUMENT_MARGIN)
        self._cursor = QTextCursor(self._document)  # always at the end: the chat only grows
        self._fresh_block = True  # the block at the end is empty and not yet part of anything

        self._visualize_drafts = True
        self._styles = _Styles(self._document.defaultFont(), self._visualize_drafts)
        self._items: list[MessageRecord | _Notice] = []
        self._answers: list[_AnswerPlacement] = []
        self._live: _LiveAnswer | None = None
        self._pending: list[EmittedToken] = []
        self._deferred_notices: list[str] = []

        self._flush_timer = QTimer(self)
        self._flush_timer.setSingleShot(True)
        self._flush_timer.setInterval(TOKEN_FLUSH_MS)
        self._flush_timer.timeout.connect(self._flush_pending_tokens)

    @property
    def browser(self) -> QTextBrowser:
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

    def append_user_message(self, text: str) -> None:
        """Add the user's message at the end."""
        self._close_live_answer_early()
        record = MessageRecord(role="user", content=text)
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
    ) -> None:
        """Write what is buffered and close the open answer with its footer."""
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
        self._live = None
        self._cursor.beginEditBlock()
        self._close_answer(live.record, live.placement)
        self._cursor.endEditBlock()
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
        """The generated text of an answer as rendered, without its label and footer."""
        return "".join(text for text, _origin, _format in self._answer_runs(index))

    def answer_origins(self, index: int = -1) -> list[tuple[str, TokenOrigin]]:
        """The rendered answer as runs of text with one origin (adjacent runs merged)."""
        merged: list[tuple[str, TokenOrigin]] = []
        for text, origin, _format in self._answer_runs(index):
            who = origin if origin is not None else TokenOrigin.TARGET
            if merged and merged[-1][1] is who:
                merged[-1] = (merged[-1][0] + text, who)
            else:
                merged.append((text, who))
        return merged

    def highlighted_text(self, index: int = -1) -> str:
        """The text of an answer shown on a draft-green background (line breaks aside)."""
        return "".join(
            text
            for text, _origin, char_format in self._answer_runs(index)
            if text != "\n" and _Styles.is_draft_background(char_format)
        )

    def footer_text(self, index: int = -1) -> str:
        """The footer line under an answer ("" while it streams or when it has none)."""
        placement = self._answers[index]
        if placement.footer_start is None:
            return ""
        return self._document.findBlock(placement.footer_start).text()

    def origin_at(self, point: QPoint) -> TokenOrigin | None:
        """Who produced the answer character under ``point`` (viewport coordinates)."""
        cursor = self._browser.cursorForPosition(point)
        position = cursor.position()
        if point.x() < self._browser.cursorRect(cursor).x():
            position -= 1
        if position < 0:
            return None
        block = self._document.findBlock(position)
        if not block.isValid() or position >= block.position() + block.length() - 1:
            return None
        for fragment in _fragments(block):
            if fragment.position <= position < fragment.position + fragment.length:
                if not self._character_rect(position, fragment.char_format).contains(point):
                    return None
                return _origin_of(fragment.char_format)
        return None

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
        """Put an answer's text on the clipboard (nothing happens when there is no such answer)."""
        if not -len(self._answers) <= index < len(self._answers):
            return
        QGuiApplication.clipboard().setText(self.answer_text(index))

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
        return menu

    # --- Qt -----------------------------------------------------------------------------

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Show the origin of the token under the mouse as its tooltip."""
        if watched is self._browser.viewport() and event.type() == QEvent.Type.ToolTip:
            help_event = cast("QHelpEvent", event)
            self._update_tooltip(help_event.pos(), help_event.globalPos())
            return True
        return super().eventFilter(watched, event)

    def _update_tooltip(self, point: QPoint, global_point: QPoint) -> None:
        origin = self.origin_at(point) if self._visualize_drafts else None
        if origin is None:
            QToolTip.hideText()
            return
        text = DRAFT_TOOLTIP if origin is TokenOrigin.DRAFT else TARGET_TOOLTIP
        QToolTip.showText(global_point, text, self._browser.viewport())

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
        self._styles = _Styles(self._document.defaultFont(), self._visualize_drafts)
        self._cursor.beginEditBlock()
        for item in self._items:
            if isinstance(item, _Notice):
                self._render_notice(item)
            elif item.role == "user":
                self._render_user(item)
            else:
                opened = self._render_answer(item, live=item is live_record)
                if opened is not None:
                    self._live = opened
        self._cursor.endEditBlock()

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
        self._cursor.insertFrame(self._styles.bubble)
        self._cursor.setBlockFormat(self._styles.bubble_label_block)
        self._cursor.insertText(USER_LABEL, self._styles.label)
        self._cursor.insertBlock(self._styles.prose_block, self._styles.body)
        self._cursor.insertText(record.content, self._styles.body)
        self._cursor.movePosition(QTextCursor.MoveOperation.End)
        self._fresh_block = True

    def _render_notice(self, notice: _Notice) -> None:
        self._open_block(self._styles.notice_block, self._styles.notice)
        self._cursor.insertText(notice.text, self._styles.notice)

    def _render_answer(self, record: MessageRecord, *, live: bool) -> _LiveAnswer | None:
        self._open_block(self._styles.label_block, self._styles.label)
        region_start = self._cursor.block().position()
        self._cursor.insertText(ASSISTANT_LABEL, self._styles.label)
        if record.method:
            self._cursor.insertText(LABEL_SEPARATOR + record.method, self._styles.label_method)
        self._open_block(self._styles.prose_block, self._styles.body)
        placement = _AnswerPlacement(region_start, self._cursor.position())
        self._answers.append(placement)
        writer = _AnswerWriter(self._cursor, self._styles)
        written = 0
        for span in record.spans:
            text = record.content[written : written + span.length]
            writer.write(text, span.origin)
            written += len(text)
        if written < len(record.content):
            writer.write(record.content[written:], TokenOrigin.TARGET)
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

    def _answer_runs(self, index: int) -> list[tuple[str, TokenOrigin | None, QTextCharFormat]]:
        placement = self._answers[index]
        start = placement.content_start
        end = (
            placement.content_end if placement.content_end is not None else self._cursor.position()
        )
        runs: list[tuple[str, TokenOrigin | None, QTextCharFormat]] = []
        block = self._document.findBlock(start)
        while block.isValid() and block.position() <= end:
            if block.position() > start:
                separator = block.charFormat()
                runs.append(("\n", _origin_of(separator), separator))
            # Content blocks hold nothing but the answer, so whole fragments are taken.
            for fragment in _fragments(block):
                if start <= fragment.position < end:
                    runs.append(
                        (fragment.text, _origin_of(fragment.char_format), fragment.char_format)
                    )
            block = block.next()
        return runs

    def _character_rect(self, position: int, char_format: QTextCharFormat) -> QRect:
        """The box of the character at ``position``, in viewport coordinates."""
        cursor = QTextCursor(self._document)
        cursor.setPosition(position)
        left = self._browser.cursorRect(cursor)
        cursor.setPosition(position + 1)
        right = self._browser.cursorRect(cursor)
        if right.top() == left.top() and right.x() > left.x():
            width = right.x() - left.x()
        else:
            character = self._document.characterAt(position)
            width = QFontMetrics(char_format.font()).horizontalAdvance(character)
        return QRect(left.x(), left.y(), max(1, width), left.height())
