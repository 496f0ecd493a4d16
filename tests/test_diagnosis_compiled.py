"""``rlgauge diagnose`` on a compiled trainer: nothing of rlgauge's inside the compiled region, the update
found by what the compiled call does, the acting call at the loop's line, the breaks as the trainer has them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main

TESTS = Path(__file__).parent
YAML = """\
trainer: compiled_trainer:make_trainer
config: {num_steps: 16}
variants: {baseline: {}}
run: {steps: 256, warmup_steps: 64, repeats: 1}
"""


@pytest.fixture()
def compiled_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(TESTS))
    path = tmp_path / "compiled.yaml"
    path.write_text(YAML)
    return path


def _line(text: str) -> int:
    lines = (TESTS / "compiled_trainer.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_a_compiled_trainer_is_diagnosed_without_recompiles_of_rlgauges_making(
        compiled_yaml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch._dynamo

    torch._dynamo.reset()
    code = main(["diagnose", str(compiled_yaml), "--json", "--device", "cpu"])
    d = json.loads(capsys.readouterr().out)["diagnosis"]
    assert code == 0
    loop = d["loop"]
    assert loop["recompiles"] == 0 and loop["recompile_reasons"] == []
    assert loop["hooks_kept_installed"] is True
    assert loop["compiled_calls"]["update"] > 0 and loop["compiled_calls"]["forward"] > 0
    assert loop["optimizer_steps_per_env_step"] == pytest.approx(1 / 32)
    assert loop["optimizers"] == [{"class": "Adam", "impl": "compiled"}]
    assert d["inference_forward_sites"][0].endswith(f"compiled_trainer.py:{_line('action = policy(obs)')}")
    breaks = {(s["kind"], s["where"].rpartition("compiled_trainer.py:")[2]) for s in loop["graph_break_sites"]}
    assert ("optimizer.zero_grad()", str(_line("optimizer.zero_grad()"))) in breaks
    assert ("backward()", str(_line("loss.backward()"))) in breaks
    assert not any("harness" in s["where"] for s in loop["graph_break_sites"])
    assert d["phases"]["update"] > 0 and d["forwards_per_env_step"] == pytest.approx(0.5)
    assert not any(r["rule"] == "forloop_optimizer" for r in d["recommendations"])


NOISY = """\
import logging, sys
import torch
_log = logging.getLogger("noisy_lib")
_log.addHandler(logging.StreamHandler(sys.__stdout__))  # a library's handler bound to the process's stdout
_log.setLevel(logging.INFO)
def make_trainer(config, *, device, seed):
    net = torch.nn.Linear(2, 2)
    while True:
        _log.info("a library's log line")
        print("the trainer's own print")
        print("a warning of its own", file=sys.stderr)
        with torch.no_grad():
            net(torch.ones(1, 2))
        yield 4
"""


@pytest.mark.parametrize("quiet", [True, False])
def test_diagnose_json_stdout_is_json_alone_and_quiet_names_the_trainers_files(
        quiet: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "noisy.py").write_text(NOISY)
    code = main(["diagnose", "--trainer", "noisy:make_trainer", "--steps", "32", "--set", "run.warmup_steps=8",
                 "--json", "--device", "cpu", *(["--quiet"] if quiet else [])])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert out.startswith("{"), (out[:200], err[-500:])
    json.loads(out)  # nothing but the JSON object
    stdout_file, stderr_file = tmp_path / "rlgauge-diagnose.stdout.txt", tmp_path / "rlgauge-diagnose.stderr.txt"
    if quiet:
        assert "a library's log line" in stdout_file.read_text() and "the trainer's own print" in stdout_file.read_text()
        assert "a warning of its own" in stderr_file.read_text() and "a warning of its own" not in err
        assert err.strip().splitlines()[-1] == (f"rlgauge: the trainer's output: rlgauge-diagnose.stdout.txt "
                                                 f"({len(stdout_file.read_text().splitlines())} lines), "
                                                 f"rlgauge-diagnose.stderr.txt "
                                                 f"({len(stderr_file.read_text().splitlines())} lines)")
    else:
        assert not stdout_file.exists() and "a library's log line" in err and "the trainer's own print" in err


def test_a_float64_finding_names_the_call_on_a_line_of_several(tmp_path: Path) -> None:
    import numpy as np
    import torch

    from harness.diagnosis.float64_sites import float64_finder, float64_sites

    sentinel = float64_finder(own_code_is_rlgauge=False)
    obs, reward = np.zeros(2, np.float32), np.zeros(2)
    with sentinel:
        pair = torch.as_tensor(obs), torch.as_tensor(reward), torch.as_tensor(obs)  # only the second is float64
    (row,) = float64_sites(sentinel)
    assert row["call"] == "torch.as_tensor(reward)" and len(pair) == 3


class RolloutBuffer:
    """SB3's shape: a NumPy buffer filled a step at a time."""

    def __init__(self) -> None:
        self.values = [None] * 8
        self.pos = 0

    def add(self, value: "torch.Tensor") -> None:
        self.values[self.pos % 8] = value.clone().cpu().numpy().flatten()  # the per-step copy
        self.pos += 1


