"""Streamed answer text in a QTextDocument: Markdown, accepted drafts on green, code in boxes."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from enum import Enum, auto
from functools import cache
from typing import TYPE_CHECKING, cast

from PySide6.QtCore import QEvent, QPoint, QPointF, QRect, QRectF, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFont,
    QFontMetrics,
    QGuiApplication,
    QPainter,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextFormat,
    QTextFrameFormat,
    QTextLength,
    QTextTableFormat,
)
from PySide6.QtWidgets import QTextBrowser, QToolTip

from backends.speculation.types import TokenOrigin
from gui.markdown_layout import (
    PLAIN,
    InlineStyle,
    Item,
    Line,
    LineKind,
    Table,
    layout,
    part_starts,
)
from gui.style import (
    DRAFT_TOOLTIP,
    GRAMMAR_TOOLTIP,
    TARGET_TOOLTIP,
    colours,
    monospace_font,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from pygments.token import _TokenType
    from PySide6.QtGui import QHelpEvent, QMouseEvent, QPaintEvent, QTextBlock, QTextDocument
    from PySide6.QtWidgets import QWidget

# Who produced a character is kept in its format, so what is read back is what is rendered.
ORIGIN_PROPERTY = QTextFormat.Property.UserProperty.value + 1
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

# The first line of a code block, and its language: its box gets a header (language, Copy).
CODE_FIRST_LINE_PROPERTY = QTextFormat.Property.UserProperty.value + 3
CODE_LANGUAGE_PROPERTY = QTextFormat.Property.UserProperty.value + 4
CODE_HEADER_HEIGHT = 24  # pixels above a code block's first line: its language and Copy
CODE_BOTTOM_PADDING = 6
TABLE_BOTTOM_MARGIN = 10
COPY_LABEL = "Copy"
COPIED_LABEL = "Copied"
LIST_INDENT = 22  # pixels per list level
LIST_MARKER_HANG = 18  # a list item's marker hangs left of its text by this much
QUOTE_INDENT = 16
HEADING_SCALES = {1: 1.45, 2: 1.3, 3: 1.15}  # h4 and below: the body's size, bold
HEADING_TOP_MARGIN = 6
MIN_GUESS_LINES = 3  # a fence that names no language: guessed once it has this many lines
GUESS_SAMPLE_LINES = 40  # from its first lines
# A code block being written is coloured from this many lines before its first new line
# (a string or comment opened further up is not seen; Pygments reads left to right).
LEX_CONTEXT_LINES = 40


class TextKind(Enum):
    """What a run of answer text is, for its look."""

    PROSE = auto()
    INLINE_CODE = auto()
    CODE = auto()


def scaled_point_size(base: QFont, scale: float) -> float:
    """``base``'s point size times ``scale``, never below one point."""
    return max(1.0, base.pointSizeF() * scale)


# --- readback ---------------------------------------------------------------------------


