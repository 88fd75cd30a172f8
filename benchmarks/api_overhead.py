"""What the local API costs: the same prompt through ``specdeck serve`` and ``specdeck-bench``.

Round after round it runs ``specdeck-bench --json`` (auto, in its own process) and a fresh
``specdeck serve`` on a free port with the same pair (the default pair unless given),
warmed up as the bench warms up, answering one streamed chat request from the ``openai``
client; one after the other, so that they never share the CPU. The API's speed is
measured by the client: tokens after the first over the time from the first streamed
chunk to the last, the definition ``specdeck-bench`` uses for its own tok/s. Both answer
at temperature 0, so their texts must be identical.

    .venv/bin/python -m benchmarks.api_overhead [--rounds 3] [--max-tokens 160] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai

from backends.engines.hardware import physical_cores
from backends.engines.weight_placement import cpu_model_name
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
from benchmarks.vs_llama_cpp import PROMPTS, PeerPrompt, run_specdeck

SPECDECK = Path(sys.executable).with_name("specdeck")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_ready(port: int, server: subprocess.Popen[bytes], timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"specdeck serve exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as reply:
                if json.load(reply)["specdeck"]["unavailable"] is None:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("specdeck serve did not get ready")


def bench_run(args: argparse.Namespace, prompt: PeerPrompt) -> dict[str, Any]:
    """``specdeck-bench``'s speculative (auto) run of the prompt (the peer benchmark's call)."""
    with tempfile.TemporaryDirectory(prefix="specdeck-api-bench-") as folder:
        speculative: dict[str, Any] = run_specdeck(prompt, Path(folder), args)["speculative"]
    return {"tok_s": speculative["tokens_per_second"], "text": speculative["text"]}


def api_run(client: openai.OpenAI, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One streamed chat answer, timed by the client."""
    stamps: list[float] = []
    texts: list[str] = []
    tokens = 0
    server_tok_s = 0.0
    for chunk in client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    ):
        extra = chunk.model_extra or {}
        released = (extra.get("specdeck") or {}).get("tokens", [])
        if released:
            stamps.append(time.perf_counter())
            tokens += len(released)
            texts.extend(token["text"] for token in released)
        if "stats" in extra:
            server_tok_s = extra["stats"]["tokens_per_second"]
    # The first chunk holds the first token (and whatever its round drafted).
    first_chunk_tokens = 1
    elapsed = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    tok_s = (tokens - first_chunk_tokens) / elapsed if elapsed > 0 else 0.0
    return {"tok_s": tok_s, "server_tok_s": server_tok_s, "text": "".join(texts)}


def served_run(args: argparse.Namespace, prompt: str) -> dict[str, Any]:
    """A fresh ``specdeck serve`` (as the bench is a fresh process), warmed up alike, timed.

    ``specdeck-bench`` warms up with 8 tokens of the same prompt on the speculative decoder
    and then measures; so does this, so that ngram-mod (which remembers across answers)
    knows exactly as much in both.
    """
    port = free_port()
    server = subprocess.Popen(
        [str(SPECDECK), "serve", "--port", str(port), "--main", str(args.main)]
        + ["--draft", str(args.draft), "--threads", str(args.threads)],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(port, server)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
        api_run(client, prompt, 8)
        return api_run(client, prompt, args.max_tokens)
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    """Serve the pair, compare the API's streamed speed with specdeck-bench's, print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", type=Path, default=None, help="default: the default main")
    parser.add_argument("--draft", type=Path, default=None, help="default: the default draft")
    parser.add_argument("--prompt", default="new-function", help="a key of the peer prompts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.main = args.main or model_path(DEFAULT_MAIN_KEY)
    args.draft = args.draft or model_path(DEFAULT_DRAFT_KEY)
    prompts = {p.key: p for p in PROMPTS}
    if args.prompt not in prompts:
        parser.error(f"unknown prompt {args.prompt} (known: {', '.join(prompts)})")
    prompt = prompts[args.prompt]
    rounds = []
    for number in range(args.rounds):
        print(f"round {number + 1}", file=sys.stderr, flush=True)
        rounds.append({"bench": bench_run(args, prompt), "api": served_run(args, prompt.text)})
    bench = statistics.median(r["bench"]["tok_s"] for r in rounds)
    api = statistics.median(r["api"]["tok_s"] for r in rounds)
    identical = all(r["bench"]["text"] == r["api"]["text"] for r in rounds)
    result = {
        "machine": {"cpu": cpu_model_name(), "threads": args.threads},
        "prompt": args.prompt,
        "rounds": rounds,
        "bench_tok_s": bench,
        "api_tok_s": api,
        "api_over_bench": api / bench if bench else None,
        "identical": identical,
    }
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
        return
    print(
        f"{cpu_model_name()}, {args.threads} threads, prompt {args.prompt}, median of "
        f"{args.rounds} rounds: specdeck-bench auto {bench:.2f} tok/s, API streamed "
        f"{api:.2f} tok/s (client-timed), {api / bench:.3f}×; texts "
        + ("identical" if identical else "DIFFER")
    )


if __name__ == "__main__":
    main()
