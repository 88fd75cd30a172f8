"""The chat pane: streamed tokens, draft highlighting, code blocks, footers, readback."""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING

import pytest
from PySide6.QtCore import QElapsedTimer, QEvent, QPoint, QPointF, Qt, QTimer, QUrl
from PySide6.QtGui import QFontInfo, QGuiApplication, QHelpEvent
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QToolTip

from backends.speculation.types import EmittedToken, SpeculationStats, TokenOrigin
from gui.answer_text import CODE_PADDING
from gui.chat_format import MAX_COLUMN_WIDTH
from gui.chat_pane import ChatPane, left_out_note
from gui.style import DRAFT_TOOLTIP, TARGET_TOOLTIP, colours, monospace_font
from gui.transcript import MessageRecord, spans_from_tokens
from tests.gui.conftest import shown_on, shown_runs, shown_text
from tests.gui.test_main_window import MAX_EVENT_LOOP_STALL_MS
from tests.gui.thread_clock import ThreadClock

if TYPE_CHECKING:
    from collections.abc import Sequence

    from PySide6.QtGui import QTextCharFormat
    from pytestqt.qtbot import QtBot

D = TokenOrigin.DRAFT
T = TokenOrigin.TARGET

MIXED = [
    ("The ", T),
    ("quick", D),
    (" brown", D),
    (" fox", T),
    (" jumps\n", D),
    ("over ", T),
    ("the lazy dog.", D),
]

CODE_ANSWER = [
    ("Here:\n\n", T),
    ("``", T),  # a fence split over three tokens
    ("`py", D),
    ("thon\n", T),
    ("def add(a, b):\n", D),
    ("    return", T),
    (" a + b\n\n", D),
    ("\tx = 1  \n", T),
    ("```", D),
    ("\nDone, `add` works.", T),
]


def tokens(pairs: Sequence[tuple[str, TokenOrigin]]) -> list[EmittedToken]:
    return [EmittedToken(index, text, origin) for index, (text, origin) in enumerate(pairs)]


def merged_runs(pairs: Sequence[tuple[str, TokenOrigin]]) -> list[tuple[str, TokenOrigin]]:
    runs: list[tuple[str, TokenOrigin]] = []
    for text, origin in pairs:
        if not text:
            continue
        if runs and runs[-1][1] is origin:
            runs[-1] = (runs[-1][0] + text, origin)
        else:
            runs.append((text, origin))
    return runs


def draft_text(pairs: Sequence[tuple[str, TokenOrigin]]) -> str:
    return "".join(text for text, origin in pairs if origin is D).replace("\n", "")


def make_stats(**overrides: object) -> SpeculationStats:
    stats = SpeculationStats(
        prompt_tokens=20,
        generated_tokens=81,
        rounds=30,
        total_draft_tokens_count=64,
        accepted_draft_tokens_count=48,
        rejected_draft_tokens_count=12,
        ignored_draft_tokens_count=4,
        time_to_first_token_sec=0.25,
        generation_seconds=2.0,
        total_seconds=2.3,
        stop_reason="eos",
    )
    for name, value in overrides.items():
        setattr(stats, name, value)
    return stats


@pytest.fixture
def pane(qtbot: QtBot) -> ChatPane:
    widget = ChatPane()
    qtbot.addWidget(widget)
    widget.resize(900, 700)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def stream(pane: ChatPane, pairs: Sequence[tuple[str, TokenOrigin]], method: str = "auto") -> None:
    pane.begin_answer(method)
    pane.append_tokens(tokens(pairs))
    pane.flush()


def answer_formats(pane: ChatPane, needle: str) -> list[QTextCharFormat]:
    """The character formats of each character of the first occurrence of ``needle``."""
    found = pane.document.find(needle)
    assert not found.isNull(), needle
    formats = []
    for position in range(found.selectionStart(), found.selectionEnd()):
        cursor = pane.document.find(needle)
        cursor.setPosition(position + 1)
        formats.append(cursor.charFormat())
    return formats


def point_inside(pane: ChatPane, needle: str, offset: int = 1) -> QPoint:
    """A viewport point over the character ``offset`` of the first occurrence of ``needle``."""
    cursor = pane.document.find(needle)
    assert not cursor.isNull(), needle
    cursor.setPosition(cursor.selectionStart() + offset)
    rect = pane.browser.cursorRect(cursor)
    return QPoint(rect.x() + 1, rect.center().y())


