"""GGUF → MLX import: tensor layout, tokenizer, and the imported model against llama.cpp's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install '.[mlx-cpu]')")

from backends.engines.interface import ChatMessage
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.mlx import MlxEngine
from backends.models.catalog import read_catalog_model
from backends.models.compat import compatibility_problem
from backends.models.gguf_to_mlx import (
    hf_tensor_name,
    import_gguf,
    mlx_folder_for,
    unpermute_rows,
)
from backends.models.provision import SMALL_TEST_KEY, ensure_model
from backends.paths import MODELS_DIR_ENV
from backends.service.models_cli import main as specdeck_models
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.ngram import NgramSimpleDrafter
from backends.speculation.types import GenerationSettings
from tests.conftest import TEST_CONTEXT, user
from tests.prestarted import Command

if TYPE_CHECKING:
    from collections.abc import Iterator

    from backends.engines.interface import ModelEngine

# Measured: SmolLM2-135M Q4_1 imported at 8 bits agrees with llama.cpp on 47 of 49 greedy
# next tokens (teacher-forced); at 4 bits (quantized twice) on 41 of 49. The imported
# Qwen2.5-Coder-0.5B (4-bit) agreed on 49 of 49 and wrote the same 48-token answer.
SMOLLM_TOP1_FLOOR = 0.9
DEAD_PID = 4_194_305  # above Linux's largest pid_max: no process has it
QWEN_TOP1_FLOOR = 0.95
COMPARE_TOKENS = 48
TOKENIZER_TEXTS = (
    "Hello world! 12345 numbers, ünïcödé 日本語 <|im_start|>user\n  def f(x):\n\treturn x**2",
    "  spaces   and\n\n\nnewlines's they'll   \t tabs",
)


def briefly(text: str) -> list[ChatMessage]:
    """A user message after a short system prompt: on MLX's CPU backend a row of Qwen2.5 0.5B
    takes about 0.6 s (Intel Xeon, 2 cores), and Qwen's own system prompt is 13 tokens more."""
    return [ChatMessage("system", "Be brief."), *user(text)]


