"""Rejection sampling keeps the target's distribution: exact bigram models, then a real model."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import pytest
from scipy import stats as scipy_stats

from backends.engines.interface import ChatMessage, LoadReport, LogitRows, VocabFacts
from backends.speculation.drafters import DraftModelDrafter
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.sampling import SamplingSettings, probabilities
from backends.speculation.types import Draft, DraftStopRule, GenerationSettings, Verification
from tests.conftest import user

if TYPE_CHECKING:
    import threading
    from collections.abc import Sequence

    from backends.engines.interface import ToolFormat, ToolFunction
    from backends.engines.llama import LlamaEngine
    from backends.engines.worker_probe import WorkerStatus
    from backends.speculation.grammar import GrammarMatcher

VOCAB = 6
DRAWS = 12_000
SIGNIFICANCE = 1e-3  # a correct sampler fails this test once in a thousand runs at most


class BigramEngine:
    """A synthetic model whose logits depend on the last token only (exact distributions known)."""

    def __init__(self, table: np.ndarray, name: str) -> None:
        self.table = table.astype(np.float32)
        self._tokens: list[int] = []
        self._name = name

    name = property(lambda self: self._name)
    n_ctx = property(lambda self: 4096)
    cached_tokens = property(lambda self: self._tokens)
    decode_seconds = property(lambda self: 0.0)
    exact_batch_limit = None
    exact_siblings = False

    @property
    def vocab(self) -> VocabFacts:
        return VocabFacts(VOCAB, None, None, False, frozenset())

    @property
    def load_report(self) -> LoadReport:
        return LoadReport(self._name, "CPU", 1, 0, False, 4096, 1, 0.0)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return [0]

    def token_bytes(self, token: int) -> bytes:
        return bytes([65 + token])

    tool_format: ToolFormat = "hermes"

    def chat_prompt(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolFunction] = ()
    ) -> str:
        return ""

    def evaluate(self, tokens: Sequence[int], logit_rows: int) -> LogitRows:
        self._tokens.extend(tokens)
        return self.table[list(self._tokens[-logit_rows:])]

    def evaluate_with_sibling(
        self, tokens: Sequence[int], logit_rows: int, sibling_at: int, sibling: int
    ) -> LogitRows:
        raise AssertionError("sampling never verifies siblings")

    def truncate(self, n_tokens: int) -> None:
        del self._tokens[n_tokens:]

    def worker_statuses(self) -> tuple[WorkerStatus, ...]:
        return ()

    def close(self) -> None:
        pass


def bigram_tables(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    target = rng.normal(0.0, 1.5, size=(VOCAB, VOCAB))
    # A draft that is related to the target but clearly wrong in places.
    draft = target + rng.normal(0.0, 1.5, size=(VOCAB, VOCAB))
    return target, draft


def exact_joint(
    table: np.ndarray, sampling: SamplingSettings, length: int
) -> dict[tuple[int, ...], float]:
    """Probability of every sequence of ``length`` tokens after the prompt token 0."""
    rows = [probabilities(table[i].astype(np.float32), sampling) for i in range(VOCAB)]
    joint: dict[tuple[int, ...], float] = {}
    for sequence in itertools.product(range(VOCAB), repeat=length):
        previous, probability = 0, 1.0
        for token in sequence:
            probability *= rows[previous][token]
            previous = token
        joint[sequence] = probability
    return joint


def chi_square_p_value(
    observed: Counter[tuple[int, ...]], expected: dict[tuple[int, ...], float], draws: int
) -> float:
    keys = [k for k, p in expected.items() if p * draws >= 5]
    rest_expected = draws - sum(expected[k] * draws for k in keys)
    rest_observed = draws - sum(observed[k] for k in keys)
    f_obs = [observed[k] for k in keys] + [rest_observed]
    f_exp = [expected[k] * draws for k in keys] + [rest_expected]
    return float(scipy_stats.chisquare(f_obs, f_exp).pvalue)


class RuledDrafter(DraftModelDrafter):
    """A draft model that always stops where a given rule says, as the planner makes it do."""

    def __init__(self, engine: BigramEngine, rule: DraftStopRule) -> None:
        super().__init__(engine, p_min=0.0)
        self.rule = rule

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
        """Draft with this drafter's rule."""
        return super().draft(context, max_tokens, sampling, rng, cancel, self.rule, grammar=grammar)