def test_streamed_answer_reads_back_text_and_origins(pane: ChatPane) -> None:
    pane.append_user_message("Say something")
    stream(pane, MIXED)

    assert pane.answer_count() == 1
    assert pane.answer_text() == "".join(text for text, _ in MIXED)
    assert pane.answer_origins() == merged_runs(MIXED)
    assert pane.highlighted_text() == draft_text(MIXED)
    assert pane.is_streaming()


def test_tokens_wait_for_the_flush_timer_and_arrive_in_one_edit(
    pane: ChatPane, qtbot: QtBot
) -> None:
    pane.begin_answer("auto")
    edits: list[int] = []
    pane.document.contentsChange.connect(lambda position, removed, added: edits.append(added))

    pane.append_tokens(tokens(MIXED[:3]))
    pane.append_tokens(tokens(MIXED[3:]))
    assert pane.answer_text() == ""

    expected = "".join(text for text, _ in MIXED)
    qtbot.waitUntil(lambda: pane.answer_text() == expected, timeout=2000)
    assert len(edits) == 1
    assert pane.answer_origins() == merged_runs(MIXED)


def test_visualization_toggle_removes_and_restores_the_green(pane: ChatPane) -> None:
    stream(pane, MIXED)
    pane.finish_answer(make_stats())
    pane.begin_answer("auto")
    pane.append_tokens(tokens([("still ", T), ("streaming", D)]))
    pane.flush()

    pane.set_visualize_drafts(False)
    assert not pane.visualize_drafts()
    assert pane.highlighted_text(0) == ""
    assert pane.highlighted_text(1) == ""
    assert pane.answer_origins(0) == merged_runs(MIXED)
    assert pane.answer_text(1) == "still streaming"

    pane.set_visualize_drafts(True)
    assert pane.highlighted_text(0) == draft_text(MIXED)
    assert pane.highlighted_text(1) == "streaming"
    assert pane.footer_text(0) != ""

    # the re-rendered open answer keeps streaming where it stopped
    pane.append_tokens(tokens([(" on", D)]))
    pane.finish_answer(make_stats())
    assert pane.answer_text(1) == "still streaming on"
    assert pane.highlighted_text(1) == "streaming on"


def test_code_block_keeps_whitespace_and_is_monospace(pane: ChatPane) -> None:
    stream(pane, CODE_ANSWER)
    pane.finish_answer(make_stats())

    source = "".join(text for text, _ in CODE_ANSWER)
    assert pane.answer_source() == source
    # The fences are not shown; the code keeps its whitespace, blank line and tab.
    assert pane.answer_text() == (
        "Here:\n\ndef add(a, b):\n    return a + b\n\n\tx = 1  \nDone, add works."
    )
    assert pane.answer_text() == shown_text(CODE_ANSWER)
    assert pane.answer_origins() == shown_runs(CODE_ANSWER)

    mono_family = monospace_font().family()
    for needle in ("def add(a, b):", "    return a + b", "\tx = 1  "):
        for char_format in answer_formats(pane, needle):
            assert char_format.fontFixedPitch(), needle
            assert mono_family in char_format.fontFamilies(), needle
    assert QFontInfo(answer_formats(pane, "def add")[0].font()).fixedPitch()
    for char_format in answer_formats(pane, "Here:") + answer_formats(pane, "Done, "):
        assert not char_format.fontFixedPitch()
    # inline code in prose is monospace too, the prose around it is not
    assert all(f.fontFixedPitch() for f in answer_formats(pane, "add works")[:3])
    assert not answer_formats(pane, " works")[0].fontFixedPitch()

    # drafted code is still marked
    assert pane.highlighted_text() == shown_on(CODE_ANSWER, D)
    assert "def add(a, b):" in pane.highlighted_text()


def test_tilde_fence_and_unclosed_code_block(pane: ChatPane) -> None:
    pairs = [("~~~\n", T), ("x  =  1\n", D), ("``` not a closing fence\n", T), ("y", D)]
    stream(pane, pairs)
    assert pane.answer_text() == "x  =  1\n``` not a closing fence\ny"
    for needle in ("x  =  1", "``` not a closing fence", "y"):
        assert all(f.fontFixedPitch() for f in answer_formats(pane, needle)), needle


