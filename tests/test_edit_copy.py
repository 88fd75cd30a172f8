"""The edit-copy drafter: following an edited copy token by token, and on a real model."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
import pytest

from backends.errors import SettingsError
from backends.speculation.edit_copy import EditCopyDrafter
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.ngram import NgramSimpleDrafter
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import GenerationSettings, TokenOrigin
from benchmarks.vs_llama_cpp import PROMPTS
from tests.conftest import user

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.llama import LlamaEngine
    from backends.speculation.types import Drafter

GREEDY = SamplingSettings()
RNG = np.random.default_rng(0)

# Word-like token ids for readable sequences.
HEADER = [50, 51, 52]  # "```python\nclass Queue:" — the answer starts by copying it
SELF, OLD, EQ, LIST, NL, APPEND, ARGS, POP = 1, 30, 4, 5, 6, 7, 8, 9
NEW, NEW_A, NEW_B = 40, 41, 42  # the new name: one token, or two
SOURCE = [SELF, OLD, EQ, LIST, NL, SELF, OLD, APPEND, ARGS, NL, SELF, OLD, POP, NL]
PROMPT = [100, *HEADER, *SOURCE, 101, 102]


def test_a_rename_is_learned_at_its_first_use_and_drafted_at_the_next() -> None:
    drafter = EditCopyDrafter()
    context = [*PROMPT, *HEADER]
    # The header matches the prompt: the drafter follows the source from there.
    assert drafter.propose(context, 4) == ([SELF, OLD, EQ, LIST], 3)
    context += [SELF, NEW]  # the answer renames OLD
    # Right after the divergence: a guess that one token was replaced.
    assert drafter.propose(context, 3) == ([EQ, LIST, NL], 0)
    context += [EQ, LIST, NL, SELF]
    proposal, evidence = drafter.propose(context, 4)
    assert drafter.substitutions == {OLD: (NEW,)}
    assert proposal == [NEW, APPEND, ARGS, NL]  # the second use comes renamed
    assert evidence == 4  # EQ, LIST, NL, SELF followed the source
    assert drafter.following


def test_a_name_replaced_by_two_tokens_is_drafted_even_halfway_through() -> None:
    drafter = EditCopyDrafter()
    context = [*PROMPT, *HEADER]
    drafter.propose(context, 3)  # finds the source
    context += [SELF, NEW_A, NEW_B, EQ, LIST, NL, SELF]
    proposal, _ = drafter.propose(context, 3)
    assert drafter.substitutions == {OLD: (NEW_A, NEW_B)}
    assert proposal == [NEW_A, NEW_B, APPEND]
    context.append(NEW_A)  # halfway through the replacement
    assert drafter.propose(context, 3)[0] == [NEW_B, APPEND, ARGS]


def test_the_copy_rejoins_after_an_insertion() -> None:
    define, name, colon, indent, ret, x, quote = 60, 61, 62, 63, 64, 65, 66
    source = [define, name, colon, NL, indent, ret, x, NL]
    prompt = [100, *HEADER, *source, 101]
    drafter = EditCopyDrafter()
    context = [*prompt, *HEADER, define, name, colon, NL, indent]
    assert drafter.propose(context, 2)[0] == [ret, x]
    docstring = [quote, 70, 71, 72, quote, NL, indent]
    for token in docstring:  # one token per round, as when nothing is accepted
        context.append(token)
        drafter.propose(context, 2)
    assert not drafter.following  # inside the insertion
    context.append(ret)  # back to the code: the copy goes on after it
    assert drafter.propose(context, 2)[0] == [x, NL]
    assert drafter.following
    assert drafter.substitutions == {}


def test_a_substitution_the_answer_does_not_follow_is_forgotten() -> None:
    drafter = EditCopyDrafter()
    context = [*PROMPT, *HEADER]
    drafter.propose(context, 2)
    context += [SELF, NEW, EQ, LIST, NL, SELF]
    drafter.propose(context, 2)
    assert drafter.substitutions == {OLD: (NEW,)}
    context.append(OLD)  # the answer keeps the old name here
    assert drafter.propose(context, 2)[0] == [APPEND, ARGS]
    assert drafter.substitutions == {}


def test_a_new_conversation_forgets_the_edit() -> None:
    drafter = EditCopyDrafter()
    drafter.propose([*PROMPT, *HEADER], 2)
    drafter.propose([*PROMPT, *HEADER, SELF, NEW, EQ, LIST, NL, SELF], 2)
    assert drafter.substitutions
    # Not a continuation of what the drafter saw: another chat.
    drafter.propose([*PROMPT[:5], 99, 98], 2)
    assert drafter.substitutions == {}


def test_without_any_earlier_match_it_proposes_nothing() -> None:
    drafter = EditCopyDrafter()
    assert drafter.propose(list(range(200, 260)), 8) == ([], 0)
    assert drafter.propose([1, 2], 8) == ([], 0)
    assert drafter.propose([*PROMPT, *HEADER], 0) == ([], 0)


def test_impossible_edit_copy_settings() -> None:
    with pytest.raises(SettingsError, match="rejoin window"):
        EditCopyDrafter(rejoin_window=0)
    with pytest.raises(SettingsError):
        EditCopyDrafter(min_match=0)


def rounds_to_write(drafter: Drafter, prompt: Sequence[int], answer: Sequence[int]) -> int:
    """Rounds a greedy loop needs for ``answer``: each keeps the matching draft, plus one."""
    context = list(prompt)
    done = rounds = 0
    while done < len(answer):
        proposal = drafter.draft(context, 8, GREEDY, RNG, None).tokens
        accepted = 0
        while (
            accepted < len(proposal)
            and done + accepted < len(answer)
            and proposal[accepted] == answer[done + accepted]
        ):
            accepted += 1
        taken = min(accepted + 1, len(answer) - done)
        context.extend(answer[done : done + taken])
        done += taken
        rounds += 1
    return rounds


def edited(rng: random.Random, source: list[int], renames: dict[int, list[int]]) -> list[int]:
    """``source`` with every renamed token replaced and a few insertions."""
    answer: list[int] = []
    for token in source:
        if rng.random() < 0.03:
            answer.extend(rng.randrange(500, 600) for _ in range(rng.randrange(1, 6)))
        answer.extend(renames.get(token, [token]))
    return answer


@pytest.mark.parametrize("seed", range(5))
def test_renaming_edits_take_far_fewer_rounds_than_prompt_lookup(seed: int) -> None:
    rng = random.Random(seed)
    names = list(range(10, 16))
    source = [rng.choice([*names, *range(20, 60)]) for _ in range(300)]
    renames = {n: [rng.randrange(300, 400) for _ in range(rng.randrange(1, 3))] for n in names}
    prompt = [7, 7, 7, *source, 8, 8]
    answer = edited(rng, source, renames)
    with_edits = rounds_to_write(EditCopyDrafter(), prompt, answer)
    lookup = rounds_to_write(NgramSimpleDrafter(), prompt, answer)
    plain = len(answer)
    # Renamed names make up a seventh of the source: prompt lookup loses its place at each.
    assert with_edits < 0.6 * lookup, (with_edits, lookup, plain)
    assert lookup < plain


def test_an_unedited_copy_is_drafted_as_well_as_prompt_lookup_does() -> None:
    rng = random.Random(7)
    source = [rng.randrange(20, 80) for _ in range(300)]
    prompt = [7, 7, 7, *source, 8, 8]
    answer = [7, 7, 7, *source]
    assert rounds_to_write(EditCopyDrafter(), prompt, answer) <= rounds_to_write(
        NgramSimpleDrafter(), prompt, answer
    )


@pytest.mark.default_pair
def test_a_rename_on_a_real_model_is_lossless_and_takes_fewer_rounds(
    qwen_main: LlamaEngine,
) -> None:
    refactor = next(p for p in PROMPTS if p.key == "refactor")
    settings = GenerationSettings(max_tokens=90)
    plain = SpeculativeDecoder(qwen_main)
    prompt = plain.prompt_tokens(user(refactor.text))
    expected = plain.run(prompt, settings)
    results = {}
    for method in ("edit-copy", "ngram-simple"):
        decoder = build_decoder(method, qwen_main, adaptive=False)
        results[method] = decoder.run(prompt, settings)
        assert results[method].token_ids == expected.token_ids, method
    edit, lookup = results["edit-copy"].stats, results["ngram-simple"].stats
    assert edit.total_draft_tokens_count == (
        edit.accepted_draft_tokens_count
        + edit.rejected_draft_tokens_count
        + edit.ignored_draft_tokens_count
    )
    drafted = sum(t.origin is TokenOrigin.DRAFT for t in results["edit-copy"].tokens)
    # An accepted end-of-generation token counts as accepted but is not emitted.
    unsent = edit.accepted_draft_tokens_count - drafted
    assert unsent == 0 or (unsent == 1 and edit.stop_reason == "eos")
    # The answer renames attributes on nearly every line: prompt lookup loses its place
    # at each, edit copy drafts the new names from their second use on.
    assert edit.rounds < 0.75 * lookup.rounds, (edit.rounds, lookup.rounds)
    assert edit.accepted_draft_tokens_count > lookup.accepted_draft_tokens_count
