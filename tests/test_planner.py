"""The cost model: batch costs, per-position acceptance, and the planner's choices."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from backends.engines.interface import common_prefix_length
from backends.speculation.earnings import JUDGED_ROUNDS, PLAIN_FIRST_MEASURE
from backends.speculation.estimates import BatchCosts, ConfidenceKept, PositionAcceptance
from backends.speculation.planner import (
    CATCH_UP_HORIZON,
    CONFIDENCE_ROUNDS,
    DRAFT_MODEL_PRIOR,
    UNUSED_DRIFT,
    DraftPlanner,
)
from backends.speculation.rounds import Candidate, RoundOutcome, RoundPlan
from backends.speculation.types import Draft, DrafterStats

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from backends.engines.llama import LlamaEngine
    from backends.speculation.grammar import GrammarMatcher
    from backends.speculation.sampling import SamplingSettings
    from backends.speculation.types import DraftStopRule


@dataclass(eq=False)  # drafters are told apart by identity (the planner keys by them)
class FixedLookup:
    """A lookup drafter that always proposes the same tokens (for planner decisions)."""

    proposal: list[int]
    evidence: int = 20
    name: str = "lookup"
    lookup: bool = True
    engine: None = None
    stats: DrafterStats = field(default_factory=DrafterStats)

    def draft(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        rng: np.random.Generator,
        cancel: object,
        stop: DraftStopRule | None = None,
        *,
        grammar: GrammarMatcher | None = None,
    ) -> Draft:
        return Draft(self.proposal[:max_tokens], None, evidence=self.evidence)

    def unread(self, context: Sequence[int]) -> int:
        return 0


@dataclass
class SeenTokens:
    """What a draft model's cache holds (all the planner asks of its engine)."""

    cached_tokens: list[int] = field(default_factory=list)


@dataclass(eq=False)
class ModelLike:
    """Stands in for a draft model drafter: not a lookup, costs come from the planner."""

    name: str = "draft model"
    lookup: bool = False
    # Its costs are given to the planner directly; an engine only says what it has read
    # (a SeenTokens: Any, since the Drafter protocol names a whole ModelEngine).
    engine: Any = None
    stats: DrafterStats = field(default_factory=DrafterStats)
    reads_at_most: int | None = None  # a reading window (None: what it has not seen)

    def draft(self, *_args: object, **_kwargs: object) -> Draft:
        raise AssertionError("the planner must not draft by itself")

    def unread(self, context: Sequence[int]) -> int:
        if self.engine is None:
            return 1  # no cache to follow: as if it had read everything
        held = common_prefix_length(self.engine.cached_tokens, context)
        unseen = max(1, len(context) - held)
        return unseen if self.reads_at_most is None else min(unseen, self.reads_at_most)


def linear(per_token: float, fixed: float = 0.0) -> BatchCosts:
    return BatchCosts({b: fixed + per_token * b for b in (1, 2, 4, 8, 16)})


def offered(
    planner: DraftPlanner, context: Sequence[int], limits: dict[Any, int]
) -> list[Candidate]:
    """What the loop offers the plan: each lookup's proposal, each draft model it is ready for."""
    candidates = []
    for drafter in planner.drafters:
        limit = limits.get(drafter, 0)
        if limit <= 0:
            continue
        if drafter.lookup:
            proposal = drafter.draft(context, limit, None, None, None)  # type: ignore[arg-type]
            if proposal.tokens:
                candidates.append(Candidate(drafter, len(proposal.tokens), proposal))
        elif planner.draft_model_ready():
            candidates.append(Candidate(drafter, limit, unread=drafter.unread(context)))
    return candidates


def plan(
    planner: DraftPlanner,
    context: Sequence[int],
    limits: dict[Any, int],
    exact_chunk: int | None = None,
    horizon: int = CATCH_UP_HORIZON,
) -> RoundPlan:
    """The planner's plan for a round, as the loop asks for it."""
    return planner.plan(offered(planner, context, limits), exact_chunk, horizon)


def verified(
    chosen: RoundPlan, drafted: int, accepted: int, confidences: Sequence[float] = ()
) -> RoundOutcome:
    """A round of ``chosen`` whose draft of ``drafted`` tokens had ``accepted`` accepted."""
    draft = Draft(list(range(drafted)), None, confidences=list(confidences))
    return RoundOutcome(chosen, verified=draft, accepted=accepted)