def test_backticks_that_only_start_like_a_fence_are_inline_code(pane: ChatPane) -> None:
    stream(pane, [("``", T), ("x`` and `", D), ("y` ok", T)])
    assert pane.answer_text() == "x and y ok"
    assert answer_formats(pane, "x and")[0].fontFixedPitch()
    assert answer_formats(pane, "y ok")[0].fontFixedPitch()
    assert not answer_formats(pane, "ok")[0].fontFixedPitch()
    assert not answer_formats(pane, " and")[0].fontFixedPitch()


def test_origin_at_tells_who_produced_the_token_under_the_mouse(
    pane: ChatPane, qtbot: QtBot
) -> None:
    stream(pane, MIXED)
    pane.finish_answer(make_stats())

    assert pane.origin_at(point_inside(pane, "quick")) is D
    assert pane.origin_at(point_inside(pane, "fox")) is T
    assert pane.origin_at(point_inside(pane, "lazy")) is D
    assert pane.origin_at(point_inside(pane, "Assistant")) is None
    # the right half of the last letter of " fox", just before the drafted " jumps"
    cursor = pane.document.find(" fox")
    cursor.setPosition(cursor.selectionEnd())
    caret = pane.browser.cursorRect(cursor)
    assert pane.origin_at(QPoint(caret.x() - 2, caret.center().y())) is T
    assert pane.origin_at(QPoint(caret.x() + 2, caret.center().y())) is D
    assert pane.origin_at(QPoint(pane.browser.viewport().width() - 5, 5)) is None

    point = point_inside(pane, "quick")
    viewport = pane.browser.viewport()
    event = QHelpEvent(QEvent.Type.ToolTip, point, viewport.mapToGlobal(point))
    QApplication.sendEvent(viewport, event)
    qtbot.waitUntil(lambda: QToolTip.text() == DRAFT_TOOLTIP, timeout=2000)
    point = point_inside(pane, "fox")
    event = QHelpEvent(QEvent.Type.ToolTip, point, viewport.mapToGlobal(point))
    QApplication.sendEvent(viewport, event)
    qtbot.waitUntil(lambda: QToolTip.text() == TARGET_TOOLTIP, timeout=2000)
    QToolTip.hideText()


def test_footer_shows_the_figures_of_the_stats(pane: ChatPane) -> None:
    stream(pane, MIXED)
    stats = make_stats()
    pane.finish_answer(stats)

    footer = pane.footer_text()
    assert stats.acceptance_rate is not None
    assert f"{stats.acceptance_rate * 100:.0f}% accepted" in footer
    assert "75% accepted" in footer
    assert "40.0 tok/s" in footer
    assert "0.25 s to first token" in footer
    assert "81 tokens" in footer
    assert "drafted 64 / accepted 48 / rejected 12" in footer
    assert "end of answer" in footer
    assert not pane.is_streaming()
    assert pane.answer_text() == "".join(text for text, _ in MIXED)


@pytest.mark.parametrize(
    ("stop_reason", "words"),
    [
        ("max_tokens", "max tokens"),
        ("stop_string", "stop string"),
        ("context_full", "context full"),
    ],
)
def test_footer_names_the_stop_reason(pane: ChatPane, stop_reason: str, words: str) -> None:
    stream(pane, MIXED)
    pane.finish_answer(make_stats(stop_reason=stop_reason))
    assert pane.footer_text().endswith(words)


def test_footer_of_stopped_interrupted_and_failed_answers(pane: ChatPane) -> None:
    stream(pane, MIXED)
    pane.finish_answer(make_stats(stop_reason="cancelled"), "cancelled")
    assert pane.footer_text().startswith("Stopped · ")

    stream(pane, MIXED)
    pane.finish_answer(None, "interrupted")
    assert pane.footer_text() == "Interrupted (the app closed while answering)"

    stream(pane, [("Partial", T)])
    pane.finish_answer(None, "error", "engine crashed")
    assert pane.footer_text() == "Error: engine crashed"
    assert answer_formats(pane, "engine crashed")[0].foreground().color() == colours().error_text

    stream(pane, [("No drafts here", T)])
    pane.finish_answer(make_stats(total_draft_tokens_count=0, accepted_draft_tokens_count=0))
    assert "no drafts" in pane.footer_text()
    assert "% accepted" not in pane.footer_text()
    assert pane.answer_count() == 4


