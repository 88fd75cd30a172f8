"""The draft-free n-gram drafters: lookups against a brute-force reference, and on a real model."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
import pytest

from backends.errors import SettingsError
from backends.service.suite_prompts import SUITE_PROMPTS
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.ngram import NgramModDrafter, NgramSimpleDrafter
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import GenerationSettings, TokenOrigin
from tests.conftest import user

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.llama import LlamaEngine

GREEDY = SamplingSettings()
RNG = np.random.default_rng(0)


def reference_lookup(
    tokens: Sequence[int], min_match: int, max_match: int, max_tokens: int
) -> tuple[list[int], int]:
    """Brute force: the earlier occurrence of the tail with the longest match, newest on ties."""
    total = len(tokens)
    best_end, best_length = -1, 0
    for end in range(total - 1, min_match - 1, -1):
        length = 0
        while (
            length < max_match
            and end - length - 1 >= 0
            and tokens[end - length - 1] == tokens[total - length - 1]
        ):
            length += 1
        if length >= min_match and length > best_length:
            best_end, best_length = end, length
    if best_end < 0:
        return [], 0
    return list(tokens[best_end : best_end + max_tokens]), best_length


def test_simple_lookup_copies_what_followed_the_best_match() -> None:
    drafter = NgramSimpleDrafter(min_match=2, max_match=8)
    #          0  1  2  3  4  5  6  7  8  9 10 11
    context = [5, 1, 2, 3, 9, 9, 7, 1, 2, 3, 4, 1, 2, 3]
    # The tail [1, 2, 3] occurs at 1..3 (preceded by 5) and at 7..9 (preceded by 7);
    # neither extends further back than the tail's own [4, 1, 2, 3], so both match 3 and
    # the newer one wins: what followed it is [4, 1, 2, 3].
    draft = drafter.draft(context, 3, GREEDY, RNG, None)
    assert draft.tokens == [4, 1, 2]
    assert draft.evidence == 3
    assert draft.distributions is None


def test_simple_lookup_prefers_the_longer_match() -> None:
    drafter = NgramSimpleDrafter(min_match=2, max_match=8)
    context = [8, 1, 2, 6, 6, 4, 8, 1, 2, 7, 7, 3, 1, 2]
    # Tail [1, 2]: at 1..2 preceded by 8, at 7..8 preceded by 8 too, but the tail is
    # preceded by 3, so both match length 2 -> newest (7..8) -> [7, 7, 3].
    assert drafter.draft(context, 3, GREEDY, RNG, None).tokens == [7, 7, 3]
    context = [*context, 9, 4, 8, 1, 2]
    # Now the tail is [4, 8, 1, 2]: the occurrence at 5..8 matches 4 tokens.
    draft = drafter.draft(context, 2, GREEDY, RNG, None)
    assert draft.tokens == [7, 7]
    assert draft.evidence == 4


def test_simple_lookup_without_a_match_proposes_nothing() -> None:
    drafter = NgramSimpleDrafter()
    assert drafter.draft(list(range(50)), 8, GREEDY, RNG, None).tokens == []
    assert drafter.draft([1, 2], 8, GREEDY, RNG, None).tokens == []


@pytest.mark.parametrize("seed", range(6))
def test_simple_lookup_matches_brute_force_while_growing_and_after_resets(seed: int) -> None:
    rng = random.Random(seed)
    drafter = NgramSimpleDrafter(min_match=3, max_match=12)
    context: list[int] = []
    for step in range(400):
        if step % 97 == 96:
            # A new chat: keep a shared prefix, replace the rest.
            context = context[: rng.randrange(len(context) + 1)]
        context.extend(rng.choice([[1, 2, 3], [rng.randrange(6)], [4, 5, 1, 2]]))
        got = drafter.propose(context, 6)
        assert got == reference_lookup(context, 3, 12, 6), (seed, step)


def test_mod_table_chains_and_remembers_across_chats() -> None:
    drafter = NgramModDrafter(order=2)
    first_chat = [10, 11, 12, 13, 14, 15, 10, 11]
    draft = drafter.draft(first_chat, 4, GREEDY, RNG, None)
    assert draft.tokens == [12, 13, 14, 15]
    # A different conversation: the table still knows what follows [12, 13].
    second_chat = [99, 98, 12, 13]
    assert drafter.draft(second_chat, 3, GREEDY, RNG, None).tokens == [14, 15, 10]


def test_mod_table_uses_the_latest_continuation_and_counts_repeats() -> None:
    drafter = NgramModDrafter(order=1)
    assert drafter.propose([1, 2, 1, 3, 1], 1) == ([3], 0)  # 1 -> 3 replaced 1 -> 2
    proposal, evidence = drafter.propose([1, 2, 1, 3, 1, 3, 1], 2)
    assert proposal == [3, 1]
    assert evidence == 2  # both links were seen more than once


def test_mod_table_capacity_drops_the_oldest() -> None:
    drafter = NgramModDrafter(order=1, capacity=3)
    drafter.propose([1, 2, 3, 4, 5, 6], 1)
    assert drafter.propose([1], 1) == ([], 0)  # 1 -> 2 was evicted
    assert drafter.propose([4], 1)[0] == [5]


@pytest.mark.parametrize(
    "make",
    [
        lambda: NgramSimpleDrafter(min_match=0),
        lambda: NgramSimpleDrafter(min_match=4, max_match=3),
        lambda: NgramModDrafter(order=0),
        lambda: NgramModDrafter(capacity=0),
    ],
)
def test_impossible_ngram_settings(make: object) -> None:
    with pytest.raises(SettingsError):
        make()  # type: ignore[operator]


@pytest.mark.heavy
def test_lookup_drafts_a_rewrite_losslessly_on_a_real_model(smollm_target: LlamaEngine) -> None:
    rewrite = next(p for p in SUITE_PROMPTS if p.key == "type-hints")
    plain = SpeculativeDecoder(smollm_target)
    prompt = plain.prompt_tokens(user(rewrite.text))
    settings = GenerationSettings(max_tokens=120, lookup_draft_max=12)
    smollm_target.truncate(0)
    expected = plain.run(prompt, settings)
    for drafter in (NgramSimpleDrafter(), NgramModDrafter()):
        smollm_target.truncate(0)
        result = SpeculativeDecoder(smollm_target, drafter).run(prompt, settings)
        assert result.token_ids == expected.token_ids, drafter.name
        stats = result.stats
        assert stats.accepted_draft_tokens_count > 0, drafter.name
        drafted = sum(t.origin == TokenOrigin.DRAFT for t in result.tokens)
        assert drafted == stats.accepted_draft_tokens_count
        assert stats.rounds_by_method.get(drafter.name, 0) > 0
        assert max(stats.draft_length_counts) <= 12
