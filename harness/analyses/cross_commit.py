"""``rlgauge gate --base REF``: the build under test against an earlier commit, in alternating processes.

``make gate`` compares two variants of one build, so a change that slows both passes; two result
files taken at different times differ by the machine's load as much as by the code. Here REF is
checked out into a temporary ``git worktree`` and both builds are measured by fresh
``python -m harness run`` processes, one after the other, in rounds whose order flips every
round (base-head, head-base, ...): load that drifts over the minutes hits both sides alike. Each
process's median env steps/s is one sample; the verdict is the paired ratio head/base over the
rounds (``compare.paired_ratio``), failing only when the whole interval lies below
``1 - max_slowdown_pct/100``.

REF's code runs with this environment's interpreter and packages: its worktree comes first on
``PYTHONPATH`` (and is the working directory), so REF's ``harness`` and ``reference_trainers`` are
imported, not this checkout's. The head side is this checkout as it is, uncommitted edits included.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from reference_trainers.state.atomic_file import write_text_atomically

from harness.cli.options import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK, user_overrides
from harness.stats.compare import Ratio, paired_ratio
from harness.errors import UserError
from harness.analyses.gate import Thresholds, load_thresholds
from harness.stats.power import MIN_REPEATS, has_power, no_verdict, resolution_note
from harness.specs.presets import specs_for
from harness.results import check_writable, load_results

BASE, HEAD = "base", "head"
DEFAULT_PRESET = "ppo-cartpole"
VARIANT = "optimized"
METRIC = "env_steps_per_sec"


@dataclass(frozen=True)
class Side:
    """One build to measure: ``base`` (REF's worktree) or ``head`` (this checkout)."""

    name: str
    label: str
    cwd: Path


@dataclass(frozen=True)
class Sample:
    """One measuring process: its median rate and whether the run judged itself trustworthy."""

    rate: float
    trustworthy: bool | None = None
    """None: the result records no quality verdict (written by an older harness)."""
    reasons: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)


Measure = Callable[[Side, int], Sample]
"""Measures one side for round ``i`` (0-based)."""


@dataclass(frozen=True)
class Verdict:
    outcome: str
    """``pass`` | ``fail`` | ``no verdict`` | ``untrustworthy``."""
    exit_code: int
    reason: str
    """One line for stderr: why (empty for a plain pass)."""
    ratio: Ratio | None = None


# --------------------------------------------------------------------------- rounds and verdict

def schedule(rounds: int) -> list[tuple[str, str]]:
    """The order of each round: base first in even rounds, head first in odd ones."""
    return [(BASE, HEAD) if i % 2 == 0 else (HEAD, BASE) for i in range(rounds)]


def run_rounds(rounds: int, sides: dict[str, Side], measure: Measure,
               say: Callable[[str], None] = lambda _text: None) -> list[dict[str, Sample]]:
    """Every side once per round, in ``schedule`` order; one progress line per measurement."""
    done: list[dict[str, Sample]] = []
    for i, order in enumerate(schedule(rounds)):
        got: dict[str, Sample] = {}
        for name in order:
            got[name] = sample = measure(sides[name], i)
            say(f"round {i + 1}/{rounds}: {name} {sample.rate:,.0f} env steps/s ({sides[name].label})")
        done.append(got)
    return done


def untrustworthy(samples: list[dict[str, Sample]]) -> list[str]:
    """``"head round 2: <reason>"`` for each sample whose run said it is not trustworthy."""
    return [f"{name} round {i + 1}: {'; '.join(s.reasons) or 'marked untrustworthy'}"
            for i, got in enumerate(samples) for name, s in got.items() if s.trustworthy is False]


