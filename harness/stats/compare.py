"""Ratios between two measurements, with a confidence interval from the per-repeat samples.

Which interval depends on how the two runs were measured:

- **paired**: both runs come from one process with their repeats interleaved (the two
  variants of one result file from ``rlgauge run``, or ``rlgauge gate --run``). Round *i*
  of the candidate ran beside round *i* of the baseline, so machine drift hits both:
  the ratio is formed round by round (``c_i / b_i``), the estimate is the median of those
  ratios and the interval a percentile bootstrap of that median, resampling rounds.
- **independent**: runs from two result files (two processes, perhaps two commits). The
  estimate is the ratio of medians, ``median(c) / median(b)``, and the interval a
  percentile bootstrap resampling each run's samples on its own.

Both come from ``harness.stats.intervals`` (the tool's one home of bootstraps), with
``RESAMPLES`` resamples from a fixed seed, so the same files always give the same
interval. With few repeats the interval is honest rather than narrow: with 3 paired rounds
it is the range of the 3 ratios. Metrics measured once per run (latency percentiles,
memory) get a plain ratio and no interval.

A verdict (better / worse, confirmed) needs ``power.MIN_REPEATS`` repeats behind its ratio
and states its resolution (``power.resolution_note``); with fewer, ``change`` says "no
verdict" and the caption calls the bracket what it is: the range of the ratios. A change between
runs either of which is judged not trustworthy is never "confirmed": the verdict names the run and
its reason instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any, Callable

from rich.markup import escape
from rich.table import Table

from harness.stats import power
from harness.errors import UserError
from harness.results import RunResult

from harness.stats.intervals import (  # noqa: F401 - the bootstrap intervals, re-exported for compare's users
    CONFIDENCE, RESAMPLES, SEED, Ratio, independent_ratio, paired_ratio, single_ratio)


# --------------------------------------------------------------------------- which runs to compare

@dataclass(frozen=True)
class Pair:
    """Two runs to compare: ``cand`` against ``base``; ``paired`` if their repeats were interleaved."""

    base: RunResult
    cand: RunResult
    paired: bool

    @property
    def label(self) -> str:
        if (self.base.preset, self.base.variant) == (self.cand.preset, self.cand.variant):
            return f"{self.cand.preset}/{self.cand.variant}"
        if self.base.preset == self.cand.preset:
            return f"{self.cand.preset}: {self.cand.variant} vs {self.base.variant}"
        return f"{self.cand.preset}/{self.cand.variant} vs {self.base.preset}/{self.base.variant}"


def _key(run: RunResult) -> tuple[str, str]:
    return run.preset, run.variant


def _names(runs: list[RunResult]) -> str:
    return ", ".join(f"{p}/{v}" for p, v in map(_key, runs)) or "no runs"


def interleaved(run: RunResult) -> bool:
    """Whether a run's repeats were interleaved with its file's other runs (``measure`` blocks are not:
    they run one after another, so their ratios are independent)."""
    return run.config.get("interleaved", True) is not False


def reference(group: list[RunResult]) -> RunResult:
    """The run a preset's other variants are compared with: the first of runs measured interleaved
    (``rlgauge run`` writes the reference first: baseline, or the first of a ``--variant`` list);
    of runs measured one after another (``measure`` blocks), its ``baseline``, else the first."""
    if all(interleaved(r) for r in group):
        return group[0]
    return next((r for r in group if r.variant == "baseline"), group[0])


def variant_pairs(runs: list[RunResult], source: str = "the result file") -> list[Pair]:
    """Within one process's runs: each preset's other variants against its reference (paired)."""
    pairs: list[Pair] = []
    for preset in dict.fromkeys(r.preset for r in runs):
        group = [r for r in runs if r.preset == preset]
        base = reference(group)
        pairs += [Pair(base, r, paired=interleaved(base) and interleaved(r)) for r in group if r is not base]
    if not pairs:
        raise UserError(f"{source} holds {_names(runs)}: nothing to compare within it; "
                        "give a second result file, or a file from 'rlgauge run --variant both'")
    return pairs


def file_pairs(base_runs: list[RunResult], cand_runs: list[RunResult], base_name: str = "A",
               cand_name: str = "B") -> list[Pair]:
    """Runs of two files matched by (preset, variant); two single-run files are compared as they are."""
    by_key = {_key(r): r for r in base_runs}
    pairs = [Pair(by_key[_key(c)], c, paired=False) for c in cand_runs if _key(c) in by_key]
    if not pairs and len(base_runs) == 1 and len(cand_runs) == 1:
        pairs = [Pair(base_runs[0], cand_runs[0], paired=False)]
    if not pairs:
        raise UserError(f"{base_name} ({_names(base_runs)}) and {cand_name} ({_names(cand_runs)}) "
                        "have no preset/variant in common")
    return pairs


# --------------------------------------------------------------------------- metrics

@dataclass(frozen=True)
class Metric:
    key: str
    higher_is_better: bool | None
    """None: shown side by side, no ratio (learning progress is not a speed)."""
    value: Callable[[RunResult], Any]
    digits: int = 2


def _metric(name: str) -> Callable[[RunResult], Any]:
    return lambda r: r.metrics.get(name)


def _latency(pct: str) -> Callable[[RunResult], Any]:
    return lambda r: (r.metrics.get("inference_latency_ms") or {}).get(pct)


RATE_METRICS = ("env_steps_per_sec", "agent_steps_per_sec", "updates_per_sec")
CPU_METRIC = "cpu_seconds_per_1k_env_steps"
SAMPLED_METRICS = (*RATE_METRICS, CPU_METRIC)
"""Metrics with one sample per repeat: their ratios get intervals (paired when the pair is)."""
METRICS: tuple[Metric, ...] = (
    *(Metric(key, True, _metric(key), 0) for key in RATE_METRICS),
    Metric(CPU_METRIC, False, _metric(CPU_METRIC), 3),
    Metric("inference_latency_ms p50", False, _latency("p50"), 3),
    Metric("inference_latency_ms p95", False, _latency("p95"), 3),
    Metric("host_syncs_per_step", False, _metric("host_syncs_per_step")),
    Metric("peak_host_rss_mb", False, _metric("peak_host_rss_mb"), 0),
    Metric("peak_device_mem_mb", False, _metric("peak_device_mem_mb"), 0),
    Metric("warmup_s", False, _metric("warmup_s")),
    Metric("end_to_end_env_steps_per_sec", True, _metric("end_to_end_env_steps_per_sec"), 0),
    Metric("end_to_end_s", False, _metric("end_to_end_s")),
    Metric("mean_return_last_k", None, _metric("mean_return_last_k"), 1),
)


def rate_samples(run: RunResult, key: str) -> list[float] | None:
    """The per-repeat samples of a sampled metric (a rate, CPU seconds), or None when the run has none."""
    block = run.metrics.get(key)
    if not isinstance(block, dict) or not block.get("samples"):
        return None
    return [float(s) for s in block["samples"]]


def metric_ratio(pair: Pair, metric: Metric, *, confidence: float = CONFIDENCE) -> Ratio | None:
    """``cand / base`` for one metric, with an interval where it has per-repeat samples."""
    if metric.higher_is_better is None:
        return None
    if metric.key in SAMPLED_METRICS:
        base, cand = rate_samples(pair.base, metric.key), rate_samples(pair.cand, metric.key)
        if not base or not cand or median(base) <= 0:  # no rate to divide by (0 updates/s)
            return None
        if pair.paired and len(base) == len(cand):
            return paired_ratio(base, cand, confidence=confidence)
        return independent_ratio(base, cand, confidence=confidence)
    b, c = metric.value(pair.base), metric.value(pair.cand)
    if isinstance(b, (int, float)) and isinstance(c, (int, float)) and b > 0:
        return single_ratio(float(b), float(c))
    return None


def change(ratio: Ratio | None, higher_is_better: bool | None, distrust: str | None = None) -> str:
    """Plain words for a ratio with an interval: better / worse only when the whole interval says so,
    with the resolution of the comparison; no verdict with fewer than ``power.MIN_REPEATS`` repeats.
    ``distrust`` (a run compared is not trustworthy, and why): never "confirmed", ``distrust`` instead."""
    if ratio is None or higher_is_better is None or ratio.method == "single":
        return ""  # one value per run: no interval, no verdict
    if not power.has_power(ratio.n):
        return power.no_verdict(ratio.n)
    if ratio.low > 1 or ratio.high < 1:
        words = "better" if (ratio.low > 1) == higher_is_better else "worse"
        if distrust:
            return f"{words}, not confirmed: {distrust}"
        words += ", confirmed"
    else:
        words = "no confirmed change"
    return f"{words} ({power.resolution_note(ratio)})"


def untrusted_run(pair: Pair, base_label: str | None = None, cand_label: str | None = None) -> tuple[str, str] | None:
    """``(label, first reason)`` of the first run of a pair judged not trustworthy, else None: what
    stops the pair's changes being called confirmed."""
    for run, label in ((pair.base, base_label), (pair.cand, cand_label)):
        reasons = untrustworthy_reasons(run)
        if reasons is not None:
            return label or run.variant, reasons[0]
    return None