def origin_backgrounds(origin: TokenOrigin | None) -> tuple[QColor, QColor] | None:
    """The background ``origin`` is shown on, in prose and in code (None: the main model's)."""
    in_use = colours()
    if origin is TokenOrigin.DRAFT:
        return in_use.draft_background, in_use.draft_background_in_code
    if origin is TokenOrigin.GRAMMAR:
        return in_use.grammar_background, in_use.grammar_background_in_code
    return None


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
        self._char_formats: dict[tuple[object, ...], QTextCharFormat] = {}
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

    def piece_format(
        self,
        kind: TextKind,
        origin: TokenOrigin | None,
        style: InlineStyle = PLAIN,
        heading_level: int = 0,
        quote: bool = False,
        code_style: tuple[str, bool, bool] | None = None,
    ) -> QTextCharFormat:
        """The format of a piece of answer text: its kind, origin, emphasis and colours.

        ``code_style``: Pygments' colour, bold and italic for a piece of a code block.
        """
        key = (kind, origin, style, heading_level, quote, code_style)
        cached = self._char_formats.get(key)
        if cached is not None:
            return cached
        char_format = QTextCharFormat()
        if kind is not TextKind.PROSE:
            char_format.setFontFamilies([self._mono_family])
            char_format.setFontFixedPitch(True)
            char_format.setFontStyleHint(QFont.StyleHint.Monospace)
            char_format.setFontPointSize(scaled_point_size(self._base_font, CODE_POINT_SCALE))
        if kind is TextKind.INLINE_CODE:
            char_format.setBackground(colours().code_background)
        if heading_level:
            scale = HEADING_SCALES.get(heading_level, 1.0)
            char_format.setFontPointSize(scaled_point_size(self._base_font, scale))
        if style.bold or heading_level:
            char_format.setFontWeight(QFont.Weight.Bold)
        if style.italic:
            char_format.setFontItalic(True)
        if style.strike:
            char_format.setFontStrikeOut(True)
        if quote:
            char_format.setForeground(colours().muted_text)
        if style.href:
            char_format.setAnchor(True)
            char_format.setAnchorHref(style.href)
            char_format.setForeground(colours().link_text)
            char_format.setFontUnderline(True)
        if code_style is not None:
            colour, bold, italic = code_style
            if colour:
                char_format.setForeground(QColor(colour))
            if bold:
                char_format.setFontWeight(QFont.Weight.Bold)
            if italic:
                char_format.setFontItalic(True)
        if origin is not None:
            char_format.setProperty(ORIGIN_PROPERTY, origin.value)
            backgrounds = origin_backgrounds(origin)
            if self.visualize_drafts and backgrounds is not None:
                char_format.setBackground(backgrounds[kind is not TextKind.PROSE])
        self._char_formats[key] = char_format
        return char_format

    def line_block(self, line: Line) -> QTextBlockFormat:
        """The block format of a rendered line (prose, heading, list item, quote, code, rule)."""
        if line.kind is LineKind.CODE:
            block = QTextBlockFormat(self.code_block)
            if line.code_first:
                block.setProperty(CODE_FIRST_LINE_PROPERTY, True)
                block.setProperty(CODE_LANGUAGE_PROPERTY, line.code_language)
                block.setTopMargin(CODE_HEADER_HEIGHT)
        else:
            block = QTextBlockFormat(self.prose_block)
        indent = line.quote_depth * QUOTE_INDENT
        if line.list_depth:
            indent += line.list_depth * LIST_INDENT
            if line.list_marker:
                block.setTextIndent(-LIST_MARKER_HANG)
        if indent:
            block.setLeftMargin(block.leftMargin() + indent)
        if line.kind is LineKind.HEADING:
            block.setTopMargin(HEADING_TOP_MARGIN)
        if line.kind is LineKind.RULE:
            block.setProperty(
                QTextFormat.Property.BlockTrailingHorizontalRulerWidth,
                QTextLength(QTextLength.Type.PercentageLength, 100),
            )
        return block

    @staticmethod
    def shows_origin(char_format: QTextCharFormat, origin: TokenOrigin) -> bool:
        """Is this text shown on ``origin``'s background (the draft's green, the grammar's blue)?"""
        if char_format.background().style() == Qt.BrushStyle.NoBrush:
            return False
        return char_format.background().color() in (origin_backgrounds(origin) or ())


@dataclass(frozen=True)
class _Mark:
    """Where an item's rendering began: the document's end then, and that block's state."""

    position: int
    block_free: bool
    block_format: QTextBlockFormat
    block_char_format: QTextCharFormat


