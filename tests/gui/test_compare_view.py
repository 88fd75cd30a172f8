"""The comparison view: two columns, draft highlighting, speeds, the speedup and the badge."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from PySide6.QtCore import QEvent, QPoint
from PySide6.QtGui import QFontInfo, QHelpEvent
from PySide6.QtWidgets import QApplication, QLabel, QToolTip

from backends.speculation.types import EmittedToken, SpeculationStats, TokenOrigin
from gui.answer_text import CODE_PADDING, AnswerBrowser, is_code_line
from gui.compare_view import GRAMMAR_LEGEND_TEXT, LEGEND_OFF_TEXT, LEGEND_TEXT, CompareView
from gui.style import DRAFT_TOOLTIP, GRAMMAR_TOOLTIP, colours

if TYPE_CHECKING:
    from pytestqt.qtbot import QtBot

D = TokenOrigin.DRAFT
T = TokenOrigin.TARGET


def tokens(*pieces: tuple[str, TokenOrigin]) -> list[EmittedToken]:
    return [EmittedToken(index, text, origin) for index, (text, origin) in enumerate(pieces)]


SPEC_TOKENS = tokens(("The", T), (" quick", D), (" brown", D), (" fox", T), (" jumps", D))
PLAIN_TOKENS = tokens(("The", T), (" quick", T), (" brown", T), (" fox", T), (" jumps", T))
ANSWER = "The quick brown fox jumps"


def stats(generated: int, seconds: float, drafted: int = 0, accepted: int = 0) -> SpeculationStats:
    return SpeculationStats(
        generated_tokens=generated,
        rounds=generated - accepted,
        total_draft_tokens_count=drafted,
        accepted_draft_tokens_count=accepted,
        rejected_draft_tokens_count=drafted - accepted,
        generation_seconds=seconds,
        total_seconds=seconds + 0.5,
    )


@pytest.fixture
def view(qtbot: QtBot) -> CompareView:
    widget = CompareView()
    qtbot.addWidget(widget)
    widget.begin("auto · n-gram")
    return widget


def test_begin_sets_headers_and_the_plain_column_waits(view: CompareView) -> None:
    assert view.column_title_text("speculative") == "Speculative · auto · n-gram"
    assert view.column_title_text("plain") == "Main model alone"
    assert view.column_status_text("plain") == "waiting…"
    assert view.column_text("speculative") == ""
    assert view.column_text("plain") == ""
    assert view.speedup_text() == ""
    assert view.badge_text() == ""


def test_tokens_reach_their_own_column_on_the_flush_timer(qtbot: QtBot, view: CompareView) -> None:
    view.append_tokens("speculative", SPEC_TOKENS[:3])
    view.append_tokens("speculative", SPEC_TOKENS[3:])
    assert view.column_text("speculative") == ""

    qtbot.waitUntil(lambda: view.column_text("speculative") == ANSWER, timeout=2000)
    assert view.column_text("plain") == ""
    assert view.column_status_text("plain") == "waiting…"

    view.finish_run("speculative", stats(5, 1.0, drafted=4, accepted=3))
    view.append_tokens("plain", PLAIN_TOKENS)
    assert view.column_status_text("plain") != "waiting…"
    qtbot.waitUntil(lambda: view.column_text("plain") == ANSWER, timeout=2000)
    assert view.column_text("speculative") == ANSWER


def test_only_draft_tokens_of_the_speculative_column_are_green(
    qtbot: QtBot, view: CompareView
) -> None:
    view.append_tokens("speculative", SPEC_TOKENS)
    # Even if a plain run reported drafted tokens, its column marks nothing.
    view.append_tokens("plain", SPEC_TOKENS)
    qtbot.waitUntil(lambda: view.column_text("plain") == ANSWER, timeout=2000)

    assert view.highlighted_text() == " quick brown jumps"
    assert view.highlighted_text("plain") == ""


def test_visualize_drafts_off_and_on_again(qtbot: QtBot, view: CompareView) -> None:
    view.append_tokens("speculative", SPEC_TOKENS)
    qtbot.waitUntil(lambda: view.column_text("speculative") == ANSWER, timeout=2000)

    view.set_visualize_drafts(False)
    assert view.highlighted_text() == ""
    assert view.column_text("speculative") == ANSWER

    view.set_visualize_drafts(True)
    assert view.highlighted_text() == " quick brown jumps"
    assert view.column_text("speculative") == ANSWER


def answer_browser(view: CompareView, run: str) -> AnswerBrowser:
    browser = view.findChild(AnswerBrowser, f"{run}-answer")
    assert browser is not None
    return browser


def point_inside(browser: AnswerBrowser, needle: str) -> QPoint:
    """A viewport point over the first character of ``needle`` in ``browser``."""
    cursor = browser.document().find(needle)
    assert not cursor.isNull(), needle
    cursor.setPosition(cursor.selectionStart())
    rect = browser.cursorRect(cursor)
    return QPoint(rect.x() + 1, rect.center().y())


def test_fenced_code_gets_a_code_block(qtbot: QtBot, view: CompareView) -> None:
    view.resize(1000, 500)
    view.show()
    view.append_tokens(
        "speculative",
        tokens(("Look:\n```py", T), ("thon\nx = ", T), ("1", D), ("\n```\n", T), ("Done.", T)),
    )
    expected = "Look:\nx = 1\nDone."  # the fences are not shown
    qtbot.waitUntil(lambda: view.column_text("speculative") == expected, timeout=2000)

    browser = answer_browser(view, "speculative")
    code_lines: dict[str, bool] = {}
    block = browser.document().begin()
    while block.isValid():
        code_lines[block.text()] = is_code_line(block)
        block = block.next()
    assert code_lines == {"Look:": False, "x = 1": True, "Done.": False}
    assert view.highlighted_text() == "1"

    mono = QFontInfo(browser.document().find("x = ").charFormat().font())
    assert mono.fixedPitch()
    image = browser.viewport().grab().toImage()
    code = point_inside(browser, "x = ")
    assert image.pixelColor(code.x() - CODE_PADDING // 2, code.y()) == colours().code_background
    prose = point_inside(browser, "Done")
    assert image.pixelColor(prose.x() - CODE_PADDING // 2, prose.y()) != colours().code_background


def assert_tooltip(qtbot: QtBot, browser: AnswerBrowser, needle: str, expected: str) -> None:
    """Hovering the first character of ``needle`` shows ``expected``."""
    viewport = browser.viewport()
    point = point_inside(browser, needle)
    QApplication.sendEvent(
        viewport, QHelpEvent(QEvent.Type.ToolTip, point, viewport.mapToGlobal(point))
    )
    qtbot.waitUntil(lambda: QToolTip.text() == expected, timeout=2000)
    QToolTip.hideText()


def test_columns_tell_token_origins_while_drafts_are_shown(qtbot: QtBot, view: CompareView) -> None:
    view.resize(1000, 500)
    view.show()
    view.append_tokens("speculative", SPEC_TOKENS)
    view.append_tokens("plain", SPEC_TOKENS)
    qtbot.waitUntil(lambda: view.column_text("plain") == ANSWER, timeout=2000)
    speculative = answer_browser(view, "speculative")
    plain = answer_browser(view, "plain")

    assert speculative.origin_at(point_inside(speculative, "quick")) is D
    assert speculative.origin_at(point_inside(speculative, "fox")) is T
    # The main model alone wrote every token of its column, whatever a run reported.
    assert plain.origin_at(point_inside(plain, "quick")) is T

    assert_tooltip(qtbot, speculative, "quick", DRAFT_TOOLTIP)

    view.set_visualize_drafts(False)
    assert not speculative.origin_tooltips()
    assert not plain.origin_tooltips()
    view.set_visualize_drafts(True)
    assert speculative.origin_tooltips()
    assert plain.origin_tooltips()


def test_live_speed_follows_the_repaint_timer(qtbot: QtBot, view: CompareView) -> None:
    live = stats(20, 0.5, drafted=10, accepted=8)
    view.update_stats("speculative", live)
    assert view.column_speed_text("speculative") == ""

    expected = f"{live.tokens_per_second:.1f} tok/s"
    qtbot.waitUntil(lambda: view.column_speed_text("speculative") == expected, timeout=2000)
    assert view.column_speed_text("plain") == ""


def test_finish_run_shows_final_speed_tokens_and_time(view: CompareView) -> None:
    final = stats(120, 3.0, drafted=80, accepted=60)
    view.finish_run("speculative", final)

    assert view.column_speed_text("speculative") == f"{final.tokens_per_second:.1f} tok/s"
    status = view.column_status_text("speculative")
    assert "120 tokens" in status
    assert f"{final.total_seconds:.2f} s" in status
    assert f"{final.tokens_per_second:.1f} tok/s" in status


def test_speedup_for_is_the_ratio_of_speeds() -> None:
    spec = stats(101, 2.0)
    plain = stats(101, 4.0)
    assert spec.speedup_over(plain) == pytest.approx(2.0)
    assert spec.speedup_over(SpeculationStats()) is None


def banner_style(view: CompareView) -> str:
    banner = view.findChild(QLabel, "speedup-banner")
    assert banner is not None
    return banner.styleSheet()


def badge_style(view: CompareView) -> str:
    badge = view.findChild(QLabel, "identical-badge")
    assert badge is not None
    return badge.styleSheet()


def test_speedup_banner_and_identical_badge(view: CompareView) -> None:
    view.set_result(1.42, True)
    assert view.speedup_text() == "1.42× faster with speculation"
    assert colours().good.name() in banner_style(view)
    assert view.badge_text() == "Identical text"
    assert colours().good.name() in badge_style(view)


def test_slower_banner_and_different_badge(view: CompareView) -> None:
    view.set_result(0.91, False)
    assert view.speedup_text() == "0.91×: speculation was slower here"
    assert colours().warn.name() in banner_style(view)
    assert view.badge_text() == "Texts differ"
    assert colours().bad.name() in badge_style(view)


def test_no_badge_when_identity_is_unknown(view: CompareView) -> None:
    view.set_result(1.1, True)
    view.set_result(1.1, None)
    assert view.badge_text() == ""
    assert view.speedup_text() == "1.10× faster with speculation"


def test_begin_clears_the_previous_comparison(qtbot: QtBot, view: CompareView) -> None:
    view.append_tokens("speculative", SPEC_TOKENS)
    view.finish_run("speculative", stats(5, 1.0))
    view.set_result(1.3, True)

    view.begin("auto")
    assert view.column_text("speculative") == ""
    assert view.column_speed_text("speculative") == ""
    assert view.speedup_text() == ""
    assert view.badge_text() == ""
    assert view.column_status_text("plain") == "waiting…"


def test_cancel_marks_unfinished_columns_stopped(qtbot: QtBot, view: CompareView) -> None:
    view.append_tokens("speculative", SPEC_TOKENS)
    view.finish_run("speculative", stats(5, 1.0))
    view.append_tokens("plain", PLAIN_TOKENS[:2])

    view.cancel()
    assert view.column_status_text("plain").startswith("stopped")
    assert not view.column_status_text("speculative").startswith("stopped")
    # Tokens that arrived before the cancel are still shown.
    assert view.column_text("plain") == "The quick"


def test_cancel_before_the_plain_run_stops_both(view: CompareView) -> None:
    view.append_tokens("speculative", SPEC_TOKENS[:1])
    view.cancel()
    assert view.column_status_text("speculative").startswith("stopped")
    assert view.column_status_text("plain").startswith("stopped")
    assert view.column_text("speculative") == "The"


def test_grammar_tokens_are_blue_tell_their_origin_and_join_the_legend(
    qtbot: QtBot, view: CompareView
) -> None:
    g = TokenOrigin.GRAMMAR
    view.resize(1000, 500)
    view.show()
    legend = view.findChild(QLabel, "speculative-subtitle")
    assert legend is not None
    assert legend.text() == LEGEND_TEXT
    view.append_tokens("speculative", tokens(('{"', g), ("name", g), ('":"', g), ("Ada", D)))
    view.update_stats("speculative", SpeculationStats(generated_tokens=4, grammar_tokens_count=3))
    qtbot.waitUntil(lambda: view.column_text("speculative") == '{"name":"Ada', timeout=2000)
    speculative = answer_browser(view, "speculative")
    assert view.highlighted_text() == "Ada"  # the draft's green
    cursor = speculative.document().find("name")
    assert cursor.charFormat().background().color() == colours().grammar_background
    assert speculative.origin_at(point_inside(speculative, "name")) is g
    assert_tooltip(qtbot, speculative, "name", GRAMMAR_TOOLTIP)
    assert legend.text() == GRAMMAR_LEGEND_TEXT
    view.set_visualize_drafts(False)
    assert legend.text() == LEGEND_OFF_TEXT
    assert speculative.document().find("name").charFormat().background().color() != (
        colours().grammar_background
    )
    view.set_visualize_drafts(True)
    view.begin("auto")  # the next answer: no grammar until its stats say so
    assert legend.text() == LEGEND_TEXT
