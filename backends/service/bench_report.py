"""What specdeck-bench prints: the comparison's table and JSON, the suite's table and JSON.

The load report (:func:`load_report`) heads both: each model with where its weights went,
the workers, the notes on what was chosen for the weights and why, and auto's calibration
(how sure, what it allows at best, its batch costs at load and after the answer).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.service.bench_suite import SuiteRow
    from backends.service.loaded_pair import LoadedPair
    from backends.service.pair_runs import Comparison
    from backends.speculation.types import GenerationResult, GenerationSettings, SpeculationStats


def load_report(pair: LoadedPair, prompt_tokens: int) -> dict[str, object]:
    """The ``load`` object: both models, their placement, the notes, the workers."""
    main, draft = pair.main, pair.draft
    return {
        "main": main.load_report.model_name,
        "draft": draft.load_report.model_name if draft is not None else None,
        "main_placement": main.load_report.placement,
        "draft_placement": draft.load_report.placement if draft is not None else None,
        "backend": main.load_report.backend,
        "exact_batch_limit": main.exact_batch_limit,
        "prompt_tokens": prompt_tokens,
        # What was chosen for the weights and why ("weight repacking on (auto), AMX ..."),
        # then what only the draft says ("draft requantized to Q4_0 for speed ...").
        "notes": list(main.load_report.notes)
        + [
            note
            for note in (draft.load_report.notes if draft is not None else ())
            if note not in main.load_report.notes
        ],
        "main_weight_buffers": list(main.load_report.weight_buffers),
        # auto's calibration: how sure it is and what speculation can gain here at best.
        "calibration": pair.calibration_notes(),
        "batch_costs_ms": {
            "at_load": {name: costs.table_ms() for name, costs in pair.costs_at_load.items()},
            "after": {name: costs.table_ms() for name, costs in pair.batch_costs().items()},
        },
        "workers": [status.summary() for status in main.worker_statuses()],
    }


def _run_json(result: GenerationResult, speculative: bool) -> dict[str, object]:
    stats = result.stats
    data: dict[str, object] = {
        "text": result.text,
        "tokens": stats.generated_tokens,
        "tokens_per_second": stats.tokens_per_second,
        "time_to_first_token_sec": stats.time_to_first_token_sec,
        "stop_reason": stats.stop_reason,
    }
    if speculative:
        data.update(stats.as_dict())
        # One letter a token: d(raft), t(arget), g(rammar).
        data["origins"] = "".join(t.origin.value[0] for t in result.tokens)
    return data


def result_json(result: Comparison, report: dict[str, object]) -> dict[str, object]:
    """The --json object."""
    return {
        "baseline": _run_json(result.baseline, speculative=False),
        "speculative": _run_json(result.speculative, speculative=True),
        "speedup": result.speedup,
        "identical": result.identical,
        "load": report,
    }


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def _report_lines(report: dict[str, object]) -> list[str]:
    """The models, the workers and the notes: the head of both tables."""
    return [
        f"main:  {report['main']} — {report['main_placement']}",
        f"draft: {report['draft']} — {report['draft_placement']}",
        *(f"worker {line}" for line in report.get("workers", ())),  # type: ignore[attr-defined]
        *(f"note:  {note}" for note in report["notes"]),  # type: ignore[attr-defined]
        *(f"note:  {note}" for note in report.get("calibration", ())),  # type: ignore[attr-defined]
    ]


def format_table(
    result: Comparison, report: dict[str, object], settings: GenerationSettings
) -> str:
    """The human-readable comparison, like LM Studio's stats."""
    base, spec = result.baseline.stats, result.speculative.stats
    lines = [
        *_report_lines(report),
        f"method {report['method']} · prompt {report['prompt_tokens']} tokens · "
        f"max {settings.max_tokens} tokens · "
        f"temperature {settings.sampling.temperature:g} · draft max {settings.draft_max} · "
        f"p-min {settings.p_min:g}",
        "",
        f"{'':14}{'tokens':>8}{'tok/s':>9}{'TTFT':>9}  stop",
    ]
    for label, stats in (("plain", base), ("speculative", spec)):
        ttft = stats.time_to_first_token_sec or 0.0
        lines.append(
            f"{label:14}{stats.generated_tokens:>8}{stats.tokens_per_second:>9.1f}"
            f"{ttft:>8.2f}s  {stats.stop_reason}"
        )
    lines.append("")
    speedup = result.speedup
    if speedup is not None:
        verdict = "faster" if speedup >= 1.0 else "SLOWER than plain decoding"
        lines.append(
            f"speedup: {speedup:.2f}× ({base.tokens_per_second:.1f} → "
            f"{spec.tokens_per_second:.1f} tok/s, {verdict})"
        )
    lines.append(_draft_line(spec))
    positions = ", ".join(
        f"{i + 1}: {_percent(rate)}" for i, rate in enumerate(spec.acceptance_by_position)
    )
    lines.append(f"acceptance by draft position: {positions}")
    lines.append(
        f"time: drafting {spec.draft_seconds:.2f} s, verifying {spec.verify_seconds:.2f} s, "
        f"loop overhead {spec.overhead_seconds:.3f} s over {spec.rounds} rounds"
    )
    if result.identical is not None:
        lines.append(f"identical text: {'yes' if result.identical else 'NO'}")
    return "\n".join(lines)


