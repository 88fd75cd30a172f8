"""SpecDeck's server against llama-server under a JSON schema: the same requests, timed alike.

``llama-server`` is built from the llama.cpp inside the pinned llama-cpp-python sdist
(:mod:`benchmarks.peer_llama_cpp`, cached). On one machine, at once: llama-server plain,
llama-server with the draft model (its default ``--spec-draft-n-max``), llama-server with
``--spec-type ngram-mod``, and ``specdeck serve`` (auto), all on the same pair and threads.
Each gets the structured-output benchmark's prompts (:mod:`benchmarks.structured_output`)
as ``/v1/chat/completions`` requests with ``response_format`` ``json_schema`` at
temperature 0, one request at a time, the servers in turn within each round (so a drift
of the machine falls on all alike), after one warm-up request each. Both servers keep a
prompt's cache between requests, so the time is mostly decoding.

It reports per prompt and server the median wall time of a request (as the client sees
it) and its tokens per second, the servers' own decoding speed (``timings``, which both
write as llama.cpp defines it), SpecDeck's speed over the fastest llama-server, and
whether each text is llama-server plain's.

    .venv/bin/python -m benchmarks.vs_llama_server [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.engines.hardware import physical_cores
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
from benchmarks.api_overhead import SPECDECK, free_port
from benchmarks.never_slower import machine_line
from benchmarks.peer_llama_cpp import build_tools
from benchmarks.structured_output import PROMPTS, SchemaPrompt

PLAIN = "llama-server plain"
DRAFT = "llama-server draft"
NGRAM = "llama-server ngram-mod"
OURS = "SpecDeck auto"
# The same server, asked with llama-server's whitespace: any between JSON tokens (SpecDeck's
# grammar writes compact JSON unless a schema asks otherwise), so the texts can be compared.
OURS_SPACED = "SpecDeck auto, JSON whitespace as llama-server's"
LLAMA_SERVERS = (PLAIN, DRAFT, NGRAM)
SPECDECK_RUNS = (OURS, OURS_SPACED)
FLEXIBLE_WHITESPACE = {"x-guidance": {"whitespace_flexible": True}}
READY_SECONDS = 600.0


@dataclass
class Server:
    """One running server: its name, process and port."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    schema_extra: dict[str, Any] = field(default_factory=dict)  # added to each schema

    def ready(self) -> None:
        """Wait until it answers ``/v1/models`` with a loaded model."""
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                status = self.process.returncode
                raise RuntimeError(f"{self.name} exited with status {status}; see {self.log}")
            try:
                url = f"http://127.0.0.1:{self.port}/v1/models"
                with urllib.request.urlopen(url, timeout=5) as reply:
                    models = json.load(reply)
                if models.get("data") and (models.get("specdeck") or {}).get("unavailable") is None:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not get ready; see {self.log}")

    def ask(self, prompt: SchemaPrompt, max_tokens: int) -> dict[str, Any]:
        """One request, timed by the client."""
        body = {
            "messages": [{"role": "user", "content": prompt.text}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "schema": {**prompt.schema, **self.schema_extra},
                    "strict": True,
                },
            },
            "temperature": 0,
            "max_tokens": max_tokens,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as reply:
            answer = json.load(reply)
        seconds = time.perf_counter() - started
        timings = answer.get("timings") or {}
        tokens = int(answer["usage"]["completion_tokens"])
        return {
            "seconds": seconds,
            "tokens": tokens,
            "tok_s": tokens / seconds,
            "decode_tok_s": float(timings.get("predicted_per_second") or 0.0),
            "prompt_tokens": int(answer["usage"]["prompt_tokens"]),
            "drafted": timings.get("draft_n"),
            "accepted": timings.get("draft_n_accepted"),
            "text": answer["choices"][0]["message"]["content"] or "",
        }


@dataclass
class Runs:
    """One server's requests for one prompt."""

    answers: list[dict[str, Any]] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(float(a[key]) for a in self.answers)


