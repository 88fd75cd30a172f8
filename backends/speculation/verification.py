"""Verification: what the target makes of a draft, as functions of its logit rows.

The words, used the same way in the loop, the stats and the planner:

- **row** ``j`` (0 ≤ j ≤ k for a draft of k tokens): the target's logits after the context
  and the draft's first ``j`` tokens. Row ``j`` judges draft token ``j`` (0-based); row
  ``k`` comes after the whole draft.
- **accepted tokens**: the longest prefix of the draft the target keeps (it may be empty).
- **corrected token**: where the target refuses a draft token, the token it gives in that
  token's place (its argmax at temperature 0; with rejection sampling a draw from the
  residual distribution; with sample-match its own draw). The round ends there.
- **bonus token**: where every draft token is accepted, the target's own token from row
  ``k``. So a round always gives one token of the target's own, the corrected token or the
  bonus token, after the accepted tokens.
- **sibling**: a draft model's second choice at one position, evaluated beside the chain in
  the same batch (greedy only). Where the corrected token is the sibling, the sibling's row
  gives one more token, the **token after the sibling**.

Each function reads the rows one by one and stops at the first refused token, so a caller
that evaluates the rows lazily, chunk by chunk, never evaluates the chunks after it. Apart
from that and the random draws of the sampled paths, they are pure: the loop does the
accounting and the planner the learning from the :class:`Verdict`.

At temperature 0 a draft token is accepted while it is the target's argmax, so the text is
exactly plain greedy decoding. At temperature > 0, :func:`verify_rejection` is the
modified rejection sampling of Leviathan et al. 2023 (arXiv 2211.17192, Algorithm 1) and
Chen et al. 2023 (arXiv 2302.01318): accept draft token x with probability
min(1, p(x)/q(x)), otherwise draw the corrected token from normalize(max(0, p − q)); the
emitted tokens follow the target's distribution exactly. :func:`verify_sample_match`
samples the target and compares (what llama.cpp's server and mlx-lm do): also lossless,
and every emitted token is one draw of the target's own random stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from backends.speculation.sampling import probabilities, residual_distribution, sample

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from backends.engines.interface import LogitRows
    from backends.speculation.sampling import ProbArray, SamplingSettings
    from backends.speculation.types import Sibling


@dataclass(frozen=True)
class Verdict:
    """What the target made of one draft (the words are defined in the module docstring).

    Exactly one of ``corrected`` and ``bonus`` is set.
    """

    accepted: int  # how many accepted tokens: the draft's first ``accepted``
    corrected: int | None  # the corrected token (None: every draft token was accepted)
    bonus: int | None  # the bonus token (None: a draft token was refused)
    # The row the corrected or bonus token was read from (the planner measures how sure
    # the target was there). Valid until the target's next forward pass.
    row: LogitRows
    after_sibling: int | None = None  # the token after the sibling, where it was taken

    @property
    def target_token(self) -> int:
        """The target's own token of the round: the corrected token or the bonus token."""
        token = self.bonus if self.corrected is None else self.corrected
        assert token is not None
        return token

    @property
    def sibling_taken(self) -> bool:
        """Whether the corrected token was the sibling (whose row then gave one more token)."""
        return self.after_sibling is not None


def _accepted_all(draft: Sequence[int], bonus: int, row: LogitRows) -> Verdict:
    return Verdict(len(draft), None, bonus, row)


def _refused(index: int, corrected: int, row: LogitRows) -> Verdict:
    return Verdict(index, corrected, None, row)


def verify_greedy(
    draft: Sequence[int],
    rows: Iterable[LogitRows],
    sibling: Sibling | None = None,
    sibling_row: LogitRows | None = None,
) -> Verdict:
    """Temperature 0: accept while the draft token is the target's argmax.

    ``rows``: rows 0..k (k = len(draft)). ``sibling_row``: the target's row after the
    context, the draft before ``sibling.index`` and ``sibling.token``, evaluated in the
    same batch (None: no sibling was evaluated).
    """
    for index, row in enumerate(rows):
        best = int(np.argmax(row))
        if index == len(draft):
            return _accepted_all(draft, best, row)
        if best != draft[index]:
            if (
                sibling_row is not None
                and sibling is not None
                and (sibling.index, sibling.token) == (index, best)
            ):
                return Verdict(index, best, None, row, int(np.argmax(sibling_row)))
            return _refused(index, best, row)
    raise AssertionError("the target produced fewer rows than asked for")


def verify_rejection(
    draft: Sequence[int],
    distributions: Sequence[ProbArray] | None,
    rows: Iterable[LogitRows],
    sampling: SamplingSettings,
    rng: np.random.Generator,
) -> Verdict:
    """Temperature > 0, rejection sampling: accept token x with probability min(1, p(x)/q(x)).

    ``distributions``: the draft distribution q of each draft token (None: a deterministic
    draft, a point mass q = 1 at each token, so x is accepted with probability p(x) and the
    residual max(0, p − q) is p without x).
    """
    for index, row in enumerate(rows):
        p = probabilities(row, sampling)
        if index == len(draft):
            return _accepted_all(draft, sample(p, rng), row)
        token = draft[index]
        if distributions is not None:
            q = distributions[index]
            ratio = p[token] / q[token] if q[token] > 0.0 else 0.0
            if rng.random() >= min(1.0, ratio):
                return _refused(index, sample(residual_distribution(p, q), rng), row)
        elif rng.random() >= p[token]:
            residual = p.copy()
            residual[token] = 0.0
            return _refused(index, sample(residual / residual.sum(), rng), row)
    raise AssertionError("the target produced fewer rows than asked for")


def verify_sample_match(
    draft: Sequence[int],
    rows: Iterable[LogitRows],
    sampling: SamplingSettings,
    rng: np.random.Generator,
) -> Verdict:
    """Temperature > 0, sample-match: draw the target's token and accept while it matches."""
    for index, row in enumerate(rows):
        own = sample(probabilities(row, sampling), rng)
        if index == len(draft):
            return _accepted_all(draft, own, row)
        if own != draft[index]:
            return _refused(index, own, row)
    raise AssertionError("the target produced fewer rows than asked for")
