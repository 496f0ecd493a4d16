"""Calibrate the throughput gate on this machine: its false alarms, and how often it catches a slowdown.

One interleaved measurement (``runner.run_variants``, the order rotated each round) of five arms of
one preset and variant: ``A`` and ``A2`` (identical), and ``slow10`` / ``slow20`` / ``slow50`` with
``run.planted_slowdown_pct`` at 10 / 20 / 50. Each arm runs ``rounds = trials x max(repeats grid)``
timed repeats of a short budget.

A trial with ``r`` repeats is a block of ``r`` consecutive rounds (``floor(rounds / r)`` blocks). Its
ratio is ``compare.paired_ratio`` of the block's samples against ``A``'s, and the gate's throughput
rule (``gate.throughput_checks``) flags it when the interval's high end is below
``1 - threshold / 100``. A false alarm is ``A2`` flagged; a detection is a ``slow*`` arm flagged.
Rates are ``k/n`` with a Wilson 95 % interval.

The recommendation is the smallest ``r`` whose false-alarm rate is at most 1 % and whose detection
of the 20 % slowdown is at least 95 % (point estimates) at some threshold; of those thresholds, the
largest: it meets the detection target with the most margin against false alarms, which two
result files from separate processes (the gate's ``--baseline/--candidate``) have more of than
the paired rounds of one process measured here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from reference_trainers.config.schema import TrainConfig, build_config

from harness.campaigns.outcome import EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK, run_arms, save_runs, status_code
from harness.cli.options import user_overrides
from harness.stats.compare import CONFIDENCE, Ratio, paired_ratio
from harness.errors import UserError
from harness.stats.power import MIN_REPEATS
from harness.specs.presets import VariantSpec, specs_for
from harness.results import RunResult

PLANTED = (10, 20, 50)
"""Planted slowdowns, percent of env steps/s."""
ARMS: dict[str, float] = {"A": 0.0, "A2": 0.0, **{f"slow{pct}": float(pct) for pct in PLANTED}}
"""Arm name -> ``run.planted_slowdown_pct``; ``A`` is the reference every other arm is divided by."""
DEFAULT_REPEATS_GRID = "3,5,7,9"
DEFAULT_THRESHOLDS_GRID = "5,10,15,20"
CALIBRATE_DEFAULT_STEPS = 2048
"""Timed env steps per arm and round: many short rounds, as the gate is best run."""
MAX_FALSE_ALARM = 0.01
MIN_DETECTION = 0.95
DETECTION_TARGET_PCT = 20
"""The recommendation asks this planted slowdown to be detected at ``MIN_DETECTION``."""
Z95 = 1.959963984540054
RULE = ("flagged when the high end of the paired ratio's 95 % bootstrap interval < 1 - threshold/100 "
        "(the gate's throughput rule)")


# --------------------------------------------------------------------------- input

def parse_grid(text: str, option: str, kind: type) -> list:
    """``"3,5,7"`` -> sorted distinct numbers of ``kind``; UserError naming ``option`` otherwise."""
    values = []
    for item in text.split(","):
        try:
            value = kind(item.strip())
        except ValueError:
            raise UserError(f"{option} {text!r}: {item.strip()!r} is not a {'whole ' * (kind is int)}number; "
                            f"expected a comma-separated list such as {option} "
                            f"{DEFAULT_REPEATS_GRID if kind is int else DEFAULT_THRESHOLDS_GRID}") from None
        if not math.isfinite(value):
            raise UserError(f"{option} {text!r}: {item.strip()!r} is not a finite number")
        values.append(value)
    return sorted(set(values))


def repeats_grid(text: str) -> list[int]:
    grid = parse_grid(text, "--repeats-grid", int)
    low = [r for r in grid if r < MIN_REPEATS]
    if low:
        raise UserError(f"--repeats-grid {low[0]}: needs at least {MIN_REPEATS} repeats: power rule")
    return grid


def thresholds_grid(text: str) -> list[float]:
    grid = parse_grid(text, "--thresholds-grid", float)
    bad = [t for t in grid if not 0 < t < 100]
    if bad:
        raise UserError(f"--thresholds-grid {bad[0]:g}: not a slowdown percentage; accepted: 0 < PCT < 100")
    return grid


def check_trials(trials: int) -> int:
    if trials < 1:
        raise UserError(f"--trials {trials}: needs at least 1 trial")
    return trials


def _check_overrides(overrides: list[str]) -> None:
    """The keys calibrate sets per arm cannot be given with ``--set``."""
    for text in overrides:
        key = text.partition("=")[0].strip()
        if key in ("run.repeats", "run.planted_slowdown_pct"):
            raise UserError(f"--set {key}: calibrate sets it for each arm (rounds = --trials x the largest "
                            "--repeats-grid value; slowdowns of 10, 20, 50 %); accepted: other config keys")


# --------------------------------------------------------------------------- the arms

def arm_specs(base: VariantSpec, rounds: int) -> list[VariantSpec]:
    """The five arms: ``base``'s config with its planted slowdown set, ``rounds`` timed repeats each."""
    return [VariantSpec(base.preset, arm, with_rounds(build_config(base.config.model_dump(mode="json"),
                                                                   [f"run.planted_slowdown_pct={pct}"]), rounds))
            for arm, pct in ARMS.items()]


