"""A whole try: the candidates' arms prepared, their maths checked (``parity``), their speed measured in
alternating slices of live processes (``slices``), then the combination of those that were faster and kept the
maths.

Every arm runs in processes of its own (``processes``); the patched copies, requests and logs live in a temporary
folder, removed at the end unless something failed (then kept, its path in ``TryReport.workdir``). A
KeyboardInterrupt ends the try with what was measured (``TryReport.interrupted``).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from harness.diagnosis.frames import short
from harness.measurement.machine_state import fair_threads_cap
from harness.trials import parity, rounds, slices
from harness.trials.processes.arms import Arm, ArmRunner, Target
from harness.trials.catalogue import A_A, Change
from harness.trials.patch_file import combined_files, unified_diff
from harness.trials.patched_copy import arrange_search, edited_files, write_copies
from harness.trials.plan import Candidate
from harness.trials.source_edits import EditRefused


@dataclass
class Trial:
    change: Change
    sites: list[str] = field(default_factory=list)
    skip: str | None = None
    edits: list[tuple[str, str]] = field(default_factory=list)
    """``(change, file:line)`` of the source edits made (a subset of ``sites``)."""
    refused: list[str] = field(default_factory=list)
    """The sites whose edit was refused, each with why."""
    arm: Arm | None = None
    parity: parity.Parity | None = None
    nonfinite: int | None = None
    effect: rounds.Effect | None = None
    error: str | None = None
    log: str | None = None
    """The log of the arm's process that failed (kept in the work folder)."""
    optimizers: dict[str, str] = field(default_factory=dict)
    diff: str = ""

    @property
    def name(self) -> str:
        return self.change.name

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return f"failed: {self.error}"
        return rounds.verdict(self.ratio)

    @property
    def ratio(self):  # noqa: ANN201 - a Ratio or None
        """The ratio the verdict rests on: changed / unchanged env steps/s (wall time)."""
        return self.effect.ratio() if self.effect else None

    @property
    def removes_float64(self) -> bool:
        """The unchanged trainer ran float64 ops (``rlgauge run`` calls it unstable) and this change has none."""
        ops = self.effect.float64_ops if self.effect else (None, None)
        return bool(ops[0]) and ops[1] == 0

    @property
    def qualifies(self) -> bool:
        """A member of the combination: the maths kept, and faster, or rid of the float64 ops that make ``rlgauge
        run`` call the trainer unstable without being found slower."""
        if self.parity is None or not self.parity.keeps_maths:
            return False
        return self.verdict == "faster" or (self.removes_float64 and self.verdict.startswith("no effect"))


@dataclass
class TryReport:
    target: str
    variant: str
    device: str
    rounds: int
    iterations: int
    cycles: int = slices.CYCLES
    threads_cap: int | None = None
    """torch's default thread count in every arm, where ``run.fair_threads`` capped it (None: torch's default)."""
    trials: list[Trial] = field(default_factory=list)
    combined: Trial | None = None
    """The combination's arm (``change`` of the first member), or a qualifying trial alone."""
    combined_changes: list[str] = field(default_factory=list)
    patch: str = ""
    """The combination as a diff: set only when it kept the maths and was not found slower (one member: its own)."""
    no_patch: str | None = None
    """Why there is no patch though changes qualified (the combination changed the maths, failed or was slower)."""
    noise: float | None = None
    """The unchanged trainer's own parity: its largest relative difference run twice from the seed."""
    unchanged_nonfinite: int | None = None
    """NaN/Inf values in the unchanged trainer's state after the maths check."""
    unseeded: list[dict[str, str]] = field(default_factory=list)
    """Where the unchanged trainer's randomness escapes its seed, each ``{"where", "what", "fix"}``
    (``seeding``): set when its two runs from one seed differ (its maths "not reproducible")."""
    interrupted: bool = False
    failed: str | None = None
    """Why the try stopped (the unchanged trainer failed)."""
    slices_ran: list[dict[str, Any]] = field(default_factory=list)
    """Every slice of the trials' rounds as it ran (``{"env_steps", "wall", "cpu"}``)."""
    rounds_run: int = 0
    """Rounds the trials ran (fewer than ``rounds`` when every interval was decisive early)."""
    combined_rounds: int = 0
    workdir: str | None = None
    """The work folder (requests, logs, patched copies), kept when something failed; removed otherwise."""

    @property
    def failures(self) -> list[Trial]:
        """The trials that failed, the combination's arm last."""
        combined = [self.combined] if self.combined is not None and all(self.combined is not t for t in self.trials) \
            else []
        return [t for t in [*self.trials, *combined] if t.error is not None]


