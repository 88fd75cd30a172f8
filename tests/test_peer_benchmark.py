"""The peer benchmark's plumbing and the kernel finding behind exact batches.

The llama.cpp tools take ten minutes to build, so the runner is tested against stand-in
executables that print what the real tools printed (recorded from llama.cpp 0.3.36's
``llama-completion`` and ``llama-speculative-simple``) and exit as told; the benchmark run
itself is the test of the real tools. The kernel finding is tested on the real 1.5B.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from backends.engines.draft_weights import drafting_file
from backends.engines.llama_native import requantize_q4_0
from backends.models.gguf_info import read_model_info
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.planner import BatchCosts
from backends.speculation.types import GenerationSettings
from benchmarks import vs_llama_server as bench
from benchmarks.draft_model_auto import ModeledClock
from benchmarks.exact_batches import run_child
from benchmarks.peer_llama_cpp import (
    PeerTools,
    cmake_options,
    common_arguments,
    run_completion,
    run_speculative,
)
from benchmarks.structured_output import PROMPTS as SCHEMA_PROMPTS
from benchmarks.vs_llama_cpp import LLAMA_METHODS, PROMPTS, SPECDECK, PeerPrompt, _summarise, table
from tests.conftest import user

if TYPE_CHECKING:
    from backends.engines.llama import LlamaEngine
    from backends.engines.weight_placement import WeightRepacking

ROOT = Path(__file__).resolve().parents[1]
CPU_FLAGS = (
    next(
        (
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        ),
        "",
    )
    if Path("/proc/cpuinfo").exists()
    else ""
)

COMPLETION_LOG = """\
0.00.671.282 I generate: n_ctx = 2048, n_batch = 2048, n_predict = 40, n_keep = 0
0.04.101.609 I common_perf_print: prompt eval time =     225.79 ms /    13 tokens (   17.37 ms \
per token,    57.58 tokens per second)
0.04.101.616 I common_perf_print:        eval time =    3181.22 ms /    39 runs   (   81.57 ms \
per token,    12.26 tokens per second)
"""

SPECULATIVE_LOG = """\
0.06.075.577 I encoded   13 tokens in    0.301 seconds, speed:   43.174 t/s
0.06.075.590 I decoded   44 tokens in    4.523 seconds, speed:    9.728 t/s
0.06.075.601 I n_draft   = 3
0.06.075.606 I n_predict = 44
0.06.075.611 I n_drafted = 38
0.06.075.617 I n_accept  = 31
0.06.075.622 I accept    = 81.579%
0.06.075.734 I common_perf_print: prompt eval time =    3330.43 ms /    65 tokens (   51.24 ms \
per token,    19.52 tokens per second)
"""

PROMPT_TEXT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def stand_in(folder: Path, name: str, stdout: str, stderr: str, status: int = 0) -> Path:
    """An executable that records its arguments and prints what a llama.cpp tool printed."""
    (folder / f"{name}.out").write_text(stdout, encoding="utf-8")
    (folder / f"{name}.err").write_text(stderr, encoding="utf-8")
    script = folder / name
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > "{folder}/{name}.args"\n'
        f'cat "{folder}/{name}.out"\ncat "{folder}/{name}.err" >&2\nexit {status}\n',
        encoding="utf-8",
    )
    script.chmod(0o755)
    return script


def tools_in(completion: Path, speculative: Path) -> PeerTools:
    return PeerTools(
        completion, speculative, completion.with_name("llama-server"), "0.3.36", "test"
    )


def test_completion_run_reads_decode_speed_and_text(tmp_path: Path) -> None:
    tool = stand_in(tmp_path, "llama-completion", "Hello!\n``` [end of text]\n\n", COMPLETION_LOG)
    common = common_arguments(tmp_path / "m.gguf", tmp_path / "p.txt", 40, 2, 2048)
    run = run_completion(tools_in(tool, tool), common)
    assert run.text == "Hello!\n```"  # without the tool's end-of-generation mark
    assert run.tokens_per_second == pytest.approx(12.26)  # the eval line, not the prompt's
    assert run.tokens == 40  # 39 runs after the prompt's pass, which gave the first
    assert run.acceptance is None
    arguments = (tmp_path / "llama-completion.args").read_text(encoding="utf-8").split("\n")
    assert arguments[arguments.index("--temp") : arguments.index("--temp") + 2] == ["--temp", "0"]
    assert "-no-cnv" in arguments
    assert "--no-display-prompt" in arguments
    assert arguments[arguments.index("-t") + 1] == "2"


def test_speculative_run_reads_acceptance_and_strips_the_echoed_prompt(tmp_path: Path) -> None:
    tool = stand_in(tmp_path, "spec", f"\n\n{PROMPT_TEXT}Hello there!\n\n", SPECULATIVE_LOG)
    common = common_arguments(tmp_path / "m.gguf", tmp_path / "p.txt", 40, 2, 2048)
    draft = tmp_path / "d.gguf"
    run = run_speculative(tools_in(tool, tool), common, "draft-simple", PROMPT_TEXT, draft)
    assert run.text == "Hello there!"
    assert run.tokens == 44
    assert run.tokens_per_second == pytest.approx(9.728)
    assert (run.drafted, run.accepted, run.draft_max) == (38, 31, 3)  # not n_drafted for n_draft
    assert run.acceptance == pytest.approx(31 / 38)
    arguments = (tmp_path / "spec.args").read_text(encoding="utf-8").split("\n")
    assert arguments[arguments.index("--spec-type") + 1] == "draft-simple"
    assert arguments[arguments.index("-md") + 1] == str(draft)
    assert arguments[arguments.index("-td") + 1] == "2"  # the draft gets the same threads


def test_a_failing_tool_is_one_line_naming_it(tmp_path: Path) -> None:
    tool = stand_in(tmp_path, "spec", "", "loading\nfailed to initialize speculative decoding", 1)
    common = common_arguments(tmp_path / "m.gguf", tmp_path / "p.txt", 40, 2, 2048)
    with pytest.raises(RuntimeError, match=r"ngram-mod failed \(exit 1\).*failed to initialize"):
        run_speculative(tools_in(tool, tool), common, "ngram-mod", PROMPT_TEXT)


def test_a_tool_that_prints_no_speed_is_an_error(tmp_path: Path) -> None:
    tool = stand_in(tmp_path, "llama-completion", "Hello!", "no timings here\n")
    common = common_arguments(tmp_path / "m.gguf", tmp_path / "p.txt", 40, 2, 2048)
    with pytest.raises(RuntimeError, match="no eval time"):
        run_completion(tools_in(tool, tool), common)


def test_the_build_compiles_amx_out_on_x86(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    options = cmake_options()
    assert "-DGGML_NATIVE=ON" in options
    assert any("-mno-amx-int8" in o for o in options if o.startswith("-DCMAKE_CXX_FLAGS="))
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert not any("amx" in o for o in cmake_options())


def sample(tok_s: float, acceptance: float | None = None, text: str = "same") -> dict[str, Any]:
    return {"tok_s": tok_s, "tokens": 100, "acceptance": acceptance, "draft_max": 3, "text": text}


def ours(plain: float, auto: float, identical: bool = True) -> dict[str, Any]:
    return {
        "plain_tok_s": plain,
        "tok_s": auto,
        "tokens": 100,
        "acceptance": 0.5,
        "identical": identical,
        "exact_batch_limit": 3,
        "rounds_by_method": {"none": 3},
        "text": "same",
    }


def test_summary_takes_medians_and_compares_with_the_fastest_llama_cpp() -> None:
    by_method: dict[str, list[dict[str, Any]]] = {
        "llama.cpp plain": [sample(10.0), sample(12.0), sample(11.0)],
        "llama.cpp draft": [sample(8.0, 0.8)] * 3,
        "llama.cpp ngram-simple": [sample(13.2, 0.4)] * 3,
        "llama.cpp ngram-mod": [sample(9.0)] * 3,
        SPECDECK: [ours(11.0, 16.5), ours(12.0, 18.0), ours(10.0, 15.0)],
    }
    summary = _summarise(PeerPrompt("x", "edit", "x"), by_method)
    assert summary["methods"]["llama.cpp plain"]["tok_s"] == 11.0
    assert summary["methods"]["llama.cpp ngram-simple"]["ratio"] == pytest.approx(1.2)
    assert summary["specdeck"]["ratio"] == pytest.approx(1.5)
    assert summary["specdeck"]["best_llama_cpp"] == "llama.cpp ngram-simple"
    assert summary["specdeck"]["vs_best_llama_cpp"] == pytest.approx(16.5 / 13.2, abs=1e-3)
    assert summary["specdeck"]["same_text_as_llama_cpp"]
    rendered = table({"prompts": {"x": summary}})
    assert "| x (edit) | 11.00 tok/s | 0.73× (80 %), k=3 | 1.20× (40 %) |" in rendered
    assert "1.25× (ngram-simple) |" in rendered
    by_method[SPECDECK] = [ours(11.0, 16.5, identical=False)]
    assert "TEXT DIFFERS" in table({"prompts": {"x": _summarise(PROMPTS[0], by_method)}})
    assert set(LLAMA_METHODS) <= set(summary["methods"])


@pytest.mark.parametrize("benchmark", ["benchmarks.vs_llama_cpp", "benchmarks.draft_model_auto"])
def test_unknown_prompt_is_refused_in_one_line(benchmark: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", benchmark, "--prompts", "haiku"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown prompt haiku (known: new-function, prose, docstrings, refactor)" in done.stderr


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="scripts/setup installs the patched build; elsewhere a stock build is fine",
)
def test_the_installed_llama_cpp_python_carries_the_current_patch() -> None:
    pin = re.search(r'"llama-cpp-python==([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin is not None
    patches = b"".join(
        p.read_bytes() for p in sorted((ROOT / "packaging/llama.cpp").glob("*.patch"))
    )
    digest = hashlib.sha256(patches).hexdigest()[:10]
    if digest.isdigit():
        digest = f"p{digest}"  # as build-wheel does, so that PEP 440 keeps it a string
    installed = version("llama-cpp-python")
    assert installed == f"{pin.group(1)}+specdeck.{digest}", (
        f"llama-cpp-python {installed} is not SpecDeck's patched build: run scripts/setup"
    )


needs_x86_tiled = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or " avx2" not in CPU_FLAGS,
    reason="the patched repack GEMM and the tiled matmul are x86 AVX2/AVX-512 kernels",
)


@pytest.fixture(scope="module")
def qwen_main_repacked(qwen_main_path: Path) -> dict[str, Any]:
    """The 1.5B loaded as by default (repacking on) in a child: exactness to 17, logit digest."""
    return run_child(qwen_main_path, "on", 17, {}, exactness_only=True)


@needs_x86_tiled
@pytest.mark.default_pair
def test_every_verification_batch_is_exact_with_repacked_weights(
    qwen_main_repacked: dict[str, Any],
) -> None:
    # Issue 14: with SpecDeck's build the default load (weights repacked) reproduces single
    # steps bit for bit for every probed batch (stock llama.cpp: up to 3 tokens).
    result = qwen_main_repacked
    assert (result["exact_batch_limit"], result["all_probed_exact"]) == (17, True)


@needs_x86_tiled
@pytest.mark.default_pair
def test_the_small_batch_kernels_compute_what_llama_cpps_own_compute(
    qwen_main_path: Path,
    qwen_draft_path: Path,
    qwen_main_repacked: dict[str, Any],
) -> None:
    # Where the CPU has them (AVX2, AVX-512), batches of fewer than 64 rows take SpecDeck's kernels
    # (repacked Q4_K and Q4_0 rows, Q6_K columns) and contiguous weight chunks per thread:
    # every logit of every batch, single steps included, is the one llama.cpp's own paths
    # give. The main model has the Q4_K and Q6_K weights, the draft's copy the Q4_0 ones.
    # The Q4_0 copy the draft drafts with, as the draft engine keeps it (made once per cache).
    draft_copy, _ = drafting_file(
        read_model_info(qwen_draft_path), "q4_0", on_gpu=False, requantize=requantize_q4_0
    )
    stock_paths = {"GGML_CPU_SPECDECK_KERNELS": "0"}
    for model in (qwen_main_path, draft_copy):
        kernels = (
            qwen_main_repacked
            if model == qwen_main_path
            else run_child(model, "on", 17, {}, exactness_only=True)
        )
        llama_cpps = run_child(model, "on", 17, stock_paths, exactness_only=True)
        assert kernels["logit_digest"] == llama_cpps["logit_digest"], model.name
        assert kernels["all_probed_exact"], model.name
        assert llama_cpps["all_probed_exact"], model.name


@needs_x86_tiled
@pytest.mark.default_pair
def test_the_tiled_matmul_from_8_rows_is_what_breaks_bigger_batches(qwen_main_path: Path) -> None:
    # llama.cpp's own threshold back: the Q6_K matmuls turn tiled at 8 rows and batches of 8
    # no longer reproduce single steps; with repacking off too (its Q4_K ones as well).
    repackings: tuple[WeightRepacking, ...] = ("on", "off")
    for repacking in repackings:
        variables = {"GGML_CPU_TILED_MM_MIN_ROWS": "8"}
        result = run_child(qwen_main_path, repacking, 12, variables, exactness_only=True)
        assert (result["exact_batch_limit"], result["all_probed_exact"]) == (7, False), repacking


def test_a_failing_measuring_process_is_one_line_with_its_cause(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(RuntimeError, match=r"measuring process failed \(exit 1\).*no-such-model"):
        run_child(missing, "on", 4, {}, exactness_only=True)


def test_modeled_clock_charges_each_pass_at_its_batch_cost(smollm_target: LlamaEngine) -> None:
    """The benchmark's noise-free clock: a plain run costs its prompt pass and a step a token."""
    costs = BatchCosts({1: 0.010, 8: 0.030})
    clock = ModeledClock()
    clock.watch(smollm_target, costs)
    try:
        decoder = SpeculativeDecoder(smollm_target)
        prompt = decoder.prompt_tokens(user("Count from one to five."))
        settings = GenerationSettings(max_tokens=6)
        result, seconds = clock.run(decoder, (smollm_target,), prompt, settings)
        assert len(result.token_ids) == 6
        # The prompt in one pass (extrapolated per token past 8), then one pass per token
        # after the first (the last token is never evaluated).
        assert seconds == pytest.approx(costs.cost(len(prompt)) + 5 * 0.010)
        smollm_target.truncate(0)
        smollm_target.evaluate(prompt[:3], 1)  # outside a run: not charged
        assert clock.seconds == pytest.approx(seconds)
    finally:
        del smollm_target.evaluate  # the instance attribute: back to the class's method


