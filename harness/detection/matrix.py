"""``rlgauge detection-matrix``: plant each kind of regression into a throwaway commit of a scratch clone, run
every gate on it against the base, ``--runs`` times, and tabulate caught k of n (A/A: false alarms k of n).

Resumable: every cell is saved as it is measured (``WORKDIR/state.json``, keyed by the base commit; a run beside
``--busy N`` loops in ``state-busyN.json``), a rerun measures only the missing ones, and an interrupted matrix is
tabulated with the missing cells named. ``--aa-chain N`` adds N empty commits in a row, each compared with its
parent as ``make asv-continuous`` compares two commits: the asv gates' false alarms in N comparisons.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from harness.detection import gates
from harness.detection.plants import PLANTS, PlantDoesNotApply
from harness.errors import UserError

DOC_START, DOC_END = "<!-- detection-matrix:start -->", "<!-- detection-matrix:end -->"
"""The markers in docs/tracking.md between which ``--doc`` writes the table."""


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, **env} if env else None)
    if done.returncode != 0:
        raise UserError(f"git {' '.join(args)} failed in {repo}: {done.stderr.strip().splitlines()[-1:] or ['']}")
    return done.stdout.strip()


def check_repository(repo: Path, base: str = "HEAD") -> str:
    """The base commit (``base``, HEAD by default); a dirty tree or a folder without git history is refused (bad
    input), and so is a ``base`` that is not a commit here."""
    head = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD^{commit}"], cwd=repo,
                          capture_output=True, text=True)
    if head.returncode != 0:
        raise UserError(f"{repo}: no git history here; the detection matrix plants commits on top of HEAD "
                        "(run it in a clone of the project)")
    inside = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}"], cwd=repo,
                            capture_output=True, text=True)
    if inside.returncode != 0:
        raise UserError(f"--base {base}: not a commit in {repo}; give a branch, a tag or a commit hash")
    if _git(repo, "status", "--porcelain", "--untracked-files=no"):
        raise UserError(f"{repo}: uncommitted changes; the matrix measures commits only "
                        "(commit or stash them first)")
    return inside.stdout.strip()


def plant_commits(clone: Path, base: str, names: Sequence[str]) -> dict[str, str]:
    """One commit per plant on top of ``base`` in the scratch clone: plant name -> commit. Each is dated as the base
    is, so the same plant on the same base is the same commit in every run (asv's stored results stay its own)."""
    date = _git(clone, "log", "-1", "--format=%cI", base)
    dated = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    commits = {}
    for name in names:
        _git(clone, "checkout", "-q", "-B", f"plant-{name}", base)
        try:
            PLANTS[name].apply(clone)
        except PlantDoesNotApply as exc:
            raise UserError(f"plant {name} does not apply: {exc}") from None
        _git(clone, "-c", "user.name=rlgauge", "-c", "user.email=rlgauge@localhost", "commit", "-q", "-a",
             "--allow-empty", "-m", f"planted regression: {name}", env=dated)
        commits[name] = _git(clone, "rev-parse", "HEAD")
    _git(clone, "checkout", "-q", base)
    return commits


AA_CHAIN = "aa_chain"
"""The state's key of the A/A chain's cells (``gate|aa_chain|k``: the k-th empty commit against its parent)."""


def state_path(workdir: Path, busy: int) -> Path:
    """Each load has its own cells: a quiet run and a run beside busy loops are different experiments."""
    return workdir / ("state.json" if busy == 0 else f"state-busy{busy}.json")


def _tag(busy: int, run: int | str) -> str:
    return str(run) if busy == 0 else f"busy{busy}-{run}"


def chain_commits(clone: Path, base: str, count: int) -> list[str]:
    """``count`` empty commits in a row on top of ``base``, dated as the base (the same commits in every run)."""
    date = _git(clone, "log", "-1", "--format=%cI", base)
    dated = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    _git(clone, "checkout", "-q", "-B", "aa-chain", base)
    commits = []
    for k in range(1, count + 1):
        _git(clone, "-c", "user.name=rlgauge", "-c", "user.email=rlgauge@localhost", "commit", "-q",
             "--allow-empty", "-m", f"A/A chain: empty commit {k} of {count}", env=dated)
        commits.append(_git(clone, "rev-parse", "HEAD"))
    _git(clone, "checkout", "-q", base)
    return commits


class State:
    """The measured cells, saved after each one (atomically)."""

    def __init__(self, path: Path, base: str) -> None:
        self.path = path
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        if data.get("base") != base:
            data = {"base": base, "cells": {}, "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "seconds": 0.0}
        self.data = data

    @property
    def cells(self) -> dict[str, dict]:
        return self.data["cells"]

    def put(self, gate: str, plant: str, run: int, verdict: gates.Verdict) -> None:
        self.cells[f"{gate}|{plant}|{run}"] = verdict.to_dict()
        self.save()

    def has(self, gate: str, plant: str, run: int) -> bool:
        """Measured with a verdict (a cell that failed to run is measured again)."""
        cell = self.cells.get(f"{gate}|{plant}|{run}")
        return cell is not None and cell.get("outcome") != gates.FAILED

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1), encoding="utf-8")
        os.replace(tmp, self.path)


@contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes that spin beside the measurements (a loaded machine), ended afterwards."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def _asv_config(clone: Path, workdir: Path, run: int | str) -> Path:
    """The clone's asv configuration with this run's own results folder (the environments are shared)."""
    text = (clone / "asv.conf.json").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.strip().startswith("//")]
    config = json.loads("\n".join(lines))
    config["results_dir"] = str(workdir / f"asv-results-{run}")
    config["env_dir"] = str(workdir / "asv-env")
    config["html_dir"] = str(workdir / "asv-html")
    config["repo"] = str(clone)
    config["benchmark_dir"] = str(clone / config.get("benchmark_dir", "benchmarks"))
    path = workdir / f"asv-{run}.conf.json"
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    return path


def _log(message: str) -> None:
    print(f"detection-matrix: {message}", file=sys.stderr, flush=True)


def measure(repo: Path, workdir: Path, plants: Sequence[str], chosen: Sequence[str], runs: int,
            busy: int, base_ref: str = "HEAD", aa_chain: int = 0) -> State:
    """Every missing (gate, plant, run) cell, then the A/A chain's; returns the state with what was measured."""
    base = check_repository(repo, base_ref)
    workdir.mkdir(parents=True, exist_ok=True)
    state = State(state_path(workdir, busy), base)
    known_plants, known_gates = state.data.get("plants", []), state.data.get("gates", [])
    state.data.update(plants=[p for p in PLANTS if p in plants or p in known_plants],
                      gates=[g for g in gates.GATES if g in chosen or g in known_gates],
                      runs=max(runs, state.data.get("runs", 0)), busy=busy,
                      aa_chain=max(aa_chain, state.data.get("aa_chain", 0)))
    clone = workdir / "clone"
    if not (clone / ".git").exists():
        _git(workdir, "clone", "-q", "--no-hardlinks", str(repo), str(clone))
    _git(clone, "fetch", "-q", str(repo), base)
    commits = plant_commits(clone, base, plants)
    subprocess.run([sys.executable, "-m", "asv", "machine", "--yes"], cwd=clone, capture_output=True)
    started = time.monotonic()
    try:
        with busy_loops(busy):
            for run in range(1, runs + 1):
                _measure_run(clone, workdir, state, base, commits, chosen, run, busy)
            if aa_chain:
                _measure_aa_chain(clone, workdir, state, base, aa_chain, chosen, busy)
    finally:
        state.data["seconds"] = state.data.get("seconds", 0.0) + time.monotonic() - started
        state.save()
    return state


def _unmeasured(state: State, gate: str, plant: str, run: int) -> bool:
    return not state.has(gate, plant, run) and gates.blind(gate, plant) is None


def _asv_gates(chosen: Sequence[str]) -> list[str]:
    """The chosen gates that one asv run serves (``make asv-continuous``'s two halves)."""
    return [g for g in (gates.ASV_RELATIVE, gates.ASV_COUNT) if g in chosen]


def _asv_cell(verdict: gates.Verdict, code: int, out: str, seconds: float) -> gates.Verdict:
    """A comparison's verdict, or the asv run's own failure where the comparison has nothing to read."""
    if code == 0 or verdict.outcome != gates.FAILED:
        return verdict
    return gates.Verdict(gates.FAILED, f"asv run exit {code}: {gates.last_line(out)}", seconds)