def _prepare(trial: Trial, workdir: Path, factory: tuple[Path | None, str]) -> None:
    """The trial's arm: its runtime change, or copies of the user's files with its edits made."""
    name = trial.name
    if trial.change.kind == "runtime":
        trial.arm = Arm(name, (name,), (name,))
    else:
        for where in trial.sites:
            try:
                edited_files([(name, where)])
                trial.edits.append((name, where))
            except EditRefused as refused:
                trial.refused.append(f"{short(where)}: {refused}")
        if not trial.edits:
            trial.skip = "; ".join(trial.refused)
            return
        edited = edited_files(trial.edits)
        trial.arm = Arm(name, (name,), (), write_copies(edited, workdir / name), edited)
    trial.diff = _diff([name], trial.arm.edited, factory, {})


def _diff(names: list[str], edited: dict[Path, tuple[str, str]], factory: tuple[Path | None, str],
          optimizers: dict[str, str]) -> str:
    path, attribute = factory
    files = combined_files(names, edited, path, attribute, optimizers)
    base = path.parent if path is not None else Path.cwd()
    return unified_diff(files, base)


def _parities(runner: ArmRunner, trials: list[Trial], maths: dict[str, dict[str, Any]], iterations: int,
              report: TryReport) -> dict[str, Any]:
    """Each trial's parity against the unchanged trainer's, from the first round's maths checks (``maths``: each
    arm's ready answer); the unchanged trainer's own noise from the A/A arm (the unchanged trainer run again),
    or from a second run of it where there is none. The reference's answer."""
    first = maths.get(rounds.UNCHANGED, {})
    second = maths.get(A_A, {})
    if "parity" not in second:
        second = runner.run(Arm(rounds.UNCHANGED), "parity", iterations)
    if "parity" not in first or "error" in second:
        raise rounds.UnchangedFailed(f"the unchanged trainer failed: {first.get('error') or second.get('error')}")
    noise = parity.compare(parity.load(first["params"]), parity.load(second["params"])).value
    report.noise = float("inf") if noise is None else noise
    report.unchanged_nonfinite = first.get("parity", {}).get("nonfinite")
    if not report.noise <= parity.TOLERANCE:
        report.unseeded = _unseeded(first, second)
    for trial in trials:
        answer = maths.get(trial.name)
        if answer is not None and "parity" in answer:
            _classify(trial, first, answer, report.noise)
    return first


def _unseeded(first: dict[str, Any], second: dict[str, Any]) -> list[dict[str, str]]:
    """What the unchanged trainer's two runs say escaped the seed: its unseeded env resets, and torch's generator
    where the two runs' weights already differ just before their first optimizer step (as built: a generator's
    first call may have trained before its modules are seen, so its ``initial`` state is no witness)."""
    import torch

    from harness.trials.seeding import initial_weights_fix

    found = list(first.get("parity", {}).get("unseeded") or [])
    before = parity.load(first["params"]).get("before_first_step")
    again = parity.load(second["params"]).get("before_first_step")
    if before is not None and again is not None and (
            before.keys() != again.keys() or any(not torch.equal(before[k], again[k]) for k in before)):
        found.insert(0, initial_weights_fix())
    return found


def _check_maths(runner: ArmRunner, trial: Trial, reference: dict[str, Any], noise: float, iterations: int) -> None:
    assert trial.arm is not None
    answer = runner.run(trial.arm, "parity", iterations)
    if "error" in answer:
        trial.error, trial.log = answer["error"], answer.get("log")
        return
    _classify(trial, reference, answer, noise)


def _classify(trial: Trial, reference: dict[str, Any], answer: dict[str, Any], noise: float) -> None:
    """The trial's maths from its check's answer (``{"parity", "params"}``) against the unchanged trainer's."""
    trial.parity = parity.classify(parity.compare(parity.load(reference["params"]), parity.load(answer["params"])),
                                   noise)
    trial.nonfinite = answer["parity"]["nonfinite"]
    trial.optimizers = answer.get("optimizers", {}) or trial.optimizers


