"""Edit-aware copying: draft an edited copy of earlier text, following the edit as it goes.

Edit requests (rename these, add docstrings, add type hints, change one thing) are answered
with the user's text changed here and there. Prompt lookup (``ngram-simple``) copies it
between the changes but loses its place at each one: after a renamed identifier the last
few tokens occur nowhere earlier, so it proposes nothing until enough unchanged tokens have
passed, and at the next use of the renamed name it proposes the old name again.

:class:`EditCopyDrafter` keeps a cursor into the text being copied (its source) and follows
the answer token by token:

- while the answer follows the source, the cursor moves along with it;
- where the answer leaves the source, the drafter looks for where it rejoins: the source
  position right at or after the divergence that the latest answer token continues (one
  token is enough there), or any position a little further on that the last two continue;
- one source token replaced by one to three answer tokens is learned as a substitution
  (``.l`` becomes ``.items``) and applied to every later copy, so a rename is drafted from
  its second use on; a substitution the answer does not follow is forgotten;
- right after a divergence it guesses that one source token was replaced and drafts the
  source from the token after it;
- without a cursor (at the start, after a change it could not follow, or when a longer
  match lies elsewhere) it takes prompt lookup's best match.

Proposals are the source from the cursor with the substitutions applied. Their evidence is
how many tokens in a row the answer has followed the source (or the lookup's match length),
so the planner trusts a long-followed copy more than a fresh guess.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.errors import SettingsError
from backends.speculation.drafters import LookupDrafter
from backends.speculation.ngram import (
    DEFAULT_MAX_MATCH,
    DEFAULT_MIN_MATCH,
    IncrementalIndex,
    NgramSimpleDrafter,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

DEFAULT_REJOIN_WINDOW = 64  # source tokens past a divergence searched for where the answer rejoins
MAX_REPLACEMENT = 3  # answer tokens a learned substitution may put in place of one source token


class EditCopyDrafter(LookupDrafter):
    """Copies earlier text with the answer's edits applied; see the module docstring."""

    name = "edit-copy"

    def __init__(
        self,
        min_match: int = DEFAULT_MIN_MATCH,
        max_match: int = DEFAULT_MAX_MATCH,
        rejoin_window: int = DEFAULT_REJOIN_WINDOW,
    ) -> None:
        super().__init__()
        if rejoin_window < 1:
            raise SettingsError(f"the rejoin window must be >= 1 token, got {rejoin_window}")
        self._lookup = NgramSimpleDrafter(min_match, max_match)
        self.max_match = max_match
        self.rejoin_window = rejoin_window
        self._index = IncrementalIndex()
        # source token -> the answer tokens that replace it in this edit
        self.substitutions: dict[int, tuple[int, ...]] = {}
        self._cursor: int | None = None  # index of the source token the answer follows next
        self._offset = 0  # tokens of that source token's replacement already followed
        self._diverged: tuple[int, int] | None = None  # (source, answer) index where they parted
        self._run = 0  # answer tokens in a row that followed the source
        self._copy_began = 0  # context index where the copy of this source began
        self._followed = 0  # context tokens the alignment has taken in

    @property
    def following(self) -> bool:
        """Whether the answer is following a source right now (not lost, not diverged)."""
        return self._cursor is not None and self._diverged is None

    def _forget(self) -> None:
        self.substitutions.clear()
        self._cursor = None
        self._offset = 0
        self._diverged = None
        self._run = 0
        self._copy_began = 0

    def _replacement(self, token: int) -> tuple[int, ...]:
        return self.substitutions.get(token, (token,))

    # -- following the answer ----------------------------------------------------------

    def _follow(self, tokens: Sequence[int], i: int) -> None:
        """Take in the answer's token ``tokens[i]``: advance, diverge or rejoin."""
        if self._cursor is None:
            return
        if self._diverged is None:
            cursor = self._cursor
            if cursor >= i:
                # The copy caught up with the answer itself: nothing left to follow.
                self._cursor = None
                return
            token = tokens[i]
            source = tokens[cursor]
            wanted = self._replacement(source)
            if token == wanted[self._offset]:
                self._offset += 1
                if self._offset == len(wanted):
                    self._cursor, self._offset = cursor + 1, 0
                self._run += 1
                return
            if self._offset == 0 and token == source:
                # The answer kept this token as it was: the substitution does not hold.
                del self.substitutions[source]
                self._cursor += 1
                self._run += 1
                return
            self._diverged = (cursor, i - self._offset)
            self._offset = 0
            self._run = 0
        self._try_rejoin(tokens, i)

    def _try_rejoin(self, tokens: Sequence[int], i: int) -> None:
        """After a divergence: find where ``tokens[.. i]`` continues the source again."""
        assert self._diverged is not None
        source_at, answer_at = self._diverged
        changed = i + 1 - answer_at  # answer tokens since the divergence, this one included
        token = tokens[i]
        # One token rejoins at the divergence itself (an insertion ended) or one source
        # token later (one token was replaced, or deleted).
        for skipped in (0, 1):
            at = source_at + skipped
            if at < self._copy_began and tokens[at] == token:
                replaced_by = changed - 1
                if skipped == 0 or replaced_by <= MAX_REPLACEMENT:
                    if skipped == 1 and replaced_by >= 1:
                        self.substitutions[tokens[source_at]] = tuple(
                            tokens[answer_at : answer_at + replaced_by]
                        )
                    self._rejoin(at + 1, 1)
                    return
        # Two tokens rejoin anywhere in the window after the divergence (in the source,
        # not in the copy made of it so far).
        if changed >= 2:
            pair = (tokens[i - 1], tokens[i])
            last = min(source_at + self.rejoin_window, self._copy_began - 1)
            for at in range(source_at, last):
                if (tokens[at], tokens[at + 1]) == pair:
                    self._rejoin(at + 2, 2)
                    return
        if changed > self.rejoin_window:
            self._cursor = None  # lost: the lookup finds a new source
            self._diverged = None

    def _rejoin(self, cursor: int, run: int) -> None:
        self._cursor, self._offset, self._diverged, self._run = cursor, 0, None, run

    # -- drafting ------------------------------------------------------------------------

    def _copy(self, cursor: int, offset: int, end: int, max_tokens: int) -> list[int]:
        """The source from ``cursor`` (``offset`` tokens into its replacement), edited."""
        proposal: list[int] = []
        while len(proposal) < max_tokens and cursor < end:
            proposal.extend(self._replacement(self._index.tokens[cursor])[offset:])
            offset = 0
            cursor += 1
        return proposal[:max_tokens]

    def propose(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        """The edited copy that continues the context, and its evidence."""
        start = self._index.update(context)
        if start < self._followed:
            # Not a continuation (a new chat, a regenerated answer): a new edit.
            self._forget()
            self._followed = start
        tokens = self._index.tokens
        for i in range(self._followed, len(tokens)):
            self._follow(tokens, i)
        self._followed = len(tokens)
        if max_tokens <= 0:
            return [], 0
        end, length = self._lookup.best_match(context)
        total = len(tokens)
        if self._diverged is not None:
            source_at, answer_at = self._diverged
            if end < 0 and total - answer_at <= MAX_REPLACEMENT:
                # Guess that one source token was replaced by what came since.
                return self._copy(source_at + 1, 0, total, max_tokens), 0
        elif self._cursor is not None and self._run >= length:
            evidence = min(self._run, self.max_match)
            return self._copy(self._cursor, self._offset, total, max_tokens), evidence
        if end < 0:
            return [], 0
        if self._diverged is None:
            # Lost, or a longer match elsewhere: follow the lookup's source from now on.
            self._rejoin(end, length)
            self._copy_began = total - length
        return self._copy(end, 0, total, max_tokens), length
