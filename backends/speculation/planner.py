"""Cost-aware speculation: measure what drafting and verifying cost here, pick each round's plan.

Speculation pays only when the tokens a round gains outweigh what drafting and verifying
cost on this machine, with these models. The planner measures both and decides every
round which drafter to use (or none: plain decoding) and how many tokens to draft.

- :class:`BatchCosts`: seconds for the target (or a draft model) to evaluate ``b``
  tokens, calibrated at load for a few batch sizes and refined with every forward pass of
  the generation (exponential moving average per size, linear between sizes).
- :class:`PositionAcceptance`: how often a draft's ``i``-th token is accepted given that
  the ones before it were. Drafts are far from independent per position (a lookup that
  got its first token right usually copies the rest right), so each position has its own
  estimate; lookups keep one set per evidence level (length of the match).
- :class:`DraftPlanner`: for every candidate ``k`` computes the expected tokens of the
  round, 1 + Σᵢ₌₁ᵏ Πⱼ₌₁ⁱ aⱼ (Leviathan et al. 2023 with per-position rates), over its
  expected time (drafting, verification, and the loop's own overhead) and takes the best;
  plain decoding (``k = 0``) is always a candidate, so a plan is chosen only when it is
  expected to be faster than not speculating.
- Verification may go in chunks, a chunk evaluated only if every draft token before it was
  accepted. Where a batch costs more per token the bigger it is (a CPU, past the few rows
  that share each weight load) a long draft that is likely to break early is cheaper to
  check in chunks; where it does not (a GPU) in one batch. The plan says which chunk size
  its expected time was computed with (never above the engine's bit-exact limit).

Lookup drafters are asked first (a lookup costs microseconds), and their proposals are
scored against the tokens that follow even when they were not used, so their estimates
stay current for free. A draft model's estimate is optimistic while it has little data and
drifts back towards optimism while unused, so a pair that may pay gets tried again.

A draft model has three more estimates. How often the target keeps its tokens by the draft's
own probability of them (:class:`ConfidenceKept`): from it and the costs the planner makes
the rule where the draft model stops drafting (:meth:`DraftPlanner.stop_rule`), in place of
a fixed p-min, so that an unsure draft token is drafted where such tokens are usually kept
and one more token is cheap, and not elsewhere. How often it goes on drafting (that rule
shortens both its passes and the verification). And
what it must read before it can draft. Beyond its steady catch-up (the last draft token and
the target's own) that reading (the prompt, on its first round) is paid once, so it is
spread over the tokens still to come instead of charged to one round. And before it has
data in an answer, a draft model is expected to be right about as often as the target is
sure of its own tokens (on average over the answer so far): a small model of the family
agrees with the big one where the big one is sure, so the prior is high on code and
lower on prose, and the costs decide whether that pays on this machine.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backends.speculation.types import DraftStopRule, confidence_bucket

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from backends.engines.interface import ModelEngine
    from backends.speculation.types import Draft, Drafter

log = logging.getLogger(__name__)

CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
DRAFT_CALIBRATION_SIZES = (1, 2, 4, 8, 16)  # a draft model drafts one token per pass
COST_SMOOTHING = 0.25  # weight of a new timing in a batch size's moving average
ACCEPTANCE_DECAY = 0.98  # older rounds count for less: the text changes as it goes
PRIOR_WEIGHT = 2.0  # pseudo-observations behind each prior rate
DRAFT_MODEL_PRIOR = 0.75  # what a compatible draft model typically gets per position
CONTINUATION_PRIOR = 0.9  # how often a draft model's confidence stays above p-min, per token
# How sure a draft model is changes with the kind of text faster than whether its sure
# tokens are right: its continuation forgets sooner, and a new answer (maybe prose after
# code) halves the weight of what the last one taught about the draft model.
CONTINUATION_DECAY = 0.9
NEW_ANSWER_FADE = 0.5
# Until it has data in an answer, a draft model is expected to be kept about as often as
# the target is sure of its own tokens (its softmax maximum, averaged over the answer so
# far). Teacher-forced over the target's own answers (Intel(R) Xeon(R) Processor with AMX,
# 2 cores, session 16) the 0.5B's top token was the 1.5B's on 95-98 % of the tokens of
# code and edits, where the 1.5B averaged 0.91-0.97, and on 61 % of prose, where it
# averaged 0.66. Whether that pays is the costs' to say: on prose it did not on a 2-core
# Xeon without SpecDeck's kernels (0.94-0.95x, README) and does on one with them (a draft
# step a fifth of a target step, batches of up to 4 tokens about one step).
# The average is the answer's mean over its first CONFIDENCE_MEMORY rounds and a moving
# average of that memory after; a draft model waits for CONFIDENCE_ROUNDS of them. Its first
# try reads the prompt (see DraftModelDrafter.reading), so it waits long enough for the
# average to mean something: on prose the 1.5B's first 4 rounds averaged 0.82, its next
# ones under 0.7 (AMD EPYC).
CONFIDENCE_MEMORY = 16
CONFIDENCE_ROUNDS = 8
# A lookup's first token is a guess whose odds grow with the match behind it; once it is
# right the lookup is usually copying, and the next ones are right too. Evidence 0 is a
# proposal with no match behind it (edit copy's guess where an edit ends, a chain of
# n-grams seen once): tried only once the shadows show such guesses come true here.
LOOKUP_FIRST_PRIORS = (0.2, 0.35, 0.5, 0.6, 0.7)  # by evidence level
LOOKUP_LATER_PRIOR = 0.9
UNUSED_DRIFT = 0.995  # per round a drafter sits unused, its evidence fades (re-exploration)
GAIN_MARGIN = 1.03  # speculate only when expected to be at least this much faster
VERIFY_CHUNKS = (2, 4, 8, 16)  # chunk sizes a plan may verify in, besides one batch
# The most rows a batch with a sibling branch has: a draft model's drafts are short (a
# sibling pays where the draft is unsure, and there the draft stops early).
MAX_TREE_ROWS = 17
EVIDENCE_LEVELS = (0, 1, 4, 8, 16)  # lookup evidence buckets: match length >= each bound
SHADOW_LIMIT = 64  # longest unused lookup proposal scored against the real continuation
# A draft model evaluates, before its first draft token of a round, what it has not seen:
# in steady use the last draft token and the target's own token (2). More than that (the
# prompt, or text written while the lookups drafted) is paid once and then serves every
# later round, so it is spread over the tokens still to come, at most this many (answers
# often end well before their budget).
STEADY_CATCH_UP = 2
CATCH_UP_HORIZON = 128
# The stop rule's buckets of draft probability (equal width); before any data a bucket
# assumes a draft token is kept about as often as the draft is sure of it (its midpoint).
CONFIDENCE_BUCKETS = 10


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
        """Estimated P(token ``position`` accepted | the ones before it were), 0-based."""
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

    def expected_tokens(self, k: int, *, optimism: float = 0.0) -> list[float]:
        """P(draft tokens 1..i all accepted) for i = 0..k (index 0 is 1.0)."""
        reach = [1.0]
        for position in range(k):
            reach.append(reach[-1] * self.rate(position, optimism=optimism))
        return reach


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


@dataclass(frozen=True)
class RoundPlan:
    """What one round will do: which drafter (None: plain decoding) and up to how many tokens."""

    drafter: Drafter | None
    draft_tokens: int
    proposal: Draft | None = None  # a lookup's proposal, already made (cut to draft_tokens)
    expected_rate: float = 0.0  # expected tokens per second of the plan
    plain_rate: float = 0.0  # expected tokens per second of plain decoding now
    verify_chunk: int | None = None  # rows per verification batch (None: all in one)


@dataclass
class _Shadow:
    drafter: Drafter
    evidence: int
    start: int  # index in the context where the proposal begins
    tokens: list[int]


class DraftPlanner:
    """Chooses each round's drafter and draft length from measured costs and acceptance.

    ``exact_chunk`` is the largest batch verification may use (the engine's bit-exact limit
    at temperature 0; None when verification runs in one batch).
    """

    def __init__(
        self,
        target_costs: BatchCosts,
        drafters: Sequence[Drafter],
        draft_costs: dict[Drafter, BatchCosts] | None = None,
    ) -> None:
        self.target_costs = target_costs
        self.drafters = list(drafters)
        self._draft_costs = dict(draft_costs or {})
        self._acceptance: dict[tuple[Drafter, int], PositionAcceptance] = {}
        self._continuation: dict[Drafter, PositionAcceptance] = {}
        self._kept: dict[Drafter, ConfidenceKept] = {}
        # Whether the draft model stops where the planner learnt (False: at its p-min), and
        # how many rounds of the target's confidence it waits for; benchmarks/draft_model_auto.py
        # compares them.
        self.learn_stop = True
        self.confidence_rounds = CONFIDENCE_ROUNDS
        self._target_confidence = 0.0  # this answer's, moving average
        self._confidence_rounds = 0
        self._confidence_expected = False  # set once a loop reports confidence per round
        self._overhead = 0.0  # seconds of loop time per round outside the engines
        self._shadows: list[_Shadow] = []
        self._rounds_unused: dict[int, int] = {}

    # -- estimates -------------------------------------------------------------------------

    def _evidence_level(self, drafter: Drafter, evidence: int) -> int:
        if not drafter.lookup:
            return 0
        return max(index for index, bound in enumerate(EVIDENCE_LEVELS) if evidence >= bound)

    def acceptance(self, drafter: Drafter, evidence: int = 0) -> PositionAcceptance:
        """The acceptance estimate used for ``drafter``'s drafts at this evidence level."""
        level = self._evidence_level(drafter, evidence)
        key = (drafter, level)
        estimate = self._acceptance.get(key)
        if estimate is None:
            if drafter.lookup:
                estimate = PositionAcceptance(LOOKUP_FIRST_PRIORS[level], LOOKUP_LATER_PRIOR)
            else:
                estimate = PositionAcceptance(DRAFT_MODEL_PRIOR)
            self._acceptance[key] = estimate
        if not drafter.lookup:
            estimate.prior = self.draft_model_prior()
        return estimate

    def draft_model_prior(self) -> float:
        """A draft model's expected rate per position before it has data in this answer.

        The target's average confidence in the answer so far (:data:`DRAFT_MODEL_PRIOR`
        while no loop reports one).
        """
        if not self._confidence_expected or self._confidence_rounds == 0:
            return DRAFT_MODEL_PRIOR
        return self._target_confidence

    def continuation(self, drafter: Drafter) -> PositionAcceptance:
        """How often a draft model goes on to its ``i``-th token, given it gave the ones before.

        A draft model stops early where its top probability falls below p-min; a lookup's
        proposal is known before the plan, so lookups have no such estimate.
        """
        estimate = self._continuation.get(drafter)
        if estimate is None:
            estimate = PositionAcceptance(CONTINUATION_PRIOR, decay=CONTINUATION_DECAY)
            self._continuation[drafter] = estimate
        return estimate

    def kept_by_confidence(self, drafter: Drafter) -> ConfidenceKept:
        """How often a draft model's tokens were kept, by its probability of them."""
        estimate = self._kept.get(drafter)
        if estimate is None:
            estimate = self._kept[drafter] = ConfidenceKept()
        return estimate

    def stop_rule(self, drafter: Drafter, tree_rows: int = 0) -> DraftStopRule | None:
        """Where a draft model should stop drafting now (None for lookups, or its p-min).

        A draft token is worth a verification row (the mean extra cost of the rows of a
        batch of 4 over a single step) where its chance of being kept, times the target
        step it then saves, is at least that row; going on to the next token costs a draft
        model step more. ``tree_rows``: the most rows a batch with a sibling branch may
        have (0: none), whose extra rows the rule then prices one by one.
        """
        costs = self.draft_costs(drafter)
        if costs is None or drafter.lookup or not self.learn_stop:
            return None
        target = self.target_costs
        step = max(1e-9, target.cost(1))
        row = max(0.0, (target.cost(4) - target.cost(1)) / 3)
        extra_row = tuple(
            max(0.0, target.cost(rows + 1) - target.cost(rows)) / step
            for rows in range(1, min(tree_rows, MAX_TREE_ROWS))
        )
        return DraftStopRule(
            self.kept_by_confidence(drafter).rates(),
            keep_floor=min(1.0, row / step),
            go_on_floor=min(1.0, (costs.cost(1) + row) / step),
            extra_row=extra_row,
        )

    def draft_costs(self, drafter: Drafter) -> BatchCosts | None:
        """The calibrated forward-pass costs of a draft model (None for lookups)."""
        return self._draft_costs.get(drafter)

    def verify_chunks(self, exact_chunk: int | None) -> tuple[int | None, ...]:
        """The chunk sizes a plan may verify in: one batch (or the exact limit) and smaller."""
        largest = exact_chunk
        smaller = tuple(c for c in VERIFY_CHUNKS if largest is None or c < largest)
        return (largest, *smaller)

    def verify_seconds(self, k: int, reach: Sequence[float], chunk: int | None) -> float:
        """Expected time to verify ``k`` draft tokens (k + 1 rows) in chunks, early exit."""
        rows = k + 1
        chunk = rows if chunk is None else max(1, min(rows, chunk))
        seconds = 0.0
        first = 0
        while first < rows:
            size = min(chunk, rows - first)
            # A chunk after the first is evaluated only if every draft token before it
            # was accepted: rows 0..first-1 verify draft tokens 1..first.
            seconds += (reach[first] if first > 0 else 1.0) * self.target_costs.cost(size)
            first += size
        return seconds

    def plain_rate(self) -> float:
        """Expected tokens per second without speculation."""
        return 1.0 / max(1e-9, self.target_costs.cost(1) + self._overhead)

    def _best_length(
        self,
        drafter: Drafter,
        limit: int,
        evidence: int,
        exact_chunk: int | None,
        catch_up: int,
        horizon: int,
    ) -> tuple[int, float, int | None]:
        """The draft length (1..limit) and verification chunk with the highest expected rate.

        Returns (length, rate, chunk). A draft model's catch-up beyond
        :data:`STEADY_CATCH_UP` tokens is spread over the next ``horizon`` tokens (capped at
        :data:`CATCH_UP_HORIZON`).
        """
        optimism = 0.0 if drafter.lookup else 0.25
        reach = self.acceptance(drafter, evidence).expected_tokens(limit, optimism=optimism)
        # given[n]: P(the drafter gives at least n tokens); a lookup's proposal is all there.
        given = [1.0] * (limit + 1)
        if not drafter.lookup:
            given = self.continuation(drafter).expected_tokens(limit)
        costs = self.draft_costs(drafter)
        one_time = 0.0
        steady = 1
        if costs is not None:
            steady = max(1, min(catch_up, STEADY_CATCH_UP))
            one_time = max(0.0, costs.cost(max(1, catch_up)) - costs.cost(steady))
        # Per planned length k, what does not depend on the verification chunk: the expected
        # tokens, the chance that the drafter stops at each n <= k, and the drafting time.
        expected = [1.0] * (limit + 1)
        stops: list[list[float]] = [[]] * (limit + 1)
        drafting = [0.0] * (limit + 1)
        for k in range(1, limit + 1):
            # Token k counts if the drafter gave it and it and every one before were accepted.
            expected[k] = expected[k - 1] + given[k] * reach[k]
            stops[k] = [given[n] - (given[n + 1] if n < k else 0.0) for n in range(k + 1)]
            if costs is not None:
                # One forward pass per drafted token that is not the last of the plan.
                passes = sum(stop * min(n, k - 1) for n, stop in enumerate(stops[k]))
                # Catching the draft's cache up (its pass gives the first token), then the
                # passes that give the others.
                drafting[k] = costs.cost(steady) + passes * costs.cost(1)
        best_k, best_rate, best_chunk = 0, 0.0, exact_chunk
        for chunk in self.verify_chunks(exact_chunk):
            if chunk is not None and chunk > limit and chunk != exact_chunk:
                continue  # checks every possible draft in one batch, as the first candidate
            # Verifying n drafted tokens, for every n the drafter may stop at.
            verify = [self.verify_seconds(n, reach, chunk) for n in range(limit + 1)]
            for k in range(1, limit + 1):
                seconds = self._overhead
                for n, stop in enumerate(stops[k]):
                    seconds += stop * verify[n]
                rate = expected[k] / (seconds + drafting[k])
                if rate > best_rate:
                    best_k, best_rate, best_chunk = k, rate, chunk
        if one_time > 0.0 and best_rate > 0.0:
            tokens = max(1, min(horizon, CATCH_UP_HORIZON))
            best_rate = tokens / (tokens / best_rate + one_time)
        return best_k, best_rate, best_chunk

    # -- planning --------------------------------------------------------------------------

    def plan(
        self,
        context: Sequence[int],
        limits: dict[Drafter, int],
        exact_chunk: int | None,
        make_proposal: Callable[[Drafter, int], Draft],
        horizon: int = CATCH_UP_HORIZON,
    ) -> RoundPlan:
        """Choose this round's plan; ``limits`` maps each drafter to its draft-length cap.

        ``horizon``: how many tokens the generation may still produce.
        """
        plain = self.plain_rate()
        best = RoundPlan(None, 0, None, plain, plain)
        for drafter in self.drafters:
            limit = limits.get(drafter, 0)
            if limit <= 0:
                continue
            if drafter.lookup:
                proposal = make_proposal(drafter, limit)
                if not proposal.tokens:
                    continue
                self._add_shadow(drafter, proposal, len(context))
                k, rate, chunk = self._best_length(
                    drafter, len(proposal.tokens), proposal.evidence, exact_chunk, 0, horizon
                )
                candidate = RoundPlan(drafter, k, proposal, rate, plain, chunk)
            else:
                if not self.draft_model_ready():
                    continue
                catch_up = drafter.unread(context)
                k, rate, chunk = self._best_length(
                    drafter, limit, 0, exact_chunk, catch_up, horizon
                )
                candidate = RoundPlan(drafter, k, None, rate, plain, chunk)
            if k > 0 and candidate.expected_rate > best.expected_rate:
                best = candidate
        if best.drafter is not None and best.expected_rate < plain * GAIN_MARGIN:
            best = RoundPlan(None, 0, None, plain, plain)
        for drafter in self.drafters:
            if drafter is not best.drafter and not drafter.lookup:
                self.acceptance(drafter).fade(UNUSED_DRIFT)
        return best

    # -- learning --------------------------------------------------------------------------

    def observe_round(
        self,
        plan: RoundPlan,
        drafted: int,
        accepted: int,
        evidence: int,
        overhead_seconds: float,
        confidences: Sequence[float] = (),
    ) -> None:
        """Learn from a verified round: acceptance of the drafter used, loop overhead.

        A draft model that gave fewer tokens than planned stopped where it was unsure:
        that is learnt apart from acceptance (:meth:`continuation`), and its tokens'
        probabilities (``confidences``) with whether they were kept (:meth:`stop_rule`).
        """
        if plan.drafter is not None and not plan.drafter.lookup and plan.draft_tokens > 0:
            self.continuation(plan.drafter).observe(plan.draft_tokens, drafted)
            self.kept_by_confidence(plan.drafter).observe(confidences, accepted)
        if plan.drafter is not None and drafted > 0:
            self.acceptance(plan.drafter, evidence).observe(drafted, accepted)
            self._shadows = [s for s in self._shadows if s.drafter is not plan.drafter]
        if overhead_seconds >= 0.0:
            self._overhead += COST_SMOOTHING * (overhead_seconds - self._overhead)

    def observe_target_confidence(self, probability: float) -> None:
        """The target's probability of its own token this round (a softmax maximum)."""
        self._confidence_rounds += 1
        weight = 1.0 / min(self._confidence_rounds, CONFIDENCE_MEMORY)
        self._target_confidence += weight * (probability - self._target_confidence)

    def draft_model_ready(self) -> bool:
        """Whether a draft model may be planned: its prior has been measured long enough.

        The prior (:meth:`draft_model_prior`) is the target's confidence over this answer's
        first :data:`CONFIDENCE_ROUNDS` rounds. True for a planner no loop reports
        confidence to (planned on its own).
        """
        if not self._confidence_expected:
            return True
        return self._confidence_rounds >= self.confidence_rounds

    def observe_target(self, size: int, seconds: float) -> None:
        """A measured target forward pass of ``size`` tokens."""
        self.target_costs.observe(size, seconds)

    def observe_draft(self, drafter: Drafter, size: int, seconds: float) -> None:
        """A measured draft-model forward pass."""
        costs = self._draft_costs.get(drafter)
        if costs is not None:
            costs.observe(size, seconds)

    def _add_shadow(self, drafter: Drafter, proposal: Draft, start: int) -> None:
        if any(shadow.drafter is drafter for shadow in self._shadows):
            return
        tokens = list(proposal.tokens[:SHADOW_LIMIT])
        self._shadows.append(_Shadow(drafter, proposal.evidence, start, tokens))

    def score_shadows(self, context: Sequence[int]) -> None:
        """Score unused lookup proposals against the tokens that actually followed."""
        remaining: list[_Shadow] = []
        for shadow in self._shadows:
            available = len(context) - shadow.start
            matched = 0
            while (
                matched < min(available, len(shadow.tokens))
                and context[shadow.start + matched] == shadow.tokens[matched]
            ):
                matched += 1
            if matched < min(available, len(shadow.tokens)) or available >= len(shadow.tokens):
                self.acceptance(shadow.drafter, shadow.evidence).observe(
                    len(shadow.tokens), matched
                )
            else:
                remaining.append(shadow)
        self._shadows = remaining

    def forget_shadows(self) -> None:
        """Drop pending proposals (the context was replaced)."""
        self._shadows.clear()

    def start_answer(self) -> None:
        """A new generation: pending proposals dropped, the draft models' record faded.

        The target's confidence is measured afresh on the new answer.
        """
        self.forget_shadows()
        self._target_confidence = 0.0
        self._confidence_rounds = 0
        self._confidence_expected = True
        for (drafter, _level), estimate in self._acceptance.items():
            if not drafter.lookup:
                estimate.fade(NEW_ANSWER_FADE)
        for estimate in self._continuation.values():
            estimate.fade(NEW_ANSWER_FADE)
