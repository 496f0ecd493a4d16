"""Gate verdicts: throughput regressions the interval confirms (two result files), speedups
below a minimum (one process, paired rounds), stability failures and learning below its bar. Thresholds come from ``gates.yaml``;
the CLI turns the verdicts into exit codes (0 pass, 1 fail).

A gate decides only on figures that can carry a verdict: a throughput or speedup check with
fewer than ``power.MIN_REPEATS`` repeats is neither pass nor fail (``underpowered``), and a
run whose quality verdict says it is not trustworthy is refused (``check_quality``); the CLI
turns both into exit code 2. A speedup that fails just short of its minimum is measured once
more (``remeasure_reason``). Runs of a different algorithm, env or batch shape are not compared
(``check_setup``: exit code 2) unless the user allows it; the mismatch then shows as a waived check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from rich.markup import escape
from rich.table import Table

from reference_trainers.config.files import safe_load

from harness.stats import power
from harness.stats.compare import (RATE_METRICS, METRICS, Pair, Ratio, file_pairs, metric_ratio, untrustworthy_reasons,
                      variant_pairs)
from harness.errors import NoVerdict, UserError
from harness.results import RunResult

GATES_FILE = Path(__file__).resolve().parent / "gates.yaml"
_KEYS = ("max_slowdown_pct", "throughput_metrics", "min_speedup", "remeasure_margin_pct", "confidence",
         "compile_fallback", "learning")


@dataclass(frozen=True)
class LearningBar:
    min_return: float
    min_env_steps: int


@dataclass(frozen=True)
class Thresholds:
    max_slowdown_pct: float = 10.0
    throughput_metrics: tuple[str, ...] = ("env_steps_per_sec",)
    min_speedup: float = 1.0
    remeasure_margin_pct: float = 10.0
    """``gate --run``: a speedup that fails by less than this (in % of the minimum) is measured again."""
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


def _check_margin(value: Any, where: str) -> float:
    pct = _number(value, where)
    if not 0 <= pct < 100:
        raise UserError(f"{where}: {pct:g} is not a margin; accepted: 0 <= PCT < 100 (0: never measure again)")
    return pct


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
        remeasure_margin_pct=_check_margin(data.get("remeasure_margin_pct", defaults.remeasure_margin_pct),
                                           f"{path}: remeasure_margin_pct"),
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
    """One verdict row: ``passed`` is None when the check did not apply (shown as skip) or had too
    few repeats for a verdict (``underpowered`` holds them; shown as no verdict)."""

    check: str
    run: str
    measured: str
    threshold: str
    passed: bool | None
    note: str = ""
    underpowered: int | None = None
    """The repeats behind the ratio when fewer than ``power.MIN_REPEATS``."""
    waived: bool = False
    """A refusal the user overrode (``--allow-config-mismatch``): shown, neither pass nor fail."""

    @property
    def verdict(self) -> str:
        if self.waived:
            return "waived"
        if self.underpowered is not None:
            return "no verdict"
        return {True: "pass", False: "FAIL", None: "skip"}[self.passed]


def _name(run: RunResult) -> str:
    return f"{run.preset}/{run.variant}"


def _metric(key: str):  # noqa: ANN202 - a compare.Metric
    return next(m for m in METRICS if m.key == key)


def _interval(ratio: Ratio) -> str:
    return f"{ratio.value:.3f}x [{ratio.low:.3f}-{ratio.high:.3f}]"


def _with_resolution(note: str, ratio: Ratio) -> str:
    return f"{note}; {power.resolution_note(ratio)}" if note else power.resolution_note(ratio)


def _no_verdict(name: str, run: str, ratio: Ratio, threshold: str) -> Check:
    return Check(name, run, _interval(ratio), threshold, None, power.no_verdict(ratio.n), underpowered=ratio.n)


def throughput_checks(pair: Pair, th: Thresholds) -> list[Check]:
    """Candidate/baseline of each gated rate: fails when the whole interval is below 1 - pct/100."""
    bar = 1.0 - th.max_slowdown_pct / 100.0
    checks = []
    unstable = [side for side, run in (("baseline", pair.base), ("candidate", pair.cand)) if run.status == "unstable"]
    for key in th.throughput_metrics:
        ratio = metric_ratio(pair, _metric(key), confidence=th.confidence)
        name, threshold = f"{key} candidate/baseline", f">= {bar:.3f}x (-{th.max_slowdown_pct:g} %)"
        if unstable and ratio is not None:  # a rate of a run that computed the wrong thing is no verdict's base
            checks.append(Check(name, pair.label, _interval(ratio), threshold, None,
                                f"not judged: the {' and '.join(unstable)} "
                                f"{'runs are' if len(unstable) > 1 else 'run is'} unstable"))
            continue
        if ratio is None:
            missing = pair.base if not (pair.base.metrics.get(key) or {}).get("samples") else pair.cand
            checks.append(Check(name, pair.label, "-", threshold, False,
                                f"{'baseline' if missing is pair.base else 'candidate'} has no {key} "
                                f"(status {missing.status})"))
            continue
        if not power.has_power(ratio.n):
            checks.append(_no_verdict(name, pair.label, ratio, threshold))
            continue
        passed = ratio.high >= bar
        note = ("slower beyond the threshold, confirmed by the interval" if not passed else
                "below the bar, but not confirmed by the interval" if ratio.value < bar else "")
        checks.append(Check(name, pair.label, _interval(ratio), threshold, passed, _with_resolution(note, ratio)))
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
    if not power.has_power(ratio.n):
        return [_no_verdict(name, pair.cand.preset, ratio, threshold)]
    passed = ratio.value >= th.min_speedup
    note = ("" if ratio.low >= th.min_speedup or ratio.high < th.min_speedup else
            "the interval reaches below the minimum" if passed else "the interval reaches above the minimum")
    return [Check(name, pair.cand.preset, _interval(ratio), threshold, passed, _with_resolution(note, ratio))]


def stability_checks(run: RunResult, th: Thresholds) -> list[Check]:
    stab, name = run.stability, _name(run)
    checks = [Check("status", name, run.status, "ok", run.status == "ok", (run.error or "")[:120])]
    for key in ("float64_ops", "nonfinite_events"):
        value = stab.get(key)
        site = stab.get(key.replace("_ops", "_first_site").replace("_events", "_first_site")) if value else None
        checks.append(Check(key, name, str(value), "0", value == 0, f"first: {site}" if site else ""))
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


# --------------------------------------------------------------------------- figures a gate may decide on

def no_power_message(repeats: int, where: str = "") -> str:
    """The one line of a gate that has too few repeats for a verdict."""
    return (f"gate: {power.no_verdict(repeats)}{f' in {where}' if where else ''}; measure with --repeats "
            f"{power.MIN_REPEATS} or more")


def underpowered(checks: list[Check]) -> str | None:
    """The one-line refusal when a check has too few repeats for a verdict (None when every check has them)."""
    short = [c for c in checks if c.underpowered is not None]
    if not short:
        return None
    first = min(short, key=lambda c: c.underpowered or 0)
    return no_power_message(first.underpowered or 0, first.run)


def check_quality(runs: list[tuple[str, RunResult]], allow: bool) -> list[str]:
    """Refuse (``UserError``, one line naming the run and its first reason) to gate a run judged not
    trustworthy, unless ``allow``; returns the stderr lines to print: a warning per untrustworthy
    run when allowed, and a note naming the runs without a quality verdict (older files)."""
    lines = []
    for label, run in runs:
        reasons = untrustworthy_reasons(run)
        if reasons is None:
            continue
        if not allow:
            raise NoVerdict(f"gate: {label} is not trustworthy: {reasons[0]} (--allow-untrustworthy to gate anyway)")
        lines.append(f"rlgauge: warning: {label} is not trustworthy: {'; '.join(reasons)} (gated anyway)")
    unrecorded = [label for label, run in runs if not isinstance(run.quality, dict)]
    if unrecorded:
        lines.append(f"rlgauge: note: quality not recorded for {', '.join(unrecorded)} (older result files); "
                     "gated without it")
    return lines


# --------------------------------------------------------------------------- runs a gate may compare

SETUP_KEYS = ("algo", "env.id", "env.num_envs")
"""What two gated runs must share: the algorithm, the env and the number of sub-envs ..."""
BATCH_KEYS = {"ppo": ("ppo.num_steps", "ppo.num_minibatches"), "dqn": ("dqn.batch_size",),
              "iqn": ("iqn.batch_size",)}
"""... and the algorithm's rollout and batch sizes. Never an optimisation flag: the two variants of
one preset differ in those by design (``gate --run``)."""


def _dotted(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def setup_differences(base_algo: str, base_config: dict[str, Any], cand_algo: str,
                      cand_config: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, base value, candidate value)`` for each algorithm / env / batch-shape key that differs.
    A key missing from either config (older files) is not compared; with different algorithms the
    algorithm's own sections are not compared either (the algorithm says it all)."""
    keys = [*SETUP_KEYS, *(BATCH_KEYS.get(base_algo, ()) if base_algo == cand_algo else ())]
    values = {"algo": (base_algo, cand_algo)}
    values.update({k: (_dotted(base_config, k), _dotted(cand_config, k)) for k in keys if k != "algo"})
    return [(k, *values[k]) for k in keys
            if None not in values[k] and values[k][0] != values[k][1]]


