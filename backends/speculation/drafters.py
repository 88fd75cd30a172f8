"""The drafters that run a model or nothing: a small draft model, and none (plain decoding).

The n-gram lookups are in :mod:`backends.speculation.ngram`; all implement
:class:`backends.speculation.types.Drafter`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from backends.engines.interface import common_prefix_length, extend_cache
from backends.errors import SettingsError
from backends.speculation.sampling import probabilities, sample, top_probability
from backends.speculation.types import (
    DEFAULT_P_MIN,
    Draft,
    DrafterStats,
    DraftStopRule,
    ForwardPass,
    Sibling,
)

# A draft model reads a long context in part (DraftModelDrafter.reading): its first
# DRAFT_READ_HEAD tokens and its last DRAFT_READ_WINDOW before the first draft. Reading all
# of the peer benchmark's docstring prompt took a seventh of its 160-token answer's time
# (2026-12-02, EPYC Zen 5, 2 cores, a traced run). Reading 24 + 32 tokens of it, the draft
# was kept as often and the answer came 12 % faster (modeled), and windows of the last 16,
# 32 and 64 tokens alone gave 1.34x, 1.40x and 1.35x of plain against 1.37x for 24 + 32
# (2026-12-02, EPYC Zen 4, 2 cores, `python -m benchmarks.draft_model_auto --rounds 4`;
# docs/benchmarks.md, "Where the draft stops, and what it reads").
DRAFT_READ_HEAD = 24
DRAFT_READ_WINDOW = 32
# Where a draft model's batches are dear, its first read decides whether it is tried at all
# (what it may lose must fit in an answer's allowance, backends/speculation/earnings.py), so
# it reads less: the longest of the head and the window, the window alone, and the short
# window, whose cost is within DRAFT_READ_BUDGET_STEPS steps of the main model
# (DraftModelDrafter.fit_reading). On the Haswell library (2026-12-05, EPYC Zen 4, 2 cores)
# a read of 24 + 32 tokens cost 6 main-model steps and one of 16, 1.7; with 16 the draft was
# tried and paid on new code, 1.17x of plain against 1.01x where it never fitted, median of
# 4 runs of `python -m benchmarks.never_slower --prompts new-function,prose`
# (docs/benchmarks.md, "Never slower").
DRAFT_READ_SHORT_WINDOW = 16
DRAFT_READ_BUDGET_STEPS = 2.0

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Sequence

    from backends.engines.interface import LogitRows, ModelEngine
    from backends.speculation.grammar import GrammarMatcher
    from backends.speculation.sampling import ProbArray, SamplingSettings


class LookupDrafter:
    """A drafter that proposes without a model: a table lookup, or nothing.

    Subclasses implement :meth:`propose`; this is the Drafter interface around it.
    """

    lookup = True
    engine: ModelEngine | None = None  # no model: nothing for the planner to calibrate

    def __init__(self) -> None:
        self.stats = DrafterStats()

    def propose(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        """The proposed continuation and its evidence (how much backs it)."""
        raise NotImplementedError

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
        """Propose up to ``max_tokens`` tokens from the lookup.

        ``stop`` is for draft models; the loop cuts the proposal where it leaves the
        ``grammar``.
        """
        proposal, evidence = self.propose(context, max_tokens)
        return Draft(proposal, None, evidence=evidence)

    def unread(self, context: Sequence[int]) -> int:
        """Nothing to read: a lookup works on the context as it is."""
        return 0


class NoDrafter(LookupDrafter):
    """Plain decoding through the same loop: never drafts."""

    name = "none"

    def propose(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        """Nothing."""
        return [], 0


class DraftModelDrafter:
    """Drafts with a small model sharing the target's tokenizer.

    Greedy at temperature 0; at temperature > 0 the tokens are sampled from the draft's own
    distribution q (with the same sampling transform as the target), and q is handed to the
    rejection sampler. Drafting stops early where the draft is unsure: below ``p_min`` (its
    top probability), or where the planner's :class:`DraftStopRule` says the next token is
    unlikely to be kept; and after an end-of-generation token. Of a long context it reads
    the opening ``head`` and the last ``window`` tokens (:meth:`reading`), then every later
    token.
    """

    lookup = False
    engine: ModelEngine

    def __init__(
        self,
        engine: ModelEngine,
        p_min: float = DEFAULT_P_MIN,
        sampling: SamplingSettings | None = None,
        window: int | None = DRAFT_READ_WINDOW,
        head: int = DRAFT_READ_HEAD,
    ) -> None:
        if window is not None and window < 1:
            raise SettingsError(f"the draft's reading window must be 1 token or more, not {window}")
        self.engine = engine
        # What the draft model reads of a long context (window None: all of it), and where
        # in the context its reading resumes after the head (None: not reading yet); see
        # :meth:`reading`.
        self.window = window
        self.head = head
        self._resume_at: int | None = None
        self.p_min = p_min
        # The draft may sample with its own settings (q is recorded either way, so the
        # output still follows the target); None uses the target's settings.
        self.sampling = sampling
        self._end_ids = engine.vocab.end_of_generation_ids
        self.stats = DrafterStats()

    @property
    def name(self) -> str:
        """The draft model's name."""
        return f"draft model '{self.engine.name}'"

    def reading(self, context: Sequence[int]) -> Sequence[int]:
        """What the draft model reads of ``context``: all of it, or its head and its tail.

        With a ``window``, a context longer than ``head`` + ``window`` tokens is read as
        its first ``head`` tokens (the chat template's opening) and everything from
        ``window`` tokens before its end on. Where reading resumes is
        set when the draft is first asked (by the planner or to draft) and kept while the
        draft's cache holds the head and the window it read there (the rounds of an answer,
        the next turns of a chat, a new answer to the same question), so that every later
        token is read once; another conversation sets it anew.
        """
        if self.window is None:
            return context
        if self._resume_at is not None and self._resume_at < len(context):
            reading = _head_and_tail(context, self.head, self._resume_at)
            window = min(len(reading), self.head + self.window)
            if common_prefix_length(self.engine.cached_tokens, reading) >= window:
                return reading  # what it read from there is still what the context holds
        self._resume_at = max(self.head, len(context) - self.window)
        return _head_and_tail(context, self.head, self._resume_at)

    def fit_reading(self, draft_seconds: Callable[[int], float], step_seconds: float) -> None:
        """Read less of a long context where reading is dear (before the first read).

        Of the head and the window, the window alone and :data:`DRAFT_READ_SHORT_WINDOW`,
        the first whose read (``draft_seconds(tokens)``) costs at most
        :data:`DRAFT_READ_BUDGET_STEPS` main-model steps (``step_seconds``); the short
        window where none does.
        """
        if self.window is None or self._resume_at is not None:
            return
        budget = DRAFT_READ_BUDGET_STEPS * step_seconds
        choices = [(self.head, self.window), (0, self.window)]
        choices.append((0, min(self.window, DRAFT_READ_SHORT_WINDOW)))
        for head, window in choices:
            if draft_seconds(head + window) <= budget:
                break
        self.head, self.window = head, window

    def unread(self, context: Sequence[int]) -> int:
        """Tokens the draft model must read before its first token after ``context``."""
        reading = self.reading(context)
        return max(1, len(reading) - common_prefix_length(self.engine.cached_tokens, reading))

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
        """Run the draft model for up to ``max_tokens`` steps after catching its cache up.

        ``stop``: the planner's rule for where to stop (None: at ``p_min``). ``grammar``:
        each step's row is masked by it, so the draft stays within the answer's grammar
        (its confidence and, when sampling, q are the masked row's); the grammar is rolled
        back to where it was before the draft.
        """
        try:
            return self._draft(context, max_tokens, sampling, rng, cancel, stop, grammar)
        finally:
            if grammar is not None:
                grammar.rollback_draft()

    def _draft(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingSettings,
        rng: np.random.Generator,
        cancel: threading.Event | None,
        stop: DraftStopRule | None,
        grammar: GrammarMatcher | None,
    ) -> Draft:
        if self.sampling is not None and not sampling.greedy:
            sampling = self.sampling
        tokens: list[int] = []
        confidences: list[float] = []
        distributions: list[ProbArray] | None = None if sampling.greedy else []
        passes: list[ForwardPass] = []
        if max_tokens <= 0:
            return Draft(tokens, distributions, passes=passes)
        started = time.perf_counter()
        rows, evaluated = extend_cache(self.engine, self.reading(context))
        passes.append((evaluated, time.perf_counter() - started))
        measure = stop is not None or self.p_min > 0.0
        # Second choices, for a sibling branch: only where the planner's rule leaves room.
        branching = stop is not None and bool(stop.extra_row) and distributions is None
        seconds: list[tuple[int, float]] = []
        reach = 1.0  # the stop rule's chance that every token so far is kept
        for step in range(max_tokens):
            row = rows[-1] if grammar is None else grammar.masked(rows[-1])
            q: ProbArray | None = None
            if distributions is None:
                token = int(np.argmax(row))
                confidence = top_probability(row, sampling) if measure else 1.0
            else:
                q = probabilities(row, sampling)
                confidence = float(q.max())
            if stop is not None:
                reach *= stop.kept_chance(confidence)
                if reach < stop.keep_floor:
                    break
            elif confidence < self.p_min:
                break
            if distributions is not None and q is not None:
                token = sample(q, rng)
                distributions.append(q)
            tokens.append(token)
            if measure:
                confidences.append(confidence)
            if branching:
                seconds.append(_second_choice(row, token, confidence))
            last_step = step + 1 == max_tokens
            if last_step or token in self._end_ids or (cancel is not None and cancel.is_set()):
                break
            if grammar is not None:
                grammar.consume_drafted(token)
            if stop is not None and reach < stop.go_on_floor:
                break
            started = time.perf_counter()
            rows = self.engine.evaluate([token], 1)
            passes.append((1, time.perf_counter() - started))
        sibling = None
        if branching and stop is not None:
            sibling = _choose_sibling(stop, confidences, seconds)
        return Draft(tokens, distributions, confidences=confidences, sibling=sibling, passes=passes)


