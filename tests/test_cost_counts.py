"""The deterministic cost counts (``harness.measurement.cost_counts``, asv's ``CostCounts``): the same work
gives the same counts; one sync or one kernel added per step shows as exactly one more per step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.measurement.cost_counts import COUNTS, count_costs, open_instruction_counter

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
              "from harness.measurement.cost_counts import count_costs; "
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