def llama_server_command(
    server: Path, name: str, port: int, main: Path, draft: Path, threads: int, n_ctx: int
) -> list[str]:
    """llama-server's (``server``) command line for ``name`` (plain, draft model, ngram-mod)."""
    command = [str(server), "-m", str(main), "--port", str(port), "--host", "127.0.0.1"]
    command += ["-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "-np", "1"]
    command += ["--jinja", "--no-webui", "-ngl", "0"]
    if name == DRAFT:
        command += ["--spec-type", "draft-simple", "-md", str(draft)]
        command += ["-td", str(threads), "-tbd", str(threads), "-ngld", "0"]
    elif name == NGRAM:
        command += ["--spec-type", "ngram-mod"]
    return command


def specdeck_command(port: int, main: Path, draft: Path, threads: int, n_ctx: int) -> list[str]:
    """``specdeck serve`` on the same pair (auto)."""
    return [str(SPECDECK), "serve", "--port", str(port), "--main", str(main)] + [
        "--draft",
        str(draft),
        "--threads",
        str(threads),
        "--ctx",
        str(n_ctx),
    ]


def start(name: str, command: list[str], port: int, logs: Path) -> Server:
    """Start one server, its output in a file of ``logs`` (named in its errors)."""
    log = logs / f"{name.replace(' ', '-')}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    return Server(name, process, port, log)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every server, every prompt, ``args.rounds`` rounds after a warm-up."""
    main = args.main or model_path(DEFAULT_MAIN_KEY)
    draft = args.draft or model_path(DEFAULT_DRAFT_KEY)
    chosen = [p for p in PROMPTS if p.key in args.prompts.split(",")]
    tools = build_tools(log=lambda line: print(line, file=sys.stderr))
    servers: list[Server] = []
    logs = Path(tempfile.mkdtemp(prefix="specdeck-vs-llama-server-"))
    try:
        for name in (*LLAMA_SERVERS, OURS):
            port = free_port()
            if name == OURS:
                command = specdeck_command(port, main, draft, args.threads, args.ctx)
            else:
                command = llama_server_command(
                    tools.server, name, port, main, draft, args.threads, args.ctx
                )
            servers.append(start(name, command, port, logs))
        for server in servers:
            server.ready()
        ours = servers[-1]
        servers.append(
            Server(OURS_SPACED, ours.process, ours.port, ours.log, dict(FLEXIBLE_WHITESPACE))
        )
        runs = {(p.key, s.name): Runs() for p in chosen for s in servers}
        for prompt in chosen:
            for server in servers:
                server.ask(prompt, args.max_tokens)  # warm-up: caches, first-call costs
        for round_index in range(args.rounds):
            order = servers[round_index % len(servers) :] + servers[: round_index % len(servers)]
            for prompt in chosen:
                for server in order:
                    runs[prompt.key, server.name].answers.append(
                        server.ask(prompt, args.max_tokens)
                    )
    finally:
        for server in servers:
            server.process.terminate()  # (the two SpecDeck runs share one process)
        for server in servers:
            try:
                server.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.process.kill()
    return summary(chosen, runs, args, tools.llama_cpp_python)


def summary(
    prompts: list[SchemaPrompt],
    runs: dict[tuple[str, str], Runs],
    args: argparse.Namespace,
    llama_cpp_python: str,
) -> dict[str, Any]:
    """Medians per prompt and server, and SpecDeck over the fastest llama-server."""
    results = []
    for prompt in prompts:
        plain_text = runs[prompt.key, PLAIN].answers[0]["text"]
        servers = {}
        for name in (*LLAMA_SERVERS, *SPECDECK_RUNS):
            server_runs = runs[prompt.key, name]
            servers[name] = {
                "seconds": round(server_runs.median("seconds"), 3),
                "tok_s": round(server_runs.median("tok_s"), 2),
                "decode_tok_s": round(server_runs.median("decode_tok_s"), 2),
                "tokens": server_runs.answers[0]["tokens"],
                "prompt_tokens": server_runs.answers[0]["prompt_tokens"],
                "drafted": server_runs.answers[0]["drafted"],
                "accepted": server_runs.answers[0]["accepted"],
                "every_seconds": [round(a["seconds"], 3) for a in server_runs.answers],
                "same_text_as_llama_plain": all(
                    a["text"] == plain_text for a in server_runs.answers
                ),
                "parses": all(_parses(a["text"]) for a in server_runs.answers),
                "text": server_runs.answers[0]["text"],
            }
        best = max(LLAMA_SERVERS, key=lambda name: servers[name]["tok_s"])
        results.append(
            {
                "prompt": prompt.key,
                "servers": servers,
                "fastest_llama_server": best,
                # The same request answered: SpecDeck's time against the fastest's.
                "specdeck_over_fastest": round(
                    servers[best]["seconds"] / servers[OURS]["seconds"], 3
                ),
                # The same text (llama-server's whitespace): tokens per second against.
                "spaced_over_fastest": round(
                    servers[OURS_SPACED]["tok_s"] / servers[best]["tok_s"], 3
                ),
                "spaced_over_llama_plain": round(
                    servers[OURS_SPACED]["tok_s"] / servers[PLAIN]["tok_s"], 3
                ),
            }
        )
    return {
        "machine": machine_line(args.threads),
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "llama_cpp": llama_cpp_python,
        "prompts": results,
    }


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def format_table(report: dict[str, Any]) -> str:
    """The report as Markdown: one row per prompt and server."""
    rows = [
        f"{report['machine']}; llama.cpp of llama-cpp-python {report['llama_cpp']}; "
        f"median of {report['rounds']} rounds",
        "",
        "| prompt | server | request (s) | tok/s (client) | decoding tok/s (server) "
        "| tokens | drafted / accepted | text = llama-server plain's |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in report["prompts"]:
        for name, server in result["servers"].items():
            drafts = f"{server['drafted']} / {server['accepted']}" if server["drafted"] else "–"
            rows.append(
                f"| {result['prompt']} | {name} | {server['seconds']:.2f} | {server['tok_s']:.2f} "
                f"| {server['decode_tok_s']:.2f} | {server['tokens']} | {drafts} "
                f"| {'yes' if server['same_text_as_llama_plain'] else 'no'} |"
            )
    rows.append("")
    for result in report["prompts"]:
        rows.append(
            f"- {result['prompt']}: the same request answered "
            f"{result['specdeck_over_fastest']:.2f}× as fast as the fastest llama-server "
            f"({result['fastest_llama_server']}); with its "
            f"whitespace, {result['spaced_over_fastest']:.2f}× its tokens per second and "
            f"{result['spaced_over_llama_plain']:.2f}× llama-server plain's"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vs_llama_server")
    parser.add_argument("--main", type=Path, default=None, help="default: the default pair's")
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--prompts", default=",".join(p.key for p in PROMPTS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    report = run(args)
    print(json.dumps(report, indent=1) if args.json else format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
