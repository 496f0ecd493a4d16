"""The gated timing benchmarks (``benchmarks/bench_relative.py``): a trainer's CPU time divided by a
fixed yardstick's, slice by slice, so that the machine's speed cancels and the code's cost stays."""

from __future__ import annotations

import time

import pytest

from benchmarks import bench_relative, common, reference_work


def _busy(seconds: float) -> None:
    end = reference_work.cpu_seconds() + seconds
    while reference_work.cpu_seconds() < end:
        pass


class _FakeReference:
    """A yardstick whose slices cost what the test says: the machine's speed, as the slices see it."""

    def __init__(self, speed: list[float]) -> None:
        self.speed = speed  # the machine's slowness factor, changed by the slots below

    def unit(self) -> None:
        pass

    def slice(self) -> float:
        return 0.01 * self.speed[0]

    def close(self) -> None:
        pass


def test_a_slot_costs_its_cpu_time_over_the_mean_of_the_reference_slices_around_it() -> None:
    speed = [1.0]

    def slot(repeats: int) -> float:
        _busy(0.004 * repeats)
        return float(repeats)

    (cost,) = reference_work.measure_paired([slot], rounds=3, reference=_FakeReference(speed), min_slice_seconds=0.0)
    assert len(cost.ratios) == 3
    assert cost.median == pytest.approx(0.4, rel=0.25)  # 4 ms of work per 10 ms reference slice


def test_a_machine_that_slows_down_slows_the_reference_alike_and_the_ratio_holds() -> None:
    """The machine halves its speed between rounds: raw slot time doubles, the yardstick's too."""
    speed = [1.0]
    spent: list[float] = []

    def slot(repeats: int) -> float:
        start = reference_work.cpu_seconds()
        _busy(0.003 * speed[0])
        spent.append(reference_work.cpu_seconds() - start)
        return 1.0

    reference = _FakeReference(speed)
    costs = []
    for slowness in (1.0, 2.0):
        speed[0] = slowness
        costs.append(reference_work.measure_paired([slot], rounds=3, reference=reference, min_slice_seconds=0.0)[0])
    assert spent[-1] > 1.5 * spent[0]
    assert costs[1].median == pytest.approx(costs[0].median, rel=0.25)


def test_slices_are_repeated_up_to_the_minimum_cpu_time() -> None:
    calls: list[int] = []

    def slot(repeats: int) -> float:
        calls.append(repeats)
        _busy(0.001 * repeats)
        return float(repeats)

    reference_work.measure_paired([slot], rounds=2, reference=_FakeReference([1.0]), min_slice_seconds=0.01)
    assert calls[0] == 1 and calls[1] == calls[2] >= 5  # one timed call, then the repeat count it set


def test_the_yardstick_is_real_work_of_this_suite_and_not_the_projects() -> None:
    import inspect

    source = inspect.getsource(reference_work)
    assert "from reference_trainers" not in source and "from harness" not in source
    work = reference_work.ReferenceWork()
    try:
        before = [p.detach().clone() for p in work.net.parameters()]
        start = reference_work.cpu_seconds()
        assert work.slice() > 0
        assert reference_work.cpu_seconds() - start > 0
        assert any(not (a == b).all() for a, b in zip(before, work.net.parameters()))  # it trained
    finally:
        work.close()


def test_relative_cost_measures_training_and_acting_per_unit_of_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_relative, "RELATIVE_PRESETS", ["dqn-cartpole"])
    monkeypatch.setattr(common, "WARMUP_STEPS", 64)
    monkeypatch.setattr(bench_relative, "WARMUP_STEPS", 64)
    monkeypatch.setattr(reference_work, "MIN_SLICE_SECONDS", 0.0)
    monkeypatch.setattr(reference_work, "REFERENCE_UNITS_PER_SLICE", 2)
    costs = bench_relative.measure_relative(rounds=2)
    assert set(costs) == {"dqn-cartpole/baseline/cpu", "dqn-cartpole/optimized/cpu"}
    for kinds in costs.values():
        assert set(kinds) == {"training", "acting"} and all(v > 0 for v in kinds.values())