def permute_like_llama_cpp(weights: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    return (
        weights.reshape(n_heads, 2, weights.shape[0] // n_heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def test_unpermute_undoes_llama_cpp_permutation() -> None:
    weights = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)
    for heads in (1, 2, 3):
        restored = unpermute_rows(permute_like_llama_cpp(weights, heads), heads)
        np.testing.assert_array_equal(restored, weights)
    bias = np.arange(12, dtype=np.float32)
    np.testing.assert_array_equal(unpermute_rows(permute_like_llama_cpp(bias, 3), 3), bias)


def test_tensor_names_map_to_hugging_face() -> None:
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("blk.7.attn_q.bias") == "model.layers.7.self_attn.q_proj.bias"
    assert hf_tensor_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_tensor_name("rope_freqs.weight") is None


def greedy_agreement(reference: ModelEngine, other: ModelEngine, prompt: list[int]) -> float:
    """Share of steps where other's argmax equals reference's, along reference's greedy text."""
    settings = GenerationSettings(max_tokens=COMPARE_TOKENS)
    reference.truncate(0)
    text = SpeculativeDecoder(reference).run(prompt, settings).token_ids
    reference.truncate(0)
    other.truncate(0)
    agree = int(
        np.argmax(reference.evaluate(prompt, 1)[0]) == np.argmax(other.evaluate(prompt, 1)[0])
    )
    for token in text[:-1]:
        agree += int(
            np.argmax(reference.evaluate([token], 1)[0]) == np.argmax(other.evaluate([token], 1)[0])
        )
    reference.truncate(0)
    other.truncate(0)
    return agree / len(text)


def assert_same_tokenizer(gguf_engine: ModelEngine, mlx_engine: MlxEngine) -> None:
    for text in TOKENIZER_TEXTS:
        for special in (True, False):
            expected = gguf_engine.tokenize(text, add_special=True, parse_special=special)
            assert mlx_engine.tokenize(text, add_special=True, parse_special=special) == expected
            assert [mlx_engine.token_bytes(t) for t in expected] == [
                gguf_engine.token_bytes(t) for t in expected
            ]
    messages = user("Write a Python function that reverses a string.")
    assert mlx_engine.chat_prompt(messages) == gguf_engine.chat_prompt(messages)


@pytest.mark.heavy
def test_smollm_import_matches_llama_cpp(
    smollm_mlx: Path, smollm_path: Path, smollm_target: LlamaEngine
) -> None:
    gguf_info, mlx_info = read_catalog_model(smollm_path), read_catalog_model(smollm_mlx)
    assert mlx_info.format == "mlx"
    assert mlx_info.quantization == "MLX 8-bit"
    assert mlx_info.vocab.fingerprint == gguf_info.vocab.fingerprint
    assert compatibility_problem(gguf_info, mlx_info) is None
    # Not the exact-batch probe (20 s on MLX's CPU backend, AMD EPYC Zen 4, 2 cores): this
    # compares one token at a time.
    with MlxEngine(smollm_mlx, n_ctx=TEST_CONTEXT, probe_exact_batch=False) as engine:
        assert_same_tokenizer(smollm_target, engine)
        assert engine.vocab.end_of_generation_ids >= {smollm_target.vocab.eos_id}
        prompt = SpeculativeDecoder(engine).prompt_tokens(
            user("Write a Python function that reverses a string.")
        )
        # Not bitwise: llama.cpp multiplies Q4_1 weights with Q8 activations, MLX 8-bit
        # weights (from the bf16 dequantized ones) with float32 ones; near-ties differ.
        assert greedy_agreement(smollm_target, engine, prompt) >= SMOLLM_TOP1_FLOOR


def test_import_cli_refuses_unsupported_architectures(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = specdeck_models(["import-mlx", str(gemma_path), "--out", str(tmp_path / "g")])
    assert status == 1
    error = capsys.readouterr().err
    assert "gemma3" in error
    assert "not supported" in error
    assert error.count("\n") == 1
    assert not (tmp_path / "g").exists()


def test_import_cli_refuses_to_overwrite(
    smollm_mlx: Path, smollm_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = specdeck_models(["import-mlx", str(smollm_path), "--out", str(smollm_mlx)])
    assert status == 1
    assert "exists already" in capsys.readouterr().err


@pytest.mark.heavy
def test_concurrent_imports_of_one_model_both_succeed(smollm_path: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    target = mlx_folder_for(smollm_path, models)
    target.parent.mkdir(parents=True)
    abandoned = target.parent / f".importing-{target.name}.{DEAD_PID}"
    (abandoned / "hf").mkdir(parents=True)  # left by an import that was killed
    code = (
        "import sys; from pathlib import Path\n"
        "from backends.models.gguf_to_mlx import ensure_mlx_import\n"
        "print(ensure_mlx_import(Path(sys.argv[1]), None, Path(sys.argv[2])))\n"
    )
    imports = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(smollm_path), str(models)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for process in imports:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
        assert out.strip() == str(target)
    assert read_catalog_model(target).format == "mlx"
    assert sorted(path.name for path in target.parent.iterdir()) == [target.name]


@pytest.fixture(scope="session")
def qwen_draft_mlx(qwen_draft_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return import_gguf(qwen_draft_path, tmp_path_factory.mktemp("import") / "qwen-0.5b")


@pytest.fixture(scope="session")
def qwen_mlx_main(qwen_draft_mlx: Path) -> Iterator[MlxEngine]:
    # Without the exact-batch probe (77 s on MLX's CPU backend, AMD EPYC (without AMX), 2
    # cores; the probe is tested in test_mlx_engine.py): a whole draft is verified in one
    # batch, so the speculation test below checks batched rows against plain decoding.
    with MlxEngine(qwen_draft_mlx, n_ctx=TEST_CONTEXT, probe_exact_batch=False) as main:
        yield main


@pytest.mark.default_pair
def test_imported_qwen_matches_llama_cpp(qwen_mlx_main: MlxEngine, qwen_draft_path: Path) -> None:
    main = qwen_mlx_main
    assert (
        compatibility_problem(read_catalog_model(qwen_draft_path), read_catalog_model(main.path))
        is None
    )
    with LlamaEngine(qwen_draft_path, LlamaLoadSettings(n_ctx=TEST_CONTEXT)) as reference:
        assert_same_tokenizer(reference, main)
        prompt = SpeculativeDecoder(main).prompt_tokens(
            briefly("Write a Python function that reverses a string.")
        )
        assert greedy_agreement(reference, main, prompt) >= QWEN_TOP1_FLOOR


@pytest.mark.default_pair
def test_imported_qwen_greedy_speculation_is_plain_decoding(
    qwen_mlx_main: MlxEngine,
) -> None:
    main = qwen_mlx_main
    # Drafted by a lookup in the prompt, which the answer copies: on MLX's CPU backend every
    # row costs about as much as a step (0.3-0.45 s for this model, AMD EPYC (without AMX),
    # 2 cores), so a draft model drafting at a step a token doubled the test's time.
    prompt = SpeculativeDecoder(main).prompt_tokens(
        briefly("Repeat exactly: def add_one(x): return x + 1")
    )
    settings = GenerationSettings(max_tokens=20)
    main.truncate(0)
    plain = SpeculativeDecoder(main).run(prompt, settings)
    # The prompt stays in the cache: the speculative run reads it again from the last token.
    speculative = SpeculativeDecoder(main, NgramSimpleDrafter()).run(prompt, settings)
    assert speculative.token_ids == plain.token_ids
    assert speculative.stats.accepted_draft_tokens_count > 0
    assert main.exact_batch_limit is None  # not probed: nothing split the batches
    assert max(speculative.stats.verify_batch_counts) > 2
    assert "def add_one" in plain.text


def first_use_command(scratch: Path) -> Command:
    """The bench on MLX with a GGUF pair and an empty models folder (``scratch``): it imports
    the GGUF on first use. MLX's CPU backend computes on one thread, so the bench's 45 s run
    in the background beside the other tests (:mod:`tests.prestarted`)."""
    smollm = str(ensure_model(SMALL_TEST_KEY))
    args = [sys.executable, "-m", "backends.service.bench", "--engine", "mlx", "--json"]
    args += ["--main", smollm, "--draft", smollm, "--method", "draft-model"]
    args += ["--fixed-draft", "--p-min", "0", "--max-tokens", "16", "--ctx", "1024"]
    args += ["--system", "Be brief."]  # 13 prompt tokens fewer than SmolLM2's own, read 3 times
    return Command(args, env={**os.environ, MODELS_DIR_ENV: str(scratch / "models")})


@pytest.mark.heavy
@pytest.mark.prestarted(command_of=first_use_command)
def test_bench_imports_a_gguf_on_first_use_and_reuses_it(
    prestarted: subprocess.CompletedProcess[str], prestarted_command: Command, smollm_path: Path
) -> None:
    stdout, stderr = prestarted.stdout, prestarted.stderr
    assert prestarted.returncode == 0, stderr
    assert prestarted_command.env is not None
    models = Path(prestarted_command.env[MODELS_DIR_ENV])
    folder = models / "mlx" / smollm_path.stem
    assert read_catalog_model(folder).format == "mlx"
    # One import with a progress bar for the main model; the draft (same file) reuses it.
    assert stderr.count("100% done:") == 1, stderr
    report = json.loads(stdout)
    assert report["load"]["backend"].startswith("MLX")
    assert report["identical"] is True
    assert report["speculative"]["accepted_draft_tokens_count"] > 0
