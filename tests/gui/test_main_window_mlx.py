"""The whole window on the MLX engine: SmolLM2-135M imported into MLX as main and draft model."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install '.[mlx-cpu]')")

from backends.speculation.types import TokenOrigin
from gui.settings import AppSettings
from tests.gui.conftest import shown_on, shown_text
from tests.gui.test_main_window import QUESTION, _ask, _open_window, _Recorder

if TYPE_CHECKING:
    from pathlib import Path

    from pytestqt.qtbot import QtBot


@pytest.mark.heavy
def test_mlx_answer_highlights_drafts_and_compares_like_llama_cpp(
    qtbot: QtBot, smollm_mlx: Path
) -> None:
    settings = AppSettings()
    settings.set("engine", "mlx")
    settings.set("extra_model_folders", str(smollm_mlx.parent))
    settings.set("last_main_path", str(smollm_mlx))
    settings.set("last_draft_choice", str(smollm_mlx))
    settings.set("speculation_method", "draft-model")  # every round drafts, so highlights exist
    settings.set("context_size", 1024)
    settings.set("max_tokens", 32)
    settings.set("compare", True)
    window = _open_window(qtbot, settings)
    try:
        placement = window.sidebar.placement_text().splitlines()
        assert placement[0].startswith("Main: MLX")
        assert placement[1].startswith("Draft: MLX")
        assert len(placement) == len(set(placement))
        recorder = _Recorder(window)
        assert _ask(qtbot, window, QUESTION) == "complete"
        stats = recorder.stats
        assert stats is not None
        assert stats.accepted_draft_tokens_count > 0
        text = "".join(token.text for token in recorder.tokens)
        assert "def" in text
        pairs = [(token.text, token.origin) for token in recorder.tokens]
        assert window.chat.answer_source() == text
        assert window.chat.highlighted_text() == shown_on(pairs, TokenOrigin.DRAFT)
        assert window.meter.overall_acceptance == pytest.approx(stats.acceptance_rate)
        # Speculative and plain decoding on MLX give one text at temperature 0.
        assert window.compare_view.column_text("speculative") == shown_text(pairs)
        assert window.compare_view.column_text("plain") == shown_text(pairs)
        assert window.compare_view.badge_text() == "Identical text"
    finally:
        window.shutdown()