# Kept as often as the draft is sure (the planner's prior); a draft stops after one to
# three tokens, by how sure it was of them.
PRIOR_RULE = DraftStopRule(tuple(0.05 + 0.1 * i for i in range(10)), 0.15, 0.3)


def sample_sequences(
    verification: Verification,
    sampling: SamplingSettings,
    seed: int,
    draft_max: int = 3,
    stop: DraftStopRule | None = None,
) -> tuple[Counter[tuple[int, ...]], float]:
    target_table, draft_table = bigram_tables(seed)
    target = BigramEngine(target_table, "target")
    draft = BigramEngine(draft_table, "draft")
    drafter = DraftModelDrafter(draft, p_min=0.0) if stop is None else RuledDrafter(draft, stop)
    decoder = SpeculativeDecoder(target, drafter)
    lengths: Counter[int] = Counter()
    counts: Counter[tuple[int, ...]] = Counter()
    accepted = drafted = 0
    for draw in range(DRAWS):
        settings = GenerationSettings(
            max_tokens=4,
            draft_max=draft_max,
            p_min=0.0,
            verification=verification,
            sampling=SamplingSettings(
                temperature=sampling.temperature,
                top_k=sampling.top_k,
                top_p=sampling.top_p,
                seed=seed * 1_000_003 + draw,
            ),
        )
        result = decoder.run([0], settings)
        counts[tuple(result.token_ids)] += 1
        lengths.update(result.stats.draft_length_counts)
        accepted += result.stats.accepted_draft_tokens_count
        drafted += result.stats.total_draft_tokens_count
    if stop is not None:
        assert len(lengths) > 1, "the rule must cut drafts at different lengths"
    return counts, accepted / drafted


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingSettings(temperature=1.0),
        SamplingSettings(temperature=0.7, top_k=4),
        SamplingSettings(temperature=1.3, top_p=0.8),
    ],
    ids=["t1", "t0.7-topk4", "t1.3-topp0.8"],
)
@pytest.mark.parametrize("verification", ["rejection", "sample-match"])
def test_speculative_sampling_matches_target_distribution(
    verification: Verification, sampling: SamplingSettings
) -> None:
    target_table, _ = bigram_tables(seed=11)
    counts, _ = sample_sequences(verification, sampling, seed=11)
    expected = exact_joint(target_table, sampling, length=4)
    p_value = chi_square_p_value(counts, expected, DRAWS)
    assert p_value > SIGNIFICANCE, f"distribution differs from the target's (p={p_value:.2e})"


@pytest.mark.parametrize("verification", ["rejection", "sample-match"])
def test_a_learnt_stop_keeps_the_target_distribution(verification: Verification) -> None:
    """Where the draft stops depends on what it drafted, never on the target: still exact."""
    sampling = SamplingSettings(temperature=1.0)
    target_table, _ = bigram_tables(seed=11)
    counts, _ = sample_sequences(verification, sampling, seed=11, stop=PRIOR_RULE)
    expected = exact_joint(target_table, sampling, length=4)
    p_value = chi_square_p_value(counts, expected, DRAWS)
    assert p_value > SIGNIFICANCE, f"distribution differs from the target's (p={p_value:.2e})"


def test_the_distribution_test_can_fail() -> None:
    """Sampling from the draft's distribution instead is caught by the same test."""
    sampling = SamplingSettings(temperature=1.0)
    _, draft_table = bigram_tables(seed=11)
    target_table, _ = bigram_tables(seed=11)
    draft = BigramEngine(draft_table, "draft")
    counts: Counter[tuple[int, ...]] = Counter()
    for draw in range(DRAWS):
        settings = GenerationSettings(
            max_tokens=4, sampling=SamplingSettings(temperature=1.0, seed=draw)
        )
        counts[tuple(SpeculativeDecoder(draft).run([0], settings).token_ids)] += 1
    expected = exact_joint(target_table, sampling, length=4)
    assert chi_square_p_value(counts, expected, DRAWS) < SIGNIFICANCE