def test_library_control_flow_buffer_copies_and_the_distribution_built_get_their_own_causes(tmp_path: Path) -> None:
    import importlib.util

    import torch

    from harness.diagnosis.frames import SiteFinder
    from harness.diagnosis.host_syncs import (DISTRIBUTION_CHECKS, LIBRARY_CONTROL, STORAGE, HostSyncFinder,
                                              per_env_step)
    from harness.diagnosis.recommendations import recommend

    library = tmp_path / "site" / "torchrl" / "envs"
    library.mkdir(parents=True)
    (library / "common.py").write_text("def any_done(done):\n    if done.any():\n        return True\n    return False\n"
                                       "def statistic(loss):\n    return loss.mean().item()\n")
    spec = importlib.util.spec_from_file_location("fake_torchrl_common", library / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from harness.diagnosis.phases import LoopCounters, PhaseClock

    clock, counters = PhaseClock(), LoopCounters()
    clock.enabled = True
    finder = HostSyncFinder(torch.device("cpu"), SiteFinder(False), counters, clock)
    buffer = RolloutBuffer()
    with finder:
        for _ in range(4):
            module.any_done(torch.zeros(2, dtype=torch.bool))
            buffer.add(torch.ones(2))
            torch.distributions.Normal(torch.zeros(2), torch.ones(2))
            with clock.phase("update"):  # a library's training statistics (SB3's train()): logging
                module.statistic(torch.ones(2))
    rows = per_env_step(finder.sites, 4, contexts=finder.contexts, updating=counters.update_syncs)
    causes = {row["cause"]: row for row in rows}
    assert causes[LIBRARY_CONTROL]["where"] == f"{library / 'common.py'}:2"
    assert causes[STORAGE]["context"] == "storage:RolloutBuffer.add"
    assert causes[DISTRIBUTION_CHECKS]["context"] == "distribution:Normal"
    assert causes["logging/statistics"]["where"] == f"{library / 'common.py'}:6"
    assert len([row for row in rows if row["cause"] == "logging/statistics"]) == 1
    d = {"host_syncs": rows, "kind": "trainer", "variant": "baseline", "device": "cpu", "float64": [],
         "phases": {"env": 10, "inference": 10, "update": 10, "transfer": 0, "other": 70},
         "loop": {"envs_per_step": 1.0, "optimizers": [], "frames_compiled": 0, "kernels_per_env_step": 1,
                  "graph_breaks": 0, "recompiles": 0, "torch_threads": 1, "host_tensors_per_update": 0,
                  "env_classes": []},
         "forwards_per_env_step": 0.0, "rows_per_inference_forward": 1.0}
    found = {r["rule"]: r for r in recommend(d, "t.yaml")}
    assert found["distribution_checks"]["change"].startswith("distribution argument checks off: Normal(..., "
                                                             "validate_args=False)")
    assert "Categorical" not in found["distribution_checks"]["change"]
    assert "RolloutBuffer.add" in found["storage_copies"]["evidence"] and "library_control" in found
    assert "item_per_step" in found and "common.py:6" in found["item_per_step"]["evidence"]


@pytest.mark.parametrize("reinforce", [False, True])
def test_an_acting_forward_is_reported_at_the_loops_call_and_no_grad_only_where_its_graph_is_unused(
        reinforce: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    config = tmp_path / "acting.yaml"
    config.write_text("trainer: acting_trainers:make_trainer\n"
                      f"config: {{reinforce: {str(reinforce).lower()}}}\nvariants: {{baseline: {{}}}}\n"
                      "run: {steps: 128, warmup_steps: 32, repeats: 1}\n")
    code = main(["diagnose", str(config), "--json", "--device", "cpu"])
    d = json.loads(capsys.readouterr().out)["diagnosis"]
    assert code == 0
    lines = (TESTS / "acting_trainers.py").read_text().splitlines()
    loop_line = next(i for i, line in enumerate(lines, 1) if "the acting call in the loop" in line)
    assert d["inference_forward_sites"] == [f"{TESTS / 'acting_trainers.py'}:{loop_line}"]
    rules = {r["rule"] for r in d["recommendations"]}
    if reinforce:  # the update backpropagates through the acting graph: no_grad there would break training
        assert d["graph_building_acting"] == [] and "acting_builds_graph" not in rules
    else:
        assert [r["where"] for r in d["graph_building_acting"]] == [f"{TESTS / 'acting_trainers.py'}:{loop_line}"]
        assert "acting_builds_graph" in rules


def test_a_python_loop_over_the_batch_is_named_at_the_loops_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    code = main(["diagnose", "--trainer", "batch_loop_trainer:make_trainer", "--steps", "64", "--set",
                 "run.warmup_steps=8", "--json", "--device", "cpu"])
    d = json.loads(capsys.readouterr().out)["diagnosis"]
    assert code == 0
    lines = (TESTS / "batch_loop_trainer.py").read_text().splitlines()
    loop, body = (next(i for i, line in enumerate(lines, 1) if text in line)
                  for text in ("the loop over the batch", "one small kernel per row"))
    path = str(TESTS / "batch_loop_trainer.py")
    hot = d["hot_lines"]
    assert hot["phase"] == "update" and hot["lines"][0]["where"] == f"{path}:{body}"
    assert hot["lines"][0]["kernels_per_update"] == pytest.approx(32)
    assert hot["batch_loops"][0]["loop"] == f"{path}:{loop}"
    rule = next(r for r in d["recommendations"] if r["rule"] == "batch_loop")
    assert rule["change"].startswith("a Python loop over the batch: vectorise it")
    assert f"batch_loop_trainer.py:{loop}" in rule["evidence"]


def test_a_compile_that_fails_is_said_in_one_line_and_the_eager_path_diagnosed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    config = tmp_path / "failing.yaml"
    config.write_text(YAML.replace("config: {num_steps: 16}", "config: {num_steps: 16, backend: failing}"))
    code = main(["diagnose", str(config), "--json", "--device", "cpu"])
    d = json.loads(capsys.readouterr().out)["diagnosis"]
    assert code == 0
    failed = [w for w in d["warnings"] if w.startswith("torch.compile of ")]
    assert len(failed) == 2 and all("its eager path is what was diagnosed" in w for w in failed)
    assert "no C++ compiler found" in failed[0]
    assert d["loop"]["optimizers"] == [{"class": "Adam", "impl": "for-loop"}]  # the eager step ran


def test_stacking_the_rollout_before_a_bootstrap_forward_is_the_loops_not_the_updates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from harness.diagnosis import phases
    from harness.diagnosis.hooks import hooks
    from harness.diagnosis.phases import LoopCounters, PhaseClock
    from test_diagnosis import _InstantEnv

    now = [0.0]  # the clock's time, moved by hand: no timed assertion
    monkeypatch.setattr(phases.time, "perf_counter", lambda: now[0])
    clock, counters, env = PhaseClock(), LoopCounters(), _InstantEnv()
    net = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with hooks(clock, counters):
        clock.enabled = True
        clock.start_window()
        env.step(0)
        now[0] += 5.0  # the rollout stacked (LeanRL's torch.stack(ts)), before the bootstrap value's forward
        with torch.no_grad():
            net(torch.ones(1, 2))
        now[0] += 3.0  # advantages computed in Python: the update's lead-in
        net(torch.ones(4, 2)).sum().backward()
        optimizer.step()
        clock.end_window()
    assert clock.seconds["update"] == pytest.approx(3.0) and clock.seconds["inference"] == pytest.approx(0.0)


def test_torch_compile_used_as_a_decorator_with_options_is_timed_from_outside() -> None:
    import torch

    from harness.diagnosis.hooks import hooks
    from harness.diagnosis.phases import LoopCounters, PhaseClock

    clock, counters = PhaseClock(), LoopCounters()
    with hooks(clock, counters) as hook_set:
        @torch.compile(backend="eager")
        def double(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        clock.enabled = True
        assert double(torch.ones(2)).tolist() == [2.0, 2.0]
        counters.resolve(None)
    assert hook_set.view.compiled.roles == {double: "forward"} and counters.compiled_calls == {"forward": 1}
    assert torch.compile.__module__ == "torch"  # removed on leaving


def test_a_minibatch_loop_that_steps_the_optimizer_is_not_a_batch_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    config = tmp_path / "minibatches.yaml"
    config.write_text("trainer: batch_loop_trainer:make_trainer\nconfig: {minibatches: true}\n"
                      "variants: {baseline: {}}\nrun: {steps: 64, warmup_steps: 8, repeats: 1}\n")
    code = main(["diagnose", str(config), "--json", "--device", "cpu"])
    d = json.loads(capsys.readouterr().out)["diagnosis"]
    assert code == 0 and d["hot_lines"]["phase"] == "update" and d["hot_lines"]["lines"]
    assert d["hot_lines"]["batch_loops"] == [] and "batch_loop" not in {r["rule"] for r in d["recommendations"]}
