"""The speculative decoding loop, written once for every engine: draft, verify, account, learn.

One round (:meth:`_Generation._one_round`, read it top to bottom):

1. **Draft.** With a planner, the loop offers it the drafters (each lookup with the
   proposal it makes now, each draft model with what it must read) and gets a plan: which
   drafter, how many tokens, what verification chunk. The loop then asks that drafter for
   its draft. Without a planner, the first drafter with a proposal drafts the full length.
2. **Verify.** The target evaluates the pending context plus the draft in one batch, or in
   chunks where a chunk is evaluated only if every draft token before it was accepted;
   :mod:`backends.speculation.verification` turns its rows into a
   :class:`~backends.speculation.verification.Verdict`: the accepted tokens, then one token
   of the target's own (the corrected token after a refused one, or the bonus token when
   every draft token was accepted). Those words are defined there.
3. **Account.** The stats count the round, and the tokens are emitted with their origins.
4. **Learn.** The planner is told what the round did, once
   (:class:`~backends.speculation.planner.RoundOutcome`).

Nothing the planner knows changes before the round ends, so a round is planned from what
the rounds before it taught. At temperature 0 the text is exactly plain greedy decoding;
at temperature > 0 it follows the target's distribution exactly (rejection sampling, or
sample-match, where with a seed the text is plain sampling's with that seed, whatever was
drafted: drafting draws from a stream of its own).

At temperature 0, with ``sibling_branches`` on (off by default), a draft model's draft may
carry its second choice at one position as a sibling branch, evaluated in the same batch
in a second sequence that shares the cache (where the engine's sibling rows are probed
bitwise plain decoding's, and the planner's cost table says the extra row pays). Where
the target refuses the chain there and its corrected token is the sibling, the sibling's
row gives one more token in the same round; the sibling's cells are dropped and it is
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

import time
from typing import TYPE_CHECKING

import numpy as np

from backends.errors import ContextOverflowError, SettingsError
from backends.speculation.drafters import DraftModelDrafter, NoDrafter
from backends.speculation.estimates import DRAFT_CALIBRATION_SIZES, CostCache
from backends.speculation.grammar import GrammarMatcher
from backends.speculation.planner import MAX_TREE_ROWS, DraftPlanner
from backends.speculation.rounds import Candidate, RoundOutcome
from backends.speculation.sampling import top_probability
from backends.speculation.target_rows import TargetPass, chain_rows, tree_rows
from backends.speculation.text_stream import TextStream
from backends.speculation.types import (
    Draft,
    Drafter,
    EmittedToken,
    GenerationResult,
    GenerationSettings,
    GenerationUpdate,
    SpeculationStats,
    StopReason,
    TokenOrigin,
)
from backends.speculation.verification import (
    Verdict,
    verify_greedy,
    verify_rejection,
    verify_sample_match,
)

# The method name of rounds whose tokens the grammar forced (beside the drafters' names and
# "none", plain decoding's), in the stats' per-method counts.
GRAMMAR_METHOD = "grammar"

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator, Sequence

    from backends.engines.interface import ChatMessage, ModelEngine, ToolFunction
    from backends.speculation.rounds import RoundPlan


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
            # A draft model reads less of a long prompt where its batches are dear.
            for drafter, costs in draft_costs.items():
                if isinstance(drafter, DraftModelDrafter):
                    drafter.fit_reading(costs.cost, target_costs.cost(1))
        return self._planner

    def prompt_tokens(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolFunction] = ()
    ) -> list[int]:
        """Apply the target's chat template (with the offered tools) and tokenize."""
        prompt = self.target.chat_prompt(messages, tools)
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
        self.output = TextStream(settings.stop_strings, target.token_bytes)
        self.finished = False
        limit = target.exact_batch_limit
        self.exact_chunk: int | None = None
        if self.sampling.greedy and settings.exact_batches and limit is not None and limit >= 1:
            self.exact_chunk = limit
        # The answer's grammar (None: free text): it masks every row the target gives.
        self.grammar = GrammarMatcher(target, settings.grammar) if settings.grammar else None
        # The most tokens a batch with a sibling may hold (0: no siblings): greedy
        # verification, an engine whose sibling rows are plain decoding's, the probed limit,
        # no grammar.
        self.tree_rows = 0
        if (
            settings.sibling_branches
            and self.sampling.greedy
            and target.exact_siblings
            and limit is not None
            and self.grammar is None
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
                yield GenerationUpdate(
                    self.output.release(final=False), self.stats.snapshot(), False
                )
        now = time.perf_counter()
        self.stats.total_seconds = now - started
        if first_token_at is not None:
            self.stats.generation_seconds = now - first_token_at
        self.stats.engine_seconds = self._engine_seconds() - engine_start
        yield GenerationUpdate(self.output.release(final=True), self.stats.snapshot(), True)

    def _one_round(self, *, first_round: bool, room: int) -> None:
        """One round, top to bottom: draft, verify, account, learn."""
        round_started = time.perf_counter()
        engine_before = self._engine_seconds()
        tokens_before = self.stats.generated_tokens
        start = len(self.context)
        remaining = self.settings.max_tokens - self.stats.generated_tokens
        # Drafting past the token budget or the context would only produce ignored tokens.
        # The first round is the prompt's own forward pass: the first token comes from the
        # target alone, so time-to-first-token is the same with and without speculation.
        budget = 0 if first_round else min(remaining - 1, room - 1)

        # 1. Draft: the plan (if there is a planner) says who drafts how much. Under a
        # grammar, the tokens it allows alone are the round's draft, with no drafter.
        forced = self._forced(budget)
        candidates: list[Candidate] = []
        plan: RoundPlan | None = None
        drafter: Drafter | None = None
        if forced:
            draft = Draft(forced, None)
        else:
            candidates, plan = self._plan(budget)
            drafter, draft = self._draft(plan, budget)
        draft_passes = draft.passes  # what the planned draft cost, even if it is dropped
        if draft.tokens and not forced:
            self.stats.total_draft_tokens_count += len(draft.tokens)
            draft = self._within_grammar(draft)
            if len(draft.tokens) < self.settings.draft_min:
                self.stats.ignored_draft_tokens_count += len(draft.tokens)
                draft = Draft([], None)
        if self.cancel is not None and self.cancel.is_set():
            if not forced:
                self.stats.ignored_draft_tokens_count += len(draft.tokens)
            self._finish("cancelled")
            if self.planner is not None:
                outcome = RoundOutcome(plan, candidates, start, draft_passes=draft_passes)
                self.planner.observe(outcome)  # what drafting cost; nothing was verified
            return

        # 2. Verify: the target's rows for the draft, and its verdict on them.
        started = time.perf_counter()
        target_passes: list[TargetPass] = []
        verdict, with_sibling = self._verify(draft, plan, target_passes)
        confidence = self._target_confidence(verdict)  # while its row is still the engine's
        if self.grammar is not None:
            self.grammar.consume(verdict.target_token)  # the accepted ones are consumed
        self.stats.verify_seconds += time.perf_counter() - started

        # 3. Account: count the round, emit its tokens.
        self._count_round(drafter, draft, verdict, target_passes, forced=bool(forced))
        self._emit_round(draft, verdict, with_sibling=with_sibling, forced=bool(forced))

        # 4. Learn: the planner's one look at the round, now that it has ended.
        if self.planner is not None:
            engine_time = self._engine_seconds() - engine_before
            round_seconds = time.perf_counter() - round_started
            outcome = RoundOutcome(
                plan,
                candidates,
                start,
                draft_passes=draft_passes,
                target_passes=[(evaluated, seconds) for evaluated, _, seconds in target_passes],
                target_confidence=confidence,
                verified=draft,
                accepted=verdict.accepted,
                overhead_seconds=round_seconds - engine_time,
                tokens=self.stats.generated_tokens - tokens_before,
                seconds=round_seconds,
                context=self.context,
            )
            backoffs = self.planner.watch.backoffs
            self.planner.observe(outcome)
            self.stats.backoffs += self.planner.watch.backoffs - backoffs
            self.stats.speculation_balance_seconds = self.planner.watch.balance
        if not first_round:
            method = GRAMMAR_METHOD if forced else "none" if drafter is None else drafter.name
            self._time_round(method, tokens_before, time.perf_counter() - round_started)

    def _time_round(self, method: str, tokens_before: int, seconds: float) -> None:
        """Add the round's tokens and wall time to those of the method that drafted them."""
        stats = self.stats
        tokens = stats.generated_tokens - tokens_before
        stats.tokens_by_method[method] = stats.tokens_by_method.get(method, 0) + tokens
        stats.seconds_by_method[method] = stats.seconds_by_method.get(method, 0.0) + seconds

    def _engine_seconds(self) -> float:
        """Time in the engines' forward passes so far (the target's and the drafters')."""
        drafting = sum(d.engine.decode_seconds for d in self.drafters if d.engine is not None)
        return self.target.decode_seconds + drafting

    # -- 1. draft --------------------------------------------------------------------------

    def _plan(self, budget: int) -> tuple[list[Candidate], RoundPlan | None]:
        """What the planner chose from, and its plan (None: no planner, or no room to draft)."""
        if self.planner is None or budget <= 0 or not self.drafters:
            return [], None
        candidates = self._candidates(self.planner, budget)
        return candidates, self.planner.plan(candidates, self.exact_chunk, horizon=budget)

    def _candidates(self, planner: DraftPlanner, budget: int) -> list[Candidate]:
        """The drafters the plan may choose from, in order.

        Each lookup with a proposal, made now (a lookup costs microseconds), and each draft
        model the planner is ready for, with how much it must read before it drafts.
        """
        candidates: list[Candidate] = []
        for drafter in self.drafters:
            limit = self._draft_limit(drafter, budget)
            if limit <= 0:
                continue
            if drafter.lookup:
                proposal = self._make_draft(drafter, limit)
                if proposal.tokens:
                    candidates.append(Candidate(drafter, len(proposal.tokens), proposal))
            elif planner.draft_model_ready():
                candidates.append(Candidate(drafter, limit, unread=drafter.unread(self.context)))
        return candidates

    def _draft(self, plan: RoundPlan | None, budget: int) -> tuple[Drafter | None, Draft]:
        """The round's drafter and its draft (None and nothing: plain decoding)."""
        if budget <= 0 or not self.drafters:
            return None, Draft([], None)
        if self.planner is None:
            # Fixed: the first drafter with a proposal drafts the full length.
            for drafter in self.drafters:
                draft = self._make_draft(drafter, self._draft_limit(drafter, budget))
                if draft.tokens or drafter is self.drafters[-1]:
                    return drafter, draft
            raise AssertionError("unreachable")
        assert plan is not None
        if plan.drafter is None:
            return None, Draft([], None)
        if plan.proposal is not None:
            proposal = plan.proposal
            tokens = proposal.tokens[: plan.draft_tokens]
            return plan.drafter, Draft(tokens, None, evidence=proposal.evidence)
        return plan.drafter, self._make_draft(plan.drafter, plan.draft_tokens)

    def _forced(self, budget: int) -> list[int]:
        """Under a grammar, with drafting on: the next tokens it allows alone.

        Up to the longest lookup draft; plain decoding verifies them one at a time, as it
        would without a grammar.
        """
        if self.grammar is None or budget <= 0 or not self.drafters:
            return []
        return self.grammar.forced(min(budget, self.settings.lookup_draft_max))

    def _within_grammar(self, draft: Draft) -> Draft:
        """The draft up to its first token the grammar forbids (the rest counts as ignored)."""
        if self.grammar is None:
            return draft
        allowed = self.grammar.allowed_prefix(draft.tokens)
        if allowed == len(draft.tokens):
            return draft
        self.stats.ignored_draft_tokens_count += len(draft.tokens) - allowed
        return draft.cut(allowed)

    def _draft_limit(self, drafter: Drafter, budget: int) -> int:
        cap = self.settings.lookup_draft_max if drafter.lookup else self.settings.draft_max
        return min(cap, budget)

    def _make_draft(self, drafter: Drafter, max_tokens: int) -> Draft:
        """Ask ``drafter`` for a draft (a draft model stops where the planner's rule says)."""
        started = time.perf_counter()
        stop = None
        if self.planner is not None and not drafter.lookup:
            stop = self.planner.stop_rule(drafter, self.tree_rows)
        draft = drafter.draft(
            self.context,
            max_tokens,
            self.sampling,
            self.draft_rng,
            self.cancel,
            stop,
            grammar=self.grammar,
        )
        elapsed = time.perf_counter() - started
        self.stats.draft_seconds += elapsed
        drafter.stats.seconds += elapsed
        return draft

    # -- 2. verify -------------------------------------------------------------------------

    def _verify(
        self, draft: Draft, plan: RoundPlan | None, passes: list[TargetPass]
    ) -> tuple[Verdict, bool]:
        """The target's verdict on the draft, and whether its sibling was verified with it.

        The target's forward passes are appended to ``passes`` as they run. At temperature
        0 (unless ``exact_batches`` is off) no batch exceeds the engine's exact limit, so
        every row is plain decoding's; the plan may ask for smaller chunks.
        """
        chunk_rows = plan.verify_chunk if plan else None
        if self.tree_rows > 0:  # the draft and its sibling in one batch, where they fit
            limit = self.tree_rows if chunk_rows is None else min(self.tree_rows, chunk_rows)
            tree = tree_rows(self.target, self.context, draft, limit, passes)
            if tree is not None:
                chain, sibling_row = tree
                return verify_greedy(draft.tokens, chain, draft.sibling, sibling_row), True
        limits = (self.exact_chunk, chunk_rows)
        rows = chain_rows(self.target, self.context, draft.tokens, limits, passes)
        if self.grammar is not None:
            rows = self.grammar.masked_rows(rows, draft.tokens)
        if self.sampling.greedy:
            return verify_greedy(draft.tokens, rows), False
        if self.settings.verification == "sample-match":
            return verify_sample_match(draft.tokens, rows, self.sampling, self.rng), False
        verdict = verify_rejection(draft.tokens, draft.distributions, rows, self.sampling, self.rng)
        return verdict, False

    def _target_confidence(self, verdict: Verdict) -> float | None:
        """How sure the target was of its own token this round (None: not measured).

        Only a draft model's planning uses it (its priors): one softmax over the vocabulary,
        about 0.24 ms on the 1.5B's 151,936 tokens, skipped without one and on the rounds
        the planner does not want it (:meth:`DraftPlanner.wants_confidence`).
        """
        if self.planner is None or not self.has_draft_model or not self.planner.wants_confidence():
            return None
        return top_probability(verdict.row, self.sampling)

    # -- 3. account ------------------------------------------------------------------------

    def _count_round(
        self,
        drafter: Drafter | None,
        draft: Draft,
        verdict: Verdict,
        passes: Sequence[TargetPass],
        *,
        forced: bool = False,
    ) -> None:
        """Count the round: its verification passes by rows, its draft and what was kept.

        A round of tokens the grammar forced drafted nothing: it counts as a round of its
        own method, in none of the draft counts.
        """
        stats = self.stats
        for _evaluated, rows, _seconds in passes:
            stats.verify_batch_counts[rows] = stats.verify_batch_counts.get(rows, 0) + 1
        if forced:
            stats.rounds += 1
            stats.rounds_by_method[GRAMMAR_METHOD] = (
                stats.rounds_by_method.get(GRAMMAR_METHOD, 0) + 1
            )
            return
        drafted, accepted = len(draft.tokens), verdict.accepted
        stats.rounds += 1
        stats.draft_length_counts[drafted] = stats.draft_length_counts.get(drafted, 0) + 1
        method = drafter.name if drafter is not None and draft.tokens else "none"
        stats.rounds_by_method[method] = stats.rounds_by_method.get(method, 0) + 1
        if drafter is not None and draft.tokens:
            drafter.stats.record(drafted, accepted)
        verified, kept = stats.verified_at_position, stats.accepted_at_position
        while len(verified) < drafted:
            verified.append(0)
            kept.append(0)
        for position in range(min(accepted + 1, drafted)):  # reached: accepted and one more
            verified[position] += 1
            if position < accepted:
                kept[position] += 1
        stats.rejected_draft_tokens_count += drafted - accepted

    def _emit_round(
        self, draft: Draft, verdict: Verdict, *, with_sibling: bool, forced: bool = False
    ) -> None:
        """Emit the accepted tokens, then the target's own (and the token after a sibling).

        ``forced``: the draft was the grammar's own tokens (always accepted, never counted
        as drafted).
        """
        for index, token in enumerate(draft.tokens[: verdict.accepted]):
            if self.finished:
                if not forced:
                    self.stats.ignored_draft_tokens_count += verdict.accepted - index
                break
            if forced:
                self.stats.grammar_tokens_count += 1
                self._emit(token, TokenOrigin.GRAMMAR)
                continue
            self.stats.accepted_draft_tokens_count += 1
            self._emit(token, TokenOrigin.DRAFT)
        if with_sibling:
            self._count_sibling(taken=verdict.sibling_taken)
        if not self.finished:
            # A taken sibling was drafted: the target's token is then the draft's.
            origin = TokenOrigin.DRAFT if verdict.sibling_taken else TokenOrigin.TARGET
            self._emit(verdict.target_token, origin)
        if verdict.after_sibling is not None and not self.finished:
            self._emit(verdict.after_sibling, TokenOrigin.TARGET)

    def _count_sibling(self, *, taken: bool) -> None:
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

    def _emit(self, token: int, origin: TokenOrigin) -> None:
        if token in self.end_ids:
            self._finish("eos")
            return
        self.context.append(token)
        self.stats.generated_tokens += 1
        if self.output.add(token, origin):
            self._finish("stop_string")
        elif self.stats.generated_tokens >= self.settings.max_tokens:
            self._finish("max_tokens")

    def _finish(self, reason: StopReason) -> None:
        if not self.finished:
            self.finished = True
            self.stats.stop_reason = reason
