"""Batch costs that noise cannot fool: interleaved, repeated, medians, outliers dropped."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from backends.speculation.estimates import (
    CALIBRATION_ROUNDS,
    CALIBRATION_SIZES,
    OUTLIER_RATIO,
    BatchCosts,
    ceiling_line,
    sizes_within_budget,
    speedup_ceiling,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.llama import LlamaEngine


def test_timings_become_medians_without_their_outliers_and_say_how_sure() -> None:
    costs = BatchCosts.from_timings({1: [0.050, 0.052, 0.400], 4: [0.100, 0.110, 0.090]})
    assert costs.seconds == {1: pytest.approx(0.051), 4: pytest.approx(0.100)}
    assert costs.dropped == 1  # the 0.4 s pass: a neighbour's burst
    assert costs.spread[4] == pytest.approx(0.10)  # 90..110 ms around 100: ±10 %
    assert costs.rounds == 3
    assert costs.sureness() == "median of 3 interleaved rounds, within ±10%, 1 outlier dropped"
    assert "1: 51.0 ms" in costs.describe()
    assert costs.table_ms() == {"1": 51.0, "4": 100.0}


def test_a_stolen_slice_during_generation_moves_the_estimate_only_a_little() -> None:
    costs = BatchCosts({1: 0.050})
    costs.observe(1, 1.0)  # twenty times the estimate
    assert costs.seconds[1] == pytest.approx(0.050 * (1 + 0.25 * (OUTLIER_RATIO - 1)))
    assert costs.clipped == 1
    for _ in range(40):  # a machine that really got twice as slow: followed within passes
        costs.observe(1, 0.100)
    assert costs.seconds[1] == pytest.approx(0.100, rel=0.01)
    frozen = costs.snapshot()
    costs.observe(1, 0.050)
    assert frozen.seconds[1] == pytest.approx(0.100, rel=0.01)  # a snapshot does not move


class _Recorded:
    """A real engine whose passes are recorded, one of them made slow on purpose."""

    def __init__(self, engine: LlamaEngine, slow_pass: int, slow_seconds: float) -> None:
        self.engine = engine
        self.sizes: list[int] = []
        self._slow_pass, self._slow_seconds = slow_pass, slow_seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> Any:
        self.sizes.append(len(tokens))
        if len(self.sizes) == self._slow_pass:
            time.sleep(self._slow_seconds)
        return self.engine.evaluate(tokens, n_logits)


def test_calibration_interleaves_its_rounds_and_drops_a_stolen_slice(
    smollm_target: LlamaEngine,
) -> None:
    sizes = (1, 2, 4)
    clean = BatchCosts.calibrate(smollm_target, sizes)
    # Pass 1 reads the prefix, pass 2 pages the weights in; pass 4 is round 1's size 2.
    recorded = _Recorded(smollm_target, slow_pass=4, slow_seconds=0.5)
    noisy = BatchCosts.calibrate(recorded, sizes)
    timed = recorded.sizes[2:]
    assert len(timed) == CALIBRATION_ROUNDS * len(sizes)
    rounds = [timed[i : i + len(sizes)] for i in range(0, len(timed), len(sizes))]
    assert rounds[:3] == [[1, 2, 4], [2, 4, 1], [4, 1, 2]]  # each round starts elsewhere
    assert noisy.dropped >= 1
    assert noisy.seconds[2] < clean.seconds[2] + 0.25  # the half second did not get in
    assert noisy.rounds == CALIBRATION_ROUNDS
    assert list(smollm_target.cached_tokens) == []


def test_the_ceiling_is_the_best_round_at_full_acceptance() -> None:
    # Batches priced like the AVX2 EPYC of issue 33: 55 / 73 / 82 / 103 / 173 / 349 ms.
    target = BatchCosts({1: 0.055, 2: 0.073, 3: 0.082, 4: 0.103, 8: 0.173, 16: 0.349})
    steps = [target.cost(size) / target.cost(1) for size in range(1, 18)]
    lookup = speedup_ceiling(lambda rows: steps[rows - 1])
    assert lookup == pytest.approx(max((k + 1) / steps[k] for k in range(1, 17)))
    assert 2.0 < lookup < 2.8
    draft = BatchCosts({1: 0.022})  # a draft step 40 % of the main model's
    with_draft = speedup_ceiling(lambda rows: steps[rows - 1], 0.4)
    assert with_draft < lookup
    line = ceiling_line(target, draft, "0.5B", "on this CPU")
    assert line == (
        f"at best on this CPU: {lookup:.2f}× where the text is copied (lookups), "
        f"{with_draft:.2f}× with the 0.5B draft (a step 40% of the main model's), "
        "every drafted token accepted"
    )
    # Where a batch costs what one token does (a GPU), the draft's step is what limits.
    flat = speedup_ceiling(lambda rows: 1.0, 0.4)
    assert flat == pytest.approx(17 / (16 * 0.4 + 1))
    assert ceiling_line(BatchCosts(), None) is None


def test_a_budget_cuts_rounds_first_then_sizes() -> None:
    # Estimated on the line from 1 s (size 1) to 4 s (size 4): a round of 1, 2, 4 takes 7 s.
    assert sizes_within_budget((1, 2, 4), 3, 1.0, 4.0, 30.0) == ([1, 2, 4], 3)
    assert sizes_within_budget((1, 2, 4), 3, 1.0, 4.0, 15.0) == ([1, 2, 4], 2)
    assert sizes_within_budget((1, 2, 4), 3, 1.0, 4.0, 7.0) == ([1, 2, 4], 1)
    assert sizes_within_budget((1, 2, 4), 3, 1.0, 4.0, 6.0) == ([1, 4], 1)
    assert sizes_within_budget((1, 2, 4), 3, 1.0, 4.0, 1.0) == ([1, 4], 1)  # never fewer
    # The default sizes on a device where 16 tokens cost 16 steps: 4 and 8 before 2.
    assert sizes_within_budget(CALIBRATION_SIZES, 3, 1.0, 16.0, 30.0) == ([1, 4, 8, 16], 1)


class _SlowDevice(_Recorded):
    """A real engine on a pretend slow device: a pass of n tokens takes 0.1·n s in all.

    Its real work is done within that time and the rest slept, so a stolen slice of the
    machine (under 0.1 s) moves no pass's time; the budget's decisions below then have
    0.1 s of margin on either side.
    """

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> Any:
        self.sizes.append(len(tokens))
        end = time.perf_counter() + 0.1 * len(tokens)
        rows = self.engine.evaluate(tokens, n_logits)
        time.sleep(max(0.0, end - time.perf_counter()))
        return rows


def test_a_slow_device_is_calibrated_within_the_budget_and_says_so(
    smollm_target: LlamaEngine,
) -> None:
    slow = _SlowDevice(smollm_target, slow_pass=0, slow_seconds=0.0)
    costs = BatchCosts.calibrate(slow, CALIBRATION_SIZES, budget_seconds=2.0)
    # The context (16 tokens) is read; the warm-up (16: 1.6 s) and the single step (0.1 s)
    # judge a round of every size at about 5.3 s. Sizes 1 and 16 stay (1.7 s); 4 (0.4 s
    # more) and 8 would overrun 2 s, 2 (0.2 s more: 1.9 s) fits.
    assert slow.sizes == [16, 16, 1, 1, 2, 16]
    assert sorted(costs.seconds) == [1, 2, 16]
    assert costs.rounds == 1
    assert costs.cut_to_budget == 2.0
    assert costs.sureness() == (
        "one timing per batch size, its spread unknown; "
        "3 batch sizes to keep within 2 s on a slow device"
    )
    assert costs.cost(8) == pytest.approx(0.8, rel=0.15)  # interpolated between 2 and 16
    unlimited = BatchCosts.calibrate(smollm_target, (1, 2, 4))
    assert unlimited.cut_to_budget is None
    assert "slow device" not in unlimited.sureness()
