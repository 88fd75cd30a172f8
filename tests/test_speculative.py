"""The speculative loop on real models: lossless at temperature 0, stats, rollback, cancel."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from backends.engines.interface import ChatMessage, LogitRows, common_prefix_length
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.errors import ContextOverflowError, SettingsError
from backends.speculation.drafters import (
    DRAFT_READ_HEAD,
    DRAFT_READ_SHORT_WINDOW,
    DRAFT_READ_WINDOW,
    DraftModelDrafter,
)
from backends.speculation.estimates import (
    CALIBRATION_SIZES,
    DRAFT_CALIBRATION_SIZES,
    BatchCosts,
    CostCache,
)
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.sampling import SamplingSettings, top_probability
from backends.speculation.types import (
    Draft,
    DraftStopRule,
    GenerationResult,
    GenerationSettings,
    SpeculationStats,
    TokenOrigin,
)
from tests.conftest import user
from tests.test_siblings import NeverJudging

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from backends.engines.interface import ModelEngine

CODE_PROMPTS = [
    "Write a quicksort function in Python.",
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
]
PROSE_PROMPTS = [
    "Explain in a short paragraph why the sky is blue.",
]
QWEN_TOKENS = 48
SMOLLM_TOKENS = 96


def assert_stats_add_up(stats: SpeculationStats, result: GenerationResult) -> None:
    total = (
        stats.accepted_draft_tokens_count
        + stats.rejected_draft_tokens_count
        + stats.ignored_draft_tokens_count
    )
    assert stats.total_draft_tokens_count == total
    drafted_tokens = sum(1 for t in result.tokens if t.origin is TokenOrigin.DRAFT)
    # An accepted end-of-generation token counts as accepted but is not emitted.
    ended_on_draft = int(stats.stop_reason == "eos")
    assert drafted_tokens <= stats.accepted_draft_tokens_count <= drafted_tokens + ended_on_draft
    assert len(result.tokens) == stats.generated_tokens
    assert sum(stats.accepted_at_position) == stats.accepted_draft_tokens_count
    for accepted, verified in zip(
        stats.accepted_at_position, stats.verified_at_position, strict=True
    ):
        assert 0 <= accepted <= verified
    assert stats.rounds == sum(stats.draft_length_counts.values())
    # Each round's verification evaluates every accepted token and the row after it, and no
    # more than the draft and that row, in one pass or more.
    rows = sum(size * count for size, count in stats.verify_batch_counts.items())
    assert stats.accepted_draft_tokens_count + stats.rounds <= rows
    assert rows <= stats.total_draft_tokens_count + stats.rounds
    assert sum(stats.verify_batch_counts.values()) >= stats.rounds
    assert stats.stop_reason is not None


def plain_and_speculative(
    target: LlamaEngine,
    draft: LlamaEngine,
    prompt: Sequence[int],
    settings: GenerationSettings,
) -> tuple[GenerationResult, GenerationResult]:
    # Both runs start from an empty cache: a reused prompt prefix would have been computed
    # in another batch shape, and batch shape changes the last bits of the logits.
    target.truncate(0)
    draft.truncate(0)
    plain = SpeculativeDecoder(target).run(prompt, settings)
    target.truncate(0)
    spec = SpeculativeDecoder(target, DraftModelDrafter(draft, p_min=settings.p_min)).run(
        prompt, settings
    )
    return plain, spec


def explain_divergence(
    target: LlamaEngine, prompt: Sequence[int], a: list[int], b: list[int]
) -> str:
    """Where two greedy outputs part, and the target's logit margin there."""
    at = common_prefix_length(a, b)
    target.truncate(0)
    row = target.evaluate(list(prompt) + a[:at], 1)[0]
    top2 = np.sort(row)[-2:]
    return f"outputs differ at token {at}: margin between top-2 logits {top2[1] - top2[0]:.5f}"


