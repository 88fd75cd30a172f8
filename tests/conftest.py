"""Shared fixtures: the real GGUF models (fetched once into the user data dir) and engines."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from backends.engine import ChatMessage
from backends.llama_engine import LlamaEngine, LlamaLoadSettings
from backends.provision import (
    DEFAULT_DRAFT_KEY,
    DEFAULT_MAIN_KEY,
    INCOMPATIBLE_TEST_KEY,
    SMALL_TEST_KEY,
    ensure_model,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

TEST_CONTEXT = 2048


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return ensure_model(SMALL_TEST_KEY)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    return ensure_model(INCOMPATIBLE_TEST_KEY)


@pytest.fixture(scope="session")
def qwen_main_path() -> Path:
    return ensure_model(DEFAULT_MAIN_KEY)


@pytest.fixture(scope="session")
def qwen_draft_path() -> Path:
    return ensure_model(DEFAULT_DRAFT_KEY)


@pytest.fixture(scope="session")
def smollm_target(smollm_path: Path) -> Iterator[LlamaEngine]:
    with LlamaEngine(smollm_path, LlamaLoadSettings(n_ctx=TEST_CONTEXT)) as engine:
        yield engine


@pytest.fixture(scope="session")
def smollm_draft(smollm_path: Path) -> Iterator[LlamaEngine]:
    with LlamaEngine(smollm_path, LlamaLoadSettings(n_ctx=TEST_CONTEXT), is_draft=True) as engine:
        yield engine


@pytest.fixture(scope="session")
def qwen_main(qwen_main_path: Path) -> Iterator[LlamaEngine]:
    with LlamaEngine(qwen_main_path, LlamaLoadSettings(n_ctx=TEST_CONTEXT)) as engine:
        yield engine


@pytest.fixture(scope="session")
def qwen_draft(qwen_draft_path: Path) -> Iterator[LlamaEngine]:
    with LlamaEngine(
        qwen_draft_path, LlamaLoadSettings(n_ctx=TEST_CONTEXT), is_draft=True
    ) as engine:
        yield engine


def user(text: str) -> list[ChatMessage]:
    """A one-message conversation."""
    return [ChatMessage("user", text)]