class AnswerWriter:
    """Writes one answer's Markdown at the end of a document as the answer grows.

    :meth:`write` takes text and who produced it; :meth:`render` shows what was written:
    the parts of the answer that closed since (:func:`part_starts`) are laid out once,
    and the open part is laid out again, its rendering replaced from its first line that
    changed (so a long code block being written costs its new lines, not all of them).
    Everything in the document after the writer's start is the answer's while it is
    written. The block the cursor is in when writing starts must be empty; it becomes the
    answer's first line.
    """

    def __init__(self, cursor: QTextCursor, styles: AnswerStyles) -> None:
        self._cursor = cursor
        self._styles = styles
        self._parts: list[str] = []
        self._origins: list[TokenOrigin] = []
        self._written = 0  # characters of source laid out at the last render
        self._open_start = 0  # where the open part begins in the source
        self._block_free = True  # the block at the cursor is empty and not yet a line
        # The open part's items as shown, and where each one's rendering began.
        self._open_items: list[Item] = []
        self._open_marks: list[_Mark] = []
        self._lexers: dict[int, str] = {}  # a code block's guessed language, by its start

    @property
    def source(self) -> str:
        """The answer's text as written (Markdown source)."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def write(self, text: str, origin: TokenOrigin) -> None:
        """Append ``text`` produced by ``origin`` (shown at the next :meth:`render`)."""
        self._parts.append(text)
        self._origins.extend([origin] * len(text))

    def render(self) -> None:
        """Show what was written: closed parts once, the open part from its first change."""
        source = self.source
        if len(source) == self._written:
            return
        self._written = len(source)
        closed = part_starts(source, self._open_start)
        for begins in closed:
            # A part that closed is shown once (the open one's rendering kept as far as it
            # holds). The newline before the next part is its separator, not a blank line.
            self._update_open(layout(source, self._origins, self._open_start, begins - 1))
            self._open_start = begins
            self._open_items, self._open_marks = [], []
        self._update_open(layout(source, self._origins, self._open_start))

    def _update_open(self, items: list[Item]) -> None:
        """Show ``items`` as the open part: its rendering replaced from its first change."""
        same = 0
        while (
            same < min(len(items), len(self._open_items)) and items[same] == self._open_items[same]
        ):
            same += 1
        if same == len(items) == len(self._open_items):
            return
        # Lines before the first change keep their rendering; in a code block, their
        # colours too (Pygments reads left to right: later text does not recolour them).
        self._erase_from(self._open_marks[same] if same < len(self._open_marks) else self._mark())
        del self._open_marks[same:]
        self._show(items, self._open_marks, first=same)
        self._open_items = items

    # -- laying out --------------------------------------------------------------------

    def _mark(self) -> _Mark:
        self._cursor.movePosition(QTextCursor.MoveOperation.End)
        return _Mark(
            self._cursor.position(),
            self._block_free,
            self._cursor.blockFormat(),
            self._cursor.blockCharFormat(),
        )

    def _erase_from(self, mark: _Mark) -> None:
        """Remove everything rendered after ``mark`` and restore the block it was in."""
        cursor = self._cursor
        cursor.setPosition(mark.position)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        # The block takes the format of the last one removed: it gets its own back.
        cursor.setBlockFormat(mark.block_format)
        cursor.setBlockCharFormat(mark.block_char_format)
        self._block_free = mark.block_free

    def _show(self, items: list[Item], marks: list[_Mark], first: int = 0) -> None:
        """Render ``items[first:]``, marking where each began in ``marks``."""
        colours: CodeColours | None = None
        code_offset = 0
        for index in range(first, len(items)):
            item = items[index]
            marks.append(self._mark())
            if isinstance(item, Table):
                self._table(item)
            elif item.kind is LineKind.CODE:
                if colours is None or item.code_first:
                    colours, code_offset = self._colours_of(items, index)
                self._code_line(item, colours, code_offset)
                code_offset += len(item.text) + 1
            else:
                colours = None
                self._line(item)

    def _colours_of(self, items: list[Item], index: int) -> tuple[CodeColours, int]:
        """Colours for the code block line ``index`` is in, from that line on.

        Returns them and where line ``index`` begins in the text they colour: the block's
        code from :data:`LEX_CONTEXT_LINES` lines before line ``index`` on (so that a long
        block being written is not read again whole at every flush).
        """
        begin = index
        while begin > 0 and _is_code_after_first(items[begin]):
            begin -= 1
        end = index + 1
        while end < len(items) and _is_code_after_first(items[end]):
            end += 1
        first = items[begin]
        assert isinstance(first, Line)
        language = first.code_language or self._guessed_language(items, begin, end)
        context = max(begin, index - LEX_CONTEXT_LINES)
        lines = [item.text for item in items[context:end] if isinstance(item, Line)]
        offset = sum(len(line) + 1 for line in lines[: index - context])
        return code_colours("\n".join(lines), language), offset

    def _begin_line(self, block_format: QTextBlockFormat, separator: TokenOrigin | None) -> None:
        """Start a block for a line; the separator carries the origin of its newline."""
        separator_format = self._styles.piece_format(TextKind.PROSE, separator)
        if self._block_free:
            self._cursor.setBlockFormat(block_format)
            self._cursor.setBlockCharFormat(separator_format)
            self._block_free = False
        else:
            self._cursor.insertBlock(block_format, separator_format)

    def _line(self, line: Line) -> None:
        self._begin_line(self._styles.line_block(line), line.break_origin)
        quote = line.quote_depth > 0
        for piece in line.pieces:
            kind = TextKind.INLINE_CODE if piece.style.code else TextKind.PROSE
            char_format = self._styles.piece_format(
                kind, piece.origin, piece.style, line.heading_level, quote
            )
            self._cursor.insertText(piece.text, char_format)

    def _code_line(self, line: Line, colours: CodeColours, offset: int) -> None:
        """One line of a code block, its text beginning at ``offset`` of the block's code."""
        self._begin_line(self._styles.line_block(line), line.break_origin)
        for piece in line.pieces:
            for begin, end, code_style in colours.between(offset, offset + len(piece.text)):
                char_format = self._styles.piece_format(
                    TextKind.CODE, piece.origin, code_style=code_style
                )
                self._cursor.insertText(piece.text[begin - offset : end - offset], char_format)
            offset += len(piece.text)

    def _guessed_language(self, items: list[Item], begin: int, end: int) -> str:
        """A fence that names no language: a guess from its code, made once it has lines."""
        first = items[begin]
        known = self._lexers.get(first.source_start)
        if known is not None:
            return known
        if end - begin < MIN_GUESS_LINES:
            return ""
        lines = items[begin : min(end, begin + GUESS_SAMPLE_LINES)]
        guess = guess_language("\n".join(line.text for line in lines if isinstance(line, Line)))
        self._lexers[first.source_start] = guess
        return guess

    def _table(self, table: Table) -> None:
        self._begin_line(QTextBlockFormat(self._styles.prose_block), table.break_origin)
        columns = max((len(row) for row in table.rows), default=1)
        table_format = QTextTableFormat()
        table_format.setCellPadding(4)
        table_format.setCellSpacing(0)
        table_format.setBorder(1)
        table_format.setBorderBrush(colours().subtle_line)
        table_format.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
        table_format.setBorderCollapse(True)
        # The line after a table lies under it (Qt's layout): the room is the table's own.
        table_format.setBottomMargin(TABLE_BOTTOM_MARGIN)
        text_table = self._cursor.insertTable(len(table.rows), max(1, columns), table_format)
        for row_index, row in enumerate(table.rows):
            style = InlineStyle(bold=True) if row_index < table.header_rows else PLAIN
            for column, cell in enumerate(row):
                cell_cursor = text_table.cellAt(row_index, column).firstCursorPosition()
                for piece in cell:
                    kind = TextKind.INLINE_CODE if piece.style.code else TextKind.PROSE
                    piece_style = InlineStyle(
                        bold=style.bold or piece.style.bold,
                        italic=piece.style.italic,
                        strike=piece.style.strike,
                        code=piece.style.code,
                        href=piece.style.href,
                    )
                    cell_cursor.insertText(
                        piece.text, self._styles.piece_format(kind, piece.origin, piece_style)
                    )
        self._cursor.movePosition(QTextCursor.MoveOperation.End)
        self._block_free = True  # Qt puts an empty block after a table


