"""What the planner measures, and how it forgets: batch costs, acceptance, the expected tokens.

- :class:`BatchCosts`: seconds for the target (or a draft model) to evaluate ``b``
  tokens, calibrated at load for a few batch sizes and refined with every forward pass of
  the generation (exponential moving average per size, linear between sizes). The
  calibration is repeated and interleaved, its outliers dropped, and says how sure it is;
  :func:`speedup_ceiling` and :func:`ceiling_line` say what the costs allow at best.
  :class:`CostCache` calibrates each engine once for every decoder built on it.
- :class:`PositionAcceptance`: how often a draft's ``i``-th token is accepted given that
  the ones before it were. Drafts are far from independent per position (a lookup that
  got its first token right usually copies the rest right), so each position has its own
  estimate.
- :class:`ConfidenceKept`: how often the target keeps a draft model's tokens, by the
  draft's own probability of them.
- :func:`reach_chances` and :func:`expected_tokens`: the expected tokens of a round,
  1 + Σᵢ₌₁ᵏ Πⱼ₌₁ⁱ aⱼ (Leviathan et al. 2023, eq. 1, with per-position rates), written once
  for the planner and the tuner's prediction (``backends/service/tuning.py``).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backends.speculation.types import confidence_bucket

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from backends.engines.interface import ModelEngine

log = logging.getLogger(__name__)

# The batch sizes timed at load: those a verification weighs most (a draft of up to 16
# lookup tokens and the chunks it is checked in); costs between them are interpolated. A
# draft model drafts one token per pass, and reads a prompt in one batch.
CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
DRAFT_CALIBRATION_SIZES = (1, 2, 4, 8, 16)
# How fast the estimates follow new data. Chosen with the first planner (commit 4a884d4,
# 2026-11-30), not tuned one by one; the planner they make was measured as a whole by
# `specdeck-bench --suite` on the x86 AVX-512 machine, 2 cores, that day (docs/benchmarks.md,
# "The suite").
COST_SMOOTHING = 0.25  # weight of a new timing in a batch size's moving average
# Calibration that noise cannot fool (issue 33; chosen 2026-12-04, measured as a whole by
# `python -m benchmarks.never_slower`): every size timed in this many interleaved rounds,
# timings above OUTLIER_RATIO times their size's median dropped (and generation's timings
# clipped there before they are folded in).
CALIBRATION_ROUNDS = 3
OUTLIER_RATIO = 1.5
# What a model's calibration at load may take. On a CPU it takes far less (the default pair's
# main model, 3 rounds: about 4 s on a 2-core AVX2 machine); on a slow device (lavapipe, a
# software GPU: SmolLM2's 16-token batch took 3.9 s on AMD EPYC (without AMX), 2 cores,
# 2026-12-06) fewer rounds, then fewer sizes, keep a load from taking minutes. Generation's
# own passes refine the estimates afterwards.
CALIBRATION_BUDGET_SECONDS = 10.0
# The sizes kept, in this order, when not all fit in the budget (the smallest and largest always).
BUDGET_SIZE_PREFERENCE = (1, 16, 4, 8, 2, 12, 6, 3)
# The draft lengths the ceiling ("every drafted token accepted") is searched over.
CEILING_DRAFT_LENGTHS = range(1, 17)
ACCEPTANCE_DECAY = 0.98  # older rounds count for less: the text changes as it goes
PRIOR_WEIGHT = 2.0  # pseudo-observations behind each prior rate
# The stop rule's buckets of draft probability (equal width); before any data a bucket
# assumes a draft token is kept about as often as the draft is sure of it (its midpoint).
# Chosen with the learnt stop (commit 58baec5, 2026-12-02).
CONFIDENCE_BUCKETS = 10


def reach_chances(rates: Iterable[float]) -> list[float]:
    """P(draft tokens 1..i all accepted) for i = 0..k, from each position's rate (index 0: 1).

    ``rates[i]`` is the chance that token i + 1 is accepted given that the ones before it
    were.
    """
    reach = [1.0]
    for rate in rates:
        reach.append(reach[-1] * rate)
    return reach


def expected_tokens(reach: Sequence[float], given: Sequence[float] | None = None) -> list[float]:
    """E(k), the tokens a round that drafts up to k tokens gives, for k = 0..len(reach) - 1.

    E(k) = 1 + Σᵢ₌₁ᵏ gᵢ · reachᵢ: draft token i counts where the drafter gave it (``given[i]``,
    the chance that it gives at least i tokens; None: always) and it and every token before
    it were accepted (``reach[i]``, :func:`reach_chances`); the 1 is the target's own token.
    """
    expected = [1.0]
    for position in range(1, len(reach)):
        gained = reach[position] if given is None else given[position] * reach[position]
        expected.append(expected[-1] + gained)
    return expected


def sizes_within_budget(
    sizes: Sequence[int], rounds: int, single: float, largest: float, budget: float
) -> tuple[list[int], int]:
    """The batch sizes and rounds a calibration keeps to take about ``budget`` seconds at most.

    A size's time is estimated on the line from the smallest size's (``single`` seconds) to
    the largest's (``largest``). Rounds go first, down to one; then sizes, kept in the order
    of :data:`BUDGET_SIZE_PREFERENCE` while they fit (the smallest and the largest always).
    """
    smallest, top = min(sizes), max(sizes)

    def estimate(size: int) -> float:
        return single + (largest - single) * (size - smallest) / max(1, top - smallest)

    round_seconds = sum(estimate(size) for size in sizes)
    if round_seconds * rounds <= budget:
        return list(sizes), rounds
    if round_seconds <= budget:
        return list(sizes), max(1, int(budget // round_seconds))
    kept = sorted({smallest, top})
    preference = [size for size in BUDGET_SIZE_PREFERENCE if size in sizes]
    for size in [*preference, *(size for size in sizes if size not in preference)]:
        if size not in kept and sum(estimate(k) for k in (*kept, size)) <= budget:
            kept.append(size)
    return sorted(kept), 1


@dataclass
class BatchCosts:
    """Seconds to evaluate a batch of ``b`` tokens (with logits for each), by ``b``.

    ``spread`` says how sure the calibration was: per size, half the range of the timings
    kept over their median (0.04: ±4 %); ``dropped``, how many timings it rejected as
    outliers; ``clipped``, how many of generation's timings were folded in cut down to
    :data:`OUTLIER_RATIO` times the estimate (a neighbour's burst, not the model's cost).
    """

    seconds: dict[int, float] = field(default_factory=dict)
    spread: dict[int, float] = field(default_factory=dict)
    rounds: int = 0  # interleaved calibration rounds behind the estimate (0: not calibrated)
    dropped: int = 0
    clipped: int = 0
    cut_to_budget: float | None = None  # the budget (s) that cut its rounds or sizes, if one did

    @classmethod
    def calibrate(
        cls,
        engine: ModelEngine,
        sizes: Sequence[int] = CALIBRATION_SIZES,
        rounds: int = CALIBRATION_ROUNDS,
        context: int = 16,
        budget_seconds: float | None = CALIBRATION_BUDGET_SECONDS,
    ) -> BatchCosts:
        """Time the engine on each batch size after ``context`` tokens; leaves its cache empty.

        One untimed pass of the largest size pages the weights in; then ``rounds`` rounds
        time every size once each, in an order that rotates from round to round (so that a
        burst of a neighbour's load lands on different sizes), and each size's estimate is
        the median of its timings once those above :data:`OUTLIER_RATIO` times their median
        are dropped. Where that would take longer than ``budget_seconds`` (judged from the
        warm-up pass and, where it could, one single step), fewer rounds are run, and then
        fewer sizes (:func:`sizes_within_budget`); None: no budget.
        """
        line = "def measure(batch):\n    return sum(x * x for x in batch)  # calibration\n"
        tokens = engine.tokenize(
            line * (8 + (context + max(sizes)) // 8),  # a line is more than 8 tokens
            add_special=False,
            parse_special=False,
        )
        limit = min(max(sizes), len(tokens) - context, engine.n_ctx - context - 1)
        sizes = [size for size in sizes if size <= limit] or [1]
        prefix = tokens[:context]
        engine.truncate(0)
        engine.evaluate(prefix, 1)

        def timed(size: int) -> float:
            engine.truncate(len(prefix))
            started = time.perf_counter()
            engine.evaluate(tokens[context : context + size], size)
            return time.perf_counter() - started

        largest = timed(max(sizes))
        rounds = max(1, rounds)
        cut = False
        # Only where every size at the largest's time could overrun the budget (a slow
        # device) does a single step more tell what a round really costs.
        if budget_seconds is not None and largest * len(sizes) * rounds > budget_seconds:
            single = timed(min(sizes))
            kept, kept_rounds = sizes_within_budget(sizes, rounds, single, largest, budget_seconds)
            cut = (kept, kept_rounds) != (sizes, rounds)
            sizes, rounds = kept, kept_rounds
        timings: dict[int, list[float]] = {size: [] for size in sizes}
        for round_index in range(rounds):
            shift = round_index % len(sizes)
            for size in [*sizes[shift:], *sizes[:shift]]:
                timings[size].append(timed(size))
        engine.truncate(0)
        costs = cls.from_timings(timings)
        costs.cut_to_budget = budget_seconds if cut else None
        log.info("%s: %s", engine.name, costs.describe())
        return costs

    @classmethod
    def from_timings(cls, timings: dict[int, list[float]]) -> BatchCosts:
        """Estimates from repeated timings per size: outliers dropped, the median kept."""
        costs = cls(rounds=max((len(samples) for samples in timings.values()), default=0))
        for size, samples in timings.items():
            if not samples:
                continue
            middle = statistics.median(samples)
            kept = [sample for sample in samples if sample <= OUTLIER_RATIO * middle]
            costs.dropped += len(samples) - len(kept)
            estimate = statistics.median(kept)
            costs.seconds[size] = estimate
            costs.spread[size] = (max(kept) - min(kept)) / (2.0 * estimate) if estimate else 0.0
        return costs

    def describe(self) -> str:
        """The costs and how sure they are, in one line (for the log and the load report)."""
        table = ", ".join(f"{b}: {1000 * s:.1f} ms" for b, s in sorted(self.seconds.items()))
        if self.rounds == 0:
            return f"batch costs {table}"
        return f"batch costs {table} ({self.sureness()})"

    def sureness(self) -> str:
        """How sure the calibration is ("median of 3 interleaved rounds, within ±4%")."""
        if self.rounds == 0:
            return "not calibrated"
        if self.rounds == 1:
            said = "one timing per batch size, its spread unknown"
        else:
            spread = max(self.spread.values(), default=0.0)
            said = f"median of {self.rounds} interleaved rounds, within ±{spread:.0%}"
        if self.dropped:
            said += f", {self.dropped} outlier{'s' if self.dropped != 1 else ''} dropped"
        if self.cut_to_budget is not None:
            sizes = len(self.seconds)
            said += (
                f"; {sizes} batch size{'s' if sizes != 1 else ''} to keep within "
                f"{self.cut_to_budget:.0f} s on a slow device"
            )
        return said

    def table_ms(self) -> dict[str, float]:
        """The estimates in milliseconds by batch size (keys as strings, for JSON)."""
        return {str(b): round(1000 * s, 2) for b, s in sorted(self.seconds.items())}

    def snapshot(self) -> BatchCosts:
        """A copy that generation's updates will not move."""
        return BatchCosts(
            dict(self.seconds),
            dict(self.spread),
            self.rounds,
            self.dropped,
            self.clipped,
            self.cut_to_budget,
        )

    def cost(self, size: int) -> float:
        """Expected seconds for ``size`` tokens (interpolated; extrapolated per token)."""
        if size in self.seconds:
            return self.seconds[size]
        if not self.seconds:
            return 0.0
        known = sorted(self.seconds)
        if size < known[0]:
            return self.seconds[known[0]] * size / known[0]
        if size > known[-1]:
            last = known[-1]
            per_token = self.seconds[last] / last
            return self.seconds[last] + per_token * (size - last)
        upper = next(b for b in known if b > size)
        lower = max(b for b in known if b < size)
        share = (size - lower) / (upper - lower)
        return self.seconds[lower] + share * (self.seconds[upper] - self.seconds[lower])

    def observe(self, size: int, seconds: float) -> None:
        """Fold one measured forward pass into the estimate for its size.

        A pass slower than :data:`OUTLIER_RATIO` times the estimate counts as that much
        (a stolen time slice moves the estimate a little, a machine that really got slower
        moves it over a few passes).
        """
        if size <= 0 or seconds <= 0.0:
            return
        previous = self.seconds.get(size)
        if previous is None:
            self.seconds[size] = seconds
            return
        if seconds > OUTLIER_RATIO * previous:
            seconds = OUTLIER_RATIO * previous
            self.clipped += 1
        self.seconds[size] = previous + COST_SMOOTHING * (seconds - previous)


def speedup_ceiling(verify_cost: Callable[[int], float], draft_step_cost: float = 0.0) -> float:
    """The best speedup over plain decoding when every drafted token is accepted.

    ``verify_cost(n)``: evaluating n tokens, in single main-model steps (1.0 for n = 1);
    ``draft_step_cost``: one drafted token, in main-model steps (0 for a lookup). A round
    of k drafted tokens then gives k + 1 tokens for k·c + verify_cost(k + 1) steps; the
    best k of :data:`CEILING_DRAFT_LENGTHS` is taken. Leviathan et al. 2023, section 3,
    at α = 1.
    """
    return max(
        (length + 1) / (length * draft_step_cost + verify_cost(length + 1))
        for length in CEILING_DRAFT_LENGTHS
    )


def ceiling_line(
    target: BatchCosts, draft: BatchCosts | None, draft_name: str = "", where: str = "here"
) -> str | None:
    """What speculation can gain at best with these costs, in one line (None: uncalibrated)."""
    single = target.cost(1)
    if single <= 0.0:
        return None

    def steps(size: int) -> float:
        return target.cost(size) / single

    said = f"at best {where}: {speedup_ceiling(steps):.2f}× where the text is copied (lookups)"
    if draft is not None and draft.cost(1) > 0.0:
        step = draft.cost(1) / single
        said += (
            f", {speedup_ceiling(steps, step):.2f}× with the {draft_name or 'draft'} draft "
            f"(a step {step:.0%} of the main model's)"
        )
    return said + ", every drafted token accepted"


class CostCache:
    """Calibrated batch costs per engine, shared by every decoder built on that engine.

    Calibration takes a few seconds per engine; an app that switches speculation methods
    (or a benchmark that builds a decoder per method) pays it once per loaded model.
    """

    def __init__(self) -> None:
        # Keyed by id(engine); the engine is kept alongside so that its id is not reused.
        self._entries: dict[tuple[int, tuple[int, ...]], tuple[ModelEngine, BatchCosts]] = {}

    def calibrated(
        self, engine: ModelEngine, sizes: Sequence[int] = CALIBRATION_SIZES
    ) -> BatchCosts | None:
        """The engine's costs if they were calibrated already (never calibrates)."""
        entry = self._entries.get((id(engine), tuple(sizes)))
        return None if entry is None else entry[1]

    def costs(self, engine: ModelEngine, sizes: Sequence[int] = CALIBRATION_SIZES) -> BatchCosts:
        """The engine's costs, calibrated on first request."""
        key = (id(engine), tuple(sizes))
        entry = self._entries.get(key)
        if entry is None:
            entry = (engine, BatchCosts.calibrate(engine, sizes))
            self._entries[key] = entry
        return entry[1]


@dataclass
class PositionAcceptance:
    """Per-position conditional acceptance rates with a prior and exponential forgetting."""

    prior: float
    later_prior: float | None = None  # prior of positions after the first (None: ``prior``)
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    decay: float = ACCEPTANCE_DECAY  # what earlier rounds count for, at each new one

    def rate(self, position: int, *, optimism: float = 0.0) -> float:
        """Estimated P(token ``position`` accepted | the ones before it were), 0-based.

        ``optimism``: a bonus for little data, shrinking with the rounds seen there (an
        upper confidence bound, so that a drafter with few rounds is tried).
        """
        reached = self.reached[position] if position < len(self.reached) else 0.0
        accepted = self.accepted[position] if position < len(self.accepted) else 0.0
        prior = self.prior if position == 0 or self.later_prior is None else self.later_prior
        mean = (accepted + PRIOR_WEIGHT * prior) / (reached + PRIOR_WEIGHT)
        if optimism > 0.0:
            mean += optimism / math.sqrt(1.0 + reached)
        return min(1.0, max(0.0, mean))

    def observe(self, drafted: int, accepted: int) -> None:
        """One verified draft: ``accepted`` of its ``drafted`` tokens kept."""
        if drafted <= 0:
            return
        self.fade(self.decay)
        reached_positions = min(drafted, accepted + 1)
        while len(self.reached) < reached_positions:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        for position in range(reached_positions):
            self.reached[position] += 1.0
            if position < accepted:
                self.accepted[position] += 1.0

    def fade(self, factor: float) -> None:
        """Let old observations count for less."""
        self.reached = [value * factor for value in self.reached]
        self.accepted = [value * factor for value in self.accepted]

    def reach(self, k: int, *, optimism: float = 0.0) -> list[float]:
        """P(draft tokens 1..i all accepted) for i = 0..k (index 0 is 1.0)."""
        return reach_chances(self.rate(position, optimism=optimism) for position in range(k))


class ConfidenceKept:
    """How often the target keeps a draft model's tokens, by the draft's probability of them."""

    def __init__(self, buckets: int = CONFIDENCE_BUCKETS) -> None:
        self.reached = [0.0] * buckets
        self.kept = [0.0] * buckets

    def bucket(self, confidence: float) -> int:
        """The bucket of a draft probability."""
        return confidence_bucket(confidence, len(self.reached))

    def observe(self, confidences: Sequence[float], accepted: int) -> None:
        """One verified draft: its tokens' draft probabilities, ``accepted`` of them kept.

        Tokens after the first rejected one were never judged and are left out.
        """
        if not confidences:
            return
        self.reached = [value * ACCEPTANCE_DECAY for value in self.reached]
        self.kept = [value * ACCEPTANCE_DECAY for value in self.kept]
        for position, confidence in enumerate(confidences[: accepted + 1]):
            index = self.bucket(confidence)
            self.reached[index] += 1.0
            if position < accepted:
                self.kept[index] += 1.0

    def rates(self) -> tuple[float, ...]:
        """Per bucket, the estimated chance that a draft token of that probability is kept."""
        buckets = len(self.reached)
        return tuple(
            (kept + PRIOR_WEIGHT * (index + 0.5) / buckets) / (reached + PRIOR_WEIGHT)
            for index, (reached, kept) in enumerate(zip(self.reached, self.kept, strict=True))
        )