def test_set_messages_round_trip(pane: ChatPane) -> None:
    first = tokens(MIXED)
    second = tokens(CODE_ANSWER)
    records = [
        MessageRecord(role="system", content="You are helpful."),
        MessageRecord(role="user", content="First question"),
        MessageRecord(
            role="assistant",
            content="".join(t.text for t in first),
            spans=spans_from_tokens(first),
            stats=make_stats(),
            method="auto",
        ),
        MessageRecord(role="user", content="Second\nquestion"),
        MessageRecord(
            role="assistant",
            content="".join(t.text for t in second),
            spans=spans_from_tokens(second),
            stats=make_stats(stop_reason="max_tokens"),
            method="off",
            state="cancelled",
        ),
    ]
    pane.set_messages(records)

    assert pane.answer_count() == 2
    assert pane.answer_text(0) == records[2].content
    assert pane.answer_origins(0) == merged_runs(MIXED)
    assert pane.highlighted_text(0) == draft_text(MIXED)
    assert pane.answer_source(1) == records[4].content
    assert pane.answer_origins(1) == shown_runs(CODE_ANSWER)
    assert "75% accepted" in pane.footer_text(0)
    assert pane.footer_text(1).startswith("Stopped · ")
    assert "Second\nquestion" in pane.document.toPlainText().replace("\u2029", "\n")
    assert "You are helpful." not in pane.document.toPlainText()

    shown = pane.records()
    assert [record.content for record in shown] == [r.content for r in records[1:]]
    assert shown[1].spans == records[2].spans

    # streaming what the first answer streamed gives the same document readback
    pane.clear()
    assert pane.answer_count() == 0
    pane.append_user_message("First question")
    stream(pane, MIXED)
    pane.finish_answer(make_stats())
    assert pane.answer_origins(0) == merged_runs(MIXED)


def test_set_messages_keeps_a_streaming_answer_open(pane: ChatPane) -> None:
    streamed = tokens([("Half ", T), ("way", D)])
    pane.set_messages(
        [
            MessageRecord(role="user", content="Go"),
            MessageRecord(
                role="assistant",
                content="Half way",
                spans=spans_from_tokens(streamed),
                state="streaming",
            ),
        ]
    )
    assert pane.is_streaming()
    assert pane.footer_text() == ""
    pane.append_tokens(tokens([(" there", D)]))
    pane.finish_answer(make_stats())
    assert pane.answer_text() == "Half way there"
    assert pane.highlighted_text() == "way there"


def test_records_without_spans_render_as_the_main_models_text(pane: ChatPane) -> None:
    pane.set_messages([MessageRecord(role="assistant", content="plain\ntext")])
    assert pane.answer_origins() == [("plain\ntext", T)]
    assert pane.highlighted_text() == ""
    assert pane.footer_text() == ""


def test_multibyte_emoji_and_empty_tokens(pane: ChatPane) -> None:
    pairs = [
        ("Crème ", T),
        ("", D),  # part of a character: no text yet
        ("brûlée 🍮", D),
        ("", T),
        (" 日本語", T),
        ("😀👍🏽\n", D),
        ("é", T),
    ]
    stream(pane, pairs)
    pane.finish_answer(make_stats())
    assert pane.answer_text() == "Crème brûlée 🍮 日本語😀👍🏽\né"
    assert pane.answer_origins() == merged_runs(pairs)
    assert pane.highlighted_text() == "brûlée 🍮😀👍🏽"
    assert pane.origin_at(point_inside(pane, "日本語")) is T
    assert pane.origin_at(point_inside(pane, "brûlée")) is D
    assert pane.records()[-1].spans == spans_from_tokens(tokens(pairs))


def test_copy_answer_and_context_menu(pane: ChatPane) -> None:
    QGuiApplication.clipboard().setText("before")
    pane.copy_answer()  # no answer yet: nothing to copy
    assert QGuiApplication.clipboard().text() == "before"
    stream(pane, MIXED)
    pane.finish_answer(make_stats())
    stream(pane, CODE_ANSWER)
    pane.finish_answer(make_stats())

    pane.copy_answer(0)
    assert QGuiApplication.clipboard().text() == "".join(text for text, _ in MIXED)

    point = point_inside(pane, "def add")
    assert pane.answer_index_at(point) == 1
    menu = pane.context_menu(point)
    actions = {action.text(): action for action in menu.actions()}
    assert "Copy answer" in actions
    actions["Copy answer"].trigger()
    assert QGuiApplication.clipboard().text() == "".join(text for text, _ in CODE_ANSWER)
    menu.deleteLater()