def verdict(base: list[float], head: list[float], th: Thresholds, doubts: Sequence[str] = (),
            allow_untrustworthy: bool = False) -> Verdict:
    """Pass, fail (exit 1: the interval's high end below ``1 - max_slowdown_pct/100``), or no
    verdict (exit 2: too few rounds, or a run that was not trustworthy unless that is allowed)."""
    n = min(len(base), len(head))
    if not has_power(n):
        return Verdict("no verdict", EXIT_BAD_INPUT, no_verdict(n))
    ratio = paired_ratio(base[:n], head[:n], confidence=th.confidence)
    bar = 1.0 - th.max_slowdown_pct / 100.0
    if doubts and not allow_untrustworthy:
        more = f" and {len(doubts) - 1} more" if len(doubts) > 1 else ""
        return Verdict("no verdict", EXIT_BAD_INPUT, f"no verdict: a run was not trustworthy ({doubts[0]}{more}); "
                       "measure on a quieter machine, or pass --allow-untrustworthy", ratio)
    if ratio.high < bar:
        return Verdict("fail", EXIT_CHECK_FAILED, f"head is slower than base beyond -{th.max_slowdown_pct:g} %, "
                       f"confirmed by the interval (its high end {ratio.high:.3f}x < {bar:.3f}x)", ratio)
    reasons = ["below the bar, but not confirmed by the interval"] if ratio.value < bar else []
    if doubts:
        reasons.append(f"{len(doubts)} untrustworthy run{'s' * (len(doubts) > 1)} allowed")
    return Verdict("pass", EXIT_OK, "; ".join(reasons), ratio)


def measured_line(ratio: Ratio, th: Thresholds) -> str:
    """``head/base env_steps_per_sec 0.981x [0.950-1.010] (95 % CI, 3 rounds), bar 0.900x, resolves +/-3.1 %``."""
    return (f"head/base {METRIC} {ratio.value:.3f}x [{ratio.low:.3f}-{ratio.high:.3f}] "
            f"({th.confidence * 100:g} % CI, {ratio.n} rounds), bar {1 - th.max_slowdown_pct / 100:.3f}x "
            f"(-{th.max_slowdown_pct:g} %), {resolution_note(ratio)}")