@dataclass(frozen=True)
class CodeColours:
    """Pygments' styles over a code block's text: runs of (begin, end, style), in order."""

    runs: list[tuple[int, int, tuple[str, bool, bool]]]

    def between(self, begin: int, end: int) -> Iterator[tuple[int, int, tuple[str, bool, bool]]]:
        """The runs cut to ``begin``..``end`` (every character of it covered)."""
        covered = begin
        index = max(0, bisect_right(self.runs, (begin, begin, ("", False, False))) - 1)
        for run_begin, run_end, style in self.runs[index:]:
            if run_begin >= end:
                break
            if run_end <= begin:
                continue
            lower, upper = max(begin, run_begin), min(end, run_end)
            if lower > covered:
                yield covered, lower, NO_CODE_STYLE
            yield lower, upper, style
            covered = upper
        if covered < end:
            yield covered, end, NO_CODE_STYLE


NO_CODE_STYLE = ("", False, False)


def _is_code_after_first(item: Item) -> bool:
    """Is ``item`` a line of a code block other than its first?"""
    return isinstance(item, Line) and item.kind is LineKind.CODE and not item.code_first


def code_colours(text: str, language: str) -> CodeColours:
    """Pygments' colours for ``text`` in ``language`` (none for an unknown language)."""
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    if not language:
        return CodeColours([])
    try:
        lexer = get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return CodeColours([])
    runs: list[tuple[int, int, tuple[str, bool, bool]]] = []
    position = 0
    for token_type, value in lexer.get_tokens(text):
        looks = _token_style(token_type, colours().code_style)
        if looks is not NO_CODE_STYLE:
            runs.append((position, position + len(value), looks))
        position += len(value)
    return CodeColours(runs)


