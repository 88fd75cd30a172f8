"""What the planner measures, and how it forgets: batch costs, acceptance, the expected tokens.

- :class:`BatchCosts`: seconds for the target (or a draft model) to evaluate ``b``
  tokens, calibrated at load for a few batch sizes and refined with every forward pass of
  the generation (exponential moving average per size, linear between sizes).
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
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backends.speculation.types import confidence_bucket

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

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


@dataclass
class BatchCosts:
    """Seconds to evaluate a batch of ``b`` tokens (with logits for each), by ``b``."""

    seconds: dict[int, float] = field(default_factory=dict)

    @classmethod
    def calibrate(cls, engine: ModelEngine, sizes: Sequence[int] = CALIBRATION_SIZES) -> BatchCosts:
        """Time the engine on each batch size after a short context; leaves its cache empty.

        Each size is timed twice and the faster kept (the first may pay for paging in).
        """
        tokens = engine.tokenize(
            "def measure(batch):\n    return sum(x * x for x in batch)  # calibration\n" * 8,
            add_special=False,
            parse_special=False,
        )
        limit = min(max(sizes), len(tokens) - 16, engine.n_ctx - 17)
        sizes = [size for size in sizes if size <= limit] or [1]
        prefix = tokens[:16]
        engine.truncate(0)
        engine.evaluate(prefix, 1)
        costs = cls()
        for size in sizes:
            best = math.inf
            for _ in range(2):
                engine.truncate(len(prefix))
                started = time.perf_counter()
                engine.evaluate(tokens[16 : 16 + size], size)
                best = min(best, time.perf_counter() - started)
            costs.seconds[size] = best
        engine.truncate(0)
        log.info(
            "%s: batch costs %s",
            engine.name,
            ", ".join(f"{b}: {1000 * s:.1f} ms" for b, s in sorted(costs.seconds.items())),
        )
        return costs

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
        """Fold one measured forward pass into the estimate for its size."""
        if size <= 0 or seconds <= 0.0:
            return
        previous = self.seconds.get(size)
        if previous is None:
            self.seconds[size] = seconds
        else:
            self.seconds[size] = previous + COST_SMOOTHING * (seconds - previous)


class CostCache:
    """Calibrated batch costs per engine, shared by every decoder built on that engine.

    Calibration takes a few seconds per engine; an app that switches speculation methods
    (or a benchmark that builds a decoder per method) pays it once per loaded model.
    """

    def __init__(self) -> None:
        # Keyed by id(engine); the engine is kept alongside so that its id is not reused.
        self._entries: dict[tuple[int, tuple[int, ...]], tuple[ModelEngine, BatchCosts]] = {}

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