def confidence(probability: float) -> RoundOutcome:
    """The prompt's round: the target's confidence in its own token, nothing planned."""
    return RoundOutcome(target_confidence=probability)


def test_batch_costs_interpolate_extrapolate_and_learn() -> None:
    costs = BatchCosts({1: 0.02, 4: 0.05, 8: 0.06})
    assert costs.cost(1) == 0.02
    assert costs.cost(2) == pytest.approx(0.03)
    assert costs.cost(6) == pytest.approx(0.055)
    assert costs.cost(16) == pytest.approx(0.06 + 8 * 0.06 / 8)
    costs.observe(1, 0.04)
    assert 0.02 < costs.cost(1) < 0.04
    costs.observe(3, 0.1)
    assert costs.cost(3) == 0.1


def test_position_acceptance_chains_conditional_rates() -> None:
    acceptance = PositionAcceptance(prior=0.5)
    for _ in range(200):
        acceptance.observe(drafted=4, accepted=4)
    reach = acceptance.reach(4)
    assert reach[0] == 1.0
    assert reach[4] > 0.9
    fresh = PositionAcceptance(prior=0.5)
    for _ in range(200):
        fresh.observe(drafted=4, accepted=0)  # the first token always refused
    assert fresh.rate(0) < 0.05
    # Position 2 was never reached: it keeps its prior.
    assert fresh.rate(1) == pytest.approx(0.5)


def test_verify_cost_counts_chunks_only_when_reached() -> None:
    planner = DraftPlanner(linear(0.01), [])
    reach = [1.0, 0.5, 0.25, 0.125, 0.0625]
    # 4 drafted tokens = 5 rows; chunks of 2: rows 0-1 always, rows 2-3 if tokens 1-2
    # were accepted (0.25), row 4 if tokens 1-4 were (0.0625).
    expected = 0.02 + 0.25 * 0.02 + 0.0625 * 0.01
    assert planner.verify_seconds(4, reach, chunk=2) == pytest.approx(expected)
    assert planner.verify_seconds(4, reach, chunk=None) == pytest.approx(0.05)


def test_plain_decoding_when_batches_cost_as_much_as_single_steps() -> None:
    lookup = FixedLookup(list(range(16)))
    planner = DraftPlanner(linear(0.02), [lookup])
    for _ in range(50):
        planner.acceptance(lookup, 20).observe(16, 16)  # even perfect drafts do not pay
    chosen = plan(planner, [1, 2, 3], {lookup: 16})
    assert chosen.drafter is None
    assert chosen.draft_tokens == 0


def test_long_lookup_drafts_when_batches_are_cheap_and_drafts_good() -> None:
    lookup = FixedLookup(list(range(16)))
    planner = DraftPlanner(linear(0.005, fixed=0.02), [lookup])
    for _ in range(50):
        planner.acceptance(lookup, 20).observe(16, 16)
    chosen = plan(planner, [1, 2, 3], {lookup: 16})
    assert chosen.drafter is lookup
    assert chosen.draft_tokens >= 12
    assert chosen.expected_rate > chosen.plain_rate * 2
    # Verified in exact chunks of one token, the same drafts no longer pay.
    chosen = plan(planner, [1, 2, 3], {lookup: 16}, 1)
    assert chosen.drafter is None


