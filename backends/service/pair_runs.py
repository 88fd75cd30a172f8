"""Generating on a loaded pair: an answer, and plain against speculative decoding.

Two kinds of comparison, one verdict (:class:`Comparison`: the speedup, and whether the
texts are identical, which only means something at temperature 0):

- **An answer** (:func:`answer`; the window's engine process): the speculative run
  streams first, then with ``compare`` the main model alone answers the same prompt.
  Both start from the prefix the main model's cache already holds for the conversation,
  so neither is helped by what the other left in the cache.
- **A benchmark** (:func:`compare_from_empty`; specdeck-bench): an untimed warm-up, then
  plain then speculative decoding, each from empty caches, so every run pays for the
  prompt alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from backends.engines.interface import common_prefix_length
from backends.errors import ContextOverflowError
from backends.service.context_fit import answer_room, fit_conversation
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.types import GenerationResult

if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping, Sequence

    from backends.engines.interface import ChatMessage, ModelEngine
    from backends.service.context_fit import ContextPolicy, FittedConversation
    from backends.service.protocol import RunKind
    from backends.speculation.methods import SpeculationMethod
    from backends.speculation.planner import CostCache
    from backends.speculation.types import (
        EmittedToken,
        GenerationSettings,
        GenerationUpdate,
        SpeculationStats,
    )

WARMUP_TOKENS = 8  # pages the weights in, so the first timed run is not penalised


@dataclass(frozen=True)
class Comparison:
    """Plain decoding and speculative decoding of the same prompt on the same main model."""

    baseline: GenerationResult  # the main model alone
    speculative: GenerationResult
    greedy: bool
    prompt_tokens: int  # the prompt both ran on

    @property
    def speedup(self) -> float | None:
        """Speculative tok/s over plain tok/s."""
        return self.speculative.stats.speedup_over(self.baseline.stats)

    @property
    def identical(self) -> bool | None:
        """Whether the texts match (only meaningful at temperature 0, else None)."""
        if not self.greedy:
            return None
        return self.baseline.token_ids == self.speculative.token_ids


class RunObserver(Protocol):
    """Hears of an answer's runs as they go (the engine process turns them into events)."""

    def run_started(self, run: RunKind, prompt_tokens: int) -> None:
        """A run begins on a prompt of ``prompt_tokens`` tokens."""

    def round_done(self, run: RunKind, update: GenerationUpdate) -> None:
        """A round of ``run`` released tokens; the last one has ``finished`` set."""


@dataclass(frozen=True)
class Answer:
    """The runs of one answer: the speculative one, and with ``compare`` the plain one."""

    results: Mapping[RunKind, GenerationResult]
    comparison: Comparison | None  # both runs finished (a cancel may stop before the second)


def answer(
    speculative: SpeculativeDecoder,
    messages: Sequence[ChatMessage],
    settings: GenerationSettings,
    *,
    compare: bool = False,
    observer: RunObserver | None = None,
    cancel: threading.Event | None = None,
    context_policy: ContextPolicy = "stop",
) -> Answer:
    """Answer a conversation with ``speculative``, streaming each round to ``observer``.

    With ``compare`` the main model alone answers it after. A conversation that outgrows
    the context is shortened by ``context_policy`` (the stats count the messages left
    out); one that still fills it raises ContextOverflowError, in one line.
    """
    main = speculative.target
    fitted = fit_conversation(
        messages,
        lambda conversation: len(speculative.prompt_tokens(conversation)),
        main.n_ctx - answer_room(settings.max_tokens, main.n_ctx),
        context_policy,
    )
    prompt = speculative.prompt_tokens(fitted.messages)
    if len(prompt) >= main.n_ctx:
        raise ContextOverflowError(
            f"the conversation is {len(prompt)} tokens but the context holds "
            f"{main.n_ctx}; start a new chat or raise the context size"
        )
    # Both runs of a comparison start from the same cached prefix, so neither is helped
    # by what the other left in the cache.
    start = common_prefix_length(main.cached_tokens, prompt)
    runs: list[tuple[RunKind, SpeculativeDecoder]] = [("speculative", speculative)]
    if compare:
        runs.append(("plain", SpeculativeDecoder(main)))
    results: dict[RunKind, GenerationResult] = {}
    for run, decoder in runs:
        if cancel is not None and cancel.is_set():
            break
        main.truncate(min(start, len(main.cached_tokens)))
        results[run] = _stream(run, decoder, prompt, settings, observer, cancel, fitted)
    comparison = None
    if compare and len(results) == 2:
        comparison = Comparison(
            results["plain"], results["speculative"], settings.sampling.greedy, len(prompt)
        )
    return Answer(results, comparison)


def _stream(
    run: RunKind,
    decoder: SpeculativeDecoder,
    prompt: list[int],
    settings: GenerationSettings,
    observer: RunObserver | None,
    cancel: threading.Event | None,
    fitted: FittedConversation | None = None,
) -> GenerationResult:
    if observer is not None:
        observer.run_started(run, len(prompt))
    tokens: list[EmittedToken] = []
    stats: SpeculationStats | None = None
    for update in decoder.generate(prompt, settings, cancel):
        tokens.extend(update.tokens)
        stats = update.stats
        if fitted is not None:
            stats.dropped_messages = fitted.dropped
            stats.dropped_from = fitted.first_dropped
        if observer is not None:
            observer.round_done(run, update)
        if update.finished:
            break
    assert stats is not None
    return GenerationResult(tuple(tokens), stats)


def compare_from_empty(
    main: ModelEngine,
    draft: ModelEngine | None,
    messages: Sequence[ChatMessage],
    settings: GenerationSettings,
    *,
    method: SpeculationMethod,
    adaptive: bool = True,
    warmup: bool = True,
    costs: CostCache | None = None,
) -> Comparison:
    """Plain then speculative decoding of one prompt, each from empty caches, timed.

    ``adaptive``: the cost-aware draft length for every method (False drafts the maximum
    length every round); ``warmup`` first runs a few untimed tokens; ``costs``: the batch
    costs measured so far (the planner measures what is missing).
    """
    plain = SpeculativeDecoder(main)
    speculative = build_decoder(
        method, main, draft, adaptive=adaptive, p_min=settings.p_min, cost_cache=costs
    )
    prompt = plain.prompt_tokens(messages)
    if warmup:
        timed_run(speculative, (main, draft), prompt, replace(settings, max_tokens=WARMUP_TOKENS))
    baseline = timed_run(plain, (main, draft), prompt, settings)
    spec = timed_run(speculative, (main, draft), prompt, settings)
    return Comparison(baseline, spec, settings.sampling.greedy, len(prompt))


def timed_run(
    decoder: SpeculativeDecoder,
    engines: Sequence[ModelEngine | None],
    prompt: Sequence[int],
    settings: GenerationSettings,
) -> GenerationResult:
    """One timed generation from empty caches, so every run pays for the prompt alike."""
    for engine in engines:
        if engine is not None:
            engine.truncate(0)
    return decoder.run(prompt, settings)
