"""Speculation against plain decoding with the main model on llama.cpp RPC workers, by latency.

Starts two ``specdeck worker`` processes on 127.0.0.1 (one thread each), puts a delaying
relay (:mod:`benchmarks.latency_relay`) in front of each, and for every round-trip time
loads the main model entirely onto the two workers (split 1,1,0) with the draft on this
machine. Then, in one load and interleaved prompt by prompt, plain decoding, the draft
model alone (k = 3, llama.cpp's default) and auto (whose planner calibrated its batch
costs through the workers at load), at temperature 0; one table: tok/s, speedup over plain,
acceptance, mean draft length per round, and whether the text is identical.

    .venv/bin/python -m benchmarks.rpc_latency [--rtt 0,2,10] [--max-tokens 64]
        [--main M.gguf] [--draft D.gguf] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from backends.engines.interface import ChatMessage
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.weight_placement import cpu_model_name
from backends.engines.worker_probe import WorkerAddress, wait_for_worker
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
from backends.service.suite_prompts import SUITE_PROMPTS, SuitePrompt
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.planner import CostCache
from backends.speculation.types import GenerationSettings
from benchmarks.latency_relay import LatencyRelay

CONTEXT = 2048
WORKER_PORTS = (50352, 50353)
PROMPT_KEYS = ("quicksort", "type-hints", "prose")
METHODS = ("plain", "draft-model", "auto")


def _mean_draft_length(stats: object) -> float:
    counts: dict[int, int] = getattr(stats, "draft_length_counts", {})
    rounds = sum(counts.values())
    return sum(length * n for length, n in counts.items()) / rounds if rounds else 0.0


def main(argv: list[str] | None = None) -> int:
    """Run every latency and print the table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rpc_latency")
    parser.add_argument("--rtt", default="0,2,10", help="round trips in ms, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--main", type=Path, default=None)
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1, help="threads here (the draft)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    main_path = args.main or model_path(DEFAULT_MAIN_KEY)
    draft_path = args.draft or model_path(DEFAULT_DRAFT_KEY)
    round_trips = [float(part) for part in args.rtt.split(",") if part.strip()]
    prompts = [p for p in SUITE_PROMPTS if p.key in PROMPT_KEYS]
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "backends.service.worker_cli", "--port", str(port)]
            + ["--threads", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in WORKER_PORTS
    ]
    rows: list[dict[str, object]] = []
    try:
        for port in WORKER_PORTS:
            status = wait_for_worker(WorkerAddress("127.0.0.1", port), 30)
            if not status.reachable:
                raise SystemExit(f"worker on port {port}: {status.problem}")
        draft = LlamaEngine(
            draft_path, LlamaLoadSettings(n_ctx=CONTEXT, n_threads=args.threads), is_draft=True
        )
        for rtt in round_trips:
            relays = [LatencyRelay(("127.0.0.1", port), rtt).start() for port in WORKER_PORTS]
            try:
                settings = LlamaLoadSettings(
                    n_ctx=CONTEXT,
                    n_threads=args.threads,
                    workers=tuple(f"127.0.0.1:{relay.port}" for relay in relays),
                    layer_split=(1.0, 1.0, 0.0),
                )
                with LlamaEngine(main_path, settings) as main_model:
                    rows += _measure(main_model, draft, prompts, rtt, args.max_tokens)
                    placement = main_model.load_report.placement
                print(f"rtt {rtt:g} ms: {placement}", file=sys.stderr, flush=True)
            finally:
                for relay in relays:
                    relay.stop()
        draft.close()
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    machine = f"{cpu_model_name()}, main model on 2 loopback workers (1 thread each)"
    if args.json:
        print(json.dumps({"machine": machine, "rows": rows}))
        return 0
    print(f"{machine}; draft here, {args.threads} thread(s); temperature 0")
    header = f"{'rtt':>6} {'method':12}{'tok/s':>7}{'speedup':>9}{'accepted':>10}"
    print(f"{header}{'draft/rnd':>10}  same")
    for row in rows:
        print(
            f"{row['rtt_ms']:>4g}ms {row['method']:12}{row['tok_s']:>7.2f}"
            f"{row['speedup']:>8.2f}×{row['acceptance']:>10}{row['draft_per_round']:>10.2f}"
            f"  {row['identical']}"
        )
    return 0


def _measure(
    main_model: LlamaEngine,
    draft: LlamaEngine,
    prompts: list[SuitePrompt],
    rtt: float,
    max_tokens: int,
) -> list[dict[str, object]]:
    costs = CostCache()
    decoders = {
        "plain": SpeculativeDecoder(main_model),
        "draft-model": build_decoder(
            "draft-model", main_model, draft, adaptive=False, cost_cache=costs
        ),
        "auto": build_decoder("auto", main_model, draft, adaptive=True, cost_cache=costs),
    }
    decoders["auto"].prepare()
    speeds: dict[str, list[float]] = {m: [] for m in METHODS}
    accepted: dict[str, list[int]] = {m: [0, 0] for m in METHODS}
    lengths: dict[str, list[float]] = {m: [] for m in METHODS}
    same = {m: True for m in METHODS}
    for prompt in prompts:
        settings = replace(GenerationSettings(), max_tokens=max_tokens)
        tokens = decoders["plain"].prompt_tokens([ChatMessage("user", prompt.text)])
        texts: dict[str, list[int]] = {}
        for method in METHODS:
            main_model.truncate(0)
            draft.truncate(0)
            result = decoders[method].run(tokens, settings)
            speeds[method].append(result.stats.tokens_per_second)
            accepted[method][0] += result.stats.accepted_draft_tokens_count
            accepted[method][1] += result.stats.total_draft_tokens_count
            lengths[method].append(_mean_draft_length(result.stats))
            texts[method] = list(result.token_ids)
        for method in METHODS:
            same[method] = same[method] and texts[method] == texts["plain"]
    plain_speed = statistics.geometric_mean(speeds["plain"])
    rows = []
    for method in METHODS:
        speed = statistics.geometric_mean(speeds[method])
        hits, total = accepted[method]
        rows.append(
            {
                "rtt_ms": rtt,
                "method": method,
                "tok_s": speed,
                "speedup": speed / plain_speed,
                "acceptance": f"{100 * hits / total:.0f} %" if total else "–",
                "draft_per_round": statistics.mean(lengths[method]),
                "identical": "yes" if same[method] else "NO",
            }
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
