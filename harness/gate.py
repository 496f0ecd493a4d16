"""Gate verdicts: throughput regressions the interval confirms (two result files), speedups
below a minimum (one process, paired rounds), stability failures and learning below its bar. Thresholds come from ``gates.yaml``;
the CLI turns the verdicts into exit codes (0 pass, 1 fail).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape
from rich.table import Table

from reference_trainers.common.config_files import safe_load

from .compare import RATE_METRICS, METRICS, Pair, Ratio, file_pairs, metric_ratio, variant_pairs
from .errors import UserError
from .results import RunResult

GATES_FILE = Path(__file__).resolve().parent / "gates.yaml"
_KEYS = ("max_slowdown_pct", "throughput_metrics", "min_speedup", "confidence", "compile_fallback", "learning")


@dataclass(frozen=True)
class LearningBar:
    min_return: float
    min_env_steps: int


@dataclass(frozen=True)
class Thresholds:
    max_slowdown_pct: float = 10.0
    throughput_metrics: tuple[str, ...] = ("env_steps_per_sec",)
    min_speedup: float = 1.0
    confidence: float = 0.95
    allow_compile_fallback: bool = False
    learning: dict[str, LearningBar] = field(default_factory=dict)

    def with_overrides(self, *, max_slowdown_pct: float | None = None, min_speedup: float | None = None,
                       confidence: float | None = None, allow_compile_fallback: bool = False) -> "Thresholds":
        """Command-line values over the file's; each checked like the file's."""
        return replace(
            self,
            max_slowdown_pct=self.max_slowdown_pct if max_slowdown_pct is None else
            _check_slowdown(max_slowdown_pct, "--max-slowdown"),
            min_speedup=self.min_speedup if min_speedup is None else _check_speedup(min_speedup, "--min-speedup"),
            confidence=self.confidence if confidence is None else _check_confidence(confidence, "--confidence"),
            allow_compile_fallback=self.allow_compile_fallback or allow_compile_fallback,
        )


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _check_slowdown(value: Any, where: str) -> float:
    pct = _number(value, where)
    if not 0 <= pct < 100:
        raise UserError(f"{where}: {pct:g} is not a slowdown percentage; accepted: 0 <= PCT < 100")
    return pct


def _check_speedup(value: Any, where: str) -> float:
    x = _number(value, where)
    if x <= 0:
        raise UserError(f"{where}: {x:g} is not a speedup; accepted: a number > 0 (1.0 = as fast as the baseline)")
    return x


def _check_confidence(value: Any, where: str) -> float:
    c = _number(value, where)
    if not 0.5 <= c < 1:
        raise UserError(f"{where}: {c:g} is not a confidence level; accepted: 0.5 <= C < 1 (e.g. 0.95)")
    return c


def load_thresholds(path: Path | None = None) -> Thresholds:
    """Read and validate a thresholds file (the shipped ``gates.yaml`` by default)."""
    path = Path(path) if path is not None else GATES_FILE
    try:
        data = safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"thresholds file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read thresholds file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserError(f"{path}: malformed YAML{where}: {' '.join(str(getattr(exc, 'problem', None) or exc).split())}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of thresholds ({', '.join(_KEYS)})")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise UserError(f"{path}: unknown key {unknown[0]!r}; accepted: {', '.join(_KEYS)}")
    defaults = Thresholds()
    metrics = data.get("throughput_metrics", list(defaults.throughput_metrics))
    if not isinstance(metrics, list) or not metrics or any(m not in RATE_METRICS for m in metrics):
        raise UserError(f"{path}: throughput_metrics must be a non-empty list of {', '.join(RATE_METRICS)}")
    fallback = data.get("compile_fallback", "fail")
    if fallback not in ("fail", "allow"):
        raise UserError(f"{path}: compile_fallback {fallback!r}; accepted: fail, allow")
    return Thresholds(
        max_slowdown_pct=_check_slowdown(data.get("max_slowdown_pct", defaults.max_slowdown_pct), f"{path}: max_slowdown_pct"),
        throughput_metrics=tuple(metrics),
        min_speedup=_check_speedup(data.get("min_speedup", defaults.min_speedup), f"{path}: min_speedup"),
        confidence=_check_confidence(data.get("confidence", defaults.confidence), f"{path}: confidence"),
        allow_compile_fallback=fallback == "allow",
        learning=_learning_bars(data.get("learning") or {}, path),
    )


def _learning_bars(data: Any, path: Path) -> dict[str, LearningBar]:
    if not isinstance(data, dict):
        raise UserError(f"{path}: learning must map preset names to {{min_return, min_env_steps}}")
    bars = {}
    for preset, bar in data.items():
        where = f"{path}: learning.{preset}"
        if not isinstance(bar, dict) or set(bar) != {"min_return", "min_env_steps"}:
            raise UserError(f"{where}: expected {{min_return: NUMBER, min_env_steps: INT}}")
        steps = bar["min_env_steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise UserError(f"{where}.min_env_steps: expected an integer >= 0, got {steps!r}")
        bars[str(preset)] = LearningBar(_number(bar["min_return"], f"{where}.min_return"), steps)
    return bars


# --------------------------------------------------------------------------- checks

@dataclass(frozen=True)
class Check:
    """One verdict row: ``passed`` is None when the check did not apply (shown as skip)."""

    check: str
    run: str
    measured: str
    threshold: str
    passed: bool | None
    note: str = ""

    @property
    def verdict(self) -> str:
        return {True: "pass", False: "FAIL", None: "skip"}[self.passed]


def _name(run: RunResult) -> str:
    return f"{run.preset}/{run.variant}"


def _metric(key: str):  # noqa: ANN202 - a compare.Metric
    return next(m for m in METRICS if m.key == key)


def _interval(ratio: Ratio) -> str:
    return f"{ratio.value:.3f}x [{ratio.low:.3f}-{ratio.high:.3f}]"


def throughput_checks(pair: Pair, th: Thresholds) -> list[Check]:
    """Candidate/baseline of each gated rate: fails when the whole interval is below 1 - pct/100."""
    bar = 1.0 - th.max_slowdown_pct / 100.0
    checks = []
    for key in th.throughput_metrics:
        ratio = metric_ratio(pair, _metric(key), confidence=th.confidence)
        name, threshold = f"{key} candidate/baseline", f">= {bar:.3f}x (-{th.max_slowdown_pct:g} %)"
        if ratio is None:
            missing = pair.base if not (pair.base.metrics.get(key) or {}).get("samples") else pair.cand
            checks.append(Check(name, pair.label, "-", threshold, False,
                                f"{'baseline' if missing is pair.base else 'candidate'} has no {key} "
                                f"(status {missing.status})"))
            continue
        passed = ratio.high >= bar
        note = ("slower beyond the threshold, confirmed by the interval" if not passed else
                "below the bar, but not confirmed by the interval" if ratio.value < bar else "")
        checks.append(Check(name, pair.label, _interval(ratio), threshold, passed, note))
    return checks


def speedup_checks(pair: Pair, th: Thresholds) -> list[Check]:
    """Optimized/baseline env_steps_per_sec of one process: fails when the median of the per-round
    ratios is below min_speedup. Paired rounds cancel drift, and a median of many short rounds
    shrugs off the odd disturbed one, so the estimate itself is the verdict; the interval is shown."""
    key = "env_steps_per_sec"
    ratio = metric_ratio(pair, _metric(key), confidence=th.confidence)
    name, threshold = f"speedup {pair.cand.variant}/{pair.base.variant}", f">= {th.min_speedup:g}x"
    if ratio is None:
        return [Check(name, pair.cand.preset, "-", threshold, False, f"a variant has no {key} measured")]
    passed = ratio.value >= th.min_speedup
    note = ("" if ratio.low >= th.min_speedup or ratio.high < th.min_speedup else
            "the interval reaches below the minimum" if passed else "the interval reaches above the minimum")
    return [Check(name, pair.cand.preset, _interval(ratio), threshold, passed, note)]


def stability_checks(run: RunResult, th: Thresholds) -> list[Check]:
    stab, name = run.stability, _name(run)
    checks = [Check("status", name, run.status, "ok", run.status == "ok", (run.error or "")[:120])]
    for key in ("float64_ops", "nonfinite_events"):
        value = stab.get(key)
        checks.append(Check(key, name, str(value), "0", value == 0))
    fallback = bool(stab.get("compile_fallback"))
    checks.append(Check("compile_fallback", name, str(fallback).lower(),
                        "allowed" if th.allow_compile_fallback else "false", th.allow_compile_fallback or not fallback))
    return checks


def trained_env_steps(run: RunResult) -> int:
    """Env steps a run trained for (warm-up budget + timed steps): the learning check's clock."""
    warmup = ((run.config.get("run") or {}).get("warmup_steps")) or 0
    return int(warmup) + int(run.steps_completed or 0)