def differences_text(differences: list[tuple[str, Any, Any]]) -> str:
    return ", ".join(f"{key} {base} vs {cand}" for key, base, cand in differences)


def check_setup(pairs: list[Pair], allow: bool, sides: tuple[str, str] = ("baseline", "candidate")) -> list[Check]:
    """Refuse (``UserError``, one line naming the runs, each differing key and both values) to gate runs
    of a different algorithm, env or batch shape, unless ``allow``; then one waived check per such pair."""
    checks = []
    for pair in pairs:
        differences = setup_differences(pair.base.algo, pair.base.config, pair.cand.algo, pair.cand.config)
        if not differences:
            continue
        text = differences_text(differences)
        if not allow:
            raise _setup_refusal(pair.label, sides, text)
        checks.append(Check("setup (algo, env, batch)", pair.label, text, "the same", None,
                            "gated anyway (--allow-config-mismatch)", waived=True))
    return checks


def check_spec_setup(specs: list[Any]) -> None:
    """``gate --run`` before measuring: refuse variants (``VariantSpec``) whose algorithm, env or batch
    shape differ from the first one's (a user's preset file can set more than flags per variant)."""
    from reference_trainers.config.schema import to_plain_dict

    first = specs[0]
    if not hasattr(first.config, "model_dump"):  # a user's trainer: its settings are free-form, its variants its own
        return
    for spec in specs[1:]:
        differences = setup_differences(first.config.algo, to_plain_dict(first.config), spec.config.algo,
                                        to_plain_dict(spec.config))
        if differences:
            raise _setup_refusal(spec.preset, (first.variant, spec.variant), differences_text(differences))