@pytest.mark.default_pair
@pytest.mark.parametrize("draft_max", [1, 3, 8])
@pytest.mark.parametrize("prompt_text", CODE_PROMPTS + PROSE_PROMPTS)
def test_greedy_speculation_is_plain_decoding_on_default_pair(
    qwen_main: LlamaEngine, qwen_draft: LlamaEngine, prompt_text: str, draft_max: int
) -> None:
    decoder = SpeculativeDecoder(qwen_main)
    prompt = decoder.prompt_tokens(user(prompt_text))
    settings = GenerationSettings(max_tokens=QWEN_TOKENS, draft_max=draft_max, p_min=0.0)
    plain, spec = plain_and_speculative(qwen_main, qwen_draft, prompt, settings)
    assert spec.token_ids == plain.token_ids, explain_divergence(
        qwen_main, prompt, plain.token_ids, spec.token_ids
    )
    assert spec.text == plain.text
    stats = spec.stats
    assert_stats_add_up(stats, spec)
    # The 0.5B draft agrees with the 1.5B model on most tokens of these prompts.
    assert stats.accepted_draft_tokens_count > 0
    assert plain.stats.total_draft_tokens_count == 0
    assert all(t.origin is TokenOrigin.TARGET for t in plain.tokens)


@pytest.mark.parametrize("draft_max", [1, 3, 8])
@pytest.mark.parametrize("prompt_text", CODE_PROMPTS + PROSE_PROMPTS)
def test_greedy_self_speculation_smollm(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine, prompt_text: str, draft_max: int
) -> None:
    decoder = SpeculativeDecoder(smollm_target)
    prompt = decoder.prompt_tokens(user(prompt_text))
    settings = GenerationSettings(max_tokens=SMOLLM_TOKENS, draft_max=draft_max, p_min=0.0)
    plain, spec = plain_and_speculative(smollm_target, smollm_draft, prompt, settings)
    assert spec.token_ids == plain.token_ids, explain_divergence(
        smollm_target, prompt, plain.token_ids, spec.token_ids
    )
    assert_stats_add_up(spec.stats, spec)
    # The same weights draft for themselves: nearly everything is accepted.
    assert spec.stats.acceptance_rate is not None
    assert spec.stats.acceptance_rate > 0.8


def test_p_min_cuts_drafts_short(smollm_target: LlamaEngine, smollm_draft: LlamaEngine) -> None:
    decoder = SpeculativeDecoder(smollm_target)
    prompt = decoder.prompt_tokens(user(PROSE_PROMPTS[0]))
    eager = GenerationSettings(max_tokens=64, draft_max=8, p_min=0.0)
    picky = GenerationSettings(max_tokens=64, draft_max=8, p_min=0.99)
    _, eager_run = plain_and_speculative(smollm_target, smollm_draft, prompt, eager)
    plain, picky_run = plain_and_speculative(smollm_target, smollm_draft, prompt, picky)
    assert picky_run.token_ids == plain.token_ids
    assert picky_run.stats.total_draft_tokens_count < eager_run.stats.total_draft_tokens_count


def test_draft_min_drops_short_drafts_as_ignored(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    decoder = SpeculativeDecoder(smollm_target)
    prompt = decoder.prompt_tokens(user(PROSE_PROMPTS[0]))
    settings = GenerationSettings(max_tokens=64, draft_max=4, draft_min=4, p_min=0.9)
    plain, spec = plain_and_speculative(smollm_target, smollm_draft, prompt, settings)
    assert spec.token_ids == plain.token_ids
    stats = spec.stats
    assert_stats_add_up(stats, spec)
    assert stats.ignored_draft_tokens_count > 0
    # Only full-length drafts were verified.
    assert set(stats.draft_length_counts) <= {0, 4}


def _log_softmax(row: np.ndarray) -> np.ndarray:
    shifted = row.astype(np.float64) - row.max()
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum())
    return result


