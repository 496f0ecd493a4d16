"""Ablation: attribute a preset's speedup to each optimisation flag, measured side by side.

The flags are the implementation keys (``env.vectorization`` and each ``optimizations.*``)
in which the preset's optimized variant differs from its baseline. A flag counts only if
the device can honour it: set alone on top of the baseline it must resolve (``resolve.py``
accepts it) to a value other than the baseline's; otherwise it is listed as not applicable
on this device and not run.

Arms: ``baseline``; ``+flag`` (each flag alone on the baseline); ``all-on`` (every
applicable flag: the optimized variant when none was left out); ``-flag`` (all on but
that one). All arms are built once and measured in one process, interleaved repeat by
repeat with the order rotated (``runner.run_variants``), so per-repeat ratios are paired.

Per flag: ``alone`` = ``+flag / baseline`` (its marginal speedup) and ``in_stack`` =
``all-on / -flag`` (its contribution to the full stack), each the median of the paired
per-repeat ratios with a 95 % percentile bootstrap interval of that median
(``compare.paired_ratio``). A flag whose interval includes 1.0 is within noise. A verdict
needs ``power.MIN_REPEATS`` repeats and states its resolution ("helps (resolves +/-3.1 %)");
with fewer the table says "no verdict" and calls the bracket the range of the ratios.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from reference_trainers.config.schema import ConfigError, TrainConfig, build_config
from reference_trainers.config.flags import ablation_keys
from reference_trainers.config.resolve import resolve_config

from harness.stats import power
from harness.stats.compare import CONFIDENCE, Ratio, paired_ratio
from harness.errors import UserError
from harness.specs.presets import load_preset
from harness.results import RunResult
from harness.measurement.runner import VariantSpec

ABLATE_DEFAULT_STEPS = 8192
"""Timed env steps per arm and repeat (the preset's own budget is for two variants, not a dozen)."""
INTERVAL = f"{CONFIDENCE:.0%} percentile bootstrap of the median paired per-repeat ratio"
RANGE = "the range (min-max) of the paired per-repeat ratios, not a confidence interval"
FLAG_KEYS = ablation_keys()
"""Every optimisation of the flag registry (settings and algorithm options are swept, not ablated)."""


@dataclass(frozen=True)
class Flag:
    """One implementation key in which the optimized variant differs from the baseline."""

    key: str
    """Dotted config key, e.g. ``optimizations.batch_inference``."""
    value: Any
    """The optimized variant's value as written (may be ``auto``)."""
    plain: Any
    """The baseline's resolved value."""
    resolved: Any
    """The value it resolves to on this device in the optimized variant."""
    alone: bool = True
    """Whether it takes effect set alone on the baseline (a flag that builds on another, e.g.
    ``block_noise`` on ``numpy_acting``, is measured in the stack only)."""

    @property
    def name(self) -> str:
        return short_name(self.key)


@dataclass
class AblationPlan:
    """What will be measured: flags that apply here, those that do not (with why), and the arms."""

    preset: str
    device: str
    flags: list[Flag]
    not_applicable: dict[str, str]
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Arm name -> {dotted key: value} set on top of the baseline."""
    skipped_arms: dict[str, str] = field(default_factory=dict)
    """Arms whose flag combination does not resolve, with the reason."""


def short_name(key: str) -> str:
    return key.removeprefix("optimizations.")


def _get(config: TrainConfig, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(config, section), name)


def _with(data_config: TrainConfig, overrides: list[str], values: dict[str, Any]) -> TrainConfig:
    """The baseline config with ``values`` (dotted key -> value) set on top."""
    extra = [f"{key}={_yaml_scalar(value)}" for key, value in values.items()]
    return build_config(data_config.model_dump(mode="json"), [*overrides, *extra])


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def plan_ablation(target: str, overrides: list[str], only: list[str] | None = None) -> AblationPlan:
    """Find the flags of ``target`` (a preset with baseline and optimized) and lay out the arms."""
    preset = load_preset(target)
    if not {"baseline", "optimized"} <= set(preset.variants):
        raise UserError(f"ablate {target}: needs a preset with baseline and optimized variants "
                        f"(it has {', '.join(preset.variants)})")
    if preset.trainer is not None:
        return _plan_own(preset, target, overrides, only)
    base = build_config(preset.variant_data("baseline"), overrides)
    opt = build_config(preset.variant_data("optimized"), overrides)
    base_res = resolve_config(base)
    try:
        opt_res = resolve_config(opt)
    except ConfigError as exc:
        raise UserError(f"ablate {target}: the optimized variant does not resolve here: {exc}") from None
    differing = [key for key in FLAG_KEYS if _get(base, key) != _get(opt, key)]
    flags: list[Flag] = []
    not_applicable: dict[str, str] = {}
    for key in differing:
        value = _get(opt, key)
        plain, in_stack = _get(base_res.config, key), _get(opt_res.config, key)
        try:
            alone = resolve_config(_with(base, [], {key: value}))
            alone_why = alone.reasons.get(key, "").partition(" (")[2].removesuffix(")") or "the baseline's value"
            takes_effect_alone = _get(alone.config, key) != plain
        except ConfigError as exc:
            alone_why, takes_effect_alone = str(exc), False
        if in_stack == plain and not takes_effect_alone:
            why = opt_res.reasons.get(key, "").partition(" (")[2].removesuffix(")") or alone_why
            not_applicable[short_name(key)] = f"{value} resolves to the plain value {plain} on {base_res.device}: {why}"
            continue
        flags.append(Flag(key, value, plain, in_stack if in_stack != plain else _get(alone.config, key),
                          alone=takes_effect_alone))
    if only is not None:
        flags = _select(flags, not_applicable, differing, only, target)
    if not flags:
        raise UserError(f"ablate {target}: no flag to measure on {base_res.device} "
                        f"(not applicable: {', '.join(not_applicable) or 'none'})")
    plan = AblationPlan(preset.name, str(base_res.device), flags, not_applicable)
    _lay_out_arms(plan, base)
    return plan


def _select(flags: list[Flag], not_applicable: dict[str, str], differing: list[str], only: list[str],
            target: str) -> list[Flag]:
    """``--flags``: keep the named flags (short or dotted names); UserError for a name that is not a flag."""
    known = {short_name(k) for k in differing}
    wanted = []
    for name in only:
        short = short_name(name.strip())
        if short not in known:
            raise UserError(f"--flags {name!r}: not a flag of {target} (its optimized variant differs from the "
                            f"baseline in: {', '.join(sorted(known)) or 'nothing'})")
        wanted.append(short)
    for name in list(not_applicable):
        if name not in wanted:
            del not_applicable[name]
    return [f for f in flags if f.name in wanted]


def _lay_out_arms(plan: AblationPlan, base: TrainConfig) -> None:
    everything = {f.key: f.value for f in plan.flags}
    candidates: dict[str, dict[str, Any]] = {"baseline": {}}
    for f in plan.flags:
        if f.alone:
            candidates[f"+{f.name}"] = {f.key: f.value}
    if len(plan.flags) > 1:
        candidates["all-on"] = everything
        for f in plan.flags:
            candidates[f"-{f.name}"] = {k: v for k, v in everything.items() if k != f.key}
    for arm, values in candidates.items():
        try:
            resolve_config(_with(base, [], values))
        except ConfigError as exc:
            plan.skipped_arms[arm] = str(exc)
            continue
        plan.arms[arm] = values


# --------------------------------------------------------------------------- a user's own trainer

def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested mapping's leaves (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _nested(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        node = out
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def _plan_own(preset: Any, target: str, overrides: list[str], only: list[str] | None) -> AblationPlan:
    """A user's trainer: its flags are the keys in which the variants' settings differ (each measured
    alone on the baseline and left out of the full stack, as rlgauge's own flags)."""
    from harness.specs.own_trainer import resolve_own
    from harness.specs.presets import specs_of

    base, opt = (_flat(spec.config.settings) for spec in specs_of(preset, "both", overrides))
    differing = sorted(key for key in set(base) | set(opt) if base.get(key) != opt.get(key))
    flags = [Flag(key, opt.get(key), base.get(key), opt.get(key)) for key in differing if key in opt]
    not_applicable = {key: "only the baseline sets it" for key in differing if key not in opt}
    if only is not None:
        flags = _select(flags, not_applicable, differing, only, target)
    if not flags:
        raise UserError(f"ablate {target}: its baseline and optimized variants set the same values: no flag to measure")
    device = resolve_own(specs_of(preset, "baseline", overrides)[0].config).device
    plan = AblationPlan(preset.name, str(device), flags, not_applicable)
    everything = {f.key: f.value for f in flags}
    plan.arms = {"baseline": {}, **{f"+{f.name}": {f.key: f.value} for f in flags}}
    if len(flags) > 1:
        plan.arms["all-on"] = everything
        plan.arms.update({f"-{f.name}": {k: v for k, v in everything.items() if k != f.key} for f in flags})
    return plan


def _own_arm_specs(preset: Any, plan: AblationPlan, overrides: list[str]) -> list[VariantSpec]:
    from harness.specs.own_trainer import build_own_config, own_builder
    from reference_trainers.config.files import deep_merge

    build = own_builder(preset.trainer, [preset.folder] if preset.folder else None)
    base = preset.variant_data("baseline")
    return [VariantSpec(plan.preset, arm, build_own_config(preset.trainer, {**preset.own, "config": deep_merge(
        base, _nested(values))}, overrides, plan.preset), build=build) for arm, values in plan.arms.items()]


def arm_specs(plan: AblationPlan, target: str, overrides: list[str]) -> list[VariantSpec]:
    """One spec per arm: the preset's baseline data with the arm's flags set on top."""
    preset = load_preset(target)
    if preset.trainer is not None:
        return _own_arm_specs(preset, plan, overrides)
    base = build_config(preset.variant_data("baseline"), overrides)
    return [VariantSpec(plan.preset, arm, _with(base, [], values)) for arm, values in plan.arms.items()]


# --------------------------------------------------------------------------- analysis

@dataclass(frozen=True)
class FlagEffect:
    name: str
    alone: Ratio | None
    in_stack: Ratio | None
    expected: float | None = None

    @property
    def significant(self) -> bool:
        """True when the interval of the in-stack contribution excludes 1.0 (its effect is not noise)."""
        return verdict(self.in_stack) in ("helps", "hurts")


def verdict(ratio: Ratio | None) -> str:
    """'helps' / 'hurts' when the interval excludes 1.0, else 'within noise' ('n/a' when not measured;
    ``power.no_verdict`` with fewer than ``power.MIN_REPEATS`` repeats)."""
    if ratio is None:
        return "n/a"
    if not power.has_power(ratio.n):
        return power.no_verdict(ratio.n)
    if ratio.low > 1.0:
        return "helps"
    return "hurts" if ratio.high < 1.0 else "within noise"


def verdict_text(ratio: Ratio | None) -> str:
    """The verdict with the resolution it was given at: ``helps (resolves +/-3.1 %)``."""
    words = verdict(ratio)
    if ratio is None or not power.has_power(ratio.n):
        return words
    return f"{words} ({power.resolution_note(ratio)})"


def interval_text(runs: list[RunResult]) -> str:
    """What the brackets of the table are: a bootstrap interval, or with too few repeats the range."""
    n = _repeats(runs)
    return INTERVAL if n is None or power.has_power(n) else f"{n} repeat{'s' * (n != 1)}: {RANGE}"


def _repeats(runs: list[RunResult]) -> int | None:
    counts = [len(run.metrics["env_steps_per_sec"]["samples"]) for run in runs
              if run.status == "ok" and run.metrics.get("env_steps_per_sec")]
    return min(counts) if counts else None


def _samples(results: dict[str, RunResult], arm: str) -> list[float] | None:
    run = results.get(arm)
    if run is None or run.status != "ok" or not run.metrics.get("env_steps_per_sec"):
        return None
    return run.metrics["env_steps_per_sec"]["samples"]


def _ratio(results: dict[str, RunResult], base_arm: str, cand_arm: str) -> Ratio | None:
    base, cand = _samples(results, base_arm), _samples(results, cand_arm)
    if base is None or cand is None:
        return None
    return paired_ratio(base, cand)


def flag_effects(plan: AblationPlan, runs: list[RunResult], expected: dict[str, float] | None = None
                 ) -> list[FlagEffect]:
    """Each flag's marginal and in-stack speedup, ranked by in-stack contribution (then alone)."""
    results = {run.variant: run for run in runs}
    expected = expected or {}
    effects = []
    for f in plan.flags:
        alone = _ratio(results, "baseline", f"+{f.name}")
        in_stack = _ratio(results, f"-{f.name}", "all-on") if len(plan.flags) > 1 else alone
        effects.append(FlagEffect(f.name, alone, in_stack, expected.get(f.name)))
    key = lambda e: ((e.in_stack.value if e.in_stack else 0.0), (e.alone.value if e.alone else 0.0))  # noqa: E731
    return sorted(effects, key=key, reverse=True)


def overall(plan: AblationPlan, runs: list[RunResult]) -> Ratio | None:
    """all-on / baseline (the whole stack's speedup)."""
    results = {run.variant: run for run in runs}
    return _ratio(results, "baseline", "all-on" if len(plan.flags) > 1 else f"+{plan.flags[0].name}")


def parse_expectations(text: str | None, plan: AblationPlan) -> dict[str, float]:
    """``--expect batch_inference=1.5x,torch_threads=2`` -> {name: 1.5, ...}; UserError on bad input."""
    if not text:
        return {}
    known = {f.name for f in plan.flags} | set(plan.not_applicable)
    out: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        name = short_name(name.strip())
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*x?\s*", value)
        if not sep or not match or float(match.group(1)) <= 0:
            raise UserError(f"--expect {item.strip()!r}: expected FLAG=SPEEDUP such as batch_inference=1.5x")
        if name not in known:
            raise UserError(f"--expect {name!r}: not a flag of {plan.preset} (flags: {', '.join(sorted(known))})")
        out[name] = float(match.group(1))
    return out


def _cell(ratio: Ratio | None) -> str:
    return "n/a" if ratio is None else f"{ratio.value:.2f}x [{ratio.low:.2f}-{ratio.high:.2f}]"


def _verdict(effect: FlagEffect) -> str:
    return f"alone: {verdict_text(effect.alone)}; in stack: {verdict_text(effect.in_stack)}"


def _expect_verdict(effect: FlagEffect) -> str:
    ratio = effect.alone
    if effect.expected is None or ratio is None:
        return ""
    if not power.has_power(ratio.n):
        return power.no_verdict(ratio.n)
    if ratio.low <= effect.expected <= ratio.high:
        return "as expected"
    return "above expected" if ratio.low > effect.expected else "below expected"


def markdown_table(plan: AblationPlan, runs: list[RunResult], effects: list[FlagEffect]) -> str:
    """The ablation as a Markdown table (ranked flags), the arms' throughput and the not-applicable list."""
    with_expect = any(e.expected is not None for e in effects)
    head = ["rank", "flag", "value", "alone (+flag / baseline)", "in stack (all-on / -flag)", "verdict"]
    if with_expect:
        head += ["expected (alone)", "measured (alone)", "vs expected"]
    lines = [f"### Ablation: {plan.preset} on {plan.device}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_name = {f.name: f for f in plan.flags}
    for rank, e in enumerate(effects, 1):
        f = by_name[e.name]
        row = [str(rank), f"`{e.name}`", f"{f.plain} -> {f.resolved}", _cell(e.alone), _cell(e.in_stack), _verdict(e)]
        if with_expect:
            row += ["-" if e.expected is None else f"{e.expected:.2f}x",
                    "n/a" if e.alone is None else f"{e.alone.value:.2f}x", _expect_verdict(e)]
        lines.append("| " + " | ".join(row) + " |")
    total = overall(plan, runs)
    lines += ["", f"Whole stack (all-on / baseline): {_cell(total)}. Intervals: {interval_text(runs)}; "
              "'within noise' = the interval includes 1.0; 'resolves +/-X %' = the smallest effect this "
              f"run could tell from noise; a verdict needs {power.MIN_REPEATS} repeats.", "",
              "| arm | env_steps_per_sec median [min-max] | status |", "|---|---|---|"]
    for run in runs:
        rate = run.metrics.get("env_steps_per_sec")
        cell = "-" if not rate else f"{rate['median']:,.0f} [{rate['min']:,.0f}-{rate['max']:,.0f}]"
        lines.append(f"| {run.variant} | {cell} | {run.status} |")
    if plan.not_applicable:
        lines += ["", "Not applicable on this device (not run):"]
        lines += [f"- `{name}`: {why}" for name, why in plan.not_applicable.items()]
    if plan.skipped_arms:
        lines += ["", "Arms not run (their flag combination does not resolve):"]
        lines += [f"- `{arm}`: {why}" for arm, why in plan.skipped_arms.items()]
    return "\n".join(lines) + "\n"


def _ratio_json(ratio: Ratio | None) -> dict[str, float] | None:
    """The ratio with its resolution (in %; None without the repeats for a verdict)."""
    if ratio is None:
        return None
    resolution = round(power.resolution_pct(ratio), 2) if power.has_power(ratio.n) else None
    return {"median": ratio.value, "low": ratio.low, "high": ratio.high, "n": ratio.n, "resolution_pct": resolution}


def ablation_json(plan: AblationPlan, runs: list[RunResult], effects: list[FlagEffect]) -> dict[str, Any]:
    by_name = {f.name: f for f in plan.flags}
    return {
        "schema_version": 1, "preset": plan.preset, "device": plan.device, "interval": interval_text(runs),
        "machine": runs[0].machine if runs else {},
        "started_at": runs[0].started_at if runs else None, "git": runs[0].git if runs else {},
        "steps": runs[0].config["run"]["steps"] if runs else None,
        "repeats": runs[0].config["run"]["repeats"] if runs else None,
        "overall": _ratio_json(overall(plan, runs)),
        "flags": [{"name": e.name, "key": by_name[e.name].key, "value": by_name[e.name].value,
                   "plain": by_name[e.name].plain, "resolved": by_name[e.name].resolved,
                   "alone": _ratio_json(e.alone), "in_stack": _ratio_json(e.in_stack),
                   "verdict_alone": verdict(e.alone), "verdict_in_stack": verdict(e.in_stack),
                   "significant": e.significant, "expected": e.expected} for e in effects],
        "not_applicable": plan.not_applicable, "skipped_arms": plan.skipped_arms,
        "arms": {run.variant: {"set": plan.arms.get(run.variant, {}), "status": run.status, "quality": run.quality,
                               "env_steps_per_sec": run.metrics.get("env_steps_per_sec")} for run in runs},
    }
