"""A try as a Markdown table (change, kind, where, effect, maths, verdict) and as ``--json`` data."""

from __future__ import annotations

from typing import Any

from harness.diagnosis.frames import short
from harness.trials.catalogue import A_A, CHANGES
from harness.trials.parity import TOLERANCE
from harness.trials.session import Trial, TryReport
from harness.trials.slices import SLICE_SECONDS


def _where(trial: Trial) -> str:
    sites = [where for _, where in trial.edits] or trial.sites
    if not sites:
        return "-"
    return short(sites[0]) + (f" (+{len(sites) - 1})" if len(sites) > 1 else "")


def _effect(trial: Trial) -> str:
    ratio = trial.ratio
    if ratio is None:
        return "-"
    return f"{ratio.value:.3f}x [{ratio.low:.3f}-{ratio.high:.3f}]" + ("" if trial.effect.trustworthy else " *")


def _maths(trial: Trial) -> str:
    found = trial.parity
    if found is None:
        return "not checked"
    if found.max_rel_diff is None or found.max_rel_diff == 0.0:
        return f"{found.cls} ({found.note})" if found.note and found.cls == "changes the maths" else found.cls
    return f"{found.cls} (max rel diff {found.max_rel_diff:.2g})"


def table(report: TryReport) -> str:
    lines = [f"### Try: {report.target} ({report.variant}) on {report.device}", "",
             "| change | kind | where | effect [95% interval] | maths | verdict |", "|---|---|---|---|---|---|"]
    tried = [t for t in report.trials if t.skip is None]
    for trial in tried:
        name = f"{trial.name} (A/A: noise floor)" if trial.name == A_A else trial.name
        lines.append(f"| {name} | {trial.change.kind} | {_where(trial)} | {_effect(trial)} | {_maths(trial)} | "
                     f"{trial.verdict} |")
    ran = report.rounds_run or report.rounds
    stopped = " (stopped early: every change decisive at 99 %)" if ran < report.rounds else ""
    lines += ["", f"Effect: changed / unchanged env steps/s (wall time) from slices ({_slices(report)}), each "
              f"changed slice between two of the unchanged trainer, {report.cycles} turns in each of {ran} of "
              f"{report.rounds} rounds of fresh processes{stopped}; the round is the unit: each round's geometric "
              f"mean ratio, their median and a 95 % t interval over rounds (per change: see the A/A arm for this "
              f"machine's noise). Maths: the parameters, buffers and optimizer state after {report.iterations} "
              f"iterate() calls (and at least {report.iterations} optimizer steps) from the seed."]
    lines += _noise_floor(tried)
    if report.threads_cap:
        lines.append(f"Every arm ran with torch's default threads capped to {report.threads_cap}: other processes kept "
                     "the rest of the cores busy when the try began (run.fair_threads, as rlgauge run does; "
                     "--set run.fair_threads=false keeps the default).")
    if report.unchanged_nonfinite:
        lines.append(f"The unchanged trainer itself ends the maths check with {report.unchanged_nonfinite} NaN/Inf "
                     "values: a change is compared where it is finite, and must have NaN/Inf at the same places.")
    lines += unseeded_lines(report)
    if report.interrupted:
        lines.append("Interrupted: the pairs measured before it are shown.")
    measured = [t.effect for t in tried if t.effect and t.effect.pairs]
    bad = [e for e in measured if not e.trustworthy]
    if bad:
        lines.append(f"* not trustworthy: {len(bad)} of {len(measured)} changes, e.g. {bad[0].reasons[0]}")
    lines += _notes(tried)
    lines += ["", _combined_line(report)]
    if report.no_patch:
        lines.append(f"No patch: {report.no_patch}.")
    unstable = still_unstable(report)
    if unstable:
        lines.append(unstable)
    skipped = [t for t in report.trials if t.skip is not None]
    if skipped:
        lines += ["", "Not tried:"] + [f"- {t.name}: {t.skip}" for t in skipped]
    refused = [(t.name, r) for t in tried for r in t.refused]
    if refused:
        lines += ["", "Lines left unedited:"] + [f"- {name}: {why}" for name, why in refused]
    if report.workdir:
        lines += ["", f"Work folder kept (requests, logs, patched copies of the failed arms): {report.workdir}"]
    lines += ["", "What each change does:"] + [f"- {t.name}: {t.change.does}; maths: {t.change.maths}" for t in tried]
    return "\n".join(lines)


