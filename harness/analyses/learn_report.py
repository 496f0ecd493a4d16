"""``learn``'s files: ``learn.json`` (settings, per-seed curves, aggregates, verdicts), ``learn.md`` and
``learn.png``; and the verdicts judged again from a ``learn.json`` (``learn --from``) with other margins."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from reference_trainers.config.schema import to_plain_dict

from harness.analyses import learn_verdicts as lv
from harness.analyses.learn import Arm, Plan, Record
from harness.errors import UserError
from harness.stats import learning, verdicts

FILES = ("learn.json", "learn.md", "learn.png")
STATISTICS = {"confidence": learning.CONFIDENCE, "resamples": learning.RESAMPLES, "bootstrap_seed": learning.SEED,
              "bootstrap": "stratified (seeds resampled within each task), each arm's seeds on their own; percentile "
                           "interval of the difference of interquartile means (rliable)"}
"""How the verdicts' intervals were formed (written with them, also when ``--from`` judges a file again)."""


def summary(plans: list[Plan], record: Record, margins: dict[str, float]) -> dict[str, Any]:
    """``learn.json``: settings, arms, the grid, per-seed curves, aggregates, verdicts, machine state."""
    from harness.measurement.provenance import git_info, machine_info

    plan = plans[0]
    grid = lv.make_grid(plan.steps)
    curves: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for task in plans:
        curves[task.preset] = {}
        for arm in task.arms:
            curves[task.preset][arm.name] = [_curve_entry(c, plan.steps, grid) for c in record.curves[task.preset][arm.name]]
    first = plan.arms[0].resolutions[0]
    config = first.config
    data = {
        "preset": ",".join(p.preset for p in plans), "tasks": [p.preset for p in plans],
        "interrupted": record.interrupted, "started_at": record.started_at,
        "settings": {"steps": plan.steps, "seeds": plan.seeds, "peer": plan.peer, "overrides": plan.overrides,
                     "reference": plan.reference, "min_steps": plan.min_steps, "grid_points": len(grid),
                     "final_fraction": lv.FINAL_FRACTION, "return_window": config.run.return_window if hasattr(config.run, "return_window") else None,
                     "device": str(first.device)},
        "campaign": {"executor": record.executor, "wall_s": round(record.wall_s, 3), "hosts": record.hosts},
        "arms": [_arm_entry(arm, plans, record) for arm in plan.arms],
        "grid": grid, "curves": curves,
        "git": git_info(), "machine": machine_info(first.device),
        "machine_state": record.machine_state, "quality": record.quality,
    }
    return judge(data, margins)


def _curve_entry(curve: Any, steps: int, grid: list[int]) -> dict[str, Any]:
    return {"seed": curve.seed, "complete": curve.complete(steps), "env_steps": curve.env_steps,
            "wall_s": round(curve.wall_s, 3), "build_s": round(curve.build_s, 3), "error": curve.error,
            "on_grid": lv.on_grid(curve.points, grid) if curve.points else [None] * len(grid),
            "points": [[s, r] for s, r in curve.points]}


def judge(data: dict[str, Any], margins: dict[str, float]) -> dict[str, Any]:
    """``data`` with its aggregates, verdicts and performance profile (re)computed from its curves."""
    curves = data["curves"]
    arms = [arm["name"] for arm in data["arms"]]
    settings = data["settings"]
    reference = settings.get("reference") or ("baseline" if "baseline" in arms else arms[0])
    grid_size = len(data["grid"])
    data["aggregates"] = {task: {arm: lv.aggregate([e["on_grid"] for e in entries]) if entries else None
                                 for arm, entries in by_arm.items()} for task, by_arm in curves.items()}
    complete = {task: {arm: [e["on_grid"] for e in entries if e["complete"]] for arm, entries in by_arm.items()}
                for task, by_arm in curves.items()}
    data["verdicts"] = [row for first, second in lv.comparisons(arms, reference, settings.get("peer"))
                        for row in lv.compare(first, second, {t: (c[first], c[second]) for t, c in complete.items()},
                                              grid_size, margins)]
    finals = {arm: [lv.seed_scores(c[arm], c[arm], grid_size)["final_return"][0] for c in complete.values()]
              for arm in arms}
    data["performance_profile"] = lv.performance_profile(finals, reference) if all(
        len(v) for per in finals.values() for v in per) else {}
    settings.update(margins_pct=dict(margins), questions=dict(verdicts.QUESTIONS), **STATISTICS)
    return data


