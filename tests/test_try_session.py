"""``rlgauge try``'s session without processes: a fake arm runner for the verdicts, the combination and its patch,
early stopping, the A/A arm, Ctrl-C and the executor's job; the statistics of rounds and pairs (docs/try.md)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness.trials import session, source_edits
from harness.trials.processes.arms import Target
from harness.trials.plan import candidates

TESTS = Path(__file__).resolve().parent


def _line(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


class FakeRunner:
    """Arms without processes: each change's speed factor and final weight, a KeyboardInterrupt on a chosen call
    (a parity run or a slice)."""

    def __init__(self, target: Target, workdir: Path, speed: dict[str, float], weight: dict[str, float],
                 stop_at: int | None = None, float64: dict[str, int] | None = None) -> None:
        self.workdir, self.speed, self.weight, self.stop_at = workdir, speed, weight, stop_at
        self.float64 = float64 or {}
        self.calls = 0

    def tick(self) -> None:
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt

    def run(self, arm: Any, mode: str, iterations: int = 0) -> dict[str, Any]:
        self.tick()
        assert mode == "parity"
        params = self.workdir / f"{self.calls}.pt"
        final = torch.full((3,), self.weight.get(arm.name, 1.0))
        torch.save({"initial": {"w": torch.zeros(3)}, "final": {"w": final}}, params)
        return {"parity": {"nonfinite": int((~torch.isfinite(final)).sum())}, "params": str(params)}

    def serve(self, arm: Any, checks: bool = True, parity_iterations: int = 0) -> FakeServed:
        return FakeServed(self, arm, parity_iterations)


class FakeServed:
    def __init__(self, runner: FakeRunner, arm: Any, parity_iterations: int) -> None:
        self.runner, self.name = runner, arm.name
        self.maths = runner.run(arm, "parity", parity_iterations) if parity_iterations else {}

    def ready(self) -> dict[str, Any]:
        return {"ready": True, "float64_ops": self.runner.float64.get(self.name, 0),
                "host_syncs_per_step": 1.0, **self.maths}

    def slice(self, env_steps: int) -> dict[str, Any]:
        self.runner.tick()
        jitter = 1.0 + 0.001 * (self.runner.calls % 3)
        rate = 1000.0 * self.runner.speed.get(self.name, 1.0) * jitter
        return {"env_steps": env_steps, "wall": env_steps / rate, "cpu": env_steps / rate}

    def close(self) -> None:
        pass


def _session(monkeypatch: pytest.MonkeyPatch, speed: dict[str, float], weight: dict[str, float],
             stop_at: int | None = None, float64: dict[str, int] | None = None, rounds: int = 3) -> session.TryReport:
    made: list[FakeRunner] = []

    def runner(target: Target, workdir: Path, **_options: Any) -> FakeRunner:
        made.append(FakeRunner(target, workdir, speed, weight, stop_at, float64))
        return made[-1]

    monkeypatch.setattr(session, "ArmRunner", runner)
    found = {"device": "cpu", "recommendations": [], "host_syncs": [], "float64": []}
    chosen = candidates(found, ["no_change", "threads_1", "no_validate_args", "autocast_bf16"])
    target = Target("x.yaml", None, None, "baseline", [], [])
    return session.run_try(target, "x.yaml", "cpu", chosen, (None, "make_trainer"), rounds, 3, lambda _t: None,
                           cycles=2)


def test_the_combination_takes_the_faster_changes_that_keep_the_maths(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _session(monkeypatch, {"threads_1": 1.3, "no_validate_args": 1.2, "autocast_bf16": 1.5, "combined": 1.5},
                      {"autocast_bf16": 1.2})
    verdicts = {t.name: (t.verdict, t.parity.cls) for t in report.trials}
    assert verdicts["autocast_bf16"] == ("faster", "changes the maths")
    assert verdicts["threads_1"] == ("faster", "identical")
    assert verdicts["no_change"][0].startswith("no effect it could resolve")
    assert report.combined_changes == ["threads_1", "no_validate_args"]
    assert report.combined is not None and report.combined.verdict == "faster"
    assert report.combined.effect.pairs == 6 and report.combined.ratio.n == 3  # 3 rounds of 2 turns


def test_a_change_rid_of_the_float64_ops_joins_the_combination_unless_it_is_slower(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 ops make ``rlgauge run`` call a trainer unstable: a change that removes them with the maths kept goes
    into the patch when it is not found slower, even without a resolved speedup."""
    float64 = {"unchanged": 6, "no_change": 6, "threads_1": 6, "autocast_bf16": 6, "no_validate_args": 0}
    report = _session(monkeypatch, {}, {}, float64=float64)
    trial = next(t for t in report.trials if t.name == "no_validate_args")
    assert trial.verdict.startswith("no effect it could resolve") and trial.removes_float64
    assert report.combined_changes == ["no_validate_args"]
    slower = _session(monkeypatch, {"no_validate_args": 0.8}, {}, float64=float64)
    assert slower.combined_changes == []


