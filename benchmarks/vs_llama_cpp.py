"""SpecDeck against llama.cpp's own tools: same prompts, template, threads and models, interleaved.

For each prompt and round it runs, in an order that rotates from round to round so that
machine noise hits every method alike:

- ``llama-completion``: llama.cpp's plain decoding (its baseline);
- ``llama-speculative-simple --spec-type draft-simple -md DRAFT``: llama.cpp's draft-model
  speculation with its default draft length (``n_draft`` in the table);
- ``llama-speculative-simple --spec-type ngram-simple`` and ``ngram-mod``: its draft-free
  lookups;
- ``specdeck-bench --json``: SpecDeck's plain decoding and its default method (auto, exact
  verification) on the same loaded model, in one call.

All at temperature 0, on the prompt rendered by the main model's chat template (the
llama.cpp tools get the rendered text, ``specdeck-bench`` the user message, which it
renders with the same template), with the same thread count. The llama.cpp tools are built from the
llama.cpp inside the pinned llama-cpp-python sdist (:mod:`benchmarks.peer_llama_cpp`, cached).
Speeds are decoding speeds after the prompt, as each tool reports them; llama.cpp's ratios
are against ``llama-completion``, SpecDeck's against its own plain run, and the last column
is SpecDeck auto against the fastest llama.cpp configuration on that prompt. "identical"
says whether SpecDeck's speculative text equals its plain text (it must, at temperature 0).

    .venv/bin/python -m benchmarks.vs_llama_cpp [--rounds 1] [--max-tokens 160] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.engines.hardware import physical_cores
from backends.engines.interface import ChatMessage
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.weight_placement import cpu_model_name
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
from benchmarks.peer_llama_cpp import (
    PeerRun,
    PeerTools,
    build_tools,
    common_arguments,
    run_completion,
    run_speculative,
)

_CSV_MODULE = """\
import csv
from collections import defaultdict


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def parse_amount(text):
    cleaned = text.replace(",", "").strip()
    if not cleaned:
        return 0.0
    return float(cleaned)


def totals_by_category(rows):
    totals = defaultdict(float)
    for row in rows:
        totals[row["category"]] += parse_amount(row["amount"])
    return dict(totals)


def largest_category(totals):
    if not totals:
        return None
    return max(totals, key=totals.get)


def write_summary(totals, path):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["category", "total"])
        for name in sorted(totals):
            writer.writerow([name, f"{totals[name]:.2f}"])
"""

_QUEUE_CLASS = """\
class TaskQueue:
    def __init__(self):
        self.l = []
        self.n = 0

    def add(self, t, p=0):
        self.l.append((p, self.n, t))
        self.n += 1
        self.l.sort(reverse=True)

    def take(self):
        if not self.l:
            return None
        p, n, t = self.l.pop(0)
        return t

    def size(self):
        return len(self.l)

    def clear(self):
        self.l = []
"""


@dataclass(frozen=True)
class PeerPrompt:
    """A prompt of the comparison and the kind of work it is."""

    key: str
    kind: str  # "edit", "new code" or "prose": the targets differ by kind
    text: str


PROMPTS = (
    PeerPrompt(
        "new-function",
        "new code",
        "Write a Python function that returns the n-th Fibonacci number using iteration, "
        "with a short docstring.",
    ),
    PeerPrompt(
        "prose",
        "prose",
        "In three short paragraphs, explain to a new gardener why tomatoes need full sun "
        "and regular watering.",
    ),
    PeerPrompt(
        "docstrings",
        "edit",
        "Add a docstring to every function of this module. Keep the code exactly as it is "
        f"and reply with the whole module.\n\n```python\n{_CSV_MODULE}```",
    ),
    PeerPrompt(
        "refactor",
        "edit",
        "Rename the attributes of this class to descriptive names (items, counter) and the "
        "parameters to task and priority. Change nothing else and reply with the whole class."
        f"\n\n```python\n{_QUEUE_CLASS}```",
    ),
)

LLAMA_METHODS = (
    "llama.cpp plain",
    "llama.cpp draft",
    "llama.cpp ngram-simple",
    "llama.cpp ngram-mod",
)
SPECDECK = "SpecDeck"


def render_prompts(main: Path, prompts: tuple[PeerPrompt, ...]) -> dict[str, str]:
    """Each prompt in the main model's chat template, as SpecDeck sends it."""
    settings = LlamaLoadSettings(n_ctx=512, probe_exact_batch=False)
    with LlamaEngine(main, settings) as engine:
        return {p.key: engine.chat_prompt([ChatMessage("user", p.text)]) for p in prompts}


