"""Which CPU matmul kernels keep verification batches bit-exact, and what each costs.

A batch of k tokens is "exact" when its logits equal, bit for bit, what k single-token
steps compute: only then is greedy speculative output plain decoding. In stock llama.cpp
(llama-cpp-python 0.3.36) two kernel switches on the CPU break that:

- repacked weights (``weight repacking on``, llama.cpp's default): ``repack.cpp`` runs
  groups of 4 batch rows through the Q4_K GEMM kernel and the rest through the GEMV kernel
  of a single step; the GEMM adds each 64-value part of a superblock into its float
  accumulator while the GEMV sums the whole superblock in integers first, so batches of 4
  and more round differently;
- the K-quant matmuls of plain weights (Q2_K..Q6_K, IQ types; with repacking on, the
  Q6_K ones) switch from ``vec_dot`` to ``ggml-cpu/tiled/tiled.cpp`` at 8 batch rows
  (``ggml_tiled_min_batch``), so batches of 8 and more round differently.
  ``GGML_CPU_TILED_MM=0`` (read once per process) turns the tiled kernel off.

SpecDeck's build (``packaging/llama.cpp/exact-batches.patch``) makes the GEMM sum like the
GEMV, and adds ``GGML_CPU_TILED_MM_MIN_ROWS`` (SpecDeck sets 64): below it, batches take
the single-step kernels, from it on (prompt reading) the tiled one. Its own CPU kernels
(``fast-kernels.patch``, AVX-512 and AVX2) then make those batches cheap: rows against repacked
Q4_K and Q4_0 weights, and columns against Q6_K ones, take kernels that share each weight
load between the rows while computing every row as llama.cpp's single step does, and
matmuls of fewer than 64 rows hand each thread a few contiguous chunks of weight rows;
``GGML_CPU_SPECDECK_KERNELS=0`` turns both off. ``logit_digest`` (SHA-256 of the logits of
batches 1 .. ``--probe``) shows that a configuration computes the same numbers as another.

Each configuration loads the model in its own process (the variables are read once) and
reports the exact limit (batches probed up to ``--probe``), decode tok/s, prompt tok/s and
the cost of batches of 1..24 tokens. "stock" configurations load llama.cpp's own shared
libraries from the peer benchmark's build (``benchmarks/peer_llama_cpp.py``) through
llama-cpp-python's ``LLAMA_CPP_LIB_PATH``; they are left out until that build exists.

    .venv/bin/python -m benchmarks.exact_batches [--model FILE] [--rounds 1] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from backends.engines.interface import probe_exact_batch_limit
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.weight_placement import WeightRepacking, cpu_model_name
from backends.models.provision import DEFAULT_MAIN_KEY, model_path
from benchmarks.peer_llama_cpp import stock_library_folder

ROOT = Path(__file__).resolve().parents[1]

STOCK = "stock"  # stands for the stock libraries' folder in a configuration's variables
CONFIGURATIONS: dict[str, tuple[WeightRepacking, dict[str, str]]] = {
    "SpecDeck, repacking on (default)": ("on", {}),
    "SpecDeck, repacking off": ("off", {}),
    "SpecDeck, repacking on, tiled from 8 rows": ("on", {"GGML_CPU_TILED_MM_MIN_ROWS": "8"}),
    "SpecDeck, repacking on, its kernels off": ("on", {"GGML_CPU_SPECDECK_KERNELS": "0"}),
    "stock, repacking on": ("on", {"LLAMA_CPP_LIB_PATH": STOCK}),
    "stock, repacking off": ("off", {"LLAMA_CPP_LIB_PATH": STOCK}),
    "stock, repacking off, tiled off": (
        "off",
        {"LLAMA_CPP_LIB_PATH": STOCK, "GGML_CPU_TILED_MM": "0"},
    ),
}
BATCH_SIZES = (1, 2, 3, 4, 7, 8, 12, 16, 24)
TEXT = "def merge(left, right):\n    result = []\n    while left and right:\n"


def measure_here(
    model: Path, repacking: WeightRepacking, probe: int, timing: bool = True
) -> dict[str, Any]:
    """The figures for one load in this process (exactness and the digest without ``timing``)."""
    settings = LlamaLoadSettings(n_ctx=2048, weight_repacking=repacking, probe_exact_batch=False)
    with LlamaEngine(model, settings) as engine:
        limit = probe_exact_batch_limit(engine, probe, probe)
        if not timing:
            return {
                "exact_batch_limit": limit,
                "all_probed_exact": limit == probe,
                "logit_digest": logit_digest(engine, probe),
            }
        words = engine.tokenize(TEXT * 64, add_special=False, parse_special=False)
        prompt = words[:300]
        reads = []
        for _ in range(2):
            engine.truncate(0)
            began = time.perf_counter()
            engine.evaluate(prompt, 1)
            reads.append(time.perf_counter() - began)
        batch_ms = batch_costs(engine, words, len(prompt), BATCH_SIZES)
        decode = decode_rate(engine, words, 40)
    return {
        "exact_batch_limit": limit,
        "all_probed_exact": limit == probe,
        "decode_tok_s": round(decode, 2),
        "prompt_tok_s": round(len(prompt) / min(reads), 1),
        "batch_ms": batch_ms,
    }


def logit_digest(engine: LlamaEngine, largest: int) -> str:
    """SHA-256 of the logits of batches of 1 .. ``largest`` tokens after one start token."""
    words = engine.tokenize(TEXT * 8, add_special=False, parse_special=False)
    digest = hashlib.sha256()
    engine.truncate(0)
    engine.evaluate(words[:1], 1)
    for size in range(1, largest + 1):
        engine.truncate(1)
        for row in engine.evaluate(words[1 : 1 + size], size):
            digest.update(row.tobytes())
    engine.truncate(0)
    return digest.hexdigest()


def batch_costs(
    engine: LlamaEngine, words: list[int], cached: int, sizes: tuple[int, ...]
) -> dict[str, float]:
    """Median milliseconds (of 3) of a batch of each size after ``cached`` tokens of ``words``."""
    costs: dict[str, float] = {}
    for size in sizes:
        samples = []
        for _ in range(3):
            engine.truncate(cached)
            began = time.perf_counter()
            engine.evaluate(words[cached : cached + size], size)
            samples.append(time.perf_counter() - began)
        costs[str(size)] = round(1000 * statistics.median(samples), 1)
    return costs


def decode_rate(engine: LlamaEngine, words: list[int], steps: int) -> float:
    """Greedy single-token steps per second after an 8-token prompt (the cache is reset)."""
    engine.truncate(0)
    rows = engine.evaluate(words[:8], 1)
    began = time.perf_counter()
    for _ in range(steps):
        rows = engine.evaluate([int(rows[0].argmax())], 1)
    return steps / (time.perf_counter() - began)


def run_child(
    model: Path,
    repacking: WeightRepacking,
    probe: int,
    variables: dict[str, str],
    *,
    exactness_only: bool = False,
) -> dict[str, Any]:
    """:func:`measure_here` in a fresh process with ``variables`` set (ggml reads them once)."""
    command = [sys.executable, "-m", "benchmarks.exact_batches", "--child", repacking]
    command += ["--model", str(model), "--probe", str(probe)]
    if exactness_only:
        command.append("--exactness-only")
    done = subprocess.run(
        command, env={**os.environ, **variables}, cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the measuring process failed (exit {done.returncode}): {tail}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure_in_child(model: Path, name: str, probe: int, stock: Path | None) -> dict[str, Any]:
    """One configuration, ``stock`` standing in for the stock libraries' folder."""
    repacking, variables = CONFIGURATIONS[name]
    variables = {k: str(stock) if v == STOCK else v for k, v in variables.items()}
    return run_child(model, repacking, probe, variables)


