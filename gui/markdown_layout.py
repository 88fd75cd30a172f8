"""An answer's Markdown as rendered lines, each character still carrying who produced it.

The answer arrives as source text with an origin per character (draft, main model,
grammar). :func:`layout` parses a piece of it with markdown-it-py (CommonMark, tables,
strikethrough, a line break for every newline as chat apps do, raw HTML as text) and
returns what the window shows: :class:`Line` after :class:`Line` (a paragraph line, a
heading, a list item, a line of code, a rule) and :class:`Table`, each piece of text with
the origin of the source characters it came from. Markup (``**``, ``#``, fences,
backticks, a link's address) is not shown; a list's ``-`` is shown as a bullet with the
``-``'s origin.

markdown-it's inline tokens do not say where in the source they came from, so their text
is found in the source in order from the inline's first line (:class:`_SourceCursor`);
text that cannot be found (an entity, an escape) takes the origin at the cursor. A blank
source line between blocks is an empty :class:`Line`, so prose without markup is shown
character for character as it was written.

Streaming: :func:`open_part_start` says where the last top-level part of the answer
begins (after a blank line, at a line that starts in the first column, outside code
fences). Parts before it are complete and rendered once; only the open part is laid out
again as tokens arrive. Nothing here imports Qt.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum, auto
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from markdown_it import MarkdownIt
    from markdown_it.token import Token

    from backends.speculation.types import TokenOrigin

BULLETS = ("•", "◦", "▪")  # by list depth, repeating
FENCE_CHARACTERS = "`~"
MIN_FENCE_RUN = 3
MAX_FENCE_INDENT = 3  # CommonMark: four spaces make an indented block, not a fence


class LineKind(Enum):
    """What a rendered line is, for its block format."""

    PROSE = auto()
    HEADING = auto()
    CODE = auto()
    RULE = auto()


@dataclass(frozen=True)
class InlineStyle:
    """How a piece of prose looks: emphasis, inline code, a link's address."""

    bold: bool = False
    italic: bool = False
    strike: bool = False
    code: bool = False
    href: str = ""


PLAIN = InlineStyle()


@dataclass(frozen=True)
class Piece:
    """Rendered text of one style and one origin."""

    text: str
    origin: TokenOrigin
    style: InlineStyle = PLAIN


@dataclass
class Line:
    """One rendered line (a block of the document).

    ``break_origin``: the origin of the source newline before it (None for an answer's
    first line), carried by the block separator so that it can be read back.
    """

    kind: LineKind
    pieces: list[Piece] = field(default_factory=list)
    break_origin: TokenOrigin | None = None
    heading_level: int = 0
    list_depth: int = 0  # nesting of lists (0: not in a list)
    list_marker: bool = False  # the item's first line (its first piece is the marker)
    quote_depth: int = 0
    code_language: str = ""  # CODE: the fence's language ("" when it names none)
    code_first: bool = False  # CODE: the first line of its block
    source_start: int = 0  # where the line's source begins (an offset into the answer)

    @property
    def text(self) -> str:
        return "".join(piece.text for piece in self.pieces)


@dataclass
class Table:
    """A table: rows of cells of pieces, the first ``header_rows`` rows a header."""

    rows: list[list[list[Piece]]]
    header_rows: int
    break_origin: TokenOrigin | None = None
    source_start: int = 0


Item = Line | Table


@cache
def _parser() -> MarkdownIt:
    from markdown_it import MarkdownIt

    options = {"breaks": True, "html": False, "linkify": False}
    return MarkdownIt("commonmark", options).enable("table").enable("strikethrough")


def part_starts(source: str, start: int = 0) -> list[int]:
    """Where the top-level parts of ``source`` after ``start`` begin.

    A part begins at a line that starts in the first column after a blank line, outside
    a fenced code block: what comes before it is complete Markdown whatever follows, and
    more text never moves a part's start.
    """
    fence = ""
    starts: list[int] = []
    previous_blank = False
    offset = start
    for line in source[start:].split("\n"):
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if fence:
            if _closes_fence(stripped, indent, fence):
                fence = ""
        else:
            if previous_blank and line and not line[0].isspace() and offset > start:
                starts.append(offset)
            if indent <= MAX_FENCE_INDENT and stripped[:1] in FENCE_CHARACTERS and stripped:
                run = len(stripped) - len(stripped.lstrip(stripped[0]))
                if run >= MIN_FENCE_RUN and not (stripped[0] == "`" and "`" in stripped[run:]):
                    fence = stripped[:run]
        previous_blank = not line.strip()
        offset += len(line) + 1
    return starts


