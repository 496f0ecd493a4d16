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

Both use ``RESAMPLES`` resamples from a fixed seed, so the same files always give the same
interval. With few repeats the interval is honest rather than narrow: with 3 paired rounds
it is the range of the 3 ratios. Metrics measured once per run (latency percentiles,
memory) get a plain ratio and no interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from rich.markup import escape
from rich.table import Table

from .errors import UserError
from .results import RunResult

RESAMPLES = 2000
SEED = 20240607
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Ratio:
    """``candidate / baseline`` with a confidence interval (low == high == value when there is none)."""

    value: float
    low: float
    high: float
    method: str
    """``paired`` | ``independent`` | ``single`` (one value per run: no interval)."""
    n: int
    """Rounds (paired) or the smaller sample count (independent) behind the interval."""

    def fmt(self) -> str:
        if self.method == "single":
            return f"{self.value:.2f}x"
        return f"{self.value:.2f}x [{self.low:.2f}-{self.high:.2f}]"


def _bootstrap_quantiles(estimates: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(estimates, [tail, 1.0 - tail])
    return float(low), float(high)


def paired_ratio(base: list[float], cand: list[float], *, confidence: float = CONFIDENCE,
                 seed: int = SEED) -> Ratio:
    """Median of the round-by-round ratios ``cand[i] / base[i]``, bootstrap interval over rounds."""
    pairs = [(b, c) for b, c in zip(base, cand) if b > 0]
    if not pairs:
        raise ValueError("no round with a positive baseline sample")
    ratios = np.array([c / b for b, c in pairs], dtype=np.float64)
    value = float(np.median(ratios))
    if len(ratios) == 1:
        return Ratio(value, value, value, "paired", 1)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ratios), size=(RESAMPLES, len(ratios)))
    low, high = _bootstrap_quantiles(np.median(ratios[idx], axis=1), confidence)
    return Ratio(value, min(low, value), max(high, value), "paired", len(ratios))


def independent_ratio(base: list[float], cand: list[float], *, confidence: float = CONFIDENCE,
                      seed: int = SEED) -> Ratio:
    """``median(cand) / median(base)`` with a bootstrap interval resampling each side on its own."""
    b, c = np.asarray(base, dtype=np.float64), np.asarray(cand, dtype=np.float64)
    if b.size == 0 or c.size == 0 or np.median(b) <= 0:
        raise ValueError("need samples on both sides and a positive baseline median")
    value = float(np.median(c) / np.median(b))
    if b.size == 1 and c.size == 1:
        return Ratio(value, value, value, "independent", 1)
    rng = np.random.default_rng(seed)
    mb = np.median(b[rng.integers(0, b.size, size=(RESAMPLES, b.size))], axis=1)
    mc = np.median(c[rng.integers(0, c.size, size=(RESAMPLES, c.size))], axis=1)
    low, high = _bootstrap_quantiles(mc / mb, confidence)
    return Ratio(value, min(low, value), max(high, value), "independent", int(min(b.size, c.size)))


def single_ratio(base: float, cand: float) -> Ratio:
    return Ratio(cand / base, cand / base, cand / base, "single", 1)


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


def variant_pairs(runs: list[RunResult], source: str = "the result file") -> list[Pair]:
    """Within one process's runs: each preset's other variants against its ``baseline`` (paired)."""
    pairs: list[Pair] = []
    for preset in dict.fromkeys(r.preset for r in runs):
        group = [r for r in runs if r.preset == preset]
        base = next((r for r in group if r.variant == "baseline"), group[0])
        pairs += [Pair(base, r, paired=True) for r in group if r is not base]
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
METRICS: tuple[Metric, ...] = (
    *(Metric(key, True, _metric(key), 0) for key in RATE_METRICS),
    Metric("inference_latency_ms p50", False, _latency("p50"), 3),
    Metric("inference_latency_ms p95", False, _latency("p95"), 3),
    Metric("host_syncs_per_step", False, _metric("host_syncs_per_step")),
    Metric("peak_host_rss_mb", False, _metric("peak_host_rss_mb"), 0),
    Metric("peak_device_mem_mb", False, _metric("peak_device_mem_mb"), 0),
    Metric("warmup_s", False, _metric("warmup_s")),
    Metric("mean_return_last_k", None, _metric("mean_return_last_k"), 1),
)


