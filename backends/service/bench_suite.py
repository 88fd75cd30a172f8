"""``specdeck-bench --suite``: every suite prompt, plain and with every method, on one pair.

The prompts are :mod:`backends.service.suite_prompts`; the methods :data:`SUITE_METHODS`,
each bit-exact and, where it matters, with llama.cpp's fast batches. Each method keeps
its decoder (and so what its planner learned) across prompts, as in the app; each run
starts from empty caches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TextIO

from backends.engines.interface import ChatMessage
from backends.errors import SettingsError
from backends.service.pair_runs import WARMUP_TOKENS, timed_run
from backends.service.suite_prompts import SUITE_PROMPTS
from backends.speculation.methods import build_decoder

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.service.loaded_pair import LoadedPair
    from backends.speculation.methods import SpeculationMethod
    from backends.speculation.types import GenerationResult, GenerationSettings

DEFAULT_PROMPT = "Write a quicksort function in Python."  # one prompt's default, the warm-up

# (label, method, adaptive, bit-exact batches); "plain" first: the others are compared to it
SUITE_METHODS: tuple[tuple[str, SpeculationMethod, bool, bool], ...] = (
    ("plain", "off", False, True),
    ("draft model, k=3", "draft-model", False, True),
    ("draft model, k=3, fast", "draft-model", False, False),
    ("ngram-simple", "ngram-simple", True, True),
    ("ngram-simple, fast", "ngram-simple", True, False),
    ("ngram-mod", "ngram-mod", True, True),
    ("ngram-mod, fast", "ngram-mod", True, False),
    ("edit-copy", "edit-copy", True, True),
    ("auto", "auto", True, True),
    ("auto, fast", "auto", True, False),
)


@dataclass(frozen=True)
class SuiteRow:
    """One prompt run with one method, next to the same prompt's plain run."""

    prompt: str
    method: str
    result: GenerationResult
    baseline: GenerationResult

    @property
    def speedup(self) -> float | None:
        """Tok/s of this run over plain decoding's on the same prompt."""
        return self.result.stats.speedup_over(self.baseline.stats)

    @property
    def identical(self) -> bool:
        """Whether the text equals plain decoding's (the suite runs at temperature 0)."""
        return self.result.token_ids == self.baseline.token_ids


def suite_keys(text: str | None) -> list[str] | None:
    """The prompts ``--suite-prompts`` names (comma-separated keys); None for all."""
    if text is None:
        return None
    keys = [key.strip() for key in text.split(",") if key.strip()]
    known = {prompt.key for prompt in SUITE_PROMPTS}
    unknown = [key for key in keys if key not in known]
    if unknown or not keys:
        raise SettingsError(
            f"unknown suite prompt {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(sorted(known))}"
        )
    return keys


def run_suite(
    pair: LoadedPair,
    settings: GenerationSettings,
    *,
    prompt_keys: Sequence[str] | None = None,
    max_tokens: int | None = None,
    progress: TextIO | None = None,
) -> list[SuiteRow]:
    """Every suite prompt, plain and with every method, at temperature 0, on ``pair``.

    ``settings`` gives the shared knobs (draft max, p-min, lookup draft max); max tokens
    come from each prompt, at most ``max_tokens`` where it is given.
    """
    greedy = replace(settings, sampling=replace(settings.sampling, temperature=0.0))
    main, draft = pair.main, pair.draft
    rows: list[SuiteRow] = []
    decoders = {
        label: build_decoder(
            method, main, draft, adaptive=adaptive, p_min=settings.p_min, cost_cache=pair.costs
        )
        for label, method, adaptive, _exact in SUITE_METHODS
    }
    # Warm-up: pages the weights in and lets adaptive decoders calibrate, untimed.
    warm_prompt = decoders["plain"].prompt_tokens([ChatMessage("user", DEFAULT_PROMPT)])
    for decoder in decoders.values():
        timed_run(decoder, (main, draft), warm_prompt, replace(greedy, max_tokens=WARMUP_TOKENS))
    for prompt in SUITE_PROMPTS:
        if prompt_keys is not None and prompt.key not in prompt_keys:
            continue
        tokens = decoders["plain"].prompt_tokens([ChatMessage("user", prompt.text)])
        length = prompt.max_tokens if max_tokens is None else min(max_tokens, prompt.max_tokens)
        baseline: GenerationResult | None = None
        for label, _method, _adaptive, exact in SUITE_METHODS:
            run_settings = replace(greedy, max_tokens=length, exact_batches=exact)
            result = timed_run(decoders[label], (main, draft), tokens, run_settings)
            baseline = baseline or result
            rows.append(SuiteRow(prompt.key, label, result, baseline))
            if progress is not None:
                print(f"  {prompt.key}: {label} done", file=progress, flush=True)
    return rows
