"""Verification as functions of the target's rows: verdicts, laziness, distributions, formula."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np
import pytest
from scipy import stats as scipy_stats

from backends.errors import SpecDeckError
from backends.service.tuning_prediction import expected_tokens as predicted_tokens
from backends.speculation.estimates import expected_tokens, reach_chances
from backends.speculation.sampling import SamplingSettings, probabilities, sample
from backends.speculation.types import Sibling
from backends.speculation.verification import (
    verify_greedy,
    verify_rejection,
    verify_sample_match,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from backends.engines.interface import LogitRows

VOCAB = 6
SAMPLED = SamplingSettings(temperature=1.0)
DRAWS = 20_000
SIGNIFICANCE = 1e-3


def peaked(token: int) -> LogitRows:
    """A row whose argmax is ``token``."""
    row = np.zeros(VOCAB, dtype=np.float32)
    row[token] = 5.0
    return row


def lazily(rows: Sequence[LogitRows], available: int) -> Iterator[LogitRows]:
    """The rows one by one, failing if more than ``available`` are asked for."""
    for index, row in enumerate(rows):
        if index >= available:
            raise AssertionError("a row after the refused token was evaluated")
        yield row


def test_greedy_accepts_the_argmax_and_gives_a_bonus_token_after_the_whole_draft() -> None:
    rows = [peaked(2), peaked(3), peaked(4)]
    verdict = verify_greedy([2, 3], rows)
    assert (verdict.accepted, verdict.corrected, verdict.bonus) == (2, None, 4)
    assert verdict.target_token == 4
    assert verdict.row is rows[2]
    assert not verdict.sibling_taken


def test_greedy_corrects_the_first_refused_token_and_reads_no_further() -> None:
    rows = [peaked(2), peaked(5), peaked(4)]
    verdict = verify_greedy([2, 3], lazily(rows, available=2))
    assert (verdict.accepted, verdict.corrected, verdict.bonus) == (1, 5, None)
    assert verdict.target_token == 5
    assert verdict.row is rows[1]
    empty = verify_greedy([], [peaked(1)])  # plain decoding: the bonus token alone
    assert (empty.accepted, empty.corrected, empty.bonus) == (0, None, 1)


def test_a_sibling_is_taken_only_where_it_is_the_corrected_token() -> None:
    rows = [peaked(2), peaked(5), peaked(4)]
    taken = verify_greedy([2, 3], rows, Sibling(1, 5), peaked(0))
    assert (taken.accepted, taken.corrected, taken.after_sibling) == (1, 5, 0)
    assert taken.sibling_taken
    for sibling in (Sibling(1, 4), Sibling(0, 5)):
        other = verify_greedy([2, 3], rows, sibling, peaked(0))
        assert (other.accepted, other.corrected, other.after_sibling) == (1, 5, None)
    assert verify_greedy([2, 3], rows, Sibling(1, 5), None).after_sibling is None


def test_rows_that_run_out_are_an_error() -> None:
    with pytest.raises(AssertionError, match="fewer rows"):
        verify_greedy([2, 3], [peaked(2)])


def first_token_counts(draw: Callable[[np.random.Generator], int], seed: int) -> Counter[int]:
    rng = np.random.default_rng(seed)
    return Counter(draw(rng) for _ in range(DRAWS))


def assert_follows(counts: Counter[int], p: np.ndarray) -> None:
    observed = [counts[token] for token in range(VOCAB)]
    expected = [DRAWS * float(p[token]) for token in range(VOCAB)]
    assert scipy_stats.chisquare(observed, expected).pvalue > SIGNIFICANCE


TARGET = np.log(np.array([0.35, 0.25, 0.15, 0.1, 0.1, 0.05], dtype=np.float32))
DRAFT_Q = probabilities(np.log(np.array([0.1, 0.5, 0.1, 0.1, 0.1, 0.1])), SAMPLED)
P = probabilities(TARGET, SAMPLED)


@pytest.mark.parametrize("deterministic", [True, False])
def test_rejection_sampling_emits_the_targets_distribution(deterministic: bool) -> None:
    """The first emitted token (accepted, or corrected in its place) follows p."""

    def draw(rng: np.random.Generator) -> int:
        if deterministic:  # a lookup: a point mass at token 1
            token = 1
            verdict = verify_rejection([token], None, [TARGET, TARGET], SAMPLED, rng)
        else:  # a sampling draft model: its token drawn from q, and q handed over
            token = sample(DRAFT_Q, rng)
            verdict = verify_rejection([token], [DRAFT_Q], [TARGET, TARGET], SAMPLED, rng)
        return token if verdict.accepted else verdict.target_token

    assert_follows(first_token_counts(draw, seed=7), P)


def test_sample_match_emits_the_targets_own_draws() -> None:
    """Every emitted token is the next draw of the target's stream, whatever was drafted."""
    rows = [TARGET, TARGET, TARGET]
    for seed in range(50):
        rng = np.random.default_rng(seed)
        verdict = verify_sample_match([0, 0], rows, SAMPLED, rng)
        own = np.random.default_rng(seed)
        draws = [sample(P, own) for _ in range(verdict.accepted + 1)]
        assert draws[:-1] == [0] * verdict.accepted
        assert draws[-1] == verdict.target_token
        assert (verdict.bonus is None) == (verdict.accepted < 2)


def test_the_expected_tokens_are_written_once_for_the_planner_and_the_tuner() -> None:
    assert reach_chances([0.5, 0.5]) == [1.0, 0.5, 0.25]
    assert expected_tokens(reach_chances([0.5, 0.5])) == [1.0, 1.5, 1.75]
    # A drafter that gives its second token half the time counts it half.
    assert expected_tokens([1.0, 0.5, 0.25], [1.0, 1.0, 0.5]) == [1.0, 1.5, 1.625]
    rates = [0.93, 0.71, 0.66, 0.52]
    assert predicted_tokens(rates, 4) == expected_tokens(reach_chances(rates))[-1]
    assert predicted_tokens(rates[:1], 3) == expected_tokens(reach_chances(rates[:1] * 3))[-1]


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-8])
def test_a_temperature_near_zero_is_all_but_greedy_never_nan(temperature: float) -> None:
    """logits / 5e-324 overflows to inf, and inf - inf is NaN: found by the API's fuzz test,
    where NaN probabilities drew the last token of the vocabulary (one a grammar refused)."""
    logits = np.array([2.0, 7.5, -np.inf, 7.0, -3.0], dtype=np.float32)  # one masked out
    for top_k in (0, 2):
        probs = probabilities(logits, SamplingSettings(temperature=temperature, top_k=top_k))
        assert not np.isnan(probs).any()
        assert probs.argmax() == 1
        assert probs[2] == 0.0
        if temperature < 1e-100:
            assert probs[1] == 1.0
        assert sample(probs, np.random.default_rng(0)) == 1


def test_a_row_with_no_possible_token_is_an_error_not_a_draw() -> None:
    logits = np.full(5, -np.inf, dtype=np.float32)
    with pytest.raises(SpecDeckError, match="no token is possible here"):
        probabilities(logits, SamplingSettings(temperature=0.7))
