"""`specdeck-bench` as a user runs it: a real subprocess, JSON output, one-line errors."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from backends.engines.hardware import LlamaBuildInfo
from backends.engines.load_guard import CRASH_AT_ENV, CRASH_RECORDS_FILE
from backends.engines.weight_placement import cpu_flags
from backends.models.provision import SMALL_TEST_KEY, ensure_model
from backends.paths import DATA_DIR_ENV
from backends.speculation.estimates import CALIBRATION_SIZES, DRAFT_CALIBRATION_SIZES
from tests.prestarted import Command

if TYPE_CHECKING:
    from pathlib import Path

BENCH = [sys.executable, "-m", "backends.service.bench"]


def run_bench(
    *args: str | Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BENCH, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )


def test_json_output_on_self_speculation(smollm_path: Path) -> None:
    done = run_bench(
        "--main",
        smollm_path,
        "--draft",
        smollm_path,
        "--max-tokens",
        "40",
        "--draft-max",
        "4",
        "--method",
        "draft-model",
        "--fixed-draft",
        "--draft-weights",
        "stored",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    # The draft drafts with its own weights, not a Q4_0 copy.
    assert not any(note.startswith("draft requantized") for note in data["load"]["notes"])
    assert set(data) >= {"baseline", "speculative", "speedup", "identical"}
    for run in ("baseline", "speculative"):
        assert set(data[run]) >= {
            "text",
            "tokens",
            "tokens_per_second",
            "time_to_first_token_sec",
            "stop_reason",
        }
        assert data[run]["tokens_per_second"] > 0
    spec = data["speculative"]
    assert spec["total_draft_tokens_count"] == (
        spec["accepted_draft_tokens_count"]
        + spec["rejected_draft_tokens_count"]
        + spec["ignored_draft_tokens_count"]
    )
    assert 0.0 <= spec["acceptance_rate"] <= 1.0
    assert data["identical"] is True
    assert data["baseline"]["text"] == spec["text"]
    assert data["speedup"] == pytest.approx(
        spec["tokens_per_second"] / data["baseline"]["tokens_per_second"]
    )


def test_json_says_how_sure_auto_s_costs_are_and_how_the_answer_moved_them(
    smollm_path: Path,
) -> None:
    done = run_bench("--main", smollm_path, "--draft", smollm_path, "--max-tokens", "32", "--json")
    assert done.returncode == 0, done.stderr
    load = json.loads(done.stdout)["load"]
    sureness, ceiling = load["calibration"]
    assert sureness.startswith("auto's batch costs: median of 3 interleaved rounds, within ±")
    assert ceiling.startswith("at best on this CPU: ")
    assert "with the smollm2" in ceiling.lower()
    assert ceiling.endswith("every drafted token accepted")
    at_load, after = load["batch_costs_ms"]["at_load"], load["batch_costs_ms"]["after"]
    assert set(at_load) == set(after) == {"main", "draft"}
    assert list(at_load["main"]) == [str(size) for size in CALIBRATION_SIZES]
    assert list(at_load["draft"]) == [str(size) for size in DRAFT_CALIBRATION_SIZES]
    assert all(ms > 0 for table in at_load.values() for ms in table.values())
    # The answer's own passes refined the estimates the load calibrated.
    assert after["main"] != at_load["main"]


def test_table_output_and_sampling(smollm_path: Path, tmp_path: Path) -> None:
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("Write a haiku about autumn.", encoding="utf-8")
    done = run_bench(
        "--main",
        smollm_path,
        "--draft",
        smollm_path,
        "--prompt-file",
        prompt_file,
        "--max-tokens",
        "24",
        "--temperature",
        "0.7",
        "--seed",
        "4",
    )
    assert done.returncode == 0, done.stderr
    assert "speedup:" in done.stdout
    assert "draft tokens:" in done.stdout
    assert "acceptance by draft position" in done.stdout
    # No identity verdict with sampling.
    assert "identical text" not in done.stdout


def test_sampled_json_has_null_identical(smollm_path: Path) -> None:
    done = run_bench(
        "--main",
        smollm_path,
        "--draft",
        smollm_path,
        "--max-tokens",
        "16",
        "--temperature",
        "0.9",
        "--seed",
        "1",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["identical"] is None
    # By default a draft on the CPU drafts with its Q4_0 copy, and the report says so.
    assert any(note.startswith("draft requantized to Q4_0") for note in data["load"]["notes"])


# What SpecDeck's own CPU kernels need at least (packaging/llama.cpp/fast-kernels.patch: AVX2
# builds, and AVX-512 ones where the CPU has it).
KERNEL_FLAGS = {"avx2", "fma", "f16c"}


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64" or not cpu_flags() >= KERNEL_FLAGS,
    reason="SpecDeck's CPU kernels are AVX2 and AVX-512 kernels in its x86 Linux build",
)
@pytest.mark.heavy
def test_the_load_report_names_specdeck_s_cpu_kernels_and_the_switch_turns_them_off(
    smollm_path: Path,
) -> None:
    arguments = ("--main", smollm_path, "--draft", smollm_path, "--max-tokens", "4", "--json")
    on = run_bench(*arguments)
    assert on.returncode == 0, on.stderr
    notes = json.loads(on.stdout)["load"]["notes"]
    kernels = [note for note in notes if note.startswith("SpecDeck's CPU kernels")]
    assert kernels == [
        "SpecDeck's CPU kernels for Q4_K, Q4_0, Q6_K weights: llama.cpp's numbers, "
        "single steps and verification batches in fewer instructions"
    ]
    off = run_bench(*arguments, env={"GGML_CPU_SPECDECK_KERNELS": "0"})
    assert off.returncode == 0, off.stderr
    notes = json.loads(off.stdout)["load"]["notes"]
    assert not any("SpecDeck's CPU kernels" in note for note in notes)


def test_the_cpu_backend_s_feature_line_says_which_kernels_it_has() -> None:
    features = "CPU : AVX2 = 1 | AVX512 = 1 | SPECDECK_KERNELS = Q4_K Q4_0 Q6_K | OPENMP = 1 |"
    assert LlamaBuildInfo("CPU", False, (), features).specdeck_kernels == ("Q4_K", "Q4_0", "Q6_K")
    assert LlamaBuildInfo("CPU", False, (), "CPU : AVX2 = 1 | OPENMP = 1 |").specdeck_kernels == ()


def assert_one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("specdeck-bench: error:"), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_missing_model_file(tmp_path: Path, smollm_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    assert_one_line_error(run_bench("--main", missing, "--draft", smollm_path), "nope.gguf")


def test_not_a_gguf_file(tmp_path: Path, smollm_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_text("this is not a model\n" * 10)
    assert_one_line_error(run_bench("--main", fake, "--draft", smollm_path), "fake.gguf")


def test_truncated_gguf_file(tmp_path: Path, smollm_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    data = smollm_path.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_bench("--main", smollm_path, "--draft", cut), "cut.gguf")


def test_incompatible_pair(gemma_path: Path, smollm_path: Path) -> None:
    assert_one_line_error(
        run_bench("--main", gemma_path, "--draft", smollm_path), "incompatible pair"
    )


def test_prompt_longer_than_context(smollm_path: Path) -> None:
    done = run_bench(
        "--main", smollm_path, "--draft", smollm_path, "--ctx", "256", "--prompt", "word " * 1000
    )
    assert_one_line_error(done, "context holds 256")


def test_a_pair_beyond_the_free_memory_is_refused_before_loading(smollm_path: Path) -> None:
    # A context of 50M tokens needs a KV cache far beyond this machine's memory: the pair
    # service's one line, as the window's engine process says it, before any load.
    done = run_bench("--main", smollm_path, "--draft", smollm_path, "--ctx", "50000000")
    assert_one_line_error(done, "not enough memory: the models need about", "smaller context")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--draft-max", "0"), "draft_max"),
        (("--temperature", "-1"), "temperature"),
        (("--max-tokens", "0"), "max_tokens"),
        (("--top-p", "0"), "top_p"),
        (("--ctx", "0"), "context size must be at least 256 tokens, got 0"),
        (("--method", "turbo"), "unknown speculation method 'turbo'"),
        (("--suite", "--suite-prompts", "nope"), "unknown suite prompt nope"),
        (("--lookup-draft-max", "0"), "lookup_draft_max"),
    ],
)
def test_impossible_settings(smollm_path: Path, args: tuple[str, ...], needle: str) -> None:
    assert_one_line_error(run_bench("--main", smollm_path, "--draft", smollm_path, *args), needle)


def suite_command(_scratch: Path) -> Command:
    """The suite on the small model's type-hints prompt, at most 96 tokens (its answer has
    256: the lookups copy by then), as JSON; 30 s of bench, run in the background from the
    session's start (:mod:`tests.prestarted`)."""
    smollm = str(ensure_model(SMALL_TEST_KEY))
    args = ["--main", smollm, "--draft", smollm, "--suite", "--suite-prompts", "type-hints"]
    return Command([*BENCH, *args, "--max-tokens", "96", "--json"])


