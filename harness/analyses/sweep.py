"""Sweep: throughput across values of any config key (or a grid of two keys), interleaved in one run.

``--param KEY=V1,V2,...`` takes any dotted config key; each value is parsed exactly like
``--set KEY=VALUE`` (YAML scalars, ``[64,64]`` lists) and validated before anything runs.
The first ``--param`` is the x axis of the plot; a second one makes a grid, with one line
per value of the second. Every point is built once and measured interleaved with the
others, repeat by repeat, so the points' ratios to the first point are paired.

A sweep of more than ``run_size.MAX_RUNS`` points (or env steps) runs only with ``--yes``; a grid
too big for that is refused before its points are built (``extrapolated_size``).

A grid's pivot names the fastest value of each row only with ``power.MIN_REPEATS`` repeats,
and says how it compares with the next fastest (paired ratio, verdict, resolution); with
fewer repeats it says "no verdict".
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from reference_trainers.config.files import parse_override
from reference_trainers.config.errors import ConfigError

from harness.stats import power
from harness.stats.compare import Ratio, paired_ratio
from harness.errors import UserError
from harness.specs.presets import specs_for
from harness.results import RunResult
from harness.specs.run_size import Size, run_env_steps
from harness.measurement.runner import VariantSpec, resolve_specs

SWEEP_DEFAULT_STEPS = 8192
"""Timed env steps per point and repeat (points are many; the preset's budget is for two variants)."""
MAX_PARAMS = 2


@dataclass(frozen=True)
class Param:
    """One swept key and its values as the user wrote them (each parsed like ``--set``)."""

    key: str
    values: tuple[str, ...]


def split_values(text: str) -> list[str]:
    """Split ``a,[1,2],b`` on the commas outside brackets and braces."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "[{"
        depth -= char in "]}"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return parts


def parse_param(text: str) -> Param:
    """``KEY=V1,V2,...`` -> Param; ``UserError`` for a missing key, no values, an empty or repeated value."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not raw.strip():
        raise UserError(f"--param {text!r}: expected KEY=V1,V2,... e.g. env.num_envs=4,16,64")
    values = split_values(raw)
    if any(not v for v in values):
        raise UserError(f"--param {text!r}: empty value in the list; expected KEY=V1,V2,...")
    if len(set(values)) != len(values):
        raise UserError(f"--param {text!r}: a value is repeated")
    try:
        for value in values:
            parse_override(f"{key}={value}")
    except ConfigError as exc:
        raise UserError(str(exc).replace("--set", "--param")) from None
    return Param(key, tuple(values))


def sweep_specs(target: str, variant: str, params: list[Param], overrides: list[str]) -> list[VariantSpec]:
    """One validated, resolvable spec per point of the grid, named ``key=value[, key=value]``."""
    if not params:
        raise UserError("sweep needs --param KEY=V1,V2,... (at most two)")
    if len(params) > MAX_PARAMS:
        raise UserError(f"sweep takes at most {MAX_PARAMS} --param options (a grid), got {len(params)}")
    if len({p.key for p in params}) != len(params):
        raise UserError(f"--param {params[1].key}: the same key is swept twice")
    specs = []
    for combo in itertools.product(*(p.values for p in params)):
        sets = [f"{p.key}={value}" for p, value in zip(params, combo)]
        try:
            (spec,) = specs_for(target, variant, [*overrides, *sets])
            resolve_specs([spec])
        except ConfigError as exc:
            raise UserError(f"--param {', '.join(sets)}: {exc}") from None
        spec.variant = ", ".join(sets)
        specs.append(spec)
    return specs


def grid_size(params: list[Param]) -> int:
    """Points of the grid (runs of the sweep)."""
    return math.prod(len(p.values) for p in params)


def extrapolated_size(target: str, variant: str, params: list[Param], overrides: list[str]) -> Size:
    """The sweep's size from its first point alone (a grid too big to build every spec of first)."""
    (first,) = sweep_specs(target, variant, [Param(p.key, p.values[:1]) for p in params], overrides)
    count = grid_size(params)
    return Size(count, count * run_env_steps(first.config), exact=False)


@dataclass(frozen=True)
class Point:
    values: tuple[str, ...]
    run: RunResult
    vs_first: Ratio | None

    @property
    def rate(self) -> dict[str, Any] | None:
        return self.run.metrics.get("env_steps_per_sec") if self.run.status == "ok" else None


def points(params: list[Param], runs: list[RunResult]) -> list[Point]:
    """The measured points in grid order, each with its paired ratio to the first point."""
    combos = list(itertools.product(*(p.values for p in params)))
    first = runs[0].metrics.get("env_steps_per_sec") if runs and runs[0].status == "ok" else None
    out = []
    for combo, run in zip(combos, runs):
        rate = run.metrics.get("env_steps_per_sec") if run.status == "ok" else None
        ratio = paired_ratio(first["samples"], rate["samples"]) if first and rate else None
        out.append(Point(combo, run, ratio))
    return out


def _rate_cell(rate: dict[str, Any] | None) -> str:
    return "-" if not rate else f"{rate['median']:,.0f} [{rate['min']:,.0f}-{rate['max']:,.0f}]"


def fastest_vs_next(row: list[Point]) -> tuple[Point | None, str]:
    """The fastest point of a pivot row and how it compares with the next fastest (by median):
    ``1.08x [1.03-1.12] faster (resolves +/-4.1 %)``. The point is named only when its paired
    interval to the next confirms it, with the repeats for a verdict."""
    measured = sorted((pt for pt in row if pt.rate), key=lambda pt: pt.rate["median"], reverse=True)
    if len(measured) < 2:
        return None, ""  # nothing to be fastest against
    best, runner_up = measured[:2]
    ratio = paired_ratio(runner_up.rate["samples"], best.rate["samples"])
    if not power.has_power(ratio.n):
        return None, power.no_verdict(ratio.n)
    confirmed = ratio.low > 1.0
    words = "faster" if confirmed else "within noise"
    return (best if confirmed else None), f"{ratio.fmt()} {words} ({power.resolution_note(ratio)})"


def markdown_table(title: str, params: list[Param], pts: list[Point]) -> str:
    """One row per point (throughput, ratio to the first point); a grid also gets a pivot of medians."""
    head = [p.key for p in params] + ["env_steps_per_sec median [min-max]", "vs first point (paired)", "status"]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for pt in pts:
        ratio = "-" if pt.vs_first is None else pt.vs_first.fmt()
        lines.append("| " + " | ".join([*pt.values, _rate_cell(pt.rate), ratio, pt.run.status]) + " |")
    if len(params) == 2:
        x, line = params
        lines += ["", f"env_steps_per_sec (median), {x.key} down, {line.key} across:", "",
                  "| " + " | ".join([x.key, *line.values, "fastest vs next (paired)"]) + " |",
                  "|" + "---|" * (len(line.values) + 2)]
        by_values = {pt.values: pt for pt in pts}
        for xv in x.values:
            row = [by_values[(xv, lv)] for lv in line.values]
            best, versus = fastest_vs_next(row)
            cells = []
            for pt in row:
                cell = "-" if not pt.rate else f"{pt.rate['median']:,.0f}"
                cells.append(f"**{cell}**" if pt is best else cell)
            lines.append("| " + " | ".join([xv, *cells, versus]) + " |")
        lines += ["", f"Bold: the fastest {line.key} for each {x.key}, where its paired interval to the next "
                  f"fastest lies above 1 ({power.MIN_REPEATS} or more repeats); 'resolves +/-X %' = the smallest "
                  "difference the row could tell from noise."]
    return "\n".join(lines) + "\n"


def series(params: list[Param], pts: list[Point]) -> dict[str, list[tuple[float, float, float] | None]]:
    """Plot series: one per value of the second param (or one in all), over the first param's values."""
    def triple(pt: Point) -> tuple[float, float, float] | None:
        rate = pt.rate
        return None if not rate else (rate["median"], rate["min"], rate["max"])

    if len(params) == 1:
        return {"env_steps_per_sec": [triple(pt) for pt in pts]}
    by_values = {pt.values: pt for pt in pts}
    return {f"{params[1].key}={lv}": [triple(by_values[(xv, lv)]) for xv in params[0].values]
            for lv in params[1].values}


def sweep_json(preset: str, variant: str, params: list[Param], pts: list[Point]) -> dict[str, Any]:
    return {
        "schema_version": 1, "preset": preset, "variant": variant,
        "params": [{"key": p.key, "values": list(p.values)} for p in params],
        "machine": pts[0].run.machine if pts else {},
        "device": pts[0].run.config.get("device") if pts else None,
        "points": [{"values": dict(zip((p.key for p in params), pt.values)), "status": pt.run.status,
                    "env_steps_per_sec": pt.rate,
                    "vs_first": None if pt.vs_first is None else {"median": pt.vs_first.value, "low": pt.vs_first.low,
                                                                  "high": pt.vs_first.high, "n": pt.vs_first.n}}
                   for pt in pts],
    }
