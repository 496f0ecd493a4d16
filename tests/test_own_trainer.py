"""Your own trainer through ``rlgauge run --trainer`` / ``trainer:`` files, and ``harness.measure``."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.cli import main
from reference_trainers.runtime import device as dev

TOY = textwrap.dedent('''
    import os
    import signal
    import time

    import torch

    SEEN_THREADS = []

    class Toy:
        """A tiny trainer: n random inputs per iterate, one Adam step on a linear layer."""

        def __init__(self, config, device, seed, probe=None):
            self.n = config.get("n", 32)
            self.fail_at = config.get("fail_at")
            self.swallow_signal_at = config.get("swallow_signal_at")
            self.returns = config.get("returns", "int")
            self.frozen = config.get("frozen", False)
            self.probe = probe
            self.device = device
            torch.manual_seed(seed)
            self.net = torch.nn.Linear(4, 4).to(device)
            if config.get("threads"):
                torch.set_num_threads(config["threads"])
            self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-2)
            self.calls = 0

        def set_probe(self, probe):
            self.probe = probe

        def iterate(self):
            self.calls += 1
            SEEN_THREADS.append(torch.get_num_threads())
            with self.probe.phase("env"):
                x = torch.randn(self.n, 4, device=self.device)
            with self.probe.phase("update"):
                loss = self.net(x).pow(2).mean()
                if self.returns == "float64":
                    loss = loss.double().float()
                self.opt.zero_grad()
                loss.backward()
                if not self.frozen:
                    self.opt.step()
            if self.fail_at is not None and self.calls >= self.fail_at:
                raise RuntimeError("the simulator lost its connection")
            if self.swallow_signal_at == self.calls:
                try:  # the signal lands in code that swallows the exception (a finaliser, say)
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(1)
                except KeyboardInterrupt:
                    pass
            if self.returns == "text":
                return "many"
            if self.returns == "object":
                return type("Done", (), {"env_steps": self.n, "updates": 2})()
            return self.n

        def close(self):
            pass

        def mean_recent_return(self):
            return 1.5

    class Resumable(Toy):
        def state_dict(self):
            return {"net": self.net.state_dict(), "calls": self.calls}

        def load_state_dict(self, state):
            self.net.load_state_dict(state["net"])
            self.calls = state["calls"]

    def make_trainer(config, *, device, seed, probe=None):
        return Toy(config, device, seed, probe)

    def make_without_probe(config, *, device, seed):
        return Toy(config, device, seed)

    def make_resumable(config, *, device, seed, probe=None):
        return Resumable(config, device, seed, probe)

    def make_nothing(config, *, device, seed):
        return object()

    NOT_A_FACTORY = 3

    def make_and_fail(config, *, device, seed):
        raise ValueError("no licence for the simulator")

    def make_from_cfg(cfg):
        return Toy(cfg, "cpu", 1)

    def make_and_raise_type_error(config, *, device, seed):
        raise TypeError("the simulator wants a list of ports")
''')

BENCH = textwrap.dedent('''
    trainer: toy_own:make_trainer
    description: a toy trainer
    config: {n: 32}
    variants:
      baseline: {}
      optimized: {n: 64, threads: 1}
    run: {steps: 256, warmup_steps: 64, repeats: 3}
''')
RUN = ["--set", "run.steps=256", "--set", "run.warmup_steps=64", "--repeats", "3", "--quiet"]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's folder with ``toy_own.py`` and ``bench.yaml``, as the current folder."""
    (tmp_path / "toy_own.py").write_text(TOY)
    (tmp_path / "bench.yaml").write_text(BENCH)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("toy_own", None)
    yield tmp_path
    sys.modules.pop("toy_own", None)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def runs_of(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["runs"]


# --------------------------------------------------------------------------- run

def test_a_trainer_file_runs_both_variants_interleaved_into_the_result_schema(project: Path, capsys,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # a default of two threads, so that the factory's one thread shows (pytest -n workers start with one)
    monkeypatch.setattr(dev, "DEFAULT_THREADS", 2)
    monkeypatch.setattr(dev, "_default_threads", 2)
    code, out, err = run_cli(capsys, "run", "bench.yaml", "--out", "r.json", "--quiet")
    assert code == 0, err
    assert "ratio optimized/baseline" in out
    baseline, optimized = runs_of(project / "r.json")
    assert (baseline["variant"], optimized["variant"]) == ("baseline", "optimized")
    assert baseline["algo"] == optimized["algo"] == "custom"
    assert baseline["config"]["trainer"] == "toy_own:make_trainer"
    assert baseline["config"]["config"] == {"n": 32} and optimized["config"]["config"] == {"n": 64, "threads": 1}
    for run in (baseline, optimized):
        assert run["status"] == "ok" and len(run["metrics"]["env_steps_per_sec"]["samples"]) == 3
        assert run["steps_completed"] >= 3 * 256
        assert run["metrics"]["mean_return_last_k"] == 1.5
        assert run["metrics"]["phase_seconds"]["update"] > 0 and run["metrics"]["phase_seconds"]["env"] > 0
        assert run["quality"] is not None
    # the factory set one thread for optimized: recorded, and kept in force while each variant iterates
    assert optimized["machine"]["torch_threads"] == 1
    assert baseline["machine"]["torch_threads"] == dev.DEFAULT_THREADS
    assert set(sys.modules["toy_own"].SEEN_THREADS) == {1, dev.DEFAULT_THREADS}


def test_trainer_option_with_a_plain_settings_file_and_set_on_the_users_keys(project: Path, capsys) -> None:
    (project / "settings.yaml").write_text("n: 16\n")
    code, _, err = run_cli(capsys, "run", "--trainer", "toy_own:make_without_probe", "--config", "settings.yaml",
                           "--set", "n=48", "--set", "config.returns=object", *RUN, "--out", "r.json")
    assert code == 0, err
    (run,) = runs_of(project / "r.json")
    assert run["variant"] == "config" and run["config"]["config"] == {"n": 48, "returns": "object"}
    # the object's updates count (2 per iterate) reached updates_per_sec: twice the iterate rate
    per_iterate = run["metrics"]["env_steps_per_sec"]["median"] / 48
    assert run["metrics"]["updates_per_sec"]["median"] == pytest.approx(2 * per_iterate, rel=1e-6)


def test_a_float64_op_in_the_users_trainer_makes_the_run_unstable(project: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "run", "--trainer", "toy_own:make_trainer", "--set", "returns=float64", *RUN,
                           "--out", "r.json")
    assert code == 1
    (run,) = runs_of(project / "r.json")
    assert run["status"] == "unstable" and run["stability"]["float64_ops"] > 0


def test_an_exception_in_the_users_trainer_is_one_line_exit_1_and_a_failed_result(project: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "run", "bench.yaml", "--set", "fail_at=3", "--out", "r.json", "--quiet")
    assert code == 1
    assert "Traceback" not in err
    line = next(l for l in err.splitlines() if "failed:" in l)
    assert "toy_own:make_trainer" in line and "RuntimeError: the simulator lost its connection" in line
    assert {r["status"] for r in runs_of(project / "r.json")} == {"failed"}


def test_a_signal_whose_interrupt_a_trainer_swallows_still_stops_the_run(project: Path, capsys) -> None:
    """A SIGTERM that lands in code that swallows KeyboardInterrupt (a finaliser, say) is not lost:
    the loop raises it again before the next iteration, and the run ends interrupted."""
    code, _, err = run_cli(capsys, "run", "bench.yaml", "--set", "swallow_signal_at=5", "--set", "run.steps=100000",
                           "--out", "r.json", "--quiet")
    assert code == 130, err
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert {r["status"] for r in runs_of(project / "r.json")} == {"interrupted"}


def test_debug_logs_the_traceback_of_the_users_exception(project: Path, capsys,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    code, _, _ = run_cli(capsys, "run", "--trainer", "toy_own:make_trainer", "--set", "fail_at=1", *RUN)
    assert code == 1 and "Traceback" not in caplog.text
    caplog.clear()
    code, _, _ = run_cli(capsys, "--debug", "run", "--trainer", "toy_own:make_trainer", "--set", "fail_at=1", *RUN)
    assert code == 1
    assert "Traceback" in caplog.text and "toy_own.py" in caplog.text


def test_checkpoints_work_with_a_resumable_trainer_and_are_refused_without(project: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "run", "--trainer", "toy_own:make_resumable", *RUN, "--checkpoint-every", "128",
                           "--checkpoint-dir", "ck")
    assert code == 0, err
    assert list((project / "ck").iterdir())
    code, _, err = run_cli(capsys, "run", "--trainer", "toy_own:make_trainer", *RUN, "--checkpoint-every", "128",
                           "--checkpoint-dir", "ck2")
    assert code == 2 and "state_dict() and load_state_dict()" in err


# --------------------------------------------------------------------------- bad input

BAD = {
    "no colon": (["--trainer", "toy_own"], "expected MODULE:ATTRIBUTE"),
    "missing module": (["--trainer", "no_such_module_xyz:make"], "no module named 'no_such_module_xyz'"),
    "missing attribute": (["--trainer", "toy_own:absent"], "has no attribute 'absent'"),
    "not callable": (["--trainer", "toy_own:NOT_A_FACTORY"], "not callable"),
    "no colon, with a settings file": (["--trainer", "toy_own", "--config", "bench.yaml"],
                                       "--trainer toy_own: expected MODULE:ATTRIBUTE (e.g. toy_own:make_trainer)"),
    "factory without device and seed": (["--trainer", "toy_own:make_from_cfg"],
                                        "expected a factory make_trainer(config: dict, *, device: str, seed: int); "
                                        "make_from_cfg(cfg) cannot be called so"),
    "unknown variant": (["bench.yaml", "--variant", "baseline,fast"],
                        "--variant baseline,fast: bench defines no variant 'fast'; defined: baseline, optimized"),
    "no iterate": (["--trainer", "toy_own:make_nothing"], "no iterate() or close()"),
    "iterate returns text": (["--trainer", "toy_own:make_trainer", "--set", "returns=text"], "iterate() returned 'many'"),
    "bad run key": (["--trainer", "toy_own:make_trainer", "--set", "run.stepz=3"], "run.stepz: unknown key"),
    "bad run value": (["--trainer", "toy_own:make_trainer", "--set", "run.return_window=0"], "run.return_window"),
    "config without trainer": (["--config", "bench.yaml"], "--config: only used with --trainer"),
    "target and trainer": (["bench.yaml", "--trainer", "toy_own:make_trainer"], "give the settings file as --config"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_trainer_input_exits_2_with_one_line_and_keeps_files(project: Path, capsys, case: str) -> None:
    argv, needle = BAD[case]
    (project / "r.json").write_text("precious\n")
    code, _, err = run_cli(capsys, "run", *RUN, *argv, "--out", "r.json")
    assert code == 2, err
    lines = [l for l in err.splitlines() if l.startswith("rlgauge: error:")]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err
    assert (project / "r.json").read_text() == "precious\n"


def test_a_factory_that_raises_is_a_failed_run_naming_the_trainer(project: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "run", "--trainer", "toy_own:make_and_fail", *RUN)
    assert code == 1 and "ValueError: no licence for the simulator" in err and "toy_own:make_and_fail" in err


def test_a_type_error_inside_the_factory_is_the_trainers_failure_not_its_signature(project: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "run", "--trainer", "toy_own:make_and_raise_type_error", *RUN)
    assert code == 1 and "TypeError: the simulator wants a list of ports" in err and "make_trainer(config" not in err


@pytest.mark.parametrize("trainer, needle", [
    ("toy_own", "bad.yaml: trainer: toy_own: expected MODULE:ATTRIBUTE (e.g. toy_own:make_trainer)"),
    ("no_such_module_xyz:make", "bad.yaml: trainer: no_such_module_xyz:make: no module named 'no_such_module_xyz'"),
])
def test_a_bad_trainer_key_in_a_file_is_blamed_on_the_files_trainer_key(project: Path, capsys, trainer: str,
                                                                       needle: str) -> None:
    (project / "bad.yaml").write_text(f"trainer: {trainer}\nconfig: {{n: 8}}\n")
    code, _, err = run_cli(capsys, "run", "bad.yaml")
    assert code == 2 and err.count("\n") == 1 and needle in err and "--trainer" not in err


def test_a_trainer_file_with_an_unknown_top_level_key_is_refused(project: Path, capsys) -> None:
    (project / "bad.yaml").write_text("trainer: toy_own:make_trainer\nsteps: 3\n")
    code, _, err = run_cli(capsys, "run", "bad.yaml")
    assert code == 2 and "unknown top-level key 'steps'" in err


BENCH3 = BENCH.replace("  optimized: {n: 64, threads: 1}\n", "  optimized: {n: 64, threads: 1}\n  fused_adam: {n: 48}\n")
"""A user's file with a variant of its own beside baseline and optimized."""


def test_run_measures_a_list_of_the_users_variants_interleaved_the_first_as_reference(project: Path, capsys) -> None:
    (project / "bench3.yaml").write_text(BENCH3)
    code, out, err = run_cli(capsys, "run", "bench3.yaml", "--variant", "fused_adam,baseline", "--out", "r.json",
                             "--quiet")
    assert code == 0, err
    assert [r["variant"] for r in runs_of(project / "r.json")] == ["fused_adam", "baseline"]
    assert "ratio baseline/fused_adam" in out and "also defines" not in err
    code, out, err = run_cli(capsys, "compare", "r.json")
    assert code == 0, err
    assert "bench3: baseline vs fused_adam" in out


def test_run_all_measures_every_variant_and_gives_each_against_the_reference(project: Path, capsys) -> None:
    (project / "bench3.yaml").write_text(BENCH3)
    code, out, err = run_cli(capsys, "run", "bench3.yaml", "--variant", "all", "--out", "r.json", "--quiet")
    assert code == 0, err
    runs = runs_of(project / "r.json")
    assert [r["variant"] for r in runs] == ["baseline", "optimized", "fused_adam"]
    assert runs[2]["config"]["config"] == {"n": 48}
    assert "ratio optimized/baseline: env_steps_per_sec" in out and "ratio fused_adam/baseline: env_steps_per_sec" in out
    code, out, err = run_cli(capsys, "compare", "r.json")
    assert code == 0, err
    assert "bench3: optimized vs baseline" in out and "bench3: fused_adam vs baseline" in out
    code, out, err = run_cli(capsys, "gate", "--baseline", "r.json", "--candidate", "r.json", "--allow-untrustworthy")
    assert code in (0, 1) and "fused_adam" in out, err


def test_the_default_both_names_the_variants_it_leaves_out(project: Path, capsys) -> None:
    (project / "bench3.yaml").write_text(BENCH3)
    code, out, err = run_cli(capsys, "config", "bench3.yaml")
    assert code == 0 and "# bench3 / fused_adam" not in out
    note = ("rlgauge: note: bench3 also defines fused_adam: left out by config's --variant both (baseline and "
            "optimized); select them with --variant all, or a list: --variant baseline,fused_adam")
    assert err.strip() == note
    code, out, err = run_cli(capsys, "config", "bench3.yaml", "--variant", "fused_adam,optimized")
    assert code == 0 and err == ""
    assert [line for line in out.splitlines() if line.startswith("# bench3")] == ["# bench3 / fused_adam",
                                                                                  "# bench3 / optimized"]
    code, _, err = run_cli(capsys, "run", "bench3.yaml", *RUN, "--out", "r.json")
    assert code == 0 and "left out by run's --variant both" in err


def test_gate_run_gates_each_listed_variant_against_the_first(project: Path, capsys) -> None:
    (project / "bench3.yaml").write_text(BENCH3)
    code, out, err = run_cli(capsys, "gate", "--run", "bench3.yaml", "--variant", "baseline,fused_adam,optimized",
                             "--min-speedup", "0.01", "--allow-untrustworthy", *RUN)
    assert code == 0, err
    text = " ".join(out.split())
    assert "speedup fused_adam/baseline" in text and "speedup optimized/baseline" in text
    code, _, err = run_cli(capsys, "gate", "--run", "bench3.yaml", "--variant", "fused_adam", *RUN)
    assert code == 2 and "needs a preset with two variants or more" in err and "selects fused_adam only" in err


def test_a_trainer_that_steps_no_optimizer_reports_no_update_rate_and_compares(project: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "run", "bench.yaml", "--set", "frozen=true", "--out", "r.json", "--quiet")
    assert code == 0, err
    assert {r["variant"]: r["metrics"]["updates_per_sec"] for r in runs_of(project / "r.json")} == {
        "baseline": None, "optimized": None}
    code, _, err = run_cli(capsys, "compare", "r.json")
    assert code == 0, err


def test_config_prints_the_users_settings_and_run(project: Path, capsys) -> None:
    code, out, _ = run_cli(capsys, "config", "bench.yaml", "--variant", "optimized")
    assert code == 0
    assert "trainer: toy_own:make_trainer" in out and "threads: 1" in out and "steps: 256" in out


# --------------------------------------------------------------------------- the protocol and measure()

def test_the_public_protocol_accepts_a_users_trainer(project: Path) -> None:
    import harness
    from harness.specs.own_trainer import load_factory

    trainer = load_factory("toy_own:make_trainer")({}, device="cpu", seed=1)
    assert isinstance(trainer, harness.Trainer)
    assert not isinstance(object(), harness.Trainer)


def _loop(m: Any, chunks: int, n: int = 64, wide: bool = False) -> None:
    net = torch.nn.Linear(4, 4)
    for _ in range(chunks):
        with m.phase("update"):
            x = torch.randn(n, 4)
            loss = net(x.double() if wide else x).sum() if not wide else net.double()(x.double()).sum()
            loss.backward()
        m.steps(n)


def test_measure_writes_runs_that_compare_reads_as_not_interleaved(project: Path, capsys) -> None:
    from harness import measure

    for variant in ("baseline", "optimized"):
        with measure("loop", out="m.json", variant=variant, steps_per_repeat=256, warmup_steps=64) as m:
            _loop(m, 20)
        assert m.result is not None and m.result.status == "ok"
    runs = runs_of(project / "m.json")
    assert [r["variant"] for r in runs] == ["baseline", "optimized"]
    assert len(runs[0]["metrics"]["env_steps_per_sec"]["samples"]) == (20 * 64 - 64) // 256
    assert runs[0]["metrics"]["phase_seconds"]["update"] > 0
    code, out, err = run_cli(capsys, "compare", "m.json")
    assert code == 0, err
    assert "independent" in " ".join(out.split())


def test_measure_checks_the_warm_up_for_float64_and_records_an_exception(project: Path) -> None:
    from harness import measure

    with measure("wide", out="w.json", steps_per_repeat=128, warmup_steps=64) as m:
        _loop(m, 10, wide=True)
    assert m.result.status == "unstable" and m.result.stability["float64_ops"] > 0
    with pytest.raises(RuntimeError, match="simulator"):
        with measure("boom", out="w.json", steps_per_repeat=128) as m:
            _loop(m, 5)
            raise RuntimeError("simulator gone")
    statuses = {r["preset"]: r["status"] for r in runs_of(project / "w.json")}
    assert statuses == {"wide": "unstable", "boom": "failed"}


def test_measure_refuses_a_step_count_that_is_not_positive(project: Path) -> None:
    from harness import measure
    from harness.errors import UserError

    with pytest.raises(UserError, match="positive int"):
        with measure("x") as m:
            m.steps(0)


def test_gate_run_and_record_take_a_users_trainer(project: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "gate", "--run", "bench.yaml", "--min-speedup", "0.01", "--allow-untrustworthy")
    assert code == 0, err
    assert "bench/optimized" in out
    code, _, err = run_cli(capsys, "gate", "--run", "bench.yaml", "--min-speedup", "1000", "--allow-untrustworthy")
    assert code == 1, err
    code, _, err = run_cli(capsys, "run", "bench.yaml", "--out", "r.json", "--quiet")
    assert code == 0, err
    code, _, err = run_cli(capsys, "record", "r.json", "--milestone", "mine", "--runs-md", "RUNS.md")
    assert code == 0, err
    rows = [l for l in (project / "RUNS.md").read_text().splitlines() if "| mine |" in l]
    assert len(rows) == 2 and "| bench | optimized |" in rows[1]
    assert runs_of(project / "r.json")[0]["git"]["commit"] is None  # the user's folder, not rlgauge's checkout


def test_end_to_end_time_covers_start_up_build_warm_up_and_the_timed_steps(project: Path, capsys) -> None:
    code, out, err = run_cli(capsys, "run", "bench.yaml", "--out", "r.json", "--quiet")
    assert code == 0, err
    assert "end_to_end_env_steps_per_sec" in out
    for run in runs_of(project / "r.json"):
        m = run["metrics"]
        timed_s = 3 * 256 / m["env_steps_per_sec"]["median"]  # about: the timed seconds
        assert m["end_to_end_s"] > m["warmup_s"] + 0.5 * timed_s
        steps = run["steps_completed"] + 64  # at least the warm-up budget
        assert m["end_to_end_env_steps_per_sec"] == pytest.approx(steps / m["end_to_end_s"], rel=0.5)
        assert m["end_to_end_env_steps_per_sec"] < m["env_steps_per_sec"]["max"]


def test_ablate_measures_the_keys_in_which_the_users_variants_differ(project: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "ablate", "bench.yaml", "--steps", "256", "--repeats", "3", "--set",
                           "run.warmup_steps=64", "--quiet", "--out", "abl")
    assert code == 0, err
    summary = json.loads((project / "abl" / "ablation.json").read_text())
    text = json.dumps(summary)
    assert '"n"' in text and '"threads"' in text  # bench.yaml's optimized sets n: 64 and threads: 1
    arms = {r["variant"]: r for r in runs_of(project / "abl" / "runs.json")}
    assert set(arms) == {"baseline", "+n", "+threads", "all-on", "-n", "-threads"}
    assert arms["+n"]["config"]["config"] == {"n": 64} and arms["-n"]["config"]["config"] == {"n": 32, "threads": 1}


def test_sweep_runs_over_a_users_key(project: Path, capsys) -> None:
    code, _, err = run_cli(capsys, "sweep", "bench.yaml", "--param", "n=16,48", "--steps", "256", "--repeats", "3",
                           "--set", "run.warmup_steps=64", "--quiet", "--out", "sw")
    assert code == 0, err
    runs = runs_of(project / "sw" / "runs.json")
    assert sorted(r["config"]["config"]["n"] for r in runs) == [16, 48]