def test_a_long_draft_that_may_break_early_is_verified_in_chunks_where_rows_cost_more() -> None:
    lookup = FixedLookup(list(range(16)))
    # A CPU with SpecDeck's kernels: a few rows cost about one step, past them every row
    # costs more; a GPU: a batch costs one step whatever its size.
    cpu = BatchCosts({1: 0.023, 2: 0.026, 4: 0.034, 8: 0.062, 16: 0.124})
    gpu = BatchCosts({b: 0.01 for b in (1, 2, 4, 8, 16)})
    chunks = {}
    for name, costs in (("cpu", cpu), ("gpu", gpu)):
        planner = DraftPlanner(costs, [lookup])
        for round_number in range(50):
            # Copies right to the end 3 times in 5, else broken after the first token.
            accepted = 16 if round_number % 5 < 3 else 1
            planner.acceptance(lookup, 20).observe(16, accepted)
        chosen = plan(planner, [1, 2, 3], {lookup: 16})
        assert chosen.drafter is lookup, name
        assert chosen.draft_tokens >= 12, name
        chunks[name] = chosen.verify_chunk
        # The chunk the plan names is the one its expected time was computed with.
        reach = planner.acceptance(lookup, 20).reach(chosen.draft_tokens)
        one_batch = planner.verify_seconds(chosen.draft_tokens, reach, None)
        chunked = planner.verify_seconds(chosen.draft_tokens, reach, chosen.verify_chunk)
        assert chunked <= one_batch, name
    assert chunks["cpu"] is not None
    assert chunks["cpu"] <= 4  # 2 breaks in 5 after one token: small first chunks
    assert chunks["gpu"] is None  # chunks would only add passes
    # Never above the engine's bit-exact limit.
    planner = DraftPlanner(cpu, [lookup])
    assert plan(planner, [1, 2, 3], {lookup: 16}, 3).verify_chunk in (2, 3)


def test_draft_model_too_expensive_is_not_used() -> None:
    model = ModelLike()
    # A draft step at 60% of a target step (the default pair on a 2-core CPU).
    planner = DraftPlanner(linear(0.02, 0.005), [model], {model: linear(0.012, 0.003)})
    chosen = plan(planner, [1, 2, 3], {model: 3})
    assert chosen.drafter is None
    # A cheap draft (5% of a target step) with cheap batches pays even before any data.
    planner = DraftPlanner(linear(0.002, 0.02), [model], {model: linear(0.001)})
    chosen = plan(planner, [1, 2, 3], {model: 8})
    assert chosen.drafter is model
    assert 1 <= chosen.draft_tokens <= 8


def test_bad_acceptance_turns_a_draft_model_off_and_learns_back() -> None:
    model = ModelLike()
    planner = DraftPlanner(linear(0.002, 0.02), [model], {model: linear(0.001)})
    chosen = plan(planner, [1], {model: 4})
    assert chosen.drafter is model
    for _ in range(40):
        planner.observe(verified(chosen, 4, 0))
    assert plan(planner, [1], {model: 4}).drafter is None


def test_unused_lookup_proposals_are_scored_against_what_followed() -> None:
    lookup = FixedLookup([7, 8, 9, 10])
    planner = DraftPlanner(linear(0.02), [lookup])  # linear costs: lookups never used
    before = planner.acceptance(lookup, 20).rate(0)
    context = [1, 2, 3]
    for _ in range(30):
        candidates = offered(planner, context, {lookup: 4})
        chosen = planner.plan(candidates, None)
        assert chosen.drafter is None
        start, context = len(context), [*context, 7, 8, 9, 10]  # exactly the proposal followed
        planner.observe(
            RoundOutcome(chosen, candidates, start, verified=Draft([], None), context=context)
        )
    assert planner.acceptance(lookup, 20).rate(0) > max(before, 0.9)


def test_calibration_on_a_real_engine(smollm_target: LlamaEngine) -> None:
    costs = BatchCosts.calibrate(smollm_target, (1, 2, 4))
    assert set(costs.seconds) == {1, 2, 4}
    assert all(seconds > 0 for seconds in costs.seconds.values())
    assert costs.cost(4) > costs.cost(1)
    assert list(smollm_target.cached_tokens) == []


def test_a_draft_model_behind_by_the_prompt_is_still_used() -> None:
    # A draft at 40 % of a target step, batches of 4 for 1.6 steps (the default pair on a
    # 2-core CPU, with the draft's Q4_0 copy): it pays at high acceptance.
    target = BatchCosts({1: 0.072, 2: 0.108, 3: 0.133, 4: 0.117, 8: 0.203, 16: 0.3})
    draft = BatchCosts({1: 0.029, 2: 0.045, 4: 0.039, 8: 0.07, 16: 0.12, 64: 0.3})
    model = ModelLike(engine=SeenTokens())  # it has read nothing yet
    planner = DraftPlanner(target, [model], {model: draft})
    for _ in range(40):
        planner.acceptance(model).observe(3, 3)
    # Its rounds were judged to pay in this answer (until then its reading must pay
    # within its trial: tests/test_earnings.py).
    for _ in range(PLAIN_FIRST_MEASURE):
        planner.watch.observe(None, 1, 0.072)
    for _ in range(JUDGED_ROUNDS):
        planner.watch.observe(model, 4, 0.072)
    assert planner.watch.proven(model)
    # Charged to one round, reading a 200-token prompt (about 0.9 s) would never pay, and
    # the draft, never used, would fall further behind every round.
    context = list(range(200))
    chosen = plan(planner, context, {model: 3}, horizon=128)
    assert chosen.drafter is model
    assert chosen.draft_tokens == 3
    # Spread over the tokens still to come: with two tokens left it does not pay.
    assert plan(planner, context, {model: 3}, horizon=2).drafter is None


