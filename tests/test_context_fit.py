"""A conversation that outgrows the context: what each policy leaves out, and the answer after."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from backends.engines.interface import ChatMessage
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.errors import ContextOverflowError, SettingsError
from backends.service.context_fit import (
    ContextPolicy,
    answer_room,
    fit_conversation,
    parse_policy,
)
from backends.service.pair_runs import answer
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.types import GenerationSettings

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

SYSTEM = ChatMessage("system", "sys")


def turns(count: int) -> list[ChatMessage]:
    """``count`` exchanges q0/a0, q1/a1, ... then the question being answered, qN."""
    messages = [SYSTEM]
    for index in range(count):
        messages += [ChatMessage("user", f"q{index}"), ChatMessage("assistant", f"a{index}")]
    return [*messages, ChatMessage("user", f"q{count}")]


def length(messages: Sequence[ChatMessage]) -> int:
    """Each message costs 10 tokens."""
    return 10 * len(messages)


def contents(messages: Sequence[ChatMessage]) -> list[str]:
    return [message.content for message in messages]


def test_truncate_middle_keeps_the_system_prompt_and_first_exchange() -> None:
    fitted = fit_conversation(turns(5), length, 70, "truncate-middle")
    assert contents(fitted.messages) == ["sys", "q0", "a0", "q4", "a4", "q5"]
    assert fitted.dropped == 6  # q1 a1 q2 a2 q3 a3
    assert fitted.first_dropped == 3  # q1, after sys q0 a0


def test_rolling_window_leaves_out_the_oldest_turns() -> None:
    fitted = fit_conversation(turns(5), length, 70, "rolling-window")
    assert contents(fitted.messages) == ["sys", "q3", "a3", "q4", "a4", "q5"]
    assert fitted.dropped == 6
    assert fitted.first_dropped == 1  # q0


def test_what_fits_and_stop_leave_everything() -> None:
    whole = turns(5)
    assert fit_conversation(whole, length, 120, "truncate-middle").messages == tuple(whole)
    stopped = fit_conversation(whole, length, 50, "stop")
    assert (stopped.messages, stopped.dropped) == (tuple(whole), 0)


def test_what_cannot_fit_keeps_the_least_the_policy_allows() -> None:
    fitted = fit_conversation(turns(3), length, 20, "truncate-middle")
    assert contents(fitted.messages) == ["sys", "q0", "a0", "q3"]
    fitted = fit_conversation(turns(3), length, 20, "rolling-window")
    assert contents(fitted.messages) == ["sys", "q3"]
    lone = [SYSTEM, ChatMessage("user", "a long question")]
    assert fit_conversation(lone, length, 5, "rolling-window").messages == tuple(lone)


def test_policy_names_and_the_answers_room() -> None:
    assert parse_policy("rolling-window") == "rolling-window"
    with pytest.raises(SettingsError, match="unknown context overflow policy 'middle'"):
        parse_policy("middle")
    assert answer_room(256, 512) == 128
    assert answer_room(40, 512) == 40


def long_chat(exchanges: int) -> list[ChatMessage]:
    messages = [ChatMessage("system", "You are a helpful assistant.")]
    for index in range(exchanges):
        messages.append(
            ChatMessage("user", f"Tell me fact number {index} about the moon, in detail please.")
        )
        messages.append(
            ChatMessage(
                "assistant",
                f"Fact {index}: the moon is about 384,400 km away, it has no air, its day lasts "
                "about 29.5 Earth days and its surface is covered in dust and craters.",
            )
        )
    messages.append(ChatMessage("user", "Now give me one short summary sentence."))
    return messages


SMALL_CONTEXT = 512


@pytest.fixture(scope="module")
def small_pair(smollm_path: Path) -> Iterator[tuple[LlamaEngine, LlamaEngine]]:
    """SmolLM2 drafting for itself in a context of 512 tokens (so a chat soon outgrows it)."""
    target_settings = LlamaLoadSettings(n_ctx=SMALL_CONTEXT)
    draft_settings = LlamaLoadSettings(n_ctx=SMALL_CONTEXT, draft_weights="stored")
    with (
        LlamaEngine(smollm_path, target_settings) as target,
        LlamaEngine(smollm_path, draft_settings, is_draft=True) as draft,
    ):
        yield target, draft


def test_after_a_drop_the_answer_is_plain_decodings_of_the_shortened_chat(
    small_pair: tuple[LlamaEngine, LlamaEngine],
) -> None:
    """The speculative state stays right: the cache holds the longer chat's prompt first.

    (Rolling window shortens the chat with the same code, tested above without a model.)
    """
    policy: ContextPolicy = "truncate-middle"
    smollm_target, smollm_draft = small_pair
    settings = GenerationSettings(max_tokens=24)
    speculative = build_decoder("draft-model", smollm_target, smollm_draft)
    # A chat that fits is answered first, so the caches hold its prompt.
    answer(speculative, long_chat(3), settings, context_policy=policy)
    n_ctx = smollm_target.n_ctx
    chat = long_chat(12)
    assert len(speculative.prompt_tokens(chat)) > n_ctx  # it outgrew the context
    done = answer(speculative, chat, settings, context_policy=policy)
    result = done.results["speculative"]
    assert result.stats.dropped_messages > 0
    fitted = fit_conversation(
        chat,
        lambda messages: len(speculative.prompt_tokens(messages)),
        n_ctx - answer_room(settings.max_tokens, n_ctx),
        policy,
    )
    assert fitted.dropped == result.stats.dropped_messages
    assert fitted.first_dropped == result.stats.dropped_from == 3
    assert contents(fitted.messages)[0] == "You are a helpful assistant."
    assert fitted.messages[1:3] == tuple(chat[1:3])  # the first exchange stays
    smollm_target.truncate(0)
    plain = SpeculativeDecoder(smollm_target).run(
        SpeculativeDecoder(smollm_target).prompt_tokens(fitted.messages), settings
    )
    assert result.text == plain.text
    with pytest.raises(ContextOverflowError, match="context holds"):
        answer(speculative, chat, settings, context_policy="stop")
