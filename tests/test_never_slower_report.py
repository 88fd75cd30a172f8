"""The never-slower benchmark's accounting: each method's pace and the seconds it won or lost."""

from __future__ import annotations

import pytest

from benchmarks.never_slower import MethodTime, PromptRuns, format_time_table


def test_a_method_slower_than_plain_shows_its_loss() -> None:
    lookups = MethodTime()
    lookups.add(10, 1.5, 0.1)  # 10 tokens in 1.5 s where plain takes 0.1 s a token
    plain = MethodTime()
    plain.add(30, 3.3, 0.1)  # auto's own plain rounds, a little slower than plain decoding
    assert lookups.pace == pytest.approx(1.0 / 1.5)
    assert plain.pace == pytest.approx(3.0 / 3.3)
    runs = PromptRuns(
        "prose", "prose", (0.9,), (0.1,), (1.0,), True, {"ngram-mod": lookups, "none": plain}, 2
    )
    table = format_time_table([runs]).splitlines()
    assert table[3] == "| prose | none | 75% | 0.91× | -0.15 s |"
    assert table[4] == "| prose | ngram-mod | 25% | 0.67× | -0.25 s |"
    assert MethodTime().pace == 0.0
