"""The local API's request parser: what a request says, and nothing it decides for itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from backends.service.api.errors import ApiError
from backends.service.api.jobs import RequestCounts, ServedModel
from backends.service.api.parsing import parse_request
from backends.service.generation_options import generation_settings
from backends.service.serve_cli import build_parser, generation_defaults
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import DEFAULT_MAX_TOKENS, GenerationSettings

if TYPE_CHECKING:
    from backends.service.api.jobs import ApiJob
    from backends.speculation.methods import SpeculationMethod

MESSAGES = [{"role": "user", "content": "hi"}]
MODEL = ServedModel.of("/models/main.gguf", "Main")
DRAFT = ServedModel.of("/models/draft.gguf", "Draft")


class LoadedBackend:
    """A backend with a pair loaded, for the parser only: it never runs a job."""

    def __init__(self, n_ctx: int = 2048) -> None:
        self.main: ServedModel | None = MODEL
        self.draft: ServedModel | None = DRAFT
        self.n_ctx = n_ctx
        self.method: SpeculationMethod = "auto"
        self.counts = RequestCounts()
        self.unavailable: str | None = None

    def submit(self, job: ApiJob) -> None:
        raise AssertionError("the parser submits nothing")


def serve_defaults(*flags: str) -> Any:
    """``specdeck serve``'s generation defaults for these flags, as the server gets them."""
    return generation_defaults(build_parser().parse_args(list(flags)))


def parsed(body: dict[str, Any], *flags: str, n_ctx: int = 2048) -> Any:
    return parse_request(
        "chat", {"messages": MESSAGES, **body}, LoadedBackend(n_ctx), serve_defaults(*flags)
    )


def test_a_request_carries_only_what_it_says() -> None:
    request = parsed({})
    assert request.options == {}
    assert request.settings == GenerationSettings()
    said = parsed(
        {
            "max_tokens": 40,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.9,
            "min_p": 0.05,
            "seed": 7,
            "stop": "END",
            "specdeck": {"draft_max": 6, "draft_min": 2, "p_min": 0.3, "lookup_draft_max": 9},
        }
    )
    assert said.options == {
        "max_tokens": 40,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.9,
        "min_p": 0.05,
        "seed": 7,
        "stop_strings": ("END",),
        "draft_max": 6,
        "draft_min": 2,
        "p_min": 0.3,
        "lookup_draft_max": 9,
    }
    assert said.settings == GenerationSettings(
        max_tokens=40,
        sampling=SamplingSettings(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=7),
        draft_max=6,
        draft_min=2,
        p_min=0.3,
        lookup_draft_max=9,
        stop_strings=("END",),
        verification="sample-match",
    )
    dotted = parsed({"speculative.n_max": 5, "speculative.n_min": 1, "speculative.p_min": 0.2})
    assert dotted.options == {"draft_max": 5, "draft_min": 1, "p_min": 0.2}
    assert parsed({"max_completion_tokens": 12, "max_tokens": 99}).options == {"max_tokens": 12}


def test_the_parser_leaves_a_seeds_verification_to_the_one_policy() -> None:
    seeded = parsed({"seed": 7, "temperature": 1.0})
    assert "verification" not in seeded.options
    assert seeded.settings.verification == "sample-match"
    assert seeded.settings == generation_settings({"seed": 7, "temperature": 1.0})
    assert parsed({"temperature": 1.0}).settings.verification == "rejection"
    asked = parsed({"seed": 7, "specdeck": {"verification": "rejection"}})
    assert asked.options["verification"] == "rejection"
    assert asked.settings.verification == "rejection"


def test_a_request_overrides_serves_defaults_and_keeps_the_rest() -> None:
    flags = ("--max-tokens", "64", "--temperature", "0.5", "--top-k", "30", "--draft-max", "8")
    served = parsed({}, *flags)
    assert served.options == {}
    assert served.settings.max_tokens == 64
    assert served.settings.sampling == SamplingSettings(temperature=0.5, top_k=30)
    assert served.settings.draft_max == 8
    overridden = parsed({"temperature": 0, "max_tokens": 5}, *flags)
    assert overridden.settings.max_tokens == 5
    assert overridden.settings.sampling == SamplingSettings(temperature=0.0, top_k=30)
    # No max_tokens anywhere: the default, or the context where that is smaller (found by
    # the fuzz test: a 400 for a request that asked for nothing past the context).
    assert parsed({}).settings.max_tokens == DEFAULT_MAX_TOKENS
    assert parsed({}, n_ctx=256).settings.max_tokens == min(DEFAULT_MAX_TOKENS, 256)
    # llama.cpp's seed -1 asks for a fresh seed (found by the fuzz test: it was a 500).
    assert parsed({"seed": -1, "temperature": 1.0}).settings.sampling.seed is None
    assert parsed({"seed": -1, "temperature": 1.0}).settings.verification == "rejection"
    # A null field says nothing: serve's default stands.
    assert parsed({"temperature": None, "seed": None}, *flags).settings.sampling.temperature == 0.5


