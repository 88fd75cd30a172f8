"""The shared answer renderer: fences across tokens, draft green, readback of runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtGui import QTextCursor, QTextDocument

from backends.speculation.types import TokenOrigin
from gui.answer_text import (
    AnswerStyles,
    AnswerWriter,
    highlighted_text,
    is_code_line,
    text_runs,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytestqt.qtbot import QtBot

D = TokenOrigin.DRAFT
T = TokenOrigin.TARGET


def render(pieces: Sequence[tuple[str, TokenOrigin]], *, visualize: bool = True) -> QTextDocument:
    document = QTextDocument()
    cursor = QTextCursor(document)
    styles = AnswerStyles(document.defaultFont(), visualize)
    cursor.setBlockFormat(styles.prose_block)
    writer = AnswerWriter(cursor, styles)
    for text, origin in pieces:
        writer.write(text, origin)
    return document


def whole(document: QTextDocument) -> list[tuple[str, TokenOrigin | None]]:
    runs = text_runs(document, 0, document.characterCount() - 1)
    return [(run.text, run.origin) for run in runs]


def code_lines(document: QTextDocument) -> list[str]:
    lines: list[str] = []
    block = document.begin()
    while block.isValid():
        if is_code_line(block):
            lines.append(block.text())
        block = block.next()
    return lines


def test_a_fence_split_over_tokens_opens_and_closes_a_code_block(qtbot: QtBot) -> None:
    document = render([("A\n`", T), ("``p", D), ("y\nx = 1\n~~~\n`", T), ("``\nB", D)])

    assert document.toPlainText() == "A\n```py\nx = 1\n~~~\n```\nB"
    # A tilde run does not close a backtick fence; it is code like any other line.
    assert code_lines(document) == ["```py", "x = 1", "~~~", "```"]
    fence = document.find("```py").charFormat()
    assert fence.fontFixedPitch()


def test_runs_read_back_text_origins_and_draft_green(qtbot: QtBot) -> None:
    pieces = [("The", T), (" quick", D), ("\n", D), ("fox", T)]
    document = render(pieces)

    assert whole(document) == [("The", T), (" quick", D), ("\n", D), ("fox", T)]
    runs = text_runs(document, 0, document.characterCount() - 1)
    assert highlighted_text(runs) == " quick"


def test_without_visualization_origins_stay_but_nothing_is_green(qtbot: QtBot) -> None:
    document = render([("The", T), (" quick", D), (" `x`", D)], visualize=False)

    runs = text_runs(document, 0, document.characterCount() - 1)
    assert highlighted_text(runs) == ""
    # Adjacent text of one format is one run; inline code has a format of its own.
    assert [(run.text, run.origin) for run in runs] == [("The", T), (" quick ", D), ("`x`", D)]
    assert runs[2].char_format.fontFixedPitch()