def _measure_run(clone: Path, workdir: Path, state: State, base: str, commits: dict[str, str],
                 chosen: Sequence[str], run: int, busy: int = 0) -> None:
    asv_gates = _asv_gates(chosen)
    missing_asv = [p for p in commits if any(_unmeasured(state, g, p, run) for g in asv_gates)]
    if missing_asv:
        config = _asv_config(clone, workdir, _tag(busy, run))
        _log(f"run {run}: asv over the base and {len(missing_asv)} plant commits")
        code, out, seconds = gates.asv_run(clone, config, [base, *(commits[p] for p in missing_asv)])
        for plant in missing_asv:
            for gate, verdict in gates.asv_verdicts(clone, config, base, commits[plant], seconds).items():
                if gate in asv_gates and gates.blind(gate, plant) is None:
                    state.put(gate, plant, run, _asv_cell(verdict, code, out, seconds))
    if gates.ASV_RELATIVE in asv_gates:
        _fill_costs(clone, workdir, state, base, commits, run, busy)
    baseline = workdir / f"plugin-baseline-{_tag(busy, run)}.json"
    for plant, commit in commits.items():
        for gate in chosen:
            if gate in asv_gates or not _unmeasured(state, gate, plant, run):
                continue
            _git(clone, "checkout", "-q", commit)
            _log(f"run {run}: {gate} on {plant}")
            if gate == gates.ONE_PROCESS:
                verdict = gates.one_process(clone)
            elif gate == gates.CROSS_COMMIT:
                verdict = gates.cross_commit(clone, base)
            elif gate == gates.PROPERTY_TESTS:
                verdict = gates.property_tests(clone)
            else:
                if not baseline.exists():
                    _git(clone, "checkout", "-q", base)
                    code, line = gates.plugin_baseline(clone, baseline)
                    _git(clone, "checkout", "-q", commit)
                    if code != 0:
                        state.put(gate, plant, run, gates.Verdict(gates.FAILED, f"base result: {line}", 0.0))
                        continue
                verdict = gates.plugin(clone, baseline, workdir)
            state.put(gate, plant, run, verdict)
    _git(clone, "checkout", "-q", base)


def _fill_costs(clone: Path, workdir: Path, state: State, base: str, commits: dict[str, str], run: int,
                busy: int) -> None:
    """Relative-cost cells saved without the plant's measured cost get it from this run's stored asv results (read
    again, not measured again)."""
    results = workdir / f"asv-results-{_tag(busy, run)}"
    config = None
    for plant, commit in commits.items():
        cell = state.cells.get(f"{gates.ASV_RELATIVE}|{plant}|{run}")
        if cell is None or "cost" in cell or not any(results.glob(f"*/{commit[:8]}-*.json")):
            continue
        config = config or _asv_config(clone, workdir, _tag(busy, run))
        verdict = gates.asv_verdicts(clone, config, base, commit, 0.0)
        if verdict[gates.ASV_RELATIVE].cost is not None:
            cell["cost"] = verdict[gates.ASV_RELATIVE].cost
            state.save()


def _cost(state: State, plant: str, runs: int) -> str:
    """The plant's measured cost: the median over runs of each run's median head / base relative cost."""
    costs = [state.cells.get(f"{gates.ASV_RELATIVE}|{plant}|{run}", {}).get("cost") for run in range(1, runs + 1)]
    costs = [c for c in costs if c]
    if not costs:
        return "not measured"
    parts = []
    for name in ("training", "acting"):
        values = sorted(c[name] for c in costs if name in c)
        if values:
            parts.append(f"{statistics.median(values):.2f}x" + (f" ({values[0]:.2f}-{values[-1]:.2f})"
                                                                 if len(values) > 1 else ""))
    return ", ".join(parts)


def _measure_aa_chain(clone: Path, workdir: Path, state: State, base: str, count: int, chosen: Sequence[str],
                      busy: int = 0) -> None:
    """One asv run over the base and ``count`` empty commits in a row; each commit against its parent at the
    Makefile's factors (what ``make asv-continuous`` does for one pair), read as a false alarm or not."""
    asv_gates = _asv_gates(chosen)
    missing = [k for k in range(1, count + 1) if any(not state.has(g, AA_CHAIN, k) for g in asv_gates)]
    if not missing:
        return
    commits = chain_commits(clone, base, count)
    parents = [base, *commits[:-1]]
    config = _asv_config(clone, workdir, _tag(busy, "aa-chain"))
    _log(f"A/A chain: asv over the base and {count} empty commits in a row, each against its parent")
    code, out, seconds = gates.asv_run(clone, config, [base, *commits])
    for k in missing:
        for gate, verdict in gates.asv_verdicts(clone, config, parents[k - 1], commits[k - 1], seconds).items():
            if gate in asv_gates:
                state.put(gate, AA_CHAIN, k, _asv_cell(verdict, code, out, seconds))


def _cell(state: State, gate: str, plant: str, runs: int) -> str:
    if gates.blind(gate, plant) is not None:
        return "blind (by design)"
    outcomes = [state.cells.get(f"{gate}|{plant}|{run}", {}).get("outcome") for run in range(1, runs + 1)]
    done = [o for o in outcomes if o is not None]
    if not done:
        return "missing"
    caught = sum(o == gates.CAUGHT for o in done)
    text = f"{caught}/{len(done)}"
    extras = [f"{sum(o == kind for o in done)} {kind}" for kind in (gates.NO_VERDICT, gates.FAILED)
              if any(o == kind for o in done)]
    if len(done) < runs:
        extras.append(f"{runs - len(done)} missing")
    return text + (f" ({', '.join(extras)})" if extras else "")


