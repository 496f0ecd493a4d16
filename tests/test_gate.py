"""Gate verdicts (``harness.analyses.gate``) and its thresholds file: each check fails exactly when it should."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.cli import app as cli
from harness.analyses.gate import (GATES_FILE, Thresholds, check_quality, failed, gate_files, gate_variants, learning_checks,
                          load_thresholds, remeasure_reason, setup_differences, stability_checks, trained_env_steps,
                          underpowered)
from harness.errors import UserError
from results_factory import make_result, write_results

TIGHT = [1000.0, 1002.0, 998.0, 1001.0, 999.0]


def _scaled(factor: float, samples: list[float] = TIGHT) -> list[float]:
    return [s * factor for s in samples]


def _by_check(checks: list, name: str) -> list:
    return [c for c in checks if c.check.startswith(name)]


# --------------------------------------------------------------------------- thresholds file

def test_shipped_thresholds_load_and_hold_the_documented_defaults() -> None:
    th = load_thresholds()
    assert th.max_slowdown_pct == 10 and th.min_speedup == 1.0 and th.confidence == 0.95
    assert th.remeasure_margin_pct == 10
    assert th.throughput_metrics == ("env_steps_per_sec",)
    assert th.allow_compile_fallback is False
    assert "ppo-cartpole" in th.learning
    assert GATES_FILE.name == "gates.yaml"


def test_command_line_values_override_the_file() -> None:
    th = load_thresholds().with_overrides(max_slowdown_pct=5, min_speedup=2.5, confidence=0.9,
                                          allow_compile_fallback=True)
    assert (th.max_slowdown_pct, th.min_speedup, th.confidence, th.allow_compile_fallback) == (5, 2.5, 0.9, True)


@pytest.mark.parametrize("override, needle", [
    ({"max_slowdown_pct": 150}, "--max-slowdown"), ({"max_slowdown_pct": -1}, "--max-slowdown"),
    ({"max_slowdown_pct": float("nan")}, "finite"), ({"min_speedup": 0}, "--min-speedup"),
    ({"confidence": 1.0}, "--confidence"),
])
def test_out_of_range_overrides_are_user_errors(override: dict, needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        load_thresholds().with_overrides(**override)


@pytest.mark.parametrize("text, needle", [
    ("max_slowdown_pct: 10\nspeed: 3\n", "unknown key 'speed'"),
    ("max_slowdown_pct: ten\n", "finite number"),
    ("throughput_metrics: [frames]\n", "throughput_metrics"),
    ("compile_fallback: sometimes\n", "compile_fallback"),
    ("learning: {ppo-cartpole: {min_return: 10}}\n", "learning.ppo-cartpole"),
    ("learning: {ppo-cartpole: {min_return: 10, min_env_steps: -5}}\n", "min_env_steps"),
    ("[1, 2]\n", "expected a mapping"),
    ("remeasure_margin_pct: 100\n", "remeasure_margin_pct: 100 is not a margin"),
    ("remeasure_margin_pct: -5\n", "remeasure_margin_pct"),
    ("remeasure_margin_pct: lots\n", "finite number"),
    ("max_slowdown_pct: [\n", "malformed YAML"),
])
def test_a_bad_thresholds_file_is_a_one_line_user_error(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "gates.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=needle) as err:
        load_thresholds(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_missing_thresholds_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        load_thresholds(tmp_path / "nope.yaml")


def test_thresholds_file_may_set_only_some_keys(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"max_slowdown_pct": 3}), encoding="utf-8")
    th = load_thresholds(path)
    assert th.max_slowdown_pct == 3 and th.min_speedup == Thresholds().min_speedup and th.learning == {}


# --------------------------------------------------------------------------- throughput (two files)

def test_a_confirmed_slowdown_beyond_the_threshold_fails() -> None:
    checks, _ = gate_files([make_result(samples=TIGHT)], [make_result(samples=_scaled(0.8))], Thresholds())
    (throughput,) = _by_check(checks, "env_steps_per_sec")
    assert throughput.passed is False and "confirmed" in throughput.note
    assert throughput.note.endswith(" %") and "resolves +/-" in throughput.note
    assert failed(checks) == [throughput]


def test_a_slowdown_within_the_threshold_passes() -> None:
    checks, _ = gate_files([make_result(samples=TIGHT)], [make_result(samples=_scaled(0.95))], Thresholds())
    assert failed(checks) == []


def test_a_slowdown_the_noise_cannot_confirm_passes_with_a_note() -> None:
    noisy = [700.0, 1300.0, 850.0, 1000.0, 600.0]  # median 850: below 0.9, but the interval reaches above it
    checks, _ = gate_files([make_result(samples=TIGHT)], [make_result(samples=noisy)], Thresholds())
    (throughput,) = _by_check(checks, "env_steps_per_sec")
    assert throughput.passed is True and "not confirmed" in throughput.note


def test_max_slowdown_threshold_moves_the_bar() -> None:
    base, cand = [make_result(samples=TIGHT)], [make_result(samples=_scaled(0.8))]
    assert failed(gate_files(base, cand, Thresholds(max_slowdown_pct=25))[0]) == []
    assert failed(gate_files(base, cand, Thresholds(max_slowdown_pct=15))[0]) != []


def test_a_faster_candidate_passes() -> None:
    checks, _ = gate_files([make_result(samples=TIGHT)], [make_result(samples=_scaled(3.0))], Thresholds())
    assert failed(checks) == []


def test_a_candidate_without_measurements_fails_naming_its_status() -> None:
    checks, _ = gate_files([make_result(samples=TIGHT)], [make_result(samples=[], status="failed", error="boom")],
                           Thresholds())
    names = {c.check for c in failed(checks)}
    assert "env_steps_per_sec candidate/baseline" in names and "status" in names
    assert any("status failed" in c.note for c in failed(checks))


def test_every_gated_metric_is_checked() -> None:
    th = Thresholds(throughput_metrics=("env_steps_per_sec", "updates_per_sec"))
    checks, _ = gate_files([make_result(samples=TIGHT)], [make_result(samples=TIGHT)], th)
    assert {c.check for c in checks if "candidate/baseline" in c.check} == {
        "env_steps_per_sec candidate/baseline", "updates_per_sec candidate/baseline"}


# --------------------------------------------------------------------------- speedup (one process)

def test_speedup_below_the_minimum_fails_when_every_round_says_so() -> None:
    runs = [make_result("baseline", TIGHT), make_result("optimized", _scaled(1.8))]
    assert failed(gate_variants(runs, Thresholds(min_speedup=2.0))[0])[0].check == "speedup optimized/baseline"
    assert failed(gate_variants(runs, Thresholds(min_speedup=1.5))[0]) == []


def test_speedup_is_judged_by_the_median_round_so_disturbed_rounds_do_not_decide() -> None:
    base = TIGHT + [1000.0, 1000.0]
    fast_but_two = [2.5 * b for b in base[:-2]] + [1.0 * b for b in base[-2:]]  # two rounds hit by load
    runs = [make_result("baseline", base), make_result("optimized", fast_but_two)]
    (speedup,) = _by_check(gate_variants(runs, Thresholds(min_speedup=2.0))[0], "speedup")
    assert speedup.passed is True and speedup.note.startswith("the interval reaches below the minimum; resolves +/-")
    slow_but_two = [1.8 * b for b in base[:-2]] + [3.0 * b for b in base[-2:]]
    runs = [make_result("baseline", base), make_result("optimized", slow_but_two)]
    (speedup,) = _by_check(gate_variants(runs, Thresholds(min_speedup=2.0))[0], "speedup")
    assert speedup.passed is False and speedup.note.startswith("the interval reaches above the minimum; resolves +/-")


def test_speedup_uses_paired_rounds_so_shared_drift_does_not_blur_it() -> None:
    drift = [1000.0, 400.0, 1000.0, 300.0, 1000.0]
    runs = [make_result("baseline", drift), make_result("optimized", _scaled(1.8, drift))]
    (speedup,) = _by_check(gate_variants(runs, Thresholds(min_speedup=2.0))[0], "speedup")
    assert speedup.passed is False and speedup.measured.startswith("1.800x [1.800-1.800]")


# --------------------------------------------------------------------------- stability and learning

@pytest.mark.parametrize("kwargs, check", [
    ({"float64_ops": 3, "status": "unstable"}, "float64_ops"),
    ({"nonfinite_events": 1, "status": "unstable"}, "nonfinite_events"),
    ({"compile_fallback": True}, "compile_fallback"),
    ({"status": "interrupted"}, "status"),
])
def test_each_stability_problem_fails_its_own_check(kwargs: dict, check: str) -> None:
    checks = stability_checks(make_result(**kwargs), Thresholds())
    assert check in {c.check for c in failed(checks)}


def test_a_compile_fallback_can_be_allowed() -> None:
    checks = stability_checks(make_result(compile_fallback=True), Thresholds(allow_compile_fallback=True))
    assert failed(checks) == []


def test_a_clean_run_passes_every_stability_check() -> None:
    checks = stability_checks(make_result(), Thresholds())
    assert [c.passed for c in checks] == [True] * 4


def test_learning_is_judged_only_after_enough_training() -> None:
    th = load_thresholds()
    bar = th.learning["ppo-cartpole"]
    short = make_result(mean_return=bar.min_return - 1, warmup_steps=0, steps_completed=bar.min_env_steps - 1)
    (check,) = learning_checks(short, th)
    assert check.passed is None and check.verdict == "skip"
    long_low = make_result(mean_return=bar.min_return - 1, warmup_steps=1024, steps_completed=bar.min_env_steps)
    assert learning_checks(long_low, th)[0].passed is False
    long_ok = make_result(mean_return=bar.min_return, warmup_steps=1024, steps_completed=bar.min_env_steps)
    assert learning_checks(long_ok, th)[0].passed is True
    none = make_result(mean_return=None, warmup_steps=1024, steps_completed=bar.min_env_steps)
    assert learning_checks(none, th)[0].note == "no episode finished"
    assert trained_env_steps(long_ok) == 1024 + bar.min_env_steps


def test_presets_without_a_learning_bar_have_no_learning_check() -> None:
    assert learning_checks(make_result(preset="ppo-pendulum"), load_thresholds()) == []


# --------------------------------------------------------------------------- power: no verdict from two repeats

def test_a_throughput_check_with_two_repeats_is_neither_pass_nor_fail() -> None:
    checks, _ = gate_files([make_result(samples=[1000.0, 1001.0])], [make_result(samples=[500.0, 501.0])], Thresholds())
    (throughput,) = _by_check(checks, "env_steps_per_sec")
    assert (throughput.passed, throughput.verdict, throughput.underpowered) == (None, "no verdict", 2)
    assert throughput.note == "no verdict: 2 repeats (needs 3)" and failed(checks) == []
    assert underpowered(checks) == ("gate: no verdict: 2 repeats (needs 3) in ppo-cartpole/optimized; "
                                    "measure with --repeats 3 or more")


def test_a_speedup_check_with_two_rounds_gives_no_verdict() -> None:
    runs = [make_result("baseline", [1000.0, 1000.0]), make_result("optimized", [100.0, 100.0])]
    checks, _ = gate_variants(runs, Thresholds(min_speedup=2.0))
    (speedup,) = _by_check(checks, "speedup")
    assert speedup.verdict == "no verdict" and failed(checks) == [] and underpowered(checks) is not None


def test_three_repeats_carry_a_verdict() -> None:
    checks, _ = gate_files([make_result(samples=TIGHT[:3])], [make_result(samples=_scaled(0.5, TIGHT[:3]))],
                           Thresholds())
    assert underpowered(checks) is None and failed(checks)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_gate_files_with_two_repeats_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_results(tmp_path / "a.json", make_result(samples=[1000.0, 1001.0]))
    cand = write_results(tmp_path / "b.json", make_result(samples=[500.0, 501.0]))
    code, out, err = run_cli(capsys, "gate", "--baseline", base, "--candidate", cand)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "gate: no verdict: 2 repeats (needs 3)" in err and "measure with --repeats 3 or more" in err


def test_gate_run_with_two_repeats_exits_2_before_measuring(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("measured without the repeats for a verdict")

    monkeypatch.setattr(cli, "_measure", never)
    code, out, err = run_cli(capsys, "gate", "--run", "ppo-cartpole", "--device", "cpu", "--repeats", "2")
    assert code == 2 and out == "" and err.strip() == (
        "rlgauge: error: gate: no verdict: 2 repeats (needs 3); measure with --repeats 3 or more")


# --------------------------------------------------------------------------- quality: untrustworthy runs are refused

SHARE = "other processes took 62 % of the 2 usable cores during the timed segments"


def test_check_quality_refuses_an_untrustworthy_run_naming_it_and_its_first_reason() -> None:
    runs = [("ppo-cartpole/baseline", make_result("baseline")),
            ("ppo-cartpole/optimized", make_result(untrustworthy=[SHARE, "repeats disagree"]))]
    with pytest.raises(UserError) as caught:
        check_quality(runs, allow=False)
    assert str(caught.value) == (f"gate: ppo-cartpole/optimized is not trustworthy: {SHARE} "
                                 "(--allow-untrustworthy to gate anyway)")
    (warning,) = check_quality(runs, allow=True)
    assert warning.startswith("rlgauge: warning: ppo-cartpole/optimized is not trustworthy: ")
    assert "repeats disagree" in warning


def test_runs_without_a_quality_verdict_are_gated_with_a_note() -> None:
    (note,) = check_quality([("old/baseline", make_result(old=True)), ("new/optimized", make_result())], allow=False)
    assert note.startswith("rlgauge: note: quality not recorded for old/baseline")


def test_gate_files_refuses_an_untrustworthy_candidate_unless_allowed(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    base = write_results(tmp_path / "a.json", make_result(samples=TIGHT))
    cand = write_results(tmp_path / "b.json", make_result(samples=TIGHT, untrustworthy=[SHARE]))
    code, out, err = run_cli(capsys, "gate", "--baseline", base, "--candidate", cand)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert f"ppo-cartpole/optimized ({cand}) is not trustworthy: {SHARE} (--allow-untrustworthy to gate anyway)" in err
    code, out, err = run_cli(capsys, "gate", "--baseline", base, "--candidate", cand, "--allow-untrustworthy")
    assert code == 0 and "gate passed" in err
    assert f"rlgauge: warning: ppo-cartpole/optimized ({cand}) is not trustworthy: {SHARE}" in err


def test_gate_files_of_old_results_pass_with_a_quality_note(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    base = write_results(tmp_path / "a.json", make_result(samples=TIGHT, old=True))
    cand = write_results(tmp_path / "b.json", make_result(samples=TIGHT, old=True))
    code, _, err = run_cli(capsys, "gate", "--baseline", base, "--candidate", cand)
    assert code == 0 and "quality not recorded for" in err and "gate passed" in err


# --------------------------------------------------------------------------- gate --run: measured once more near the minimum

def _variants(speedup: float, **kwargs: object) -> list:
    return [make_result("baseline", TIGHT, **kwargs), make_result("optimized", _scaled(speedup), **kwargs)]


def test_remeasure_reason_only_for_a_speedup_just_short_of_its_minimum() -> None:
    th = Thresholds(min_speedup=2.0)

    def reason(runs: list, thresholds: Thresholds = th) -> str | None:
        return remeasure_reason(runs, gate_variants(runs, thresholds)[0], thresholds)

    assert "within 10 % of the minimum" in reason(_variants(1.9))
    assert reason(_variants(1.5)) is None  # clearly short
    assert reason(_variants(2.1)) is None  # passed
    assert reason(_variants(1.9), Thresholds(min_speedup=2.0, remeasure_margin_pct=0)) is None
    assert reason(_variants(1.9, nonfinite_events=1, status="unstable")) is None  # fails on stability anyway
    wide = [make_result("baseline", [1000.0] * 5), make_result("optimized", [1500.0, 1600.0, 1700.0, 2100.0, 2200.0])]
    assert "its interval reaches the minimum" in reason(wide)  # 1.7x: 15 % short, but the interval reaches 2x


def _fake_measure(monkeypatch: pytest.MonkeyPatch, *measurements: list) -> list:
    calls: list = []

    def measure(specs: list, args: object, checkpointing: object = None) -> tuple[list, bool]:
        calls.append([spec.variant for spec in specs])
        return measurements[len(calls) - 1], False

    monkeypatch.setattr(cli, "_measure", measure)
    return calls


GATE_RUN = ("gate", "--run", "ppo-cartpole", "--device", "cpu", "--repeats", "5", "--min-speedup", "2", "--quiet")


def test_gate_run_measures_once_more_near_the_minimum_and_decides_on_the_second(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls = _fake_measure(monkeypatch, _variants(1.9), _variants(2.05))
    code, out, err = run_cli(capsys, *GATE_RUN)
    assert code == 0 and calls == [["baseline", "optimized"]] * 2, out + err
    (line,) = [line for line in err.splitlines() if "once more" in line]
    assert line.startswith("rlgauge: gate: measuring once more, the second measurement decides: ppo-cartpole speedup "
                           "1.900x") and "within 10 % of the minimum" in line
    assert "2.050x" in out and "1.900x" not in out


def test_gate_run_fails_when_the_second_measurement_is_short_too(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    calls = _fake_measure(monkeypatch, _variants(1.9), _variants(1.95))
    code, _, err = run_cli(capsys, *GATE_RUN)
    assert code == 1 and len(calls) == 2 and err.count("once more") == 1


def test_gate_run_does_not_measure_again_a_speedup_clearly_short(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    calls = _fake_measure(monkeypatch, _variants(1.2))
    code, _, err = run_cli(capsys, *GATE_RUN)
    assert code == 1 and len(calls) == 1 and "once more" not in err


def test_gate_run_refuses_untrustworthy_measurements_unless_allowed(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _fake_measure(monkeypatch, _variants(2.5, untrustworthy=[SHARE]))
    code, out, err = run_cli(capsys, *GATE_RUN)
    assert code == 2 and err.strip() == (f"rlgauge: error: gate: ppo-cartpole/baseline is not trustworthy: {SHARE} "
                                         "(--allow-untrustworthy to gate anyway)")
    _fake_measure(monkeypatch, _variants(2.5, untrustworthy=[SHARE]))
    code, _, err = run_cli(capsys, *GATE_RUN, "--allow-untrustworthy")
    assert code == 0 and "gate passed" in err


# --------------------------------------------------------------------------- runs of a different setup are not compared

def _setup(run: object, **dotted: object) -> object:
    """``run`` with config keys set (``env__id="Acrobot-v1"`` sets ``env.id``)."""
    for key, value in dotted.items():
        node = run.config  # type: ignore[attr-defined]
        *parents, last = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return run


def test_setup_differences_name_algorithm_env_and_batch_keys_never_flags() -> None:
    base = _setup(make_result(), ppo__num_steps=64, ppo__num_minibatches=4, ppo__learning_rate=2.5e-4,
                  optimizations__batch_inference=False, env__vectorization="serial")
    same_shape = _setup(make_result(), ppo__num_steps=64, ppo__num_minibatches=4, ppo__learning_rate=1e-3,
                        optimizations__batch_inference=True, env__vectorization="native")
    assert setup_differences(base.algo, base.config, same_shape.algo, same_shape.config) == []
    other = _setup(make_result(), env__id="Acrobot-v1", env__num_envs=8, ppo__num_steps=128, ppo__num_minibatches=4)
    assert setup_differences(base.algo, base.config, other.algo, other.config) == [
        ("env.id", "CartPole-v1", "Acrobot-v1"), ("env.num_envs", 16, 8), ("ppo.num_steps", 64, 128)]
    dqn = _setup(make_result(), dqn__batch_size=128)
    dqn.algo = "dqn"
    assert setup_differences(base.algo, base.config, dqn.algo, dqn.config) == [("algo", "ppo", "dqn")]
    old = make_result()  # no ppo section recorded: a key missing on one side is not compared
    assert setup_differences(base.algo, base.config, old.algo, old.config) == []


def test_gate_files_refuses_a_different_env_or_batch_naming_keys_and_values(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    base = write_results(tmp_path / "a.json", make_result(samples=TIGHT))
    cand = write_results(tmp_path / "b.json", _setup(make_result(samples=TIGHT), env__id="Acrobot-v1",
                                                     env__num_envs=8))
    before = cand.read_bytes()
    code, out, err = run_cli(capsys, "gate", "--baseline", base, "--candidate", cand)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.strip() == (
        f"rlgauge: error: gate: ppo-cartpole/optimized: --baseline {base} and --candidate {cand} differ in setup: "
        "env.id CartPole-v1 vs Acrobot-v1, env.num_envs 16 vs 8 (accepted: runs of the same algorithm, env and "
        "batch shape; --allow-config-mismatch to gate anyway)")
    assert cand.read_bytes() == before


def test_gate_files_with_allow_config_mismatch_gates_and_shows_the_mismatch(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    base = write_results(tmp_path / "a.json", make_result(samples=TIGHT))
    cand = write_results(tmp_path / "b.json", _setup(make_result(samples=TIGHT), env__num_envs=8))
    code, out, err = run_cli(capsys, "gate", "--baseline", base, "--candidate", cand, "--allow-config-mismatch")
    assert code == 0 and "gate passed" in err, out + err
    assert ("rlgauge: warning: ppo-cartpole/optimized: setup differs: env.num_envs 16 vs 8; gated anyway "
            "(--allow-config-mismatch)") in err
    row = next(line for line in out.splitlines() if "setup (algo" in line)
    assert "waived" in row and "FAIL" not in out


def test_gate_files_passes_runs_that_differ_in_optimisation_flags_only(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    base = write_results(tmp_path / "a.json", _setup(make_result(samples=TIGHT), optimizations__amp=False))
    cand = write_results(tmp_path / "b.json", _setup(make_result(samples=TIGHT), optimizations__amp=True,
                                                     env__vectorization="native"))
    code, out, err = run_cli(capsys, "gate", "--baseline", base, "--candidate", cand)
    assert code == 0 and "gate passed" in err and "waived" not in out, out + err


def test_gate_run_compares_only_setup_keys_of_its_two_variants(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The variants of one preset differ in optimisation flags by design: never a mismatch."""
    runs = _variants(2.5)
    _setup(runs[0], optimizations__batch_inference=False, env__vectorization="serial")
    _setup(runs[1], optimizations__batch_inference=True, env__vectorization="native")
    _fake_measure(monkeypatch, runs)
    code, out, err = run_cli(capsys, *GATE_RUN)
    assert code == 0 and "setup" not in err and "waived" not in out, out + err


