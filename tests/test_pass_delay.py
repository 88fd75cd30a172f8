"""Fault injection for speed: $SPECDECK_PASS_DELAY slows real passes, and auto keeps its promise.

The noise test puts the small model on a slower, noisier machine than this one (every pass
at least 20 ms, each extra row of a batch 7 ms, as an AVX2 CPU's rows cost about a third
of a step, plus jitter and stolen slices) and checks that auto, which measures its rounds'
earnings against plain decoding's pace (backends/speculation/earnings.py), ends no slower
than plain decoding measured under the same noise. The injected delays outweigh the
model's own compute several times over, so the comparison is the noise's, not this
machine's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.pass_delay import PASS_DELAY_ENV, PassDelay, parse_pass_delay
from backends.errors import SettingsError
from backends.speculation.drafters import LookupDrafter
from backends.speculation.earnings import EarningsWatch
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.types import GenerationSettings
from tests.conftest import user

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from backends.speculation.types import Drafter

# An AVX2 laptop's shape with neighbours: rows a third of a step, jitter, stolen slices.
NOISY_AVX2 = "step=20,row=7,jitter=6,spikes=0.05:40,seed=3"
NEVER_SLOWER = 0.97  # auto's speed over plain's, at the least (the goal)


def test_the_fields_parse_and_the_delay_is_step_rows_jitter_and_spikes() -> None:
    spec = parse_pass_delay("step=10, row=2,jitter=0,spikes=1:5,seed=4,from=2,on=all")
    assert (spec.step_ms, spec.row_ms, spec.spike_chance, spec.spike_ms) == (10, 2, 1, 5)
    assert (spec.seed, spec.first_pass, spec.on) == (4, 2, "all")
    assert spec.applies_to("main")
    assert spec.applies_to("draft")
    delay = PassDelay(spec)
    assert [delay.seconds(4), delay.seconds(4)] == [0.0, 0.0]  # the first two passes: none
    assert delay.seconds(4) == pytest.approx((10 + 3 * 2 + 5) / 1000)
    jittered = PassDelay(parse_pass_delay("step=5,jitter=10,seed=1"))
    again = PassDelay(parse_pass_delay("step=5,jitter=10,seed=1"))
    draws = [jittered.seconds(1) for _ in range(50)]
    assert all(0.005 <= seconds <= 0.015 for seconds in draws)
    assert len(set(draws)) > 40  # random ...
    assert draws == [again.seconds(1) for _ in range(50)]  # ... and repeatable by its seed
    assert not parse_pass_delay("step=1").applies_to("draft")  # the main model by default


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("stepp=3", "'stepp=3' is not one of"),
        ("step=fast", "numbers expected"),
        ("spikes=0.5", "numbers expected"),
        ("step=-1", "must be >= 0"),
        ("spikes=2:10", "spike chance"),
        ("on=gpu", "on=gpu is not one of"),
    ],
)
def test_a_bad_value_is_one_line_naming_what_is_wrong(value: str, named: str) -> None:
    with pytest.raises(SettingsError, match=named) as caught:
        parse_pass_delay(value)
    assert PASS_DELAY_ENV in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_real_engine_is_slowed_where_it_is_asked_and_refuses_a_bad_value(
    smollm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = LlamaLoadSettings(n_ctx=256, probe_exact_batch=False)
    monkeypatch.setenv(PASS_DELAY_ENV, "step=40,row=10")
    with (
        LlamaEngine(smollm_path, settings) as main,
        LlamaEngine(smollm_path, settings, is_draft=True) as draft,
    ):
        tokens = main.tokenize("Hello there, world", add_special=False, parse_special=False)
        spent = {}
        for role, engine in (("main", main), ("draft", draft)):
            engine.evaluate(tokens[:4], 1)  # warmed up: a context's first pass allocates
            engine.truncate(0)
            before = engine.decode_seconds
            engine.evaluate(tokens[:3], 1)  # 3 rows: a step and 2 rows more
            engine.evaluate(tokens[3:4], 1)  # a step
            spent[role] = engine.decode_seconds - before
        assert spent["main"] >= (40 + 2 * 10 + 40) / 1000
        assert spent["draft"] < 0.04  # on=main (the default) spares the draft
    monkeypatch.setenv(PASS_DELAY_ENV, "step=soon")
    with pytest.raises(SettingsError, match="numbers expected"):
        LlamaEngine(smollm_path, settings)


@pytest.mark.heavy
def test_under_injected_noise_auto_is_never_slower_than_plain(
    smollm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASS_DELAY_ENV, NOISY_AVX2)
    settings = LlamaLoadSettings(n_ctx=1024)
    with (
        LlamaEngine(smollm_path, settings) as main,
        LlamaEngine(smollm_path, settings, is_draft=True) as draft,
    ):
        plain = SpeculativeDecoder(main)
        auto = build_decoder("auto", main, draft)
        auto.prepare()  # calibrated under the noise, as a load on that machine would be
        prompt = plain.prompt_tokens(user("Write a short story about a robot who learns to paint."))
        generation = GenerationSettings(max_tokens=96)
        seconds = {"plain": 0.0, "auto": 0.0}
        tokens = {"plain": 0, "auto": 0}
        texts = {}
        for _ in range(2):  # interleaved, so that the machine's own noise hits both alike
            for name, decoder in (("plain", plain), ("auto", auto)):
                main.truncate(0)
                draft.truncate(0)
                result = decoder.run(prompt, generation)
                seconds[name] += result.stats.generation_seconds
                tokens[name] += result.stats.generated_tokens - 1
                texts[name] = result.token_ids
        assert texts["auto"] == texts["plain"]
        ratio = (tokens["auto"] / seconds["auto"]) / (tokens["plain"] / seconds["plain"])
        assert ratio >= NEVER_SLOWER, f"auto ran at {ratio:.3f}x plain under {NOISY_AVX2}"


class NeverBenching(EarningsWatch):
    """Plain's pace measured, the loss bound kept, but no drafter ever sent to sit out."""

    def benched(self, drafter: Drafter, evidence: int = 0) -> bool:
        return False

    def proven(self, drafter: Drafter) -> bool:
        return True