def test_what_a_draft_model_must_read_is_the_drafters_to_say() -> None:
    # The costs above; 32 tokens to go. Reading all of a 200-token prompt (about 0.9 s)
    # costs more than the draft would save over them, reading 56 of it does not.
    target = BatchCosts({1: 0.072, 2: 0.108, 3: 0.133, 4: 0.117, 8: 0.203, 16: 0.3})
    draft = BatchCosts({1: 0.029, 2: 0.045, 4: 0.039, 8: 0.07, 16: 0.12, 64: 0.3})
    context = list(range(200))
    chosen = []
    for reads_at_most in (None, 56):
        model = ModelLike(engine=SeenTokens(), reads_at_most=reads_at_most)
        planner = DraftPlanner(target, [model], {model: draft})
        for _ in range(40):
            planner.acceptance(model).observe(3, 3)
        chosen.append(plan(planner, context, {model: 3}, horizon=32).drafter)
    assert chosen[0] is None
    assert isinstance(chosen[1], ModelLike)


def test_a_draft_model_that_keeps_stopping_early_is_dropped() -> None:
    target = BatchCosts({1: 0.072, 2: 0.108, 3: 0.133, 4: 0.117, 8: 0.203, 16: 0.3})
    draft = BatchCosts({1: 0.029, 2: 0.045, 4: 0.039, 8: 0.07, 16: 0.12})
    model = ModelLike()
    planner = DraftPlanner(target, [model], {model: draft})
    chosen = plan(planner, [1], {model: 3})
    assert chosen.drafter is model
    # Every token it gives is right, but mostly it gives none (p-min stops it): each such
    # round costs a draft pass and a plain step for one token.
    for round_number in range(12):
        drafted = 1 if round_number % 4 == 0 else 0
        planner.observe(verified(chosen, drafted, drafted))
    assert planner.acceptance(model).rate(0) > 0.75
    assert planner.continuation(model).rate(0) < 0.4
    assert plan(planner, [1], {model: 3}).drafter is None


def test_a_new_answer_halves_what_the_last_taught_about_the_draft_model() -> None:
    model = ModelLike()
    lookup = FixedLookup([1, 2])
    planner = DraftPlanner(linear(0.02), [model, lookup], {model: linear(0.01)})
    for _ in range(30):
        planner.acceptance(model).observe(3, 3)
        planner.continuation(model).observe(3, 3)
        planner.acceptance(lookup, 20).observe(2, 2)
    seen = sum(planner.acceptance(model).reached)
    stops = sum(planner.continuation(model).reached)
    lookup_seen = sum(planner.acceptance(lookup, 20).reached)
    planner.start_answer()
    assert sum(planner.acceptance(model).reached) == pytest.approx(seen / 2)
    assert sum(planner.continuation(model).reached) == pytest.approx(stops / 2)
    # A lookup's record is about the chat, not the kind of text: kept.
    assert sum(planner.acceptance(lookup, 20).reached) == pytest.approx(lookup_seen)


def test_a_draft_model_waits_for_the_targets_confidence_and_takes_it_as_its_prior() -> None:
    model = ModelLike()
    planner = DraftPlanner(linear(0.002, 0.02), [model], {model: linear(0.001)})
    assert plan(planner, [1], {model: 4}).drafter is model  # no loop: on
    assert planner.acceptance(model).prior == DRAFT_MODEL_PRIOR
    planner.start_answer()
    # The first rounds of an answer measure how sure the target is of its own tokens.
    for _ in range(CONFIDENCE_ROUNDS - 1):
        planner.observe(confidence(0.95))
        assert plan(planner, [1], {model: 4}).drafter is None
    planner.observe(confidence(0.95))
    assert plan(planner, [1], {model: 4}).drafter is model
    assert planner.acceptance(model).prior == pytest.approx(0.95)
    assert planner.acceptance(model).rate(0) == pytest.approx(0.95)