def main() -> None:
    """Every configuration, alternated over rounds; a table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the default main")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--probe", type=int, default=25, help="largest batch probed for exactness")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--exactness-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model is None:
        args.model = model_path(DEFAULT_MAIN_KEY)
    if args.child:
        print(json.dumps(measure_here(args.model, args.child, args.probe, not args.exactness_only)))
        return
    stock = stock_library_folder()
    names = [n for n in CONFIGURATIONS if stock is not None or not n.startswith(STOCK)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in names:
            runs[name].append(measure_in_child(args.model, name, args.probe, stock))
    if args.json:
        print(
            json.dumps({"cpu": cpu_model_name(), "model": args.model.name, "runs": runs}, indent=2)
        )
        return
    print(f"{args.model.name} on {cpu_model_name()}")
    sizes = " / ".join(str(s) for s in BATCH_SIZES)
    header = f"batch ms, median of the rounds ({sizes})"
    print(f"| configuration | exact up to | decode tok/s | prompt tok/s | {header} |")
    print("|---|---|---|---|---|")
    for name, samples in runs.items():
        limit = samples[0]["exact_batch_limit"]
        exact = f"all probed ({limit})" if samples[0]["all_probed_exact"] else str(limit)
        decode = " / ".join(f"{s['decode_tok_s']:.1f}" for s in samples)
        prompt = " / ".join(f"{s['prompt_tok_s']:.0f}" for s in samples)
        costs = " / ".join(
            f"{statistics.median(sample['batch_ms'][str(s)] for sample in samples):.0f}"
            for s in BATCH_SIZES
        )
        print(f"| {name} | {exact} | {decode} | {prompt} | {costs} |")


if __name__ == "__main__":
    main()