def test_a_faster_change_that_makes_the_parameters_nan_stays_out_of_the_combination(
        monkeypatch: pytest.MonkeyPatch) -> None:
    report = _session(monkeypatch, {"threads_1": 1.3, "no_validate_args": 1.2, "combined": 1.2},
                      {"threads_1": float("nan")})
    trial = next(t for t in report.trials if t.name == "threads_1")
    assert trial.verdict == "faster" and trial.parity.cls == "changes the maths" and "NaN/Inf" in trial.parity.note
    assert report.combined_changes == ["no_validate_args"] and "set_num_threads" not in report.patch


def test_a_change_is_compared_with_an_unchanged_trainer_that_ends_in_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN against NaN at the same places stays comparable (the A/A arm: identical); finite values where the
    unchanged trainer has NaN change the maths; the table says the unchanged trainer ends in NaN."""
    from harness.trials import report as report_module

    nan = float("nan")
    report = _session(monkeypatch, {}, {"unchanged": nan, "no_change": nan, "no_validate_args": nan,
                                        "autocast_bf16": nan})
    classes = {t.name: t.parity.cls for t in report.trials}
    assert classes == {"no_change": "identical", "threads_1": "changes the maths", "no_validate_args": "identical",
                       "autocast_bf16": "identical"}
    assert "The unchanged trainer itself ends the maths check with 3 NaN/Inf values" in report_module.table(report)


def test_a_combination_that_keeps_the_float64_ops_says_rlgauge_run_will_call_it_unstable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.trials import report as report_module

    float64 = {"unchanged": 6, "no_change": 6, "threads_1": 6, "autocast_bf16": 6, "no_validate_args": 0}
    report = _session(monkeypatch, {"threads_1": 1.3, "no_validate_args": 0.8}, {}, float64=float64)
    assert report.combined_changes == ["threads_1"]
    assert report_module.still_unstable(report) == (
        "Still unstable: the unchanged trainer runs 6 float64 ops and no change in the combination removes them, so "
        "rlgauge run will call the patched trainer unstable; no_validate_args removes them, left out: slower, maths "
        "identical.")
    kept = _session(monkeypatch, {"threads_1": 1.3}, {}, float64=float64)
    assert "no_validate_args" in kept.combined_changes and report_module.still_unstable(kept) == ""


def test_a_combination_that_changes_the_maths_gives_no_patch_and_names_the_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each member kept the maths alone; together they do not: no patch, and the member whose addition broke it."""
    report = _session(monkeypatch, {"threads_1": 1.3, "no_validate_args": 1.2, "combined": 1.5},
                      {"combined": 1.2})
    assert report.combined_changes == ["threads_1", "no_validate_args"] and report.patch == ""
    assert report.combined.parity.cls == "changes the maths" and report.combined.effect is None  # never measured
    assert report.no_patch.startswith("the combination changes the maths (max rel diff 0.2): no_validate_args added "
                                      "to threads_1 does")


def test_a_combination_measured_slower_gives_no_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _session(monkeypatch, {"threads_1": 1.3, "no_validate_args": 1.2, "combined": 0.8}, {})
    assert report.combined.verdict == "slower" and report.patch == ""
    assert report.no_patch.startswith("the combination was slower: 0.8")
    kept = _session(monkeypatch, {"threads_1": 1.3, "no_validate_args": 1.2, "combined": 1.4}, {})
    assert kept.combined.verdict == "faster" and kept.no_patch is None