def members(trials: list[Trial]) -> list[Trial]:
    """The combination: every trial that qualifies (``Trial.qualifies``), the best of each group of alternatives
    (faster first, then the higher ratio)."""
    chosen: dict[str, Trial] = {}
    for trial in trials:
        if not trial.qualifies or trial.name == A_A:  # the A/A arm changes nothing: a check, never a member
            continue
        key = trial.change.group or trial.name
        best = chosen.get(key)
        if best is None or (trial.verdict == "faster", trial.ratio.value) > \
                (best.verdict == "faster", best.ratio.value):  # type: ignore[union-attr]
            chosen[key] = trial
    return [t for t in trials if t in chosen.values()]


def _combined_arm(name: str, chosen: list[Trial], workdir: Path) -> Arm:
    """One arm with every change of ``chosen`` (``EditRefused`` when their source edits do not combine)."""
    runtime = tuple(t.name for t in chosen if t.change.kind == "runtime")
    edited = edited_files([edit for t in chosen for edit in t.edits])
    return Arm(name, tuple(t.name for t in chosen), runtime, write_copies(edited, workdir / name) if edited else None,
               edited)


def _combine(runner: ArmRunner, chosen: list[Trial], reference: dict[str, Any], workdir: Path,
             factory: tuple[Path | None, str], report: TryReport, say: Callable[[str], None]) -> None:
    """The members applied together, its maths checked and measured as each trial was (one member: its own); the
    patch kept only when the combination kept the maths and was not slower (else ``report.no_patch`` says why)."""
    names = [t.name for t in chosen]
    report.combined_changes = names
    optimizers = {k: v for t in chosen for k, v in t.optimizers.items()}
    edits = [edit for t in chosen for edit in t.edits]
    try:
        edited = edited_files(edits)
    except EditRefused as refused:  # two edits that do not go together: each alone was measured
        report.combined = Trial(chosen[0].change, error=f"the source edits do not combine: {refused}")
        report.no_patch = f"the source edits do not combine: {refused}"
        return
    candidate = _diff(names, edited, factory, optimizers)
    if len(chosen) == 1:
        report.combined = chosen[0]
        report.patch = candidate
        return
    arm = _combined_arm("combined", chosen, workdir)
    combined = Trial(chosen[0].change, arm=arm, optimizers=optimizers, diff=candidate)
    report.combined = combined
    say(f"try: the combination: {' + '.join(names)}")
    _check_maths(runner, combined, reference, report.noise or 0.0, report.iterations)
    if combined.error is None and combined.parity is not None and not combined.parity.keeps_maths:
        report.no_patch = _maths_breaker(runner, chosen, reference, workdir, report, combined.parity)
        return
    if combined.error is None:
        effects: dict[str, rounds.Effect] = {}
        report.combined_rounds = slices.measure(runner, [arm], report.rounds, effects, say, report.cycles,
                                                label="combined round")
        combined.effect = effects["combined"]
        combined.error, combined.log = combined.effect.error, combined.effect.log
    if combined.error is not None:
        report.no_patch = f"the combination failed: {combined.error}"
    elif combined.verdict == "slower":
        report.no_patch = f"the combination was slower: {_ratio_text(combined)}"
    elif combined.verdict == "faster" or combined.verdict.startswith("no effect"):
        report.patch = candidate
    else:
        report.no_patch = f"the combination was not measured ({combined.verdict})"


def _maths_breaker(runner: ArmRunner, chosen: list[Trial], reference: dict[str, Any], workdir: Path,
                   report: TryReport, found: parity.Parity) -> str:
    """Why the combination changes the maths though each member alone kept it: the first member whose addition to
    those before it changes the maths (each prefix of two or more members checked in turn)."""
    breaker, before = chosen[-1], chosen[:-1]
    for count in range(2, len(chosen)):
        trial = Trial(chosen[0].change, arm=_combined_arm(f"combined-{count}", chosen[:count], workdir))
        _check_maths(runner, trial, reference, report.noise or 0.0, report.iterations)
        if trial.error is not None or (trial.parity is not None and not trial.parity.keeps_maths):
            breaker, before = chosen[count - 1], chosen[:count - 1]
            break
    detail = f"max rel diff {found.max_rel_diff:.2g}" if found.max_rel_diff is not None else found.note
    return (f"the combination changes the maths ({detail}): {breaker.name} added to "
            f"{' + '.join(t.name for t in before)} does, though each kept it alone")


