"""Every front end's generation options become ``GenerationSettings`` here, under one policy.

The window's settings, ``specdeck serve``'s flags with an API request's fields over them,
``specdeck-bench``'s flags and the tuner all describe a generation as
:class:`GenerationOptions` (a partial mapping: what is not said keeps the default) and turn
it into :class:`~backends.speculation.types.GenerationSettings` with
:func:`generation_settings`. One rule lives here and nowhere else:

- **The seed policy.** Verification that is not asked for explicitly is sample-match when
  a seed is set, else rejection sampling. A seed asks for a reproducible answer:
  sample-match gives the main model's own sample for that seed whatever was drafted, while
  rejection sampling's answer also depends on the drafts (both keep the main model's
  distribution). So the window and the API answer the same seeded request alike.

The command-line flags that bench and serve share are declared once
(:func:`add_generation_arguments`) and read back once (:func:`generation_options_from_args`).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any, TypedDict, cast, get_args

from backends.errors import SettingsError
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import (
    DEFAULT_DRAFT_MAX,
    DEFAULT_DRAFT_MIN,
    DEFAULT_LOOKUP_DRAFT_MAX,
    DEFAULT_MAX_TOKENS,
    DEFAULT_P_MIN,
    GenerationSettings,
    Verification,
)

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

VERIFICATIONS: tuple[Verification, ...] = get_args(Verification)
SEEDED_VERIFICATION: Verification = "sample-match"
UNSEEDED_VERIFICATION: Verification = "rejection"


class GenerationOptions(TypedDict, total=False):
    """What a front end says about one generation; a key left out keeps the default.

    ``verification`` None (or left out) leaves it to the seed policy; ``seed`` None draws a
    fresh seed.
    """

    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    draft_max: int
    draft_min: int
    p_min: float
    lookup_draft_max: int
    stop_strings: tuple[str, ...]
    verification: Verification | None
    exact_batches: bool
    sibling_branches: bool
    grammar: str | None


SAMPLING_KEYS = frozenset(field.name for field in fields(SamplingSettings))
OPTION_KEYS = frozenset(GenerationOptions.__annotations__)


def verification_for(seed: int | None, asked: Verification | None = None) -> Verification:
    """The seed policy: what was asked for, else sample-match with a seed, else rejection."""
    if asked is not None:
        if asked not in VERIFICATIONS:
            raise SettingsError(
                f"verification must be {' or '.join(map(repr, VERIFICATIONS))}, got {asked!r}"
            )
        return asked
    return SEEDED_VERIFICATION if seed is not None else UNSEEDED_VERIFICATION


def merged(*layers: Mapping[str, Any]) -> GenerationOptions:
    """Later layers' keys over earlier ones' (an API request's fields over serve's flags)."""
    options: dict[str, Any] = {}
    for layer in layers:
        options.update(layer)
    return cast("GenerationOptions", options)


def generation_settings(options: Mapping[str, Any]) -> GenerationSettings:
    """The settings ``options`` describe, defaults for what they leave out.

    An unknown key or an impossible value is a SettingsError naming it.
    """
    unknown = sorted(set(options) - OPTION_KEYS)
    if unknown:
        raise SettingsError(f"unknown generation option {', '.join(unknown)}")
    given = dict(options)
    sampling = SamplingSettings(**{key: given.pop(key) for key in SAMPLING_KEYS & set(given)})
    asked = given.pop("verification", None)
    if "stop_strings" in given:
        given["stop_strings"] = tuple(given["stop_strings"])
    return replace(
        GenerationSettings(),
        sampling=sampling,
        verification=verification_for(sampling.seed, asked),
        **given,
    )


def settings_options(settings: GenerationSettings) -> GenerationOptions:
    """``settings`` as options again (every key given): ``generation_settings`` inverts it."""
    sampling = settings.sampling
    return GenerationOptions(
        max_tokens=settings.max_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        seed=sampling.seed,
        draft_max=settings.draft_max,
        draft_min=settings.draft_min,
        p_min=settings.p_min,
        lookup_draft_max=settings.lookup_draft_max,
        stop_strings=settings.stop_strings,
        verification=settings.verification,
        exact_batches=settings.exact_batches,
        sibling_branches=settings.sibling_branches,
        grammar=settings.grammar,
    )


# -- the command line -------------------------------------------------------------------------


def add_generation_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> None:
    """The sampling, drafting and verification flags of specdeck-bench and specdeck serve.

    ``--max-tokens`` reads as ``None`` when it is not given (a front end can tell a length
    asked for from its default: the bench's suite caps its prompts only when asked);
    :func:`generation_options_from_args` puts ``max_tokens`` in its place.
    """
    parser.add_argument("--max-tokens", type=int, default=None, help=f"(default: {max_tokens})")
    parser.set_defaults(default_max_tokens=max_tokens)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    parser.add_argument("--min-p", type=float, default=0.0, help="0.0 = off")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="a fixed sampling seed (default: a fresh one); with a seed, verification is "
        "sample-match unless --verification says otherwise",
    )
    parser.add_argument(
        "--draft-max",
        type=int,
        default=DEFAULT_DRAFT_MAX,
        help=f"most draft tokens a round (llama.cpp's --spec-draft-n-max; default: "
        f"{DEFAULT_DRAFT_MAX})",
    )
    parser.add_argument(
        "--draft-min",
        type=int,
        default=DEFAULT_DRAFT_MIN,
        help=f"fewest draft tokens worth verifying (default: {DEFAULT_DRAFT_MIN})",
    )
    parser.add_argument(
        "--p-min",
        type=float,
        default=DEFAULT_P_MIN,
        help="stop drafting when the draft's top probability falls below this (with "
        "--fixed-draft and the forced methods; auto learns where to stop)",
    )
    parser.add_argument(
        "--lookup-draft-max",
        type=int,
        default=DEFAULT_LOOKUP_DRAFT_MAX,
        help="longest draft of the n-gram lookups",
    )
    parser.add_argument(
        "--verification",
        choices=VERIFICATIONS,
        default=None,
        help="at temperature > 0: rejection sampling, or sample-and-match (default: "
        "sample-match with --seed, else rejection)",
    )
    parser.add_argument(
        "--fast-batches",
        action="store_true",
        help="verify each draft in one batch (llama.cpp's way) instead of bit-exact chunks; "
        "faster where big batches are cheap, but a near-tie may resolve differently",
    )
    parser.add_argument(
        "--sibling-branches",
        action="store_true",
        help="verify the draft model's second choice as a sibling branch where the costs say "
        "it pays (temperature 0; off by default, it gained nothing where measured)",
    )


def generation_options_from_args(args: argparse.Namespace) -> GenerationOptions:
    """What the flags of :func:`add_generation_arguments` say."""
    return GenerationOptions(
        max_tokens=args.default_max_tokens if args.max_tokens is None else args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        draft_max=args.draft_max,
        draft_min=args.draft_min,
        p_min=args.p_min,
        lookup_draft_max=args.lookup_draft_max,
        verification=args.verification,
        exact_batches=not args.fast_batches,
        sibling_branches=args.sibling_branches,
    )