@pytest.mark.parametrize(("no_patch", "patch", "code"), [("the combination was slower: 0.800x [0.79-0.81]", "", 3),
                                                         (None, "--- a/x.py\n", 0), (None, "", 0)])
def test_patch_is_written_only_for_a_checked_combination(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str], no_patch: str | None,
                                                         patch: str, code: int) -> None:
    """``--patch`` where the combination failed its checks: nothing written, one line saying why, exit 3."""
    from argparse import Namespace

    from harness.cli import try_command

    report = session.TryReport("x.yaml", "baseline", "cpu", 2, 3, patch=patch, no_patch=no_patch)
    monkeypatch.setattr(session, "run_try", lambda *_a, **_k: report)
    out = tmp_path / "out.diff"
    args = Namespace(target=None, trainer="nowhere_module:make", config=None, quiet=True, executor_checked=None,
                     executor="local", repeats=None, rounds=2,
                     parity_iterations=3, json=True, patch=out, set=[], steps=None, device=None, seed=None)
    spec = SimpleNamespace(config=SimpleNamespace(trainer="nowhere_module:make", run=SimpleNamespace(
        fair_threads=False)), variant="baseline")
    monkeypatch.setattr(try_command, "user_overrides", lambda _args: [])
    found = {"device": "cpu", "recommendations": []}
    assert try_command.try_changes(args, spec, SimpleNamespace(device="cpu"), "x.yaml", found, None) == code
    err = capsys.readouterr().err.strip()
    if no_patch:
        assert not out.exists() and err == f"rlgauge: {out} not written: {no_patch}"
    else:
        assert out.exists() == bool(patch) and "Traceback" not in err


def test_the_measurement_stops_early_once_every_change_is_decisive(monkeypatch: pytest.MonkeyPatch) -> None:
    """After 3 rounds every change but the A/A arm (a check, exempt) is clearly faster: rounds 4 and 5 are skipped.
    One change without an effect keeps all 5; the decisive ones and the A/A arm (3 rounds give its interval) are
    measured no further."""
    clear = _session(monkeypatch, {"threads_1": 1.3, "no_validate_args": 1.2, "autocast_bf16": 0.7}, {}, rounds=5)
    assert clear.rounds_run == 3 and all(t.ratio.n == 3 for t in clear.trials)
    unclear = _session(monkeypatch, {"threads_1": 1.3, "autocast_bf16": 0.7}, {}, rounds=5)
    rounds_of = {t.name: t.ratio.n for t in unclear.trials}
    assert unclear.rounds_run == 5
    assert rounds_of == {"no_change": 3, "threads_1": 3, "no_validate_args": 5, "autocast_bf16": 3}
    assert {t.name: t.verdict for t in unclear.trials}["autocast_bf16"] == "slower"


