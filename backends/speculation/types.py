"""What the speculative loop takes and gives: settings, emitted tokens, stats, and drafts.

A leaf of ``backends.speculation``: the drafters, the planner and the loop build on these
types, and the window and the engine process show them. :class:`Drafter` is the interface
every drafter implements (a draft model, the n-gram lookups, none), with what the planner
and the loop may ask of any drafter declared on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol

from backends.errors import SettingsError
from backends.speculation.sampling import ProbArray, SamplingSettings

if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping, Sequence

    import numpy as np

    from backends.engines.interface import ModelEngine
    from backends.speculation.grammar import GrammarMatcher

DEFAULT_DRAFT_MAX = 3  # llama.cpp's --spec-draft-n-max default
DEFAULT_DRAFT_MIN = 0
DEFAULT_P_MIN = 0.75  # llama.cpp's --spec-draft-p-min default
DEFAULT_MAX_TOKENS = 512
DEFAULT_LOOKUP_DRAFT_MAX = 16  # lookups are free to make, so they may propose long runs

Verification = Literal["rejection", "sample-match"]
StopReason = Literal["eos", "max_tokens", "stop_string", "cancelled", "context_full"]


class TokenOrigin(StrEnum):
    """Who produced an emitted token."""

    DRAFT = "draft"  # drafted and accepted by the target
    TARGET = "target"  # the target's own token (plain step, correction or bonus)
    GRAMMAR = "grammar"  # the only token the answer's grammar allowed there (no drafting)


@dataclass(frozen=True)
class EmittedToken:
    """One generated token, its text (possibly empty mid-character) and its origin."""

    token_id: int
    text: str
    origin: TokenOrigin


@dataclass(frozen=True)
class GenerationSettings:
    """Everything that shapes one generation besides the prompt and the models."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    draft_max: int = DEFAULT_DRAFT_MAX
    draft_min: int = DEFAULT_DRAFT_MIN
    p_min: float = DEFAULT_P_MIN
    stop_strings: tuple[str, ...] = ()
    verification: Verification = "rejection"
    lookup_draft_max: int = DEFAULT_LOOKUP_DRAFT_MAX
    # At temperature 0, verify in batches the engine computes bit-exactly, so the text is
    # exactly plain decoding's. False verifies a draft in one batch, as llama.cpp does:
    # faster where big batches are cheap, but a near-tie may then resolve differently.
    exact_batches: bool = True
    # At temperature 0, let a draft model's second choice ride along as a sibling branch
    # where the planner's costs say it pays and the engine's sibling rows are exact. Off by
    # default: on a 2-core AMX Xeon it was exact and nearly free but gained nothing
    # (benchmarks/sibling_tree.py, docs/benchmarks.md "Sibling branches").
    sibling_branches: bool = False
    # A grammar every answer follows (llguidance's form: backends/speculation/grammar.py
    # compiles JSON schemas, Lark, regexes and GBNF into it); None: free text.
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise SettingsError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.draft_max < 1:
            raise SettingsError(f"draft_max must be >= 1, got {self.draft_max}")
        if self.lookup_draft_max < 1:
            raise SettingsError(f"lookup_draft_max must be >= 1, got {self.lookup_draft_max}")
        if not 0 <= self.draft_min <= self.draft_max:
            raise SettingsError(
                f"draft_min must be between 0 and draft_max ({self.draft_max}), "
                f"got {self.draft_min}"
            )
        if not 0.0 <= self.p_min <= 1.0:
            raise SettingsError(f"p_min must be in [0, 1], got {self.p_min}")
        if any(not stop for stop in self.stop_strings):
            raise SettingsError("stop strings must not be empty")
        if self.verification not in ("rejection", "sample-match"):
            raise SettingsError(
                f"verification must be 'rejection' or 'sample-match', got {self.verification!r}"
            )


# The counts and times of SpeculationStats that add up over several runs.
ADDITIVE_STATS = (
    "prompt_tokens",
    "generated_tokens",
    "rounds",
    "total_draft_tokens_count",
    "accepted_draft_tokens_count",
    "rejected_draft_tokens_count",
    "ignored_draft_tokens_count",
    "sibling_tokens_count",
    "accepted_sibling_tokens_count",
    "grammar_tokens_count",
    "generation_seconds",
    "total_seconds",
    "draft_seconds",
    "verify_seconds",
    "engine_seconds",
)


