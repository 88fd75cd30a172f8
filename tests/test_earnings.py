"""The earnings watch: plain's measured pace; a drafter that does not pay sits out, then returns."""

from __future__ import annotations

import pytest

from backends.speculation.earnings import (
    ALLOWANCE_LOOKAHEAD,
    COPY_EVIDENCE,
    FIRST_BACKOFF,
    JUDGED_ROUNDS,
    LOSS_ALLOWANCE,
    MAX_BACKOFF,
    PLAIN_FIRST_MEASURE,
    PLAIN_PROBE_EVERY,
    PLAIN_SETTLE_EVERY,
    PLAIN_SETTLED,
    TRIAL_HORIZON,
    EarningsWatch,
)
from backends.speculation.estimates import BatchCosts
from backends.speculation.planner import CATCH_UP_HORIZON, DraftPlanner
from backends.speculation.rounds import RoundOutcome, RoundPlan
from backends.speculation.types import Draft
from tests.test_planner import FixedLookup, ModelLike, SeenTokens, linear, plan

PLAIN = 0.050  # seconds a plain round takes in these tests


def plain_rounds(watch: EarningsWatch, count: int = 4, seconds: float = PLAIN) -> None:
    for _ in range(count):
        watch.observe(None, 1, seconds)


def test_plain_pace_is_the_median_of_plain_rounds_and_unknown_before_one() -> None:
    watch = EarningsWatch()
    assert watch.plain_seconds() is None
    assert not watch.wants_plain_round()  # no timed round yet: planning on its own
    watch.observe(FixedLookup([1]), 2, PLAIN)
    assert watch.wants_plain_round()  # in a loop: plain's pace is measured first
    for seconds in (0.05, 0.05, 0.90, 0.05, 0.06):  # one stolen slice does not move it
        watch.observe(None, 1, seconds)
    assert watch.plain_seconds() == pytest.approx(0.05)


def test_a_drafter_that_earns_less_than_plain_sits_out_and_its_time_out_doubles() -> None:
    watch, lookup = EarningsWatch(), FixedLookup([1])
    plain_rounds(watch)
    # Each round: 2 tokens in 3 plain steps' time: 0.67x of plain.
    for _ in range(JUDGED_ROUNDS - 1):
        watch.observe(lookup, 2, 3 * PLAIN)
        assert not watch.benched(lookup)
    assert watch.earnings(lookup) is None  # not judged on fewer rounds
    watch.observe(lookup, 2, 3 * PLAIN)
    assert watch.backoffs == 1
    assert watch.benched(lookup)
    plain_rounds(watch, FIRST_BACKOFF - 1)
    assert watch.benched(lookup)
    plain_rounds(watch, 1)
    assert not watch.benched(lookup)  # the probe: tried again
    for _ in range(JUDGED_ROUNDS):
        watch.observe(lookup, 2, 3 * PLAIN)
    assert watch.backoffs == 2
    plain_rounds(watch, 2 * FIRST_BACKOFF - 1)
    assert watch.benched(lookup)  # twice as long this time
    plain_rounds(watch, 1)
    assert not watch.benched(lookup)


def test_a_drafter_that_pays_is_never_benched_and_paying_resets_the_backoff() -> None:
    watch, lookup = EarningsWatch(), FixedLookup([1])
    plain_rounds(watch)
    for _ in range(3 * JUDGED_ROUNDS):
        watch.observe(lookup, 3, 2 * PLAIN)  # 1.5x of plain
        assert not watch.benched(lookup)
    assert watch.earnings(lookup) == pytest.approx(1.5)
    for _ in range(JUDGED_ROUNDS):
        watch.observe(lookup, 1, 2 * PLAIN)  # now 0.5x: out for the first time out
    assert watch.benched(lookup)
    plain_rounds(watch, FIRST_BACKOFF)
    for _ in range(JUDGED_ROUNDS):
        watch.observe(lookup, 4, 2 * PLAIN)  # pays again
    for _ in range(JUDGED_ROUNDS):
        watch.observe(lookup, 1, 2 * PLAIN)
    plain_rounds(watch, FIRST_BACKOFF)
    assert not watch.benched(lookup)  # the backoff went back to the first


def test_the_backoff_stops_growing_at_its_maximum() -> None:
    watch, lookup = EarningsWatch(), FixedLookup([1])
    plain_rounds(watch)
    for _ in range(12):
        for _ in range(JUDGED_ROUNDS):
            watch.observe(lookup, 1, 4 * PLAIN)
        plain_rounds(watch, MAX_BACKOFF)
    for _ in range(JUDGED_ROUNDS):
        watch.observe(lookup, 1, 4 * PLAIN)
    plain_rounds(watch, MAX_BACKOFF - 1)
    assert watch.benched(lookup)
    plain_rounds(watch, 1)
    assert not watch.benched(lookup)