def test_the_a_a_arm_is_in_every_try_and_never_in_the_combination(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.trials import report as report_module

    found = {"device": "cpu", "recommendations": [], "host_syncs": [], "float64": []}
    assert [c.change.name for c in candidates(found, ["threads_1"])] == ["no_change", "threads_1"]
    assert "no_change" in [c.change.name for c in candidates(found, None)]
    lucky = _session(monkeypatch, {"no_change": 1.2, "threads_1": 1.3}, {})  # an A/A arm read "faster" by chance
    assert next(t for t in lucky.trials if t.name == "no_change").verdict == "faster"
    assert "no_change" not in lucky.combined_changes
    table = report_module.table(lucky)
    assert "| no_change (A/A: noise floor) | runtime |" in table
    assert "Noise floor (the A/A arm, the unchanged trainer against itself): 1.2" in table
    assert "It reads faster: this machine's noise exceeded the intervals" in table


def test_the_round_is_the_unit_so_intervals_cover_a_planted_effect() -> None:
    """Simulated tries of a change planted 10 % slower: each fresh process adds its own offset (3 %) that every pair
    of its round shares, slices add 1 %. One value per round keeps the interval's coverage near 95 %; pairs taken
    as independent draws would claim a precision the rounds do not have."""
    import math

    import numpy as np

    from harness.stats.intervals import paired_t_ratio
    from harness.trials.rounds import Effect

    rng = np.random.default_rng(11)
    covered_rounds = covered_pairs = 0
    tries = 400
    for _ in range(tries):
        offsets = rng.normal(0.0, 0.03, size=5)
        logs = [math.log(0.9) + offsets[r] + rng.normal(0.0, 0.01) for r in range(5) for _ in range(4)]
        effect = Effect(unchanged=[1.0] * 20, changed=[math.exp(v) for v in logs], round_of=[r for r in range(5)
                                                                                             for _ in range(4)])
        by_round, by_pair = effect.ratio(), paired_t_ratio(effect.unchanged, effect.changed)
        assert by_round.n == 5 and by_pair.n == 20
        covered_rounds += by_round.low <= 0.9 <= by_round.high
        covered_pairs += by_pair.low <= 0.9 <= by_pair.high
    assert covered_rounds / tries >= 0.92 and covered_pairs / tries < 0.75


def test_a_source_edit_is_tried_in_a_process_that_never_imported_the_module(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    """``--executor ray``: the job's process has not imported the user's single-file trainer (beside its YAML file);
    the edit is checked by the file its name imports from the parent's import path, and made."""
    import sys

    module = tmp_path / "try_never_imported.py"
    shutil.copy(TESTS / "try_trainer.py", module)
    line = _line(module, "dist = torch.distributions.Categorical(")
    assert "try_never_imported" not in sys.modules and str(tmp_path) not in sys.path
    monkeypatch.setattr(sys, "path", list(sys.path))  # what the job arranges is undone after the test
    made: list[FakeRunner] = []
    monkeypatch.setattr(session, "ArmRunner", lambda target, workdir, **_options: made.append(FakeRunner(
        target, workdir, {"validate_args_off": 1.3}, {})) or made[-1])
    from harness.trials.catalogue import CHANGES
    from harness.trials.plan import Candidate

    chosen = [Candidate(CHANGES["validate_args_off"], [f"{module}:{line}"])]
    target = Target("x.yaml", None, None, "baseline", [], [str(tmp_path)], fair_threads=False)
    report = session.run_try_job(target, "x.yaml", "cpu", chosen, (module, "make_trainer"), 3, 3, 2)
    (trial,) = report.trials
    assert trial.skip is None and trial.edits == [("validate_args_off", f"{module}:{line}")]
    assert "validate_args=False" in trial.diff and report.combined_changes == ["validate_args_off"]


def test_a_file_inside_a_package_is_not_copied(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from harness.trials.patched_copy import importable_as_copy

    (tmp_path / "try_pkg").mkdir()
    (tmp_path / "try_pkg" / "__init__.py").write_text("")
    (tmp_path / "try_pkg" / "inner.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("try_pkg.inner")
    with pytest.raises(source_edits.EditRefused, match="inner.py is not imported as the top-level module inner"):
        importable_as_copy(tmp_path / "try_pkg" / "inner.py")


def test_an_interrupt_keeps_the_pairs_already_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 + 4 maths checks (the A/A arm's is the unchanged trainer's second), a timed call and a first unchanged slice,
    # then (changed, unchanged) slices for 4 arms a turn: stopping at call 17 leaves the first turn finished and the
    # second's first arm unfinished
    report = _session(monkeypatch, {"threads_1": 1.3}, {}, stop_at=17)
    assert report.interrupted and report.combined is None
    assert {t.name: t.effect.pairs for t in report.trials} == {name: 1 for name in
                                                              ("no_change", "threads_1", "no_validate_args",
                                                               "autocast_bf16")}
    assert all(t.parity is not None and t.parity.keeps_maths for t in report.trials)  # checked in the first round


def test_the_rounds_interval_keeps_its_level_with_three_rounds() -> None:
    """A/A rounds (log-normal noise): the t interval excludes 1 in about 5 % of tries; a bootstrap of 3 rounds'
    median (only their range) would in about 25 %."""
    import numpy as np

    from harness.stats.intervals import paired_ratio, paired_t_ratio

    rng = np.random.default_rng(7)
    tries = [np.exp(rng.normal(0.0, 0.1, size=(2, 3))) for _ in range(400)]
    misses_t = sum(not r.low <= 1.0 <= r.high for r in (paired_t_ratio(list(b), list(c)) for b, c in tries))
    misses_boot = sum(not r.low <= 1.0 <= r.high for r in (paired_ratio(list(b), list(c)) for b, c in tries))
    assert misses_t / len(tries) < 0.09 and misses_boot / len(tries) > 0.15


def test_the_verdict_rests_on_wall_time_and_the_cpu_time_ratio_is_reported_beside_it() -> None:
    """Unchanged / changed CPU seconds per 1k env steps is reported (``cpu_ratio``), but a loaded machine's verdict
    still rests on wall time: the CPU time of the same work drifts, and its tight interval over a few rounds would
    call an A/A change faster."""
    from harness.trials.rounds import Effect

    loaded = Effect(unchanged=[100.0, 60.0, 130.0], changed=[90.0, 150.0, 70.0],
                    unchanged_cpu=[2.0, 2.1, 1.9], changed_cpu=[1.0, 1.05, 0.95], round_of=[0, 1, 2])
    assert loaded.cpu_ratio().value == pytest.approx(2.0, rel=0.01)
    from harness.trials.catalogue import CHANGES
    from harness.trials.session import Trial

    trial = Trial(CHANGES["no_change"], effect=loaded)
    assert trial.ratio == loaded.ratio() and trial.ratio.low < 1.0 < trial.ratio.high
    assert trial.verdict.startswith("no effect it could resolve")


def test_a_pair_divides_the_changed_slice_by_the_unchanged_slices_around_it() -> None:
    """A machine slowing down linearly over three slices: the raw rates fall, the pair's ratio holds."""
    from harness.trials.rounds import Effect

    effect = Effect()
    for index, slowdown in enumerate((1.0, 1.5, 2.0, 2.5)):  # each pair's slices: slowdown, + 0.25, + 0.5
        before = {"env_steps": 1000, "wall": 1.0 * slowdown, "cpu": 1.0}
        changed = {"env_steps": 1000, "wall": 0.8 * (slowdown + 0.25), "cpu": 0.8}  # a 1.25x faster change
        after = {"env_steps": 1000, "wall": 1.0 * (slowdown + 0.5), "cpu": 1.0}
        effect.add_pair(before, changed, after, round_index=index)  # a pair a round
    ratio = effect.ratio()
    assert ratio.n == 4 and ratio.value == pytest.approx(1.25, rel=0.03) and ratio.high - ratio.low < 0.1
    assert effect.disturbed == 1 and effect.trustworthy  # only 1.0 -> 1.5 moved by more than 25 %
    for _ in range(2):  # the machine halves its speed within two more pairs: 3 of 6 disturbed
        effect.add_pair({"env_steps": 1000, "wall": 1.0, "cpu": 1.0}, {"env_steps": 1000, "wall": 1.2, "cpu": 0.8},
                        {"env_steps": 1000, "wall": 2.0, "cpu": 1.0})
    assert effect.disturbed == 3 and not effect.trustworthy
    assert "within 3 of 6 pairs" in effect.reasons[0]


def test_slices_alternate_the_arms_between_slices_of_the_unchanged_trainer() -> None:
    from harness.trials import slices
    from harness.trials.processes.arms import Arm
    from harness.trials.rounds import Effect

    order: list[str] = []

    class Served:
        def __init__(self, name: str) -> None:
            self.name = name

        def ready(self) -> dict[str, Any]:
            return {"float64_ops": 0, "host_syncs_per_step": 0.0}

        def slice(self, steps: int) -> dict[str, Any]:
            order.append(self.name)
            assert steps in (1, 100)  # one call to time, then SLICE_SECONDS of the unchanged trainer's rate
            done = max(steps, 50)  # a call of 50 env steps
            return {"env_steps": done, "wall": done / 400, "cpu": done / 400}

        def close(self) -> None:
            order.append(f"close {self.name}")

    class Runner:
        def serve(self, arm: Arm, checks: bool = True) -> Served:
            return Served(arm.name)

    effects: dict[str, Effect] = {}
    slices.measure(Runner(), [Arm("a"), Arm("b")], 1, effects, lambda _t: None, cycles=2)  # type: ignore[arg-type]
    assert order[:10] == ["unchanged",  # the timed call that sets the slice's size
                          "unchanged", "a", "unchanged", "b", "unchanged", "b", "unchanged", "a", "unchanged"]
    assert sorted(order[10:]) == ["close a", "close b", "close unchanged"]
    assert effects["a"].pairs == effects["b"].pairs == 2


def test_arms_warm_up_no_more_than_the_usable_cores_at_once_and_are_checked_in_the_first_round_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nine warm-ups side by side on two cores (``ArmRunner.width``: the cores over each arm's threads) thrash each other's threads; the checks (float64 ops, host syncs)
    are the same in every process, so later rounds skip them; the arm slowest to be ready (a compile) starts first
    in the next round."""
    from harness.trials import slices
    from harness.trials.processes.arms import Arm
    from harness.trials.rounds import Effect

    warming: list[str] = []
    most = [0]
    checked: list[tuple[str, bool]] = []

    class Served:
        def __init__(self, name: str) -> None:
            self.name = name

        def ready(self) -> dict[str, Any]:
            warming.remove(self.name)
            return {"float64_ops": 0, "host_syncs_per_step": 0.0, "ready_s": 9.0 if self.name == "d" else 2.0}

        def slice(self, steps: int) -> dict[str, Any]:
            assert not warming  # no slice is timed beside a warm-up
            return {"env_steps": max(steps, 50), "wall": max(steps, 50) / 400, "cpu": 0.1}

        def close(self) -> None:
            pass

    class Runner:
        def width(self) -> int:  # two cores, a thread an arm
            return 2

        def serve(self, arm: Arm, checks: bool = True) -> Served:
            warming.append(arm.name)
            most[0] = max(most[0], len(warming))
            checked.append((arm.name, checks))
            return Served(arm.name)

    effects: dict[str, Effect] = {}
    arms = [Arm(name) for name in "abcde"]
    slices.measure(Runner(), arms, 2, effects, lambda _t: None, cycles=1)  # type: ignore[arg-type]
    assert most[0] == 2 and len(checked) == 12
    assert all(flag for _name, flag in checked[:6]) and not any(flag for _name, flag in checked[6:])
    assert [name for name, _flag in checked[:6]] == ["unchanged", "a", "b", "c", "d", "e"]
    assert checked[6][0] == "d"  # the slowest to be ready last round starts first


def test_arms_start_one_at_a_time_where_each_would_take_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.measurement import machine_state
    from harness.trials.processes.arms import starting_width

    monkeypatch.setattr(machine_state, "usable_cores", lambda: 8)
    assert [starting_width(cap) for cap in (None, 8, 4, 3, 1)] == [1, 1, 2, 2, 8]


def test_the_progress_and_the_report_give_the_slice_as_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slice is whole calls of the trainer (a call longer than the slice aimed at makes it longer than asked): the
    lines say what ran, not what was aimed at."""
    from harness.trials import report as report_module
    from harness.trials.slices import as_ran

    report = _session(monkeypatch, {"threads_1": 1.3}, {})
    assert report.slices_ran and as_ran(report.slices_ran).startswith("a slice ran ")
    assert as_ran([{"env_steps": 1000, "wall": 1.1}, {"env_steps": 1000, "wall": 1.2},
                   {"env_steps": 1000, "wall": 1.1}]) == "a slice ran 1,000 env steps in 1.1 s (median of 3)"
    assert f"from slices ({as_ran(report.slices_ran)})" in report_module.table(report)
    ran = report_module.as_json(report)["try"]
    assert ran["slice_env_steps_ran"] > 0 and ran["slice_seconds_ran"] > 0


def test_arms_are_forked_from_the_zygote_on_the_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has touched a GPU's driver cannot be forked safely: CUDA and MPS arms are plain processes."""
    options: list[dict[str, Any]] = []

    def runner(target: Target, workdir: Path, **given: Any) -> FakeRunner:
        options.append(given)
        return FakeRunner(target, workdir, {}, {})

    monkeypatch.setattr(session, "ArmRunner", runner)
    found = {"device": "cpu", "recommendations": [], "host_syncs": [], "float64": []}
    target = Target("x.yaml", None, None, "baseline", [], [])
    for device in ("cpu", "cuda:0", "mps"):
        session.run_try(target, "x.yaml", device, candidates(found, ["no_change"]), (None, "make_trainer"), 3, 3,
                        lambda _t: None, cycles=1)
    assert [o["forked"] for o in options] == [True, False, False]
