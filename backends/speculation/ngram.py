"""Draft-free drafters: propose the next tokens by looking them up in text already seen.

Two behaviours, after llama.cpp's speculative types of the same names:

- ``ngram-simple`` (:class:`NgramSimpleDrafter`, "prompt lookup"): find the most recent
  earlier place in the prompt and the answer so far where the last few tokens occurred,
  and propose what followed them there. Rewrites, edits and quotes of the prompt copy
  long runs, and this drafts them for free.
- ``ngram-mod`` (:class:`NgramModDrafter`): a bounded table from each n-gram seen to the
  token that followed it last, kept across generations (llama.cpp shares its pool across
  requests), drafting by chaining lookups.

Both index incrementally: each round only the new tokens are added, so a lookup costs
microseconds next to a forward pass. Each proposal carries ``evidence``, the length of the
match it came from; the planner keeps acceptance statistics per evidence level, because
a 20-token match predicts far better than a 3-token one.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from backends.errors import SettingsError
from backends.speculation.drafters import LookupDrafter

if TYPE_CHECKING:
    from collections.abc import Sequence


DEFAULT_MIN_MATCH = 3  # tokens that must match before a lookup is trusted at all
DEFAULT_MAX_MATCH = 32  # how far back a match is measured (its evidence)
DEFAULT_MOD_ORDER = 4  # n of ngram-mod's n-grams
DEFAULT_MOD_CAPACITY = 1 << 18  # entries kept by ngram-mod (oldest dropped first)


class IncrementalIndex:
    """Follows a growing token sequence; tells which tokens are new since the last call."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def update(self, context: Sequence[int]) -> int:
        """Adopt ``context``; return the index of the first token not seen before.

        When ``context`` does not extend what was seen (a new chat, a regenerated answer),
        the return value is where the two part, and the caller forgets what lies after.
        """
        seen = self.tokens
        if len(context) >= len(seen) and list(context[: len(seen)]) == seen:
            start = len(seen)
        else:
            start = 0
            limit = min(len(seen), len(context))
            while start < limit and seen[start] == context[start]:
                start += 1
            del seen[start:]
        seen.extend(context[start:])
        return start


class NgramSimpleDrafter(LookupDrafter):
    """Prompt lookup: copy what followed the latest earlier occurrence of the context's tail.

    Every position is indexed by the ``min_match`` tokens ending there. A lookup takes the
    candidates for the current tail and keeps the one whose match extends furthest back
    (up to ``max_match`` tokens), the most recent on ties; it proposes up to
    ``max_tokens`` of the tokens that followed it.
    """

    name = "ngram-simple"

    def __init__(
        self, min_match: int = DEFAULT_MIN_MATCH, max_match: int = DEFAULT_MAX_MATCH
    ) -> None:
        super().__init__()
        if min_match < 1 or max_match < min_match:
            raise SettingsError(
                f"n-gram match lengths must satisfy 1 <= min ({min_match}) <= max ({max_match})"
            )
        self.min_match = min_match
        self.max_match = max_match
        self._index = IncrementalIndex()
        # n-gram -> end positions (exclusive) of its occurrences, oldest first
        self._positions: dict[tuple[int, ...], list[int]] = {}
        self._indexed_end = 0  # n-grams ending at positions <= this are indexed

    def _index_new_tokens(self, start: int) -> None:
        """Index the n-grams ending after ``start``, forgetting any that ended past it."""
        if start < self._indexed_end:
            # The sequence changed (a new chat, a regenerated answer): drop what no longer is.
            for key in [k for k, ends in self._positions.items() if ends[-1] > start]:
                kept = [end for end in self._positions[key] if end <= start]
                if kept:
                    self._positions[key] = kept
                else:
                    del self._positions[key]
            self._indexed_end = start
        tokens = self._index.tokens
        n = self.min_match
        for end in range(max(self._indexed_end + 1, n), len(tokens) + 1):
            self._positions.setdefault(tuple(tokens[end - n : end]), []).append(end)
        self._indexed_end = len(tokens)

    def propose(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        """The proposed continuation and its evidence (matched length, 0 when none)."""
        if max_tokens <= 0:
            return [], 0
        best_end, best_length = self.best_match(context)
        if best_end < 0:
            return [], 0
        return self._index.tokens[best_end : best_end + max_tokens], best_length

    def best_match(self, context: Sequence[int]) -> tuple[int, int]:
        """(end, length) of the best earlier match of the context's tail; (-1, 0) if none.

        ``end`` is the index in ``context`` just after the earlier occurrence: the token
        there is the first one a lookup proposes.
        """
        self._index_new_tokens(self._index.update(context))
        tokens = self._index.tokens
        n = self.min_match
        if len(tokens) <= n:
            return -1, 0
        ends = self._positions.get(tuple(tokens[-n:]))
        if not ends:
            return -1, 0
        total = len(tokens)
        best_end, best_length = -1, 0
        # Newest first; the last entry is the tail itself.
        for end in reversed(ends):
            if end >= total:
                continue
            length = n
            while (
                length < self.max_match
                and end - length - 1 >= 0
                and tokens[end - length - 1] == tokens[total - length - 1]
            ):
                length += 1
            if length > best_length:
                best_end, best_length = end, length
                if length >= self.max_match:
                    break
        return best_end, best_length


class NgramModDrafter(LookupDrafter):
    """A bounded n-gram → next-token table over everything seen, chained to draft.

    Unlike prompt lookup it remembers across generations (the same app session), so an
    answer that repeats an earlier answer's code drafts well even in a new chat. The
    evidence of a proposal is how many of its tokens came from n-grams seen more than once.
    """

    name = "ngram-mod"

    def __init__(
        self, order: int = DEFAULT_MOD_ORDER, capacity: int = DEFAULT_MOD_CAPACITY
    ) -> None:
        super().__init__()
        if order < 1:
            raise SettingsError(f"n-gram order must be >= 1, got {order}")
        if capacity < 1:
            raise SettingsError(f"n-gram table capacity must be >= 1, got {capacity}")
        self.order = order
        self.capacity = capacity
        self._index = IncrementalIndex()
        # n-gram -> (next token, times this continuation was seen in a row)
        self._table: OrderedDict[tuple[int, ...], tuple[int, int]] = OrderedDict()

    def _learn(self, tokens: Sequence[int], start: int) -> None:
        n = self.order
        table = self._table
        for end in range(max(start, n), len(tokens)):
            key = tuple(tokens[end - n : end])
            following = tokens[end]
            previous = table.get(key)
            if previous is not None:
                count = previous[1] + 1 if previous[0] == following else 1
                table.move_to_end(key)
            else:
                count = 1
            table[key] = (following, count)
        while len(table) > self.capacity:
            table.popitem(last=False)

    def propose(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        """Chain lookups from the context's tail; return the proposal and its evidence."""
        start = self._index.update(context)
        tokens = self._index.tokens
        # The table keeps what it learned even when the sequence changes (new chat):
        # only new tokens are added.
        self._learn(tokens, max(0, start - self.order))
        n = self.order
        if max_tokens <= 0 or len(tokens) < n:
            return [], 0
        window = list(tokens[-n:])
        proposal: list[int] = []
        evidence = 0
        while len(proposal) < max_tokens:
            entry = self._table.get(tuple(window))
            if entry is None:
                break
            following, count = entry
            proposal.append(following)
            if count > 1:
                evidence += 1
            window = [*window[1:], following]
        return proposal, evidence
