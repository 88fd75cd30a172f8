"""Light and dark: the palette, restyled labels, and the chat rendered again in the new colours."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from pygments.styles import get_style_by_name
from pygments.token import Keyword
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QLabel

from backends.models.draft_verdict import draft_verdict
from backends.models.gguf_info import read_model_info
from backends.speculation.types import TokenOrigin
from gui.chat_pane import ChatPane
from gui.main_window import MainWindow
from gui.settings import AppSettings
from gui.style import DARK, LIGHT, colours
from gui.theme import MUTED_TEXT_STYLE, apply_theme, colours_for, keep_styled, text_colour
from gui.tuning_dialog import TuningDialog
from tests.gui.test_chat_pane import CODE_ANSWER, answer_formats, stream

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pytestqt.qtbot import QtBot


def application() -> QApplication:
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    return app


@pytest.fixture(autouse=True)
def light_afterwards(qapp: QApplication) -> Iterator[None]:
    """Every other test sees the light colours and the app's own palette again."""
    yield
    apply_theme(qapp, "light")


def keyword_colour(style_name: str) -> str:
    colour = get_style_by_name(style_name).style_for_token(Keyword)["color"]
    assert colour, style_name
    return f"#{colour}"


def test_a_text_colour_must_name_one_of_the_colours() -> None:
    assert text_colour("muted_text")(DARK) == f"color: {DARK.muted_text.name()};"
    assert text_colour("good", "font-weight: bold;")(LIGHT).endswith(" font-weight: bold;")
    with pytest.raises(ValueError, match="no colour named 'purple'"):
        text_colour("purple")
    with pytest.raises(ValueError, match="no colour named 'code_style'"):
        text_colour("code_style")  # a field, but not a colour


def test_system_means_light_where_the_desktop_does_not_say() -> None:
    # The offscreen platform reports no colour scheme.
    assert colours_for("system") is LIGHT
    assert colours_for("dark") is DARK
    assert colours_for("light") is LIGHT


def test_dark_recolours_the_palette_and_kept_styles_and_light_restores_them(
    qtbot: QtBot,
) -> None:
    app = application()
    apply_theme(app, "light")
    light_window = app.palette().color(QPalette.ColorRole.Window)
    label = QLabel("a caption")
    qtbot.addWidget(label)
    keep_styled(label, MUTED_TEXT_STYLE)
    assert LIGHT.muted_text.name() in label.styleSheet()

    assert apply_theme(app, "dark") is True
    assert colours() is DARK
    assert app.palette().color(QPalette.ColorRole.Window).lightness() < 60
    assert app.palette().color(QPalette.ColorRole.Text).lightness() > 200
    assert DARK.muted_text.name() in label.styleSheet()
    assert apply_theme(app, "dark") is False  # nothing changed

    assert apply_theme(app, "light") is True
    assert app.palette().color(QPalette.ColorRole.Window) == light_window
    assert LIGHT.muted_text.name() in label.styleSheet()


def test_the_chat_is_rendered_again_in_dark_with_the_draft_green_kept_under_the_code_colours(
    qtbot: QtBot,
) -> None:
    pane = ChatPane()
    qtbot.addWidget(pane)
    pane.resize(900, 700)
    pane.show()
    pane.append_user_message("Add two numbers")
    stream(pane, CODE_ANSWER)
    pane.finish_answer(None)
    light_origins, light_text = pane.answer_origins(), pane.answer_text()
    assert any(origin is TokenOrigin.DRAFT for _text, origin in light_origins)
    light_def = answer_formats(pane, "def")[0]
    assert light_def.foreground().color().name() == keyword_colour(LIGHT.code_style)
    assert light_def.background().color() == LIGHT.draft_background_in_code

    apply_theme(application(), "dark")
    pane.rerender()
    dark_def = answer_formats(pane, "def")[0]
    assert keyword_colour(DARK.code_style) != keyword_colour(LIGHT.code_style)
    assert dark_def.foreground().color().name() == keyword_colour(DARK.code_style)
    assert dark_def.background().color() == DARK.draft_background_in_code
    # What is read back does not depend on the colours.
    assert pane.answer_origins() == light_origins
    assert pane.answer_text() == light_text


def test_the_theme_setting_switches_the_window_at_once(qtbot: QtBot) -> None:
    settings = AppSettings()
    window = MainWindow(settings, offer_first_run=False)
    qtbot.addWidget(window)
    window.chat.append_user_message("Add two numbers")
    stream(window.chat, CODE_ANSWER)
    window.chat.finish_answer(None)
    assert colours() is LIGHT

    settings.set("theme", "dark")
    assert colours() is DARK
    assert answer_formats(window.chat, "def")[0].background().color() == (
        DARK.draft_background_in_code
    )
    assert application().palette().color(QPalette.ColorRole.Base) == DARK.answer_background

    # No widget keeps a style sheet written in the light colours.
    light_only = {
        getattr(LIGHT, name).name()
        for name in vars(LIGHT)
        if isinstance(getattr(LIGHT, name), QColor)
        and getattr(LIGHT, name).name()
        not in {
            getattr(DARK, other).name()
            for other in vars(DARK)
            if isinstance(getattr(DARK, other), QColor)
        }
    }
    for widget in QApplication.allWidgets():
        sheet = widget.styleSheet()
        stale = [colour for colour in light_only if colour in sheet]
        assert not stale, (widget.objectName() or type(widget).__name__, stale)

    settings.set("theme", "system")
    assert colours() is LIGHT
    assert answer_formats(window.chat, "def")[0].background().color() == (
        LIGHT.draft_background_in_code
    )


def test_the_fastest_setup_dialog_marks_its_drafts_again_in_the_new_colours(
    qtbot: QtBot, smollm_path: Path, tmp_path: Path
) -> None:
    """A draft that can draft is marked in the draft's colour, light or dark, after a switch."""
    main = read_model_info(smollm_path)
    twin = tmp_path / "twin.gguf"  # the same file under another name: it can draft
    twin.symlink_to(smollm_path)
    verdicts = [draft_verdict(main, read_model_info(twin))]
    assert verdicts[0].can_draft
    dialog = TuningDialog()
    qtbot.addWidget(dialog)
    dialog.set_context(main.display_name, "the suite's 3 prompts", verdicts)

    def marked() -> QColor:
        cell = dialog.drafts.item(0, 1)
        assert cell is not None
        return cell.background().color()

    assert marked() == LIGHT.draft_background
    apply_theme(application(), "dark")
    dialog.recolour()
    assert marked() == DARK.draft_background