def prose_planner(draft_step: float) -> tuple[DraftPlanner, ModelLike]:
    """A planner after 9 rounds of prose: the target averaged 0.73 on its own tokens.

    The target costs 55 ms a step and 58 ms for a batch of 4 (nearly free rows, as the
    1.5B on a 2-core Xeon with AMX).
    """
    model = ModelLike()
    target = BatchCosts({1: 0.055, 2: 0.056, 4: 0.058, 8: 0.083, 16: 0.146})
    planner = DraftPlanner(target, [model], {model: linear(draft_step, 0.001)})
    planner.start_answer()
    for probability in (0.99, 0.4, 0.7, 0.55, 0.9, 0.6, 0.95, 0.8, 0.7):
        planner.observe(confidence(probability))
    return planner, model


def test_on_prose_the_costs_decide_whether_a_draft_model_pays() -> None:
    # The prior follows the hesitating target, and a draft model is tried...
    planner, model = prose_planner(draft_step=0.011)
    assert planner.acceptance(model).prior == pytest.approx(planner._target_confidence)
    assert 0.6 < planner.acceptance(model).prior < 0.8
    assert plan(planner, [1], {model: 4}).drafter is model
    # ...then measured as the 0.5B is on prose: 60 % of its drafts keep the first token,
    # half of those the second, a third of those the third.
    dear, dear_model = prose_planner(draft_step=0.04)
    for index in range(30):
        accepted = (0, 0, 0, 0, 1, 1, 1, 2, 2, 3)[index % 10]
        planner.observe(verified(RoundPlan(model, 3), 3, accepted))
        dear.observe(verified(RoundPlan(dear_model, 3), 3, accepted))
    # A draft step a fifth of a target step: that pays, and the draft model goes on.
    assert plan(planner, [1], {model: 4}).drafter is model
    # Three quarters of a target step: it does not, and the draft model rests.
    assert plan(dear, [1], {dear_model: 4}).drafter is None


def test_confidence_kept_starts_at_the_draft_probability_and_learns() -> None:
    kept = ConfidenceKept(buckets=10)
    assert kept.rates() == pytest.approx([0.05 + 0.1 * i for i in range(10)])
    # Three tokens drafted, the first kept, the second rejected: the third was never judged.
    for _ in range(20):
        kept.observe([0.95, 0.42, 0.97], accepted=1)
    rates = kept.rates()
    assert rates[9] > 0.95  # 0.95 kept every time (0.97 was never judged)
    assert rates[4] < 0.05  # 0.42 never kept
    assert rates[0] == pytest.approx(0.05)  # no data: the prior
    assert kept.reached[9] == pytest.approx(kept.kept[9])
    kept.observe([], accepted=0)  # a draft of nothing teaches nothing
    assert kept.rates() == rates


def test_stop_rule_floors_come_from_the_costs() -> None:
    model = ModelLike()
    # A target step 30 ms, a batch of 4 45 ms (5 ms a row), a draft step 10 ms.
    target = BatchCosts({1: 0.030, 4: 0.045})
    planner = DraftPlanner(target, [model, FixedLookup([1])], {model: BatchCosts({1: 0.010})})
    rule = planner.stop_rule(model)
    assert rule is not None
    assert rule.keep_floor == pytest.approx(0.005 / 0.030)
    assert rule.go_on_floor == pytest.approx(0.015 / 0.030)
    assert rule.kept_chance(0.93) == pytest.approx(0.95)
    assert rule.kept_chance(1.0) == pytest.approx(0.95)  # the top bucket holds 1.0
    assert planner.stop_rule(planner.drafters[1]) is None  # lookups have none
    # What a round teaches lands in the rule.
    chosen = RoundPlan(model, 3)
    for _ in range(10):
        planner.observe(verified(chosen, 3, 1, confidences=[0.9, 0.65, 0.6]))
    learnt = planner.stop_rule(model)
    assert learnt is not None
    assert learnt.kept_chance(0.65) < 0.2 < 0.9 < learnt.kept_chance(0.9)


