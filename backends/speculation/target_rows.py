"""The target's logit rows for a draft: lazily in chunks, or with a sibling in one batch.

Row ``j`` is the target's prediction after the context and the draft's first ``j`` tokens
(:mod:`backends.speculation.verification` judges them). Each forward pass is recorded as a
:data:`TargetPass` for the loop's stats and the planner's costs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from backends.engines.interface import extend_cache, extend_cache_with_sibling

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from backends.engines.interface import LogitRows, ModelEngine
    from backends.speculation.types import Draft

# One forward pass of the target: (tokens evaluated, logit rows, seconds).
TargetPass = tuple[int, int, float]


def chain_rows(
    target: ModelEngine,
    context: list[int],
    proposed: list[int],
    chunk_limits: Sequence[int | None],
    passes: list[TargetPass],
) -> Iterator[LogitRows]:
    """The target's rows 0..k for ``context + proposed``, evaluated lazily in chunks.

    A chunk is no larger than any of ``chunk_limits`` (None: no limit): at temperature 0
    the engine's exact batch limit, so every row is bitwise what plain one-token-at-a-time
    decoding computes, and the chunk the plan asked for, where checking a draft that breaks
    early costs less that way. A chunk is evaluated only when its first row is asked for,
    so a rejection ends the round before later chunks are evaluated.
    """
    total_rows = len(proposed) + 1
    chunk = total_rows
    for limit in chunk_limits:
        if limit is not None:
            chunk = min(chunk, max(1, limit))
    sequence = context + proposed
    first = 0
    while first < total_rows:
        last = min(total_rows, first + chunk) - 1
        started = time.perf_counter()
        rows, evaluated = extend_cache(
            target, sequence[: len(context) + last], logit_rows=last - first + 1
        )
        passes.append((evaluated, len(rows), time.perf_counter() - started))
        yield from rows
        first = last + 1


def tree_rows(
    target: ModelEngine,
    context: list[int],
    draft: Draft,
    batch_limit: int,
    passes: list[TargetPass],
) -> tuple[LogitRows, LogitRows] | None:
    """The target's rows 0..k for the draft and its sibling's row, in one batch.

    None, with nothing evaluated, where the draft has no sibling or the tree does not fit
    ``batch_limit`` tokens.
    """
    sibling = draft.sibling
    if sibling is None:
        return None
    started = time.perf_counter()
    evaluated = extend_cache_with_sibling(
        target,
        context + draft.tokens,
        len(draft.tokens) + 1,
        len(context) + sibling.index,
        sibling.token,
        batch_limit=batch_limit,
    )
    if evaluated is None:
        return None
    rows, count = evaluated
    passes.append((count + 1, len(rows), time.perf_counter() - started))
    return rows[:-1], rows[-1]
