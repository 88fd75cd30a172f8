"""The speculative decoding loop, written once for every engine: draft, verify, accept, account.

One round: the drafter proposes up to ``k`` tokens; the target evaluates the pending
context plus those tokens in one batch; verification keeps the longest acceptable prefix
and adds one token of the target's own (the correction after a rejection, or a bonus token
when every draft token was accepted).

Verification at temperature 0 accepts while the draft token is the target's argmax, so the
text is exactly plain greedy decoding. At temperature > 0 it is the modified rejection
sampling of Leviathan et al. 2023 (arXiv 2211.17192, Algorithm 1) and Chen et al. 2023
(arXiv 2302.01318): accept draft token x with probability min(1, p(x)/q(x)), otherwise
sample from normalize(max(0, p − q)); the emitted tokens follow the target's distribution
exactly. ``verification="sample-match"`` instead samples the target and compares (what
llama.cpp's server and mlx-lm do): also lossless, but it accepts less often from a
sampling draft model; every emitted token is then one draw of the target's own random
stream, so with a seed the text is plain sampling's with that seed, whatever was drafted.

At temperature 0, with ``sibling_branches`` on (off by default), a draft model's draft may
carry its second choice at one position as a sibling branch, evaluated in the same batch
in a second sequence that shares the cache (where the engine's sibling rows are probed
bitwise plain decoding's, and the planner's cost table says the extra row pays). Where
the target refuses the chain there and its own token is the sibling, the sibling's row
gives one more token in the same round; the sibling's cells are dropped and it is
evaluated again, in order, in the next round's batch.

Draft-token accounting follows LM Studio's names:

- accepted: drafted tokens the target kept and that were emitted;
- rejected: the first refused token of a draft and every token after it, and a sibling
  the target did not take (a verified sibling counts as one drafted token);
- ignored: drafted tokens never used, because the draft was shorter than ``draft_min``
  or generation stopped (end of generation, max tokens, stop string, cancel) first;

so ``total = accepted + rejected + ignored`` always holds.
"""

from __future__ import annotations

import codecs
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from backends.engines.interface import (
    ChatMessage,
    LogitRows,
    ModelEngine,
    extend_cache,
    extend_cache_with_sibling,
)
from backends.errors import ContextOverflowError, SettingsError
from backends.speculation.drafters import NoDrafter
from backends.speculation.planner import (
    DRAFT_CALIBRATION_SIZES,
    MAX_TREE_ROWS,
    CostCache,
    DraftPlanner,
)
from backends.speculation.sampling import (
    probabilities,
    residual_distribution,
    sample,
    top_probability,
)
from backends.speculation.types import (
    Draft,
    Drafter,
    EmittedToken,
    GenerationResult,
    GenerationSettings,
    GenerationUpdate,
    Sibling,
    SpeculationStats,
    StopReason,
    TokenOrigin,
)

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator, Sequence

    from backends.speculation.planner import RoundPlan

log = logging.getLogger(__name__)


