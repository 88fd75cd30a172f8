"""Structured output: answers that follow a grammar, and speculation under it, exact."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from backends.errors import SettingsError
from backends.speculation.drafters import DraftModelDrafter
from backends.speculation.grammar import (
    ANY_JSON_OBJECT,
    GrammarMatcher,
    compile_grammar,
    grammar_tokenizer,
)
from backends.speculation.loop import GRAMMAR_METHOD, SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.ngram import NgramSimpleDrafter
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import GenerationSettings, TokenOrigin
from benchmarks.structured_output import answer as run  # from empty caches
from tests.conftest import user

if TYPE_CHECKING:
    from pathlib import Path

    from backends.engines.llama import LlamaEngine

PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
PERSON_PROMPT = (
    "Ada Lovelace was 36 and wrote about the Analytical Engine in English and French. "
    "Give her as a JSON object with name, age and languages."
)


def assert_person(text: str) -> dict[str, Any]:
    """The answer parses as JSON and holds what PERSON_SCHEMA requires, typed."""
    person = json.loads(text)
    assert isinstance(person, dict)
    assert set(person) == {"name", "age", "languages"}
    assert isinstance(person["name"], str)
    assert len(person["name"]) <= 40
    assert isinstance(person["age"], int)
    assert isinstance(person["languages"], list)
    assert all(isinstance(language, str) for language in person["languages"])
    return person


@pytest.mark.parametrize(
    ("kind", "source", "message"),
    [
        ("json_schema", {"type": "nonsense"}, "invalid json schema: Invalid type: nonsense"),
        ("json_schema", [1, 2], "invalid json schema: it must be an object"),
        ("regex", "[a-", "invalid regex: at 1(8): invalid regex"),
        ("lark", "start: foo", 'invalid lark: at 1(8): unknown name: "foo"'),
        ("gbnf", "root ::= (", "invalid gbnf: Expected ')' at line 1"),
        ("gbnf", "", "a gbnf grammar must be a non-empty string"),
        ("yaml", "x", "unknown grammar kind 'yaml'"),
    ],
)
def test_a_bad_schema_or_grammar_is_one_line_naming_the_problem(
    kind: str, source: object, message: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        compile_grammar(kind, source)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("grammar", "words"),
    [
        ('root ::= "ab" root', "the grammar cannot take token"),  # llguidance's item limit
        ('root ::= root "a"', "the grammar cannot go on"),  # nothing can start it
    ],
)
def test_a_grammar_that_can_never_finish_is_a_short_error_not_a_hang(
    smollm_target: LlamaEngine, grammar: str, words: str
) -> None:
    """Such a grammar compiles; generating under it ends at once with one short line."""
    decoder = SpeculativeDecoder(smollm_target)
    settings = GenerationSettings(max_tokens=8, grammar=compile_grammar("gbnf", grammar))
    with pytest.raises(SettingsError) as refused:
        decoder.run(decoder.prompt_tokens(user("Hi")), settings)
    message = str(refused.value)
    assert message.startswith(words), message
    assert "<state>" not in message
    assert len(message) < 300


def test_the_tokenizer_is_the_engine_s_own(smollm_target: LlamaEngine) -> None:
    tokenizer = grammar_tokenizer(smollm_target)
    assert grammar_tokenizer(smollm_target) is tokenizer  # built once per engine
    text = '{"name": "Ada", "age": 36}'
    tokens = smollm_target.tokenize(text, add_special=False, parse_special=False)
    assert tokenizer.decode_bytes(tokens) == text.encode()
    # Special tokens (no text) are never part of the grammar's text, the end only at the end.
    matcher = GrammarMatcher(smollm_target, compile_grammar("regex", "(yes|no)"))
    allowed = matcher.allowed()
    end_ids = smollm_target.vocab.end_of_generation_ids
    assert not any(allowed[token] for token in end_ids)
    yes = smollm_target.tokenize("yes", add_special=False, parse_special=False)
    assert allowed[yes[0]]
    assert matcher.allowed_prefix([*yes, *yes]) == len(yes)  # "yesyes" leaves the grammar
    for token in yes:
        matcher.consume(token)
    assert any(matcher.allowed()[token] for token in end_ids)  # complete: it may end now


def test_plain_constrained_decoding_follows_the_schema(smollm_target: LlamaEngine) -> None:
    decoder = SpeculativeDecoder(smollm_target)
    prompt = decoder.prompt_tokens(user(PERSON_PROMPT))
    grammar = compile_grammar("json_schema", PERSON_SCHEMA)
    free = run(decoder, prompt, GenerationSettings(max_tokens=96))
    with pytest.raises(json.JSONDecodeError):  # SmolLM2 on its own answers in prose
        json.loads(free.text)
    result = run(decoder, prompt, GenerationSettings(max_tokens=200, grammar=grammar))
    assert result.stats.stop_reason == "eos"  # the grammar complete: the answer ended
    assert_person(result.text)
    assert result.stats.grammar_tokens_count == 0  # no drafting: one token a step


@pytest.mark.parametrize("method", ["auto", "draft-model", "ngram-simple"])
def test_speculation_under_a_grammar_is_plain_constrained_decoding(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine, method: str
) -> None:
    grammar = compile_grammar("json_schema", PERSON_SCHEMA)
    settings = GenerationSettings(max_tokens=200, grammar=grammar)
    plain = SpeculativeDecoder(smollm_target)
    prompt = plain.prompt_tokens(user(PERSON_PROMPT))
    expected = run(plain, prompt, settings)
    decoder = build_decoder(method, smollm_target, smollm_draft)  # type: ignore[arg-type]
    result = run(decoder, prompt, settings)
    assert result.token_ids == expected.token_ids
    assert_person(result.text)
    stats = result.stats
    # The scaffolding the schema fixes (keys, quotes, colons) came from the grammar alone,
    # verified without drafting and always kept, counted apart from the drafts.
    by_grammar = [t for t in result.tokens if t.origin is TokenOrigin.GRAMMAR]
    assert stats.grammar_tokens_count == len(by_grammar) >= 5
    scaffolding = "".join(t.text for t in by_grammar)
    assert all(key in scaffolding for key in PERSON_SCHEMA["required"])
    assert stats.rounds_by_method[GRAMMAR_METHOD] >= 1
    drafted = stats.total_draft_tokens_count
    assert drafted == (
        stats.accepted_draft_tokens_count
        + stats.rejected_draft_tokens_count
        + stats.ignored_draft_tokens_count
    )
    assert sum(t.origin is TokenOrigin.DRAFT for t in result.tokens) == (
        stats.accepted_draft_tokens_count
    )


def test_a_forbidden_draft_token_ends_the_draft_before_verification(
    smollm_target: LlamaEngine,
) -> None:
    """A lookup copies the prompt's text, which the grammar forbids: the draft is cut at its
    first forbidden token and the cut tokens count as ignored, never verified."""
    grammar = compile_grammar("regex", "[0-9]{1,3}(, [0-9]{1,3}){0,30}")
    settings = GenerationSettings(max_tokens=48, grammar=grammar)
    plain = SpeculativeDecoder(smollm_target)
    prompt = plain.prompt_tokens(user("List the numbers: 1, 2, 3, four, five, 6, 7, 8, nine."))
    expected = run(plain, prompt, settings)
    lookup = SpeculativeDecoder(smollm_target, [NgramSimpleDrafter()], adaptive=False)
    result = run(lookup, prompt, settings)
    assert result.token_ids == expected.token_ids
    text = result.text
    assert all(part.strip().isdigit() for part in text.split(","))
    stats = result.stats
    assert stats.ignored_draft_tokens_count > 0
    verified_drafted = sum(stats.verified_at_position[:1])
    assert verified_drafted <= stats.total_draft_tokens_count


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_answers_follow_the_schema_with_speculation(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine, seed: int
) -> None:
    sampling = SamplingSettings(temperature=0.9, top_p=0.95, seed=seed)
    grammar = compile_grammar("json_schema", ANY_JSON_OBJECT)
    settings = GenerationSettings(max_tokens=160, sampling=sampling, grammar=grammar)
    decoder = build_decoder("auto", smollm_target, smollm_draft)
    result = run(decoder, decoder.prompt_tokens(user(PERSON_PROMPT)), settings)
    if result.stats.stop_reason == "eos":
        assert isinstance(json.loads(result.text), dict)
    else:  # cut by max_tokens: still a prefix of a JSON object
        assert result.stats.stop_reason == "max_tokens"
        assert result.text.startswith("{")


def test_a_draft_model_drafts_within_the_grammar_and_leaves_it_as_it_was(
    smollm_draft: LlamaEngine,
) -> None:
    drafter = DraftModelDrafter(smollm_draft, p_min=0.0)
    context = smollm_draft.tokenize(
        "The year the war ended was", add_special=False, parse_special=False
    )
    greedy, rng = SamplingSettings(), np.random.default_rng(0)
    smollm_draft.truncate(0)
    free = drafter.draft(context, 6, greedy, rng, None)
    matcher = GrammarMatcher(smollm_draft, compile_grammar("regex", " [0-9]{1,6}"))
    assert matcher.allowed_prefix(free.tokens) < len(free.tokens)  # free, it leaves it
    before = matcher.allowed()
    smollm_draft.truncate(0)
    held = drafter.draft(context, 6, greedy, rng, None, grammar=matcher)
    assert held.tokens
    assert matcher.allowed_prefix(held.tokens) == len(held.tokens)
    assert smollm_draft.detokenize(held.tokens).strip().isdigit()
    assert (matcher.allowed() == before).all()  # rolled back: as before the draft


def test_the_structured_output_benchmark_runs_and_checks_the_texts(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    from backends.speculation.estimates import CostCache
    from benchmarks.structured_output import PROMPTS, format_table, run_prompt

    call = next(p for p in PROMPTS if p.key == "function-call")
    result = run_prompt(smollm_target, smollm_draft, call, 1, 64, CostCache())
    assert result.identical
    assert len(result.speedups) == 1
    assert result.speedups[0] > 0
    answer = json.loads(result.text)
    assert answer["name"] == "get_weather"
    assert set(answer["arguments"]) == {"city", "country_code", "unit", "days"}
    assert all(count > 0 for count in result.grammar_tokens)  # '"name":"get_weather"' at least
    table = format_table([result], "a machine", 1)
    assert "| function-call | " in table
    assert table.rstrip().endswith("| yes |")


def test_a_seed_gives_plain_constrained_sampling_s_text_with_sample_match(
    smollm_target: LlamaEngine, smollm_draft: LlamaEngine
) -> None:
    """Sample-match under a grammar: each emitted token is one draw of the target's own
    stream from its masked row, the grammar's forced ones too, so a seed gives the text
    plain constrained sampling gives."""
    sampling = SamplingSettings(temperature=0.8, seed=7)
    grammar = compile_grammar("json_schema", PERSON_SCHEMA)
    settings = GenerationSettings(
        max_tokens=160, sampling=sampling, grammar=grammar, verification="sample-match"
    )
    plain = SpeculativeDecoder(smollm_target)
    prompt = plain.prompt_tokens(user(PERSON_PROMPT))
    expected = run(plain, prompt, settings)
    result = run(build_decoder("auto", smollm_target, smollm_draft), prompt, settings)
    assert result.token_ids == expected.token_ids
    assert result.stats.grammar_tokens_count > 0


def test_any_engine_follows_the_grammar_mlx_too(tiny_mlx_main: Path) -> None:
    """The grammar's tokenizer comes from the engine's own token texts: a random MLX model
    answers within the grammar too."""
    from backends.engines.mlx import MlxEngine

    grammar = compile_grammar("regex", "(def|for) [a-z]{1,8}")
    with MlxEngine(tiny_mlx_main, n_ctx=256, probe_exact_batch=False) as engine:
        decoder = SpeculativeDecoder(engine, [NgramSimpleDrafter()], adaptive=False)
        prompt = decoder.prompt_tokens(user("def add(a, b):"))
        for seed in (1, 2):
            sampling = SamplingSettings(temperature=1.0, seed=seed)
            settings = GenerationSettings(max_tokens=24, sampling=sampling, grammar=grammar)
            result = run(decoder, prompt, settings)
            assert re.fullmatch("(def|for) [a-z]{1,8}", result.text), result.text
            assert result.stats.stop_reason == "eos"