def test_notice_during_an_answer_waits_for_its_end(pane: ChatPane) -> None:
    pane.begin_answer("auto")
    pane.append_tokens(tokens([("part", T)]))
    pane.show_notice("Engine restarted")
    pane.append_tokens(tokens([(" two", D)]))
    pane.finish_answer(None, "error", "crashed")

    assert pane.answer_text() == "part two"
    plain = pane.document.toPlainText()
    assert plain.index("Error: crashed") < plain.index("Engine restarted")


def test_a_new_answer_closes_an_open_one_as_stopped(pane: ChatPane) -> None:
    pane.begin_answer("auto")
    pane.append_tokens(tokens([("cut ", T), ("short", D)]))
    pane.begin_answer("auto")
    assert pane.answer_count() == 2
    assert pane.answer_text(0) == "cut short"
    assert pane.footer_text(0) == "Stopped"
    assert pane.answer_text(1) == ""


def test_auto_scroll_follows_unless_the_user_scrolled_up(pane: ChatPane) -> None:
    bar = pane.browser.verticalScrollBar()
    pane.begin_answer("auto")
    for line in range(80):
        pane.append_tokens(tokens([(f"line {line}\n", T)]))
        pane.flush()
    assert bar.maximum() > 0
    assert bar.value() == bar.maximum()

    bar.setValue(0)
    for line in range(20):
        pane.append_tokens(tokens([(f"more {line}\n", D)]))
        pane.flush()
    assert bar.value() == 0

    bar.setValue(bar.maximum())
    pane.append_tokens(tokens([("back at the bottom\n", T)]))
    pane.flush()
    assert bar.value() == bar.maximum()


def test_two_thousand_tokens_stream_quickly(pane: ChatPane) -> None:
    words = ["alpha ", "beta ", "gamma\n", "    delta ", "```\n", "eps ", "ζ ", "🍮 "]
    pairs = [(words[i % len(words)], D if i % 3 else T) for i in range(2000)]
    batch = 40

    started = time.perf_counter()
    pane.begin_answer("auto")
    for start in range(0, len(pairs), batch):
        pane.append_tokens(tokens(pairs[start : start + batch]))
        pane.flush()
    pane.finish_answer(make_stats())
    QApplication.processEvents()
    elapsed = time.perf_counter() - started

    assert pane.answer_source() == "".join(text for text, _ in pairs)
    assert pane.answer_text() == shown_text(pairs)
    assert pane.answer_origins() == shown_runs(pairs)
    assert elapsed < 3.0, f"2,000 tokens took {elapsed:.2f} s"