def distrust(pair: Pair) -> str | None:
    """``run X is not trustworthy (first reason)`` where a run of the pair is not trustworthy, else None."""
    untrusted = untrusted_run(pair)
    return None if untrusted is None else f"run {untrusted[0]} is not trustworthy ({untrusted[1]})"


def env_rate_line(pair: Pair, confidence: float = CONFIDENCE) -> str:
    """``ratio CAND/BASE: env_steps_per_sec R [low-high], CHANGE``: one line per variant of a run of three or more."""
    metric = METRICS[0]
    ratio = metric_ratio(pair, metric, confidence=confidence)
    if ratio is None:
        return f"ratio {pair.cand.variant}/{pair.base.variant}: {metric.key} -"
    unstable = [run.variant for run in (pair.base, pair.cand) if run.status == "unstable"]
    words = (f"no verdict: {' and '.join(unstable)} unstable" if unstable
             else change(ratio, metric.higher_is_better, distrust(pair)))
    return f"ratio {pair.cand.variant}/{pair.base.variant}: {metric.key} {ratio.fmt()}" + (f", {words}" if words else "")


def fmt_value(metric: Metric, run: RunResult) -> str:
    value = metric.value(run)
    if value is None:
        return "-"
    if isinstance(value, dict):
        d = metric.digits
        return f"{value['median']:,.{d}f} [{value['min']:,.{d}f}-{value['max']:,.{d}f}]"
    if isinstance(value, float):
        return f"{value:,.{metric.digits}f}"
    return str(value)