class _StopStringWatcher:
    """Holds back text that may be the start of a stop string; finds complete ones."""

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self.stop_strings = tuple(stop_strings)
        self._longest = max((len(s) for s in self.stop_strings), default=0)

    def find(self, text: str, search_from: int) -> int | None:
        """Index in ``text`` where the earliest complete stop string starts, if any."""
        if not self.stop_strings:
            return None
        start = max(0, search_from - self._longest + 1)
        hits = [i for s in self.stop_strings if (i := text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        """How much of ``text`` can be released without hiding a stop string's beginning."""
        for cut in range(max(0, len(text) - self._longest + 1), len(text)):
            tail = text[cut:]
            if any(s.startswith(tail) for s in self.stop_strings):
                return cut
        return len(text)


class SpeculativeDecoder:
    """Generates from a target engine with drafters; yields updates round by round.

    With one drafter and ``adaptive=False`` every round drafts up to the settings' draft
    length (llama.cpp's behaviour). With ``adaptive=True`` a :class:`DraftPlanner` picks
    each round the drafter and the draft length expected to give the most tokens per
    second, plain decoding included (the "auto" mode when given every drafter). The planner
    calibrates the engines' costs on first use and keeps learning across generations.
    """

    def __init__(
        self,
        target: ModelEngine,
        drafter: Drafter | Sequence[Drafter] | None = None,
        *,
        adaptive: bool = False,
        cost_cache: CostCache | None = None,
    ) -> None:
        self.target = target
        self._cost_cache = cost_cache
        if drafter is None:
            self.drafters: list[Drafter] = []
        elif isinstance(drafter, (list, tuple)):
            self.drafters = list(drafter)
        else:
            self.drafters = [drafter]  # type: ignore[list-item]
        self.adaptive = adaptive and bool(self.drafters)
        self._planner: DraftPlanner | None = None

    @property
    def drafter(self) -> Drafter:
        """The first drafter (a :class:`NoDrafter` when there is none)."""
        return self.drafters[0] if self.drafters else NoDrafter()

    @property
    def planner(self) -> DraftPlanner | None:
        """The cost-aware planner (None unless adaptive, or before the first generation)."""
        return self._planner

    def prepare(self) -> None:
        """Calibrate the planner's costs now (at load) instead of at the first generation."""
        self._ensure_planner()

    def _ensure_planner(self) -> DraftPlanner | None:
        if not self.adaptive:
            return None
        if self._planner is None:
            if self._cost_cache is None:
                self._cost_cache = CostCache()
            cache = self._cost_cache
            target_costs = cache.costs(self.target)
            draft_costs = {
                drafter: cache.costs(drafter.engine, DRAFT_CALIBRATION_SIZES)
                for drafter in self.drafters
                if drafter.engine is not None
            }
            self._planner = DraftPlanner(target_costs, self.drafters, draft_costs)
        return self._planner

    def prompt_tokens(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Apply the target's chat template and tokenize, as the model expects."""
        prompt = self.target.chat_prompt(messages)
        return self.target.tokenize(prompt, add_special=True, parse_special=True)

    def generate(
        self,
        prompt_tokens: Sequence[int],
        settings: GenerationSettings,
        cancel: threading.Event | None = None,
    ) -> Iterator[GenerationUpdate]:
        """Yield one update per round; the last one has ``finished=True`` and final stats."""
        planner = self._ensure_planner()
        run = _Generation(
            self.target, self.drafters, planner, list(prompt_tokens), settings, cancel
        )
        return run.rounds()

    def run(
        self,
        prompt_tokens: Sequence[int],
        settings: GenerationSettings,
        cancel: threading.Event | None = None,
    ) -> GenerationResult:
        """Generate to the end and collect the tokens and the final stats."""
        tokens: list[EmittedToken] = []
        stats = SpeculationStats()
        for update in self.generate(prompt_tokens, settings, cancel):
            tokens.extend(update.tokens)
            stats = update.stats
        return GenerationResult(tuple(tokens), stats)


class _Generation:
    """The state of one generation; ``rounds()`` drives it."""

    def __init__(
        self,
        target: ModelEngine,
        drafters: list[Drafter],
        planner: DraftPlanner | None,
        prompt: list[int],
        settings: GenerationSettings,
        cancel: threading.Event | None,
    ) -> None:
        if not prompt:
            raise SettingsError("the prompt is empty")
        if len(prompt) >= target.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(prompt)} tokens but the context holds {target.n_ctx}; "
                "shorten the prompt or raise the context size"
            )
        self.target = target
        self.drafters = drafters
        self.has_draft_model = any(not drafter.lookup for drafter in drafters)
        self.planner = planner
        self.settings = settings
        self.sampling = settings.sampling
        self.cancel = cancel
        # Verification and drafting draw from separate streams of the seed: with
        # sample-match verification every emitted token is then one draw of the target's
        # own stream, so a seed gives the text plain sampling gives, whatever was drafted.
        self.rng = np.random.default_rng(self.sampling.seed)
        self.draft_rng = np.random.default_rng(
            np.random.SeedSequence(self.sampling.seed).spawn(1)[0]
        )
        self.context = list(prompt)
        self.end_ids = target.vocab.end_of_generation_ids
        self.stats = SpeculationStats(prompt_tokens=len(prompt))
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop_watch = _StopStringWatcher(settings.stop_strings)
        self.text = ""  # all generated text so far
        self.released_chars = 0  # how much of ``text`` was handed out in updates
        self.held: list[EmittedToken] = []  # emitted tokens whose text is not released yet
        self.finished = False
        limit = target.exact_batch_limit
        self.exact_chunk: int | None = None
        if self.sampling.greedy and settings.exact_batches and limit is not None and limit >= 1:
            self.exact_chunk = limit
        # The most tokens a batch with a sibling may hold (0: no siblings): greedy
        # verification, an engine whose sibling rows are plain decoding's, the probed limit.
        self.tree_rows = 0
        if (
            settings.sibling_branches
            and self.sampling.greedy
            and target.exact_siblings
            and limit is not None
        ):
            self.tree_rows = min(MAX_TREE_ROWS, limit)
        if planner is not None:
            planner.start_answer()

    # -- the loop ------------------------------------------------------------------------

    def rounds(self) -> Iterator[GenerationUpdate]:
        started = time.perf_counter()
        engine_start = self._engine_seconds()
        first_token_at: float | None = None
        while not self.finished:
            if self.cancel is not None and self.cancel.is_set():
                self._finish("cancelled")
                break
            room = self.target.n_ctx - len(self.context)
            if room <= 0:
                self._finish("context_full")
                break
            self._one_round(first_round=first_token_at is None, room=room)
            now = time.perf_counter()
            if first_token_at is None:
                first_token_at = now
                self.stats.time_to_first_token_sec = now - started
            self.stats.total_seconds = now - started
            self.stats.generation_seconds = now - first_token_at
            self.stats.engine_seconds = self._engine_seconds() - engine_start
            if not self.finished:
                yield GenerationUpdate(self._release(final=False), self.stats.snapshot(), False)
        now = time.perf_counter()
        self.stats.total_seconds = now - started
        if first_token_at is not None:
            self.stats.generation_seconds = now - first_token_at
        self.stats.engine_seconds = self._engine_seconds() - engine_start
        yield GenerationUpdate(self._release(final=True), self.stats.snapshot(), True)

    def _engine_seconds(self) -> float:
        return self.target.decode_seconds + sum(d.engine_seconds() for d in self.drafters)

    def _draft_limit(self, drafter: Drafter, budget: int) -> int:
        cap = self.settings.lookup_draft_max if drafter.lookup else self.settings.draft_max
        return min(cap, budget)

    def _make_draft(self, drafter: Drafter, max_tokens: int) -> Draft:
        started = time.perf_counter()
        stop = None if self.planner is None else self.planner.stop_rule(drafter, self.tree_rows)
        draft = drafter.draft(
            self.context, max_tokens, self.sampling, self.draft_rng, self.cancel, stop
        )
        elapsed = time.perf_counter() - started
        self.stats.draft_seconds += elapsed
        drafter.stats.seconds += elapsed
        if self.planner is not None:
            for size, seconds in drafter.last_passes:
                self.planner.observe_draft(drafter, size, seconds)
        return draft

    def _plan_round(self, budget: int) -> tuple[RoundPlan | None, Drafter | None, Draft]:
        """Choose the drafter of this round and draft; (plan, drafter, draft)."""
        if budget <= 0 or not self.drafters:
            return None, None, Draft([], None)
        if self.planner is None:
            # Fixed: the first drafter with a proposal drafts the full length.
            for drafter in self.drafters:
                draft = self._make_draft(drafter, self._draft_limit(drafter, budget))
                if draft.tokens or drafter is self.drafters[-1]:
                    return None, drafter, draft
            raise AssertionError("unreachable")
        limits = {d: self._draft_limit(d, budget) for d in self.drafters}
        plan = self.planner.plan(
            self.context, limits, self.exact_chunk, self._make_draft, horizon=budget
        )
        if plan.drafter is None:
            return plan, None, Draft([], None)
        if plan.proposal is not None:
            proposal = plan.proposal
            return (
                plan,
                plan.drafter,
                Draft(proposal.tokens[: plan.draft_tokens], None, evidence=proposal.evidence),
            )
        return plan, plan.drafter, self._make_draft(plan.drafter, plan.draft_tokens)

    def _one_round(self, *, first_round: bool, room: int) -> None:
        round_started = time.perf_counter()
        engine_before = self._engine_seconds()
        remaining = self.settings.max_tokens - self.stats.generated_tokens
        # Drafting past the token budget or the context would only produce ignored tokens.
        # The first round is the prompt's own forward pass: the first token comes from the
        # target alone, so time-to-first-token is the same with and without speculation.
        budget = 0 if first_round else min(remaining - 1, room - 1)
        plan, drafter, draft = self._plan_round(budget)
        if draft.tokens:
            self.stats.total_draft_tokens_count += len(draft.tokens)
            if len(draft.tokens) < self.settings.draft_min:
                self.stats.ignored_draft_tokens_count += len(draft.tokens)
                draft = Draft([], None)
        if self.cancel is not None and self.cancel.is_set():
            self.stats.ignored_draft_tokens_count += len(draft.tokens)
            self._finish("cancelled")
            return
        started = time.perf_counter()
        chunk_rows = plan.verify_chunk if plan else None
        tree = self._tree_rows(draft, chunk_rows)
        accepted, own_token, bonus = self._verify(draft, chunk_rows, tree)
        self.stats.verify_seconds += time.perf_counter() - started
        self.stats.rounds += 1
        self.stats.draft_length_counts[len(draft.tokens)] = (
            self.stats.draft_length_counts.get(len(draft.tokens), 0) + 1
        )
        method = drafter.name if drafter is not None and draft.tokens else "none"
        self.stats.rounds_by_method[method] = self.stats.rounds_by_method.get(method, 0) + 1
        if drafter is not None and draft.tokens:
            drafter.stats.record(len(draft.tokens), accepted)
        self.stats.rejected_draft_tokens_count += len(draft.tokens) - accepted
        for index, token in enumerate(draft.tokens[:accepted]):
            if self.finished:
                self.stats.ignored_draft_tokens_count += accepted - index
                break
            self.stats.accepted_draft_tokens_count += 1
            self._emit(token, TokenOrigin.DRAFT)
        if tree is not None:
            self._account_sibling(taken=bonus is not None)
        if not self.finished:
            self._emit(own_token, TokenOrigin.TARGET if bonus is None else TokenOrigin.DRAFT)
        if bonus is not None and not self.finished:
            self._emit(bonus, TokenOrigin.TARGET)
        if self.planner is not None and not first_round:
            engine_time = self._engine_seconds() - engine_before
            overhead = time.perf_counter() - round_started - engine_time
            if plan is not None:
                self.planner.observe_round(
                    plan, len(draft.tokens), accepted, draft.evidence, overhead, draft.confidences
                )
            self.planner.score_shadows(self.context)

    def _account_sibling(self, *, taken: bool) -> None:
        """Count a verified sibling as one drafted token (taken only if it was emitted)."""
        self.stats.sibling_tokens_count += 1
        self.stats.total_draft_tokens_count += 1
        if not taken:
            self.stats.rejected_draft_tokens_count += 1
        elif self.finished:
            self.stats.ignored_draft_tokens_count += 1
        else:
            self.stats.accepted_sibling_tokens_count += 1
            self.stats.accepted_draft_tokens_count += 1

    def _tree_rows(
        self, draft: Draft, chunk_rows: int | None
    ) -> tuple[LogitRows, LogitRows] | None:
        """The target's rows 0..k for the draft and its sibling's row, in one batch.

        None, with nothing evaluated, where the draft has no sibling or the tree does not
        fit one batch (the probed exact limit, or the chunks the plan asked for).
        """
        sibling = draft.sibling
        if sibling is None or self.tree_rows == 0:
            return None
        limit = self.tree_rows if chunk_rows is None else min(self.tree_rows, chunk_rows)
        started = time.perf_counter()
        evaluated = extend_cache_with_sibling(
            self.target,
            self.context + draft.tokens,
            len(draft.tokens) + 1,
            len(self.context) + sibling.index,
            sibling.token,
            batch_limit=limit,
        )
        if evaluated is None:
            return None
        rows, count = evaluated
        self._count_verify_pass(count + 1, len(rows), started)
        return rows[:-1], rows[-1]

    def _count_verify_pass(self, evaluated: int, rows: int, started: float) -> None:
        """Tell the planner what a verification pass cost; count it by its logit rows."""
        if self.planner is not None:
            self.planner.observe_target(evaluated, time.perf_counter() - started)
        batches = self.stats.verify_batch_counts
        batches[rows] = batches.get(rows, 0) + 1

    def _target_rows(self, proposed: list[int], chunk_rows: int | None) -> Iterator[LogitRows]:
        """The target's logit rows 0..k for ``context + proposed``, evaluated lazily in chunks.

        Row j is the target's prediction after ``proposed[:j]``. At temperature 0 (unless
        ``exact_batches`` is off) the batch is split into chunks no larger than the engine's
        exact batch limit, so every row is bitwise what plain one-token-at-a-time decoding
        computes; the plan may ask for smaller chunks (``chunk_rows``), where checking a
        draft that breaks early costs less that way. A rejection ends the round before later
        chunks are evaluated.
        """
        total_rows = len(proposed) + 1
        chunk = total_rows
        for limit in (self.exact_chunk, chunk_rows):
            if limit is not None:
                chunk = min(chunk, max(1, limit))
        sequence = self.context + proposed
        first = 0
        while first < total_rows:
            last = min(total_rows, first + chunk) - 1
            started = time.perf_counter()
            rows, evaluated = extend_cache(
                self.target, sequence[: len(self.context) + last], logit_rows=last - first + 1
            )
            self._count_verify_pass(evaluated, len(rows), started)
            yield from rows
            first = last + 1

    def _verify(
        self,
        draft: Draft,
        chunk_rows: int | None,
        tree: tuple[LogitRows, LogitRows] | None = None,
    ) -> tuple[int, int, int | None]:
        """Evaluate the draft with the target: (accepted count, the target's token, bonus).

        ``chunk_rows``: rows per verification batch the plan asked for (None: as many as
        exactness allows). ``tree``: the chain's rows and the sibling's, already evaluated
        (:meth:`_tree_rows`, greedy only); where the target's token is the sibling, the
        bonus is the target's token after it (else None).
        """
        proposed = draft.tokens
        positions = self.stats.verified_at_position
        accepted_at = self.stats.accepted_at_position
        while len(positions) < len(proposed):
            positions.append(0)
            accepted_at.append(0)
        greedy = self.sampling.greedy
        sibling_row: LogitRows | None = None
        rows: Iterator[LogitRows] | LogitRows
        if tree is not None:
            rows, sibling_row = tree
        else:
            rows = self._target_rows(proposed, chunk_rows)
        for index, row in enumerate(rows):
            if index == len(proposed):
                # Every draft token was accepted: the last row gives a bonus token.
                self._observe_confidence(row)
                return (
                    index,
                    int(np.argmax(row))
                    if greedy
                    else sample(probabilities(row, self.sampling), self.rng),
                    None,
                )
            token = proposed[index]
            positions[index] += 1
            if greedy:
                best = int(np.argmax(row))
                if best != token:
                    self._observe_confidence(row)
                    if sibling_row is not None and draft.sibling == Sibling(index, best):
                        return index, best, int(np.argmax(sibling_row))
                    return index, best, None
            else:
                p = probabilities(row, self.sampling)
                if self.settings.verification == "sample-match":
                    own = sample(p, self.rng)
                    if own != token:
                        self._observe_confidence(row)
                        return index, own, None
                elif draft.distributions is not None:
                    q = draft.distributions[index]
                    ratio = p[token] / q[token] if q[token] > 0.0 else 0.0
                    if self.rng.random() >= min(1.0, ratio):
                        self._observe_confidence(row)
                        return index, sample(residual_distribution(p, q), self.rng), None
                elif self.rng.random() >= p[token]:
                    self._observe_confidence(row)
                    # A deterministic draft is a point mass q = 1 at the proposed token:
                    # accept with probability p(x); the residual max(0, p - q) is p without x.
                    residual = p.copy()
                    residual[token] = 0.0
                    return index, sample(residual / residual.sum(), self.rng), None
            accepted_at[index] += 1
        raise AssertionError("the target produced fewer rows than asked for")

    def _observe_confidence(self, row: LogitRows) -> None:
        """Tell the planner how sure the target is of the token it gives this round.

        Only a draft model's planning uses it (its priors): one softmax over the vocabulary
        per round, about 0.3 ms on the 1.5B's 151,936 tokens, skipped without one.
        """
        if self.planner is not None and self.has_draft_model:
            self.planner.observe_target_confidence(top_probability(row, self.sampling))

    # -- emitting tokens -------------------------------------------------------------------

    def _emit(self, token: int, origin: TokenOrigin) -> None:
        if token in self.end_ids:
            self._finish("eos")
            return
        self.context.append(token)
        self.stats.generated_tokens += 1
        piece = self.decoder.decode(self.target.token_bytes(token))
        search_from = len(self.text)
        self.text += piece
        self.held.append(EmittedToken(token, piece, origin))
        stop_at = self.stop_watch.find(self.text, search_from)
        if stop_at is not None:
            self._cut_at_stop_string(stop_at)
            self._finish("stop_string")
        elif self.stats.generated_tokens >= self.settings.max_tokens:
            self._finish("max_tokens")

    def _cut_at_stop_string(self, stop_at: int) -> None:
        """Drop the stop string and everything after it from the held tokens."""
        kept: list[EmittedToken] = []
        position = self.released_chars
        for token in self.held:
            if position >= stop_at:
                break
            room = stop_at - position
            text = token.text if len(token.text) <= room else token.text[:room]
            kept.append(replace(token, text=text))
            position += len(token.text)
        self.held = kept
        self.text = self.text[:stop_at]

    def _finish(self, reason: StopReason) -> None:
        if not self.finished:
            self.finished = True
            self.stats.stop_reason = reason

    def _release(self, *, final: bool) -> tuple[EmittedToken, ...]:
        """Hand out held tokens, keeping back those that may begin a stop string."""
        if final:
            tail = self.decoder.decode(b"", final=True)
            if tail and self.held:
                last = self.held[-1]
                self.held[-1] = replace(last, text=last.text + tail)
            everything = tuple(self.held)
            self.held = []
            return everything
        safe_end = self.released_chars + self.stop_watch.safe_length(
            self.text[self.released_chars :]
        )
        released: list[EmittedToken] = []
        position = self.released_chars
        for token in self.held:
            if position + len(token.text) > safe_end:
                break
            released.append(token)
            position += len(token.text)
        self.held = self.held[len(released) :]
        self.released_chars = position
        return tuple(released)