def trained_auto_planner() -> tuple[DraftPlanner, ModelLike, FixedLookup]:
    """A planner for a draft model and a lookup, ten rounds into an answer."""
    model = ModelLike()
    lookup = FixedLookup([5, 6, 7, 8], evidence=4)
    planner = DraftPlanner(linear(0.004, 0.02), [lookup, model], {model: linear(0.002)})
    planner.start_answer()
    for probability in (0.9, 0.8, 0.95, 0.7, 0.9, 0.85, 0.9, 0.99, 0.6):
        planner.observe(confidence(probability))
    for accepted in (3, 1, 0, 3, 2):
        planner.observe(verified(RoundPlan(model, 3), 3, accepted, [0.9, 0.7, 0.95]))
        planner.acceptance(lookup, 4).observe(4, accepted)
    return planner, model, lookup


def planner_state(planner: DraftPlanner) -> str:
    """Every number the planner plans with, as text."""
    return repr(
        (
            planner.target_costs,
            planner._draft_costs,
            planner._acceptance,
            planner._continuation,
            [(k.reached, k.kept) for k in planner._kept.values()],
            planner._overhead,
            planner._target_confidence,
            planner._confidence_rounds,
            planner._shadows,
        )
    )


def test_a_plan_changes_nothing() -> None:
    planner, model, lookup = trained_auto_planner()
    before = planner_state(planner)
    candidates = offered(planner, [1, 2, 3], {model: 4, lookup: 4})
    assert {c.drafter for c in candidates} == {model, lookup}
    first = planner.plan(candidates, 4)
    assert planner_state(planner) == before
    assert planner.plan(candidates, 4) == first  # the same estimates give the same plan
    assert planner.stop_rule(model) == planner.stop_rule(model)
    assert planner_state(planner) == before


def test_one_observation_a_round_in_the_order_the_round_ran() -> None:
    planner, model, lookup = trained_auto_planner()
    model_seen = sum(planner.acceptance(model).reached)
    lookup_seen = sum(planner.acceptance(lookup, 4).reached)
    context = [1, 2, 3]
    candidates = offered(planner, context, {lookup: 4})
    chosen = RoundPlan(None, 0)  # plain decoding: the lookup's proposal becomes a shadow
    planner.observe(
        RoundOutcome(chosen, candidates, len(context), [], [(1, 0.03)], 0.5, Draft([], None))
    )
    # The draft model sat the round out: its record drifted back towards its prior.
    assert sum(planner.acceptance(model).reached) == pytest.approx(model_seen * UNUSED_DRIFT)
    assert planner.target_costs.cost(1) == pytest.approx(0.024 + 0.25 * (0.03 - 0.024))
    assert planner._confidence_rounds == 10
    # The proposal waits for the tokens that follow, then is scored against them.
    assert [s.tokens for s in planner._shadows] == [[5, 6, 7, 8]]
    context = [*context, 5, 6, 9]
    planner.observe(RoundOutcome(RoundPlan(None, 0), verified=Draft([], None), context=context))
    assert planner._shadows == []
    reached = sum(planner.acceptance(lookup, 4).reached)
    assert reached == pytest.approx(lookup_seen * 0.98 + 3)  # 2 matched, the 3rd refused
    # A round cancelled after drafting teaches what the draft cost, and nothing else.
    learnt = repr((planner._acceptance, planner._continuation, planner._kept, planner._overhead))
    planner.observe(RoundOutcome(RoundPlan(model, 3), draft_passes=[(2, 0.005)]))
    assert planner._draft_costs[model].cost(2) == pytest.approx(0.004 + 0.25 * (0.005 - 0.004))
    assert (
        repr((planner._acceptance, planner._continuation, planner._kept, planner._overhead))
        == learnt
    )


def test_the_prior_follows_the_targets_confidence_without_being_asked() -> None:
    planner, model, _lookup = trained_auto_planner()
    prior = planner.acceptance(model).prior
    assert prior == pytest.approx(planner._target_confidence)
    planner.observe(confidence(0.1))
    assert planner.acceptance(model).prior == planner.draft_model_prior() < prior
    planner.start_answer()
    assert planner.acceptance(model).prior == DRAFT_MODEL_PRIOR
