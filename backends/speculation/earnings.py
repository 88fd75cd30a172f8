"""What speculation actually earns, against plain decoding's measured pace; who sits out a while.

The planner chooses from estimates: batch costs calibrated at load, acceptance learnt as it
goes. Where those are wrong (a calibration a neighbour's burst fooled, an AVX2 CPU where
every row of a batch costs a third of a step, text where a drafter's guesses stop coming
true) a plan that looked faster is slower, round after round. :class:`EarningsWatch` keeps
the promise "never slower than plain" by construction, from nothing but the rounds that
generation runs anyway:

- **plain's pace**: the median wall time of the latest plain rounds (one token each, the
  loop's own time included), kept current by one now and then where speculation ran for
  long (:data:`PLAIN_PROBE_EVERY`). One round is not a measurement on a machine whose
  neighbours steal time slices (a busy process beside llama.cpp's threads made single
  steps of 15 ms take 128-171 ms now and then, 2-core EPYC Zen 4). So the first
  measurement, before the first speculation, is two plain rounds in a row, with one every
  :data:`PLAIN_SETTLE_EVERY` rounds of speculation until :data:`PLAIN_SETTLED` were seen;
  until then the loss bound takes the fastest of them (a stolen slice only ever lengthens
  a pass), the earnings their median (:meth:`EarningsWatch.cautious_plain_seconds`);
- **each drafter's earnings**: tokens over wall time of its latest rounds
  (:data:`JUDGED_ROUNDS`), drafting, verification and the loop's own time included;
- **backing off**: a drafter whose rounds earned less than plain's pace sits out
  (:meth:`benched`) for a number of rounds that doubles each time it fails again
  (:data:`FIRST_BACKOFF` up to :data:`MAX_BACKOFF`) and is reset when it pays. After its
  time out it is tried again: that is the cheap probe. A lookup whose proposal rests on a
  long match (the text turned copyable) comes back at once (:data:`COPY_EVIDENCE`).
- **proof**: a drafter has paid in this answer once a judgement of its rounds found it
  earning plain's pace (:meth:`proven`). Until then, the tokens it must read before its
  first draft (a draft model reads the prompt, or what was written while it sat out) must
  pay within its trial (:data:`TRIAL_HORIZON` tokens), not over the rest of the answer: on
  a CPU where a draft model's batches are dear that reading alone costs several steps of
  the main model (a 56-token read about 7 on a 2-core AVX2 EPYC), and a trial that could
  not earn it back is not made. Where reading is cheap, or speculation gains much (a GPU,
  an AVX-512 CPU), the trial is made as before; lookups read nothing.
- **the loss bound**: what speculation won or lost in this answer against plain's pace is
  kept as a balance (:attr:`EarningsWatch.balance`), priced at plain's pace as it is
  measured now: a pace corrected later re-prices the rounds that came before it, so a
  first plain round slowed by a neighbour cannot credit speculation with wins it never
  made. A round may be planned only if what
  it would lose at worst (every drafted token refused: its drafting, its first
  verification batch and its reading, less the one token it still gives) fits in that
  balance plus an allowance of :data:`LOSS_ALLOWANCE` of the answer's time at plain's
  pace (:meth:`EarningsWatch.headroom`). So an answer is never more than that share
  slower than plain decoding, whatever the estimates said, as long as plain's pace and
  the batch costs are measured right: where little was won, only short drafts (or drafts
  checked in small chunks) fit, and after a loss none until the allowance has grown back
  with the tokens written since; what speculation wins widens the room for longer ones.

Engine-neutral and pure Python: the planner owns one and feeds it in ``observe``.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backends.speculation.types import Drafter

# These numbers were chosen with the watch (2026-12-03), not tuned one by one; the watch
# as a whole is measured by `python -m benchmarks.never_slower` (docs/benchmarks.md,
# "Never slower").
PLAIN_MEMORY = 16  # plain rounds whose median is plain's pace
PLAIN_PROBE_EVERY = 64  # rounds of speculation after which one plain round re-measures it
PLAIN_FIRST_MEASURE = 2  # plain rounds in a row that first measure plain's pace
PLAIN_SETTLED = 4  # plain rounds after which their median is plain's pace (before: the fastest)
PLAIN_SETTLE_EVERY = 8  # rounds of speculation between plain rounds until plain's pace settles
JUDGED_ROUNDS = 6  # a drafter's latest rounds whose earnings are judged
PAY_FLOOR = 1.0  # earnings below this share of plain's pace: the drafter sits out
FIRST_BACKOFF = 8  # rounds sat out after a first failure; doubles with every next one
MAX_BACKOFF = 256
COPY_EVIDENCE = 8  # a lookup proposal on a match this long is tried even while it sits out
# The tokens within which a drafter not yet proven in an answer must pay its reading.
# Chosen 2026-12-04 between two measured cost tables: the default pair's draft still gets
# its trial after a 56-token read on the 2-core AVX-512 machines' costs (Q4_0 draft copy,
# tests/test_planner.py) and does not on the 2-core AVX2 EPYC's, where that read costs
# about 7 main steps and the best the draft allows is 1.15x (docs/benchmarks.md, "Never
# slower"); with 12 tokens (two a judged round) the AVX-512 trial was refused too.
TRIAL_HORIZON = 32
# The share of an answer's time at plain decoding's pace that speculation may lose at worst
# (issue 33: auto at least 0.97x plain in every run; the rest of the margin is measurement
# noise and the loop's own time). The answer's length it is a share of: the tokens written
# so far and those still allowed, at most ALLOWANCE_LOOKAHEAD of them (an answer that ends
# at its end-of-generation token sooner has spent less of it).
LOSS_ALLOWANCE = 0.015
ALLOWANCE_LOOKAHEAD = 128


@dataclass
class _DrafterEarnings:
    """One drafter's latest rounds and its time out."""

    rounds: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=JUDGED_ROUNDS))
    benched_until: int = 0  # the round number from which it may draft again
    backoff: int = FIRST_BACKOFF
    proven: bool = False  # a judgement of its rounds in this answer found that it pays