@pytest.mark.heavy
def test_kv_rollback_keeps_both_caches_consistent(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    """Over a long generation with many rejections the caches stay equal to a fresh decode."""
    decoder = SpeculativeDecoder(smollm_target, DraftModelDrafter(smollm_draft, p_min=0.0))
    prompt = decoder.prompt_tokens(user("Write a long story about a robot learning to paint."))
    settings = GenerationSettings(
        max_tokens=300, draft_max=6, p_min=0.0, sampling=SamplingSettings(temperature=1.0, seed=3)
    )
    result = decoder.run(prompt, settings)
    assert result.stats.rejected_draft_tokens_count > 0
    context = list(prompt) + result.token_ids
    # The main model keeps its single-path attention; the draft takes llama.cpp's faster
    # paths, whose rounding moves further with the context length (it needs no exactness).
    for engine, bound in ((smollm_target, 1.0), (smollm_draft, 2.0)):
        cached = list(engine.cached_tokens)
        assert cached == context[: len(cached)]
        # The cache's last logits equal those of a fresh evaluation of the same tokens.
        kept = len(cached) - 1
        engine.truncate(kept)
        incremental = engine.evaluate(context[kept : kept + 1], 1)[0].copy()
        engine.truncate(0)
        fresh = engine.evaluate(context[: kept + 1], 1)[0].copy()
        # Batch shape moves log-probabilities by a fraction of a unit (the fresh prompt is
        # one batch of hundreds of rows); stale or misplaced cache entries would move them
        # by far more. So the choice is the same, or a near-tie of the fresh logits.
        moved = np.abs(_log_softmax(incremental) - _log_softmax(fresh))
        assert float(moved.max()) < bound, engine.name
        chosen = int(np.argmax(incremental))
        assert chosen == int(np.argmax(fresh)) or fresh[chosen] > fresh.max() - 0.5


def test_cancel_stops_within_one_round(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    decoder = SpeculativeDecoder(smollm_target, DraftModelDrafter(smollm_draft, p_min=0.0))
    prompt = decoder.prompt_tokens(user("Write a long essay about the history of computing."))
    cancel = threading.Event()
    settings = GenerationSettings(max_tokens=400, draft_max=4, p_min=0.0)
    rounds_after_cancel = 0
    generated_at_cancel = 0
    final = None
    for update in decoder.generate(prompt, settings, cancel):
        if cancel.is_set():
            rounds_after_cancel += 1
        elif update.stats.generated_tokens >= 12:
            generated_at_cancel = update.stats.generated_tokens
            # Another thread asks to stop, as the GUI's Stop button does.
            threading.Thread(target=cancel.set).start()
            while not cancel.is_set():
                pass
        final = update
    assert final is not None
    assert final.finished
    assert final.stats.stop_reason == "cancelled"
    assert rounds_after_cancel <= 1
    assert final.stats.generated_tokens <= generated_at_cancel + settings.draft_max + 1


def test_stop_string_ends_generation_and_is_not_emitted(smollm_target: LlamaEngine) -> None:
    decoder = SpeculativeDecoder(smollm_target)
    prompt = decoder.prompt_tokens(user("Count from 1 to 20, separated by commas."))
    free = decoder.run(prompt, GenerationSettings(max_tokens=80))
    assert "7" in free.text
    stop = "7"
    cut = decoder.run(prompt, GenerationSettings(max_tokens=80, stop_strings=(stop,)))
    assert cut.stats.stop_reason == "stop_string"
    assert cut.text == free.text[: free.text.index(stop)]


def test_max_tokens_and_end_of_generation(smollm_target: LlamaEngine) -> None:
    decoder = SpeculativeDecoder(smollm_target)
    prompt = decoder.prompt_tokens(user("Say hello."))
    short = decoder.run(prompt, GenerationSettings(max_tokens=5))
    assert short.stats.stop_reason == "max_tokens"
    assert short.stats.generated_tokens == 5
    full = decoder.run(prompt, GenerationSettings(max_tokens=200))
    assert full.stats.stop_reason == "eos"
    assert not set(full.token_ids) & smollm_target.vocab.end_of_generation_ids


def test_prompt_longer_than_context_is_a_clear_error(smollm_target: LlamaEngine) -> None:
    decoder = SpeculativeDecoder(smollm_target)
    prompt = decoder.prompt_tokens(user("word " * (smollm_target.n_ctx + 10)))
    with pytest.raises(ContextOverflowError, match="context holds"):
        decoder.run(prompt, GenerationSettings(max_tokens=4))


def test_generation_stops_when_context_is_full(smollm_path: Path) -> None:
    # A small context: filling it costs a short prompt (exactness is not the question here).
    settings = LlamaLoadSettings(n_ctx=256, probe_exact_batch=False)
    with LlamaEngine(smollm_path, settings) as engine:
        decoder = SpeculativeDecoder(engine)
        prompt = _prompt_of_at_most(decoder, engine.n_ctx - 4, "Count from 1 to 100.")
        room = engine.n_ctx - len(prompt)
        assert 4 <= room < 20  # fewer tokens than counting to 100 takes: the answer cannot end
        result = decoder.run(prompt, GenerationSettings(max_tokens=50))
    assert result.stats.stop_reason == "context_full", result.text
    assert result.stats.generated_tokens == len(result.token_ids) == room


def _prompt_of_at_most(decoder: SpeculativeDecoder, length: int, question: str) -> list[int]:
    """The longest chat prompt of filler text and then ``question`` that has ``length`` tokens
    or fewer."""
    filler = "Some notes to ignore. "
    base = len(decoder.prompt_tokens(user(question)))
    per_filler = (len(decoder.prompt_tokens(user(filler * 100 + question))) - base) / 100
    count = int((length - base) / per_filler) + 1
    while len(prompt := decoder.prompt_tokens(user(filler * count + question))) > length:
        count -= 1
    return prompt


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"draft_max": 0}, "draft_max"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"draft_min": 5, "draft_max": 3}, "draft_min"),
        ({"p_min": 1.5}, "p_min"),
        ({"stop_strings": ("",)}, "stop strings"),
    ],
)
def test_impossible_generation_settings(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        GenerationSettings(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.0}, "min_p"),
    ],
)
def test_impossible_sampling_settings(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        SamplingSettings(**kwargs)  # type: ignore[arg-type]


def test_utf8_split_across_tokens_decodes(smollm_target: LlamaEngine) -> None:
    decoder = SpeculativeDecoder(smollm_target)
    prompt = decoder.prompt_tokens(user("Write the word café three times, then an emoji 🎉."))
    result = decoder.run(prompt, GenerationSettings(max_tokens=40))
    joined = b"".join(smollm_target.token_bytes(t) for t in result.token_ids)
    assert result.text == joined.decode("utf-8", errors="replace")


@pytest.mark.default_pair
def test_exact_batch_probe_guards_greedy_identity(qwen_main: LlamaEngine) -> None:
    """The probe's limit is real: batches up to it reproduce single-token logits bitwise."""
    limit = qwen_main.exact_batch_limit
    assert limit is not None
    assert limit >= 1
    tokens = qwen_main.tokenize(
        "for i in range(10):\n    print(i * i)\n", add_special=False, parse_special=False
    )
    size = min(limit, len(tokens) - 1)
    qwen_main.truncate(0)
    qwen_main.evaluate(tokens[:1], 1)
    singles: list[LogitRows] = [qwen_main.evaluate([t], 1)[0].copy() for t in tokens[1 : size + 1]]
    qwen_main.truncate(1)
    batch = qwen_main.evaluate(tokens[1 : size + 1], size).copy()
    for index in range(size):
        assert np.array_equal(batch[index], singles[index])


def test_stop_rule_decides_where_the_draft_model_stops(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    """A stop rule replaces p-min: it drafts past p-min where its tokens are kept, not else."""
    decoder = SpeculativeDecoder(smollm_target)
    context = decoder.prompt_tokens(user(PROSE_PROMPTS[0]))
    drafter = DraftModelDrafter(smollm_draft, p_min=1.0)  # p-min alone would never draft
    greedy = SamplingSettings(temperature=0.0)
    rng = np.random.default_rng(0)
    assert drafter.draft(context, 6, greedy, rng, None).tokens == []
    always_kept = DraftStopRule((1.0,) * 10, keep_floor=0.5, go_on_floor=0.5)
    smollm_draft.truncate(0)
    eager = drafter.draft(context, 6, greedy, rng, None, always_kept)
    assert len(eager.tokens) == 6
    # Each token's confidence is the draft's top probability after the tokens before it
    # (recomputed the same way: the context in one batch, then one token at a time).
    smollm_draft.truncate(0)
    rows = [smollm_draft.evaluate(context, 1)[-1].copy()]
    rows += [smollm_draft.evaluate([token], 1)[-1].copy() for token in eager.tokens[:-1]]
    assert eager.confidences == pytest.approx([top_probability(r, greedy) for r in rows])
    never_kept = DraftStopRule((0.0,) * 10, keep_floor=0.5, go_on_floor=0.5)
    assert drafter.draft(context, 6, greedy, rng, None, never_kept).tokens == []
    # Kept half the time: the second token's reach (0.25) is under the keep floor, and going
    # on after the first (reach 0.5) needs 0.6.
    halves = DraftStopRule((0.5,) * 10, keep_floor=0.3, go_on_floor=0.4)
    assert len(drafter.draft(context, 6, greedy, rng, None, halves).tokens) == 1
    timid = DraftStopRule((0.5,) * 10, keep_floor=0.3, go_on_floor=0.6)
    assert len(drafter.draft(context, 6, greedy, rng, None, timid).tokens) == 1
    assert len(smollm_draft.cached_tokens) == len(context)  # it did not go on to a second


class FavourableCosts(CostCache):
    """Costs that make drafting pay from the first round (the loop then measures its own)."""

    def costs(self, engine: ModelEngine, sizes: Sequence[int] = CALIBRATION_SIZES) -> BatchCosts:
        """Target passes of 20 ms plus 1 ms a row, draft steps of 1 ms."""
        if sizes == DRAFT_CALIBRATION_SIZES:
            return BatchCosts({size: 0.001 * size for size in sizes})
        return BatchCosts({size: 0.020 + 0.001 * size for size in sizes})


def test_planner_learns_its_stop_rule_from_the_answer(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    """With the planner the drafts carry confidences, and what was kept is learnt by them."""
    decoder = SpeculativeDecoder(
        smollm_target,
        [DraftModelDrafter(smollm_draft, p_min=0.75)],
        adaptive=True,
        cost_cache=FavourableCosts(),
    )
    decoder.prepare()
    assert decoder.planner is not None
    # On these costs the draft is chosen wherever it is expected to be kept; this machine's
    # own pace is not to judge it (that is tests/test_earnings.py's).
    decoder.planner.watch = NeverJudging()
    prompt = decoder.prompt_tokens(user(CODE_PROMPTS[1]))
    settings = GenerationSettings(max_tokens=SMOLLM_TOKENS, draft_max=6)
    plain = SpeculativeDecoder(smollm_target).run(prompt, settings)
    smollm_draft.truncate(0)
    spec = decoder.run(prompt, settings)
    assert spec.token_ids == plain.token_ids
    planner = decoder.planner
    assert planner is not None
    drafter = planner.drafters[0]
    kept = planner.kept_by_confidence(drafter)
    # The verified draft tokens up to each first rejection were counted in their buckets.
    assert spec.stats.accepted_draft_tokens_count > 0
    assert 0.0 < sum(kept.kept) <= sum(kept.reached)
    rule = planner.stop_rule(drafter)
    assert rule is not None  # (its floors come from costs: tests/test_planner.py)
    # The same weights draft for themselves: their sure tokens are kept.
    assert rule.kept_chance(0.99) > 0.9


LONG_PROMPT = (
    "Here is a log of a warehouse robot's day, one line per task:\n"
    + "".join(f"- task {n}: crate {n * 7} from aisle {n % 5} to dock {n % 3}\n" for n in range(30))
    + "Summarise the day in two sentences."
)


class ReadCounting(DraftModelDrafter):
    """Counts every token the draft model evaluates (its reading and its own steps)."""

    evaluated = 0

    def draft(self, *args: Any, **kwargs: Any) -> Draft:
        """Draft, then add up this draft's forward passes."""
        result = super().draft(*args, **kwargs)
        self.evaluated += sum(tokens for tokens, _seconds in result.passes)
        return result


def test_draft_model_reads_the_head_and_tail_of_a_long_context_once(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    """A long prompt: the draft reads its opening and last tokens, each later token once."""
    decoder = SpeculativeDecoder(smollm_target)
    prompt = decoder.prompt_tokens(user(LONG_PROMPT))
    assert len(prompt) > 10 * (DRAFT_READ_HEAD + DRAFT_READ_WINDOW)
    settings = GenerationSettings(max_tokens=SMOLLM_TOKENS, draft_max=4, p_min=0.0)
    plain = decoder.run(prompt, settings)
    smollm_draft.truncate(0)
    drafter = ReadCounting(smollm_draft, p_min=0.0)
    spec = SpeculativeDecoder(smollm_target, drafter).run(prompt, settings)
    assert spec.token_ids == plain.token_ids  # what the draft reads never changes the text
    assert spec.stats.accepted_draft_tokens_count > 0
    context = [*prompt, *spec.token_ids]
    resume_at = len(prompt) + 1 - DRAFT_READ_WINDOW  # its first draft follows the first token
    # Its cache: the prompt's opening, then everything from the window on.
    cached = smollm_draft.cached_tokens
    assert cached[:DRAFT_READ_HEAD] == prompt[:DRAFT_READ_HEAD]
    read_since = cached[DRAFT_READ_HEAD:]
    assert read_since == context[resume_at : resume_at + len(read_since)]
    assert len(read_since) >= len(context) - resume_at - settings.draft_max - 1
    # Read once: the window, then each later token (a drafted one may be read again
    # after the target's replacement of the token before it).
    drafted = spec.stats.total_draft_tokens_count
    window = DRAFT_READ_HEAD + DRAFT_READ_WINDOW
    assert drafter.evaluated <= window + len(spec.token_ids) + drafted
    # The next turn of the chat reads only what is new.
    turn = decoder.prompt_tokens(
        [*user(LONG_PROMPT), ChatMessage("assistant", spec.text), *user("And in one?")]
    )
    shared = common_prefix_length(turn, context)
    assert shared > len(prompt)
    assert drafter.unread(turn) <= len(turn) - shared + settings.draft_max + 1
    # Another conversation starts a new window instead of reading all of it.
    question = LONG_PROMPT.replace("Summarise the day in two sentences.", "Which dock won?")
    other = decoder.prompt_tokens(user(question))
    assert drafter.reading(other) == [*other[:DRAFT_READ_HEAD], *other[-DRAFT_READ_WINDOW:]]
    assert drafter.unread(other) <= window


def test_where_reading_is_dear_the_draft_reads_less(smollm_draft: LlamaEngine) -> None:
    """The head and window where they fit in the budget, the window alone, the short one."""
    step = 0.030
    for per_token, read in ((0.001, (24, 32)), (0.0015, (0, 32)), (0.0036, (0, 16))):
        drafter = DraftModelDrafter(smollm_draft)

        def linear_reading(tokens: int, cost: float = per_token) -> float:
            return tokens * cost

        drafter.fit_reading(linear_reading, step)
        assert (drafter.head, drafter.window) == read
    long_context = list(range(1000))
    assert drafter.reading(long_context) == long_context[-DRAFT_READ_SHORT_WINDOW:]
    drafter.fit_reading(lambda tokens: 0.0, step)  # reading started: it stays as it was
    assert drafter.reading(long_context) == long_context[-DRAFT_READ_SHORT_WINDOW:]


def test_draft_model_without_a_window_reads_everything(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    """``window=None``: the whole context, as llama.cpp's draft reads it."""
    prompt = SpeculativeDecoder(smollm_target).prompt_tokens(user(LONG_PROMPT))
    smollm_draft.truncate(0)
    drafter = DraftModelDrafter(smollm_draft, p_min=0.0, window=None)
    assert drafter.unread(prompt) == len(prompt)
    greedy = SamplingSettings(temperature=0.0)
    draft = drafter.draft(prompt, 2, greedy, np.random.default_rng(0), None)
    assert draft.passes[0][0] == len(prompt)
    assert smollm_draft.cached_tokens[: len(prompt)] == prompt
    with pytest.raises(SettingsError, match="reading window must be 1 token or more, not 0"):
        DraftModelDrafter(smollm_draft, window=0)
