"""What to do when a conversation outgrows the context: LM Studio's three policies.

- ``truncate-middle`` (the window's default): keep the system prompt and the first
  exchange (the first user message and its answer), leave out the oldest turns after it;
- ``rolling-window``: keep the system prompt, leave out the oldest turns;
- ``stop``: leave nothing out (an answer that does not fit is a one-line error).

A turn is a user message and what follows it up to the next user message, so what is
kept still alternates as chat templates expect; the last user message (the question being
answered) is always kept. Turns are left out until the prompt leaves room for the answer
(:func:`answer_room`). The speculative loop then runs on the shorter prompt as on any
other: the main model's cache keeps the prefix the two prompts share, and the text is what
plain decoding gives for the same shortened conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from backends.errors import SettingsError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from backends.engines.interface import ChatMessage

ContextPolicy = Literal["truncate-middle", "rolling-window", "stop"]
CONTEXT_POLICIES: tuple[ContextPolicy, ...] = get_args(ContextPolicy)
ANSWER_ROOM_SHARE = 4  # at most a quarter of the context is kept for the answer


@dataclass(frozen=True)
class FittedConversation:
    """The conversation to answer, and which of its messages were left out.

    They are always one run: ``dropped`` messages from index ``first_dropped`` of the
    conversation as given.
    """

    messages: tuple[ChatMessage, ...]
    dropped: int = 0
    first_dropped: int = 0


def parse_policy(text: str) -> ContextPolicy:
    """A policy name from a request or the settings (SettingsError for another)."""
    for policy in CONTEXT_POLICIES:
        if text == policy:
            return policy
    raise SettingsError(
        f"unknown context overflow policy {text!r}; choose one of {', '.join(CONTEXT_POLICIES)}"
    )


def answer_room(max_tokens: int, n_ctx: int) -> int:
    """Tokens kept free for the answer: its maximum, but at most a quarter of the context."""
    return min(max_tokens, n_ctx // ANSWER_ROOM_SHARE)


def fit_conversation(
    messages: Sequence[ChatMessage],
    prompt_length: Callable[[Sequence[ChatMessage]], int],
    limit: int,
    policy: ContextPolicy,
) -> FittedConversation:
    """``messages`` with turns left out by ``policy`` until their prompt is ``limit`` or less.

    ``prompt_length`` counts the tokens of a conversation's prompt. Where even the fewest
    messages the policy keeps are too long, they are returned: the caller's context check
    says so in one line.
    """
    whole = tuple(messages)
    if policy == "stop" or prompt_length(whole) <= limit:
        return FittedConversation(whole)
    system = 0
    while system < len(whole) and whole[system].role == "system":
        system += 1
    starts = [index for index in range(system, len(whole)) if whole[index].role == "user"]
    if len(starts) < 2:
        return FittedConversation(whole)  # one question: nothing to leave out
    # Turns that may be left out, oldest first: not the first one under truncate-middle,
    # never the last (the question being answered).
    first_droppable = 1 if policy == "truncate-middle" else 0
    kept_head = list(whole[: starts[first_droppable]])
    turns = [
        whole[begin:end]
        for begin, end in zip(
            starts[first_droppable:-1], starts[first_droppable + 1 :], strict=True
        )
    ]
    tail = whole[starts[-1] :]
    if policy == "rolling-window":
        kept_head = list(whole[:system])
        turns = [whole[system : starts[0]], *turns] if starts[0] > system else turns
    first_dropped = len(kept_head)
    dropped = 0
    while turns:
        dropped += len(turns.pop(0))
        candidate = (*kept_head, *(m for turn in turns for m in turn), *tail)
        if prompt_length(candidate) <= limit:
            return FittedConversation(candidate, dropped, first_dropped)
    return FittedConversation((*kept_head, *tail), dropped, first_dropped)