def test_a_lookup_on_a_long_match_comes_back_at_once_a_draft_model_does_not() -> None:
    watch, lookup, model = EarningsWatch(), FixedLookup([1]), ModelLike()
    plain_rounds(watch)
    for drafter in (lookup, model):
        for _ in range(JUDGED_ROUNDS):
            watch.observe(drafter, 1, 2 * PLAIN)
    assert watch.benched(lookup, evidence=COPY_EVIDENCE - 1)
    assert not watch.benched(lookup, evidence=COPY_EVIDENCE)
    assert watch.benched(model, evidence=COPY_EVIDENCE)


def test_until_plains_pace_settles_the_bound_takes_the_fastest_round_and_probes_often() -> None:
    """A neighbour's stolen slice in the first plain rounds neither sets the pace nor stays."""
    watch, lookup = EarningsWatch(), FixedLookup([1])
    watch.observe(lookup, 2, PLAIN)  # the first round, planned on the costs
    for _ in range(PLAIN_FIRST_MEASURE):
        assert watch.wants_plain_round()  # measured first, by plain rounds in a row
        watch.observe(None, 1, 3 * PLAIN if watch.plain_seconds() is None else PLAIN)
    # The loss bound takes the fastest, not the first; the earnings their median.
    assert watch.cautious_plain_seconds() == pytest.approx(PLAIN)
    assert watch.plain_seconds() == pytest.approx(2 * PLAIN)
    assert not watch.settled
    while not watch.settled:
        for _ in range(PLAIN_SETTLE_EVERY):
            assert not watch.wants_plain_round()
            watch.observe(lookup, 2, PLAIN)
        assert watch.wants_plain_round()  # a plain round soon, until the pace settles
        watch.observe(None, 1, PLAIN)
    assert PLAIN_FIRST_MEASURE < PLAIN_SETTLED
    for _ in range(PLAIN_SETTLE_EVERY):
        watch.observe(lookup, 2, PLAIN)
    assert not watch.wants_plain_round()  # settled: probed only after long speculation
    for _ in range(2):
        watch.observe(None, 1, 3 * PLAIN)
    # Settled, both are the median (3,1,1,1,3,3).
    assert watch.plain_seconds() == watch.cautious_plain_seconds() == pytest.approx(2 * PLAIN)


def test_long_speculation_asks_for_a_plain_round_to_measure_plain_again() -> None:
    watch, lookup = EarningsWatch(), FixedLookup([1])
    plain_rounds(watch, PLAIN_SETTLED)
    for _ in range(PLAIN_PROBE_EVERY - 1):
        watch.observe(lookup, 4, PLAIN)
    assert not watch.wants_plain_round()
    watch.observe(lookup, 4, PLAIN)
    assert watch.wants_plain_round()
    watch.observe(None, 1, PLAIN)
    assert not watch.wants_plain_round()


def round_outcome(
    planner: DraftPlanner, drafter: FixedLookup, tokens: int, seconds: float
) -> tuple[RoundPlan, RoundOutcome]:
    """What the loop reports of a round in which ``drafter``'s proposal was verified."""
    chosen = plan(planner, [1, 2, 3], {drafter: len(drafter.proposal)})
    verified = Draft(drafter.proposal[: chosen.draft_tokens], None, evidence=drafter.evidence)
    return chosen, RoundOutcome(
        chosen,
        verified=verified if chosen.drafter is not None else Draft([], None),
        accepted=tokens - 1 if chosen.drafter is not None else 0,
        tokens=tokens if chosen.drafter is not None else 1,
        seconds=seconds,
        context=[1, 2, 3],
    )


def test_the_planner_benches_a_lookup_its_costs_promised_would_pay() -> None:
    """Costs that say a batch is free, rounds that say it is not: the rounds win."""
    lookup = FixedLookup([7, 8, 9, 10], evidence=4)
    planner = DraftPlanner(linear(0.0, fixed=PLAIN), [lookup])  # a batch costs one step
    first, outcome = round_outcome(planner, lookup, 2, 4 * PLAIN)
    assert first.drafter is lookup  # no timed round yet: the costs decide
    planner.observe(outcome)
    for _ in range(PLAIN_FIRST_MEASURE):
        second, outcome = round_outcome(planner, lookup, 1, PLAIN)
        assert second.drafter is None  # now plain's pace is measured first
        planner.observe(outcome)
    for _ in range(JUDGED_ROUNDS - 1):
        chosen, outcome = round_outcome(planner, lookup, 2, 4 * PLAIN)  # 0.5x of plain
        assert chosen.drafter is lookup
        planner.observe(outcome)
    assert plan(planner, [1, 2, 3], {lookup: 4}).drafter is None
    assert planner.watch.backoffs == 1