def config_differences(base: RunResult, cand: RunResult) -> list[str]:
    """Dotted config keys whose values differ between two runs."""
    def flat(value: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, child in value.items():
                out.update(flat(child, f"{prefix}.{key}" if prefix else str(key)))
            return out
        return {prefix: value}

    a, b = flat(base.config), flat(cand.config)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


MACHINE_KEYS = ("cpu", "cores", "torch", "device_name")


def machine_differences(base: RunResult, cand: RunResult) -> list[str]:
    return [k for k in MACHINE_KEYS if base.machine.get(k) != cand.machine.get(k)]


def describe_method(pair: Pair, confidence: float = CONFIDENCE, n: int | None = None) -> str:
    """How the ratios were formed; with ``n`` below ``power.MIN_REPEATS`` repeats the bracket is
    the range of the ratios, not a confidence interval, and is called so."""
    level = f"{confidence * 100:g} % bootstrap CI"
    if n is not None and not power.has_power(n):
        level = f"{n} repeat{'s' * (n != 1)}: the range of the ratios, not a confidence interval"
    if pair.paired:
        return f"paired (repeats interleaved in one process): median of per-round ratios [{level}]"
    return f"independent (not interleaved: two processes, or runs one after another): ratio of medians [{level}]"


def comparison_table(pair: Pair, *, confidence: float = CONFIDENCE, title: str | None = None,
                     base_header: str | None = None, cand_header: str | None = None) -> Table:
    """Metric rows: both values, ``cand / base`` with its interval, and what that means."""
    untrusted = untrusted_run(pair, _run_label(base_header, pair.base), _run_label(cand_header, pair.cand))
    base_header = (base_header or pair.base.variant) + _status(pair.base)
    cand_header = (cand_header or pair.cand.variant) + _status(pair.cand)
    ratios = {m.key: metric_ratio(pair, m, confidence=confidence) for m in METRICS}
    sampled = [r.n for key, r in ratios.items() if key in SAMPLED_METRICS and r is not None]
    method = describe_method(pair, confidence, min(sampled) if sampled else None)
    caption = (f"ratio = {cand_header} / {base_header}; {method}. Rates: higher is better; CPU seconds, "
               "latency, syncs, memory, warm-up: lower is better.")
    table = Table(title=title or pair.label, caption=caption, caption_justify="left")
    table.add_column("metric")
    table.add_column(base_header, justify="right")
    table.add_column(cand_header, justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("change", no_wrap=True)
    unstable = [run.variant for run in (pair.base, pair.cand) if run.status == "unstable"]
    withheld = False
    for metric in METRICS:
        ratio = ratios[metric.key]
        words = change(ratio, metric.higher_is_better, untrusted and f"run {untrusted[0]} not trustworthy")
        if unstable and words and ratio is not None and ratio.method != "single":
            words = f"no verdict: {' and '.join(unstable)} unstable"  # a change between wrong computations
        withheld = withheld or "not confirmed:" in words
        cells = (metric.key, fmt_value(metric, pair.base), fmt_value(metric, pair.cand),
                 "-" if ratio is None else ratio.fmt(), words)
        table.add_row(*(escape(c) for c in cells))
    stab = lambda r: f"{r.stability.get('float64_ops')} / {r.stability.get('nonfinite_events')}"  # noqa: E731
    table.add_row("float64_ops / nonfinite_events", stab(pair.base), stab(pair.cand), "", "")
    if withheld and untrusted is not None:  # the cells stay short; the reason is said once, here
        table.caption = f"{caption} Not confirmed: run {untrusted[0]} is not trustworthy ({untrusted[1]})."
    return table


def _run_label(header: str | None, run: RunResult) -> str:
    """A run as a verdict names it: ``A (optimized)`` under a file header ``A: a.json``, else its variant."""
    return run.variant if header is None else f"{header.partition(':')[0]} ({run.variant})"


def _status(run: RunResult) -> str:
    return "" if run.status == "ok" else f" ({run.status})"


# --------------------------------------------------------------------------- each run's machine state and quality

NOT_RECORDED = "not recorded"


def _load(state: dict[str, Any]) -> str:
    before, after = state.get("load_avg_before"), state.get("load_avg_after")
    if not before or not after:
        return NOT_RECORDED
    return f"{before[0]:.2f} -> {after[0]:.2f}"


def _others_share(state: dict[str, Any]) -> str:
    share = state.get("others_cpu_share") or {}
    if share.get("median") is None or share.get("max") is None:
        return NOT_RECORDED
    return f"{100 * share['median']:.0f} % / {100 * share['max']:.0f} %"


def _threads(state: dict[str, Any]) -> str:
    threads = state.get("threads") or {}
    if threads.get("intra_op") is None:
        return NOT_RECORDED
    capped = threads.get("capped_from")
    return f"{threads['intra_op']} / {threads.get('inter_op', '?')}" + (f" (capped from {capped})" if capped else "")


def _thread_env(state: dict[str, Any]) -> str:
    env = state.get("thread_env")
    if not isinstance(env, dict):
        return NOT_RECORDED
    return ", ".join(f"{name}={value}" for name, value in env.items() if value is not None) or "none set"


STATE_FIELDS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("load avg (1 min) before -> after", _load),
    ("others' CPU share median / max", _others_share),
    ("threads intra / inter", _threads),
    ("thread env vars", _thread_env),
)
"""What is shown of a run's ``machine_state``, as (label, formatter)."""


def state_cells(run: RunResult) -> list[str]:
    """A run's machine state as short texts, one per ``STATE_FIELDS`` ("not recorded" where missing)."""
    state = run.machine_state if isinstance(run.machine_state, dict) else {}
    return [fmt(state) for _, fmt in STATE_FIELDS]


def untrustworthy_reasons(run: RunResult) -> list[str] | None:
    """The reasons of a run judged not trustworthy; None for a trustworthy run or one without a verdict."""
    quality = run.quality
    if not isinstance(quality, dict) or quality.get("trustworthy") is not False:
        return None
    return list(quality.get("reasons") or []) or ["no reason recorded"]


def quality_text(run: RunResult) -> str:
    """``trustworthy``, ``NOT trustworthy: reason; reason`` or ``quality not recorded``."""
    if not isinstance(run.quality, dict) or "trustworthy" not in run.quality:
        return f"quality {NOT_RECORDED}"
    reasons = untrustworthy_reasons(run)
    return "trustworthy" if reasons is None else "NOT trustworthy: " + "; ".join(reasons)


def state_line(label: str, run: RunResult) -> str:
    """One line per run under a comparison: its machine state, then its quality verdict."""
    cells = state_cells(run)
    if all(cell == NOT_RECORDED for cell in cells):
        return f"{label}: machine state {NOT_RECORDED}; {quality_text(run)}"
    parts = [f"{name} {cell}" for (name, _), cell in zip(STATE_FIELDS, cells)]
    return f"{label}: " + "; ".join(parts) + f"; {quality_text(run)}"


def untrustworthy_warning(label: str, run: RunResult) -> str | None:
    """``rlgauge: warning: LABEL is not trustworthy: reasons`` for an untrustworthy run, else None."""
    reasons = untrustworthy_reasons(run)
    return None if reasons is None else f"rlgauge: warning: {label} is not trustworthy: {'; '.join(reasons)}"