def _ratio_text(trial: Trial) -> str:
    ratio = trial.ratio
    return "not measured" if ratio is None else f"{ratio.value:.3f}x [{ratio.low:.3f}-{ratio.high:.3f}]"


def _say_to_stderr(text: str) -> None:
    import sys

    print(text, file=sys.stderr, flush=True)


def run_try_job(target: Target, label: str, device: str, candidates: list[Candidate], factory: tuple[Path | None, str],
                rounds_count: int, iterations: int, cycles: int) -> TryReport:
    """``run_try`` as a campaign job (``--executor ray``): importable by name, its progress on the job's stderr. The
    job's process never imported the user's module: the parent's import path is arranged here, so that source
    edits are checked by the file that name imports (``patched_copy.importable_as_copy``)."""
    arrange_search(target.sys_path)
    return run_try(target, label, device, candidates, factory, rounds_count, iterations, _say_to_stderr, cycles)


def run_try(target: Target, label: str, device: str, candidates: list[Candidate], factory: tuple[Path | None, str],
            rounds_count: int, iterations: int, say: Callable[[str], None], cycles: int = slices.CYCLES) -> TryReport:
    """Prepare, check and measure every candidate, then their combination; never raises for a trial's failure."""
    # decided once, on the machine the try runs on, before any arm of its own runs (arms warming up side by side
    # would see each other as the machine's load)
    target = replace(target, threads_cap=fair_threads_cap(target.fair_threads))
    report = TryReport(label, target.variant, device, rounds_count, iterations, cycles, target.threads_cap)
    workdir = Path(tempfile.mkdtemp(prefix="rlgauge-try-"))
    try:
        report.trials = [Trial(c.change, list(c.sites), skip=c.skip) for c in candidates]
        for trial in report.trials:
            if trial.skip is None:
                _prepare(trial, workdir, factory)
        live = [t for t in report.trials if t.skip is None]
        if not live:
            return report
        # forked arms on the CPU only: a process that has touched a GPU's driver cannot be forked safely
        runner = ArmRunner(target, workdir, forked=device.split(":")[0] == "cpu")
        try:
            effects: dict[str, rounds.Effect] = {}
            for trial in live:
                trial.effect = effects.setdefault(trial.name, rounds.Effect())
            say(f"try: {rounds_count} rounds of {1 + len(live)} live processes (unchanged, "
                + ", ".join(t.name for t in live) + f"), {cycles} turns each in slices aimed at "
                f"{slices.SLICE_SECONDS} s (whole calls); the first round's also check the maths: {iterations} iterate() calls "
                f"(at least {iterations} optimizer steps) from the seed")
            maths: dict[str, dict[str, Any]] = {}
            interrupted = False
            try:
                report.rounds_run = slices.measure(runner, [t.arm for t in live if t.arm is not None], rounds_count,
                                                   effects, say, cycles, exempt=frozenset({A_A}), maths=maths,
                                                   parity_iterations=iterations, ran=report.slices_ran)
            except KeyboardInterrupt:  # the maths already checked are kept
                interrupted = True
            reference = _parities(runner, live, maths, iterations, report) if maths else {}
            if interrupted:
                raise KeyboardInterrupt
            for trial in live:
                if trial.optimizers and trial.arm is not None:  # the patch names what the arm built (fused/foreach)
                    trial.diff = _diff([trial.name], trial.arm.edited, factory, trial.optimizers)
                if trial.error is None and trial.effect.error is not None:  # type: ignore[union-attr]
                    trial.error, trial.log = trial.effect.error, trial.effect.log  # type: ignore[union-attr]
            chosen = members(report.trials)
            if not (report.noise is None or report.noise <= parity.TOLERANCE):
                report.no_patch = ("the unchanged trainer is not reproducible from its seed, so no change's maths "
                                   "could be judged: seed what the report names, then try again")
            if chosen:
                _combine(runner, chosen, reference, workdir, factory, report, say)
        except KeyboardInterrupt:
            report.interrupted = True
        except rounds.UnchangedFailed as failed:
            report.failed = str(failed)
        finally:
            if hasattr(runner, "close"):
                runner.close()
    finally:
        if report.failed or report.failures:
            report.workdir = str(workdir)  # the logs the failures quote stay where they are named
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return report
