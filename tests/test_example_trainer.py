"""The CleanRL-style example trainer (examples/cleanrl_ppo): the bring-your-own-trainer contract,
and every speed switch observed taking its own code path without changing the maths."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

pytest_plugins = ["pytester"]

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples" / "cleanrl_ppo"
TINY = {"num_envs": 2, "num_steps": 16, "num_minibatches": 2, "update_epochs": 1}
STEPS = TINY["num_envs"] * TINY["num_steps"]


@pytest.fixture
def ppo() -> Iterator:
    """The example module, imported from examples/cleanrl_ppo as a user's rlgauge run would."""
    sys.path.insert(0, str(EXAMPLE_DIR))
    sys.modules.pop("ppo_cartpole", None)
    try:
        yield importlib.import_module("ppo_cartpole")
    finally:
        sys.path.remove(str(EXAMPLE_DIR))
        sys.modules.pop("ppo_cartpole", None)


@pytest.fixture
def make(ppo) -> Iterator[Callable]:
    """``make(seed=0, probe=None, **switches)``: a tiny trainer, closed after the test."""
    made = []

    def _make(seed: int = 0, probe=None, **switches):
        made.append(ppo.make_trainer({**TINY, **switches}, device="cpu", seed=seed, probe=probe))
        return made[-1]

    yield _make
    for trainer in made:
        trainer.close()


class RecordingProbe:
    """Knows the current phase and records ``on_enter()`` at each phase entry."""

    def __init__(self, on_enter: Callable[[], object] = lambda: None) -> None:
        self.on_enter, self.current, self.seen = on_enter, None, {}

    @contextlib.contextmanager
    def phase(self, name: str):
        self.seen.setdefault(name, []).append(self.on_enter())
        outer, self.current = self.current, name
        try:
            yield
        finally:
            self.current = outer


def params(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.agent.parameters()]


def assert_close(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 0.0) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=atol, rtol=0.0)


def test_iterate_takes_its_steps_and_learns(make) -> None:
    trainer = make()
    before = params(trainer)
    assert trainer.mean_recent_return() is None
    assert trainer.iterate() == STEPS
    assert any(not torch.equal(x, y) for x, y in zip(before, params(trainer)))
    for _ in range(3):
        trainer.iterate()
    assert trainer.global_step == 4 * STEPS
    assert isinstance(trainer.mean_recent_return(), float)  # a random CartPole policy ends episodes in ~20 steps


def test_vectorization_switch_builds_async_envs_with_the_same_maths(make) -> None:
    sync = make(seed=4)
    assert isinstance(sync.envs, gym.vector.SyncVectorEnv)
    for _ in range(3):
        sync.iterate()
    asyn = make(seed=4, vectorization="async")  # made after: trainers share the global RNGs they seed
    assert isinstance(asyn.envs, gym.vector.AsyncVectorEnv)
    for _ in range(3):
        asyn.iterate()
    assert_close(params(sync), params(asyn))
    assert asyn.mean_recent_return() == sync.mean_recent_return() is not None


def test_torch_threads_switch_is_reapplied_inside_each_iterate(make) -> None:
    torch.set_num_threads(2)
    plain_probe = RecordingProbe(torch.get_num_threads)
    plain = make(probe=plain_probe)
    capped_probe = RecordingProbe(torch.get_num_threads)
    capped = make(probe=capped_probe, torch_threads=1)
    assert torch.get_num_threads() == 1  # applied by make_trainer
    plain.iterate()  # null: keeps the count in effect when that trainer was made
    assert set(plain_probe.seen["env"]) == {2}
    capped.iterate()
    assert set(capped_probe.seen["env"]) == {1}


def test_batched_inference_switch_uses_inference_mode_and_no_distribution(make, ppo, monkeypatch) -> None:
    constructed: list[str | None] = []

    def run(**switches) -> tuple[set, list]:
        probe = RecordingProbe()
        trainer = make(probe=probe, **switches)

        class CountingCategorical(ppo.Categorical):
            def __init__(self, *args, **kwargs):
                constructed.append(probe.current)
                super().__init__(*args, **kwargs)

        monkeypatch.setattr(ppo, "Categorical", CountingCategorical)
        modes = set()
        trainer.agent.actor.register_forward_pre_hook(
            lambda _m, _x: modes.add((probe.current, torch.is_inference_mode_enabled(), torch.is_grad_enabled())))
        constructed.clear()
        trainer.iterate()
        return {m for m in modes if m[0] == "inference"}, list(constructed)

    modes, built = run()
    assert modes == {("inference", False, False)}  # torch.no_grad()
    assert built.count("inference") == TINY["num_steps"]
    modes, built = run(batched_inference_no_grad=True)
    assert modes == {("inference", True, False)}  # torch.inference_mode()
    assert "inference" not in built and "update" in built  # the update still builds its distributions


def test_batched_inference_gives_the_plain_action_probabilities(make) -> None:
    trainer = make()
    obs = torch.randn(64, 4)
    torch.manual_seed(5)
    fast_action, fast_logprob, fast_value = trainer.agent.act_fast(obs)
    torch.manual_seed(5)
    action, logprob, _, value = trainer.agent.get_action_and_value(obs)
    assert torch.equal(fast_action, action)
    torch.testing.assert_close(fast_logprob, logprob)
    torch.testing.assert_close(fast_value, value)
    _, plain_logprob, _, _ = trainer.agent.get_action_and_value(obs, fast_action)
    torch.testing.assert_close(fast_logprob, plain_logprob)


