"""The shared answer renderer: Markdown as it streams, origins kept under it, readback of runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtGui import QColor, QFont, QTextCursor, QTextDocument, QTextFormat

from backends.speculation.types import TokenOrigin
from gui.answer_text import (
    AnswerStyles,
    AnswerWriter,
    code_colours,
    highlighted_text,
    is_code_line,
    origin_of,
    text_runs,
)
from gui.markdown_layout import answer_layout, part_starts, rendered_runs
from gui.style import colours

if TYPE_CHECKING:
    from collections.abc import Sequence

    from PySide6.QtGui import QTextCharFormat
    from pytestqt.qtbot import QtBot

D = TokenOrigin.DRAFT
T = TokenOrigin.TARGET


def render(
    pieces: Sequence[tuple[str, TokenOrigin]], *, visualize: bool = True, every: int = 1
) -> QTextDocument:
    """``pieces`` written and rendered after every ``every`` of them, as a stream would."""
    document = QTextDocument()
    cursor = QTextCursor(document)
    styles = AnswerStyles(document.defaultFont(), visualize)
    cursor.setBlockFormat(styles.prose_block)
    writer = AnswerWriter(cursor, styles)
    for index, (text, origin) in enumerate(pieces):
        writer.write(text, origin)
        if (index + 1) % every == 0:
            writer.render()
    writer.render()
    return document


def whole(document: QTextDocument) -> list[tuple[str, TokenOrigin | None]]:
    runs = text_runs(document, 0, document.characterCount() - 1)
    merged: list[tuple[str, TokenOrigin | None]] = []
    for run in runs:
        if merged and merged[-1][1] is run.origin:
            merged[-1] = (merged[-1][0] + run.text, run.origin)
        else:
            merged.append((run.text, run.origin))
    return merged


def expected(pieces: Sequence[tuple[str, TokenOrigin]]) -> list[tuple[str, TokenOrigin | None]]:
    source = "".join(text for text, _ in pieces)
    origins = [origin for text, origin in pieces for _ in text]
    merged: list[tuple[str, TokenOrigin | None]] = []
    for text, origin in rendered_runs(answer_layout(source, origins)):
        if merged and merged[-1][1] is origin:
            merged[-1] = (merged[-1][0] + text, origin)
        elif text:
            merged.append((text, origin))
    return merged


def code_lines(document: QTextDocument) -> list[str]:
    lines: list[str] = []
    block = document.begin()
    while block.isValid():
        if is_code_line(block):
            lines.append(block.text())
        block = block.next()
    return lines


def block_looks(document: QTextDocument) -> list[tuple[str, bool, float, float, float]]:
    """Each block's text, whether it is code, and its margins."""
    looks = []
    block = document.begin()
    while block.isValid():
        shape = block.blockFormat()
        looks.append(
            (
                block.text(),
                is_code_line(block),
                shape.leftMargin(),
                shape.topMargin(),
                shape.textIndent(),
            )
        )
        block = block.next()
    return looks


def format_of(document: QTextDocument, needle: str, offset: int = 0) -> QTextCharFormat:
    found = document.find(needle)
    assert not found.isNull(), needle
    cursor = QTextCursor(document)
    cursor.setPosition(found.selectionStart() + offset + 1)
    return cursor.charFormat()


def test_a_fence_split_over_tokens_is_a_code_block_without_its_fences(qtbot: QtBot) -> None:
    pieces = [("A\n`", T), ("``p", D), ("y\nx = 1\n~~~\n`", T), ("``\nB", D)]
    document = render(pieces)

    # A tilde run does not close a backtick fence: it is code like any other line.
    assert document.toPlainText() == "A\nx = 1\n~~~\nB"
    assert code_lines(document) == ["x = 1", "~~~"]
    assert format_of(document, "x = 1").fontFixedPitch()
    assert not format_of(document, "B").fontFixedPitch()
    assert whole(document) == expected(pieces)


