"""The deterministic cost counts (``benchmarks.cost_instrument``, asv's ``CostCounts``): the same work
gives the same counts; one sync or one kernel added per step shows as exactly one more per step, in
training and in action selection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.cost_instrument import COUNTS, count_costs, open_instruction_counter

ROOT = Path(__file__).resolve().parents[1]


def _loop(steps: int, *, extra_sync: bool = False, extra_kernel: bool = False) -> int:
    net = torch.nn.Linear(4, 2)
    torch.manual_seed(0)
    for _ in range(steps):
        with torch.no_grad():
            q = net(torch.ones(3, 4))
        actions = q.argmax(dim=1)
        if extra_sync:
            actions.sum().item()
        if extra_kernel:
            q = q + 1
    return steps


def test_the_same_work_gives_the_same_counts() -> None:
    count_costs(lambda: _loop(20), torch.device("cpu"))  # a first call also pays one-off initialisation
    first = count_costs(lambda: _loop(20), torch.device("cpu"))
    second = count_costs(lambda: _loop(20), torch.device("cpu"))
    assert set(first) == set(COUNTS) and first == second and first["aten_ops"] > 0


def test_an_added_sync_per_step_is_one_more_sync_per_step() -> None:
    base = count_costs(lambda: _loop(20), torch.device("cpu"))
    synced = count_costs(lambda: _loop(20, extra_sync=True), torch.device("cpu"))
    assert synced["host_syncs"] - base["host_syncs"] == pytest.approx(1.0)


def test_an_added_kernel_per_step_shows_in_the_ops_and_bytes() -> None:
    base = count_costs(lambda: _loop(20), torch.device("cpu"))
    more = count_costs(lambda: _loop(20, extra_kernel=True), torch.device("cpu"))
    assert more["aten_ops"] - base["aten_ops"] == pytest.approx(1.0)
    assert more["output_bytes"] - base["output_bytes"] == pytest.approx(3 * 2 * 4)  # one float32 [3, 2] output
    assert more["python_calls"] >= base["python_calls"] and more["host_syncs"] == base["host_syncs"]


def test_float64_work_is_counted() -> None:
    wide = count_costs(lambda: (torch.ones(3, dtype=torch.float64) * 2, 1)[1], torch.device("cpu"))
    assert wide["float64_ops"] >= 1


def test_instructions_are_none_where_the_kernel_has_no_counter() -> None:
    counts = count_costs(lambda: _loop(2), torch.device("cpu"))
    assert (counts["instructions"] is None) == (open_instruction_counter() is None)


def test_a_preset_counts_the_same_in_two_fresh_processes() -> None:
    """What asv compares across commits: a preset variant's counts in two processes of the same code."""
    script = ("import torch, json; from benchmarks.common import build, train_env_steps; "
              "from benchmarks.cost_instrument import count_costs; "
              "t = build('dqn-cartpole', 'baseline', 'cpu', ('dqn.learning_starts=64',)); train_env_steps(t, 64); "
              "print(json.dumps(count_costs(lambda: train_env_steps(t, 64), torch.device('cpu'))))")
    runs = [subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert runs[0].stdout.splitlines()[-1] == runs[1].stdout.splitlines()[-1]


def test_the_counts_benchmark_skips_a_count_the_machine_lacks() -> None:
    from benchmarks.bench_counts import CostCounts

    bench = CostCounts()
    counts = {"ppo-cartpole/baseline/cpu": dict.fromkeys(COUNTS, 1.0) | {"instructions": None}}
    bench.setup(counts, "ppo-cartpole", "baseline", "cpu")
    assert bench.track_host_syncs_per_env_step(counts, "ppo-cartpole", "baseline", "cpu") == 1.0
    with pytest.raises(NotImplementedError, match="no counter"):
        bench.track_instructions_per_env_step(counts, "ppo-cartpole", "baseline", "cpu")
    with pytest.raises(NotImplementedError):
        bench.setup(counts, "ppo-pendulum", "baseline", "cpu")


def test_the_makefile_gates_every_count_but_the_instructions_at_a_factor_near_one() -> None:
    import re

    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    value = {line.split("?=", 1)[0].strip(): line.split("?=", 1)[1].strip()
             for line in text.splitlines() if "?=" in line}
    gated = re.compile(value["ASV_COUNTS"])
    for name in ("aten_ops", "host_syncs", "float64_ops", "output_bytes", "python_calls"):
        assert gated.search(f"bench_counts.CostCounts.track_{name}_per_env_step")
        assert gated.search(f"bench_counts.CostCounts.track_acting_{name}_per_selection")
    assert not gated.search("bench_counts.CostCounts.track_instructions_per_env_step")
    assert re.compile(value["ASV_REPORTED"]).search("bench_counts.CostCounts.track_instructions_per_env_step")
    assert not re.compile(value["ASV_GATED"]).search("bench_counts.CostCounts.track_host_syncs_per_env_step")
    assert 1.0 < float(value["ASV_COUNT_FACTOR"]) <= 1.01
    recipe = text[text.index("asv-continuous: asv-machine"):text.index("asv-counts: asv-machine")]
    assert "--factor $(ASV_COUNT_FACTOR) -b '$(ASV_COUNTS)'" in recipe  # make asv-continuous gates the counts too
    assert "make asv-continuous" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_an_absent_device_is_skipped_by_the_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import bench_counts, common

    monkeypatch.setattr(common, "available", lambda device: device == "cpu")
    monkeypatch.setattr(bench_counts, "skip_unless_available", common.skip_unless_available)
    for device in ("cuda", "mps"):
        with pytest.raises(NotImplementedError, match=device):
            bench_counts.CostCounts().setup({}, "ppo-cartpole", "baseline", device)


def test_an_in_place_op_allocates_nothing_and_a_new_tensor_does() -> None:
    x = torch.ones(3, 4)

    def in_place() -> int:
        for _ in range(10):
            x.add_(1)
        return 10

    def fresh() -> int:
        for _ in range(10):
            x.add(1)
        return 10

    assert count_costs(in_place, torch.device("cpu"))["output_bytes"] == 0
    assert count_costs(fresh, torch.device("cpu"))["output_bytes"] == 3 * 4 * 4


def test_the_instruments_own_frames_are_not_python_calls_of_the_work() -> None:
    """A loop of C-implemented torch calls makes no Python call per step, however many ops the modes see."""
    x = torch.ones(3, 4)

    def loop() -> int:
        for _ in range(50):
            x.sum().item()
        return 50

    counts = count_costs(loop, torch.device("cpu"))
    assert counts["aten_ops"] >= 2 and counts["python_calls"] < 0.5


def test_the_instrument_is_the_suites_own() -> None:
    """Both commits of a comparison are counted by the same code: the instrument imports nothing of the project."""
    import inspect

    from benchmarks import cost_instrument

    source = inspect.getsource(cost_instrument)
    assert "from harness" not in source and "import harness" not in source and "reference_trainers" not in source


def test_a_kernel_and_a_sync_added_to_action_selection_move_the_acting_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inference path is counted per selection: one more kernel and one .item() in every PPO select_actions
    call are one more op and one more sync per selection (training counts cover it only in the rollout)."""
    from benchmarks import bench_counts, common

    monkeypatch.setattr(bench_counts, "COUNT_PRESETS", ["ppo-cartpole"])
    monkeypatch.setattr(bench_counts, "VARIANTS", ["optimized"])
    monkeypatch.setattr(bench_counts, "DEVICES", ["cpu"])
    monkeypatch.setattr(bench_counts, "COUNT_STEPS", 64)
    monkeypatch.setattr(bench_counts, "WARMUP_STEPS", 64)
    plain = bench_counts.measure_counts()["ppo-cartpole/optimized/cpu"]
    real_build = common.build

    def planted_build(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        trainer = real_build(*args, **kwargs)
        select = trainer.select_actions

        def select_actions(obs):  # noqa: ANN001, ANN202
            out = select(obs)
            torch.ones(2).mul(2).sum().item()
            return out

        trainer.select_actions = select_actions
        return trainer

    monkeypatch.setattr(bench_counts, "build", planted_build)
    planted = bench_counts.measure_counts()["ppo-cartpole/optimized/cpu"]
    assert planted["acting_host_syncs"] - plain["acting_host_syncs"] == pytest.approx(1.0)
    assert planted["acting_aten_ops"] - plain["acting_aten_ops"] >= 2.0