@pytest.mark.heavy
@pytest.mark.prestarted(command_of=suite_command)
def test_suite_table_and_json(
    prestarted: subprocess.CompletedProcess[str], smollm_path: Path
) -> None:
    """The suite on the small model: every method on the chosen prompts, in one table."""
    assert prestarted.returncode == 0, prestarted.stderr
    data = json.loads(prestarted.stdout)
    runs = data["runs"]
    from backends.service.bench_suite import SUITE_METHODS

    assert [run["method"] for run in runs] == [label for label, *_ in SUITE_METHODS]
    assert {run["prompt"] for run in runs} == {"type-hints"}
    plain = runs[0]
    assert plain["speedup"] == 1.0
    assert plain["generated_tokens"] == 96  # the whole file is longer: the cap ended it
    for run, (_label, _method, _adaptive, exact) in zip(runs, SUITE_METHODS, strict=True):
        assert run["tokens_per_second"] > 0
        assert run["generated_tokens"] <= 96
        if exact:  # bit-exact verification: identical to plain decoding, always
            assert run["identical"] is True, run["method"]
            assert run["text"] == plain["text"]
    lookups = [run for run in runs if run["method"].startswith("ngram")]
    assert any(run["accepted_draft_tokens_count"] > 0 for run in lookups)

    common = ("--main", smollm_path, "--draft", smollm_path, "--suite")
    table = run_bench(*common, "--suite-prompts", "quicksort", "--max-tokens", "32", timeout=600)
    assert table.returncode == 0, table.stderr
    assert "draft lengths" in table.stdout
    assert "auto, fast" in table.stdout