def test_markdown_is_shown_and_every_character_keeps_its_origin(qtbot: QtBot) -> None:
    pieces = [
        ("# A ti", D),
        ("tle\n\nSome **bo", T),
        ("ld** and *it*", D),
        (" with `co", T),
        ("de` and [a link](https://example.org/x).\n\n- one\n", D),
        ("- two\n  1. nested\n", T),
        ("\n> a quote\n\n---\nend", D),
    ]
    document = render(pieces)

    assert document.toPlainText() == (
        "A title\n\nSome bold and it with code and a link.\n\n• one\n• two\n1. nested\n\n"
        "a quote\n\n\nend"
    )
    assert whole(document) == expected(pieces)
    heading = format_of(document, "A title")
    assert heading.fontWeight() == QFont.Weight.Bold
    assert heading.fontPointSize() > format_of(document, "Some").fontPointSize()
    assert format_of(document, "bold").fontWeight() == QFont.Weight.Bold
    assert format_of(document, "it with").fontItalic()
    assert format_of(document, "code and").fontFixedPitch()
    link = format_of(document, "a link")
    assert link.isAnchor()
    assert link.anchorHref() == "https://example.org/x"
    # The bold's "bo" came from the main model, "ld" from the draft: so it is shown.
    assert origin_of(format_of(document, "bold", 0)) is T
    assert origin_of(format_of(document, "bold", 3)) is D
    # A list's bullet carries its marker's origin; nested lists are indented deeper.
    assert origin_of(format_of(document, "• one")) is D
    one, nested = document.find("• one").block(), document.find("1. nested").block()
    assert nested.blockFormat().leftMargin() > one.blockFormat().leftMargin() > 0
    rule = document.find("a quote").block().next().next()
    assert rule.blockFormat().hasProperty(QTextFormat.Property.BlockTrailingHorizontalRulerWidth)


def test_streamed_in_any_pieces_the_rendering_is_the_whole_answers(qtbot: QtBot) -> None:
    source = (
        "Intro line\n\n```python\ndef f(x):\n    return x  # done\n```\n\n"
        "1. first\n2. second\n\n| a | b |\n|---|---|\n| `1` | **2** |\n\nBye."
    )
    pieces = [
        (source[index : index + 3], D if index % 2 else T) for index in range(0, len(source), 3)
    ]
    at_once = render(pieces, every=len(pieces))
    token_by_token = render(pieces, every=1)
    one_by_one = render([(character, T) for character in source], every=1)
    assert token_by_token.toPlainText() == at_once.toPlainText()
    assert whole(token_by_token) == whole(at_once)
    # Every block looks the same however the text arrived (a part laid out again leaves
    # no format of its old rendering behind).
    assert block_looks(token_by_token) == block_looks(at_once) == block_looks(one_by_one)
    ends_in_code = [(character, T) for character in "Tip.\n\n```python\ndef f(s):\n    x\n```\n"]
    whole_at_once = render(ends_in_code, every=len(ends_in_code))
    assert block_looks(render(ends_in_code, every=1)) == block_looks(whole_at_once)
    assert code_lines(token_by_token) == ["def f(x):", "    return x  # done"]
    table = token_by_token.rootFrame().childFrames()[0]
    assert table.firstCursorPosition().block().text() == "a"
    # The closed parts were laid out once: the list and the table begin parts of their own.
    assert [source[start : start + 5] for start in part_starts(source)] == [
        "```py",
        "1. fi",
        "| a |",
        "Bye.",
    ]


def test_code_is_highlighted_under_the_draft_green(qtbot: QtBot) -> None:
    pieces = [("```python\n", T), ("def", D), (" f():\n    return 1\n```", T)]
    document = render(pieces)

    keyword = format_of(document, "def")
    name = format_of(document, "f():")
    assert keyword.foreground().color() != name.foreground().color()  # Pygments' colours
    assert keyword.fontWeight() == QFont.Weight.Bold
    assert keyword.background().color() == colours().draft_background_in_code  # and the origin's
    assert origin_of(keyword) is D
    assert origin_of(name) is T
    assert name.background().style().name == "NoBrush"
    runs = text_runs(document, 0, document.characterCount() - 1)
    assert highlighted_text(runs) == "def"
    first = document.find("def").block()
    assert first.blockFormat().topMargin() > 0  # room for the language and Copy


def test_an_unknown_language_is_plain_code_and_a_known_one_is_coloured() -> None:
    assert code_colours("x = 1", "no-such-language").runs == []
    runs = code_colours("def f():\n    return 1", "python").runs
    assert any(QColor(style[0]).isValid() for _, _, style in runs)


def test_runs_read_back_text_origins_and_draft_green(qtbot: QtBot) -> None:
    pieces = [("The", T), (" quick", D), ("\n", D), ("fox", T)]
    document = render(pieces)

    assert whole(document) == [("The", T), (" quick\n", D), ("fox", T)]
    runs = text_runs(document, 0, document.characterCount() - 1)
    assert highlighted_text(runs) == " quick"


def test_without_visualization_origins_stay_but_nothing_is_green(qtbot: QtBot) -> None:
    document = render([("The", T), (" quick", D), (" `x`", D)], visualize=False)

    runs = text_runs(document, 0, document.characterCount() - 1)
    assert highlighted_text(runs) == ""
    # Adjacent text of one format is one run; inline code has a format of its own.
    assert [(run.text, run.origin) for run in runs] == [("The", T), (" quick ", D), ("x", D)]
    assert runs[2].char_format.fontFixedPitch()