def still_unstable(report: TryReport) -> str:
    """A line when the unchanged trainer runs float64 ops (``rlgauge run`` calls it unstable) and the combination
    keeps them, naming the change that removes them and why it was left out; empty otherwise."""
    ops = next((t.effect.float64_ops[0] for t in report.trials if t.effect and t.effect.float64_ops[0] is not None),
               None)
    chosen = [t for t in report.trials if t.name in report.combined_changes]
    if not ops or any(t.removes_float64 for t in chosen):
        return ""
    line = (f"Still unstable: the unchanged trainer runs {ops} float64 ops and no change in the combination removes "
            "them, so rlgauge run will call the patched trainer unstable")
    remover = next((t for t in report.trials if t.removes_float64), None)
    if remover is not None:
        maths = remover.parity.cls if remover.parity else "not checked"
        line += f"; {remover.name} removes them, left out: {remover.verdict}, maths {maths}"
    return line + "."


def _noise_floor(trials: list[Trial]) -> list[str]:
    """The A/A arm's reading: the width of its interval is the noise; a verdict from it is a warning."""
    same = next((t for t in trials if t.name == A_A and t.ratio is not None), None)
    if same is None or same.error is not None:
        return []
    ratio = same.ratio
    line = (f"Noise floor (the A/A arm, the unchanged trainer against itself): {_effect(same)}, ±"
            f"{100 * (ratio.high - ratio.low) / 2:.1f} %.")
    if same.verdict in ("faster", "slower"):
        line += (f" It reads {same.verdict}: this machine's noise exceeded the intervals in this try (about 1 in 20 "
                 "A/A tries does); read the other verdicts with care, or try again on a quieter machine.")
    return [line]


def _notes(trials: list[Trial]) -> list[str]:
    notes = []
    for trial in trials:
        effect = trial.effect
        if effect is None or not effect.pairs:
            continue
        parts = []
        if effect.float64_ops[0] != effect.float64_ops[1]:
            parts.append(f"float64 ops {effect.float64_ops[0]} -> {effect.float64_ops[1]}")
        syncs = effect.host_syncs_per_step
        if None not in syncs and syncs[0] != syncs[1]:
            parts.append(f"host syncs per step {syncs[0]:.3g} -> {syncs[1]:.3g}")
        if trial.nonfinite:
            parts.append(f"{trial.nonfinite} NaN/Inf values in the state after the maths check")
        if effect.optimizers:
            parts.append("optimizers " + ", ".join(f"{k} {v}" for k, v in effect.optimizers.items()))
        if parts:
            notes.append(f"- {trial.name}: {'; '.join(parts)}")
    return ["", "Seen in the runs:", *notes] if notes else []


def _combined_line(report: TryReport) -> str:
    combined = report.combined
    if combined is None:
        return ("Combined: no change was faster with the maths kept (or removed float64 ops without a slowdown); "
                "nothing to combine.")
    names = " + ".join(report.combined_changes)
    if len(report.combined_changes) == 1:
        return (f"Combined: {names} alone (the only change faster, or rid of float64 ops, with the maths kept): "
                f"{_effect(combined)}.")
    return f"Combined ({names}): {_effect(combined)}, maths {_maths(combined)}: {combined.verdict}."


def _ratio(trial: Trial | None) -> dict[str, Any] | None:
    if trial is None:
        return None
    return _plain(trial.ratio, trial.effect.pairs if trial.effect else None)


def _plain(ratio: Any, pairs: int | None = None) -> dict[str, float] | None:
    if ratio is None:
        return None
    return {"median": ratio.value, "low": ratio.low, "high": ratio.high, "rounds": ratio.n,
            **({"pairs": pairs} if pairs is not None else {})}


