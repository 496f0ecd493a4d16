"""Matrix: every preset, both variants, one report (Markdown and HTML, with charts) for a pull request.

Each preset's variants are measured interleaved in one ``run_variants`` call (as ``rlgauge
run`` does): one job per preset, run here one after another or as Ray tasks (``--executor``,
``harness.campaigns``), so the variants whose speeds are compared always share a machine; a
rich progress bar counts presets and variants.
The speedup of each preset is the median paired per-repeat ratio with a 95 % percentile
bootstrap interval (``compare.paired_ratio``); with fewer than ``power.MIN_REPEATS`` repeats
the report calls the bracket the range of the ratios. Each run's machine state and quality
verdict get a table of their own. A matrix above ``run_size``'s limit (``--steps`` and
``--repeats`` multiply every run) runs only with ``--yes``.
"""

from __future__ import annotations

import datetime as dt
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import markdown
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from reference_trainers.state.atomic_file import write_text_atomically

from harness.campaigns.executors import Executor, LocalExecutor
from harness.campaigns.jobs import Job
from harness.stats import power
from harness.stats.compare import CONFIDENCE, STATE_FIELDS, Ratio, paired_ratio, quality_text, state_cells
from harness.errors import UserError
from harness.specs.presets import preset_names, specs_for
from harness.results import RunResult
from harness.measurement.runner import VariantSpec, resolve_specs, run_variants

MATRIX_DEFAULT_STEPS = 8192
SPEEDUP_CHART = "matrix-speedup.png"
THROUGHPUT_CHART = "matrix-throughput.png"


@dataclass
class PresetRow:
    preset: str
    runs: list[RunResult]

    def run(self, variant: str) -> RunResult | None:
        return next((r for r in self.runs if r.variant == variant), None)

    @property
    def speedup(self) -> Ratio | None:
        base, opt = self.run("baseline"), self.run("optimized")
        if not base or not opt or base.status != "ok" or opt.status != "ok":
            return None
        return paired_ratio(base.metrics["env_steps_per_sec"]["samples"], opt.metrics["env_steps_per_sec"]["samples"])


def matrix_specs(names: list[str] | None, overrides: list[str]) -> dict[str, list[VariantSpec]]:
    """Validated specs of both variants for each preset (all presets when ``names`` is None)."""
    known = preset_names()
    chosen = names or known
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise UserError(f"--presets {unknown[0]!r}: unknown preset (available: {', '.join(known)})")
    plan = {name: specs_for(name, "both", overrides) for name in chosen}
    for specs in plan.values():
        resolve_specs(specs)
    return plan


def measure_preset(name: str, specs: list[VariantSpec]) -> tuple[PresetRow, bool]:
    """One job of the matrix: a preset's variants measured interleaved on one machine; (row, interrupted)."""
    runs, interrupted = run_variants(specs, show_progress=False, say=lambda _t: None)
    return PresetRow(name, runs), interrupted


def run_matrix(plan: dict[str, list[VariantSpec]], show_progress: bool, say: Callable[[str], None],
               executor: Executor | None = None) -> tuple[list[PresetRow], bool]:
    """Measure each preset's variants interleaved, one job per preset (here in turn, or as Ray tasks);
    returns (rows of the presets measured, interrupted)."""
    executor = executor or LocalExecutor()
    total = sum(len(specs) for specs in plan.values())
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), disable=not show_progress)
    jobs = [Job(name, measure_preset, (name, specs)) for name, specs in plan.items()]
    stopped = []

    def finished(job: Job, result: tuple[PresetRow, bool]) -> None:
        row, interrupted = result
        progress.advance(task, len(row.runs))
        say(f"{row.preset}: " + ", ".join(f"{r.variant} {_rate(r)}" for r in row.runs))
        if interrupted:  # a local job measured what it could: stop the campaign there
            stopped.append(job.name)
            raise KeyboardInterrupt

    with progress:
        task = progress.add_task(f"matrix ({getattr(executor, 'label', executor.name)})", total=total)
        gathered = executor.run(jobs, cpus_per_job=1, on_result=finished)
    rows = [row for row, _ in gathered.in_order(jobs)]
    return rows, gathered.interrupted or bool(stopped)


def _rate(run: RunResult | None) -> str:
    rate = run.metrics.get("env_steps_per_sec") if run and run.status == "ok" else None
    if not rate:
        return "-" if run is None else run.status
    return f"{rate['median']:,.0f} [{rate['min']:,.0f}-{rate['max']:,.0f}]"


def _ratio_cell(ratio: Ratio | None) -> str:
    return "-" if ratio is None else f"{ratio.value:.2f}x [{ratio.low:.2f}-{ratio.high:.2f}]"