def _ci_cell(state: State, plant: str, runs: int, chosen: Sequence[str],
             among: Sequence[str] = gates.IN_CI) -> str:
    """Caught in a run by any of the gates ``among`` (by default every gate CI runs; a gate without verdict passes
    in CI). A run counts once one of them caught it, or once every one of them was measured in it."""
    in_ci = [g for g in among if g in chosen and gates.blind(g, plant) is None]
    caught, done = 0, 0
    for run in range(1, runs + 1):
        outcomes = [state.cells.get(f"{g}|{plant}|{run}", {}).get("outcome") for g in in_ci]
        if any(o == gates.CAUGHT for o in outcomes):
            caught, done = caught + 1, done + 1
        elif outcomes and all(o is not None for o in outcomes):
            done += 1
    return f"{caught}/{done}" if done else "missing"


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}"


def table(state: State) -> str:
    """The matrix as Markdown: each plant x each gate, caught k of n (the A/A row: false alarms k of n)."""
    data = state.data
    runs, chosen = data.get("runs", 1), data.get("gates", list(gates.GATES))
    plants = data.get("plants", list(PLANTS))
    merge = _asv_gates(chosen)
    head = ["plant", "cost: training, acting", *chosen,
            *(["merge gate (make asv-continuous)"] if merge else []), "CI (any gate it runs)"]
    lines = [f"Detection matrix: base commit {data['base'][:10]}, {machine_line()}; {runs} run(s) per cell"
             f"{', with ' + str(data.get('busy')) + ' busy loops beside' if data.get('busy') else ', no busy loops added'}; "
             f"started {data.get('started')}, {data.get('seconds', 0) / 60:.0f} min measured. A cell: runs that "
             "caught the plant / runs measured (the A/A row: false alarms). The cost: head / base of the asv relative "
             "costs, the median of the 8 training and of the 8 acting costs, median over runs (range).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for plant in plants:
        row = [f"{plant}: {PLANTS[plant].kind}" if plant in PLANTS else plant]
        row.append(_cost(state, plant, runs))
        row += [_cell(state, gate, plant, runs) for gate in chosen]
        if merge:
            row.append(_ci_cell(state, plant, runs, chosen, merge))
        row.append(_ci_cell(state, plant, runs, chosen))
        lines.append("| " + " | ".join(row) + " |")
    blind: dict[tuple[str, str], list[str]] = {}
    for gate in chosen:
        for plant in plants:
            if (why := gates.blind(gate, plant)) is not None:
                blind.setdefault((gate, why), []).append(plant)
    if blind:
        lines += ["", "Blind by design (not measured; another gate CI runs covers the row): " + "; ".join(
            f"{gate} on {', '.join(names)}: {why}" for (gate, why), names in blind.items()) + "."]
    chain = data.get("aa_chain", 0)
    if chain:
        counts = []
        for gate in merge:
            done = [state.cells[f"{gate}|{AA_CHAIN}|{k}"]["outcome"] for k in range(1, chain + 1)
                    if f"{gate}|{AA_CHAIN}|{k}" in state.cells]
            counts.append(f"{gate} {sum(o == gates.CAUGHT for o in done)}/{len(done)}"
                          + (f" ({chain - len(done)} missing)" if len(done) < chain else ""))
        lines += ["", f"A/A chain: {chain} empty commits in a row, each measured against its parent as "
                      f"`make asv-continuous` compares two commits (one asv run over them all); false alarms: "
                      f"{', '.join(counts)}."]
    missing = [key for key in (f"{g}|{p}|{r}" for g in chosen for p in plants for r in range(1, runs + 1))
               if key not in state.cells and gates.blind(*key.split("|")[:2]) is None]
    if missing:
        lines += ["", f"Missing: {len(missing)} cells ({', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''})."]
    return "\n".join(lines) + "\n"


def write_doc(doc: Path, text: str) -> None:
    """Replace the table between the markers in ``doc`` (refused where the markers are not there once)."""
    content = doc.read_text(encoding="utf-8")
    if content.count(DOC_START) != 1 or content.count(DOC_END) != 1:
        raise UserError(f"{doc}: needs the markers {DOC_START} and {DOC_END} once each, around the table")
    head, rest = content.split(DOC_START)
    _, tail = rest.split(DOC_END)
    doc.write_text(f"{head}{DOC_START}\n{text}{DOC_END}{tail}", encoding="utf-8")


def tables(workdir: Path, base: str) -> str:
    """The table of every load measured in ``workdir`` for ``base``: quiet first, then each ``--busy N``."""
    paths = sorted(workdir.glob("state*.json"), key=lambda p: (p.name != "state.json", p.name))
    states = [State(p, base) for p in paths]
    return "\n".join(table(s) for s in states if s.cells) or table(State(state_path(workdir, 0), base))


def default_workdir(repo: Path) -> Path:
    return Path(tempfile.gettempdir()) / f"rlgauge-detection-matrix-{repo.resolve().name}"


def remove_workdir(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