def open_part_start(source: str, start: int = 0) -> int:
    """Where the last (open) top-level part of ``source`` begins, searching from ``start``."""
    starts = part_starts(source, start)
    return starts[-1] if starts else start


def _closes_fence(stripped: str, indent: int, fence: str) -> bool:
    run = len(stripped) - len(stripped.lstrip(fence[0])) if stripped else 0
    return (
        indent <= MAX_FENCE_INDENT
        and run >= len(fence)
        and stripped[:1] == fence[0]
        and not stripped[run:].strip()
    )


def layout(
    source: str, origins: Sequence[TokenOrigin], start: int = 0, end: int | None = None
) -> list[Item]:
    """What ``source[start:end]`` (a whole part, see :func:`open_part_start`) renders as.

    ``origins`` has one origin per character of ``source``. The first item's
    ``break_origin`` is the origin of the newline before ``start`` (None at 0).
    """
    end = len(source) if end is None else end
    return _Layout(source, origins, start, end).items()


class _SourceCursor:
    """Finds rendered text in the source, in order, within one inline's lines."""

    def __init__(self, source: str, origins: Sequence[TokenOrigin], at: int, end: int) -> None:
        self.source, self.origins, self.at, self.end = source, origins, at, end

    def take(self, text: str) -> list[TokenOrigin]:
        """The origins of ``text``'s characters, found from the cursor on (which moves past)."""
        if not text:
            return []
        found = self.source.find(text, self.at, self.end)
        if found < 0:
            origin = self.origins[min(self.at, self.end - 1, len(self.origins) - 1)]
            return [origin] * len(text)
        self.at = found + len(text)
        return list(self.origins[found : self.at])

    def skip(self, markup: str) -> None:
        """Move past ``markup`` (``**``, a backtick) if it comes next in the source."""
        if markup:
            found = self.source.find(markup, self.at, self.end)
            if found >= 0:
                self.at = found + len(markup)

    def newline(self) -> TokenOrigin:
        """The origin of the next newline (the cursor moves past it)."""
        found = self.source.find("\n", self.at, self.end)
        if found < 0:
            return self.origins[min(self.at, len(self.origins) - 1)]
        self.at = found + 1
        return self.origins[found]


@dataclass
class _ListLevel:
    ordered: bool
    item_open: bool = False  # an item began and its marker is not written yet
    marker: str = ""


def _pieces(text: str, origins: Sequence[TokenOrigin], style: InlineStyle) -> list[Piece]:
    """``text`` cut where its origin changes."""
    pieces: list[Piece] = []
    begin = 0
    for index in range(1, len(text) + 1):
        if index == len(text) or origins[index] is not origins[begin]:
            pieces.append(Piece(text[begin:index], origins[begin], style))
            begin = index
    return pieces


