"""Fault injection for speed: forward passes made slower on purpose, as another CPU would be.

``$SPECDECK_PASS_DELAY`` makes every forward pass of the main model (or the draft, or
both) sleep inside the engine's timed region, so the loop, the planner and every timing
see a slower machine. It is how tests put SpecDeck on a CPU it is not running on (an AVX2
laptop where each row of a batch costs a third of a step) and under neighbours that steal
cycles, on any machine, and check that auto still keeps its promise there.

The value is comma-separated ``key=value`` fields::

    SPECDECK_PASS_DELAY="step=40,row=13,jitter=30,spikes=0.1:120,seed=7,from=0,on=main"

- ``step``: milliseconds added to every pass (one token's);
- ``row``: milliseconds more for each row past the first (a batch of n: ``(n-1)*row``);
- ``jitter``: up to this many milliseconds more, uniformly at random, per pass;
- ``spikes``: ``P:MS``: with probability P a pass takes MS milliseconds more (a stolen
  time slice);
- ``seed``: the random stream's seed (default 0), so a run can be repeated;
- ``from``: the first pass slowed (default 0: every one), counting from the load, so
  that the load's calibration sees one machine and generation another;
- ``on``: ``main`` (default), ``draft`` or ``all``: whose passes are slowed.

A value that does not parse is refused with a one-line SettingsError naming the field.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from typing import Literal

from backends.errors import SettingsError

PASS_DELAY_ENV = "SPECDECK_PASS_DELAY"
PassRole = Literal["main", "draft"]
_ROLES = ("main", "draft", "all")
_FIELDS = ("step", "row", "jitter", "spikes", "seed", "from", "on")
_MS = 1e-3


@dataclass(frozen=True)
class PassDelaySpec:
    """What ``$SPECDECK_PASS_DELAY`` asks for (milliseconds, a probability, a seed)."""

    step_ms: float = 0.0
    row_ms: float = 0.0
    jitter_ms: float = 0.0
    spike_chance: float = 0.0
    spike_ms: float = 0.0
    seed: int = 0
    first_pass: int = 0
    on: str = "main"

    def applies_to(self, role: PassRole) -> bool:
        """Whether the passes of a model in ``role`` are slowed."""
        return self.on in ("all", role)


def parse_pass_delay(text: str) -> PassDelaySpec:
    """``"step=40,row=13"`` as a spec; a one-line SettingsError for anything else."""
    values: dict[str, str] = {}
    for field in (part.strip() for part in text.split(",")):
        if not field:
            continue
        key, equals, value = field.partition("=")
        if not equals or key not in _FIELDS:
            raise SettingsError(
                f"{PASS_DELAY_ENV}: {field!r} is not one of {', '.join(f + '=' for f in _FIELDS)}"
            )
        values[key] = value.strip()
    try:
        spike_chance, spike_ms = 0.0, 0.0
        if "spikes" in values:
            chance, colon, milliseconds = values["spikes"].partition(":")
            if not colon:
                raise ValueError("spikes")
            spike_chance, spike_ms = float(chance), float(milliseconds)
        spec = PassDelaySpec(
            step_ms=float(values.get("step", 0)),
            row_ms=float(values.get("row", 0)),
            jitter_ms=float(values.get("jitter", 0)),
            spike_chance=spike_chance,
            spike_ms=spike_ms,
            seed=int(values.get("seed", 0)),
            first_pass=int(values.get("from", 0)),
            on=values.get("on", "main"),
        )
    except ValueError:
        raise SettingsError(
            f"{PASS_DELAY_ENV}={text!r}: numbers expected (step=MS,row=MS,jitter=MS,"
            "spikes=P:MS,seed=N,from=N)"
        ) from None
    if spec.on not in _ROLES:
        raise SettingsError(f"{PASS_DELAY_ENV}: on={spec.on} is not one of {', '.join(_ROLES)}")
    if min(spec.step_ms, spec.row_ms, spec.jitter_ms, spec.spike_ms, spec.first_pass) < 0:
        raise SettingsError(f"{PASS_DELAY_ENV}={text!r}: delays and from must be >= 0")
    if not 0.0 <= spec.spike_chance <= 1.0:
        raise SettingsError(f"{PASS_DELAY_ENV}: the spike chance must be in [0, 1]")
    return spec


class PassDelay:
    """The delay one engine adds to its passes; one random stream per engine."""

    def __init__(self, spec: PassDelaySpec) -> None:
        self.spec = spec
        self.passes = 0  # passes seen, slowed or not
        self._random = random.Random(spec.seed)

    @classmethod
    def from_environment(cls, role: PassRole) -> PassDelay | None:
        """The delay ``$SPECDECK_PASS_DELAY`` asks of a model in ``role`` (None: none)."""
        text = os.environ.get(PASS_DELAY_ENV, "")
        if not text:
            return None
        spec = parse_pass_delay(text)
        return cls(spec) if spec.applies_to(role) else None

    def seconds(self, rows: int) -> float:
        """The delay of one pass over ``rows`` tokens (draws from the stream)."""
        spec = self.spec
        self.passes += 1
        if self.passes <= spec.first_pass:
            return 0.0
        milliseconds = spec.step_ms + spec.row_ms * max(0, rows - 1)
        if spec.jitter_ms > 0:
            milliseconds += self._random.uniform(0.0, spec.jitter_ms)
        if spec.spike_chance > 0 and self._random.random() < spec.spike_chance:
            milliseconds += spec.spike_ms
        return milliseconds * _MS

    def sleep(self, rows: int) -> None:
        """Wait as long as one pass over ``rows`` tokens is to take more."""
        seconds = self.seconds(rows)
        if seconds > 0:
            time.sleep(seconds)


__all__ = ["PASS_DELAY_ENV", "PassDelay", "PassDelaySpec", "PassRole", "parse_pass_delay"]
