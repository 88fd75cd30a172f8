"""Shared fixtures: the real GGUF models (fetched once into the user data dir) and engines."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from backends.engines.interface import ChatMessage
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.models.provision import (
    DEFAULT_DRAFT_KEY,
    DEFAULT_MAIN_KEY,
    INCOMPATIBLE_TEST_KEY,
    SMALL_TEST_KEY,
    ensure_model,
)
from tests.hub_standin import HubRepo, HubStandin, point_client_at, serve_hub
from tests.prestarted import PRESTART_ENV, Command, CommandProblem, PrestartedRuns, commands_of

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from tests.test_api_server import Served

pytest_plugins = ["pytester"]  # tests/test_architecture.py runs the marker check on a test file

TEST_CONTEXT = 2048
# The fixtures that need the default Qwen2.5-Coder pair's files (the engines need the paths).
# A test that uses one, directly or through another fixture, must say so with
# ``@pytest.mark.default_pair``: ``scripts/test --quick`` leaves those out, and a setup for the
# quick tier does not fetch the pair. Collection fails on a test that does not say so.
DEFAULT_PAIR_FIXTURES = frozenset({"qwen_main_path", "qwen_draft_path"})
DEFAULT_PAIR_MARKER = "default_pair"


def default_pair_fixtures_of(item: pytest.Item) -> set[str]:
    """The default pair's fixtures ``item`` uses: asked for (directly or through fixtures) or
    named by a parameter (for ``request.getfixturevalue``)."""
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        names |= {value for value in callspec.params.values() if isinstance(value, str)}
    return names & DEFAULT_PAIR_FIXTURES


def unmarked_default_pair_tests(items: Sequence[pytest.Item]) -> list[str]:
    """The tests among ``items`` that use the default pair's fixtures without the marker."""
    return [
        f"{item.nodeid} (uses {', '.join(sorted(used))})"
        for item in items
        if (used := default_pair_fixtures_of(item))
        and item.get_closest_marker(DEFAULT_PAIR_MARKER) is None
    ]


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the quick tier checks every test too
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse to run when a test loads the default pair without the ``default_pair`` marker."""
    unmarked = unmarked_default_pair_tests(items)
    if unmarked:
        raise pytest.UsageError(
            f"these tests need the default pair but lack @pytest.mark.{DEFAULT_PAIR_MARKER} "
            "(scripts/test --quick would run them): " + "; ".join(unmarked)
        )


@dataclass
class Prestarted:
    """The session's background runs and the marked tests whose command could not be made."""

    runs: PrestartedRuns
    problems: dict[str, CommandProblem]

    def run_of(self, nodeid: str) -> PrestartedRuns:
        if nodeid in self.problems:
            raise self.problems[nodeid].error
        if not self.runs.has(nodeid):
            pytest.fail(
                f"{nodeid} asks for its prestarted run, but it is not marked "
                "@pytest.mark.prestarted(command_of=...) or its command_of returned None "
                "without a skip marker that skips it here"
            )
        return self.runs


@pytest.fixture(scope="session", autouse=True)
def prestarted_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prestarted]:
    """The slow commands of the selected tests, started at once in the background
    (:mod:`tests.prestarted`)."""
    commands, problems = commands_of(request.session.items, tmp_path_factory.mktemp)
    runs = PrestartedRuns(commands)
    if os.environ.get(PRESTART_ENV) == "1":
        runs.start()
    yield Prestarted(runs, problems)
    runs.stop()


@pytest.fixture
def prestarted(
    prestarted_runs: Prestarted, request: pytest.FixtureRequest
) -> subprocess.CompletedProcess[str]:
    """The finished run of the command this test is marked with (``@pytest.mark.prestarted``)."""
    return prestarted_runs.run_of(request.node.nodeid).result(request.node.nodeid)