@dataclass
class SpeculationStats:
    """Live and final statistics of one generation (LM Studio's names where it has them)."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    rounds: int = 0
    # Earlier messages of the conversation left out to fit the context (the window's
    # context overflow policy; backends/service/context_fit.py): this many, one run from
    # index dropped_from of the messages as sent.
    dropped_messages: int = 0
    dropped_from: int = 0
    total_draft_tokens_count: int = 0
    accepted_draft_tokens_count: int = 0
    rejected_draft_tokens_count: int = 0
    ignored_draft_tokens_count: int = 0
    # Of those, the draft model's second choices verified as siblings of a chain, and the
    # siblings the target took (a sibling not taken counts as rejected).
    sibling_tokens_count: int = 0
    accepted_sibling_tokens_count: int = 0
    # Under a grammar: tokens it allowed alone, verified with no drafting and always kept
    # (not draft tokens: they are in none of the draft counts above).
    grammar_tokens_count: int = 0
    # verified_at_position[i]: drafts whose (i+1)-th token reached verification
    verified_at_position: list[int] = field(default_factory=list)
    accepted_at_position: list[int] = field(default_factory=list)
    draft_length_counts: dict[int, int] = field(default_factory=dict)
    # verify_batch_counts[n]: target passes that gave n logit rows (the prompt's pass: 1)
    verify_batch_counts: dict[int, int] = field(default_factory=dict)
    rounds_by_method: dict[str, int] = field(default_factory=dict)  # "none" = plain step
    # Per drafter a round planned ("none": plain), the tokens its rounds gave and their wall
    # time (drafting, verification and the loop's own time, learning included; a draft that
    # came out empty counts to its drafter), the first round (the prompt's) left out: each
    # method's pace beside plain decoding's, where auto gained or lost its time.
    tokens_by_method: dict[str, int] = field(default_factory=dict)
    seconds_by_method: dict[str, float] = field(default_factory=dict)
    # How often auto sent a drafter to sit out because its rounds earned less than plain
    # decoding's measured pace (backends/speculation/earnings.py).
    backoffs: int = 0
    # What auto's speculative rounds won (+) or lost (-) in seconds against plain decoding's
    # measured pace, the balance its loss bound keeps (backends/speculation/earnings.py).
    speculation_balance_seconds: float = 0.0
    time_to_first_token_sec: float | None = None
    generation_seconds: float = 0.0  # from the first token to the last
    total_seconds: float = 0.0  # from the start of prompt processing to the last token
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    engine_seconds: float = 0.0  # inside the engines' forward passes (draft and target)
    stop_reason: StopReason | None = None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted, as LM Studio reports it (None before anything was drafted)."""
        if self.total_draft_tokens_count == 0:
            return None
        return self.accepted_draft_tokens_count / self.total_draft_tokens_count

    @property
    def tokens_per_second(self) -> float:
        """Generation speed after the first token (prompt processing excluded)."""
        if self.generated_tokens <= 1 or self.generation_seconds <= 0.0:
            if self.total_seconds > 0.0:
                return self.generated_tokens / self.total_seconds
            return 0.0
        return (self.generated_tokens - 1) / self.generation_seconds

    def speedup_over(self, baseline: SpeculationStats) -> float | None:
        """Tokens per second relative to ``baseline`` (None when the baseline has no speed)."""
        base = baseline.tokens_per_second
        return self.tokens_per_second / base if base > 0 else None

    @property
    def acceptance_by_position(self) -> list[float | None]:
        """For each draft position, the share of drafts reaching it whose token there was kept."""
        return [
            accepted / verified if verified else None
            for accepted, verified in zip(
                self.accepted_at_position, self.verified_at_position, strict=True
            )
        ]

    @property
    def overhead_seconds(self) -> float:
        """Time of the loop outside the engines' forward passes (Python, sampling, copies)."""
        return max(0.0, self.total_seconds - self.engine_seconds)

    def snapshot(self) -> SpeculationStats:
        """A copy safe to hand to another thread."""
        return replace(
            self,
            verified_at_position=list(self.verified_at_position),
            accepted_at_position=list(self.accepted_at_position),
            draft_length_counts=dict(self.draft_length_counts),
            verify_batch_counts=dict(self.verify_batch_counts),
            rounds_by_method=dict(self.rounds_by_method),
            tokens_by_method=dict(self.tokens_by_method),
            seconds_by_method=dict(self.seconds_by_method),
        )

    def as_dict(self) -> dict[str, object]:
        """Plain data for JSON output (counts, timings, rates)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "rounds": self.rounds,
            "total_draft_tokens_count": self.total_draft_tokens_count,
            "accepted_draft_tokens_count": self.accepted_draft_tokens_count,
            "rejected_draft_tokens_count": self.rejected_draft_tokens_count,
            "ignored_draft_tokens_count": self.ignored_draft_tokens_count,
            "sibling_tokens_count": self.sibling_tokens_count,
            "accepted_sibling_tokens_count": self.accepted_sibling_tokens_count,
            "grammar_tokens_count": self.grammar_tokens_count,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_by_position": self.acceptance_by_position,
            "verified_at_position": list(self.verified_at_position),
            "accepted_at_position": list(self.accepted_at_position),
            "draft_length_counts": {str(k): v for k, v in sorted(self.draft_length_counts.items())},
            "verify_batch_counts": {str(k): v for k, v in sorted(self.verify_batch_counts.items())},
            "rounds_by_method": dict(self.rounds_by_method),
            "tokens_by_method": dict(self.tokens_by_method),
            "seconds_by_method": dict(self.seconds_by_method),
            "backoffs": self.backoffs,
            "speculation_balance_seconds": self.speculation_balance_seconds,
            "tokens_per_second": self.tokens_per_second,
            "time_to_first_token_sec": self.time_to_first_token_sec,
            "generation_seconds": self.generation_seconds,
            "total_seconds": self.total_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "engine_seconds": self.engine_seconds,
            "overhead_seconds": self.overhead_seconds,
            "stop_reason": self.stop_reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpeculationStats:
        """The counts and times back from :meth:`as_dict`'s data (its JSON, read back).

        The per-position and per-length counts come back too; the per-method figures and
        the stop reason do not. A count newer than the data (``grammar_tokens_count`` in
        files written before grammars) reads as 0.
        """
        stats = cls(**{name: data[name] for name in ADDITIVE_STATS if name in data})
        stats.verified_at_position = list(data["verified_at_position"])
        stats.accepted_at_position = list(data["accepted_at_position"])
        stats.draft_length_counts = {int(k): v for k, v in data["draft_length_counts"].items()}
        stats.verify_batch_counts = {int(k): v for k, v in data["verify_batch_counts"].items()}
        return stats


@dataclass(frozen=True)
class GenerationUpdate:
    """What one round produced: newly released tokens and the stats so far."""

    tokens: tuple[EmittedToken, ...]
    stats: SpeculationStats
    finished: bool


@dataclass(frozen=True)
class GenerationResult:
    """A finished generation: its tokens with their origins, its text and its stats."""

    tokens: tuple[EmittedToken, ...]
    stats: SpeculationStats

    @property
    def text(self) -> str:
        """The generated text (stop string and end-of-generation token excluded)."""
        return "".join(token.text for token in self.tokens)

    @property
    def token_ids(self) -> list[int]:
        """The generated token ids."""
        return [token.token_id for token in self.tokens]


ForwardPass = tuple[int, float]  # (tokens evaluated, seconds)


@dataclass
class Draft:
    """Proposed tokens and, when they were sampled, the draft distribution q of each."""

    tokens: list[int]
    distributions: list[ProbArray] | None  # None: deterministic (greedy or lookup) drafts
    evidence: int = 0  # a lookup's match length (how much the proposal is backed by)
    # A draft model's probability of each token it drafted (its top one at temperature 0);
    # empty for lookups.
    confidences: list[float] = field(default_factory=list)
    # The draft model's second choice at one position, verified beside the chain as a
    # branch of its own where the engine allows it (None: a plain chain).
    sibling: Sibling | None = None
    # The draft model's forward passes for this draft (empty for lookups), for the planner.
    passes: list[ForwardPass] = field(default_factory=list)

    def cut(self, length: int) -> Draft:
        """The draft's first ``length`` tokens (a sibling past them is dropped)."""
        sibling = self.sibling if self.sibling is not None and self.sibling.index < length else None
        return replace(
            self,
            tokens=self.tokens[:length],
            distributions=None if self.distributions is None else self.distributions[:length],
            confidences=self.confidences[:length],
            sibling=sibling,
        )