def run_specdeck(prompt: PeerPrompt, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One ``specdeck-bench`` call: SpecDeck plain and auto on the same loaded models."""
    prompt_file = folder / f"{prompt.key}.user.txt"
    prompt_file.write_text(prompt.text, encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "backends.service.bench",
        "--json",
        "--main",
        str(args.main),
        "--draft",
        str(args.draft),
        "--prompt-file",
        str(prompt_file),
        "--max-tokens",
        str(args.max_tokens),
        "--threads",
        str(args.threads),
        "--ctx",
        str(args.ctx),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"specdeck-bench failed on {prompt.key}: {done.stderr.strip()[-300:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def run_llama(
    method: str, tools: PeerTools, prompt_file: Path, prompt_text: str, args: argparse.Namespace
) -> PeerRun:
    """One llama.cpp run of ``method``."""
    common = common_arguments(args.main, prompt_file, args.max_tokens, args.threads, args.ctx)
    if method == "llama.cpp plain":
        return run_completion(tools, common)
    if method == "llama.cpp draft":
        return run_speculative(tools, common, "draft-simple", prompt_text, draft=args.draft)
    return run_speculative(tools, common, method.removeprefix("llama.cpp "), prompt_text)


def measure(
    args: argparse.Namespace, tools: PeerTools, prompts: tuple[PeerPrompt, ...]
) -> dict[str, Any]:
    """Every method on every prompt, ``args.rounds`` times, the order rotating."""
    rendered = render_prompts(args.main, prompts)
    methods = (*LLAMA_METHODS, SPECDECK)
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {
        p.key: {m: [] for m in methods} for p in prompts
    }
    with tempfile.TemporaryDirectory(prefix="specdeck-peer-") as name:
        folder = Path(name)
        for round_index in range(args.rounds):
            for prompt in prompts:
                prompt_file = folder / f"{prompt.key}.txt"
                prompt_file.write_text(rendered[prompt.key], encoding="utf-8")
                shift = round_index % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    print(
                        f"round {round_index + 1}: {prompt.key}: {method}",
                        file=sys.stderr,
                        flush=True,
                    )
                    if method == SPECDECK:
                        report = run_specdeck(prompt, folder, args)
                        samples[prompt.key][method].append(_specdeck_sample(report))
                    else:
                        run = run_llama(method, tools, prompt_file, rendered[prompt.key], args)
                        samples[prompt.key][method].append(_llama_sample(run))
    return {"prompts": {p.key: _summarise(p, samples[p.key]) for p in prompts}}


def _llama_sample(run: PeerRun) -> dict[str, Any]:
    return {
        "tok_s": run.tokens_per_second,
        "tokens": run.tokens,
        "acceptance": run.acceptance,
        "draft_max": run.draft_max,
        "text": run.text,
    }


def _specdeck_sample(report: dict[str, Any]) -> dict[str, Any]:
    plain, spec = report["baseline"], report["speculative"]
    return {
        "plain_tok_s": plain["tokens_per_second"],
        "tok_s": spec["tokens_per_second"],
        "tokens": spec["tokens"],
        "acceptance": spec.get("acceptance_rate"),
        "identical": report["identical"],
        "exact_batch_limit": report["load"].get("exact_batch_limit"),
        "rounds_by_method": spec.get("rounds_by_method"),
        "text": plain["text"],
    }


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _summarise(prompt: PeerPrompt, by_method: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per method, the ratios, and whether the texts agree."""
    plain = _median([s["tok_s"] for s in by_method["llama.cpp plain"]])
    summary: dict[str, Any] = {"kind": prompt.kind, "methods": {}}
    for method in LLAMA_METHODS:
        runs = by_method[method]
        tok_s = _median([s["tok_s"] for s in runs])
        accepted = [s["acceptance"] for s in runs if s["acceptance"] is not None]
        summary["methods"][method] = {
            "tok_s": round(tok_s, 2),
            "ratio": round(tok_s / plain, 3),
            "acceptance": round(_median(accepted), 3) if accepted else None,
            "draft_max": runs[0]["draft_max"],
        }
    ours = by_method[SPECDECK]
    ours_plain = _median([s["plain_tok_s"] for s in ours])
    ours_auto = _median([s["tok_s"] for s in ours])
    best_name = max(LLAMA_METHODS, key=lambda m: summary["methods"][m]["tok_s"])
    best = summary["methods"][best_name]["tok_s"]
    accepted = [s["acceptance"] for s in ours if s["acceptance"] is not None]
    summary["specdeck"] = {
        "plain_tok_s": round(ours_plain, 2),
        "auto_tok_s": round(ours_auto, 2),
        "ratio": round(ours_auto / ours_plain, 3),
        "acceptance": round(_median(accepted), 3) if accepted else None,
        "identical": all(s["identical"] for s in ours),
        "exact_batch_limit": ours[0]["exact_batch_limit"],
        "rounds_by_method": ours[-1]["rounds_by_method"],
        "vs_best_llama_cpp": round(ours_auto / best, 3),
        "best_llama_cpp": best_name,
        "same_text_as_llama_cpp": ours[0]["text"].strip()
        == by_method["llama.cpp plain"][0]["text"].strip(),
    }
    return summary


def table(results: dict[str, Any]) -> str:
    """The comparison as a Markdown table."""
    lines = [
        "| prompt | llama.cpp plain | llama.cpp draft | ngram-simple | ngram-mod "
        "| SpecDeck plain | SpecDeck auto (exact) | auto vs best llama.cpp |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cell(entry: dict[str, Any]) -> str:
        text = f"{entry['ratio']:.2f}×"
        if entry.get("acceptance") is not None:
            text += f" ({100 * entry['acceptance']:.0f} %)"
        return text

    for key, entry in results["prompts"].items():
        m, ours = entry["methods"], entry["specdeck"]
        draft = cell(m["llama.cpp draft"])
        if m["llama.cpp draft"]["draft_max"]:
            draft += f", k={m['llama.cpp draft']['draft_max']}"
        auto = f"{ours['auto_tok_s']:.2f} tok/s, {cell(ours)}"
        if not ours["identical"]:
            auto += ", TEXT DIFFERS"
        best = ours["best_llama_cpp"].removeprefix("llama.cpp ")
        lines.append(
            f"| {key} ({entry['kind']}) | {m['llama.cpp plain']['tok_s']:.2f} tok/s "
            f"| {draft} | {cell(m['llama.cpp ngram-simple'])} | {cell(m['llama.cpp ngram-mod'])} "
            f"| {ours['plain_tok_s']:.2f} tok/s | {auto} "
            f"| {ours['vs_best_llama_cpp']:.2f}× ({best}) |"
        )
    return "\n".join(lines)


def main() -> None:
    """Build the llama.cpp tools when needed, run the comparison, print the table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", type=Path, default=None, help="default: the default main")
    parser.add_argument("--draft", type=Path, default=None, help="default: the default draft")
    parser.add_argument(
        "--prompts", default=",".join(p.key for p in PROMPTS), help="comma-separated prompt keys"
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.main = args.main or model_path(DEFAULT_MAIN_KEY)
    args.draft = args.draft or model_path(DEFAULT_DRAFT_KEY)
    wanted = args.prompts.split(",")
    unknown = sorted(set(wanted) - {p.key for p in PROMPTS})
    if unknown:
        parser.error(
            f"unknown prompt {', '.join(unknown)} (known: {', '.join(p.key for p in PROMPTS)})"
        )
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    tools = build_tools(lambda line: print(line, file=sys.stderr))
    results = measure(args, tools, tuple(p for p in PROMPTS if p.key in wanted))
    results["machine"] = {"cpu": cpu_model_name(), "threads": args.threads}
    results["llama_cpp"] = {
        "from": f"llama-cpp-python {tools.llama_cpp_python}",
        "cmake": tools.configuration,
    }
    results["max_tokens"] = args.max_tokens
    results["rounds"] = args.rounds
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{results['machine']['cpu']}, {args.threads} threads, {args.max_tokens} tokens max, "
        f"median of {args.rounds} round(s); llama.cpp from {results['llama_cpp']['from']}"
    )
    print(table(results))
    same = [k for k, v in results["prompts"].items() if v["specdeck"]["same_text_as_llama_cpp"]]
    other = [k for k in results["prompts"] if k not in same]
    print(
        f"SpecDeck's plain text equals llama-completion's on: {', '.join(same) or 'none'}"
        + (f"; differs on: {', '.join(other)}" if other else "")
    )


if __name__ == "__main__":
    main()
