"""A chat as a file: Markdown for people, JSON for SpecDeck (and back), no widgets involved.

The JSON keeps everything the history keeps: every message, each answer's tokens as
``[text, origin]`` pairs (``draft``, ``target`` or ``grammar``), its stats (every field of
:class:`SpeculationStats`), how it ended, and ``extra`` (the models and settings it was
generated with, the comparison's figures). :func:`chat_from_json` reads it back; a file
that is not such a chat is a one-line :class:`ChatFileError` naming what is wrong.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, cast, get_args

from backends.errors import SpecDeckError
from backends.service.protocol import stats_from_wire, stats_to_wire
from backends.speculation.types import TokenOrigin
from gui.chat_format import footer_parts
from gui.transcript import MessageRecord, MessageState, TokenSpan

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.interface import Role

FORMAT = "specdeck-chat"
FORMAT_VERSION = 1
ROLES = ("system", "user", "assistant")
STATES: tuple[str, ...] = get_args(MessageState)
ROLE_HEADINGS = {"system": "System", "user": "You", "assistant": "Assistant"}


class ChatFileError(SpecDeckError):
    """A file that cannot be imported as a chat (not JSON, not SpecDeck's, a bad message)."""


def chat_to_markdown(title: str, messages: Sequence[MessageRecord]) -> str:
    """The chat for people: a heading per message, answers as written, their figures."""
    parts = [f"# {title}", ""]
    for record in messages:
        heading = ROLE_HEADINGS[record.role]
        if record.role == "assistant" and record.method:
            heading += f" · {record.method}"
        parts += [f"## {heading}", "", record.content, ""]
        if record.role == "assistant":
            error_text, figures = footer_parts(record.stats, record.state, record.error)
            footer = " · ".join(text for text in (error_text, figures) if text)
            if footer:
                parts += [f"*{footer}*", ""]
    return "\n".join(parts).rstrip("\n") + "\n"


def chat_to_json(title: str, messages: Sequence[MessageRecord]) -> dict[str, Any]:
    """The chat for SpecDeck: every message with its tokens, stats and ``extra``."""
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "title": title,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "messages": [_message_to_json(record) for record in messages],
    }


def _message_to_json(record: MessageRecord) -> dict[str, Any]:
    message: dict[str, Any] = {"role": record.role, "content": record.content}
    if record.role != "assistant":
        return message
    tokens = []
    written = 0
    for span in record.spans:
        tokens.append([record.content[written : written + span.length], span.origin.value])
        written += span.length
    message.update(
        {
            "tokens": tokens,
            "method": record.method,
            "state": record.state,
            "error": record.error,
            "stats": None if record.stats is None else stats_to_wire(record.stats),
            "extra": record.extra,
        }
    )
    return message


def chat_from_json(text: str) -> tuple[str, list[MessageRecord]]:
    """A chat exported by :func:`chat_to_json`: its title and messages."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ChatFileError(f"not a chat file: not JSON ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ChatFileError(f'not a chat file: no "format": "{FORMAT}" in it')
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise ChatFileError(
            f"a chat file of version {version!r}; this SpecDeck reads version {FORMAT_VERSION}"
        )
    title = data.get("title")
    messages = data.get("messages")
    if not isinstance(title, str) or not isinstance(messages, list):
        raise ChatFileError('a chat file needs a "title" text and a "messages" list')
    return title, [_message_from_json(index, raw) for index, raw in enumerate(messages)]


def _message_from_json(index: int, raw: object) -> MessageRecord:
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise ChatFileError(f"{where} is not an object")
    role, content = raw.get("role"), raw.get("content")
    if role not in ROLES or not isinstance(content, str):
        raise ChatFileError(f"{where} needs a role ({', '.join(ROLES)}) and a content text")
    if role != "assistant":
        return MessageRecord(role=cast("Role", role), content=content)
    state = raw.get("state", "complete")
    if state not in STATES:
        raise ChatFileError(f"{where}.state must be one of {', '.join(STATES)}, not {state!r}")
    spans = _spans(where, content, raw.get("tokens", []))
    try:
        stats = None if raw.get("stats") is None else stats_from_wire(raw["stats"])
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise ChatFileError(f"{where}.stats cannot be read: {error}") from None
    extra = raw.get("extra") or {}
    method, error_text = raw.get("method"), raw.get("error")
    if not isinstance(extra, dict) or not isinstance(method, (str, type(None))):
        raise ChatFileError(f'{where}: "extra" must be an object and "method" a text')
    return MessageRecord(
        role="assistant",
        content=content,
        spans=spans,
        stats=stats,
        method=method,
        state=cast("MessageState", state),
        error=error_text if isinstance(error_text, str) else None,
        extra=extra,
    )


def _spans(where: str, content: str, tokens: object) -> tuple[TokenSpan, ...]:
    """The tokens' spans; their texts must make up the content."""
    if not isinstance(tokens, list):
        raise ChatFileError(f"{where}.tokens must be a list of [text, origin]")
    spans: list[TokenSpan] = []
    texts: list[str] = []
    for token in tokens:
        if (
            not isinstance(token, list)
            or len(token) != 2
            or not isinstance(token[0], str)
            or token[1] not in {origin.value for origin in TokenOrigin}
        ):
            raise ChatFileError(f"{where}.tokens: {token!r} is not [text, origin]")
        texts.append(token[0])
        spans.append(TokenSpan(len(token[0]), TokenOrigin(token[1])))
    if tokens and "".join(texts) != content:
        raise ChatFileError(f"{where}: its tokens do not make up its content")
    return tuple(spans)