def with_rounds(config: TrainConfig, rounds: int) -> TrainConfig:
    """``config`` with ``run.repeats = rounds``, past the cap one ``rlgauge run`` accepts: calibrate
    needs every round in one interleaved measurement (a copy, so the cap is not re-checked)."""
    return config.model_copy(update={"run": config.run.model_copy(update={"repeats": rounds})})


def estimate_seconds(rate: float, rounds: int, steps: int, warmup: int) -> float:
    """Wall time of the measurement for a reference ``rate`` (env steps/s): each arm's warm-up and
    rounds, the planted arms slower by their slowdown."""
    return sum((warmup + rounds * steps / (1.0 - pct / 100.0)) / rate for pct in ARMS.values())


# --------------------------------------------------------------------------- statistics

def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of the proportion ``k / n`` (``(0, 1)`` when ``n`` is 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def blocks(rounds: int, r: int) -> list[slice]:
    """Trials of ``r`` consecutive rounds; the last ``rounds % r`` rounds are left out."""
    return [slice(i * r, (i + 1) * r) for i in range(rounds // r)]


def flagged(ratio: Ratio, threshold_pct: float) -> bool:
    """The gate's throughput rule: a regression beyond the threshold, confirmed by the whole interval."""
    return ratio.high < 1.0 - threshold_pct / 100.0


@dataclass(frozen=True)
class Count:
    """``k`` of ``n`` trials flagged."""

    k: int
    n: int

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else float("nan")

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.k, self.n)

    def fmt(self) -> str:
        if not self.n:
            return "-"
        low, high = self.interval
        return f"{self.k}/{self.n} = {100 * self.rate:.1f} % [{100 * low:.1f}-{100 * high:.1f}]"

    def to_json(self) -> dict[str, Any]:
        low, high = self.interval
        return {"k": self.k, "n": self.n, "rate": self.rate if self.n else None, "low": low, "high": high}


@dataclass(frozen=True)
class Cell:
    """How the gate did with ``repeats`` per run and ``--max-slowdown threshold``."""

    repeats: int
    threshold: float
    false_alarms: Count
    detections: dict[int, Count]
    """Planted slowdown percent -> trials flagged."""

    @property
    def trials(self) -> int:
        return self.false_alarms.n

    @property
    def qualifies(self) -> bool:
        return (self.trials > 0 and self.false_alarms.rate <= MAX_FALSE_ALARM
                and self.detections[DETECTION_TARGET_PCT].rate >= MIN_DETECTION)

    @property
    def shortfall(self) -> float:
        """How far from qualifying: excess false-alarm rate plus missing detection rate."""
        if not self.trials:
            return float("inf")
        return (max(0.0, self.false_alarms.rate - MAX_FALSE_ALARM)
                + max(0.0, MIN_DETECTION - self.detections[DETECTION_TARGET_PCT].rate))

    def to_json(self) -> dict[str, Any]:
        return {"repeats": self.repeats, "trials": self.trials, "threshold_pct": self.threshold,
                "false_alarms": self.false_alarms.to_json(),
                "detection": {str(pct): c.to_json() for pct, c in self.detections.items()},
                "qualifies": self.qualifies}


def evaluate(samples: dict[str, list[float]], grid: list[int], thresholds: list[float]) -> list[Cell]:
    """Every (repeats, threshold) of the grids, from the arms' per-round samples (truncated to the
    rounds every arm completed)."""
    rounds = min(len(s) for s in samples.values())
    cells = []
    for r in grid:
        ratios = {arm: [paired_ratio(samples["A"][b], samples[arm][b]) for b in blocks(rounds, r)]
                  for arm in ARMS if arm != "A"}
        for t in thresholds:
            count = lambda arm: Count(sum(flagged(x, t) for x in ratios[arm]), len(ratios[arm]))  # noqa: E731
            cells.append(Cell(r, t, count("A2"), {pct: count(f"slow{pct}") for pct in PLANTED}))
    return cells


def measured_slowdowns(samples: dict[str, list[float]]) -> dict[str, Ratio]:
    """Each arm against ``A`` over all rounds: the median per-round ratio, with its interval."""
    rounds = min(len(s) for s in samples.values())
    return {arm: paired_ratio(samples["A"][:rounds], samples[arm][:rounds]) for arm in ARMS if arm != "A"}


@dataclass(frozen=True)
class Recommendation:
    cell: Cell | None
    qualifies: bool

    @property
    def options(self) -> str:
        return "" if self.cell is None else f"--repeats {self.cell.repeats} --max-slowdown {self.cell.threshold:g}"

    def text(self) -> str:
        if self.cell is None:
            return "no recommendation: too few rounds for a single trial"
        c = self.cell
        numbers = (f"false alarms {c.false_alarms.fmt()}, {DETECTION_TARGET_PCT} % slowdown detected "
                   f"{c.detections[DETECTION_TARGET_PCT].fmt()}")
        if self.qualifies:
            return f"recommended: {self.options} ({numbers})"
        return (f"no setting meets the target (false alarms <= {100 * MAX_FALSE_ALARM:g} %, "
                f"{DETECTION_TARGET_PCT} % slowdown detected >= {100 * MIN_DETECTION:g} %); "
                f"closest: {self.options} ({numbers}); measure more repeats or longer steps")


def recommend(cells: list[Cell]) -> Recommendation:
    """The smallest repeats that qualifies, at its largest qualifying threshold; else the closest cell."""
    good = sorted((c for c in cells if c.qualifies), key=lambda c: (c.repeats, -c.threshold))
    if good:
        return Recommendation(good[0], True)
    tried = [c for c in cells if c.trials]
    if not tried:
        return Recommendation(None, False)
    return Recommendation(min(tried, key=lambda c: (c.shortfall, c.repeats, c.threshold)), False)


# --------------------------------------------------------------------------- the report

@dataclass
class Report:
    preset: str
    variant: str
    device: str
    steps: int
    warmup: int
    rounds_planned: int
    rounds: int
    cells: list[Cell]
    slowdowns: dict[str, Ratio]
    interrupted: bool = False
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def recommendation(self) -> Recommendation:
        return recommend(self.cells)

    def setup(self) -> str:
        done = (f"interrupted after {self.rounds} of {self.rounds_planned} rounds" if self.interrupted
                else f"{self.rounds} rounds")
        return (f"{len(ARMS)} arms ({', '.join(ARMS)}) interleaved in one process, {done} of "
                f"{self.steps:,} env steps each (warm-up {self.warmup:,}). A trial with r repeats = r consecutive "
                f"rounds (trials = floor(rounds / r)); {RULE}. Rates: k/n with a Wilson 95 % interval.")

    def caveat(self) -> str:
        return ("Measured paired, in one process: two result files from separate processes add the drift "
                f"between them, so their false-alarm rate can be higher. Valid for --steps {self.steps}.")

    def slowdown_rows(self) -> list[tuple[str, str, str, str]]:
        rows = []
        for arm, ratio in self.slowdowns.items():
            pct = ARMS[arm]
            rows.append((arm, f"{pct:g} %", f"{1 - pct / 100:.2f}x", ratio.fmt()))
        return rows

    def cell_rows(self) -> list[list[str]]:
        return [[str(c.repeats), str(c.trials), f"{c.threshold:g} %", c.false_alarms.fmt(),
                 *(c.detections[pct].fmt() for pct in PLANTED), "yes" if c.qualifies else ""] for c in self.cells]

    HEAD = ("repeats", "trials", "max slowdown", "false alarms (A2 vs A)",
            *(f"detected {pct} %" for pct in PLANTED), "meets target")

    def markdown(self) -> str:
        lines = [f"### Gate calibration: {self.preset} ({self.variant}) on {self.device}", "", self.setup(), "",
                 "| arm | planted | expected vs A | measured vs A (median per-round ratio) |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.slowdown_rows()]
        lines += ["", "| " + " | ".join(self.HEAD) + " |", "|" + "---|" * len(self.HEAD)]
        lines += ["| " + " | ".join(row) + " |" for row in self.cell_rows()]
        lines += ["", self.recommendation.text() + ".", "", self.caveat()]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        rec = self.recommendation
        return {
            "schema_version": 1, "preset": self.preset, "variant": self.variant, "device": self.device,
            "machine": self.machine, "steps": self.steps, "warmup_steps": self.warmup,
            "rounds_planned": self.rounds_planned, "rounds": self.rounds, "interrupted": self.interrupted,
            "confidence": CONFIDENCE, "rule": RULE,
            "target": {"max_false_alarm": MAX_FALSE_ALARM, "min_detection": MIN_DETECTION,
                       "detection_of_pct": DETECTION_TARGET_PCT},
            "measured_slowdowns": {arm: {"planted_pct": ARMS[arm], "median": r.value, "low": r.low, "high": r.high,
                                         "n": r.n} for arm, r in self.slowdowns.items()},
            "cells": [c.to_json() for c in self.cells],
            "recommendation": {"qualifies": rec.qualifies, "options": rec.options or None,
                               "repeats": rec.cell.repeats if rec.cell else None,
                               "max_slowdown_pct": rec.cell.threshold if rec.cell else None, "text": rec.text()},
        }

    def print(self, console: Console) -> None:
        arms = Table(title=f"Planted slowdowns: {self.preset} ({self.variant}) on {self.device}")
        for name in ("arm", "planted", "expected vs A", "measured vs A"):
            arms.add_column(name, justify="left" if name == "arm" else "right")
        for row in self.slowdown_rows():
            arms.add_row(*row)
        console.print(arms)
        table = Table(title="Gate calibration", caption=self.setup() + " " + self.caveat(), caption_justify="left")
        for name in self.HEAD:
            table.add_column(name, justify="right")
        for row in self.cell_rows():
            table.add_row(*row)
        console.print(table)
        console.print(self.recommendation.text(), markup=False)


def build_report(runs: list[RunResult], variant: str, grid: list[int], thresholds: list[float], rounds_planned: int,
                 interrupted: bool) -> Report | None:
    """The calibration of ``variant`` from its arms' results; None when some arm has no sample."""
    samples = {}
    for run in runs:
        block = run.metrics.get("env_steps_per_sec") or {}
        samples[run.variant] = [float(s) for s in block.get("samples") or []]
    if set(samples) != set(ARMS) or not all(samples.values()):
        return None
    rounds = min(len(s) for s in samples.values())
    cfg = runs[0].config
    return Report(runs[0].preset, variant, str(cfg.get("device")), int(cfg["run"]["steps"]),
                  int(cfg["run"]["warmup_steps"]), rounds_planned, rounds, evaluate(samples, grid, thresholds),
                  measured_slowdowns(samples), interrupted, runs[0].machine)


# --------------------------------------------------------------------------- the command

def run_command(args: argparse.Namespace) -> int:
    """``rlgauge calibrate``: check every input, measure, write calibration.{json,md} and runs.json."""
    from reference_trainers.state.atomic_file import write_text_atomically

    from harness.results import check_output_dir
    from harness.measurement.runner import resolve_specs

    trials = check_trials(args.trials)
    grid, thresholds = repeats_grid(args.repeats_grid), thresholds_grid(args.thresholds_grid)
    _check_overrides(args.overrides)
    overrides = [f"run.steps={CALIBRATE_DEFAULT_STEPS}", *user_overrides(args)]
    rounds = trials * max(grid)
    base = specs_for(args.target, args.variant, overrides)[0]  # a plain config file: its one run, "config"
    specs = arm_specs(base, rounds)
    (resolution,) = resolve_specs(specs[:1])  # the arms differ only in the planted slowdown
    out = check_output_dir(args.out or Path(f"calibrate-{specs[0].preset}"),
                           files=("runs.json", "calibration.json", "calibration.md"))
    say: Callable[[str], None] = (lambda _t: None) if args.quiet else (lambda t: print(t, file=sys.stderr))
    run_cfg = resolution.config.run
    say(f"calibrate {base.preset} ({base.variant}) on {resolution.device}: {len(specs)} arms "
        f"({', '.join(ARMS)}) x {rounds} rounds of {run_cfg.steps:,} env steps, interleaved")
    if not args.quiet:
        if not _say_estimate(specs[0], rounds, say):
            return EXIT_INTERRUPTED
    runs, interrupted = run_arms(specs, show_progress=not args.quiet and sys.stderr.isatty())
    report = build_report(runs, base.variant, grid, thresholds, rounds, interrupted)
    reported = report is not None and any(c.trials for c in report.cells)
    written = ("calibration.json, calibration.md, runs.json" if reported else
               f"runs.json only: fewer than {min(grid)} rounds from every arm, no trial")
    stopped = save_runs(out, runs, interrupted, what=f"what was measured ({written})")
    if reported:
        write_text_atomically(out / "calibration.json", json.dumps(report.to_json(), indent=2) + "\n")
        write_text_atomically(out / "calibration.md", report.markdown())
        report.print(Console(soft_wrap=False, width=max(160, Console().width)))  # wide in a pipe or CI log
    if stopped is not None:
        return stopped
    code = status_code(runs)
    say(f"calibration written to {out}/ ({written})")
    return EXIT_CHECK_FAILED if code or not reported else EXIT_OK


def _say_estimate(spec: VariantSpec, rounds: int, say: Callable[[str], None]) -> bool:
    """Time one round of ``A`` (after its warm-up) and say how long the measurement will take;
    False when interrupted."""
    probe = VariantSpec(spec.preset, "probe", with_rounds(spec.config, 1))
    say("timing one probe round for an estimate of the time ...")
    (run,), interrupted = run_arms([probe])
    if interrupted:
        print("rlgauge: interrupted before the measurement; nothing written", file=sys.stderr)
        return False
    rate = (run.metrics.get("env_steps_per_sec") or {}).get("median")
    if not rate:
        say("could not time a probe round; no time estimate")
        return True
    cfg = spec.config.run
    seconds = estimate_seconds(rate, rounds, cfg.steps, cfg.warmup_steps)
    say(f"estimated time: about {_duration(seconds)} (a probe round ran at {rate:,.0f} env steps/s)")
    return True


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
