"""Sampling settings and the logits → probabilities transform shared by the target and the draft."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from backends.errors import SettingsError, SpecDeckError

FloatArray = npt.NDArray[np.float32]
ProbArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SamplingSettings:
    """How tokens are picked from logits; temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 keeps the whole vocabulary
    top_p: float = 1.0  # 1.0 keeps the whole vocabulary
    min_p: float = 0.0  # 0.0 keeps the whole vocabulary
    seed: int | None = None  # None draws a fresh seed

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise SettingsError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SettingsError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise SettingsError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise SettingsError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.seed is not None and self.seed < 0:
            raise SettingsError(f"seed must be >= 0 (none: a fresh one), got {self.seed}")

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax (temperature 0)."""
        return self.temperature == 0.0


def probabilities(logits: FloatArray, settings: SamplingSettings) -> ProbArray:
    """Turn one row of logits into the sampling distribution (temperature, top-k, top-p, min-p).

    The same transform is applied to the target's and the draft's logits, so that the
    rejection sampler compares the distributions the user actually asked for.
    """
    if settings.greedy:
        probs = np.zeros(logits.shape[0], dtype=np.float64)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    scaled = logits.astype(np.float64)
    top = float(scaled.max())
    if not np.isfinite(top):
        raise SpecDeckError("no token is possible here: every logit is -inf or not a number")
    # Shifted before the division: at a temperature near 0 (5e-324 is a float) the division
    # overflows to inf for every positive logit, and inf - inf would make NaN probabilities.
    with np.errstate(over="ignore"):  # to -inf, as it should: exp(-inf) is 0
        scaled = (scaled - top) / settings.temperature
    if 0 < settings.top_k < scaled.shape[0]:
        # Everything below the k-th largest logit is cut.
        kth = np.partition(scaled, -settings.top_k)[-settings.top_k]
        scaled[scaled < kth] = -np.inf
    probs = np.exp(scaled)
    probs /= probs.sum()
    if settings.min_p > 0.0:
        probs[probs < settings.min_p * probs.max()] = 0.0
        probs /= probs.sum()
    if settings.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        keep = int(np.searchsorted(cumulative, settings.top_p, side="left")) + 1
        probs[order[keep:]] = 0.0
        probs /= probs.sum()
    return probs


def sample(probs: ProbArray, rng: np.random.Generator) -> int:
    """Draw one token id from a probability vector (inverse-CDF, no copy of the vocabulary)."""
    cumulative = np.cumsum(probs)
    target = rng.random() * cumulative[-1]
    index = int(np.searchsorted(cumulative, target, side="right"))
    return min(index, int(probs.shape[0]) - 1)


def top_probability(logits: FloatArray, settings: SamplingSettings) -> float:
    """The probability of the most likely token (for the draft's p-min cut-off).

    At temperature 0 this is the plain softmax maximum, so p-min still measures how sure
    the draft is even though it picks by argmax.
    """
    if settings.greedy:
        # float32 is plenty for a threshold test and halves the work on a big vocabulary.
        return float(1.0 / np.exp(logits - logits.max()).sum(dtype=np.float64))
    return float(probabilities(logits, settings).max())


def residual_distribution(target: ProbArray, draft: ProbArray) -> ProbArray:
    """normalize(max(0, p − q)): where to sample after a rejected draft token."""
    residual = np.maximum(target - draft, 0.0)
    mass = residual.sum()
    if mass <= 0.0:
        # p == q exactly: a rejection cannot happen then, but stay safe against rounding.
        return target
    normalized: ProbArray = residual / mass
    return normalized