def _second_choice(row: LogitRows, top: int, top_probability: float) -> tuple[int, float]:
    """The draft's second most likely token after ``top`` and its probability."""
    others = np.array(row, dtype=np.float32)
    others[top] = -np.inf
    second = int(np.argmax(others))
    return second, top_probability * float(np.exp(float(row[second]) - float(row[top])))


def _choose_sibling(
    stop: DraftStopRule, confidences: Sequence[float], seconds: Sequence[tuple[int, float]]
) -> Sibling | None:
    """Where the draft's second choice is most likely to be what the target takes, if it pays.

    At position i that takes every token before i kept (the stop rule's reach), token i
    refused (one minus its kept rate) and the target's token then being the draft's second
    choice, as likely as the draft's own share of what its top choice leaves (q2 / (1 - q1);
    over real prose answers that predicted 30 % where 33 % came true: 2026-12-03, Xeon AMX,
    2 cores, ``python -m benchmarks.sibling_tree``). It pays where that chance clears the
    cost of its row (:meth:`DraftStopRule.sibling_floor`).
    """
    floor = stop.sibling_floor(len(confidences))
    if floor is None:
        return None
    best: Sibling | None = None
    best_chance = floor
    reach = 1.0
    for index, (confidence, (second, second_probability)) in enumerate(
        zip(confidences, seconds, strict=True)
    ):
        kept = stop.kept_chance(confidence)
        share = min(1.0, second_probability / max(1e-9, 1.0 - confidence))
        chance = reach * (1.0 - kept) * share
        if chance >= best_chance:
            best, best_chance = Sibling(index, second), chance
        reach *= kept
    return best


def _head_and_tail(context: Sequence[int], head: int, resume_at: int) -> Sequence[int]:
    """The context's first ``head`` tokens and those from ``resume_at`` on."""
    if resume_at <= head:
        return context
    return [*context[:head], *context[resume_at:]]