def interval_text(repeats: object) -> str:
    """What the speedup's bracket is: a bootstrap interval, or with too few repeats the range of the ratios."""
    if isinstance(repeats, int) and not power.has_power(repeats):
        return (f"with {repeats} repeat{'s' * (repeats != 1)} the bracket is the range of the per-repeat ratios, "
                f"not a confidence interval (that needs {power.MIN_REPEATS})")
    return f"{CONFIDENCE:.0%} percentile bootstrap interval"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def quality_section(rows: list[PresetRow]) -> list[str]:
    """Markdown lines: one table row per run with its machine state and quality verdict."""
    head = ["preset", "variant", *(name for name, _ in STATE_FIELDS), "quality"]
    lines = ["## Machine state and quality", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        for run in row.runs:
            cells = [row.preset, run.variant, *state_cells(run), quality_text(run)]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def report_markdown(rows: list[PresetRow], charts: bool = True) -> str:
    """The report: machine and settings, one table row per preset, the charts, stability notes."""
    first = next((r for row in rows for r in row.runs), None)
    machine = first.machine if first else {}
    commit = (first.git.get("commit") or "unknown")[:12] if first else "unknown"
    dirty = " (uncommitted changes)" if first and first.git.get("dirty") else ""
    settings = first.config["run"] if first else {}
    lines = [
        "# rlgauge matrix", "",
        f"Measured {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} at commit `{commit}`{dirty} on "
        f"{machine.get('cpu', '?')} ({machine.get('cores', '?')} cores), torch {machine.get('torch', '?')}, "
        f"device `{first.config['device'] if first else '?'}`.",
        f"Each preset: baseline and optimized interleaved in one process, repeats: {settings.get('repeats', '?')} of "
        f"{settings.get('steps', '?')} env steps after {settings.get('warmup_steps', '?')} warm-up steps. "
        f"Speedup: median of the paired per-repeat ratios, {interval_text(settings.get('repeats'))}.", "",
        "| preset | algo | baseline env steps/s | optimized env steps/s | speedup | return (base / opt) | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        base, opt = row.run("baseline"), row.run("optimized")
        algo = (base or opt).algo if (base or opt) else "?"
        returns = " / ".join("-" if r is None or r.metrics.get("mean_return_last_k") is None
                             else f"{r.metrics['mean_return_last_k']:.1f}" for r in (base, opt))
        status = ", ".join(sorted({r.status for r in row.runs}))
        lines.append(f"| {row.preset} | {algo} | {_rate(base)} | {_rate(opt)} | {_ratio_cell(row.speedup)} | "
                     f"{returns} | {status} |")
    if charts:
        lines += ["", f"![speedup per preset]({SPEEDUP_CHART})", "", f"![throughput per preset]({THROUGHPUT_CHART})"]
    problems = [(row.preset, r) for row in rows for r in row.runs if r.status != "ok"]
    lines += ["", "## Stability", ""]
    if problems:
        lines += [f"- {preset} {r.variant}: {r.status} ({r.error or r.stability})" for preset, r in problems]
    else:
        lines.append("Every run passed: no float64 op, no non-finite value.")
    lines += ["", *quality_section(rows)]
    return "\n".join(lines) + "\n"


HTML_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:64rem;margin:2rem auto;padding:0 1rem}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.25rem .5rem;text-align:right}}
td:first-child,th:first-child{{text-align:left}}img{{max-width:100%}}</style></head>
<body>
{body}
</body></html>
"""


def report_html(markdown_text: str) -> str:
    return HTML_TEMPLATE.format(title=html.escape("rlgauge matrix"),
                                body=markdown.markdown(markdown_text, extensions=["tables"]))


def write_report(out: Path, rows: list[PresetRow]) -> None:
    """``report.md``, ``report.html`` and the two charts in ``out``."""
    from harness.report.plots import bar_chart, grouped_bar_chart

    names = [row.preset for row in rows]
    speedups = [row.speedup for row in rows]
    fewest = min((r.n for r in speedups if r is not None), default=power.MIN_REPEATS)
    bracket = f"{CONFIDENCE:.0%} interval" if power.has_power(fewest) else f"range of {fewest} ratios"
    bar_chart(out / SPEEDUP_CHART, "optimized / baseline env steps/sec", names, speedups,
              f"speedup (paired median, {bracket})")
    series = {}
    for variant in ("baseline", "optimized"):
        points = []
        for row in rows:
            run = row.run(variant)
            rate = run.metrics.get("env_steps_per_sec") if run and run.status == "ok" else None
            points.append(None if not rate else (rate["median"], rate["min"], rate["max"]))
        series[variant] = points
    grouped_bar_chart(out / THROUGHPUT_CHART, "env steps/sec per preset", "preset", names, series)
    text = report_markdown(rows)
    write_text_atomically(out / "report.md", text)
    write_text_atomically(out / "report.html", report_html(text))
