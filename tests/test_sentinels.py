"""The training-path detectors: ``Float64Sentinel`` (dispatch-level float64 ops) and
the one host-sync counter of run and diagnose (device->host synchronisations)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY
from harness.cli import main
from harness.diagnosis.frames import SiteFinder
from harness.diagnosis.host_syncs import BRANCH, HOST_COPY, ITEM, HostSyncFinder
from harness.measurement.sentinels import Float64Sentinel



# --------------------------------------------------------------------------- Float64Sentinel

def test_float64_sentinel_counts_a_planted_float64_op_and_names_it() -> None:
    sentinel = Float64Sentinel()
    with sentinel:
        wide = torch.ones(2, dtype=torch.float64) + 1  # planted: aten.ones + aten.add, both float64
    assert wide.dtype == torch.float64
    assert sentinel.count == 2
    assert sentinel.ops["aten.add.Tensor"] == 1
    assert sentinel.ops["aten.ones.default"] == 1
    assert sentinel.first_site is not None
    assert sentinel.first_site.startswith("aten.ones.default at ")
    assert Path(__file__).name in sentinel.first_site  # points at the user's line, not torch internals


def test_float64_sentinel_sees_a_float32_tensor_widened_by_double() -> None:
    sentinel = Float64Sentinel()
    narrow = torch.ones(3)
    with sentinel:
        narrow.double()
    assert sentinel.count == 1
    assert sentinel.ops == {"aten._to_copy.default": 1}


def test_float64_sentinel_counts_complex128_too() -> None:
    sentinel = Float64Sentinel()
    with sentinel:
        torch.zeros(2, dtype=torch.complex128)
    assert sentinel.count == 1


def test_float64_sentinel_counts_zero_for_float32_work() -> None:
    sentinel = Float64Sentinel()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with sentinel:
        loss = model(torch.randn(5, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        torch.from_numpy(np.zeros(3, dtype=np.float64).astype(np.float32))  # made float32 on the host first
    assert sentinel.count == 0
    assert sentinel.first_site is None
    assert not sentinel.ops


@pytest.mark.parametrize("convert", [
    lambda a: torch.as_tensor(a, dtype=torch.float32),
    lambda a: torch.tensor(a, dtype=torch.float32),
    lambda a: torch.from_numpy(a).float(),
])
def test_numpy_float64_converted_to_float32_at_creation_is_not_float64_work(convert) -> None:
    """The host-side conversion of NumPy input into a float32 tensor runs no float64 on the device."""
    sentinel = Float64Sentinel()
    with sentinel:
        narrow = convert(np.zeros(3, dtype=np.float64))
        narrow * 2
    assert narrow.dtype == torch.float32
    assert sentinel.count == 0 and sentinel.first_site is None


@pytest.mark.parametrize("make, ops", [
    (lambda r: torch.tensor(r), {"aten.lift_fresh.default", "aten._to_copy.default"}),  # float64 rewards, kept
    (lambda r: torch.as_tensor(r), {"aten.lift_fresh.default"}),
    (lambda r: torch.ones(3) * torch.as_tensor(r), {"aten.lift_fresh.default", "aten.mul.Tensor"}),
    (lambda r: torch.tensor(r).float(), {"aten.lift_fresh.default", "aten._to_copy.default"}),
])
def test_a_float64_tensor_created_or_computed_is_counted_at_its_line(make, ops) -> None:
    """What breaks MPS stays caught: a float64 tensor kept from NumPy data, or float64 maths."""
    rewards = np.ones(3, dtype=np.float64)  # gymnasium's rewards
    sentinel = Float64Sentinel()
    with sentinel:
        make(rewards)
    assert set(sentinel.ops) == ops
    assert sentinel.first_site is not None and sentinel.first_site.startswith("aten.lift_fresh.default at ")
    assert all(where.startswith(__file__ + ":") for _, where in sentinel.sites)  # the user's line, not torch's


def test_float64_sentinel_stops_counting_after_its_context() -> None:
    sentinel = Float64Sentinel()
    with sentinel:
        torch.ones(1, dtype=torch.float64)
    torch.ones(1, dtype=torch.float64) * 2
    assert sentinel.count == 1


# --------------------------------------------------------------------------- the sync counter on the CPU
# One counter for run and diagnose: harness.diagnosis.host_syncs.HostSyncFinder.

def _counter(device: str) -> HostSyncFinder:
    return HostSyncFinder(torch.device(device), SiteFinder())


def _kinds(counter: HostSyncFinder) -> dict[str, int]:
    found: dict[str, int] = {}
    for (kind, _, _), count in counter.sites.items():
        found[kind] = found.get(kind, 0) + count
    return found


def test_host_sync_counter_on_cpu_counts_each_host_read() -> None:
    counter = _counter("cpu")
    x = torch.arange(4, dtype=torch.float32)
    with counter:
        x.sum().item()
        x.tolist()
        float(x.sum())
        int(x[1])
        bool(x[1] > 0)
    assert counter.count == 5
    assert _kinds(counter) == {ITEM: 3, HOST_COPY: 1, BRANCH: 1}


def test_host_sync_counter_on_cpu_counts_cpu_numpy_once() -> None:
    counter = _counter("cpu")
    x = torch.arange(4, dtype=torch.float32)
    with counter:
        array = x.cpu().numpy()
        x.to("cpu")  # a no-op on the CPU: free
    assert isinstance(array, np.ndarray)
    assert counter.count == 1 and _kinds(counter) == {HOST_COPY: 1}


def test_host_sync_counter_counts_nothing_for_device_side_work() -> None:
    counter = _counter("cpu")
    x = torch.randn(8)
    with counter:
        y = (x * 2).softmax(-1)
        y = y.to(torch.float32)
        torch.multinomial(y, 1)
    assert counter.count == 0


def test_host_sync_counter_counts_nothing_once_left_even_after_an_exception() -> None:
    counter = _counter("cpu")
    with pytest.raises(RuntimeError, match="inside"), counter:
        torch.ones(1).item()
        raise RuntimeError("inside")
    torch.ones(2).sum().item()
    torch.ones(2).cpu().numpy()
    assert counter.count == 1


def test_host_sync_counter_returns_the_original_results() -> None:
    x = torch.tensor([1.5, 2.5])
    with _counter("cpu"):
        assert x.tolist() == [1.5, 2.5]
        assert x[0].item() == 1.5
        assert float(x[1]) == 2.5
        assert x.to(torch.float16).dtype == torch.float16
        np.testing.assert_array_equal(x.cpu().numpy(), np.array([1.5, 2.5], dtype=np.float32))


# --------------------------------------------------------------------------- the sync counter for an accelerator

def test_host_sync_counter_for_cuda_does_not_count_cpu_copies_of_cpu_tensors() -> None:
    # Only device.type is read, so this runs without CUDA: the tensors here all live on the CPU.
    counter = _counter("cuda")
    x = torch.arange(3, dtype=torch.float32)
    with counter:
        x.cpu()
        x.to("cpu")
        x.to(device="cpu")
        x.to(torch.device("cpu"))
        x.numpy()
    assert counter.count == 0


def test_host_sync_counter_for_cuda_ignores_scalar_reads_of_host_tensors() -> None:
    """Scalar reads of host tensors (e.g. optimiser step counters) never synchronise a GPU."""
    counter = _counter("cuda")
    x = torch.arange(3, dtype=torch.float32)
    with counter:
        x.sum().item()
        x.tolist()
        float(x[0])
    assert counter.count == 0


def test_host_sync_counter_on_cpu_counts_the_forloop_optimizers_step_counters_as_the_optimizers() -> None:
    """The for-loop Adam reads its step counters with .item() (one per parameter per step): counted on the CPU as
    on any host read, and attributed to the optimizer (diagnose points them to the fused implementation)."""
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([param], foreach=False)
    param.grad = torch.ones(3)
    counter = _counter("cpu")
    with counter:
        optimizer.step()
        optimizer.step()
        param.sum().item()
    via: dict[str | None, int] = {}
    for (_, _, library), count in counter.sites.items():
        via[library] = via.get(library, 0) + count
    assert counter.count == 3 and via == {"torch.optim": 2, None: 1}
    fused = torch.optim.Adam([param], fused=True)
    counter = _counter("cpu")
    with counter:
        fused.step()
    assert counter.count == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_host_sync_counter_for_cuda_counts_copies_of_device_tensors() -> None:
    counter = _counter("cuda")
    x = torch.arange(3, dtype=torch.float32, device="cuda")
    with counter:
        x.cpu()
        x.to("cpu")
        x.to(device="cpu")
        x.to("cuda")  # device to device: no sync
    assert counter.count == 3


# --------------------------------------------------------------------------- what the runner reports

def test_runner_reports_per_env_host_syncs_for_baseline_and_about_one_per_step_for_optimized(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    num_envs = 4
    out = tmp_path / "r.json"
    argv = ["run", "ppo-cartpole", *[a for item in TINY for a in ("--set", item)],
            "--set", f"env.num_envs={num_envs}", "--out", str(out), "--quiet"]
    code = main(argv)
    assert code == 0, capsys.readouterr().err
    baseline, optimized = json.loads(out.read_text(encoding="utf-8"))["runs"]
    base_syncs = baseline["metrics"]["host_syncs_per_step"]
    opt_syncs = optimized["metrics"]["host_syncs_per_step"]
    assert base_syncs >= num_envs  # one .cpu().numpy() per sub-env per step, plus .item() per logged value
    assert 1 <= opt_syncs < 2  # one host copy of the actions per step (+ one per log interval)
    assert base_syncs > 2 * opt_syncs


def test_the_checked_iteration_runs_a_compiled_step_eagerly_without_a_compile_fallback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The float64 check's dispatch mode cannot enter compiled code: the runner runs that iteration
    eagerly by stance, so a step that compiled and trained is not reported as a compile fallback."""
    out = tmp_path / "r.json"
    argv = ["run", "ppo-cartpole", "--variant", "optimized", *[a for item in TINY for a in ("--set", item)],
            "--set", "optimizations.compile_train_step=true", "--set", "optimizations.compile_cpp_wrapper=false",
            "--out", str(out), "--quiet"]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    run = json.loads(out.read_text(encoding="utf-8"))["runs"][0]
    assert run["resolution"].get("optimizations.compile_train_step") is None  # set, not auto
    assert run["stability"] == {"float64_ops": 0, "nonfinite_events": 0, "compile_fallback": False, "passed": True}
    lookups = run["metrics"]["inductor_cache"]  # the compile was a cold one or a load from the cache
    assert set(lookups) == {"hit", "miss", "bypass"} and lookups["hit"] + lookups["miss"] >= 1
