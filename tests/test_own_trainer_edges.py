"""The rough edges of measuring a user's script: generators, threads, running out, stdout,
unstable runs named at their line, and ``measure`` without re-indenting."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.cli import main

SCRIPT = textwrap.dedent('''
    import numpy as np
    import torch

    SEEN_THREADS = []

    def train(config, *, device, seed):
        """A single-file script's main block turned into a generator: no line re-indented."""
        net = torch.nn.Linear(4, 2)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        for update in range(config.get("iterations", 10**6)):
            if update == 0 and config.get("threads"):
                torch.set_num_threads(config["threads"])
            SEEN_THREADS.append(torch.get_num_threads())
            reward = np.ones(8)  # float64, as gymnasium's rewards
            if config.get("float64"):
                r = torch.tensor(reward)
            else:
                r = torch.tensor(reward, dtype=torch.float32)
            loss = (net(torch.randn(8, 4)).sum(1) * r.float()).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            print("SPS:", update)
            yield 8

    def dqn(config=None, *, device=None, seed=None):
        """A DQN-style script as a generator with defaults: one env step per yield, an optimizer step every 10th."""
        net = torch.nn.Linear(4, 2)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        for step in range(10**7):
            if step % 10 == 9:
                loss = net(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            yield 1
''')
FLOAT64_LINE = SCRIPT.splitlines().index("            r = torch.tensor(reward)") + 1
RUN = ["--set", "run.steps=32", "--set", "run.warmup_steps=8", "--repeats", "3"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "script.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("script", None)
    yield tmp_path
    sys.modules.pop("script", None)


def _settings(path: Path, **config: object) -> Path:
    path.write_text(json.dumps(config))  # YAML reads JSON
    return path


def test_a_generator_factory_is_a_trainer_and_running_out_after_the_repeats_is_not_a_failure(
        project: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    # warm-up: 1 call; 3 repeats of 4 calls: 13 calls, then the checked iteration finds it exhausted
    config = _settings(project / "c.yaml", iterations=13)
    code = main(["run", "--trainer", "script:train", "--config", str(config), *RUN, "--out", "r.json", "--quiet"])
    err = capsys.readouterr().err
    assert code == 0, err
    (run,) = json.loads((project / "r.json").read_text())["runs"]
    assert run["status"] == "ok" and run["steps_completed"] == 96
    assert "ran out of iterations" in run["stability"]["sentinel_skipped"]
    assert "ran out of iterations (iterate() raised StopIteration) after 104 env steps" in caplog.text


def test_a_generator_that_runs_out_before_its_repeats_is_a_failure_naming_it(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _settings(project / "c.yaml", iterations=3)
    code = main(["run", "--trainer", "script:train", "--config", str(config), *RUN, "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "TrainerExhausted: your trainer script:train ran out of iterations" in err


def test_updates_are_the_optimizer_steps_a_generator_takes_not_its_yields(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--trainer", "script:dqn", "--set", "run.steps=200", "--set", "run.warmup_steps=10",
                 "--repeats", "3", "--out", "r.json", "--quiet"])
    assert code == 0, capsys.readouterr().err
    (run,) = json.loads((project / "r.json").read_text())["runs"]
    env, updates = run["metrics"]["env_steps_per_sec"]["samples"], run["metrics"]["updates_per_sec"]["samples"]
    assert updates == pytest.approx([rate / 10 for rate in env], rel=1e-9)  # 20 optimizer steps in each 200 env steps


def test_the_optimizer_step_hook_lives_as_long_as_the_trainer(project: Path) -> None:
    from torch.optim.optimizer import _global_optimizer_post_hooks

    from harness.specs.own_trainer import OwnConfig, OwnTrainer, load_factory

    before = len(_global_optimizer_post_hooks)
    trainer = OwnTrainer(load_factory("script:dqn"), OwnConfig("script:dqn", {}), "cpu", None)
    assert len(_global_optimizer_post_hooks) == before + 1
    assert [trainer.iterate().updates for _ in range(10)] == [0] * 9 + [1]
    trainer.close()
    assert len(_global_optimizer_post_hooks) == before


def test_the_unstable_line_says_what_to_change_where_float64_enters() -> None:
    from harness.measurement.sentinels import instability

    line = instability({"float64_ops": 512, "float64_first_site": "aten.lift_fresh.default at /x/ppo.py:207"})
    assert line == ("float64_ops=512: float64 enters at /x/ppo.py:207 (aten.lift_fresh.default): make it float32 there "
                    "(dtype=torch.float32 where the tensor is made, or .astype(np.float32))")
    assert "drop the .double() / .to(torch.float64)" in instability(
        {"float64_ops": 3, "float64_first_site": "aten._to_copy.default at t.py:9"})
    assert instability({"float64_ops": 0, "nonfinite_events": 2}).startswith(
        "nonfinite_events=2: a loss or gradient went NaN/inf")


def test_threads_set_inside_iterate_are_kept_and_warned_about(project: Path, capsys: pytest.CaptureFixture[str],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    import torch

    from reference_trainers.runtime import device as dev

    before, wanted = torch.get_num_threads(), dev.DEFAULT_THREADS + 1  # never the default the factory leaves
    config = _settings(project / "c.yaml", threads=wanted)
    assert main(["run", "--trainer", "script:train", "--config", str(config), *RUN, "--out", "r.json",
                 "--quiet"]) == 0
    import script

    assert set(script.SEEN_THREADS) == {wanted}  # never put back before a later call
    (run,) = json.loads((project / "r.json").read_text())["runs"]
    assert run["machine"]["torch_threads"] == wanted
    assert f"set torch threads to {wanted} inside iterate()" in caplog.text
    assert torch.get_num_threads() == before  # the process's own setting is restored after the run


def test_quiet_keeps_the_trainers_prints_out_of_the_console_in_a_file_the_result_names(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--trainer", "script:train", *RUN, "--out", "r.json", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "SPS:" not in out and "SPS:" not in err
    (run,) = json.loads((project / "r.json").read_text())["runs"]
    captured = Path(run["trainer_stdout"])
    assert captured == Path("r.json.stdout.txt") and "SPS: 0" in captured.read_text()
    assert f"is in {captured}" in err


def test_an_unstable_run_names_its_first_float64_line_in_run_compare_and_gate(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _settings(project / "c.yaml", float64=True)
    for out in ("a.json", "b.json"):
        assert main(["run", "--trainer", "script:train", "--config", str(config), *RUN, "--out", out, "--quiet"]) == 1
        err = capsys.readouterr().err
        site = f"{project / 'script.py'}:{FLOAT64_LINE}"
        assert f"float64 enters at {site} (aten.lift_fresh.default): make it float32 there (dtype=torch.float32" in err
    assert main(["compare", "a.json", "b.json"]) == 0
    compared = " ".join(capsys.readouterr().out.split())
    assert "confirmed" not in compared and "no verdict" in compared
    assert main(["gate", "--baseline", "a.json", "--candidate", "b.json", "--allow-untrustworthy"]) == 1
    gated = capsys.readouterr()
    assert "rlgauge: gate failed" in gated.err


def test_gate_does_not_judge_a_rate_of_an_unstable_run_and_names_the_float64_site() -> None:
    from results_factory import make_result

    from harness.analyses.gate import Thresholds, stability_checks, throughput_checks
    from harness.stats.compare import Pair

    base = make_result("baseline", [1000.0, 1000.0, 1000.0])
    cand = make_result("baseline", [500.0, 510.0, 505.0], status="unstable", float64_ops=4)
    cand.stability["float64_first_site"] = "aten.lift_fresh.default at train.py:207"
    (check,) = throughput_checks(Pair(base, cand, paired=False), Thresholds())
    assert check.passed is None and check.note == "not judged: the candidate run is unstable"  # no verdict
    float64 = next(c for c in stability_checks(cand, Thresholds()) if c.check == "float64_ops")
    assert float64.note == "first: aten.lift_fresh.default at train.py:207"
    (fine,) = throughput_checks(Pair(base, make_result("baseline", [990.0, 1000.0, 1010.0]), paired=False),
                                Thresholds())
    assert "not judged" not in fine.note


def test_the_float32_fix_of_that_line_passes(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--trainer", "script:train", *RUN, "--out", "a.json", "--quiet"]) == 0


def test_measure_start_stop_needs_no_reindenting_and_prints_its_status(project: Path) -> None:
    script = textwrap.dedent('''
        import numpy as np, torch
        from harness import measure
        m = measure("loop", out="m.json", steps_per_repeat=16, warmup_steps=8).start()
        for update in range(12):
            x = torch.tensor(np.ones(4))
            m.steps(8)
        if "--stop" in __import__("sys").argv:
            m.stop()
    ''')
    (project / "loop.py").write_text(script)
    for argv in (["--stop"], []):  # stopped by hand, or at the interpreter's exit
        done = subprocess.run([sys.executable, "loop.py", *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "rlgauge: measure loop (config): unstable" in done.stderr
        assert f"float64 enters at {project / 'loop.py'}:6 (aten.lift_fresh.default): make it float32" in done.stderr
        (run,) = json.loads((project / "m.json").read_text())["runs"]
        assert run["status"] == "unstable" and len(run["metrics"]["env_steps_per_sec"]["samples"]) == 5


def test_run_checks_a_generator_over_whole_updates_as_diagnose_audits_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A generator that yields every env step and updates every 10th: run's host syncs per step are the rate
    over at least CHECKED_ENV_STEPS (the action copy each step, the for-loop Adam's 4 step counters each 10th),
    not one call's (1 or 5)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--trainer", "planted_trainer:make_dqn_like", "--set", "run.steps=100", "--set",
                 "run.warmup_steps=20", "--repeats", "2", "--out", "r.json", "--quiet"])
    assert code == 0, capsys.readouterr().err
    (run,) = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert run["metrics"]["host_syncs_per_step"] == pytest.approx(1.0 + 4 / 10, abs=0.02)


def test_a_variant_keeps_its_distribution_checks_when_another_turns_them_off_in_the_process() -> None:
    """torch's first compile turns distribution argument checks off process-wide; interleaved variants each run with
    the default their own factory and calls left, as they would in processes of their own."""
    import torch

    from harness.specs.own_trainer import OwnConfig, OwnTrainer

    seen: list[bool] = []

    class Checks:
        def __init__(self, turns_off: bool) -> None:
            self.turns_off = turns_off

        def iterate(self) -> int:
            seen.append(bool(torch.distributions.Distribution._validate_args))
            if self.turns_off:  # what a compile inside the call does
                torch.distributions.Distribution.set_default_validate_args(False)
            return 1

        def close(self) -> None:
            pass

    def factory(turns_off: bool):  # noqa: ANN202 - a factory
        return lambda config, *, device, seed: Checks(turns_off)

    compiling = OwnTrainer(factory(True), OwnConfig("t:compiling", {}), "cpu", None)
    plain = OwnTrainer(factory(False), OwnConfig("t:plain", {}), "cpu", None)
    for _ in range(2):
        compiling.iterate()
        plain.iterate()
    assert seen == [True, True, False, True]  # the compiling variant keeps what its call left; the other its own