def _setup_refusal(label: str, sides: tuple[str, str], text: str) -> UserError:
    return UserError(f"gate: {label}: {sides[0]} and {sides[1]} differ in setup: {text} (accepted: runs of the "
                     "same algorithm, env and batch shape; --allow-config-mismatch to gate anyway)")


def remeasure_reason(runs: list[RunResult], checks: list[Check], th: Thresholds) -> str | None:
    """Why ``gate --run`` should measure once more, or None: every failed check is a speedup just short
    of its minimum (within ``remeasure_margin_pct`` of it, or its interval reaching it)."""
    bad = failed(checks)
    if th.remeasure_margin_pct == 0 or not bad or any(not c.check.startswith("speedup ") for c in bad):
        return None
    near = th.min_speedup * (1.0 - th.remeasure_margin_pct / 100.0)
    reasons = []
    for pair in variant_pairs(runs, "the gated run"):
        ratio = metric_ratio(pair, _metric("env_steps_per_sec"), confidence=th.confidence)
        if ratio is not None and ratio.value >= th.min_speedup:
            continue
        if ratio is None or not power.has_power(ratio.n) or (ratio.value < near and ratio.high < th.min_speedup):
            return None  # missing, without a verdict, or clearly short: a second measurement would not help
        why = (f"within {th.remeasure_margin_pct:g} % of the minimum" if ratio.value >= near else
               "its interval reaches the minimum")
        reasons.append(f"{pair.cand.preset} speedup {_interval(ratio)} is below {th.min_speedup:g}x but {why}")
    return "; ".join(reasons) or None


def checks_table(checks: list[Check], title: str) -> Table:
    table = Table(title=title)
    for column, justify in (("check", "left"), ("run", "left"), ("measured", "right"), ("threshold", "left"),
                            ("verdict", "left"), ("note", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for c in checks:
        table.add_row(*(escape(x) for x in (c.check, c.run, c.measured, c.threshold, c.verdict, c.note)))
    return table