def _server_answer(seconds: float, tokens: int, text: str) -> dict[str, Any]:
    return {
        "seconds": seconds,
        "tokens": tokens,
        "tok_s": tokens / seconds,
        "decode_tok_s": tokens / seconds,
        "prompt_tokens": 40,
        "drafted": None,
        "accepted": None,
        "text": text,
    }


def test_the_llama_server_comparison_takes_the_fastest_and_says_which_texts_match() -> None:

    prompt = SCHEMA_PROMPTS[1]
    spaced, compact = '{\n  "a": 1\n}', '{"a":1}'
    seconds = {bench.PLAIN: 4.0, bench.DRAFT: 6.0, bench.NGRAM: 2.0, bench.OURS: 1.0}
    seconds[bench.OURS_SPACED] = 1.6
    runs = {}
    for name, time_taken in seconds.items():
        text = compact if name == bench.OURS else spaced
        tokens = 10 if name == bench.OURS else 20
        runs[prompt.key, name] = bench.Runs(
            [_server_answer(time_taken * factor, tokens, text) for factor in (1.1, 1.0, 0.9)]
        )
    args = argparse.Namespace(threads=2, rounds=3, max_tokens=64)
    report = bench.summary([prompt], runs, args, "0.3.36")
    result = report["prompts"][0]
    assert result["fastest_llama_server"] == bench.NGRAM
    assert result["specdeck_over_fastest"] == 2.0  # 2.0 s against 1.0 s for the same request
    assert result["spaced_over_fastest"] == 1.25  # 12.5 tok/s against 10
    assert result["spaced_over_llama_plain"] == 2.5
    servers = result["servers"]
    assert servers[bench.OURS]["same_text_as_llama_plain"] is False
    assert servers[bench.OURS_SPACED]["same_text_as_llama_plain"] is True
    assert all(server["parses"] for server in servers.values())
    table = bench.format_table(report)
    assert "| function-call | SpecDeck auto | 1.00 | 10.00 |" in table
    assert "answered 2.00× as fast as the fastest llama-server (llama-server ngram-mod)" in table