class EarningsWatch:
    """Plain decoding's measured pace, each drafter's measured earnings, and who sits out."""

    def __init__(self) -> None:
        self.round = 0  # rounds seen (every decode round, plain or not)
        self.backoffs = 0  # how often a drafter was sent to sit out
        self._plain: deque[float] = deque(maxlen=PLAIN_MEMORY)
        self._since_plain = 0
        self._drafters: dict[Drafter, _DrafterEarnings] = {}
        # The loss bound, per answer (start_answer): the tokens the answer's rounds gave,
        # and its speculative rounds' tokens and seconds (the balance prices them).
        self.answer_tokens = 0
        self._speculative_tokens = 0
        self._speculative_seconds = 0.0
        self._plain_estimate: float | None = None  # the costs' plain pace, before one is measured
        self._in_answer = False  # an answer started: the planner runs in a loop

    # -- what the planner asks -------------------------------------------------------------

    def plain_seconds(self) -> float | None:
        """Plain decoding's measured seconds per token: the latest plain rounds' median.

        None before a plain round. What a drafter's earnings are judged against.
        """
        return statistics.median(self._plain) if self._plain else None

    def cautious_plain_seconds(self) -> float | None:
        """Plain's pace as the loss bound takes it: the fastest plain round until settled.

        Until :data:`PLAIN_SETTLED` plain rounds were seen, one slowed by a neighbour would
        move their median, and a slow plain pace credits speculation with wins; the fastest
        round cannot be slowed (a stolen slice only lengthens a pass). Settled: the median.
        """
        if self.settled or not self._plain:
            return self.plain_seconds()
        return min(self._plain)

    @property
    def settled(self) -> bool:
        """Whether plain's pace rests on :data:`PLAIN_SETTLED` plain rounds or more."""
        return len(self._plain) >= PLAIN_SETTLED

    @property
    def balance(self) -> float:
        """Seconds this answer's speculative rounds won (+) or lost (-) against plain's pace.

        Priced at plain's pace as measured now (before a plain round, as the costs said).
        """
        plain = self.cautious_plain_seconds() or self._plain_estimate
        if plain is None:
            return 0.0
        return self._speculative_tokens * plain - self._speculative_seconds

    def wants_plain_round(self) -> bool:
        """Whether this round should be plain: to measure plain's pace, first or again.

        Never before a timed round was seen (a planner planned on its own, not in a loop).
        """
        if self.round == 0:
            return False
        if len(self._plain) < PLAIN_FIRST_MEASURE:
            return True
        every = PLAIN_PROBE_EVERY if self.settled else PLAIN_SETTLE_EVERY
        return self._since_plain >= every

    def benched(self, drafter: Drafter, evidence: int = 0) -> bool:
        """Whether ``drafter`` sits out this round (a lookup on a long match never does)."""
        record = self._drafters.get(drafter)
        if record is None or self.round >= record.benched_until:
            return False
        return not (drafter.lookup and evidence >= COPY_EVIDENCE)

    def proven(self, drafter: Drafter) -> bool:
        """Whether ``drafter``'s rounds were judged to pay in this answer, since it last sat out."""
        record = self._drafters.get(drafter)
        return record is not None and record.proven

    def earnings(self, drafter: Drafter) -> float | None:
        """``drafter``'s latest rounds' tokens per second over plain's (None: not yet known)."""
        plain = self.plain_seconds()
        record = self._drafters.get(drafter)
        if plain is None or record is None or len(record.rounds) < JUDGED_ROUNDS:
            return None
        tokens = sum(count for count, _ in record.rounds)
        seconds = sum(spent for _, spent in record.rounds)
        return tokens * plain / seconds if seconds > 0 else None

    def headroom(self, horizon: int, plain_seconds: float) -> float | None:
        """Seconds the next round may lose at worst (None: no bound, not in an answer).

        The balance so far plus :data:`LOSS_ALLOWANCE` of the answer's time at plain's pace
        (``plain_seconds`` a token), the answer being the tokens written so far and
        ``horizon`` more at most (up to :data:`ALLOWANCE_LOOKAHEAD`).
        """
        if not self._in_answer:
            return None
        length = self.answer_tokens + max(0, min(horizon, ALLOWANCE_LOOKAHEAD))
        return self.balance + LOSS_ALLOWANCE * plain_seconds * length

    # -- what the planner tells it ---------------------------------------------------------

    def observe(
        self,
        drafter: Drafter | None,
        tokens: int,
        seconds: float,
        plain_estimate: float | None = None,
    ) -> None:
        """One decode round: who drafted (None: plain), the tokens it gave, its wall time.

        ``plain_estimate``: plain's seconds a token as the costs say, for the balance
        before plain's pace was measured. A round without a time (or without tokens) is
        not counted.
        """
        if seconds <= 0.0 or tokens <= 0:
            return
        self.round += 1
        self.answer_tokens += tokens
        if plain_estimate is not None:
            self._plain_estimate = plain_estimate
        if drafter is not None:
            self._speculative_tokens += tokens
            self._speculative_seconds += seconds
        if drafter is None:
            if tokens == 1:
                self._plain.append(seconds)
                self._since_plain = 0
            return
        self._since_plain += 1
        record = self._drafters.setdefault(drafter, _DrafterEarnings())
        record.rounds.append((tokens, seconds))
        earned = self.earnings(drafter)
        if earned is None:
            return
        if earned < PAY_FLOOR:
            record.benched_until = self.round + record.backoff
            record.backoff = min(MAX_BACKOFF, record.backoff * 2)
            record.rounds.clear()
            record.proven = False
            self.backoffs += 1
        else:
            record.backoff = FIRST_BACKOFF
            record.proven = True

    def start_answer(self) -> None:
        """A new answer: every time out ends and backoffs start from the first again.

        Plain's pace is kept (the same machine, the same model); what a drafter earned on
        the last answer's text says little about the next one's, so each is judged afresh.
        The loss bound starts afresh: nothing won, nothing lost.
        """
        self._in_answer = True
        self.answer_tokens = 0
        self._speculative_tokens = 0
        self._speculative_seconds = 0.0
        for record in self._drafters.values():
            record.benched_until = 0
            record.backoff = FIRST_BACKOFF
            record.rounds.clear()
            record.proven = False

    def forget(self, drafter: Drafter) -> None:
        """Drop what ``drafter`` earned (its time out too)."""
        self._drafters.pop(drafter, None)


__all__ = [
    "ALLOWANCE_LOOKAHEAD",
    "COPY_EVIDENCE",
    "FIRST_BACKOFF",
    "JUDGED_ROUNDS",
    "LOSS_ALLOWANCE",
    "MAX_BACKOFF",
    "PAY_FLOOR",
    "PLAIN_FIRST_MEASURE",
    "PLAIN_PROBE_EVERY",
    "PLAIN_SETTLED",
    "PLAIN_SETTLE_EVERY",
    "EarningsWatch",
]
