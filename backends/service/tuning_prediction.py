"""What theory predicts for a setup the tuner measured, and the sentence that explains it.

From the parts a trial measured (the acceptance at each draft position, what a draft step
costs relative to a main model step, and what verifying k+1 tokens costs from the
planner's calibrated batch costs), :func:`predict_speedup` gives the speedup over plain
decoding that Leviathan et al. 2023 (section 3) predict, the ceiling at 100 % acceptance,
and why: "the draft costs 55 % of a main step here: even at 100 % acceptance it cannot
pay". :class:`backends.service.tuning.SetupTuner` sets it beside each measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from backends.speculation import estimates
from backends.speculation.types import ADDITIVE_STATS, SpeculationStats

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


@dataclass(frozen=True)
class Prediction:
    """What the measured parts predict for a setup, and the sentence that explains it."""

    speedup: float
    tokens_per_round: float
    main_steps_per_round: float  # the round's cost in main model steps (draft + verify)
    draft_step_cost: float  # one drafted token's cost relative to a main model step
    ceiling: float  # the best speedup at 100 % acceptance with these costs
    reason: str  # what the parts are, e.g. "the 0.5B draft costs 52 % of a main step …"

    @property
    def explanation(self) -> str:
        """The reason and the predicted speedup, in one line."""
        return f"{self.reason}: {self.speedup:.2f}× predicted"


def expected_tokens(acceptance: Sequence[float], length: int) -> float:
    """Tokens a round of ``length`` drafted tokens yields: 1 + Σᵢ Πⱼ≤ᵢ αⱼ (Leviathan eq. 1).

    ``acceptance[i]`` is the conditional acceptance at position i (the share of drafts that
    reached it whose token there was kept); positions past the measured ones take the last.
    The formula is the planner's (:func:`backends.speculation.estimates.expected_tokens`).
    """
    rates = (
        acceptance[min(position, len(acceptance) - 1)] if acceptance else 0.0
        for position in range(length)
    )
    return estimates.expected_tokens(estimates.reach_chances(rates))[-1]


def predict_speedup(
    stats: SpeculationStats,
    main_step_seconds: float,
    verify_cost: Callable[[int], float],
    *,
    runs: int = 1,
    draft_name: str = "",
    draft_step_seconds: float | None = None,
    draft_forward_cost: float | None = None,
    draft_used: bool = True,
    device: str = "this machine",
) -> Prediction | None:
    """The speedup over plain decoding that the measured parts of ``stats`` predict.

    ``stats`` may add up several ``runs`` (each begins with one round that reads the
    prompt, not counted). ``main_step_seconds`` is plain decoding's time per token on the
    same prompts; ``verify_cost(n)`` what evaluating n tokens costs in main model steps
    (1.0 for n = 1, from the calibrated batch costs). Per round with k drafted tokens:
    E(k) tokens (:func:`expected_tokens`, from the acceptance at each position); the
    verification passes as they ran cost verify_cost(n) steps for each pass of n rows (one
    pass of k+1 rows a round where ``stats`` does not count them), plus the measured
    drafting time in main model steps.
    ``draft_name`` names the draft model, if the setup has one, and
    ``draft_step_seconds`` is its time per drafted token (else the drafting time per
    drafted token is the step cost c). The ceiling is the best speedup at 100 %
    acceptance: (k+1) / (k·c + verify_cost(k+1)) over k. ``draft_forward_cost`` is the
    draft's calibrated forward pass over the main model's (the bare step, before the
    loop's catching up and sampling). ``draft_used`` False: auto had the draft model and
    never chose it. None when nothing was drafted.
    """
    if stats.total_draft_tokens_count == 0 or main_step_seconds <= 0.0:
        return None
    acceptance = [rate if rate is not None else 0.0 for rate in stats.acceptance_by_position]
    lengths = dict(stats.draft_length_counts)
    lengths[0] = lengths.get(0, 0) - runs  # the prompt's rounds are not decode steps
    rounds = sum(count for count in lengths.values() if count > 0)
    if rounds == 0:
        return None
    per_drafted = stats.draft_seconds / stats.total_draft_tokens_count
    step_cost = (draft_step_seconds or per_drafted) / main_step_seconds
    tokens = 0.0
    steps = stats.draft_seconds / main_step_seconds  # all drafting, as measured
    for length, count in lengths.items():
        if count > 0:
            tokens += count * expected_tokens(acceptance, length)
    if stats.verify_batch_counts:
        # Verification as it ran: a draft checked in chunks pays for the chunks evaluated.
        batches = dict(stats.verify_batch_counts)
        batches[1] = batches.get(1, 0) - runs  # the prompts' passes
    else:
        batches = {length + 1: count for length, count in lengths.items()}
    for rows, count in batches.items():
        if count > 0:
            steps += count * verify_cost(rows)
    speedup = tokens / steps
    ceiling = estimates.speedup_ceiling(verify_cost, step_cost)
    per_round, cost_per_round = tokens / rounds, steps / rounds
    accepted = stats.acceptance_rate or 0.0
    forward = (
        f"its forward pass costs {draft_forward_cost:.0%} of a main step on {device}"
        if draft_forward_cost is not None
        else f"it runs on {device}"
    )
    if draft_name and not draft_used:
        said = (
            f"auto left the {draft_name} draft unused: {forward}; lookups drafted, "
            f"{accepted:.0%} accepted"
        )
    elif draft_name:
        said = (
            f"the {draft_name} draft: {forward}, {step_cost:.0%} per drafted token with "
            "catching up and sampling"
        )
        if ceiling < 1.0:
            said += f"; even at 100 % acceptance it cannot pay here (at most {ceiling:.2f}×)"
            gpu_like = _flat_verify_ceiling(draft_forward_cost)
            if device == "this CPU" and gpu_like is not None and gpu_like > 1.0:
                said += (
                    f"; where checking a batch costs one step, as on a GPU, it could reach "
                    f"{gpu_like:.2f}×"
                )
        elif speedup < 1.0:
            said += f"; it would pay with more accepted than the {accepted:.0%} measured"
        else:
            said += f"; {accepted:.0%} accepted pays for it"
    else:
        said = f"lookups cost next to nothing; {accepted:.0%} of the drafted tokens accepted"
    said += f"; {per_round:.2f} tokens per round for {cost_per_round:.2f} main steps"
    return Prediction(speedup, per_round, cost_per_round, step_cost, ceiling, said)


def _flat_verify_ceiling(forward_cost: float | None) -> float | None:
    """The best speedup at 100 % acceptance if verifying any batch cost one main step."""
    if forward_cost is None:
        return None
    return estimates.speedup_ceiling(lambda rows: 1.0, forward_cost)


def predict_setup(
    runs: Sequence[SpeculationStats],
    plain_runs: Sequence[SpeculationStats],
    verify_cost: Callable[[int], float],
    **parts: Any,
) -> Prediction | None:
    """A setup's prediction over prompts, comparable with its measured speedup.

    Each prompt is predicted against plain decoding's step on that prompt and the
    predictions are averaged as the measurements are (geometric mean); the reason's
    figures come from all prompts together. ``parts`` go to :func:`predict_speedup`.
    """
    pooled = predict_speedup(
        combined_stats(runs), main_step_seconds(plain_runs), verify_cost, runs=len(runs), **parts
    )
    if pooled is None:
        return None
    each = [
        predict_speedup(run, main_step_seconds([plain]), verify_cost, **parts)
        for run, plain in zip(runs, plain_runs, strict=True)
    ]
    speedups = [prediction.speedup if prediction else 1.0 for prediction in each]
    mean = math.exp(sum(math.log(max(value, 1e-9)) for value in speedups) / len(speedups))
    return replace(pooled, speedup=mean)


def combined_stats(runs: Sequence[SpeculationStats]) -> SpeculationStats:
    """Several runs' counts and times added up (the per-position counts position by position)."""
    total = SpeculationStats()
    for stats in runs:
        for name in ADDITIVE_STATS:
            setattr(total, name, getattr(total, name) + getattr(stats, name))
        for mine, theirs in (
            (total.verified_at_position, stats.verified_at_position),
            (total.accepted_at_position, stats.accepted_at_position),
        ):
            mine.extend([0] * (len(theirs) - len(mine)))
            for position, count in enumerate(theirs):
                mine[position] += count
        for mine_by_size, theirs_by_size in (
            (total.draft_length_counts, stats.draft_length_counts),
            (total.verify_batch_counts, stats.verify_batch_counts),
        ):
            for size, count in theirs_by_size.items():
                mine_by_size[size] = mine_by_size.get(size, 0) + count
    return total


def main_step_seconds(runs: Sequence[SpeculationStats]) -> float:
    """Plain decoding's seconds per generated token after the first, over runs."""
    steps = sum(max(0, stats.generated_tokens - 1) for stats in runs)
    return sum(stats.generation_seconds for stats in runs) / steps if steps else 0.0
