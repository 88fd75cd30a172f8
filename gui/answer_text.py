"""Streamed answer text in a QTextDocument: accepted drafts on green, fenced code in boxes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum, auto
from typing import TYPE_CHECKING, cast

from PySide6.QtCore import QEvent, QPoint, QPointF, QRect, QRectF, Qt
from PySide6.QtGui import (
    QFont,
    QFontMetrics,
    QPainter,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextFormat,
)
from PySide6.QtWidgets import QTextBrowser, QToolTip

from backends.speculation.types import TokenOrigin
from gui.style import (
    CODE_BACKGROUND,
    DRAFT_BACKGROUND,
    DRAFT_BACKGROUND_IN_CODE,
    DRAFT_TOOLTIP,
    GRAMMAR_BACKGROUND,
    GRAMMAR_BACKGROUND_IN_CODE,
    GRAMMAR_TOOLTIP,
    MUTED_TEXT,
    TARGET_TOOLTIP,
    monospace_font,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from PySide6.QtGui import QHelpEvent, QPaintEvent, QTextBlock, QTextDocument
    from PySide6.QtWidgets import QWidget

# Who produced a character is kept in its format, so what is read back is what is rendered.
ORIGIN_PROPERTY = QTextFormat.Property.UserProperty.value + 1
# The background each origin is shown on (in prose, in code); the main model's own: none.
ORIGIN_BACKGROUNDS = {
    TokenOrigin.DRAFT: (DRAFT_BACKGROUND, DRAFT_BACKGROUND_IN_CODE),
    TokenOrigin.GRAMMAR: (GRAMMAR_BACKGROUND, GRAMMAR_BACKGROUND_IN_CODE),
}
ORIGIN_TOOLTIPS = {
    TokenOrigin.DRAFT: DRAFT_TOOLTIP,
    TokenOrigin.TARGET: TARGET_TOOLTIP,
    TokenOrigin.GRAMMAR: GRAMMAR_TOOLTIP,
}
# Lines of a fenced code block (fences included) are marked, for the box painted behind them.
CODE_LINE_PROPERTY = QTextFormat.Property.UserProperty.value + 2

CODE_PADDING = 12
CODE_BOX_RADIUS = 6.0
LINE_HEIGHT_PERCENT = 125
CODE_LINE_HEIGHT_PERCENT = 115
CODE_POINT_SCALE = 0.95

MAX_FENCE_INDENT = 3  # CommonMark: four spaces make an indented block, not a fence
MIN_FENCE_RUN = 3
FENCE_CHARACTERS = "`~"
INLINE_CODE_SPLIT = re.compile("(`)")


class TextKind(Enum):
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


def scaled_point_size(base: QFont, scale: float) -> float:
    """``base``'s point size times ``scale``, never below one point."""
    return max(1.0, base.pointSizeF() * scale)


# --- readback ---------------------------------------------------------------------------


def origin_of(char_format: QTextCharFormat) -> TokenOrigin | None:
    """Who produced text of this format (None: not answer text)."""
    value = char_format.property(ORIGIN_PROPERTY)
    return TokenOrigin(value) if isinstance(value, str) and value else None


def is_code_line(block: QTextBlock) -> bool:
    """Is ``block`` a line of a fenced code block (its fences included)?"""
    return bool(block.blockFormat().property(CODE_LINE_PROPERTY))


@dataclass(frozen=True)
class Fragment:
    """A run of one format in a block; position and length count UTF-16 units, as Qt does."""

    position: int
    length: int
    text: str
    char_format: QTextCharFormat


def fragments(block: QTextBlock) -> Iterator[Fragment]:
    """The fragments of ``block``, in order."""
    iterator = block.begin()
    while not iterator.atEnd():
        fragment = iterator.fragment()
        if fragment.isValid():
            yield Fragment(
                fragment.position(), fragment.length(), fragment.text(), fragment.charFormat()
            )
        iterator += 1


@dataclass(frozen=True)
class TextRun:
    """Rendered answer text of one format; a line break is a run of one newline character."""

    text: str
    origin: TokenOrigin | None
    char_format: QTextCharFormat