def test_a_new_answer_judges_every_drafter_afresh_and_keeps_plains_pace() -> None:
    planner = DraftPlanner(linear(0.010, 0.004), [FixedLookup([1])])
    lookup = planner.drafters[0]
    watch = planner.watch
    plain_rounds(watch)
    for _ in range(3 * JUDGED_ROUNDS):  # three failures: a long time out
        watch.observe(lookup, 1, 3 * PLAIN)
        plain_rounds(watch, 0)
    assert watch.benched(lookup)
    planner.start_answer()
    assert not watch.benched(lookup)
    assert watch.plain_seconds() == pytest.approx(PLAIN)
    for _ in range(JUDGED_ROUNDS):  # failing again: the first backoff, not a doubled one
        watch.observe(lookup, 1, 3 * PLAIN)
    assert watch.benched(lookup)
    plain_rounds(watch, FIRST_BACKOFF)
    assert not watch.benched(lookup)


def test_until_a_draft_model_pays_in_an_answer_its_reading_must_pay_within_its_trial() -> None:
    # The AVX2 EPYC's measured costs: a 4-token batch is 2.7 steps, the draft's 16-token
    # batch 3.
    target = BatchCosts({1: 0.144, 2: 0.225, 4: 0.392, 8: 0.769, 16: 1.543})
    draft = BatchCosts({1: 0.036, 2: 0.061, 4: 0.107, 8: 0.212, 16: 0.424})
    model = ModelLike(engine=SeenTokens(list(range(100))))
    planner = DraftPlanner(target, [model], {model: draft})
    for _ in range(40):
        planner.acceptance(model).observe(3, 3)  # every drafted token kept
    behind = list(range(100 + FIRST_BACKOFF))  # what was written while it sat out once
    caught_up = list(range(100))
    watch = planner.watch
    assert not watch.proven(model)
    # Its reading must pay within TRIAL_HORIZON tokens: on these costs it cannot...
    assert plan(planner, behind, {model: 3}).drafter is None
    # ...and with nothing to read the trial is cheap, and it is made.
    assert plan(planner, caught_up, {model: 3}).drafter is model
    plain_rounds(watch)
    for _ in range(JUDGED_ROUNDS):
        watch.observe(model, 3, 2 * PLAIN)  # it pays
    assert watch.proven(model)
    # Proven: its reading is spread over the rest of the answer, as before the watch.
    assert plan(planner, behind, {model: 3}).drafter is model
    for _ in range(JUDGED_ROUNDS):
        watch.observe(model, 1, 2 * PLAIN)  # it stops paying: benched, proof gone
    assert not watch.proven(model)
    plain_rounds(watch, FIRST_BACKOFF)
    assert not watch.benched(model)
    assert plan(planner, behind, {model: 3}).drafter is None  # the probe it could not pay
    for _ in range(JUDGED_ROUNDS):
        watch.observe(model, 3, 2 * PLAIN)
    assert watch.proven(model)
    planner.start_answer()
    assert not watch.proven(model)  # each answer proves it afresh
    assert TRIAL_HORIZON < CATCH_UP_HORIZON


# -- the loss bound ------------------------------------------------------------------------

# The AVX2 EPYC's measured costs (docs/benchmarks.md, "Never slower"): a batch of 2 is 1.56
# steps, one of 16 about 10.7.
AVX2_TARGET = {1: 0.144, 2: 0.225, 4: 0.392, 8: 0.769, 16: 1.543}


def test_the_balance_is_what_speculative_rounds_won_or_lost_against_plains_pace() -> None:
    watch, lookup = EarningsWatch(), FixedLookup([1])
    assert watch.headroom(128, PLAIN) is None  # no answer: planned on its own, no bound
    watch.start_answer()
    assert watch.headroom(128, PLAIN) == pytest.approx(LOSS_ALLOWANCE * PLAIN * 128)
    plain_rounds(watch, 4)
    assert watch.balance == 0.0  # plain rounds neither win nor lose
    watch.observe(lookup, 3, 2 * PLAIN)  # 3 tokens in 2 steps' time: one step won
    assert watch.balance == pytest.approx(PLAIN)
    watch.observe(lookup, 1, 4 * PLAIN)  # 1 token in 4 steps' time: three lost
    assert watch.balance == pytest.approx(-2 * PLAIN)
    # The allowance grows with the answer's tokens (8 so far), up to the lookahead's end.
    assert watch.headroom(10, PLAIN) == pytest.approx(-2 * PLAIN + LOSS_ALLOWANCE * PLAIN * 18)
    assert watch.headroom(10_000, PLAIN) == pytest.approx(
        -2 * PLAIN + LOSS_ALLOWANCE * PLAIN * (8 + ALLOWANCE_LOOKAHEAD)
    )
    watch.start_answer()  # each answer keeps its own account
    assert (watch.balance, watch.answer_tokens) == (0.0, 0)