def test_gate_run_refuses_a_preset_file_whose_variants_differ_in_setup_before_measuring(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    preset = tmp_path / "mine.yaml"
    preset.write_text("config: {algo: ppo, env: {id: CartPole-v1, num_envs: 4}}\n"
                      "variants: {baseline: {}, optimized: {env: {num_envs: 8}}}\n", encoding="utf-8")
    calls = _fake_measure(monkeypatch, _variants(2.5))
    code, out, err = run_cli(capsys, "gate", "--run", preset, "--device", "cpu", "--repeats", "5", "--quiet")
    assert code == 2 and calls == [] and len(err.splitlines()) == 1, err
    assert "gate: mine: baseline and optimized differ in setup: env.num_envs 4 vs 8" in err
    code, out, err = run_cli(capsys, "gate", "--run", preset, "--device", "cpu", "--repeats", "5", "--quiet",
                             "--allow-config-mismatch")
    assert calls == [["baseline", "optimized"]]


# --------------------------------------------------------------------------- the typed gate API

def test_harness_gate_types_each_outcome_without_reading_what_was_printed(tmp_path: Path) -> None:
    from harness import GateVerdict, Outcome, gate

    slow, fast = tmp_path / "slow.json", tmp_path / "fast.json"
    write_results(slow, make_result("optimized", [1000.0, 1010.0, 990.0, 1005.0, 995.0]))
    write_results(fast, make_result("optimized", [2000.0, 2010.0, 1990.0, 2005.0, 1995.0]))
    passed = gate(baseline=slow, candidate=fast)
    failed = gate(baseline=fast, candidate=slow, max_slowdown_pct=10)
    assert isinstance(passed, GateVerdict) and passed.outcome is Outcome.PASS and passed.exit_code == 0
    assert failed.outcome is Outcome.FAIL and failed.exit_code == 1 and "gate failed" in failed.output
    bad = gate(baseline=tmp_path / "missing.json", candidate=fast)
    assert bad.outcome is Outcome.BAD_INPUT and bad.exit_code == 2 and "missing.json" in bad.reason
    assert gate(baseline=slow).outcome is Outcome.BAD_INPUT  # --candidate missing: the parser's check
    few = tmp_path / "few.json"
    write_results(few, make_result("optimized", [2000.0, 2010.0]))
    short = gate(baseline=slow, candidate=few)
    assert short.outcome is Outcome.NO_VERDICT and short.exit_code == 2 and "no verdict" in short.reason


def test_no_verdict_is_a_user_error_to_the_cli_and_its_own_type_to_callers() -> None:
    from harness.analyses.gate_outcome import Outcome, verdict_of
    from harness.errors import NoVerdict, UserError

    def refuse() -> int:
        raise NoVerdict("gate: a run is not trustworthy")

    def bad() -> int:
        raise UserError("gate: --baseline and --candidate go together")

    assert issubclass(NoVerdict, UserError)  # the CLI's exit code 2 and one line
    assert verdict_of(refuse).outcome is Outcome.NO_VERDICT
    assert verdict_of(bad).outcome is Outcome.BAD_INPUT
    assert verdict_of(lambda: 2).outcome is Outcome.NO_VERDICT  # gate --base: measured, could not decide
    assert verdict_of(lambda: 130).outcome is Outcome.INTERRUPTED
