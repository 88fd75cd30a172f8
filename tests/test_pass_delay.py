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
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.types import GenerationSettings
from tests.conftest import user

if TYPE_CHECKING:
    from pathlib import Path

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