def test_the_balance_is_repriced_when_plains_pace_is_corrected() -> None:
    """Rounds credited against a slowed first plain round are judged again at the true pace."""
    watch, lookup = EarningsWatch(), FixedLookup([1])
    watch.start_answer()
    watch.observe(lookup, 2, 1.5 * PLAIN, plain_estimate=PLAIN)  # before any plain round
    assert watch.balance == pytest.approx(0.5 * PLAIN)  # priced as the costs said
    watch.observe(None, 1, 4 * PLAIN)  # a plain round a neighbour slowed fourfold
    assert watch.balance == pytest.approx(2 * 4 * PLAIN - 1.5 * PLAIN)
    for _ in range(3):
        watch.observe(lookup, 2, 3 * PLAIN)  # each "wins" 5 steps at that pace
    assert watch.balance > 20 * PLAIN
    watch.observe(None, 1, PLAIN)  # the true pace
    # 8 tokens in 10.5 steps: 2.5 steps lost, whatever was credited before.
    assert watch.balance == pytest.approx(-2.5 * PLAIN)


def test_a_round_is_planned_only_if_its_worst_loss_fits_shorter_drafts_first() -> None:
    """Where nothing was won yet, a long draft is cut to what the answer may lose."""
    lookup = FixedLookup(list(range(16)), evidence=16)  # a long match: sure of its tokens
    # Rows a third of a step up to 4, then cheaper: one batch of all 17 rows costs 4.25
    # steps, and with a lookup that copies right every time it is the best plan.
    steps = {1: 1.0, 2: 1.3, 4: 1.9, 8: 3.0, 16: 4.0}
    costs = BatchCosts({size: cost * PLAIN for size, cost in steps.items()})
    planner = DraftPlanner(costs, [lookup])
    for _ in range(30):
        planner.acceptance(lookup, 16).observe(16, 16)
    unbounded = plan(planner, [1, 2, 3], {lookup: 16})
    planner.start_answer()
    plain_rounds(planner.watch, 4)
    bounded = plan(planner, [1, 2, 3], {lookup: 16}, horizon=128)
    headroom = planner.watch.headroom(128, PLAIN)
    assert headroom is not None
    assert headroom == pytest.approx(LOSS_ALLOWANCE * PLAIN * (4 + 128))  # about 2 steps
    assert unbounded.draft_tokens >= 15
    assert unbounded.verify_chunk is None
    # The costs alone risk 3 steps or more: 16 rows for one token.
    assert planner.worst_loss(0.0, unbounded.draft_tokens, None) > headroom
    assert bounded.drafter is lookup
    assert planner.worst_loss(0.0, bounded.draft_tokens, bounded.verify_chunk) <= headroom
    assert (bounded.draft_tokens, bounded.verify_chunk) != (unbounded.draft_tokens, None)
    # Once speculation has won enough, the whole proposal is checked in one batch again.
    for _ in range(4):
        planner.watch.observe(lookup, 17, costs.cost(17))
    assert planner.watch.balance > 0.6 * PLAIN
    again = plan(planner, [1, 2, 3], {lookup: 16})
    assert (again.draft_tokens, again.verify_chunk) == (unbounded.draft_tokens, None)


def test_after_a_loss_beyond_the_allowance_nothing_is_planned_until_it_grows_back() -> None:
    lookup = FixedLookup([7, 8], evidence=16)
    planner = DraftPlanner(BatchCosts(dict(AVX2_TARGET)), [lookup])
    planner.start_answer()
    watch = planner.watch
    plain_rounds(watch, 4, seconds=AVX2_TARGET[1])
    assert plan(planner, [1], {lookup: 2}, horizon=64).drafter is lookup
    watch.observe(lookup, 1, 6 * AVX2_TARGET[1])  # a round that lost 5 steps
    assert plan(planner, [1], {lookup: 2}, horizon=64).drafter is None
    # Plain rounds win nothing back, but the answer grows and with it the allowance: a
    # one-token draft (at worst 0.56 steps lost) fits again once 5.56 steps are allowed.
    rounds = 0
    while plan(planner, [1], {lookup: 2}, horizon=64).drafter is None:
        watch.observe(None, 1, AVX2_TARGET[1])
        rounds += 1
        assert rounds < 400
    needed = (5 + 0.5625) / LOSS_ALLOWANCE - (5 + 64)  # tokens of answer the allowance needs
    assert rounds == pytest.approx(needed, abs=2)