def test_a_planted_slowdown_in_the_trainer_raises_its_cost_and_not_the_yardsticks() -> None:
    """The same code with 50 % more same-thread work in select_actions costs about 1.5x as much (one intra-op
    thread, as under asv: a second thread's waiting on a busy machine is CPU time that neither side controls). The
    plain and the slowed slot take turns in one measurement, so a change of the machine's load lands on both."""
    from reference_trainers.runtime import device as dev

    dev.cap_default_threads(1)
    trainer = common.build("dqn-cartpole", "baseline", "cpu")
    try:
        real = trainer.select_actions

        def slowed(obs):  # noqa: ANN001, ANN202
            start = time.thread_time()
            out = real(obs)
            end = time.thread_time() + 0.5 * (time.thread_time() - start)
            while time.thread_time() < end:
                pass
            return out

        obs = common.observations(trainer.config.env.id, trainer.num_envs)

        def slot(select):  # noqa: ANN001, ANN202
            def run(repeats: int) -> float:
                trainer.activate()
                for _ in range(repeats * bench_relative.ACTING_SLICE_SELECTIONS):
                    select(obs)
                return repeats * bench_relative.ACTING_SLICE_SELECTIONS / 100
            return run

        slot(real)(1)
        plain, slow = reference_work.measure_paired([slot(real), slot(slowed)], rounds=9, min_slice_seconds=0.05)
    finally:
        trainer.close()
        dev.cap_default_threads(None)
    assert 1.2 < slow.median / plain.median < 1.9


def test_relative_cost_skips_every_device_but_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "available", lambda device: True)
    monkeypatch.setattr(bench_relative, "skip_unless_available", lambda device: None)
    for device in ("cuda", "mps"):
        with pytest.raises(NotImplementedError, match="cpu device only"):
            bench_relative.RelativeCost().setup({}, "ppo-cartpole", "optimized", device)


def test_relative_cost_reads_what_its_cache_measured() -> None:
    bench = bench_relative.RelativeCost()
    costs = {"ppo-cartpole/baseline/cpu": {"training": 2.5, "acting": 1.25}}
    bench.setup(costs, "ppo-cartpole", "baseline", "cpu")
    assert bench.track_training_cost(costs, "ppo-cartpole", "baseline", "cpu") == 2.5
    assert bench.track_acting_cost(costs, "ppo-cartpole", "baseline", "cpu") == 1.25
    assert bench_relative.RelativeCost.params[0] == bench_relative.RELATIVE_PRESETS


def test_relative_cost_carries_an_explicit_version_for_its_yardstick() -> None:
    """asv versions a benchmark by its own source, which here only reads the cache: a change of the yardstick must
    bump ``version`` by hand, or old and new units would be compared."""
    assert "version" in bench_relative.RelativeCost.__dict__
    assert "RelativeCost.version" in (reference_work.__doc__ or "")


def test_the_sibling_yardstick_keeps_its_settings_whatever_the_trainers_process_set() -> None:
    """A thread count, a matmul precision, a default dtype, grad mode or anomaly detection left by the commit under
    test changes the trainer's process, never the yardstick's."""
    import torch

    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    torch.set_num_threads(2)
    torch.set_float32_matmul_precision("medium")
    torch.set_default_dtype(torch.float64)
    torch.autograd.set_detect_anomaly(True)
    try:
        with torch.no_grad():
            sibling = reference_work.SiblingReference()
    finally:
        torch.set_num_threads(threads)
        torch.set_float32_matmul_precision(precision)
        torch.set_default_dtype(torch.float32)
        torch.autograd.set_detect_anomaly(False)
    try:
        assert sibling.settings() == {"threads": 1, "interop_threads": 1, "matmul_precision": "highest",
                                      "default_dtype": "torch.float32", "grad_enabled": True,
                                      "anomaly_detection": False}
        sibling.unit()
        assert sibling.slice() > 0
    finally:
        sibling.close()
    assert sibling.process.returncode == 0


def test_a_busy_thread_in_the_trainers_process_is_charged_to_its_slices() -> None:
    """The trainer's slice costs its whole process's CPU time: a background thread's spinning counts there, and the
    yardstick in its own process does not share it (in one process, the ratio divided it away)."""
    import threading

    def slot(repeats: int) -> float:
        end = time.thread_time() + 0.004 * repeats
        while time.thread_time() < end:
            pass
        return float(repeats)

    plain = reference_work.measure_paired([slot], rounds=5, min_slice_seconds=0.03)[0].median
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        busy = reference_work.measure_paired([slot], rounds=5, min_slice_seconds=0.03)[0].median
    finally:
        stop.set()
        spinner.join()
    assert busy / plain > 1.25


def test_the_sibling_refuses_an_unknown_request_with_one_line() -> None:
    sibling = reference_work.SiblingReference()
    try:
        with pytest.raises(RuntimeError, match="unknown request 'lap'"):
            sibling._ask("lap")
    finally:
        sibling.close()
