"""The generated text as the loop hands it out: UTF-8 pieces, stop strings, text held back.

Each emitted token's bytes are decoded incrementally (a character may span tokens). Text
that may be the start of a stop string is held back until it is known not to be one; a
complete stop string ends the text where it begins, and neither it nor anything after it
is handed out.
"""

from __future__ import annotations

import codecs
from dataclasses import replace
from typing import TYPE_CHECKING

from backends.speculation.types import EmittedToken

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from backends.speculation.types import TokenOrigin


class _StopStringWatcher:
    """Holds back text that may be the start of a stop string; finds complete ones."""

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self.stop_strings = tuple(stop_strings)
        self._longest = max((len(s) for s in self.stop_strings), default=0)

    def find(self, text: str, search_from: int) -> int | None:
        """Index in ``text`` where the earliest complete stop string starts, if any."""
        if not self.stop_strings:
            return None
        start = max(0, search_from - self._longest + 1)
        hits = [i for s in self.stop_strings if (i := text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        """How much of ``text`` can be released without hiding a stop string's beginning."""
        for cut in range(max(0, len(text) - self._longest + 1), len(text)):
            tail = text[cut:]
            if any(s.startswith(tail) for s in self.stop_strings):
                return cut
        return len(text)


class TextStream:
    """The emitted tokens with their text, released as far as no stop string may begin."""

    def __init__(self, stop_strings: Sequence[str], token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop_watch = _StopStringWatcher(stop_strings)
        self.text = ""  # all generated text so far
        self._released_chars = 0  # how much of ``text`` was handed out
        self._held: list[EmittedToken] = []  # emitted tokens whose text is not released yet

    def add(self, token: int, origin: TokenOrigin) -> bool:
        """Add one emitted token; True where it completed a stop string (the text ends there)."""
        piece = self._decoder.decode(self._token_bytes(token))
        search_from = len(self.text)
        self.text += piece
        self._held.append(EmittedToken(token, piece, origin))
        stop_at = self._stop_watch.find(self.text, search_from)
        if stop_at is None:
            return False
        self._cut_at(stop_at)
        return True

    def _cut_at(self, stop_at: int) -> None:
        """Drop the stop string and everything after it from the held tokens."""
        kept: list[EmittedToken] = []
        position = self._released_chars
        for token in self._held:
            if position >= stop_at:
                break
            room = stop_at - position
            text = token.text if len(token.text) <= room else token.text[:room]
            kept.append(replace(token, text=text))
            position += len(token.text)
        self._held = kept
        self.text = self.text[:stop_at]

    def release(self, *, final: bool) -> tuple[EmittedToken, ...]:
        """Hand out held tokens, keeping back those that may begin a stop string (all: final)."""
        if final:
            tail = self._decoder.decode(b"", final=True)
            if tail and self._held:
                last = self._held[-1]
                self._held[-1] = replace(last, text=last.text + tail)
            everything = tuple(self._held)
            self._held = []
            return everything
        safe_end = self._released_chars + self._stop_watch.safe_length(
            self.text[self._released_chars :]
        )
        released: list[EmittedToken] = []
        position = self._released_chars
        for token in self._held:
            if position + len(token.text) > safe_end:
                break
            released.append(token)
            position += len(token.text)
        self._held = self._held[len(released) :]
        self._released_chars = position
        return tuple(released)