@pytest.fixture
def prestarted_command(prestarted_runs: Prestarted, request: pytest.FixtureRequest) -> Command:
    """The command this test is marked with, as it was started."""
    return prestarted_runs.run_of(request.node.nodeid).command(request.node.nodeid)


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
    """SmolLM2 drafting for itself with its own weights (as stored, not the Q4_0 copy)."""
    settings = LlamaLoadSettings(n_ctx=TEST_CONTEXT, draft_weights="stored")
    with LlamaEngine(smollm_path, settings, is_draft=True) as engine:
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


@pytest.fixture(scope="session")
def smollm_server(smollm_path: Path) -> Iterator[Served]:
    """``specdeck serve`` on the SmolLM pair, shared by the API's tests."""
    from tests.test_api_server import serve

    with serve("--main", str(smollm_path), "--draft", str(smollm_path)) as served:
        yield served


def user(text: str) -> list[ChatMessage]:
    """A one-message conversation."""
    return [ChatMessage("user", text)]


# -- MLX: tiny random-weight model folders (built in-process, offline, in seconds) ---------------

TINY_MLX_TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "for i in range(10):\n    print(i)\n",
    "Write a quicksort function in Python.",
]
TINY_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_mlx_folder(
    folder: Path, *, seed: int, texts: list[str] | None = None, vocab_size: int = 320
) -> Path:
    """A 2-layer, hidden-64 qwen2 model with random weights and a tokenizer trained here."""
    import json

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator((texts or TINY_MLX_TEXTS) * 20, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "bos_token": None,
                "add_bos_token": False,
                "chat_template": TINY_CHATML,
            }
        )
    )
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": tokenizer.get_vocab_size(),
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "eos_token_id": tokenizer.token_to_id("<|im_end|>"),
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))
    mx.random.seed(seed)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))  # type: ignore[no-untyped-call]
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return folder


@pytest.fixture(scope="session")
def tiny_mlx_main(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install '.[mlx-cpu]')")
    return write_tiny_mlx_folder(tmp_path_factory.mktemp("mlx") / "tiny-main", seed=0)


@pytest.fixture(scope="session")
def tiny_mlx_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install '.[mlx-cpu]')")
    return write_tiny_mlx_folder(tmp_path_factory.mktemp("mlx") / "tiny-draft", seed=1)


@pytest.fixture(scope="session")
def smollm_mlx(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M imported into an MLX folder (8-bit: close to the GGUF's own numbers)."""
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install '.[mlx-cpu]')")
    from backends.models.gguf_to_mlx import ImportProgress, import_gguf

    events: list[ImportProgress] = []
    folder = import_gguf(
        smollm_path, tmp_path_factory.mktemp("import") / "smollm", progress=events.append, bits=8
    )
    fractions = [event.fraction for event in events]
    assert fractions == sorted(fractions)
    assert events[-1].stage == "done"
    return folder


# --- a stand-in of the Hugging Face hub (tests/hub_standin.py) for the hub's tests ---------

SMOLLM_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
GATED_REPO = "meta-llama/Llama-Gated-GGUF"
MLX_REPO = "mlx-community/Qwen2.5-Coder-0.5B-Instruct-4bit"
TOKEN = "hf_standin_token"


@pytest.fixture
def standin(
    smollm_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[HubStandin]:
    """The hub with SmolLM2's GGUF, a gated copy of it, and an MLX repo."""
    with serve_hub(*small_repos(smollm_path, tmp_path)) as running:
        point_client_at(running, tmp_path / "hf-home", monkeypatch)
        yield running


def small_repos(smollm_path: Path, tmp_path: Path) -> list[HubRepo]:
    """SmolLM2's GGUF (and a README), a gated copy of it, an MLX repo with no weights."""
    readme = tmp_path / "README.md"
    readme.write_text("# a model\n")
    return [
        HubRepo(SMOLLM_REPO, {smollm_path.name: smollm_path, "README.md": readme}, downloads=500),
        HubRepo(
            GATED_REPO,
            {smollm_path.name: smollm_path},
            gated="manual",
            access_tokens=frozenset({TOKEN}),
            downloads=10,
        ),
        HubRepo(MLX_REPO, {"README.md": readme}, tags=("mlx",), library_name="mlx"),
    ]