class Unbounded(NeverBenching):
    """As :class:`NeverBenching`, without the loss bound."""

    def headroom(self, horizon: int, plain_seconds: float) -> float | None:
        return None


class SureButWrong(LookupDrafter):
    """A lookup that claims a long match every round and is never right."""

    name = "sure but wrong"

    def propose(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        """Eight copies of a token the answer never has, on a match of 16."""
        return [NEVER_SAID] * min(8, max_tokens), 16


# Auto's speed over plain's at the least where only the bound holds it: the allowance
# (1.5 %), the loop's own time and the noise of four 2.7 s runs on a 2-core machine
# (CI saw 0.94; the unbounded run is near 0.4).
BOUNDED_LOSS = 0.9
# A stretch of a slow machine can sink one measurement: on an Intel Xeon (2 cores) the
# whole test once took 110 s instead of 48 s, and bounded auto measured 0.66-0.72x. Run
# unbounded, auto measures 0.30-0.45x, so a bound that does not hold fails every attempt.
BOUNDED_ATTEMPTS = 3
NEVER_SAID = 0  # SmolLM2's <|endoftext|>: never emitted, the answer ends on <|im_end|>


def _auto_against_plain(
    main: LlamaEngine, watch: EarningsWatch, monkeypatch: pytest.MonkeyPatch
) -> tuple[float, int]:
    """Auto with :class:`SureButWrong` and ``watch`` against plain: (speed ratio, drafted).

    Plain, auto, auto, plain: a drift of the machine over the four cancels. The planner
    keeps expecting the lookup's proposals to be kept (its acceptance is frozen at the
    prior of a long match).
    """
    plain = SpeculativeDecoder(main)
    prompt = plain.prompt_tokens(user("Write a short story about a robot who learns to paint."))
    generation = GenerationSettings(max_tokens=96)
    auto = SpeculativeDecoder(main, [SureButWrong()], adaptive=True)
    auto.prepare()
    planner = auto.planner
    assert planner is not None
    planner.watch = watch
    monkeypatch.setattr(planner, "_learn_acceptance", lambda *_: None)
    monkeypatch.setattr(planner, "_score_shadows", lambda *_: None)
    seconds = {"plain": 0.0, "auto": 0.0}
    tokens = {"plain": 0, "auto": 0}
    texts, drafted = {}, 0
    for name, decoder in (("plain", plain), ("auto", auto), ("auto", auto), ("plain", plain)):
        main.truncate(0)
        result = decoder.run(prompt, generation)
        seconds[name] += result.stats.generation_seconds
        tokens[name] += result.stats.generated_tokens - 1
        texts[name] = result.token_ids
        if name == "auto":
            drafted += result.stats.total_draft_tokens_count
    assert texts["auto"] == texts["plain"]
    assert NEVER_SAID not in texts["plain"]
    return (tokens["auto"] / seconds["auto"]) / (tokens["plain"] / seconds["plain"]), drafted


@pytest.mark.heavy
def test_the_loss_bound_holds_auto_near_plain_where_its_estimates_promise_too_much(
    smollm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drafter the planner believes (its estimates frozen) and the rounds refute, always.

    Rows cost a third of a step (an AVX2 CPU's shape), calibrated as they are, and no
    drafter is ever sent to sit out, so nothing but the loss bound stands between auto and
    a loss every round. Without it auto is far slower than plain decoding; with it,
    speculation is tried only while its allowance lasts (a few refused drafts an answer,
    where unbounded it drafts every round).
    """
    monkeypatch.setenv(PASS_DELAY_ENV, "step=20,row=10")
    bounded: list[tuple[float, int]] = []
    with LlamaEngine(smollm_path, LlamaLoadSettings(n_ctx=1024)) as main:
        while len(bounded) < BOUNDED_ATTEMPTS and (not bounded or bounded[-1][0] < BOUNDED_LOSS):
            bounded.append(_auto_against_plain(main, NeverBenching(), monkeypatch))
        unbounded, drafted_unbounded = _auto_against_plain(main, Unbounded(), monkeypatch)
    assert unbounded < 0.8, unbounded  # what believing the estimates costs
    speed, drafted_bounded = bounded[-1]
    assert speed >= BOUNDED_LOSS, (bounded, unbounded)
    assert drafted_bounded * 10 < drafted_unbounded, (drafted_bounded, drafted_unbounded)


class FirstPlainRoundSlowed(NeverBenching):
    """As :class:`NeverBenching`, its first plain round five times as long: a stolen slice.

    On a 2-core machine with a busy neighbour, single steps of 15 ms took 128-171 ms now and
    then; when the first plain round of a load was one of them, plain's pace stood at 178 ms
    for 64 rounds and every refused draft was credited as a win (587 tokens drafted, auto
    at 0.50x plain, under injected spikes).
    """

    def __init__(self) -> None:
        super().__init__()
        self.slowed = False

    def observe(
        self,
        drafter: Drafter | None,
        tokens: int,
        seconds: float,
        plain_estimate: float | None = None,
    ) -> None:
        if drafter is None and not self.slowed:
            seconds, self.slowed = 5 * seconds, True
        super().observe(drafter, tokens, seconds, plain_estimate)


@pytest.mark.heavy
def test_one_slow_plain_round_does_not_open_the_loss_bound(
    smollm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain's pace settles on several plain rounds, and the balance is re-priced at it."""
    monkeypatch.setenv(PASS_DELAY_ENV, "step=20,row=10")
    # As above, a slow stretch of the machine may sink one measurement (0.89x once in a
    # full run on the EPYC Zen 4, 2 cores): measured again, up to BOUNDED_ATTEMPTS times.
    ratio = 0.0
    with LlamaEngine(smollm_path, LlamaLoadSettings(n_ctx=1024)) as main:
        for _ in range(BOUNDED_ATTEMPTS):
            watch = FirstPlainRoundSlowed()
            ratio, drafted = _auto_against_plain(main, watch, monkeypatch)
            if ratio >= BOUNDED_LOSS:
                break
        pace = watch.plain_seconds()
    assert watch.slowed
    assert pace is not None
    assert pace < 0.04, f"plain's pace {pace * 1000:.0f} ms a token (a step is 20 ms or more)"
    assert drafted < 60, f"{drafted} tokens drafted in two answers (fooled: several hundred)"
    assert ratio >= BOUNDED_LOSS, ratio