class _Layout:
    """One part's tokens walked into lines and tables."""

    def __init__(self, source: str, origins: Sequence[TokenOrigin], start: int, end: int) -> None:
        self.source, self.origins, self.start, self.end = source, origins, start, end
        part = source[start:end]
        self.line_starts = [start]
        for index, character in enumerate(part):
            if character == "\n":
                self.line_starts.append(start + index + 1)
        self.tokens = _parser().parse(part)
        self.out: list[Item] = []
        self.next_line = 0  # the first source line (of the part) not yet rendered

    def items(self) -> list[Item]:
        lists: list[_ListLevel] = []
        quote = 0
        heading = 0
        table: list[list[list[Piece]]] | None = None
        header_rows = 0
        table_line = 0
        in_head = False
        for token in self.tokens:
            kind = token.type
            if kind in ("bullet_list_open", "ordered_list_open"):
                lists.append(_ListLevel(kind == "ordered_list_open"))
            elif kind in ("bullet_list_close", "ordered_list_close"):
                lists.pop()
            elif kind == "list_item_open" and lists:
                level = lists[-1]
                level.item_open = True
                level.marker = f"{token.info}{token.markup}" if level.ordered else token.markup
                self._blank_lines_to(token.map[0] if token.map else self.next_line)
            elif kind == "blockquote_open":
                quote += 1
            elif kind == "blockquote_close":
                quote -= 1
            elif kind == "heading_open":
                heading = int(token.tag[1:])
            elif kind == "heading_close":
                heading = 0
            elif kind in ("fence", "code_block"):
                self._code(token, lists, quote)
            elif kind == "hr":
                self._rule(token, lists, quote)
            elif kind == "table_open":
                table, header_rows = [], 0
                table_line = token.map[0] if token.map else self.next_line
            elif kind == "thead_open":
                in_head = True
            elif kind == "thead_close":
                in_head = False
            elif kind == "tr_open" and table is not None:
                table.append([])
                header_rows += in_head
            elif kind == "inline" and table is not None and table:
                table[-1].append(self._cell(token))
            elif kind == "table_close" and table is not None:
                self._table(table, header_rows, table_line, token)
                table = None
            elif kind == "inline":
                self._inline_lines(token, lists, quote, heading)
        self._blank_lines_to(len(self.line_starts))
        return self.out

    # -- blocks --------------------------------------------------------------------------

    def _break_origin(self, line: int) -> TokenOrigin | None:
        """The origin of the newline before source line ``line`` of the part."""
        position = self.line_starts[line] - 1 if line < len(self.line_starts) else self.end - 1
        return self.origins[position] if position >= 0 else None

    def _add(self, item: Item, line: int) -> None:
        item.break_origin = self._break_origin(line)
        item.source_start = self.line_starts[min(line, len(self.line_starts) - 1)]
        self.out.append(item)

    def _blank_lines_to(self, line: int) -> None:
        """Empty lines for the blank source lines before ``line``."""
        for blank in range(self.next_line, min(line, len(self.line_starts))):
            begin = self.line_starts[blank]
            stop = (
                self.line_starts[blank + 1] - 1 if blank + 1 < len(self.line_starts) else self.end
            )
            if not self.source[begin:stop].strip():
                self._add(Line(LineKind.PROSE), blank)
        self.next_line = max(self.next_line, line)

    def _context(self, line: Line, lists: list[_ListLevel], quote: int) -> Line:
        line.list_depth = len(lists)
        line.quote_depth = quote
        return line

    def _marker(self, lists: list[_ListLevel], at: int) -> list[Piece]:
        """The open item's marker (its first line only), with the marker's origin."""
        if not lists or not lists[-1].item_open:
            return []
        level = lists[-1]
        level.item_open = False
        found = self.source.find(level.marker, self.line_starts[at], self.end)
        origin = self.origins[found] if found >= 0 else self.origins[self.line_starts[at]]
        shown = level.marker if level.ordered else BULLETS[(len(lists) - 1) % len(BULLETS)]
        return [Piece(f"{shown} ", origin)]

    def _inline_lines(
        self, token: Token, lists: list[_ListLevel], quote: int, heading: int
    ) -> None:
        first = token.map[0] if token.map else self.next_line
        last = token.map[1] if token.map else first + 1
        self._blank_lines_to(first)
        kind = LineKind.HEADING if heading else LineKind.PROSE
        marker = self._marker(lists, first)
        end = self.line_starts[last] if last < len(self.line_starts) else self.end
        cursor = _SourceCursor(self.source, self.origins, self.line_starts[first], end)
        line = self._context(Line(kind, marker, heading_level=heading), lists, quote)
        line.list_marker = bool(marker)
        self._add(line, first)
        row = first
        style = PLAIN
        for child in token.children or []:
            if child.type in ("softbreak", "hardbreak"):
                origin = cursor.newline()
                row += 1
                line = self._context(Line(kind, heading_level=heading), lists, quote)
                self._add(line, row)
                line.break_origin = origin
                continue
            style = self._style_after(child, style, cursor)
            text = child.content if child.type in ("text", "code_inline", "image") else ""
            if child.type == "code_inline":
                cursor.skip(child.markup)
                line.pieces += _pieces(text, cursor.take(text), replace(style, code=True))
                cursor.skip(child.markup)
            elif text:
                line.pieces += _pieces(text, cursor.take(text), style)
        self.next_line = max(self.next_line, last)

    def _style_after(self, token: Token, style: InlineStyle, cursor: _SourceCursor) -> InlineStyle:
        """The style after an opening or closing markup token (the cursor skips its markup)."""
        switches = {
            "strong_open": {"bold": True},
            "strong_close": {"bold": False},
            "em_open": {"italic": True},
            "em_close": {"italic": False},
            "s_open": {"strike": True},
            "s_close": {"strike": False},
        }
        if token.type in switches:
            cursor.skip(token.markup)
            return replace(style, **switches[token.type])  # type: ignore[arg-type]
        if token.type == "link_open":
            cursor.skip("[")
            return replace(style, href=str(token.attrs.get("href", "")))
        if token.type == "link_close":
            cursor.skip("]")
            return replace(style, href="")
        return style

    def _code(self, token: Token, lists: list[_ListLevel], quote: int) -> None:
        first, last = token.map if token.map else (self.next_line, self.next_line + 1)
        self._blank_lines_to(first)
        fenced = token.type == "fence"
        content_first = first + 1 if fenced else first
        language = token.info.split()[0] if fenced and token.info.strip() else ""
        code = token.content[:-1] if token.content.endswith("\n") else token.content
        marker = self._marker(lists, first)
        if marker:  # a list item that starts with code: its marker on a line of its own
            self._add(
                self._context(Line(LineKind.PROSE, marker, list_marker=True), lists, quote), first
            )
        for index, text in enumerate(code.split("\n") if code or not fenced else []):
            row = content_first + index
            if row >= len(self.line_starts):
                break
            begin = self.line_starts[row]
            stop = self.line_starts[row + 1] - 1 if row + 1 < len(self.line_starts) else self.end
            cursor = _SourceCursor(self.source, self.origins, begin, max(begin, stop))
            line = Line(
                LineKind.CODE,
                _pieces(text, cursor.take(text), PLAIN),
                code_language=language,
                code_first=index == 0,
            )
            self._add(self._context(line, lists, quote), row)
        self.next_line = max(self.next_line, last)

    def _rule(self, token: Token, lists: list[_ListLevel], quote: int) -> None:
        first = token.map[0] if token.map else self.next_line
        self._blank_lines_to(first)
        self._add(self._context(Line(LineKind.RULE), lists, quote), first)
        self.next_line = max(self.next_line, first + 1)

    def _cell(self, token: Token) -> list[Piece]:
        first = token.map[0] if token.map else self.next_line
        end = self.line_starts[first + 1] if first + 1 < len(self.line_starts) else self.end
        cursor = _SourceCursor(self.source, self.origins, self.line_starts[first], end)
        pieces: list[Piece] = []
        style = PLAIN
        for child in token.children or []:
            style = self._style_after(child, style, cursor)
            if child.type in ("text", "code_inline"):
                child_style = replace(style, code=child.type == "code_inline")
                pieces += _pieces(child.content, cursor.take(child.content), child_style)
        return pieces

    def _table(
        self, rows: list[list[list[Piece]]], header_rows: int, first: int, token: Token
    ) -> None:
        self._blank_lines_to(first)
        self._add(Table(rows, header_rows), first)
        last = first + len(rows) + 1  # the rows and the delimiter row
        self.next_line = max(self.next_line, last)


