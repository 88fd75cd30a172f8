"""The local API under mixed load for a set time, and the server's memory over that time.

A fresh ``specdeck serve`` (SmolLM2-135M as main and draft unless given) answers client
threads that send, in a seeded random mix: whole and streamed chat completions, streams
whose client goes away after two chunks, ``response_format`` JSON-schema answers, tool
calls (``tool_choice`` required), streamed ``/v1/responses`` answers and bursts of
concurrent requests past the queue's limit (answered 429). Every few seconds it samples
the server process's memory (RSS and USS, with psutil). At the end it reports what was
served (by kind and status), the memory after the warm-up (the first tenth of the run),
at the end and at its highest, the growth after the warm-up and its slope, and draws the
curve as a PNG (with Qt, no plotting library). A 5xx or an answer of the wrong shape is
counted and printed.

    .venv/bin/python -m benchmarks.soak --minutes 30 --png docs/soak.png [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from backends.engines.hardware import physical_cores
from backends.models.provision import SMALL_TEST_KEY, ensure_model
from benchmarks.api_overhead import SPECDECK, free_port, wait_ready

SAMPLE_SECONDS = 5.0
WARM_UP_SHARE = 0.1  # the first tenth of the run: caches, arenas and the grammar's tokenizer
BURST = 24  # concurrent requests of a burst: more than the queue holds (16), so some get 429
REQUEST_TIMEOUT_SECONDS = 300
# The mix of requests, by weight: bursts are rarer, as they fill the queue for everyone.
KINDS = {
    "chat": 2.0,
    "stream": 2.0,
    "dropped": 1.0,
    "schema": 1.0,
    "tools": 1.0,
    "responses": 1.0,
    "burst": 0.3,
}
ASK = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@dataclass
class Tally:
    """What was asked and answered, shared by the client threads."""

    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)  # 5xx and answers of the wrong shape
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, status: int, problem: str | None = None) -> None:
        with self.lock:
            self.statuses[(kind, status)] += 1
            if problem is not None or status >= 500:
                self.wrong.append(f"{kind}: {status} {problem or ''}".strip())


def _post(
    port: int, path: str, body: dict[str, Any], *, read_chunks: int | None = None
) -> tuple[int, bytes]:
    """POST ``body``; the status and the answer (only ``read_chunks`` reads of a stream)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_SECONDS)
    try:
        connection.request(
            "POST", "/v1" + path, json.dumps(body), {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        if read_chunks is None:
            return response.status, response.read()
        data = b"".join(response.read1(512) for _ in range(read_chunks))
        return response.status, data  # the connection closes unread: a departed client
    finally:
        connection.close()


def _problem(kind: str, status: int, data: bytes) -> str | None:
    """What is wrong with an answer of ``kind`` (None: nothing)."""
    if status == 429 or kind == "dropped":
        return None
    if status != 200:
        return data[:200].decode(errors="replace")
    if kind in ("stream", "responses"):
        last = data.strip().split(b"\n\n")[-1]
        ends = (b"data: [DONE]", b"event: response.completed", b"event: response.incomplete")
        return None if last.startswith(ends) else f"stream ended with {last[:80]!r}"
    choice = json.loads(data)["choices"][0]
    message = choice["message"]
    if choice["finish_reason"] == "length":
        return None  # cut short by max_tokens: nothing to check
    if kind == "schema":
        person = json.loads(message["content"])
        if not isinstance(person, dict) or set(person) != {"name", "age"}:
            return f"not the schema's JSON: {message['content'][:80]!r}"
    if kind == "tools" and not message.get("tool_calls"):
        return f"no tool call: {message.get('content', '')[:80]!r}"
    return None


def _one_request(
    port: int, kind: str, max_tokens: int, tally: Tally, counted_as: str | None = None
) -> None:
    chat: dict[str, Any] = {"messages": ASK, "max_tokens": max_tokens, "temperature": 0.7}
    if kind == "chat":
        status, data = _post(port, "/chat/completions", chat)
    elif kind in ("stream", "dropped"):
        reads = 2 if kind == "dropped" else None
        status, data = _post(port, "/chat/completions", {**chat, "stream": True}, read_chunks=reads)
    elif kind == "schema":
        schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        ask = [{"role": "user", "content": "Describe a person as JSON."}]
        status, data = _post(
            port,
            "/chat/completions",
            {**chat, "messages": ask, "max_tokens": 48, "response_format": schema},
        )
    elif kind == "tools":
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        body = {**chat, "messages": ask, "max_tokens": 48}
        body |= {"tools": [WEATHER_TOOL], "tool_choice": "required"}
        status, data = _post(port, "/chat/completions", body)
    elif kind == "responses":
        body = {"input": ASK[0]["content"], "max_output_tokens": max_tokens, "stream": True}
        status, data = _post(port, "/responses", body)
    else:  # a burst: many at once, past the queue's limit
        threads = [
            threading.Thread(target=_one_request, args=(port, "chat", 4, tally, "burst"))
            for _ in range(BURST)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return
    tally.count(counted_as or kind, status, _problem(kind, status, data))


def _client(port: int, seed: int, until: float, max_tokens: int, tally: Tally) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        try:
            _one_request(port, kind, max_tokens, tally)
        except (OSError, http.client.HTTPException, ValueError, KeyError) as error:
            tally.count(kind, 0, f"{type(error).__name__}: {error}")


def _memory_mb(process: psutil.Process) -> tuple[float, float]:
    info = process.memory_full_info()
    return info.rss / 2**20, info.uss / 2**20


def soak(args: argparse.Namespace) -> dict[str, Any]:
    """Serve, load and sample for ``args.minutes``; the report as a dict."""
    main = args.main or ensure_model(SMALL_TEST_KEY)
    draft = args.draft or main
    port = free_port()
    command = [str(SPECDECK), "serve", "--port", str(port), "--main", str(main)]
    command += ["--draft", str(draft), "--threads", str(args.threads), "--ctx", "2048"]
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    tally = Tally()
    samples: list[tuple[float, float, float]] = []  # seconds, RSS MB, USS MB
    try:
        wait_ready(port, server)
        process = psutil.Process(server.pid)
        start = time.monotonic()
        until = start + args.minutes * 60
        clients = [
            threading.Thread(
                target=_client, args=(port, args.seed + n, until, args.max_tokens, tally)
            )
            for n in range(args.clients)
        ]
        for client in clients:
            client.start()
        while any(client.is_alive() for client in clients):
            samples.append((time.monotonic() - start, *_memory_mb(process)))
            time.sleep(min(SAMPLE_SECONDS, max(0.1, until - time.monotonic())))
        for client in clients:
            client.join()
        samples.append((time.monotonic() - start, *_memory_mb(process)))
        still_answers = _post(port, "/chat/completions", {"messages": ASK, "max_tokens": 2})[0]
    finally:
        server.terminate()
        server.wait(timeout=60)
    return _report(args, main, draft, tally, samples, still_answers)


def _report(
    args: argparse.Namespace,
    main: Path,
    draft: Path,
    tally: Tally,
    samples: list[tuple[float, float, float]],
    still_answers: int,
) -> dict[str, Any]:
    seconds = samples[-1][0]
    settled = [sample for sample in samples if sample[0] >= seconds * WARM_UP_SHARE]
    after_warm_up, at_end = settled[0][1], samples[-1][1]
    slope = _slope([(t, rss) for t, rss, _ in settled]) * 3600  # MB an hour
    by_kind: dict[str, dict[str, int]] = {}
    for (kind, status), count in sorted(tally.statuses.items()):
        by_kind.setdefault(kind, {})[str(status)] = count
    return {
        "main": main.name,
        "draft": draft.name,
        "minutes": round(seconds / 60, 1),
        "clients": args.clients,
        "served": sum(count for (_, status), count in tally.statuses.items() if status == 200),
        "refused_429": sum(count for (_, status), count in tally.statuses.items() if status == 429),
        "by_kind": by_kind,
        "wrong": tally.wrong,
        "still_answers": still_answers == 200,
        "rss_mb": {
            "after_warm_up": round(after_warm_up, 1),
            "at_end": round(at_end, 1),
            "highest": round(max(rss for _, rss, _ in samples), 1),
            "growth_after_warm_up": round(at_end - after_warm_up, 1),
            "slope_mb_per_hour": round(slope, 1),
        },
        "uss_mb_at_end": round(samples[-1][2], 1),
        "samples": [[round(t, 1), round(rss, 1), round(uss, 1)] for t, rss, uss in samples],
    }


def _slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of ``points`` (0 for fewer than two)."""
    if len(points) < 2:
        return 0.0
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread if spread else 0.0


def draw_curve(report: dict[str, Any], path: Path) -> None:
    """The RSS and USS over time as a PNG, with the warm-up's end marked."""
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QGuiApplication, QImage, QPainter, QPen

    _app = QGuiApplication.instance() or QGuiApplication(["soak", "-platform", "offscreen"])
    width, height, margin = 900, 420, 60
    image = QImage(width, height, QImage.Format.Format_ARGB32)
    image.fill(QColor("white"))
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    samples = report["samples"]
    seconds = max(samples[-1][0], 1.0)
    top = max(rss for _, rss, _ in samples) * 1.15
    plot = QRectF(margin, 40, width - 2 * margin, height - 40 - margin)

    def point(t: float, mb: float) -> QPointF:
        return QPointF(
            plot.left() + plot.width() * t / seconds, plot.bottom() - plot.height() * mb / top
        )

    painter.setPen(QPen(QColor("#9ca3af"), 1))
    painter.drawRect(plot)
    for step in range(5):
        mb = top * step / 4
        y = point(0, mb).y()
        painter.drawText(QRectF(0, y - 8, margin - 6, 16), Qt.AlignmentFlag.AlignRight, f"{mb:.0f}")
        minutes = seconds / 60 * step / 4
        x = plot.left() + plot.width() * step / 4
        painter.drawText(
            QRectF(x - 30, plot.bottom() + 4, 60, 16),
            Qt.AlignmentFlag.AlignCenter,
            f"{minutes:.0f} min" if seconds >= 600 else f"{minutes:.1f} min",
        )
    warm_up = point(seconds * WARM_UP_SHARE, 0).x()
    painter.setPen(QPen(QColor("#d1d5db"), 1, Qt.PenStyle.DashLine))
    painter.drawLine(QPointF(warm_up, plot.top()), QPointF(warm_up, plot.bottom()))
    for index, colour, name in ((1, "#1a7f37", "RSS"), (2, "#2563eb", "USS")):
        painter.setPen(QPen(QColor(colour), 2))
        line = [point(sample[0], sample[index]) for sample in samples]
        for start, end in zip(line, line[1:], strict=False):
            painter.drawLine(start, end)
        painter.drawText(QPointF(plot.right() - 110 + 50 * (index - 1), plot.top() + 18), name)
    painter.setPen(QColor("#111827"))
    painter.drawText(
        QPointF(margin, 24),
        f"specdeck serve memory (MB), {report['main']}: {report['served']} answers, "
        f"{report['refused_429']} refused (429) in {report['minutes']} min",
    )
    painter.end()
    image.save(str(path))


def main() -> None:
    """Run the soak, print the report (and draw the curve with --png)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--main", type=Path, default=None, help="default: SmolLM2-135M")
    parser.add_argument("--draft", type=Path, default=None, help="default: --main itself")
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--png", type=Path, default=None, help="draw the memory curve here")
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
    args = parser.parse_args()
    report = soak(args)
    if args.png is not None:
        draw_curve(report, args.png)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    memory = report["rss_mb"]
    print(
        f"{report['minutes']} min, {report['clients']} clients: {report['served']} answers, "
        f"{report['refused_429']} refused with 429, {len(report['wrong'])} wrong"
    )
    for kind, statuses in report["by_kind"].items():
        print(f"  {kind}: {statuses}")
    print(
        f"RSS {memory['after_warm_up']} MB after the warm-up, {memory['at_end']} MB at the end "
        f"(highest {memory['highest']}): {memory['growth_after_warm_up']:+} MB, "
        f"{memory['slope_mb_per_hour']:+} MB an hour"
    )
    for problem in report["wrong"][:20]:
        print(f"  wrong: {problem}")


if __name__ == "__main__":
    main()
