"""The acceptance meter: recent-window math, states, and texts shown only after a repaint."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from backends.speculation.types import SpeculationStats
from gui.meter import RECENT_ROUNDS, AcceptanceMeter, RecentWindow
from gui.meter_painting import PositionBars

if TYPE_CHECKING:
    from pytestqt.qtbot import QtBot

NO_COUNTS = "Drafted — · accepted — · rejected — · ignored —"


class SnapshotBuilder:
    """Cumulative stats, as the speculative loop reports them, built round by round."""

    def __init__(self) -> None:
        self.stats = SpeculationStats()

    def rounds(self, count: int, drafted: int, accepted: int) -> SpeculationStats:
        """``count`` more rounds with ``drafted`` / ``accepted`` tokens in all; a snapshot."""
        stats = self.stats
        stats.rounds += count
        stats.total_draft_tokens_count += drafted
        stats.accepted_draft_tokens_count += accepted
        stats.rejected_draft_tokens_count += drafted - accepted
        stats.generated_tokens += accepted + count
        stats.generation_seconds += 0.025 * count
        stats.total_seconds = stats.generation_seconds + 0.2
        stats.rounds_by_method["ngram-simple" if drafted else "none"] = (
            stats.rounds_by_method.get("ngram-simple" if drafted else "none", 0) + count
        )
        return stats.snapshot()


@pytest.fixture
def meter(qtbot: QtBot) -> AcceptanceMeter:
    widget = AcceptanceMeter()
    qtbot.addWidget(widget)
    return widget


def test_recent_acceptance_covers_only_the_last_16_rounds(meter: AcceptanceMeter) -> None:
    builder = SnapshotBuilder()
    meter.start("auto · drafting")
    for _ in range(4):
        meter.update_stats(builder.rounds(1, drafted=3, accepted=0))
    for _ in range(16):
        last = builder.rounds(1, drafted=4, accepted=3)
        meter.update_stats(last)

    assert RECENT_ROUNDS == 16
    assert meter.recent_acceptance == pytest.approx(48 / 64)
    assert meter.overall_acceptance == pytest.approx(48 / 76)
    assert meter.overall_acceptance == last.acceptance_rate


def test_an_update_of_several_rounds_counts_them_all(meter: AcceptanceMeter) -> None:
    builder = SnapshotBuilder()
    meter.start("auto")
    meter.update_stats(builder.rounds(10, drafted=30, accepted=30))
    meter.update_stats(builder.rounds(16, drafted=32, accepted=8))

    assert meter.recent_acceptance == pytest.approx(8 / 32)


def test_an_update_straddling_the_window_contributes_its_share() -> None:
    builder = SnapshotBuilder()
    window = RecentWindow(16)
    window.add(builder.rounds(10, drafted=20, accepted=20))
    window.add(builder.rounds(10, drafted=20, accepted=0))

    # All of the newest 10 rounds, and 6 of the 10 rounds before them.
    assert window.acceptance() == pytest.approx(12 / 32)


def test_rounds_without_drafting_push_drafted_rounds_out(meter: AcceptanceMeter) -> None:
    builder = SnapshotBuilder()
    meter.start("auto")
    for _ in range(10):
        meter.update_stats(builder.rounds(1, drafted=4, accepted=2))
    for _ in range(10):
        meter.update_stats(builder.rounds(1, drafted=0, accepted=0))
    assert meter.recent_acceptance == pytest.approx(0.5)

    for _ in range(6):
        meter.update_stats(builder.rounds(1, drafted=0, accepted=0))
    assert meter.recent_acceptance is None
    assert meter.overall_acceptance == pytest.approx(0.5)

    meter.update_stats(builder.rounds(1, drafted=4, accepted=1))
    assert meter.recent_acceptance == pytest.approx(0.25)


def test_counts_going_backwards_start_a_new_window(meter: AcceptanceMeter) -> None:
    first = SnapshotBuilder()
    meter.start("auto")
    meter.update_stats(first.rounds(30, drafted=60, accepted=60))
    second = SnapshotBuilder()
    meter.update_stats(second.rounds(2, drafted=4, accepted=1))

    assert meter.recent_acceptance == pytest.approx(0.25)


def test_texts_change_only_on_the_repaint_timer(qtbot: QtBot, meter: AcceptanceMeter) -> None:
    builder = SnapshotBuilder()
    meter.start("auto · drafting")
    for _ in range(20):
        stats = builder.rounds(1, drafted=5, accepted=4)
        meter.update_stats(stats)

    assert meter.value_texts()["recent"] == "—"
    assert meter.value_texts()["counts"] == NO_COUNTS

    qtbot.waitUntil(lambda: meter.value_texts()["recent"] == "80%", timeout=2000)
    texts = meter.value_texts()
    assert stats.acceptance_rate == pytest.approx(0.8)
    assert texts["overall"] == "80%"
    assert texts["speed"] == f"{stats.tokens_per_second:.1f} tok/s"
    assert texts["counts"] == (
        f"Drafted {stats.total_draft_tokens_count} · "
        f"accepted {stats.accepted_draft_tokens_count} · "
        f"rejected {stats.rejected_draft_tokens_count} · "
        f"ignored {stats.ignored_draft_tokens_count}"
    )
    assert meter.tokens_per_second == stats.tokens_per_second


def test_states_and_captions(qtbot: QtBot, meter: AcceptanceMeter) -> None:
    states = [meter.state]
    assert meter.value_texts()["caption"] == "Idle: nothing is generating"

    meter.start("auto · drafting")
    states.append(meter.state)
    assert meter.value_texts()["caption"] == "auto · drafting"
    meter.prompt_started(1234)
    assert meter.value_texts()["caption"] == "auto · drafting · reading the prompt (1,234 tokens)…"

    builder = SnapshotBuilder()
    meter.update_stats(builder.rounds(5, drafted=10, accepted=5))
    # The first tokens end the wait: the caption is the method again on the next repaint.
    qtbot.waitUntil(lambda: meter.value_texts()["caption"] == "auto · drafting")
    final = builder.rounds(5, drafted=10, accepted=9)
    final.stop_reason = "eos"
    meter.finish(final)
    states.append(meter.state)
    texts = meter.value_texts()
    # finish() shows the final values at once, without waiting for the timer.
    assert texts["caption"].startswith("last answer")
    assert texts["overall"] == "70%"
    assert texts["recent"] == "70%"
    assert texts["speed"] == f"{final.tokens_per_second:.1f} tok/s"

    meter.reset()
    states.append(meter.state)
    assert states == ["idle", "running", "done", "idle"]
    assert meter.recent_acceptance is None
    assert meter.overall_acceptance is None
    assert meter.tokens_per_second == 0.0
    assert meter.position_acceptance == []
    texts = meter.value_texts()
    assert texts["caption"] == "Idle: nothing is generating"
    assert texts["recent"] == "—"
    assert texts["overall"] == "—"
    assert texts["speed"] == "—"
    assert texts["positions"] == ""
    assert texts["counts"] == NO_COUNTS


def test_start_drops_the_previous_answers_numbers(meter: AcceptanceMeter) -> None:
    builder = SnapshotBuilder()
    meter.start("auto")
    meter.finish(builder.rounds(20, drafted=40, accepted=10))
    assert meter.value_texts()["overall"] == "25%"

    meter.start("auto")
    assert meter.recent_acceptance is None
    assert meter.value_texts()["overall"] == "—"
    assert meter.value_texts()["counts"] == NO_COUNTS


def test_position_bars_follow_the_stats(qtbot: QtBot, meter: AcceptanceMeter) -> None:
    stats = SpeculationStats(
        generated_tokens=40,
        rounds=12,
        total_draft_tokens_count=30,
        accepted_draft_tokens_count=21,
        rejected_draft_tokens_count=9,
        verified_at_position=[10, 8, 0],
        accepted_at_position=[9, 4, 0],
        generation_seconds=1.0,
    )
    meter.start("auto")
    meter.update_stats(stats)
    assert meter.position_acceptance == [0.9, 0.5, None]
    qtbot.waitUntil(lambda: meter.value_texts()["positions"] != "No drafts yet", timeout=2000)

    assert meter.value_texts()["positions"] == "pos 1 90% · pos 2 50% · pos 3 —"
    bars = meter.findChild(PositionBars)
    assert bars is not None
    assert bars.values() == [0.9, 0.5, None]


def test_method_share_shown_only_for_several_methods(meter: AcceptanceMeter) -> None:
    meter.start("auto")
    meter.finish(SpeculationStats(rounds=10, rounds_by_method={"none": 10}))
    assert meter.value_texts()["methods"] == ""

    meter.start("auto")
    meter.finish(
        SpeculationStats(
            rounds=10,
            total_draft_tokens_count=12,
            rounds_by_method={"none": 4, "ngram-simple": 6},
        )
    )
    assert meter.value_texts()["methods"] == "Rounds: n-gram 60% · none 40%"


def test_the_grammar_s_tokens_are_counted_only_in_answers_with_a_grammar(
    meter: AcceptanceMeter,
) -> None:
    meter.start("auto")
    meter.finish(SpeculationStats(rounds=4, total_draft_tokens_count=6, grammar_tokens_count=0))
    assert "grammar" not in meter.value_texts()["counts"]
    meter.start("auto")
    meter.finish(
        SpeculationStats(
            rounds=4,
            total_draft_tokens_count=6,
            accepted_draft_tokens_count=5,
            rejected_draft_tokens_count=1,
            grammar_tokens_count=9,
        )
    )
    assert meter.value_texts()["counts"] == (
        "Drafted 6 · accepted 5 · rejected 1 · ignored 0 · grammar 9"
    )
    meter.reset()
    assert meter.value_texts()["counts"] == NO_COUNTS