@dataclass(frozen=True)
class Sibling:
    """A draft's alternative token at one position: ``token`` in place of ``tokens[index]``."""

    index: int
    token: int


@dataclass(frozen=True)
class DraftStopRule:
    """Where a draft model stops drafting, learnt by the planner instead of a fixed p-min.

    ``kept_by_confidence[i]`` is how often the target kept a draft token whose draft
    probability fell in the i-th of equal-width buckets. Along a draft their product is the
    chance that every token so far is kept (the reach). A token is kept in the draft while
    its reach is at least ``keep_floor`` (what one more verification row costs over what a
    kept token saves); the draft model goes on to the next token while the reach is at least
    ``go_on_floor`` (the same with a draft model step added).
    """

    kept_by_confidence: tuple[float, ...]
    keep_floor: float
    go_on_floor: float
    # What one more verification row costs, in target steps: ``extra_row[n - 1]`` for a
    # batch of n rows growing to n + 1. Its length bounds the rows a batch with a sibling
    # may have; empty: no siblings (the engine or the settings do not allow them).
    extra_row: tuple[float, ...] = ()

    def kept_chance(self, confidence: float) -> float:
        """How often a draft token of this confidence was kept."""
        return self.kept_by_confidence[confidence_bucket(confidence, len(self.kept_by_confidence))]

    def sibling_floor(self, drafted: int) -> float | None:
        """The chance a sibling must have of being taken to pay in a draft of ``drafted``.

        A taken sibling gives one token (a target step saved) and is evaluated again, in
        order, in the next round's batch; it costs one row now. None: no room for it.
        """
        if not 0 < drafted < len(self.extra_row):
            return None
        row = max(SIBLING_ROW_FLOOR, self.extra_row[drafted])
        return row / max(1e-9, 1.0 - row) if row < 1.0 else None


