"""Cost-aware speculation: each round's plan, from what drafting and verifying cost here.

Speculation pays only when the tokens a round gains outweigh what drafting and verifying
cost on this machine, with these models. The planner measures both
(:mod:`backends.speculation.estimates`) and decides every round which drafter to use (or
none: plain decoding), how many tokens to draft and in what chunks to verify them.

The loop and the planner meet twice a round, and neither calls the other back:

- :meth:`DraftPlanner.plan` takes the drafters it may choose (:class:`Candidate`; a
  lookup's proposal is made before the plan, it costs microseconds) and returns a
  :class:`RoundPlan`. It changes nothing: the same estimates give the same plan.
- :meth:`DraftPlanner.observe` takes what the round did (:class:`RoundOutcome`) once it
  has ended. It is the only place an answer changes the estimates
  (:meth:`DraftPlanner.start_answer` fades them between answers).

The choice: for every candidate length ``k`` the round's expected tokens
(:func:`~backends.speculation.estimates.expected_tokens`) over its expected time
(drafting, verification and the loop's own overhead), for each verification chunk size;
the highest rate wins. Plain decoding (``k = 0``) is always a candidate, so a plan is
chosen only when it is expected to be faster than not speculating. Expectations can be
wrong, so the rounds' real earnings are watched too
(:class:`~backends.speculation.earnings.EarningsWatch`): a drafter whose rounds earn less
than plain decoding's measured pace sits out a while, a plain round now and then keeps
that pace measured, and until a draft model has paid in an answer, what it must read
before its first draft must pay within its trial. A chunk is evaluated only if every draft
token before it was accepted, so where a batch costs more per token the bigger it is (a CPU) a
long draft likely to break early is cheaper to check in chunks, and where it does not (a
GPU) in one batch.

Lookup proposals are scored against the tokens that follow even when they were not used
("shadows"), so their estimates stay current for free; lookups keep one acceptance
estimate per evidence level (the length of the match). A draft model's estimate is
optimistic while it has little data and drifts back towards optimism while unused, so a
pair that may pay gets tried again. A draft model also has: where it stops drafting
(:meth:`DraftPlanner.stop_rule`, learnt from how often the target keeps its tokens by its
own probability of them, in place of a fixed p-min); how often it goes on drafting; what it
must read first (beyond its steady catch-up, paid once and spread over the tokens still to
come); and, before it has data in an answer, a prior: the target's average confidence in
its own tokens so far (a small model of the family agrees with the big one where the big
one is sure), the costs deciding whether that pays on this machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.speculation.earnings import TRIAL_HORIZON, EarningsWatch

# The estimates lived here first: those imported "as" themselves are re-exported for callers.
from backends.speculation.estimates import CALIBRATION_SIZES as CALIBRATION_SIZES
from backends.speculation.estimates import COST_SMOOTHING, expected_tokens
from backends.speculation.estimates import DRAFT_CALIBRATION_SIZES as DRAFT_CALIBRATION_SIZES
from backends.speculation.estimates import BatchCosts as BatchCosts
from backends.speculation.estimates import ConfidenceKept as ConfidenceKept
from backends.speculation.estimates import CostCache as CostCache
from backends.speculation.estimates import PositionAcceptance as PositionAcceptance
from backends.speculation.rounds import Candidate as Candidate
from backends.speculation.rounds import RoundOutcome as RoundOutcome
from backends.speculation.rounds import RoundPlan as RoundPlan
from backends.speculation.types import DraftStopRule

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.speculation.types import Draft, Drafter

# What a plan must beat, how lookups and draft models start, and how the planner explores.
# Chosen with the first planner (commit 4a884d4, 2026-11-30) and edit copy (commit bb52ce8,
# 2026-12-01, which added evidence 0), not tuned one by one: the planner they make was
# measured as a whole by `specdeck-bench --suite` on the x86 AVX-512 machine, 2 cores,
# 2026-11-30 (docs/benchmarks.md, "The suite").
GAIN_MARGIN = 1.03  # speculate only when expected to be at least this much faster
UNUSED_DRIFT = 0.995  # per round a draft model sits unused, its evidence fades (re-exploration)
# A draft model's rates get a bonus for little data, DRAFT_MODEL_OPTIMISM / sqrt(1 + rounds
# seen at that position) (PositionAcceptance.rate), so that a pair that may pay is tried.
DRAFT_MODEL_OPTIMISM = 0.25
DRAFT_MODEL_PRIOR = 0.75  # a draft model's rate per position while no loop reports confidence
# A lookup's first token is a guess whose odds grow with the match behind it; once it is
# right the lookup is usually copying, and the next ones are right too. Evidence 0 is a
# proposal with no match behind it (edit copy's guess where an edit ends, a chain of
# n-grams seen once): tried only once the shadows show such guesses come true here.
EVIDENCE_LEVELS = (0, 1, 4, 8, 16)  # lookup evidence buckets: match length >= each bound
LOOKUP_FIRST_PRIORS = (0.2, 0.35, 0.5, 0.6, 0.7)  # by evidence level
LOOKUP_LATER_PRIOR = 0.9
SHADOW_LIMIT = 64  # longest unused lookup proposal scored against the real continuation
# The chunk sizes a plan may verify in, besides one batch (commit 34411d6, 2026-12-02): on
# the EPYC Zen 5, 2 cores, chunks against one batch gave the refactor 2.15x and 2.09x of
# plain against 1.92x and 1.77x, every text identical (a script, the command was not
# recorded; docs/benchmarks.md, "Cheap batches").
VERIFY_CHUNKS = (2, 4, 8, 16)
# The most rows a batch with a sibling branch has: a draft model's drafts are short (a
# sibling pays where the draft is unsure, and there the draft stops early). Chosen with
# sibling branches (commit 2ec15eb, 2026-12-03).
MAX_TREE_ROWS = 17

# How a draft model goes on and forgets (commit aa822b0, 2026-12-01; chosen, not tuned one
# by one). How sure a draft model is changes with the kind of text faster than whether its
# sure tokens are right: its continuation forgets sooner, and a new answer (maybe prose
# after code) halves the weight of what the last one taught about the draft model.
CONTINUATION_PRIOR = 0.9  # how often a draft model's confidence stays above p-min, per token
CONTINUATION_DECAY = 0.9
NEW_ANSWER_FADE = 0.5
# Until it has data in an answer, a draft model is expected to be kept about as often as
# the target is sure of its own tokens (its softmax maximum, averaged over the answer so
# far). Teacher-forced over the target's own answers (2026-12-02, Xeon AMX, 2 cores; the
# command was not recorded) the 0.5B's top token was the 1.5B's on 95-98 % of the tokens of
# code and edits, where the 1.5B averaged 0.91-0.97 (2026-12-01, the same machine), and on
# 61 % of prose, where it averaged 0.66. Whether that pays is the costs' to say: on prose
# it did not on that Xeon without SpecDeck's kernels (0.94-0.95x, 2026-12-01) and does with
# them (1.24x and 1.30x of plain in two `specdeck-bench` runs, 2026-12-02: a draft step a
# fifth of a target step, batches of up to 4 tokens about one step). docs/benchmarks.md,
# "The draft model's prior".
# The average is the answer's mean over its first CONFIDENCE_MEMORY rounds and a moving
# average of that memory after; a draft model waits for CONFIDENCE_ROUNDS of them. Its first
# try reads the prompt (see DraftModelDrafter.reading), so it waits long enough for the
# average to mean something: on prose the 1.5B's first 4 rounds averaged 0.82, its next
# ones under 0.7, and waiting 8 rounds instead of 4 took prose from 0.965x to 1.00x of
# plain, modeled (2026-12-02, EPYC Zen 5, 2 cores, the method of
# `python -m benchmarks.draft_model_auto` in a script; docs/benchmarks.md, "Where the draft
# stops, and what it reads").
CONFIDENCE_MEMORY = 16
CONFIDENCE_ROUNDS = 8
# After its first CONFIDENCE_ROUNDS, the target's confidence is measured every this many
# rounds: one softmax over the 1.5B's 151,936 logits cost 0.24 ms a round, 0.8 % of a 30 ms
# step, and was the largest part of what auto's rounds cost beyond plain decoding's
# (2026-12-05, EPYC Zen 4, 2 cores, the Haswell library: 0.71 against 0.31 ms a round).
CONFIDENCE_EVERY = 4
# A draft model evaluates, before its first draft token of a round, what it has not seen:
# in steady use the last draft token and the target's own token (2). More than that (the
# prompt, or text written while the lookups drafted) is paid once and then serves every
# later round, so it is spread over the tokens still to come, at most this many (answers
# often end well before their budget). Chosen with the catch-up fix (commit aa822b0,
# 2026-12-01), measured with it by `specdeck-bench` on new-function, Xeon AMX, 2 cores
# (docs/benchmarks.md, "Its Q4_0 copy and the catch-up fix").
STEADY_CATCH_UP = 2
CATCH_UP_HORIZON = 128
# The stop rule prices a draft token's verification row as the mean extra cost of the rows
# of a batch of this many tokens over a single step: a draft of DEFAULT_DRAFT_MAX (3)
# tokens and the target's row. Chosen with the learnt stop (commit 58baec5, 2026-12-02).
STOP_RULE_BATCH = 4


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
        self._rounds_unmeasured = 0  # planned rounds since the target's confidence was measured
        self._confidence_expected = False  # set once a loop reports confidence per round
        self._overhead = 0.0  # seconds of loop time per round outside the engines
        self._shadows: list[_Shadow] = []
        # What the rounds really earned against plain's measured pace: a drafter that
        # does not pay sits out (:mod:`backends.speculation.earnings`).
        self.watch = EarningsWatch()

    # -- estimates -------------------------------------------------------------------------
    #
    # The public accessors keep the estimate they return (for learning); planning reads
    # through the private ones, which leave the planner as it is.

    def _acceptance_key(self, drafter: Drafter, evidence: int) -> tuple[Drafter, int]:
        if not drafter.lookup:
            return drafter, 0
        return drafter, max(i for i, bound in enumerate(EVIDENCE_LEVELS) if evidence >= bound)

    def _new_acceptance(self, drafter: Drafter, level: int) -> PositionAcceptance:
        if drafter.lookup:
            return PositionAcceptance(LOOKUP_FIRST_PRIORS[level], LOOKUP_LATER_PRIOR)
        return PositionAcceptance(self.draft_model_prior())

    def acceptance(self, drafter: Drafter, evidence: int = 0) -> PositionAcceptance:
        """The acceptance estimate used for ``drafter``'s drafts at this evidence level.

        A draft model's prior is :meth:`draft_model_prior`, kept current by the planner.
        """
        key = self._acceptance_key(drafter, evidence)
        estimate = self._acceptance.get(key)
        if estimate is None:
            estimate = self._acceptance[key] = self._new_acceptance(drafter, key[1])
        return estimate

    def _read_acceptance(self, drafter: Drafter, evidence: int) -> PositionAcceptance:
        key = self._acceptance_key(drafter, evidence)
        estimate = self._acceptance.get(key)
        return self._new_acceptance(drafter, key[1]) if estimate is None else estimate

    def draft_model_prior(self) -> float:
        """A draft model's expected rate per position before it has data in this answer.

        The target's average confidence in the answer so far (:data:`DRAFT_MODEL_PRIOR`
        while no loop reports one).
        """
        if not self._confidence_expected or self._confidence_rounds == 0:
            return DRAFT_MODEL_PRIOR
        return self._target_confidence

    def _refresh_priors(self) -> None:
        """Give every draft model's estimate the prior the target's confidence now makes."""
        prior = self.draft_model_prior()
        for (drafter, _level), estimate in self._acceptance.items():
            if not drafter.lookup:
                estimate.prior = prior

    def continuation(self, drafter: Drafter) -> PositionAcceptance:
        """How often a draft model goes on to its ``i``-th token, given it gave the ones before.

        A draft model stops early where its top probability falls below p-min; a lookup's
        proposal is known before the plan, so lookups have no such estimate.
        """
        estimate = self._continuation.get(drafter)
        if estimate is None:
            estimate = self._continuation[drafter] = self._new_continuation()
        return estimate

    @staticmethod
    def _new_continuation() -> PositionAcceptance:
        return PositionAcceptance(CONTINUATION_PRIOR, decay=CONTINUATION_DECAY)

    def kept_by_confidence(self, drafter: Drafter) -> ConfidenceKept:
        """How often a draft model's tokens were kept, by its probability of them."""
        estimate = self._kept.get(drafter)
        if estimate is None:
            estimate = self._kept[drafter] = ConfidenceKept()
        return estimate

    def draft_costs(self, drafter: Drafter) -> BatchCosts | None:
        """The calibrated forward-pass costs of a draft model (None for lookups)."""
        return self._draft_costs.get(drafter)

    def wants_confidence(self) -> bool:
        """Whether the loop should measure the target's confidence this round.

        Every round until :data:`CONFIDENCE_ROUNDS` were measured in the answer, then every
        :data:`CONFIDENCE_EVERY`-th (the prior is an average, and a softmax over a big
        vocabulary is not free).
        """
        return (
            self._confidence_rounds < self.confidence_rounds
            or self._rounds_unmeasured + 1 >= CONFIDENCE_EVERY
        )

    def draft_model_ready(self) -> bool:
        """Whether a draft model may be planned: its prior has been measured long enough.

        The prior (:meth:`draft_model_prior`) is the target's confidence over this answer's
        first :data:`CONFIDENCE_ROUNDS` rounds. True for a planner no loop reports
        confidence to (planned on its own).
        """
        if not self._confidence_expected:
            return True
        return self._confidence_rounds >= self.confidence_rounds

    # -- what things cost ------------------------------------------------------------------

    def stop_rule(self, drafter: Drafter, tree_rows: int = 0) -> DraftStopRule | None:
        """Where a draft model should stop drafting now (None for lookups, or its p-min).

        A draft token is worth a verification row (the mean extra cost of the rows of a
        batch of :data:`STOP_RULE_BATCH` over a single step) where its chance of being kept,
        times the target step it then saves, is at least that row; going on to the next
        token costs a draft model step more. ``tree_rows``: the most rows a batch with a
        sibling branch may have (0: none), whose extra rows the rule then prices one by one.
        """
        costs = self.draft_costs(drafter)
        if costs is None or drafter.lookup or not self.learn_stop:
            return None
        target = self.target_costs
        step = max(1e-9, target.cost(1))
        row = max(0.0, (target.cost(STOP_RULE_BATCH) - target.cost(1)) / (STOP_RULE_BATCH - 1))
        extra_row = tuple(
            max(0.0, target.cost(rows + 1) - target.cost(rows)) / step
            for rows in range(1, min(tree_rows, MAX_TREE_ROWS))
        )
        kept = self._kept.get(drafter) or ConfidenceKept()
        return DraftStopRule(
            kept.rates(),
            keep_floor=min(1.0, row / step),
            go_on_floor=min(1.0, (costs.cost(1) + row) / step),
            extra_row=extra_row,
        )

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

    def _drafting_seconds(
        self, drafter: Drafter, stops: Sequence[Sequence[float]], catch_up: int
    ) -> tuple[list[float], float]:
        """Per planned length, a draft model's expected drafting time; and its one-time reading.

        ``stops[k][n]``: the chance that a plan of ``k`` tokens stops after ``n``. Lookups
        cost nothing here (their time is the loop's overhead).
        """
        costs = self.draft_costs(drafter)
        if costs is None:
            return [0.0] * len(stops), 0.0
        steady = max(1, min(catch_up, STEADY_CATCH_UP))
        one_time = max(0.0, costs.cost(max(1, catch_up)) - costs.cost(steady))
        drafting = [0.0]
        for k in range(1, len(stops)):
            # One forward pass per drafted token that is not the last of the plan, after
            # catching the draft's cache up (its pass gives the first token).
            passes = sum(stop * min(n, k - 1) for n, stop in enumerate(stops[k]))
            drafting.append(costs.cost(steady) + passes * costs.cost(1))
        return drafting, one_time

    def _refused_drafting_seconds(self, drafter: Drafter, limit: int, unread: int) -> list[float]:
        """Per planned length, a drafter's drafting time if it drafts all of it (its worst).

        A draft model catches up (its reading included) and steps once per token after the
        first; a lookup's proposal is already made.
        """
        costs = self.draft_costs(drafter)
        if costs is None:
            return [0.0] * (limit + 1)
        catch_up = costs.cost(max(1, unread))
        return [0.0] + [catch_up + (k - 1) * costs.cost(1) for k in range(1, limit + 1)]

    def worst_loss(self, drafting: float, k: int, chunk: int | None) -> float:
        """Seconds a round of ``k`` drafted tokens loses against plain's pace at worst.

        Every drafted token refused: ``drafting`` (the drafter's time for all ``k``), the
        first verification batch (``chunk`` rows, or all ``k + 1``) and the loop's own
        time, less the one token the round still gives at plain's pace.
        """
        rows = k + 1 if chunk is None else max(1, min(chunk, k + 1))
        plain = self.watch.cautious_plain_seconds() or 1.0 / self.plain_rate()
        return drafting + self.target_costs.cost(rows) + self._overhead - plain

    def _round_seconds(self, stops: Sequence[float], verify: Sequence[float]) -> float:
        """Expected verification and overhead time of a plan whose drafter stops as ``stops``."""
        seconds = self._overhead
        for n, stop in enumerate(stops):
            seconds += stop * verify[n]
        return seconds

    def _best_length(
        self,
        candidate: Candidate,
        exact_chunk: int | None,
        horizon: int,
        loss_limit: float | None = None,
    ) -> tuple[int, float, int | None]:
        """The draft length (1..limit) and verification chunk with the highest expected rate.

        Returns (length, rate, chunk); (0, 0.0, ...) where nothing fits. A draft model's
        catch-up beyond :data:`STEADY_CATCH_UP` tokens is spread over the next ``horizon``
        tokens (capped at :data:`CATCH_UP_HORIZON`). ``loss_limit``: the seconds the round
        may lose at worst (:meth:`worst_loss`; None: no bound).
        """
        drafter, limit = candidate.drafter, candidate.limit
        evidence = 0 if candidate.proposal is None else candidate.proposal.evidence
        optimism = 0.0 if drafter.lookup else DRAFT_MODEL_OPTIMISM
        reach = self._read_acceptance(drafter, evidence).reach(limit, optimism=optimism)
        # given[n]: P(the drafter gives at least n tokens); a lookup's proposal is all there.
        given = [1.0] * (limit + 1)
        if not drafter.lookup:
            given = (self._continuation.get(drafter) or self._new_continuation()).reach(limit)
        # Per planned length k: the expected tokens, the chance that the drafter stops at
        # each n <= k, the drafting time; none of them depends on the verification chunk.
        expected = expected_tokens(reach, given)
        stops: list[list[float]] = [[]] + [
            [given[n] - (given[n + 1] if n < k else 0.0) for n in range(k + 1)]
            for k in range(1, limit + 1)
        ]
        drafting, one_time = self._drafting_seconds(drafter, stops, candidate.unread)
        refused = self._refused_drafting_seconds(drafter, limit, candidate.unread)
        best_k, best_rate, best_chunk = 0, 0.0, exact_chunk
        for chunk in self.verify_chunks(exact_chunk):
            if chunk is not None and chunk > limit and chunk != exact_chunk:
                continue  # checks every possible draft in one batch, as the first candidate
            # Verifying n drafted tokens, for every n the drafter may stop at.
            verify = [self.verify_seconds(n, reach, chunk) for n in range(limit + 1)]
            for k in range(1, limit + 1):
                if loss_limit is not None and self.worst_loss(refused[k], k, chunk) > loss_limit:
                    break  # a longer draft loses more at worst
                rate = expected[k] / (self._round_seconds(stops[k], verify) + drafting[k])
                if rate > best_rate:
                    best_k, best_rate, best_chunk = k, rate, chunk
        if one_time > 0.0 and best_rate > 0.0:
            tokens = max(1, min(horizon, CATCH_UP_HORIZON))
            best_rate = tokens / (tokens / best_rate + one_time)
        return best_k, best_rate, best_chunk

    # -- planning --------------------------------------------------------------------------

    def plan(
        self,
        candidates: Sequence[Candidate],
        exact_chunk: int | None,
        horizon: int = CATCH_UP_HORIZON,
    ) -> RoundPlan:
        """Choose this round's plan among ``candidates`` and plain decoding; changes nothing.

        ``horizon``: how many tokens the generation may still produce.
        """
        plain = self.plain_rate()
        best = RoundPlan(None, 0, None, plain, plain)
        if self.watch.wants_plain_round():
            return best  # plain's own pace, measured (first, or again after long speculation)
        # What this round may lose at worst: the answer's balance and allowance.
        plain_seconds = self.watch.cautious_plain_seconds() or 1.0 / plain
        loss_limit = self.watch.headroom(horizon, plain_seconds)
        for candidate in candidates:
            evidence = 0 if candidate.proposal is None else candidate.proposal.evidence
            if candidate.limit <= 0 or self.watch.benched(candidate.drafter, evidence):
                continue
            # Not yet proven in this answer: its reading must pay within its judged rounds.
            pays_within = horizon
            if not self.watch.proven(candidate.drafter):
                pays_within = min(horizon, TRIAL_HORIZON)
            k, rate, chunk = self._best_length(candidate, exact_chunk, pays_within, loss_limit)
            if k > 0 and rate > best.expected_rate:
                best = RoundPlan(candidate.drafter, k, candidate.proposal, rate, plain, chunk)
        if best.drafter is not None and best.expected_rate < plain * GAIN_MARGIN:
            best = RoundPlan(None, 0, None, plain, plain)
        return best

    # -- learning --------------------------------------------------------------------------

    def observe(self, outcome: RoundOutcome) -> None:
        """Learn from one round once it has ended, in the order the round ran.

        The plan's proposals become shadows and the draft models it left unused drift back
        towards optimism; the forward passes refine the costs; the target's confidence, the
        draft models' prior; the verified draft, the drafter's acceptance (a draft model
        that gave fewer tokens than planned stopped where it was unsure: that is learnt
        apart, :meth:`continuation`, with its tokens' probabilities and whether they were
        kept, :meth:`stop_rule`) and the loop's overhead; the tokens that followed score
        the shadows.
        """
        plan = outcome.plan
        if plan is not None:
            for candidate in outcome.candidates:
                if candidate.proposal is not None:
                    self._add_shadow(candidate.drafter, candidate.proposal, outcome.start)
            for drafter in self.drafters:
                unused = self._acceptance.get((drafter, 0))
                if drafter is not plan.drafter and not drafter.lookup and unused is not None:
                    unused.fade(UNUSED_DRIFT)
            draft_costs = None if plan.drafter is None else self.draft_costs(plan.drafter)
            if draft_costs is not None:
                for size, seconds in outcome.draft_passes:
                    draft_costs.observe(size, seconds)
        for size, seconds in outcome.target_passes:
            self.target_costs.observe(size, seconds)
        if outcome.target_confidence is not None:
            self._learn_confidence(outcome.target_confidence)
            self._rounds_unmeasured = 0
        elif plan is not None:
            self._rounds_unmeasured += 1
        if outcome.verified is None:
            return
        if plan is not None:
            plain_estimate = 1.0 / plan.plain_rate if plan.plain_rate > 0.0 else None
            self.watch.observe(plan.drafter, outcome.tokens, outcome.seconds, plain_estimate)
            self._learn_acceptance(plan, outcome.verified, outcome.accepted)
            if outcome.overhead_seconds >= 0.0:
                self._overhead += COST_SMOOTHING * (outcome.overhead_seconds - self._overhead)
        self._score_shadows(outcome.context)

    def _learn_confidence(self, probability: float) -> None:
        """The target's probability of its own token this round (a softmax maximum)."""
        self._confidence_rounds += 1
        weight = 1.0 / min(self._confidence_rounds, CONFIDENCE_MEMORY)
        self._target_confidence += weight * (probability - self._target_confidence)
        self._refresh_priors()

    def _learn_acceptance(self, plan: RoundPlan, verified: Draft, accepted: int) -> None:
        drafter = plan.drafter
        drafted = len(verified.tokens)
        if drafter is not None and not drafter.lookup and plan.draft_tokens > 0:
            self.continuation(drafter).observe(plan.draft_tokens, drafted)
            self.kept_by_confidence(drafter).observe(verified.confidences, accepted)
        if drafter is not None and drafted > 0:
            self.acceptance(drafter, verified.evidence).observe(drafted, accepted)
            self._shadows = [s for s in self._shadows if s.drafter is not drafter]

    def _add_shadow(self, drafter: Drafter, proposal: Draft, start: int) -> None:
        if any(shadow.drafter is drafter for shadow in self._shadows):
            return
        tokens = list(proposal.tokens[:SHADOW_LIMIT])
        self._shadows.append(_Shadow(drafter, proposal.evidence, start, tokens))

    def _score_shadows(self, context: Sequence[int]) -> None:
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

        The target's confidence is measured afresh on the new answer, and every drafter the
        earnings watch sent to sit out is judged afresh too.
        """
        self.forget_shadows()
        self.watch.start_answer()
        self._target_confidence = 0.0
        self._confidence_rounds = 0
        self._rounds_unmeasured = 0
        self._confidence_expected = True
        for (drafter, _level), estimate in self._acceptance.items():
            if not drafter.lookup:
                estimate.fade(NEW_ANSWER_FADE)
        for estimate in self._continuation.values():
            estimate.fade(NEW_ANSWER_FADE)
        self._refresh_priors()
