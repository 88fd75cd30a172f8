"""Auto mode and cost-aware drafting on real models: lossless, and fast batches only at ties."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from backends.engines.interface import sync_cache
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.errors import SettingsError
from backends.service.suite_prompts import SUITE_PROMPTS
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder, parse_method
from backends.speculation.ngram import NgramSimpleDrafter
from backends.speculation.types import GenerationSettings
from tests.conftest import TEST_CONTEXT, user

if TYPE_CHECKING:
    from backends.engines.interface import ModelEngine

PROMPTS = {prompt.key: prompt for prompt in SUITE_PROMPTS}
ROOT = Path(__file__).resolve().parents[1]
# llama.cpp's own threshold of the tiled matmul (SpecDeck's build sets 64, read once per
# process): from 8 rows the main model's batches round differently from single steps.
TILED_FROM_8_ROWS = {"GGML_CPU_TILED_MM_MIN_ROWS": "8"}


def plain_run(engine: ModelEngine, prompt: list[int], settings: GenerationSettings) -> list[int]:
    engine.truncate(0)
    return SpeculativeDecoder(engine).run(prompt, settings).token_ids


@pytest.mark.default_pair
def test_auto_on_the_default_pair_is_plain_decoding(
    qwen_main: LlamaEngine, qwen_draft: LlamaEngine
) -> None:
    auto = build_decoder("auto", qwen_main, qwen_draft)
    for key, max_tokens in (("quicksort", 64), ("type-hints", 96)):
        prompt = auto.prompt_tokens(user(PROMPTS[key].text))
        settings = GenerationSettings(max_tokens=max_tokens)
        expected = plain_run(qwen_main, prompt, settings)
        qwen_main.truncate(0)
        result = auto.run(prompt, settings)
        assert result.token_ids == expected, key
        stats = result.stats
        assert stats.total_draft_tokens_count == (
            stats.accepted_draft_tokens_count
            + stats.rejected_draft_tokens_count
            + stats.ignored_draft_tokens_count
        )
    # The rewrite copies its prompt: the lookups drafted some of it.
    lookup_rounds = sum(
        count
        for name, count in result.stats.rounds_by_method.items()
        if name.startswith("ngram") or name == "edit-copy"
    )
    assert lookup_rounds > 0
    assert result.stats.accepted_draft_tokens_count > 0
    assert auto.planner is not None
    assert auto.planner.target_costs.cost(1) > 0


@pytest.mark.heavy
def test_long_context_greedy_stays_bitwise_plain(smollm_target: LlamaEngine) -> None:
    """Past 512 cached tokens llama.cpp's CPU attention has other paths; the engine avoids them."""
    decoder = SpeculativeDecoder(smollm_target, NgramSimpleDrafter())
    prompt = decoder.prompt_tokens(user(PROMPTS["summary"].text))
    assert len(prompt) > 600
    settings = GenerationSettings(max_tokens=96, lookup_draft_max=16)
    expected = plain_run(smollm_target, prompt, settings)
    smollm_target.truncate(0)
    result = decoder.run(prompt, settings)
    assert result.token_ids == expected
    assert result.stats.accepted_draft_tokens_count > 0


def top_two_margin(row: np.ndarray) -> float:
    best, second = np.partition(row, -2)[-2:][::-1]
    return float(best - second)


def fast_batches_against_plain(model: str) -> dict[str, Any]:
    """Fast batches on ``model`` against plain decoding: where they first differ, and how sure
    plain decoding was there (the top two logits' margin). Run in a child process."""
    with LlamaEngine(Path(model), LlamaLoadSettings(n_ctx=TEST_CONTEXT)) as engine:
        decoder = build_decoder("ngram-simple", engine, adaptive=False)
        prompt = decoder.prompt_tokens(user(PROMPTS["type-hints"].text))
        settings = GenerationSettings(max_tokens=96, lookup_draft_max=12, exact_batches=False)
        expected = plain_run(engine, prompt, settings)
        engine.truncate(0)
        result = decoder.run(prompt, settings)
        got = result.token_ids
        first = next(
            (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None
        )
        margin = None
        if first is not None:
            engine.truncate(0)
            margin = top_two_margin(sync_cache(engine, prompt + expected[:first])[0])
        return {
            "exact_batch_limit": engine.exact_batch_limit,
            "longest_batch": max(result.stats.draft_length_counts) + 1,
            "identical": got == expected,
            "first_difference": first,
            "margin": margin,
        }


@pytest.mark.default_pair
def test_fast_batches_differ_from_plain_only_at_near_ties(qwen_main_path: Path) -> None:
    # SpecDeck's build keeps every batch the loop sends exact; with llama.cpp's own tiled
    # threshold back, batches past the probed limit round differently, as on a stock build.
    code = (
        "import json, sys\n"
        "from tests.test_auto import fast_batches_against_plain\n"
        "print(json.dumps(fast_batches_against_plain(sys.argv[1])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(qwen_main_path)],
        cwd=ROOT,
        env={**os.environ, **TILED_FROM_8_ROWS},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert 1 <= found["exact_batch_limit"] <= 7, found  # batches from 8 rows: never assumed exact
    # Fast mode verified drafts longer than the bit-exact limit in one batch.
    assert found["longest_batch"] > found["exact_batch_limit"], found
    if not found["identical"]:
        assert found["margin"] < 1.0, (
            f"diverged at token {found['first_difference']} where plain decoding was sure "
            f"({found['margin']})"
        )


# Each forced method takes over 4 s here: the quick tier keeps "off", the full suite all five.
@pytest.mark.parametrize(
    "method",
    [
        pytest.param("draft-model", marks=pytest.mark.heavy),
        pytest.param("ngram-simple", marks=pytest.mark.heavy),
        pytest.param("ngram-mod", marks=pytest.mark.heavy),
        pytest.param("edit-copy", marks=pytest.mark.heavy),
        "off",
    ],
)
def test_forced_methods_are_lossless_with_adaptive_length(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine, method: str
) -> None:
    decoder = build_decoder(parse_method(method), smollm_target, smollm_draft)
    prompt = decoder.prompt_tokens(user(PROMPTS["type-hints"].text))
    settings = GenerationSettings(max_tokens=64)
    expected = plain_run(smollm_target, prompt, settings)
    smollm_target.truncate(0)
    smollm_draft.truncate(0)
    result = decoder.run(prompt, settings)
    assert result.token_ids == expected
    stats = result.stats
    names = {"none", *(d.name for d in decoder.drafters)}
    assert set(stats.rounds_by_method) <= names
    # Every token after the prompt's round is timed to the drafter its round planned.
    assert set(stats.seconds_by_method) == set(stats.tokens_by_method) <= names
    assert sum(stats.tokens_by_method.values()) == stats.generated_tokens - 1
    timed = sum(stats.seconds_by_method.values())
    assert 0.0 < timed <= stats.generation_seconds
    assert all(seconds > 0.0 for seconds in stats.seconds_by_method.values())


def test_method_errors_are_clear(smollm_target: LlamaEngine) -> None:
    with pytest.raises(SettingsError, match="unknown speculation method 'fastest'"):
        parse_method("fastest")
    with pytest.raises(SettingsError, match="needs a draft model"):
        build_decoder("draft-model", smollm_target, None)
    with pytest.raises(SettingsError, match="lookup_draft_max"):
        GenerationSettings(lookup_draft_max=0)