def text_runs(document: QTextDocument, start: int, end: int) -> list[TextRun]:
    """The runs of the blocks from ``start`` to ``end``, which hold nothing but answer text."""
    runs: list[TextRun] = []
    block = document.findBlock(start)
    while block.isValid() and block.position() <= end:
        if block.position() > start:
            separator = block.charFormat()
            runs.append(TextRun("\n", origin_of(separator), separator))
        for fragment in fragments(block):
            if start <= fragment.position < end:
                runs.append(
                    TextRun(fragment.text, origin_of(fragment.char_format), fragment.char_format)
                )
        block = block.next()
    return runs


def highlighted_text(runs: Iterable[TextRun], origin: TokenOrigin = TokenOrigin.DRAFT) -> str:
    """The text of ``runs`` shown on ``origin``'s background (line breaks aside).

    The accepted draft's green by default.
    """
    return "".join(
        run.text
        for run in runs
        if run.text != "\n" and AnswerStyles.shows_origin(run.char_format, origin)
    )


# --- writing ----------------------------------------------------------------------------


class AnswerStyles:
    """The formats of answer text (prose, inline code, code lines), per visualization setting."""

    def __init__(self, base_font: QFont, visualize_drafts: bool) -> None:
        self.visualize_drafts = visualize_drafts
        self._base_font = base_font
        self._char_formats: dict[tuple[TextKind, TokenOrigin | None], QTextCharFormat] = {}
        self._mono_family = monospace_font().family()

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

    def char_format(self, kind: TextKind, origin: TokenOrigin | None) -> QTextCharFormat:
        """The format of answer text of ``kind`` produced by ``origin``."""
        key = (kind, origin)
        cached = self._char_formats.get(key)
        if cached is not None:
            return cached
        char_format = QTextCharFormat()
        if kind is not TextKind.PROSE:
            char_format.setFontFamilies([self._mono_family])
            char_format.setFontFixedPitch(True)
            char_format.setFontStyleHint(QFont.StyleHint.Monospace)
            char_format.setFontPointSize(scaled_point_size(self._base_font, CODE_POINT_SCALE))
        if kind is TextKind.FENCE:
            char_format.setForeground(MUTED_TEXT)
        if kind is TextKind.INLINE_CODE:
            char_format.setBackground(CODE_BACKGROUND)
        if origin is not None:
            char_format.setProperty(ORIGIN_PROPERTY, origin.value)
            backgrounds = ORIGIN_BACKGROUNDS.get(origin)
            if self.visualize_drafts and backgrounds is not None:
                char_format.setBackground(backgrounds[kind is not TextKind.PROSE])
        self._char_formats[key] = char_format
        return char_format

    @staticmethod
    def shows_origin(char_format: QTextCharFormat, origin: TokenOrigin) -> bool:
        """Is this text shown on ``origin``'s background (the draft's green, the grammar's blue)?"""
        if char_format.background().style() == Qt.BrushStyle.NoBrush:
            return False
        return char_format.background().color() in ORIGIN_BACKGROUNDS.get(origin, ())


class AnswerWriter:
    """Appends one answer's text at a cursor, following fenced code blocks as the text grows.

    Whether a character is in a code block is a function of the answer text before it; a
    token may hold part of a fence, so a line is restyled once its prefix shows it is one.
    The block the cursor is in when writing starts should have ``styles.prose_block``.
    """

    def __init__(self, cursor: QTextCursor, styles: AnswerStyles) -> None:
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
            block_format, kind = self._styles.code_block, TextKind.CODE
        else:
            block_format, kind = self._styles.prose_block, TextKind.PROSE
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
            self._insert(piece, TextKind.FENCE, origin)
        elif self._open_fence:
            self._insert(piece, TextKind.CODE, origin)
        else:
            self._write_prose(piece, origin)

    def _write_prose(self, piece: str, origin: TokenOrigin) -> None:
        for part in INLINE_CODE_SPLIT.split(piece):
            if part == "`":
                self._insert(part, TextKind.INLINE_CODE, origin)
                self._inline_code = not self._inline_code
            elif part:
                kind = TextKind.INLINE_CODE if self._inline_code else TextKind.PROSE
                self._insert(part, kind, origin)

    def _insert(self, text: str, kind: TextKind, origin: TokenOrigin) -> None:
        self._cursor.insertText(text, self._styles.char_format(kind, origin))

    def _restyle_line_as_fence(self) -> None:
        block = self._cursor.block()
        runs = [
            (fragment.position, fragment.length, origin_of(fragment.char_format))
            for fragment in fragments(block)
        ]
        editor = QTextCursor(self._cursor.document())
        for position, length, origin in runs:
            editor.setPosition(position)
            editor.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
            editor.setCharFormat(self._styles.char_format(TextKind.FENCE, origin))


