"""Front ends' options become GenerationSettings in one place, under one seed policy."""

from __future__ import annotations

import argparse

import pytest

from backends.errors import SettingsError
from backends.service.generation_options import (
    add_generation_arguments,
    generation_options_from_args,
    generation_settings,
    merged,
    settings_options,
    verification_for,
)
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import GenerationSettings


def test_nothing_said_is_the_defaults() -> None:
    assert generation_settings({}) == GenerationSettings()


def test_seed_policy() -> None:
    assert verification_for(None) == "rejection"
    assert verification_for(7) == "sample-match"
    assert verification_for(0) == "sample-match"  # 0 is a real seed
    assert verification_for(7, "rejection") == "rejection"  # asked for explicitly
    assert generation_settings({"seed": 3, "temperature": 0.7}).verification == "sample-match"
    assert generation_settings({"temperature": 0.7}).verification == "rejection"
    explicit = generation_settings({"seed": 3, "verification": "rejection"})
    assert explicit.verification == "rejection"
    with pytest.raises(SettingsError, match="verification must be"):
        verification_for(None, "majority")  # type: ignore[arg-type]


def test_every_field_reaches_the_settings() -> None:
    settings = generation_settings(
        {
            "max_tokens": 99,
            "temperature": 0.5,
            "top_k": 40,
            "top_p": 0.9,
            "min_p": 0.05,
            "seed": 11,
            "draft_max": 6,
            "draft_min": 2,
            "p_min": 0.4,
            "lookup_draft_max": 12,
            "stop_strings": ["END"],
            "verification": "rejection",
            "exact_batches": False,
            "sibling_branches": True,
        }
    )
    assert settings == GenerationSettings(
        max_tokens=99,
        sampling=SamplingSettings(temperature=0.5, top_k=40, top_p=0.9, min_p=0.05, seed=11),
        draft_max=6,
        draft_min=2,
        p_min=0.4,
        lookup_draft_max=12,
        stop_strings=("END",),
        verification="rejection",
        exact_batches=False,
        sibling_branches=True,
    )
    assert generation_settings(settings_options(settings)) == settings


def test_unknown_and_impossible_options_name_the_problem() -> None:
    with pytest.raises(SettingsError, match="unknown generation option draft_maxx"):
        generation_settings({"draft_maxx": 3})
    with pytest.raises(SettingsError, match="top_p must be in"):
        generation_settings({"top_p": 0.0})
    with pytest.raises(SettingsError, match="draft_min must be between"):
        generation_settings({"draft_max": 2, "draft_min": 3})


def test_later_layers_win() -> None:
    served = {"temperature": 0.2, "seed": 5, "max_tokens": 64}
    request = {"temperature": 0.9, "seed": None}
    settings = generation_settings(merged(served, request))
    assert settings.sampling.temperature == pytest.approx(0.9)
    assert settings.sampling.seed is None
    assert settings.verification == "rejection"  # the request's seed None: fresh, unseeded
    assert settings.max_tokens == 64


def test_command_line_flags() -> None:
    parser = argparse.ArgumentParser()
    add_generation_arguments(parser, max_tokens=128)
    defaults = generation_settings(generation_options_from_args(parser.parse_args([])))
    assert defaults == GenerationSettings(max_tokens=128)
    args = parser.parse_args(
        ["--seed", "4", "--temperature", "0.8", "--min-p", "0.1", "--draft-min", "1"]
        + ["--fast-batches", "--sibling-branches", "--lookup-draft-max", "9"]
    )
    settings = generation_settings(generation_options_from_args(args))
    assert settings.verification == "sample-match"
    assert settings.sampling == SamplingSettings(temperature=0.8, min_p=0.1, seed=4)
    assert (settings.draft_min, settings.lookup_draft_max) == (1, 9)
    assert not settings.exact_batches
    assert settings.sibling_branches
    explicit = parser.parse_args(["--seed", "4", "--verification", "rejection"])
    assert generation_settings(generation_options_from_args(explicit)).verification == "rejection"