def _draft_line(stats: SpeculationStats) -> str:
    return (
        f"draft tokens: {stats.total_draft_tokens_count} total, "
        f"{stats.accepted_draft_tokens_count} accepted, "
        f"{stats.rejected_draft_tokens_count} rejected, "
        f"{stats.ignored_draft_tokens_count} ignored — acceptance "
        f"{_percent(stats.acceptance_rate)}"
        + (
            f" (of them {stats.sibling_tokens_count} second choices as siblings, "
            f"{stats.accepted_sibling_tokens_count} taken)"
            if stats.sibling_tokens_count
            else ""
        )
    )


def _length_summary(stats: SpeculationStats) -> str:
    """Chosen draft lengths: how many rounds drafted nothing, and the mean of the others."""
    counts = stats.draft_length_counts
    drafted = {k: v for k, v in counts.items() if k > 0}
    rounds = sum(counts.values())
    if not drafted:
        return "0 ×" + str(rounds)
    mean = sum(k * v for k, v in drafted.items()) / sum(drafted.values())
    plain = counts.get(0, 0)
    return f"{100 * plain / rounds:.0f}% 0, else {mean:.1f} (max {max(drafted)})"


def format_suite(rows: Sequence[SuiteRow], report: dict[str, object]) -> str:
    """The suite's one table."""
    lines = [
        *_report_lines(report),
        "loop ms: time per round outside the engines' forward passes (Python, lookups, sampling)",
        f"bit-exact batch limit of the main model: {report['exact_batch_limit']} tokens; "
        "temperature 0",
        "",
        f"{'prompt':11}{'method':24}{'tok/s':>7}{'speedup':>9}{'accepted':>10}"
        f"{'identical':>11}{'loop ms':>9}  draft lengths (share of rounds at 0, mean of the rest)",
    ]
    for row in rows:
        stats = row.result.stats
        speedup = "–" if row.speedup is None else f"{row.speedup:.2f}×"
        identical = "yes" if row.identical else "NO"
        lengths = "–" if row.method == "plain" else _length_summary(stats)
        overhead = 1000 * stats.overhead_seconds / max(1, stats.rounds)
        lines.append(
            f"{row.prompt:11}{row.method:24}{stats.tokens_per_second:>7.1f}{speedup:>9}"
            f"{_percent(stats.acceptance_rate):>10}{identical:>11}{overhead:>9.2f}  {lengths}"
        )
    return "\n".join(lines)


def suite_json(rows: Sequence[SuiteRow], report: dict[str, object]) -> dict[str, object]:
    """The --suite --json object."""
    return {
        "load": report,
        "runs": [
            {
                "prompt": row.prompt,
                "method": row.method,
                "speedup": row.speedup,
                "identical": row.identical,
                "text": row.result.text,
                **row.result.stats.as_dict(),
            }
            for row in rows
        ],
    }
