"""An answer's Markdown as lines whose characters keep their origins (no Qt involved)."""

from __future__ import annotations

import pytest

from backends.speculation.types import TokenOrigin
from gui.markdown_layout import (
    Line,
    LineKind,
    Table,
    answer_layout,
    layout,
    open_part_start,
    part_starts,
    plain_text,
)

D = TokenOrigin.DRAFT
T = TokenOrigin.TARGET


def origins_of(source: str, drafted: str = "") -> list[TokenOrigin]:
    """T everywhere, D over the first occurrence of ``drafted``."""
    origins = [T] * len(source)
    if drafted:
        start = source.index(drafted)
        origins[start : start + len(drafted)] = [D] * len(drafted)
    return origins


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("plain prose\n\nover two paragraphs\n", "plain prose\n\nover two paragraphs\n"),
        ("# Title\n## Sub", "Title\nSub"),
        ("**bold**, *it*, ~~gone~~, `code`", "bold, it, gone, code"),
        ("[a link](https://example.org) and <b>html</b>", "a link and <b>html</b>"),
        ("- a\n- b\n  - c\n\n1. one\n2. two", "• a\n• b\n◦ c\n\n1. one\n2. two"),
        ("```js\nlet x = 1;\n```\nafter", "let x = 1;\nafter"),
        ("```\nunclosed\n", "unclosed\n"),
        ("> quoted\n\n---\nend", "quoted\n\n\nend"),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "a\tb\n1\t2"),
        ("escaped \\*stars\\* &amp; entities", "escaped *stars* & entities"),
    ],
)
def test_markdown_is_shown_without_its_markup(source: str, shown: str) -> None:
    assert plain_text(answer_layout(source, origins_of(source))) == shown


def test_each_shown_character_keeps_the_origin_of_its_source_character() -> None:
    source = "Say **hello there** to `the_code` now\n\n- item one"
    items = layout(source, origins_of(source, "lo the"))
    first = items[0]
    assert isinstance(first, Line)
    drafted = "".join(piece.text for piece in first.pieces if piece.origin is D)
    assert drafted == "lo the"
    bold = [piece for piece in first.pieces if piece.style.bold]
    assert "".join(piece.text for piece in bold) == "hello there"
    code = [piece for piece in first.pieces if piece.style.code]
    assert "".join(piece.text for piece in code) == "the_code"
    item = items[-1]
    assert isinstance(item, Line)
    assert item.list_marker
    assert item.list_depth == 1
    assert item.pieces[0].text == "• "


def test_code_lines_keep_their_whitespace_and_language() -> None:
    source = "```python\ndef f():\n\treturn  1\n\n```"
    items = layout(source, origins_of(source, "return"))
    code = [item for item in items if isinstance(item, Line) and item.kind is LineKind.CODE]
    assert [line.text for line in code] == ["def f():", "\treturn  1", ""]
    assert code[0].code_first
    assert code[0].code_language == "python"
    assert not code[1].code_first
    assert [piece.origin for piece in code[1].pieces] == [T, D, T]


def test_tables_are_rows_of_cells_with_a_header() -> None:
    source = "| name | n |\n|---|--:|\n| **a** | `1` |"
    (table,) = layout(source, origins_of(source))
    assert isinstance(table, Table)
    assert table.header_rows == 1
    assert [[piece.text for piece in cell] for cell in table.rows[1]] == [["a"], ["1"]]
    assert table.rows[1][0][0].style.bold
    assert table.rows[1][1][0].style.code


def test_a_newline_between_lines_carries_its_own_origin() -> None:
    source = "one\ntwo\n\nthree"
    origins = origins_of(source)
    origins[3] = D  # the first newline was drafted
    lines = answer_layout(source, origins)
    assert [line.break_origin for line in lines] == [None, D, T, T]


@pytest.mark.parametrize(
    ("source", "starts"),
    [
        ("a\n\nb\n\nc", ["b", "c"]),
        ("a\nb\n  \nc", ["c"]),  # a blank line of spaces counts
        ("a\n\n  indented continues", []),
        ("a\n\n```\nx\n\ny\n```\n\nz", ["```", "z"]),  # never inside a fence
        ("a\n\n~~~\n```\n\nstill code\n", ["~~~"]),  # a fence closes with its own kind
        ("a\n\n", []),  # the next line has not begun
    ],
)
def test_parts_begin_in_the_first_column_after_a_blank_line(source: str, starts: list[str]) -> None:
    found = part_starts(source)
    assert [source[start:].split("\n")[0] for start in found] == starts
    assert open_part_start(source) == (found[-1] if found else 0)


def test_more_text_never_moves_a_parts_start() -> None:
    source = "Intro\n\n```py\nx = 1\n\n```\n\n1. a\n\n| t |\n|---|\n| 1 |\n\nend"
    final = part_starts(source)
    for length in range(len(source) + 1):
        assert set(part_starts(source[:length])) <= set(final), source[:length]