@pytest.mark.heavy
def test_rejection_sampling_accepts_more_than_sample_and_match() -> None:
    sampling = SamplingSettings(temperature=1.0)
    _, rejection_rate = sample_sequences("rejection", sampling, seed=5)
    _, match_rate = sample_sequences("sample-match", sampling, seed=5)
    assert rejection_rate > match_rate + 0.05


@pytest.mark.heavy
def test_real_model_keeps_target_distribution(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    """SmolLM2 drafts for itself at a hotter temperature (q != p); tokens 2-3 still follow p.

    Compared with plain sampling from the target by a two-sample chi-square test, and the
    draft's own output is shown to differ by the same test.
    """
    sampling = SamplingSettings(temperature=0.8, top_k=8)
    draft_sampling = SamplingSettings(temperature=1.6, top_k=8)
    prompt_messages = user("Name one colour.")
    plain = SpeculativeDecoder(smollm_target)
    prompt = plain.prompt_tokens(prompt_messages)
    speculative = SpeculativeDecoder(
        smollm_target, DraftModelDrafter(smollm_draft, p_min=0.0, sampling=draft_sampling)
    )
    draft_only = SpeculativeDecoder(smollm_draft)
    draws = 300

    def tails(
        decoder: SpeculativeDecoder, settings_sampling: SamplingSettings
    ) -> Counter[tuple[int, ...]]:
        counts: Counter[tuple[int, ...]] = Counter()
        for draw in range(draws):
            settings = GenerationSettings(
                max_tokens=3,
                draft_max=2,
                p_min=0.0,
                sampling=SamplingSettings(
                    temperature=settings_sampling.temperature,
                    top_k=settings_sampling.top_k,
                    seed=draw,
                ),
            )
            counts[tuple(decoder.run(prompt, settings).token_ids)] += 1
        return counts

    reference = tails(plain, sampling)
    observed = tails(speculative, sampling)
    hot = tails(draft_only, draft_sampling)

    def two_sample_p(a: Counter[tuple[int, ...]], b: Counter[tuple[int, ...]]) -> float:
        keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
        rest_a = draws - sum(a[k] for k in keys)
        rest_b = draws - sum(b[k] for k in keys)
        table = np.array([[a[k] for k in keys] + [rest_a], [b[k] for k in keys] + [rest_b]])
        table = table[:, table.sum(axis=0) > 0]
        return float(scipy_stats.chi2_contingency(table).pvalue)

    assert two_sample_p(reference, observed) > SIGNIFICANCE
    assert two_sample_p(reference, hot) < SIGNIFICANCE


@pytest.mark.heavy
def test_a_seed_gives_plain_samplings_text_with_sample_match(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    """Sample-match emits one draw of the target's stream per token: drafts cannot change it.

    Rejection sampling's text depends on what was drafted (its draws decide acceptance);
    sample-match's does not, so a seed reproduces plain sampling's answer exactly.
    """
    prompt = SpeculativeDecoder(smollm_target).prompt_tokens(user("Tell me about the sea."))
    draft_sampling = SamplingSettings(temperature=1.3)
    speculative = SpeculativeDecoder(
        smollm_target, DraftModelDrafter(smollm_draft, p_min=0.0, sampling=draft_sampling)
    )
    for seed in (3, 4):
        settings = GenerationSettings(
            max_tokens=40,
            draft_max=4,
            p_min=0.0,
            verification="sample-match",
            sampling=SamplingSettings(temperature=1.0, seed=seed),
        )
        smollm_target.truncate(0)
        plain = SpeculativeDecoder(smollm_target).run(prompt, settings)
        smollm_target.truncate(0)
        smollm_draft.truncate(0)
        result = speculative.run(prompt, settings)
        assert result.stats.accepted_draft_tokens_count > 0
        assert result.token_ids == plain.token_ids, seed