def test_serves_verification_flags_reach_the_settings() -> None:
    # Serve's --verification is asked for explicitly: a request's seed does not override it.
    assert parsed({"seed": 7}, "--verification", "rejection").settings.verification == "rejection"
    assert parsed({}, "--verification", "sample-match").settings.verification == "sample-match"
    over = parsed(
        {"seed": 7, "specdeck": {"verification": "sample-match"}}, "--verification", "rejection"
    )
    assert over.settings.verification == "sample-match"  # the request's own word wins
    # Serve's --seed is a seed like a request's: sample-match unless told otherwise.
    assert parsed({}, "--seed", "3").settings.sampling.seed == 3
    assert parsed({}, "--seed", "3").settings.verification == "sample-match"
    fast = parsed({}, "--fast-batches", "--sibling-branches").settings
    assert fast.exact_batches is False
    assert fast.sibling_branches is True
    plain = parsed({}).settings
    assert plain.exact_batches is True
    assert plain.sibling_branches is False


def test_serve_refuses_impossible_generation_flags_before_it_listens() -> None:
    from backends.errors import SettingsError

    with pytest.raises(SettingsError, match="temperature must be >= 0"):
        serve_defaults("--temperature", "-1")
    with pytest.raises(SettingsError, match="draft_min must be between"):
        serve_defaults("--draft-max", "2", "--draft-min", "3")
    assert serve_defaults("--max-tokens", "64")["max_tokens"] == 64
    assert "max_tokens" not in serve_defaults()  # each request's default, within its context


@pytest.mark.parametrize(
    ("body", "flags", "message", "param"),
    [
        (
            {"max_tokens": 0},
            (),
            "'max_tokens' must be between 1 and the context size (512)",
            "max_tokens",
        ),
        (
            {"max_tokens": 513},
            (),
            "'max_tokens' must be between 1 and the context size (512)",
            "max_tokens",
        ),
        # Serve's default is checked against the context as a request's own would be.
        (
            {},
            ("--max-tokens", "600"),
            "'max_tokens' must be between 1 and the context size (512)",
            "max_tokens",
        ),
        ({"max_tokens": "8"}, (), "'max_tokens' must be a int", "max_tokens"),
        ({"temperature": "hot"}, (), "'temperature' must be a float", "temperature"),
        ({"top_p": float("inf")}, (), "'top_p' must be a finite number", "top_p"),
        ({"seed": True}, (), "'seed' must be a int", "seed"),
        ({"seed": -2}, (), "seed must be >= 0 (none: a fresh one), got -2", None),
        ({"temperature": -1}, (), "temperature must be >= 0, got -1.0", None),
        ({"specdeck": {"draft_max": 0}}, (), "draft_max must be >= 1, got 0", None),
        ({"specdeck": {"draft_min": 9, "draft_max": 4}}, (), "draft_min must be between", None),
        ({"specdeck": 5}, (), "'specdeck' must be an object", "specdeck"),
        (
            {"specdeck": {"verification": "majority"}},
            (),
            "'specdeck.verification' must be 'rejection' or 'sample-match'",
            "specdeck.verification",
        ),
        ({"specdeck": {"method": 3}}, (), "'specdeck.method' must be a string", "specdeck.method"),
        ({"specdeck": {"method": "fast"}}, (), "unknown speculation method", "specdeck.method"),
        ({"stop": ["a", ""]}, (), "'stop' takes 1 to 4 non-empty strings", "stop"),
        ({"stop": 5}, (), "'stop' must be a string or a list of strings", "stop"),
        ({"stream": "yes"}, (), "'stream' must be true or false", "stream"),
        ({"stream_options": 1}, (), "'stream_options' must be an object", "stream_options"),
        ({"n": 2}, (), "only n = 1 is supported", "n"),
        ({"model": 7}, (), "'model' must be a string", "model"),
        ({"draft_model": ["d"]}, (), "'draft_model' must be a string", "draft_model"),
    ],
)
def test_a_bad_field_is_named(
    body: dict[str, Any], flags: tuple[str, ...], message: str, param: str | None
) -> None:
    with pytest.raises(ApiError) as refused:
        parsed(body, *flags, n_ctx=512)
    assert refused.value.status == 400
    assert message in refused.value.message
    assert refused.value.param == param


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        (
            {"model": "gpt-4o"},
            "model 'gpt-4o' is not loaded; this server answers with 'main'",
            "model",
        ),
        (
            {"draft_model": "other"},
            "draft model 'other' is not loaded; the loaded draft is 'draft'",
            "draft_model",
        ),
    ],
)
def test_a_model_that_is_not_loaded_is_a_404_naming_the_loaded_one(
    body: dict[str, Any], message: str, param: str
) -> None:
    with pytest.raises(ApiError) as refused:
        parsed(body, n_ctx=512)
    assert (refused.value.status, refused.value.code) == (404, "model_not_found")
    assert refused.value.message == message
    assert refused.value.param == param


def test_requests_before_a_load_and_prompts_of_the_completions_endpoint() -> None:
    idle = LoadedBackend()
    idle.main, idle.unavailable = None, "the models are still loading"
    with pytest.raises(ApiError, match="still loading") as refused:
        parse_request("chat", {"messages": MESSAGES}, idle)
    assert refused.value.status == 503
    completion = parse_request("completion", {"prompt": ["def f():"]}, LoadedBackend())
    assert (completion.messages, completion.text) == (None, "def f():")
    with pytest.raises(ApiError, match="'prompt' must be a non-empty string"):
        parse_request("completion", {"prompt": ""}, LoadedBackend())
    chat = parsed({"messages": [{"role": "developer", "content": [{"type": "text", "text": "x"}]}]})
    assert chat.messages is not None
    assert [(m.role, m.content) for m in chat.messages] == [("system", "x")]