def rounds_table(samples: list[dict[str, Sample]], sides: dict[str, Side]) -> Table:
    table = Table(title=escape(f"gate --base: {sides[HEAD].label} against {sides[BASE].label}, alternating processes"))
    for column, justify in (("round", "right"), ("order", "left"), (f"base {METRIC}", "right"),
                            (f"head {METRIC}", "right"), ("head/base", "right"), ("note", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for i, (got, order) in enumerate(zip(samples, schedule(len(samples)))):
        b, h = got[BASE], got[HEAD]
        notes = [f"{name}: {'; '.join(s.reasons) or 'untrustworthy'}" for name, s in got.items() if s.trustworthy is False]
        table.add_row(str(i + 1), "-".join(order), f"{b.rate:,.0f}", f"{h.rate:,.0f}", f"{h.rate / b.rate:.3f}x",
                      escape("; ".join(notes)))
    return table


# --------------------------------------------------------------------------- git

def _git(root: Path, *argv: str, detach: bool = False) -> subprocess.CompletedProcess[str]:
    """``git argv`` in ``root``; ``detach``: in a session of its own, so a second Ctrl-C spares it."""
    try:
        return subprocess.run(["git", *argv], cwd=root, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              start_new_session=detach)
    except FileNotFoundError:
        raise UserError("gate --base: git is not installed (REF is checked out with git worktree)") from None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def repo_root(start: Path) -> Path:
    """The git checkout holding ``start``; ``UserError`` outside one or outside rlgauge's."""
    proc = _git(start, "rev-parse", "--show-toplevel")
    if proc.returncode != 0:
        raise UserError(f"gate --base: {start} is not in a git checkout; run it inside the rlgauge repository")
    root = Path(proc.stdout.strip())
    if not (root / "harness" / "__main__.py").is_file():
        raise UserError(f"gate --base: {root} is not an rlgauge checkout (it has no harness/__main__.py)")
    return root


def resolve_ref(root: Path, ref: str) -> str:
    """REF's full commit id; ``UserError`` naming REF when it is no commit here."""
    if not ref or ref.startswith("-"):
        raise UserError(f"--base {ref!r}: not a git revision; accepted: a branch, tag, commit id or e.g. HEAD~1")
    proc = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if proc.returncode != 0:
        raise UserError(f"--base {ref!r}: no such commit in {root}; accepted: a branch, tag, commit id or e.g. HEAD~1 "
                        "(a shallow clone lacks the history: fetch it)")
    return proc.stdout.strip()


def head_label(root: Path) -> str:
    """``HEAD 1a2b3c4d5`` or, with uncommitted changes to tracked files, ``working tree at ...``."""
    proc = _git(root, "rev-parse", "--short=9", "HEAD")
    sha = proc.stdout.strip() if proc.returncode == 0 else "(no commit)"
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    return f"working tree at {sha}" if dirty else f"HEAD {sha}"


@contextmanager
def worktree(root: Path, sha: str) -> Iterator[tuple[Path, Path]]:
    """``(tree, scratch)``: ``sha`` checked out detached in a temporary folder, and a scratch folder;
    the worktree is removed and pruned on the way out, whatever happened."""
    scratch = Path(tempfile.mkdtemp(prefix="rlgauge-gate-base-"))
    tree = scratch / "tree"
    try:
        proc = _git(root, "worktree", "add", "--detach", "--quiet", str(tree), sha)
        if proc.returncode != 0:
            raise UserError(f"gate --base: git worktree add failed: {_last_line(proc.stderr)}")
        yield tree, scratch
    finally:
        if tree.exists():
            _git(root, "worktree", "remove", "--force", str(tree), detach=True)
        shutil.rmtree(scratch, ignore_errors=True)
        _git(root, "worktree", "prune", detach=True)


def _dependencies(pyproject: Path) -> frozenset[str] | None:
    """The declared requirements (``[extra] spec`` for optional ones); None where they cannot be read."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: not compared
        return None
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except FileNotFoundError:
        return frozenset()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    deps = {str(d) for d in project.get("dependencies", [])}
    for extra, specs in (project.get("optional-dependencies") or {}).items():
        deps |= {f"[{extra}] {d}" for d in specs}
    return frozenset(deps)


def dependency_note(root: Path, tree: Path, ref: str) -> str | None:
    """One line when REF's pyproject.toml declares other dependencies than this checkout's."""
    here, there = _dependencies(root / "pyproject.toml"), _dependencies(tree / "pyproject.toml")
    if here is None or there is None or here == there:
        return None
    changed = sorted(here ^ there)
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return (f"rlgauge: note: {ref}'s pyproject.toml declares other dependencies than this checkout's "
            f"({', '.join(changed[:3])}{more} differ); both sides run with this environment's packages")


# --------------------------------------------------------------------------- measuring processes

def run_command(preset: str, out: Path, args: argparse.Namespace, variant: str = VARIANT) -> list[str]:
    """``python -m harness run PRESET --variant V --quiet --out OUT`` plus the user's run options."""
    cmd = [sys.executable, "-m", "harness", "run", preset, "--variant", variant, "--quiet", "--out", str(out)]
    for option in ("steps", "repeats", "seed", "device"):
        value = getattr(args, option, None)
        if value is not None:
            cmd += [f"--{option}", str(value)]
    for item in getattr(args, "overrides", None) or []:
        cmd += ["--set", item]
    return cmd


def child_env(code: Path) -> dict[str, str]:
    """This environment, with ``code`` first on PYTHONPATH and one BLAS/OpenMP thread (as ``make gate``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code), env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = "1"
    return env


def read_sample(path: Path, variant: str = VARIANT) -> Sample:
    """The measured run of one process's result file: its median rate and quality verdict."""
    runs = load_results(path)
    index = next((i for i, r in enumerate(runs) if r.variant == variant), 0 if len(runs) == 1 else None)
    if index is None:
        raise UserError(f"{path}: no {variant} run in it (runs: {', '.join(r.variant for r in runs) or 'none'})")
    run = runs[index]
    block = run.metrics.get(METRIC)
    if not isinstance(block, dict) or not block.get("median"):
        raise UserError(f"{path}: the {run.variant} run has no {METRIC} (status {run.status})")
    quality = json.loads(path.read_text(encoding="utf-8"))["runs"][index].get("quality")
    if not isinstance(quality, dict) or not isinstance(quality.get("trustworthy"), bool):
        return Sample(float(block["median"]), None, (), run.config)
    return Sample(float(block["median"]), quality["trustworthy"], tuple(map(str, quality.get("reasons") or ())),
                  run.config)


@dataclass(frozen=True)
class ProcessMeasure:
    """Measures a side by a ``python -m harness run`` process in its folder (the ``Measure`` of the CLI)."""

    preset: str
    args: argparse.Namespace
    scratch: Path
    variant: str = VARIANT

    def __call__(self, side: Side, index: int) -> Sample:
        out = self.scratch / f"{side.name}-{index + 1}.json"
        proc = subprocess.run(run_command(self.preset, out, self.args, self.variant), cwd=side.cwd,
                              env=child_env(side.cwd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        if proc.returncode == EXIT_INTERRUPTED:
            raise KeyboardInterrupt
        if proc.returncode != 0:
            raise UserError(f"gate --base: the {side.name} run of round {index + 1} ({side.label}) exited "
                            f"{proc.returncode}: {_last_line(proc.stderr)}")
        return read_sample(out, self.variant)


# --------------------------------------------------------------------------- the command

def _check_options(args: argparse.Namespace) -> int:
    """The options that make no sense with ``--base``; returns the number of rounds."""
    if getattr(args, "baseline", None) is not None or getattr(args, "candidate", None) is not None:
        raise UserError("gate: --base measures two commits; --baseline/--candidate compare two result files (not both)")
    if getattr(args, "min_speedup", None) is not None:
        raise UserError("gate --base: --min-speedup applies to --run alone; with --base use --max-slowdown")
    rounds = getattr(args, "rounds", None)
    rounds = MIN_REPEATS if rounds is None else rounds
    if not has_power(rounds):
        raise UserError(f"--rounds {rounds}: {no_verdict(rounds)}; accepted: --rounds N with N >= {MIN_REPEATS}")
    return rounds


def _preset_argument(preset: str) -> str:
    """A config file given by a relative path still names it from another working directory."""
    path = Path(preset)
    return str(path.resolve()) if path.suffix in (".yaml", ".yml") and path.is_file() else preset


def summary(ref: str, sha: str, sides: dict[str, Side], preset: str, samples: list[dict[str, Sample]],
            th: Thresholds, result: Verdict) -> dict[str, Any]:
    """The ``--out`` JSON: what was compared, every round, the ratio and the verdict."""
    ratio = result.ratio
    return {
        "kind": "rlgauge gate --base",
        "base": {"ref": ref, "commit": sha, "label": sides[BASE].label},
        "head": {"label": sides[HEAD].label},
        "preset": preset, "variant": VARIANT, "metric": METRIC,
        "rounds": [{"order": list(order), "ratio": got[HEAD].rate / got[BASE].rate,
                    **{name: {"rate": s.rate, "trustworthy": s.trustworthy, "reasons": list(s.reasons)}
                       for name, s in got.items()}}
                   for got, order in zip(samples, schedule(len(samples)))],
        "ratio": None if ratio is None else {"value": ratio.value, "low": ratio.low, "high": ratio.high,
                                             "method": ratio.method, "n": ratio.n},
        "confidence": th.confidence, "max_slowdown_pct": th.max_slowdown_pct,
        "verdict": result.outcome, "exit_code": result.exit_code, "reason": result.reason,
    }


def cmd_gate_base(args: argparse.Namespace, measure_with: Callable[[str, argparse.Namespace, Path], Measure] = ProcessMeasure,
                  ) -> int:
    """``rlgauge gate --base REF [--run PRESET]``: exit 0 pass, 1 a confirmed slowdown, 2 no verdict.

    ``measure_with(preset, args, scratch)`` makes the measuring function (tests pass a fake)."""
    rounds = _check_options(args)
    th = load_thresholds(getattr(args, "thresholds", None)).with_overrides(
        max_slowdown_pct=getattr(args, "max_slowdown", None), confidence=getattr(args, "confidence", None))
    preset = getattr(args, "run", None) or DEFAULT_PRESET
    specs_for(preset, VARIANT, user_overrides(args))  # checked with this checkout's presets before anything runs
    if getattr(args, "out", None) is not None:
        check_writable(args.out)
    root = repo_root(Path.cwd())
    sha = resolve_ref(root, args.base)
    say = (lambda _text: None) if getattr(args, "quiet", False) else (lambda text: print(text, file=sys.stderr, flush=True))
    with worktree(root, sha) as (tree, scratch):
        sides = {BASE: Side(BASE, f"{args.base} ({sha[:9]})", tree), HEAD: Side(HEAD, head_label(root), root)}
        note = dependency_note(root, tree, args.base)
        if note:
            print(note, file=sys.stderr)
        say(f"gate --base: {preset}/{VARIANT}, {rounds} rounds, one process per side, order flipped every round")
        samples = run_rounds(rounds, sides, measure_with(_preset_argument(preset), args, scratch), say)
    return _report(args, sha, sides, preset, samples, th)


def _report(args: argparse.Namespace, sha: str, sides: dict[str, Side], preset: str,
            samples: list[dict[str, Sample]], th: Thresholds) -> int:
    """The rounds table and the verdict (stdout), notes and the one-line outcome (stderr), ``--out``."""
    unrecorded = sorted({name for got in samples for name, s in got.items() if s.trustworthy is None})
    if unrecorded:
        print(f"rlgauge: note: the {' and '.join(unrecorded)} results record no quality verdict (an older "
              "harness): taken as they are", file=sys.stderr)
    configs = _config_differences(samples[0][BASE].config, samples[0][HEAD].config) if samples else []
    if configs:
        print(f"rlgauge: note: the configs of base and head differ in {', '.join(configs[:5])}"
              + (f" and {len(configs) - 5} more" if len(configs) > 5 else ""), file=sys.stderr)
    result = verdict([got[BASE].rate for got in samples], [got[HEAD].rate for got in samples], th,
                     untrustworthy(samples), bool(getattr(args, "allow_untrustworthy", False)))
    console = Console(soft_wrap=False, width=max(160, Console().width))
    console.print(rounds_table(samples, sides))
    if result.ratio is not None:
        console.print(escape(f"gate --base: {measured_line(result.ratio, th)}: {result.outcome}"))
    out = getattr(args, "out", None)
    if out is not None:
        payload = summary(args.base, sha, sides, preset, samples, th, result)
        try:
            write_text_atomically(Path(out), json.dumps(payload, indent=2) + "\n")
        except OSError as exc:
            raise UserError(f"--out {out}: cannot write the summary ({exc.strerror or exc})") from None
        print(f"summary written to {out}", file=sys.stderr)
    if result.outcome == "pass":
        print("rlgauge: gate passed" + (f" ({result.reason})" if result.reason else ""), file=sys.stderr)
    elif result.outcome == "fail":
        print(f"rlgauge: gate failed: {result.reason}", file=sys.stderr)
    else:
        print(f"rlgauge: gate --base: {result.reason}", file=sys.stderr)
    return result.exit_code


def _config_differences(base: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """Dotted config keys whose values differ between a base run and a head run."""
    def flat(value: Any, prefix: str = "") -> dict[str, Any]:
        if not isinstance(value, dict):
            return {prefix: value}
        return {k: v for key, child in value.items() for k, v in flat(child, f"{prefix}.{key}" if prefix else str(key)).items()}

    a, b = flat(base), flat(head)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
