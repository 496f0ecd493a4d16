"""Flag-effect tests for the environment and host->device flags: the vector env each
vectorisation builds and steps, the env frames per decision under action repeat, and the dtype,
memory and blocking of the observation copies. Each shows the optimised path taken when the flag
is on and the plain path when it is off, by what happens while ``iterate()`` runs.
Registry coverage: tests/test_flag_registry.py reads the ``flag_effect`` markers."""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from typing import Any

import gymnasium as gym
import pytest
import torch
from flag_effects import PIXELS, running, spy
from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv

from reference_trainers.envs.envpool_backend import EnvPoolVectorEnv
from reference_trainers.envs.serial_backend import SerialVectorEnv

VECTOR_STEPS = 8
"""Vector-env steps in one iteration of ``flag_effects.TINY``: PPO's rollout, DQN's 24 decisions of 3 sub-envs."""
VECTOR_ENVS: dict[str, type[gym.vector.VectorEnv]] = {
    "serial": SerialVectorEnv, "sync": gym.vector.SyncVectorEnv, "async": gym.vector.AsyncVectorEnv,
    "native": CartPoleVectorEnv, "envpool": EnvPoolVectorEnv,
}
IN_PROCESS = {"serial", "sync"}
"""Modes whose single envs step in this process (async steps them in workers; native and envpool have none)."""
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
needs_envpool = pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool")


# --------------------------------------------------------------------------- env.vectorization

@pytest.mark.flag_effect("env.vectorization", "sync")
@pytest.mark.flag_effect("env.vectorization", "async")
@pytest.mark.flag_effect("env.vectorization", "native")
@pytest.mark.flag_effect("env.vectorization", "envpool")
@pytest.mark.parametrize(("algo", "mode"), [
    ("ppo", "serial"), ("ppo", "sync"), ("ppo", "async"), ("ppo", "native"),
    pytest.param("ppo", "envpool", marks=needs_envpool), ("dqn", "serial"), ("dqn", "sync"), ("dqn", "native"),
])
def test_vectorization_builds_and_steps_the_chosen_vector_env(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                              mode: str) -> None:
    """Each mode builds its own vector env class, and every vector step of iterate() goes through it."""
    # serial: the project's loop over single envs; sync: gymnasium's SyncVectorEnv; async: AsyncVectorEnv,
    # single envs stepped in worker processes; native: CartPole's own vectorised env; envpool: EnvPool's pool
    cls = VECTOR_ENVS[mode]
    vector_steps = spy(monkeypatch, cls, "step")
    single_steps = spy(monkeypatch, CartPoleEnv, "step")
    with running(algo, f"env.vectorization={mode}") as trainer:
        envs = trainer.envs
        trainer.iterate()
        workers = [process.pid for process in getattr(envs, "processes", [])]
    assert isinstance(envs, cls)
    assert not any(isinstance(envs, other) for name, other in VECTOR_ENVS.items() if name != mode)
    assert len(vector_steps) == VECTOR_STEPS
    assert (len(single_steps) > 0) is (mode in IN_PROCESS)
    if mode == "async":
        assert len(workers) == 3 and os.getpid() not in workers


# --------------------------------------------------------------------------- env.action_repeat

@pytest.mark.flag_effect("env.action_repeat")
@pytest.mark.flag_effect("env.action_repeat", "2")
@pytest.mark.flag_effect("env.action_repeat", "4")
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
@pytest.mark.parametrize(("repeat", "at_least"), [(1, 0.0), (2, 1.5), (4, 2.0)])
def test_action_repeat_steps_the_env_k_times_per_decision(monkeypatch: pytest.MonkeyPatch, algo: str, repeat: int,
                                                          at_least: float) -> None:
    """Plain: at most one env step per decision; k: up to k env steps (frames) per decision."""
    single_steps = spy(monkeypatch, CartPoleEnv, "step")
    with running(algo, f"env.action_repeat={repeat}") as trainer:
        result = trainer.iterate()
    frames = len(single_steps)
    assert frames == result.env_steps if repeat > 1 else frames <= result.env_steps
    assert at_least * result.agent_steps < frames <= repeat * result.agent_steps


# --------------------------------------------------------------------------- host->device copies

def observation_copies(monkeypatch: pytest.MonkeyPatch, trainer: Any) -> list[torch.dtype]:
    """The dtype of every observation batch the trainer's host->device copier hands the device."""
    copier = type(trainer.to_device)
    real = copier.observations
    dtypes: list[torch.dtype] = []

    def observations(self: Any, *args: Any) -> torch.Tensor:
        out = real(self, *args)
        dtypes.append(out.dtype)
        return out

    monkeypatch.setattr(copier, "observations", observations)
    return dtypes


@pytest.mark.flag_effect("optimizations.uint8_transfer")
@pytest.mark.parametrize("algo", ["ppo", "dqn", "iqn"])
@pytest.mark.parametrize("uint8", [False, True])
def test_uint8_transfer_copies_pixels_as_uint8_into_the_network(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                                uint8: bool) -> None:
    """Plain: pixels cross to the device and enter the network as float32; on: as uint8."""
    taken: list[torch.dtype] = []
    with running(algo, *PIXELS, f"optimizations.uint8_transfer={str(uint8).lower()}") as trainer:
        crossed = observation_copies(monkeypatch, trainer)
        trainer.model.register_forward_pre_hook(lambda _module, inputs: taken.append(inputs[0].dtype))
        assert trainer.iterate().updates > 0
    expected = torch.uint8 if uint8 else torch.float32
    assert crossed and set(crossed) == {expected}
    assert taken and set(taken) == {expected}


def cuda_copies(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """(source page-locked, non_blocking) of every host->CUDA ``Tensor.to`` copy."""
    real = torch.Tensor.to
    copies: list[tuple[bool, bool]] = []

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.device.type == "cpu" and out.device.type == "cuda":
            copies.append((self.is_pinned(), bool(kwargs.get("non_blocking", False))))
        return out

    monkeypatch.setattr(torch.Tensor, "to", to)
    return copies


@needs_cuda
@pytest.mark.flag_effect("optimizations.pinned_memory")
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
@pytest.mark.parametrize("pinned", [False, True])
def test_pinned_memory_copies_from_page_locked_staging(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                       pinned: bool) -> None:
    """Plain: host->device copies from pageable memory; on: the per-step copies from page-locked buffers."""
    copies = cuda_copies(monkeypatch)
    with running(algo, "device=cuda", "optimizations.batch_inference=true",
                 f"optimizations.pinned_memory={str(pinned).lower()}") as trainer:
        trainer.iterate()
    from_pinned = Counter(source for source, _ in copies)
    assert from_pinned[True] >= VECTOR_STEPS if pinned else from_pinned[True] == 0
    assert copies


@needs_cuda
@pytest.mark.flag_effect("optimizations.non_blocking")
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
@pytest.mark.parametrize("non_blocking", [False, True])
def test_non_blocking_issues_asynchronous_host_to_device_copies(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                                non_blocking: bool) -> None:
    """Plain: blocking host->device copies; on: the per-step copies issued with non_blocking=True."""
    copies = cuda_copies(monkeypatch)
    with running(algo, "device=cuda", "optimizations.batch_inference=true",
                 f"optimizations.non_blocking={str(non_blocking).lower()}") as trainer:
        trainer.iterate()
    asynchronous = Counter(flag for _, flag in copies)
    assert asynchronous[True] >= VECTOR_STEPS if non_blocking else asynchronous[True] == 0
    assert copies