def rate_samples(run: RunResult, key: str) -> list[float] | None:
    """The per-repeat samples of a rate metric, or None when the run measured none."""
    block = run.metrics.get(key)
    if not isinstance(block, dict) or not block.get("samples"):
        return None
    return [float(s) for s in block["samples"]]


def metric_ratio(pair: Pair, metric: Metric, *, confidence: float = CONFIDENCE) -> Ratio | None:
    """``cand / base`` for one metric, with an interval where it has per-repeat samples."""
    if metric.higher_is_better is None:
        return None
    if metric.key in RATE_METRICS:
        base, cand = rate_samples(pair.base, metric.key), rate_samples(pair.cand, metric.key)
        if not base or not cand:
            return None
        if pair.paired and len(base) == len(cand):
            return paired_ratio(base, cand, confidence=confidence)
        return independent_ratio(base, cand, confidence=confidence)
    b, c = metric.value(pair.base), metric.value(pair.cand)
    if isinstance(b, (int, float)) and isinstance(c, (int, float)) and b > 0:
        return single_ratio(float(b), float(c))
    return None


def change(ratio: Ratio | None, higher_is_better: bool | None) -> str:
    """Plain words for a ratio with an interval: better / worse only when the whole interval says so."""
    if ratio is None or higher_is_better is None or ratio.method == "single":
        return ""  # one value per run: no interval, no verdict
    if ratio.low > 1 or ratio.high < 1:
        return ("better" if (ratio.low > 1) == higher_is_better else "worse") + ", confirmed"
    return "no confirmed change"


def fmt_value(metric: Metric, run: RunResult) -> str:
    value = metric.value(run)
    if value is None:
        return "-"
    if isinstance(value, dict):
        return f"{value['median']:,.0f} [{value['min']:,.0f}-{value['max']:,.0f}]"
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


def describe_method(pair: Pair, confidence: float = CONFIDENCE) -> str:
    level = f"{confidence * 100:g} % bootstrap CI"
    if pair.paired:
        return f"paired (repeats interleaved in one process): median of per-round ratios [{level}]"
    return f"independent (two processes): ratio of medians [{level}]"


def comparison_table(pair: Pair, *, confidence: float = CONFIDENCE, title: str | None = None,
                     base_header: str | None = None, cand_header: str | None = None) -> Table:
    """Metric rows: both values, ``cand / base`` with its interval, and what that means."""
    base_header = (base_header or pair.base.variant) + _status(pair.base)
    cand_header = (cand_header or pair.cand.variant) + _status(pair.cand)
    caption = (f"ratio = {cand_header} / {base_header}; {describe_method(pair, confidence)}. Rates: higher is "
               "better; latency, syncs, memory, warm-up: lower is better.")
    table = Table(title=title or pair.label, caption=caption, caption_justify="left")
    table.add_column("metric")
    table.add_column(base_header, justify="right")
    table.add_column(cand_header, justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("change")
    for metric in METRICS:
        ratio = metric_ratio(pair, metric, confidence=confidence)
        cells = (metric.key, fmt_value(metric, pair.base), fmt_value(metric, pair.cand),
                 "-" if ratio is None else ratio.fmt(), change(ratio, metric.higher_is_better))
        table.add_row(*(escape(c) for c in cells))
    stab = lambda r: f"{r.stability.get('float64_ops')} / {r.stability.get('nonfinite_events')}"  # noqa: E731
    table.add_row("float64_ops / nonfinite_events", stab(pair.base), stab(pair.cand), "", "")
    return table


def _status(run: RunResult) -> str:
    return "" if run.status == "ok" else f" ({run.status})"