def _crashing(tmp_path: Path, crash_at: str | None) -> dict[str, str]:
    env = {DATA_DIR_ENV: str(tmp_path / "data")}
    if crash_at is not None:
        env[CRASH_AT_ENV] = crash_at
    return env


@pytest.mark.heavy
def test_a_crash_while_loading_is_retried_once_with_the_safest_settings(
    smollm_path: Path, tmp_path: Path
) -> None:
    args = ("--main", smollm_path, "--draft", smollm_path, "--max-tokens", "16", "--json")
    done = run_bench(*args, env=_crashing(tmp_path, "main-probe:unless-safe"))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, done.stderr  # the crash, then the retry saying how it loads
    assert lines[1].startswith("specdeck-bench: safest settings: SmolLM2-135M")
    assert lines[0].startswith("specdeck-bench: the engine crashed while running the main")
    assert "(SmolLM2-135M-Instruct.Q4_1.gguf; weight repacking auto" in lines[0]
    assert lines[0].endswith(
        "retrying once with the safest settings (no weight repacking, "
        "no GPU offload of the main model, default threads)"
    )
    load = json.loads(done.stdout)["load"]
    assert any(note.startswith("safest settings") for note in load["notes"])
    assert any(note.startswith("weight repacking off") for note in load["notes"])
    # The next run remembers: safest settings at once, no crash, said in one line.
    again = run_bench(*args, env=_crashing(tmp_path, "main-probe:unless-safe"))
    assert again.returncode == 0, again.stderr
    assert [line for line in again.stderr.splitlines() if line.strip()] == [
        "specdeck-bench: " + load["notes"][0]
    ]


def test_a_crash_with_the_safest_settings_too_exits_3_then_refuses(
    smollm_path: Path, tmp_path: Path
) -> None:
    args = ("--main", smollm_path, "--draft", smollm_path, "--max-tokens", "8")
    done = run_bench(*args, env=_crashing(tmp_path, "main-model"))
    assert done.returncode == 3
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 3, done.stderr
    assert "retrying once with the safest settings" in lines[0]
    assert lines[1].startswith("specdeck-bench: safest settings: SmolLM2-135M")
    assert lines[2].startswith("specdeck-bench: error: the engine crashed while loading the main")
    assert lines[2].endswith("nothing safer is left to try")
    assert_one_line_error(
        run_bench(*args, env=_crashing(tmp_path, None)), "will not load it again by itself"
    )


@pytest.mark.heavy
def test_a_crash_while_calibrating_is_a_load_crash_too(smollm_path: Path, tmp_path: Path) -> None:
    """auto measures its batch costs at load (as the window's engine process does)."""
    args = ("--main", smollm_path, "--draft", smollm_path, "--max-tokens", "8", "--json")
    done = run_bench(*args, env=_crashing(tmp_path, "calibration:unless-safe"))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith("specdeck-bench: the engine crashed while measuring batch costs")
    assert lines[0].endswith(
        "retrying once with the safest settings (no weight repacking, "
        "no GPU offload of the main model, default threads)"
    )
    assert lines[1].startswith("specdeck-bench: safest settings: SmolLM2-135M")
    assert any(
        note.startswith("safest settings") for note in json.loads(done.stdout)["load"]["notes"]
    )


def test_a_crash_after_loading_is_one_line_and_exit_3(smollm_path: Path, tmp_path: Path) -> None:
    args = ("--main", smollm_path, "--draft", smollm_path, "--max-tokens", "8")
    done = run_bench(*args, env=_crashing(tmp_path, "loaded"))
    assert done.returncode == 3
    assert_one_line_error(done, "the engine crashed (SIGSEGV) after loading")
    assert not (tmp_path / "data" / CRASH_RECORDS_FILE).exists()


def test_the_suite_is_capped_only_where_max_tokens_is_given() -> None:
    from backends.service.bench import DEFAULT_BENCH_MAX_TOKENS, build_parser
    from backends.service.generation_options import generation_options_from_args

    parser = build_parser()
    for given in (["--max-tokens", "32"], ["--max-tokens=32"], ["--max-tok", "32"]):
        args = parser.parse_args(["--suite", *given])
        assert args.max_tokens == 32, given  # the suite caps each prompt at 32
        assert generation_options_from_args(args)["max_tokens"] == 32
    args = parser.parse_args(["--suite", "--main", "m.gguf", "--json"])
    assert args.max_tokens is None  # each suite prompt keeps its own length
    assert generation_options_from_args(args)["max_tokens"] == DEFAULT_BENCH_MAX_TOKENS