# --- showing ----------------------------------------------------------------------------


class AnswerBrowser(QTextBrowser):
    """A text browser that paints a rounded box behind code lines and tells token origins.

    The origin of the answer token under the mouse is its tooltip while origin tooltips are
    on (:meth:`set_origin_tooltips`).

    Signals: none of its own.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._origin_tooltips = True

    def set_origin_tooltips(self, on: bool) -> None:
        """Tell (or not) who produced the token under the mouse, as its tooltip."""
        self._origin_tooltips = on

    def origin_tooltips(self) -> bool:
        """Is the origin of the token under the mouse shown as its tooltip?"""
        return self._origin_tooltips

    def origin_at(self, point: QPoint) -> TokenOrigin | None:
        """Who produced the answer character under ``point`` (viewport coordinates)."""
        cursor = self.cursorForPosition(point)
        position = cursor.position()
        if point.x() < self.cursorRect(cursor).x():
            position -= 1
        if position < 0:
            return None
        block = self.document().findBlock(position)
        if not block.isValid() or position >= block.position() + block.length() - 1:
            return None
        for fragment in fragments(block):
            if fragment.position <= position < fragment.position + fragment.length:
                if not self._character_rect(position, fragment.char_format).contains(point):
                    return None
                return origin_of(fragment.char_format)
        return None

    def viewportEvent(self, event: QEvent) -> bool:
        """Show the origin of the token under the mouse as its tooltip."""
        if event.type() == QEvent.Type.ToolTip:
            help_event = cast("QHelpEvent", event)
            self._update_tooltip(help_event.pos(), help_event.globalPos())
            return True
        return super().viewportEvent(event)

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

    def _update_tooltip(self, point: QPoint, global_point: QPoint) -> None:
        origin = self.origin_at(point) if self._origin_tooltips else None
        if origin is None:
            QToolTip.hideText()
            return
        QToolTip.showText(global_point, ORIGIN_TOOLTIPS[origin], self.viewport())

    def _character_rect(self, position: int, char_format: QTextCharFormat) -> QRect:
        """The box of the character at ``position``, in viewport coordinates."""
        cursor = QTextCursor(self.document())
        cursor.setPosition(position)
        left = self.cursorRect(cursor)
        cursor.setPosition(position + 1)
        right = self.cursorRect(cursor)
        if right.top() == left.top() and right.x() > left.x():
            width = right.x() - left.x()
        else:
            character = self.document().characterAt(position)
            width = QFontMetrics(char_format.font()).horizontalAdvance(character)
        return QRect(left.x(), left.y(), max(1, width), left.height())

    def _code_boxes(self, visible: QRectF) -> list[QRectF]:
        """The boxes (document coordinates) of the code blocks that reach into ``visible``."""
        document = self.document()
        layout = document.documentLayout()
        right = document.size().width() - document.rootFrame().frameFormat().rightMargin()
        position = layout.hitTest(visible.topLeft(), Qt.HitTestAccuracy.FuzzyHit)
        block = document.findBlock(max(0, position))
        while block.previous().isValid() and is_code_line(block.previous()):
            block = block.previous()
        boxes: list[QRectF] = []
        box: QRectF | None = None
        while block.isValid():
            rect = layout.blockBoundingRect(block)
            rect.setRight(right)  # the block's rectangle stops short of its right margin
            if is_code_line(block):
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
