"""What the loop and the planner hand each other every round: candidates, a plan, an outcome.

The loop offers the planner the round's :class:`Candidate` drafters and gets a
:class:`RoundPlan` (:meth:`~backends.speculation.planner.DraftPlanner.plan`); once the
round has ended it tells the planner what happened in one :class:`RoundOutcome`
(:meth:`~backends.speculation.planner.DraftPlanner.observe`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.speculation.types import Draft, Drafter, ForwardPass


@dataclass(frozen=True)
class RoundPlan:
    """What one round will do: which drafter (None: plain decoding) and up to how many tokens."""

    drafter: Drafter | None
    draft_tokens: int
    proposal: Draft | None = None  # a lookup's proposal, already made (cut to draft_tokens)
    expected_rate: float = 0.0  # expected tokens per second of the plan
    plain_rate: float = 0.0  # expected tokens per second of plain decoding now
    verify_chunk: int | None = None  # rows per verification batch (None: all in one)


@dataclass(frozen=True)
class Candidate:
    """A drafter the plan may choose this round, with what the loop found out before it.

    The loop offers each lookup with a proposal (made first: a lookup costs microseconds)
    and each draft model the planner is ready for (:meth:`DraftPlanner.draft_model_ready`).
    """

    drafter: Drafter
    limit: int  # the most tokens it may draft (a lookup: its proposal's length)
    proposal: Draft | None = None  # a lookup's proposal
    unread: int = 0  # a draft model's tokens to read before its first draft token


@dataclass(frozen=True)
class RoundOutcome:
    """What one round did: all the planner learns from it (:meth:`DraftPlanner.observe`).

    The prompt's round and a round with no room to draft have no plan; a round cancelled
    after drafting has nothing verified.
    """

    plan: RoundPlan | None = None
    candidates: Sequence[Candidate] = ()  # what the plan chose from
    start: int = 0  # the context's length when the round was planned (proposals begin there)
    draft_passes: Sequence[ForwardPass] = ()  # the planned draft model's forward passes
    target_passes: Sequence[ForwardPass] = ()  # the target's forward passes, in order
    target_confidence: float | None = None  # its probability of its own token (None: unmeasured)
    verified: Draft | None = None  # the draft the target verified (None: not verified)
    accepted: int = 0  # how many of its tokens were accepted
    overhead_seconds: float = 0.0  # the round's time outside the engines' forward passes
    tokens: int = 0  # the tokens the round gave (accepted, and the target's own)
    seconds: float = 0.0  # the round's wall time, drafting, verification and the loop's own
    context: Sequence[int] = ()  # the context after the round: unused proposals are scored