def load_summary(path: Path) -> dict[str, Any]:
    """A ``learn.json`` to judge again (one from before several tasks were supported is read as one task)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"--from {path}: no such file; accepted: a learn.json written by rlgauge learn") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"--from {path}: not a readable JSON file ({' '.join(str(exc).split())}); accepted: a "
                        "learn.json written by rlgauge learn") from None
    needed = ("preset", "settings", "arms", "grid", "curves")
    if not isinstance(data, dict) or any(key not in data for key in needed):
        raise UserError(f"--from {path}: not a learn.json (needs {', '.join(needed)}); accepted: a learn.json "
                        "written by rlgauge learn")
    if all(isinstance(v, list) for v in data["curves"].values()):  # one task, curves by arm
        data["curves"] = {data["preset"]: data["curves"]}
        data["tasks"] = [data["preset"]]
    return data


def _arm_entry(arm: Arm, plans: list[Plan], record: Record) -> dict[str, Any]:
    config = arm.resolutions[0].config
    plain = config.plain() if hasattr(config, "plain") else to_plain_dict(config)
    runs = [c for plan in plans for c in record.curves[plan.preset][arm.name]]
    wall = sum(c.wall_s for c in runs)
    steps = sum(c.env_steps for c in runs)
    return {"name": arm.name, "kind": arm.kind, "wall_s": round(wall, 3),
            "env_steps_per_sec": round(steps / wall, 1) if wall > 0 else None, "config": _finite(plain)}


def _finite(value: Any) -> Any:
    """JSON-safe: a non-finite float (an unbounded setting) written as its name."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _fmt(value: float | None, signed: bool = False, unit: str = "") -> str:
    if value is None:
        return "n/a"
    return (f"{value:+,.1f}" if signed else f"{value:,.1f}") + unit