def test_code_block_sits_in_a_painted_box(pane: ChatPane) -> None:
    stream(pane, CODE_ANSWER)
    pane.finish_answer(make_stats())
    image = pane.browser.viewport().grab().toImage()

    code = point_inside(pane, "def add", offset=0)
    assert image.pixelColor(code.x() - CODE_PADDING // 2, code.y()) == colours().code_background
    prose = point_inside(pane, "Done", offset=0)
    assert image.pixelColor(prose.x() - CODE_PADDING // 2, prose.y()) != colours().code_background


def test_wide_windows_keep_a_readable_column(pane: ChatPane, qtbot: QtBot) -> None:
    stream(pane, MIXED)
    pane.resize(MAX_COLUMN_WIDTH + 800, 600)
    qtbot.waitUntil(lambda: pane.document.rootFrame().frameFormat().leftMargin() > 300)
    root = pane.document.rootFrame().frameFormat()
    assert root.leftMargin() == root.rightMargin()
    assert pane.document.size().width() - 2 * root.leftMargin() <= MAX_COLUMN_WIDTH


def test_each_code_block_has_a_copy_button_and_a_language(pane: ChatPane, qtbot: QtBot) -> None:
    pairs = [
        ("Two blocks:\n\n```python\ndef f():\n", T),
        ("    return 1\n```\n\n```\n", D),
        ("plain code\n```\n\nSee [the docs](https://example.org/docs).", T),
    ]
    stream(pane, pairs)
    pane.finish_answer(make_stats())
    boxes = pane.browser.code_boxes()
    assert [box.language for box in boxes] == ["python", ""]
    QGuiApplication.clipboard().setText("before")
    with qtbot.waitSignal(pane.browser.code_copied) as copied:
        QTest.mouseClick(
            pane.browser.viewport(),
            Qt.MouseButton.LeftButton,
            pos=boxes[0].copy_rect().center().toPoint(),
        )
    assert copied.args == ["def f():\n    return 1"]
    assert QGuiApplication.clipboard().text() == "def f():\n    return 1"
    QTest.mouseClick(
        pane.browser.viewport(),
        Qt.MouseButton.LeftButton,
        pos=boxes[1].copy_rect().center().toPoint(),
    )
    assert QGuiApplication.clipboard().text() == "plain code"
    # The button sits above the code, in the box's header, not over its first line.
    first_line = point_inside(pane, "def f", offset=0)
    assert boxes[0].copy_rect().bottom() <= first_line.y()
    assert boxes[0].rect.contains(QPointF(first_line))


def test_a_link_opens_in_the_browser(pane: ChatPane, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr(
        "gui.answer_text.QDesktopServices.openUrl", lambda url: opened.append(url.toString())
    )
    stream(
        pane,
        [("See [the docs](https://example.org/docs) or ", T), ("[this](ftp://example.org/f)", D)],
    )
    pane.finish_answer(make_stats())
    assert pane.answer_text() == "See the docs or this"
    pane.browser.anchorClicked.emit(QUrl("https://example.org/docs"))
    pane.browser.anchorClicked.emit(QUrl("ftp://example.org/f"))
    assert opened == ["https://example.org/docs"]  # only web and mail links leave the app
    cursor = pane.document.find("the docs")
    assert cursor.charFormat().anchorHref() == "https://example.org/docs"


def long_markdown_answer() -> str:
    """A long answer of every kind of block, its code block 240 lines long."""
    code = "\n".join(
        f"def step_{index}(values: list[int]) -> int:  # step {index}\n"
        f'    """Step {index} of the pipeline."""\n'
        f"    return sum(v * {index} for v in values if v % 3 != {index % 3})\n"
        for index in range(60)
    )
    items = "\n".join(
        f"{index}. Item **{index}** with `code` and *emphasis*." for index in range(1, 21)
    )
    rows = "\n".join(f"| {index} | `{index * 3}` | row {index} |" for index in range(12))
    return (
        "# A long answer\n\nIt has prose, a list, a table and a long code block.\n\n"
        f"{items}\n\n```python\n{code}\n```\n\n| n | code | text |\n|---|---|---|\n{rows}\n\n"
        "## Done\n\nThat is **all**."
    )


def test_a_long_markdown_answer_with_code_never_stalls_the_event_loop(
    pane: ChatPane, qtbot: QtBot
) -> None:
    source = long_markdown_answer()
    pairs = [(source[i : i + 4], D if i % 12 else T) for i in range(0, len(source), 4)]
    feed = iter(range(0, len(pairs), 4))
    pane.begin_answer("auto")
    done: list[bool] = []

    def feed_tokens() -> None:  # about 400 tokens a second, as a fast CPU pair gives
        start = next(feed, None)
        if start is None:
            feeder.stop()
            pane.finish_answer(make_stats())
            done.append(True)
            return
        pane.append_tokens(tokens(pairs[start : start + 4]))

    feeder = QTimer()
    feeder.setInterval(10)
    feeder.timeout.connect(feed_tokens)
    clock = QElapsedTimer()
    thread_clock = ThreadClock()
    gaps: list[tuple[int, float]] = []
    waited_before = thread_clock.waited_ns()

    def tick() -> None:
        nonlocal waited_before
        waited_now = thread_clock.waited_ns()
        gaps.append((clock.restart(), (waited_now - waited_before) / 1e6))
        waited_before = waited_now

    ticker = QTimer()
    ticker.setInterval(5)
    ticker.timeout.connect(tick)
    # As the app does after startup (gui/app.py): what exists now is never collected, so a
    # full collection does not scan the test runner's own objects.
    gc.freeze()
    clock.start()
    ticker.start()
    feeder.start()
    try:
        qtbot.waitUntil(lambda: bool(done), timeout=60_000)
    finally:
        ticker.stop()
        feeder.stop()
        thread_clock.close()
        gc.unfreeze()
    assert pane.answer_source() == source
    assert pane.answer_text() == shown_text(pairs)
    assert len(pane.browser.code_boxes()) == 1
    wall, waited = max(gaps[1:], key=lambda gap: gap[0] - gap[1])
    print(f"longest stall of the GUI thread's own: {wall - waited:.0f} ms over {len(gaps)} ticks")
    assert wall - waited < MAX_EVENT_LOOP_STALL_MS, (
        f"the GUI thread held its event loop for {wall - waited:.0f} ms ({wall} ms gap)"
    )


def test_the_last_code_block_is_copied_by_its_own_command(pane: ChatPane) -> None:
    assert pane.copy_last_code_block() is None  # no code yet
    stream(pane, [("```sh\nls -l\n```\n\n", T), ("```python\nprint(1)\nprint(2)\n```", D)])
    pane.finish_answer(make_stats())
    assert pane.copy_last_code_block() == "print(1)\nprint(2)"
    assert QGuiApplication.clipboard().text() == "print(1)\nprint(2)"


def test_alternatives_show_a_switcher_and_user_messages_can_be_edited(
    pane: ChatPane, qtbot: QtBot
) -> None:
    records = [
        MessageRecord(role="user", content="Name a colour", message_id=1, branch=(2, 2)),
        MessageRecord(role="assistant", content="Red", message_id=2, branch=(1, 3), method="auto"),
    ]
    pane.set_messages(records)
    assert pane.branch_switcher_text(0) == "‹ 2/2 ›"
    assert pane.branch_switcher_text(1) == "‹ 1/3 ›"
    assert "Assistant · auto   ‹ 1/3 ›" in pane.document.toPlainText()
    # The arrows are links (the first alternative has no ‹); a click asks for the step.
    cursor = pane.document.find("›", pane.document.find("1/3").position())
    assert cursor.charFormat().anchorHref() == pane.branch_link(2, +1).toString()
    cursor = pane.document.find("‹", pane.document.find("Assistant").position())
    assert not cursor.charFormat().isAnchor()
    with qtbot.waitSignal(pane.branch_requested) as asked:
        pane.browser.anchorClicked.emit(pane.branch_link(2, +1))
    assert asked.args == [2, 1]
    # A right click on a user message offers to edit it.
    menu = pane.context_menu(point_inside(pane, "Name a colour"))
    actions = {action.text(): action for action in menu.actions()}
    with qtbot.waitSignal(pane.edit_requested) as edit:
        actions["Edit and send again"].trigger()
    assert edit.args == [1, "Name a colour"]
    menu.deleteLater()
    assert "Edit and send again" not in [
        a.text() for a in pane.context_menu(point_inside(pane, "Red")).actions()
    ]


def test_the_footer_says_how_many_messages_were_left_out(pane: ChatPane) -> None:
    stream(pane, MIXED)
    pane.finish_answer(make_stats(dropped_messages=4))
    assert pane.footer_text().endswith("4 earlier messages left out to fit the context")


def test_a_line_says_where_the_last_answers_context_left_messages_out(pane: ChatPane) -> None:
    exchanges = [("First question", "First answer"), ("Second", "Two"), ("Third", "Three")]
    records = []
    for number, (question, reply) in enumerate(exchanges):
        records.append(MessageRecord("user", question, message_id=2 * number + 1))
        records.append(MessageRecord("assistant", reply, message_id=2 * number + 2))
    pane.set_messages(records)
    pane.append_user_message("Fourth", message_id=7)
    stream(pane, [("Four", T)])
    pane.finish_answer(make_stats(dropped_messages=2), left_out=[3, 4])
    shown = pane.document.toPlainText()
    note = left_out_note(2)
    assert shown.index("First answer") < shown.index(note) < shown.index("Second")
    assert pane.records()[-1].extra["left_out"] == [3, 4]
    # The next answer left nothing out: the note goes.
    pane.append_user_message("Fifth", message_id=9)
    stream(pane, [("Five", T)])
    pane.finish_answer(make_stats())
    assert "left out of the last answer's context" not in pane.document.toPlainText()
    assert pane.answer_source() == "Five"
    # A stored chat whose last answer left messages out shows the note where they begin.
    stored = [*records, MessageRecord("assistant", "Again", extra={"left_out": [1, 2, 3]})]
    pane.set_messages(stored)
    shown = pane.document.toPlainText()
    assert shown.index(left_out_note(3)) < shown.index("First question")
    assert left_out_note(3).startswith("The next 3 messages were left out")
    assert left_out_note(1).startswith("The next 1 message was left out")