def answer_layout(source: str, origins: Sequence[TokenOrigin]) -> list[Item]:
    """A whole answer laid out part by part, as the window shows it."""
    items: list[Item] = []
    start = 0
    for begins in part_starts(source):
        # The newline before the next part is that part's separator, not a blank line.
        items += layout(source, origins, start, begins - 1)
        start = begins
    return items + layout(source, origins, start)


def rendered_runs(items: Sequence[Item]) -> list[tuple[str, TokenOrigin | None]]:
    """The text of laid-out lines with origins, a newline of its origin between lines.

    What the window's readback of an answer gives: a table is an empty line, then each
    of its cells on a line of its own (their line breaks of no origin).
    """
    runs: list[tuple[str, TokenOrigin | None]] = []
    for index, item in enumerate(items):
        if index > 0:
            runs.append(("\n", item.break_origin))
        if isinstance(item, Line):
            runs += [(piece.text, piece.origin) for piece in item.pieces]
            continue
        for row in item.rows:
            for cell in row:
                runs.append(("\n", None))
                runs += [(piece.text, piece.origin) for piece in cell]
    return runs


def shown_text_of(source: str, origins: Sequence[TokenOrigin], origin: TokenOrigin) -> str:
    """What the window shows of ``origin``'s characters of an answer, line breaks aside.

    (What its background colour marks: the accepted draft's green, the grammar's blue.)
    """
    runs = rendered_runs(answer_layout(source, origins))
    return "".join(text for text, who in runs if who is origin and text != "\n")


def plain_text(items: Sequence[Item]) -> str:
    """The rendered text of ``items``: lines joined by newlines, a table's cells by tabs."""
    parts: list[str] = []
    for item in items:
        if isinstance(item, Table):
            parts.append("\n".join("\t".join(_text(cell) for cell in row) for row in item.rows))
        else:
            parts.append(item.text)
    return "\n".join(parts)


def _text(pieces: Sequence[Piece]) -> str:
    return "".join(piece.text for piece in pieces)
