"""The MLX engine under the engine-neutral loop: exactness, rollback, sampling, errors, catalog."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install '.[mlx-cpu]')")

from backends.engines.interface import ChatMessage
from backends.engines.mlx import PREFILL_CHUNK, MlxEngine
from backends.engines.selection import open_engine
from backends.errors import EngineError, ModelFileError
from backends.models.catalog import compatible_drafts, read_catalog_model, scan_models
from backends.models.draft_verdict import draft_verdict
from backends.paths import MODELS_DIR_ENV
from backends.service.loaded_pair import open_pair
from backends.service.protocol import LoadRequest
from backends.speculation.drafters import DraftModelDrafter
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.ngram import NgramSimpleDrafter
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import GenerationSettings
from tests.conftest import user, write_tiny_mlx_folder

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from backends.models.gguf_info import ModelInfo

TINY_CONTEXT = 1024
GREEDY_TOKENS = 48


@pytest.fixture(scope="module")
def main_engine(tiny_mlx_main: Path) -> Iterator[MlxEngine]:
    with MlxEngine(tiny_mlx_main, n_ctx=TINY_CONTEXT) as engine:
        yield engine


@pytest.fixture(scope="module")
def draft_engine(tiny_mlx_draft: Path) -> Iterator[MlxEngine]:
    with MlxEngine(tiny_mlx_draft, n_ctx=TINY_CONTEXT, is_draft=True) as engine:
        yield engine


def run_from_empty(
    decoder: SpeculativeDecoder, engines: list[MlxEngine], prompt: list[int], settings: object
) -> list[int]:
    for engine in engines:
        engine.truncate(0)
    assert isinstance(settings, GenerationSettings)
    return decoder.run(prompt, settings).token_ids


def test_load_report_and_vocab(main_engine: MlxEngine) -> None:
    report = main_engine.load_report
    assert report.backend.startswith("MLX")
    assert report.n_layers == 2
    assert "layers on" in report.placement
    if report.backend == "MLX (CPU)":
        assert any("float32" in note for note in report.notes)
    vocab = main_engine.vocab
    assert vocab.eos_id is not None
    assert vocab.eos_id in vocab.end_of_generation_ids
    assert vocab.n_vocab == main_engine.info.vocab.size
    assert main_engine.exact_batch_limit is not None
    assert main_engine.exact_batch_limit >= 1


def test_placement_says_unified_memory_on_apple_silicon(main_engine: MlxEngine) -> None:
    report = main_engine.load_report
    assert report.unified_memory == (report.backend == "MLX (Metal)")
    on_metal = replace(
        report, backend="MLX (Metal)", gpu_layers=2, kv_cache_on_gpu=True, unified_memory=True
    )
    assert on_metal.placement == (
        "MLX (Metal): all 2 layers on GPU, KV cache on GPU (unified memory)"
    )


def test_rows_after_a_cache_only_prefill_equal_rows_of_one_batch(main_engine: MlxEngine) -> None:
    # The tokens before the rows asked for run without an output layer, in chunks of
    # PREFILL_CHUNK: the rows must be those of evaluating everything with logits.
    text = "def double(x):\n    return x * 2  # doubled\n"
    tokens = main_engine.tokenize(text * 60, add_special=False, parse_special=False)
    tokens = tokens[: PREFILL_CHUNK + 88]
    main_engine.truncate(0)
    last_only = main_engine.evaluate(tokens, 1).copy()
    assert last_only.shape == (1, main_engine.vocab.n_vocab)
    assert len(main_engine.cached_tokens) == len(tokens)
    main_engine.truncate(0)
    head = main_engine.evaluate(tokens[: PREFILL_CHUNK // 2], 1).copy()
    rest = main_engine.evaluate(tokens[PREFILL_CHUNK // 2 :], 88).copy()
    main_engine.truncate(0)
    assert np.allclose(last_only[0], rest[-1], rtol=0, atol=1e-4)
    assert int(np.argmax(last_only[0])) == int(np.argmax(rest[-1]))
    main_engine.truncate(0)
    whole_short = main_engine.evaluate(tokens[: PREFILL_CHUNK // 2], PREFILL_CHUNK // 2).copy()
    main_engine.truncate(0)
    assert np.allclose(head[0], whole_short[-1], rtol=0, atol=1e-4)


def test_tokenize_and_token_bytes_round_trip(main_engine: MlxEngine) -> None:
    text = "def add(a, b):\n    return a + b  # ünï\n"
    tokens = main_engine.tokenize(text, add_special=True, parse_special=False)
    assert main_engine.detokenize(tokens) == text
    marked = "<|im_start|>user"
    special = main_engine.tokenize(marked, add_special=False, parse_special=True)
    literal = main_engine.tokenize(marked, add_special=False, parse_special=False)
    assert len(special) < len(literal)
    assert main_engine.token_bytes(special[0]) == b""  # special tokens render as nothing
    prompt = main_engine.chat_prompt(user("hi"))
    assert prompt.endswith("<|im_start|>assistant\n")


def test_greedy_speculation_with_a_draft_model_is_plain_decoding(
    main_engine: MlxEngine, draft_engine: MlxEngine, tiny_mlx_main: Path
) -> None:
    prompt = main_engine.tokenize(
        main_engine.chat_prompt(user("Write a quicksort function in Python.")),
        add_special=True,
        parse_special=True,
    )
    settings = GenerationSettings(max_tokens=GREEDY_TOKENS, draft_max=4, p_min=0.0)
    plain = run_from_empty(SpeculativeDecoder(main_engine), [main_engine], prompt, settings)
    decoder = SpeculativeDecoder(main_engine, DraftModelDrafter(draft_engine, p_min=0.0))
    main_engine.truncate(0)
    draft_engine.truncate(0)
    result = decoder.run(prompt, settings)
    assert result.token_ids == plain
    stats = result.stats
    assert stats.total_draft_tokens_count > 0
    assert stats.rejected_draft_tokens_count > 0  # a different random model: real rejections
    assert stats.total_draft_tokens_count == (
        stats.accepted_draft_tokens_count
        + stats.rejected_draft_tokens_count
        + stats.ignored_draft_tokens_count
    )
    # The main model drafting for itself: every greedy draft token is accepted.
    with MlxEngine(tiny_mlx_main, n_ctx=TINY_CONTEXT, is_draft=True) as twin:
        self_draft = SpeculativeDecoder(main_engine, DraftModelDrafter(twin, p_min=0.0))
        main_engine.truncate(0)
        same = self_draft.run(prompt, settings)
    assert same.token_ids == plain
    assert same.stats.rejected_draft_tokens_count == 0
    assert same.stats.accepted_draft_tokens_count > 0


def test_greedy_speculation_with_ngram_and_auto_is_plain_decoding(main_engine: MlxEngine) -> None:
    prompt = main_engine.tokenize("for i in range(10):\n", add_special=True, parse_special=False)
    settings = GenerationSettings(max_tokens=GREEDY_TOKENS)
    plain = run_from_empty(SpeculativeDecoder(main_engine), [main_engine], prompt, settings)
    ngram = SpeculativeDecoder(main_engine, NgramSimpleDrafter())
    main_engine.truncate(0)
    result = ngram.run(prompt, settings)
    assert result.token_ids == plain
    assert result.stats.accepted_draft_tokens_count > 0  # random models repeat themselves
    auto = build_decoder("auto", main_engine)
    assert run_from_empty(auto, [main_engine], prompt, settings) == plain


def test_truncate_rolls_the_cache_back(main_engine: MlxEngine) -> None:
    text = "The quick brown fox jumps over"
    tokens = main_engine.tokenize(text, add_special=False, parse_special=False)
    assert len(tokens) >= 6
    main_engine.truncate(0)
    reference = main_engine.evaluate(tokens, len(tokens)).copy()
    assert list(main_engine.cached_tokens) == tokens
    main_engine.truncate(3)
    assert list(main_engine.cached_tokens) == tokens[:3]
    other = list(reversed(tokens[3:]))
    detour = main_engine.evaluate(other, len(other)).copy()
    assert not np.array_equal(detour, reference[3:])
    main_engine.truncate(3)
    again = main_engine.evaluate(tokens[3:], len(tokens) - 3)
    np.testing.assert_array_equal(again, reference[3:])
    # One row at a time after the rollback gives the rows one row at a time gives from an
    # empty cache: the rollback leaves nothing of the detour behind.
    main_engine.truncate(3)
    rows = [main_engine.evaluate([t], 1)[0].copy() for t in tokens[3:]]
    main_engine.truncate(0)
    main_engine.evaluate(tokens[:3], 3)
    fresh = [main_engine.evaluate([t], 1)[0].copy() for t in tokens[3:]]
    np.testing.assert_array_equal(np.stack(rows), np.stack(fresh))
    if (main_engine.exact_batch_limit or 1) >= len(tokens) - 3:  # and batched rows, if exact
        np.testing.assert_array_equal(np.stack(rows), reference[3:])
    main_engine.truncate(0)
    assert list(main_engine.cached_tokens) == []


def test_mlx_verifies_chains_only(main_engine: MlxEngine) -> None:
    assert not main_engine.exact_siblings
    with pytest.raises(EngineError, match="does not verify sibling branches"):
        main_engine.evaluate_with_sibling([1, 2], 2, 1, 3)


@pytest.mark.parametrize("verification", ["rejection", "sample-match"])
def test_sampling_runs_at_temperature(
    main_engine: MlxEngine, draft_engine: MlxEngine, verification: str
) -> None:
    prompt = main_engine.tokenize("def add(a, b):", add_special=True, parse_special=False)
    decoder = SpeculativeDecoder(main_engine, DraftModelDrafter(draft_engine, p_min=0.0))
    # Random weights sample an end-of-generation token now and then: the first seed whose
    # answer runs to max_tokens (each of ten ending early is all but impossible).
    for seed in range(7, 17):
        settings = GenerationSettings(
            max_tokens=32,
            sampling=SamplingSettings(temperature=0.8, seed=seed),
            p_min=0.0,
            verification=verification,  # type: ignore[arg-type]
        )
        main_engine.truncate(0)
        draft_engine.truncate(0)
        first = decoder.run(prompt, settings)
        if first.stats.stop_reason != "eos":
            break
    stats = first.stats
    assert (stats.stop_reason, stats.generated_tokens) == ("max_tokens", 32)
    assert stats.total_draft_tokens_count > 0
    assert stats.total_draft_tokens_count == (
        stats.accepted_draft_tokens_count
        + stats.rejected_draft_tokens_count
        + stats.ignored_draft_tokens_count
    )
    main_engine.truncate(0)
    draft_engine.truncate(0)
    assert decoder.run(prompt, settings).token_ids == first.token_ids  # seeded: reproducible


def test_missing_and_broken_folders_give_one_line_errors(
    tmp_path: Path, tiny_mlx_main: Path
) -> None:
    def error_of(path: Path) -> str:
        with pytest.raises(ModelFileError) as caught:
            open_engine("mlx", path, n_ctx=TINY_CONTEXT)
        message = str(caught.value)
        assert "\n" not in message
        return message

    assert "not found" in error_of(tmp_path / "nowhere")
    for missing, said in (
        ("config.json", "config.json"),
        ("model.safetensors", "safetensors"),
        ("tokenizer.json", "tokenizer"),
    ):
        broken = tmp_path / f"without-{missing}"
        shutil.copytree(tiny_mlx_main, broken)
        (broken / missing).unlink()
        assert said in error_of(broken)
    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_mlx_main, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert "truncated or corrupt" in error_of(truncated)
    garbage = tmp_path / "garbage"
    shutil.copytree(tiny_mlx_main, garbage)
    (garbage / "model.safetensors").write_bytes(b"\xff" * 64)
    assert "corrupt" in error_of(garbage)
    bad_config = tmp_path / "bad-config"
    shutil.copytree(tiny_mlx_main, bad_config)
    (bad_config / "config.json").write_text("{not json")
    assert "not valid JSON" in error_of(bad_config)


def test_catalog_lists_mlx_folders_and_checks_compatibility(
    tmp_path: Path, tiny_mlx_main: Path, tiny_mlx_draft: Path
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    (root / "main").symlink_to(tiny_mlx_main)
    (root / "draft").symlink_to(tiny_mlx_draft)
    other_texts = ["completely different words make another vocabulary", "zzz yyy xxx 42"]
    write_tiny_mlx_folder(root / "stranger", seed=2, texts=other_texts, vocab_size=300)
    (root / ".importing-partial").mkdir()  # an import in progress is never listed
    scan = scan_models([root])
    assert not scan.problems
    by_name = {info.path.name: info for info in scan.models}
    assert set(by_name) == {"main", "draft", "stranger"}
    main = by_name["main"]
    assert main.format == "mlx"
    assert main.architecture == "qwen2"
    assert main.n_layers == 2
    assert main.quantization == "F32"
    assert main.parameter_count > 0
    verdicts = {info.path.name: problem for info, problem in compatible_drafts(main, scan.models)}
    assert verdicts["draft"] is None
    assert verdicts["main"] is None
    assert verdicts["stranger"] is not None
    assert "incompatible pair" in verdicts["stranger"]
    assert read_catalog_model(tiny_mlx_main).vocab.fingerprint == main.vocab.fingerprint


def test_bench_cli_runs_on_mlx_folders(tiny_mlx_main: Path, tiny_mlx_draft: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "backends.service.bench",
            "--engine",
            "mlx",
            "--main",
            str(tiny_mlx_main),
            "--draft",
            str(tiny_mlx_draft),
            "--method",
            "draft-model",
            "--fixed-draft",  # the cost-aware planner may rightly choose not to draft on a CPU
            "--p-min",
            "0",
            "--max-tokens",
            "24",
            "--ctx",
            str(TINY_CONTEXT),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert report["identical"] is True
    assert report["load"]["backend"].startswith("MLX")
    assert report["speculative"]["total_draft_tokens_count"] > 0


def test_mlx_is_imported_only_when_the_engine_is_chosen() -> None:
    code = (
        "import sys\n"
        "import backends.service.bench, backends.models.catalog, backends.engines.selection\n"
        "import backends.service.engine_server\n"
        "import backends.engines.mlx, backends.models.gguf_to_mlx\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.heavy
def test_a_gguf_draft_for_an_mlx_main_is_imported_at_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, smollm_mlx: Path, smollm_path: Path
) -> None:
    mlx_main, gguf = read_catalog_model(smollm_mlx), read_catalog_model(smollm_path)
    # The same tokenizer in the other format: the GGUF to MLX import fixes it, and says so.
    verdict = draft_verdict(mlx_main, gguf)
    assert verdict.kind == "import first"
    assert verdict.reason.startswith("a GGUF file and the main model is an MLX folder: import")
    # The other way round nothing can: llama.cpp reads GGUF only.
    backwards = draft_verdict(gguf, mlx_main)
    assert backwards.kind == "incompatible"
    assert "llama.cpp reads GGUF only" in backwards.reason
    # Loading the pair imports the draft first (into the models folder), then loads both.
    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path / "models"))
    stages: list[tuple[float, str]] = []
    request = LoadRequest(
        str(smollm_mlx), str(smollm_path), engine="mlx", method="draft-model", n_ctx=TINY_CONTEXT
    )
    pair = open_pair(request, lambda fraction, what: stages.append((fraction, what)))
    try:
        assert pair.draft is not None
        assert pair.draft.load_report.backend.startswith("MLX")
        assert any(what.startswith("importing") for _, what in stages)
        fractions = [fraction for fraction, _ in stages]
        assert fractions == sorted(fractions)  # the import, then the loads: never backwards
        assert (tmp_path / "models" / "mlx" / smollm_path.stem).is_dir()
    finally:
        pair.close()


def test_the_tuner_ranks_mlx_setups_through_the_same_trials(
    main_engine: MlxEngine, tiny_mlx_draft: Path
) -> None:
    from backends.service.tuning import SetupTuner, TrialPrompt, candidate_setups

    @contextlib.contextmanager
    def open_draft(info: ModelInfo) -> Iterator[MlxEngine]:
        with MlxEngine(info.path, n_ctx=TINY_CONTEXT, is_draft=True) as draft:
            yield draft

    tuner = SetupTuner(main_engine, open_draft)
    prompts = [TrialPrompt("loop", (ChatMessage("user", "for i in range(10):"),))]
    setups = candidate_setups([read_catalog_model(tiny_mlx_draft)])
    outcome = tuner.run(setups, prompts, budget_seconds=60, max_tokens=24)
    rows = {row.label: row for row in outcome.rows}
    assert rows["plain"].measured
    drafted = [row for row in rows.values() if row.method == "draft-model"]
    assert len(drafted) == 1
    assert drafted[0].measured, drafted[0].skipped
    assert all(row.identical for row in rows.values() if row.measured)