def test_fused_adam_switch_runs_the_fused_kernel(make, monkeypatch) -> None:
    calls = []
    real = torch._fused_adam_
    monkeypatch.setattr(torch, "_fused_adam_", lambda *a, **k: calls.append(1) or real(*a, **k))
    plain = make()
    plain.iterate()
    assert not plain.optimizer.param_groups[0]["fused"] and not calls
    fused = make(fused_adam=True)
    assert fused.optimizer.param_groups[0]["fused"] is True
    fused.iterate()
    assert len(calls) == TINY["update_epochs"] * TINY["num_minibatches"]


def test_validate_args_switch_turns_the_distribution_checks_off(make) -> None:
    """The plain path validates each Categorical's arguments (host syncs in torch.distributions); the switch
    builds it with validate_args=False: no sync from there, the same numbers."""
    from harness.diagnosis.frames import SiteFinder
    from harness.diagnosis.host_syncs import HostSyncFinder

    def distribution_syncs(**switches) -> int:
        trainer = make(seed=5, **switches)
        counter = HostSyncFinder(torch.device("cpu"), SiteFinder())
        with counter:
            trainer.iterate()
        return sum(n for (_, _, via), n in counter.sites.items() if via == "torch.distributions")

    assert distribution_syncs() >= TINY["num_steps"] and distribution_syncs(validate_args=False) == 0
    plain = make(seed=5)
    plain.iterate()
    fast = make(seed=5, validate_args=False)  # made after the plain one ran: both start from the seed's RNG
    fast.iterate()
    assert_close(params(fast), params(plain), atol=0)


def test_preallocated_storage_switch_converts_once_per_rollout(make, monkeypatch) -> None:
    calls = []
    for name in ("from_numpy", "as_tensor"):
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))

    def conversions(**switches) -> int:
        trainer = make(**switches)
        calls.clear()
        trainer.iterate()
        return len(calls)

    plain = conversions()
    numpy_buffers = conversions(preallocated_storage=True)
    assert plain >= 3 * TINY["num_steps"]  # obs, reward and done flags every step
    assert numpy_buffers <= TINY["num_steps"] + 8  # the policy's obs every step, then one per buffer
    assert numpy_buffers < plain


@pytest.mark.parametrize("switches", [
    {"fused_adam": True, "preallocated_storage": True, "batched_inference_no_grad": False},
    {"fused_adam": True, "preallocated_storage": True, "batched_inference_no_grad": True},
    {"fused_adam": True, "preallocated_storage": True, "validate_args": False},
], ids=["fused+prealloc", "fused+prealloc+batched", "fused+prealloc+no-checks"])
def test_optimised_paths_do_the_same_maths(make, switches) -> None:
    plain = make(seed=7)
    plain.iterate()
    expected = params(plain)
    fast = make(seed=7, **switches)
    fast.iterate()
    assert_close(params(fast), expected, atol=1e-5)


def test_state_dict_round_trip_resumes_identically(make, tmp_path) -> None:
    original = make(seed=3, preallocated_storage=True)
    original.iterate()
    original.iterate()
    state = original.state_dict()
    torch.save(state, tmp_path / "ckpt.pt")
    loaded_state = torch.load(tmp_path / "ckpt.pt", weights_only=True)

    resumed = make(seed=99, preallocated_storage=True)  # its own seed is replaced by the saved one
    resumed.load_state_dict(loaded_state)
    assert_close(params(resumed), params(original))
    assert resumed.global_step == original.global_step
    assert resumed.mean_recent_return() == original.mean_recent_return()
    resumed.iterate()

    original.load_state_dict(state)  # the original resuming from its own checkpoint
    original.iterate()
    assert_close(params(resumed), params(original))


def test_unknown_config_key_is_named(ppo) -> None:
    with pytest.raises(ValueError, match="fused_adma") as err:
        ppo.make_trainer({"fused_adma": True}, device="cpu", seed=0)
    assert "\n" not in str(err.value) and "fused_adam" in str(err.value)


class DtypeRecorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.dtypes.update(t.dtype for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


@pytest.mark.parametrize("switches", [{}, {"preallocated_storage": True, "fused_adam": True,
                                           "batched_inference_no_grad": True}], ids=["plain", "optimised"])
def test_no_float64_anywhere(make, switches) -> None:
    from harness.measurement.sentinels import Float64Sentinel

    trainer = make(**switches)
    with DtypeRecorder() as recorder, Float64Sentinel() as dispatched:  # rlgauge's own sentinel sees every kernel
        trainer.iterate()
    assert torch.float32 in recorder.dtypes and torch.float64 not in recorder.dtypes
    assert dispatched.count == 0, dispatched.first_site
    assert {p.dtype for p in trainer.agent.parameters()} == {torch.float32}
    for name, buf in trainer.buffers.items():
        assert buf.dtype in ((np.int64, torch.float32) if name == "actions" else (np.float32, torch.float32)), name


@pytest.mark.slow
def test_the_examples_own_speed_gate_passes_or_gives_no_verdict(pytester: pytest.Pytester) -> None:
    """``examples/cleanrl_ppo/test_speed.py`` run as a user runs it: the plugin's fixture gates
    bench.yaml (at a smaller budget here); a busy machine may give no verdict (skip), never a failure."""
    import shutil

    example = Path(__file__).resolve().parents[1] / "examples" / "cleanrl_ppo"
    for name in ("ppo_cartpole.py", "bench.yaml", "test_speed.py"):
        shutil.copy(example / name, pytester.path / name)
    bench = pytester.path / "bench.yaml"
    bench.write_text(bench.read_text().replace("run: {steps: 4096, warmup_steps: 1024, repeats: 3}",
                                               "run: {steps: 512, warmup_steps: 256, repeats: 3}"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "test_speed.py")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 1