def markdown(data: dict[str, Any]) -> str:
    """``learn.md``: each arm's final return and speed, then every verdict with its interval and question."""
    s = data["settings"]
    level = f"{s['confidence'] * 100:g} %"
    window = f"mean of the last {s['return_window']} episodes" if s.get("return_window") else "the trainer's mean recent return"
    header = (f"{len(s['seeds'])} seeds ({s['seeds'][0]}..{s['seeds'][-1]}), {s['steps']:,} env steps per arm and "
              f"seed on {s['device']}; return: {window}; curves resampled on {s['grid_points']} points.")
    campaign = data.get("campaign") or {}
    if campaign:
        header += f" Executor: {campaign.get('executor')}, campaign wall time {campaign.get('wall_s', 0):,.1f} s."
    interrupted = " (interrupted)" if data["interrupted"] else ""
    lines = [f"# Learning: {data['preset']}{interrupted}", "", header, "",
             "| task | arm | final return, median [IQR] | complete seeds |", "|---|---|---|---|"]
    for task, by_arm in data["curves"].items():
        for arm, entries in by_arm.items():
            agg = data["aggregates"][task][arm]
            final = "n/a" if agg is None or agg["median"][-1] is None else \
                f"{_fmt(agg['median'][-1])} [{_fmt(agg['q25'][-1])}-{_fmt(agg['q75'][-1])}]"
            lines.append(f"| {task} | {arm} | {final} | {sum(e['complete'] for e in entries)} of {len(entries)} |")
    lines += ["", "| arm | wall s | env steps/s |", "|---|---|---|"]
    for arm in data["arms"]:
        rate = "n/a" if arm["env_steps_per_sec"] is None else f"{arm['env_steps_per_sec']:,.0f}"
        lines.append(f"| {arm['name']} | {arm['wall_s']:,.1f} | {rate} |")
    lines += ["", f"| comparison | task | metric | IQM first / second | difference, % of second [{level} CI] | "
                  "P(first > second) | verdict |", "|---|---|---|---|---|---|---|"]
    for row in data["verdicts"]:
        iqms = f"{_fmt(row['iqm_first'])} / {_fmt(row['iqm_second'])}" if "iqm_first" in row else "n/a"
        diff = "n/a" if "difference_pct" not in row else (
            f"{_fmt(row['difference_pct'], True)} [{_fmt(row['low_pct'], True)}, {_fmt(row['high_pct'], True)}]")
        poi = row.get("probability_of_improvement")
        poi_text = "n/a" if not poi else f"{poi['value']:.2f} [{poi['low']:.2f}, {poi['high']:.2f}]"
        lines.append(f"| {row['first']} vs {row['second']} | {row['task']} | {lv.METRICS[row['metric']]} | {iqms} | "
                     f"{diff} | {poi_text} | {row.get('verdict_text', row['verdict'])} |")
    margins = ", ".join(f"{lv.METRICS[m]} +-{v:g} %" for m, v in s.get("margins_pct", {}).items())
    legend = (f"IQM: interquartile mean over seeds. Difference: IQM of the first arm minus the second's, in percent "
              f"of the second's (scores normalised per task by its IQM); {level} stratified bootstrap interval "
              f"({s['resamples']:,} resamples, each arm's seeds on their own). Final return: the last "
              f"{s['final_fraction'] * 100:g} % of the grid; area under curve: the mean over the grid. Each verdict "
              f"answers one question: '{verdicts.SAME}': is the whole interval inside the margin ({margins})? "
              f"'{verdicts.LESS}' / '{verdicts.MORE}': is it wholly below / above 0? '{verdicts.INCONCLUSIVE}': "
              "neither; the seeds named would likely settle it at the observed spread. Wall s: seconds in iterate() "
              "over every seed, compilation included.")
    lines += ["", legend]
    reasons = (data.get("quality") or {}).get("reasons") or []
    if reasons:
        lines += ["", "The wall seconds are not trustworthy (the curves, counted in env steps, are unaffected): "
                  + "; ".join(reasons) + "."]
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, data: dict[str, Any]) -> None:
    """``learn.json``, ``learn.md`` and ``learn.png`` in ``out`` (each written atomically)."""
    from reference_trainers.state.atomic_file import write_text_atomically

    from harness.report.plots import learning_chart

    write_text_atomically(out / "learn.json", json.dumps(data, indent=2) + "\n")
    write_text_atomically(out / "learn.md", markdown(data))
    several = len(data["aggregates"]) > 1
    series = {(f"{task}: {name}" if several else name): (agg["median"], agg["q25"], agg["q75"])
              for task, by_arm in data["aggregates"].items() for name, agg in by_arm.items() if agg}
    s = data["settings"]
    title = (f"{data['preset']}: median and IQR over {len(s['seeds'])} seeds"
             + (" (interrupted)" if data["interrupted"] else ""))
    learning_chart(out / "learn.png", title, data["grid"], series, "mean recent return")


def failed_verdicts(data: dict[str, Any], *, strict: bool = False) -> list[str]:
    """``first vs second (metric, task)`` of each comparison that says "learns less" (``strict``: also each that
    is inconclusive or has no verdict)."""
    bad = {verdicts.LESS} if not strict else None
    return [f"{r['first']} vs {r['second']} ({lv.METRICS[r['metric']]}, {r['task']}): {r['verdict']}"
            for r in data["verdicts"]
            if (r["verdict"] in bad if bad is not None else r["verdict"] not in (verdicts.SAME, verdicts.MORE))]


def failed_curves(data: dict[str, Any]) -> list[str]:
    """``task arm seed N: error`` of each run that failed (logged when it failed)."""
    return [f"{task} {arm} seed {e['seed']}: {e['error']}" for task, by_arm in data["curves"].items()
            for arm, entries in by_arm.items() for e in entries if e["error"]]