@cache
def _token_style(token_type: _TokenType, style_name: str) -> tuple[str, bool, bool]:
    """Pygments' colour, bold and italic for a token type in the named style."""
    from pygments.styles import get_style_by_name

    looks = get_style_by_name(style_name).style_for_token(token_type)
    if not (looks["color"] or looks["bold"] or looks["italic"]):
        return NO_CODE_STYLE
    return (f"#{looks['color']}" if looks["color"] else "", looks["bold"], looks["italic"])


def guess_language(text: str) -> str:
    """Pygments' guess of the language of ``text`` ("" when it cannot tell)."""
    from pygments.lexers import guess_lexer
    from pygments.util import ClassNotFound

    try:
        lexer = guess_lexer(text)
    except ClassNotFound:
        return ""
    aliases = lexer.aliases
    return aliases[0] if aliases and aliases[0] != "text" else ""


# --- showing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeBox:
    """A code block's painted box (document coordinates), its first line and its language."""

    rect: QRectF
    first_block: int  # the block number of its first line
    language: str

    def copy_rect(self) -> QRectF:
        """Where its Copy button is: the header's right end."""
        width = COPY_BUTTON_WIDTH
        return QRectF(self.rect.right() - width - 4, self.rect.top() + 2, width, HEADER_ROW)


COPY_BUTTON_WIDTH = 56
HEADER_ROW = CODE_HEADER_HEIGHT - 4
COPIED_FOR_MS = 1500