def _trial(trial: Trial) -> dict[str, Any]:
    effect = trial.effect
    return {"change": trial.name, "kind": trial.change.kind, "where": [w for _, w in trial.edits] or trial.sites,
            "does": trial.change.does, "maths": trial.change.maths, "ratio": _ratio(trial),
            "wall_ratio": _plain(effect.ratio(), effect.pairs) if effect else None,
            "cpu_ratio": _plain(effect.cpu_ratio()) if effect else None,
            "trustworthy": effect.trustworthy if effect and effect.pairs else None,
            "disturbed_pairs": effect.disturbed if effect else None,
            "untrustworthy_reasons": effect.reasons if effect else [], "verdict": trial.verdict,
            "parity": trial.parity.to_dict() if trial.parity else None, "nonfinite_params": trial.nonfinite,
            "float64_ops": _pair(effect.float64_ops) if effect and effect.pairs else None,
            "host_syncs_per_step": _pair(effect.host_syncs_per_step) if effect and effect.pairs else None,
            "optimizers": trial.optimizers, "error": trial.error, "log": trial.log, "refused": trial.refused,
            "diff": trial.diff}


def _pair(pair: tuple[Any, Any]) -> dict[str, Any]:
    return {"unchanged": pair[0], "changed": pair[1]}


def _slices(report: TryReport) -> str:
    """The slices as they ran, or as they were aimed where none ran."""
    from harness.trials.slices import as_ran

    return as_ran(report.slices_ran) if report.slices_ran else f"aimed at {SLICE_SECONDS} s"


def unseeded_lines(report: TryReport) -> list[str]:
    """Why no change's maths could be judged: the unchanged trainer differs from itself, and what to seed."""
    if report.noise is None or report.noise <= TOLERANCE:
        return []
    lines = [f"Not reproducible: the unchanged trainer run twice from its seed differs by {report.noise:.2g}, so no "
             "change's maths can be judged and none joins a patch. Seed it, then try again:"]
    for found in report.unseeded:
        where = found["where"] if found["where"] == "the factory" else short(found["where"])
        lines.append(f"- {where}: {found['what']}; fix: {found['fix']}")
    if not report.unseeded:
        lines.append("- no unseeded env reset was seen: seed every source of randomness in the factory from its "
                     "seed (torch.manual_seed(seed), np.random.seed(seed), random.seed(seed), the env's first "
                     "reset(seed=seed))")
    return lines


def as_json(report: TryReport) -> dict[str, Any]:
    combined = report.combined
    tried = [t for t in report.trials if t.skip is None]
    return {"try": {
        "target": report.target, "variant": report.variant, "device": report.device, "rounds": report.rounds,
        "rounds_run": report.rounds_run, "combined_rounds": report.combined_rounds, "a_a": A_A,
        "turns_per_round": report.cycles, "slice_seconds": SLICE_SECONDS, "slice_seconds_ran": _median(report, "wall"),
        "slice_env_steps_ran": _median(report, "env_steps"), "threads_cap": report.threads_cap,
        "parity_iterations": report.iterations, "unchanged_parity_noise": report.noise,
        "unchanged_nonfinite": report.unchanged_nonfinite, "unseeded": report.unseeded,
        "trials": [_trial(t) for t in tried],
        "skipped": [{"change": t.name, "reason": t.skip} for t in report.trials if t.skip is not None],
        "combined": {"changes": report.combined_changes, "ratio": _ratio(combined),
                     "parity": combined.parity.to_dict() if combined and combined.parity else None,
                     "verdict": combined.verdict if combined else None,
                     "diff": combined.diff if combined else "",
                     "patch": report.patch, "no_patch": report.no_patch},
        "interrupted": report.interrupted, "failed": report.failed, "workdir": report.workdir,
        "accepted_changes": list(CHANGES)}}


def _median(report: TryReport, key: str) -> float | None:
    import statistics

    return statistics.median(float(a[key]) for a in report.slices_ran) if report.slices_ran else None