def learning_checks(run: RunResult, th: Thresholds) -> list[Check]:
    bar = th.learning.get(run.preset)
    if bar is None:
        return []
    value, trained = run.metrics.get("mean_return_last_k"), trained_env_steps(run)
    threshold = f">= {bar.min_return:g} after {bar.min_env_steps:,} steps"
    measured = "-" if value is None else f"{value:.1f}"
    if trained < bar.min_env_steps:
        return [Check("mean_return_last_k", _name(run), measured, threshold, None,
                      f"trained {trained:,} env steps: too short to judge")]
    if value is None:
        return [Check("mean_return_last_k", _name(run), measured, threshold, False, "no episode finished")]
    return [Check("mean_return_last_k", _name(run), measured, threshold, value >= bar.min_return)]


def run_checks(runs: list[RunResult], th: Thresholds) -> list[Check]:
    return [c for run in runs for c in (*stability_checks(run, th), *learning_checks(run, th))]


def gate_files(base_runs: list[RunResult], cand_runs: list[RunResult], th: Thresholds,
               base_name: str = "--baseline", cand_name: str = "--candidate") -> tuple[list[Check], list[Pair]]:
    """Candidate file against baseline file: throughput of matched runs, stability of every candidate run."""
    pairs = file_pairs(base_runs, cand_runs, base_name, cand_name)
    checks = [c for pair in pairs for c in throughput_checks(pair, th)]
    return checks + run_checks(cand_runs, th), pairs


def gate_variants(runs: list[RunResult], th: Thresholds) -> tuple[list[Check], list[Pair]]:
    """Variants measured interleaved in one process: speedup of each against baseline, stability of all."""
    pairs = variant_pairs(runs, "the gated run")
    checks = [c for pair in pairs for c in speedup_checks(pair, th)]
    return checks + run_checks(runs, th), pairs


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.passed is False]


def checks_table(checks: list[Check], title: str) -> Table:
    table = Table(title=title)
    for column, justify in (("check", "left"), ("run", "left"), ("measured", "right"), ("threshold", "left"),
                            ("verdict", "left"), ("note", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for c in checks:
        table.add_row(*(escape(x) for x in (c.check, c.run, c.measured, c.threshold, c.verdict, c.note)))
    return table