class AnswerBrowser(QTextBrowser):
    """A text browser that paints boxes behind code blocks and tells token origins.

    Each code block's box has a header: its language and a Copy button that puts the
    block's code on the clipboard. The origin of the answer token under the mouse is its
    tooltip while origin tooltips are on (:meth:`set_origin_tooltips`). A link opens in
    the system's browser (http, https and mailto only).

    Signals: ``code_copied(str)``: a code block's code was put on the clipboard.
    """

    code_copied = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._origin_tooltips = True
        self._copied_block: int | None = None  # the box whose button says "Copied"
        self._copied_timer = QTimer(self)
        self._copied_timer.setSingleShot(True)
        self._copied_timer.setInterval(COPIED_FOR_MS)
        self._copied_timer.timeout.connect(self._forget_copied)
        self.setOpenLinks(False)
        self.anchorClicked.connect(open_link)
        self.viewport().setMouseTracking(True)

    def set_origin_tooltips(self, on: bool) -> None:
        """Tell (or not) who produced the token under the mouse, as its tooltip."""
        self._origin_tooltips = on

    def origin_tooltips(self) -> bool:
        """Is the origin of the token under the mouse shown as its tooltip?"""
        return self._origin_tooltips

    def code_boxes(self) -> list[CodeBox]:
        """Every code block's box, in viewport coordinates."""
        offset = self._scroll_offset()
        whole = QRectF(QPointF(0, 0), self.document().size())
        return [
            CodeBox(box.rect.translated(-offset), box.first_block, box.language)
            for box in self._code_boxes(whole)
        ]

    def copy_code(self, first_block: int) -> str:
        """Put the code of the block starting at block number ``first_block`` on the clipboard."""
        block = self.document().findBlockByNumber(first_block)
        lines: list[str] = []
        while block.isValid() and is_code_line(block):
            if lines and block.blockFormat().property(CODE_FIRST_LINE_PROPERTY):
                break
            lines.append(block.text())
            block = block.next()
        code = "\n".join(lines)
        QGuiApplication.clipboard().setText(code)
        self._copied_block = first_block
        self._copied_timer.start()
        self.viewport().update()
        self.code_copied.emit(code)
        return code

    def mousePressEvent(self, event: QMouseEvent) -> None:
        """A click on a code block's Copy button copies its code."""
        if event.button() == Qt.MouseButton.LeftButton:
            for box in self.code_boxes():
                if box.copy_rect().contains(event.position()):
                    self.copy_code(box.first_block)
                    event.accept()
                    return
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        """A pointing hand over a Copy button."""
        over = any(box.copy_rect().contains(event.position()) for box in self.code_boxes())
        if over:
            self.viewport().setCursor(Qt.CursorShape.PointingHandCursor)
        else:
            self.viewport().unsetCursor()
        super().mouseMoveEvent(event)

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
        """Paint the code boxes and their headers, then the text over them."""
        offset = self._scroll_offset()
        boxes = self._code_boxes(QRectF(event.rect()).translated(offset))
        if boxes:
            painter = QPainter(self.viewport())
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            small = QFont(self.font())
            small.setPointSizeF(scaled_point_size(self.font(), CODE_POINT_SCALE * 0.9))
            painter.setFont(small)
            for box in boxes:
                rect = box.rect.translated(-offset)
                painter.setPen(Qt.PenStyle.NoPen)
                painter.setBrush(colours().code_background)
                painter.drawRoundedRect(rect, CODE_BOX_RADIUS, CODE_BOX_RADIUS)
                header = QRectF(
                    rect.left() + CODE_PADDING, rect.top() + 2, rect.width(), HEADER_ROW
                )
                painter.setPen(colours().muted_text)
                painter.drawText(header, Qt.AlignmentFlag.AlignVCenter, box.language)
                button = CodeBox(rect, box.first_block, box.language).copy_rect()
                label = COPIED_LABEL if box.first_block == self._copied_block else COPY_LABEL
                painter.setPen(colours().subtle_line)
                painter.setBrush(Qt.BrushStyle.NoBrush)
                painter.drawRoundedRect(button.adjusted(0, 2, 0, -2), 4, 4)
                painter.setPen(colours().muted_text)
                painter.drawText(button, Qt.AlignmentFlag.AlignCenter, label)
            painter.end()
        super().paintEvent(event)

    def _scroll_offset(self) -> QPointF:
        return QPointF(self.horizontalScrollBar().value(), self.verticalScrollBar().value())

    def _forget_copied(self) -> None:
        self._copied_block = None
        self.viewport().update()

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

    def _code_boxes(self, visible: QRectF) -> list[CodeBox]:
        """The boxes (document coordinates) of the code blocks that reach into ``visible``."""
        document = self.document()
        layout = document.documentLayout()
        right = document.size().width() - document.rootFrame().frameFormat().rightMargin()
        position = layout.hitTest(visible.topLeft(), Qt.HitTestAccuracy.FuzzyHit)
        block = document.findBlock(max(0, position))
        while (
            is_code_line(block)
            and not block.blockFormat().property(CODE_FIRST_LINE_PROPERTY)
            and block.previous().isValid()
            and is_code_line(block.previous())
        ):
            block = block.previous()
        boxes: list[CodeBox] = []
        box: CodeBox | None = None
        while block.isValid():
            rect = layout.blockBoundingRect(block)
            rect.setRight(right)  # the block's rectangle stops short of its right margin
            code = is_code_line(block)
            first = code and bool(block.blockFormat().property(CODE_FIRST_LINE_PROPERTY))
            if box is not None and (not code or first):
                boxes.append(box)
                box = None
            if code:
                if box is None:
                    if first:  # the header above the first line: language and Copy
                        rect.setTop(rect.top() - CODE_HEADER_HEIGHT)
                    language = str(block.blockFormat().property(CODE_LANGUAGE_PROPERTY) or "")
                    box = CodeBox(rect, block.blockNumber(), language)
                else:
                    box = CodeBox(box.rect.united(rect), box.first_block, box.language)
            if rect.top() > visible.bottom():
                break
            block = block.next()
        if box is not None:
            boxes.append(box)
        # A little room under the last line (the block after a code block is a blank line
        # or the footer's margin, so nothing is covered).
        return [
            CodeBox(box.rect.adjusted(0, 0, 0, CODE_BOTTOM_PADDING), box.first_block, box.language)
            for box in boxes
        ]


def open_link(url: QUrl) -> None:
    """Open a link of an answer in the system's browser (web and mail links only)."""
    if url.scheme() in ("http", "https", "mailto"):
        QDesktopServices.openUrl(url)
