"""The chat's data, apart from any widget: messages, their token origins and their stats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from backends.speculation.types import TokenOrigin

if TYPE_CHECKING:
    from collections.abc import Iterable

    from backends.engines.interface import Role
    from backends.speculation.types import EmittedToken, SpeculationStats

# streaming: being generated (or the app died while it was); interrupted: found streaming
# when the history was reopened; cancelled: stopped by the user; error: the engine failed.
MessageState = Literal["complete", "streaming", "interrupted", "cancelled", "error"]


# In an answer's ``extra``: the ids of the earlier messages its context left out (one run).
LEFT_OUT_KEY = "left_out"


@dataclass(frozen=True)
class TokenSpan:
    """``length`` characters of an answer produced by one token, and who produced it."""

    length: int
    origin: TokenOrigin


@dataclass
class MessageRecord:
    """One message of a conversation as the history keeps it and the chat pane shows it."""

    role: Role
    content: str
    spans: tuple[TokenSpan, ...] = ()  # assistant answers: one span per token, in order
    stats: SpeculationStats | None = None
    method: str | None = None  # how the answer was generated ("auto", "off", ...)
    state: MessageState = "complete"
    error: str | None = None
    message_id: int | None = None
    extra: dict[str, object] = field(default_factory=dict)  # e.g. the comparison's figures
    # Which of its alternatives it is (an edited question, a regenerated answer): its place
    # among them from 1, and how many there are.
    branch: tuple[int, int] = (1, 1)


def spans_from_tokens(tokens: Iterable[EmittedToken]) -> tuple[TokenSpan, ...]:
    """One span per token with text (tokens that are only part of a character are merged on)."""
    spans: list[TokenSpan] = []
    for token in tokens:
        if token.text:
            spans.append(TokenSpan(len(token.text), token.origin))
    return tuple(spans)


# Each origin's code in storage: 0 and 1 as stored before grammars, 2 for the grammar's.
ORIGIN_CODES = {TokenOrigin.TARGET: 0, TokenOrigin.DRAFT: 1, TokenOrigin.GRAMMAR: 2}
ORIGINS_BY_CODE = {code: origin for origin, code in ORIGIN_CODES.items()}


def spans_to_json(spans: Iterable[TokenSpan]) -> list[list[int]]:
    """Compact form for storage: ``[[length, origin code], ...]`` (:data:`ORIGIN_CODES`)."""
    return [[span.length, ORIGIN_CODES[span.origin]] for span in spans]


def spans_from_json(raw: Iterable[list[int]]) -> tuple[TokenSpan, ...]:
    """The inverse of :func:`spans_to_json` (an unknown code reads as the main model's)."""
    return tuple(
        TokenSpan(int(length), ORIGINS_BY_CODE.get(int(code), TokenOrigin.TARGET))
        for length, code in raw
    )