# The least a sibling's row is charged, in target steps: its cache bookkeeping, its logit
# row's argmax and the round's extra work, about 1 % of a 1.5B step on a CPU, doubled for
# the cost table's noise (a batch's calibrated cost can even fall with one more row).
# Chosen with sibling branches (commit 2ec15eb, 2026-12-03), not tuned.
SIBLING_ROW_FLOOR = 0.02


def confidence_bucket(confidence: float, buckets: int) -> int:
    """Which of ``buckets`` equal-width buckets of [0, 1] a draft probability falls in."""
    return min(buckets - 1, max(0, int(confidence * buckets)))


@dataclass
class DrafterStats:
    """What one drafter did, kept with the drafter (as llama.cpp's drafters keep theirs)."""

    drafts: int = 0  # drafts that proposed tokens and were verified
    drafted: int = 0  # tokens those drafts proposed
    accepted: int = 0  # of those, tokens the target kept
    seconds: float = 0.0  # wall time in draft(), used or not

    def record(self, drafted: int, accepted: int) -> None:
        """Count one verified draft."""
        self.drafts += 1
        self.drafted += drafted
        self.accepted += accepted

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted (None before any draft)."""
        return self.accepted / self.drafted if self.drafted else None


class Drafter(Protocol):
    """Proposes the next tokens of a context: the interface every drafter implements.

    Two calls, as llama.cpp's drafters have begin / draft / accept: :meth:`unread` (what a
    draft model must read first, which the planner weighs) and :meth:`draft`; the loop
    counts what was accepted in :attr:`stats`. ``lookup`` is True for drafters whose
    proposals cost next to nothing (table lookups): the loop asks them before the plan.
    False for model drafters, whose cost grows with every token drafted; those name their
    ``engine`` (so that the planner can calibrate its costs and the loop count its time)
    and report a draft's forward passes in it (:attr:`Draft.passes`).
    """

    @property
    def name(self) -> str:
        """What the drafter is, for reports ("none", "draft model 'Qwen…'")."""
        ...

    @property
    def lookup(self) -> bool:
        """Whether drafting is a negligible-cost lookup."""
        ...

    @property
    def engine(self) -> ModelEngine | None:
        """The model this drafter runs (None for lookups and plain decoding)."""
        ...

    @property
    def stats(self) -> DrafterStats:
        """What this drafter drafted and how much of it was accepted, so far."""
        ...

    def unread(self, context: Sequence[int]) -> int:
        """Tokens a draft model must read before its first draft token after ``context``.

        What it has not read yet, at least the last token; 0 for lookups.
        """
        ...

    def draft(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        rng: np.random.Generator,
        cancel: threading.Event | None,
        stop: DraftStopRule | None = None,
        *,
        grammar: GrammarMatcher | None = None,
    ) -> Draft:
        """Propose at most ``max_tokens`` tokens to follow ``context``.

        ``stop``: where a draft model stops (None: at its own p-min); lookups ignore it.
        ``grammar``: the answer's grammar, which a draft model drafts within (it leaves the
        grammar as it found it); the loop cuts a lookup's proposal where it leaves it.
        """
        ...
