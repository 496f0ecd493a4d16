"""Trainer checkpoints: a resumed trainer ends exactly where an uninterrupted one does, files load
with ``weights_only=True``, and bad checkpoints are refused with one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from reference_trainers import build_trainer
from reference_trainers.state.checkpoint import (FORMAT, VERSION, CheckpointError, decode_array, encode_array,
                                                  load_checkpoint, save_checkpoint)
from reference_trainers.config.schema import build_config
from reference_trainers.state.env_state import capture_env_state, restore_env_state
from reference_trainers.config.resolve import resolve_config


def tiny_config(algo: str, *extra: str):  # noqa: ANN201 - a TrainConfig
    base = ["device=cpu", "env.num_envs=2", "model.hidden_sizes=[16,16]", f"algo={algo}", "env.vectorization=sync",
            "optimizations.torch_threads=1"]
    if algo == "iqn":
        base += ["iqn.num_tau_samples=8", "iqn.num_tau_prime_samples=8", "iqn.num_quantile_samples=8",
                 "iqn.quantile_embedding_dim=16"]
    if algo == "ppo":
        base += ["ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2"]
    else:
        base += [f"{algo}.learning_starts=32", f"{algo}.batch_size=16", f"{algo}.log_interval=32",
                 f"{algo}.buffer_size=100", f"{algo}.target_update_interval=5", f"{algo}.exploration_steps=200"]
    return build_config({}, base + list(extra))


def trainer_for(config):  # noqa: ANN001, ANN201
    return build_trainer(resolve_config(config))


def parameters(trainer: Any) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in trainer.model.parameters()]
    if hasattr(trainer, "target"):
        tensors += [p.detach().clone() for p in trainer.target.parameters()]
    return tensors


def save(path: Path, trainer: Any) -> None:
    save_checkpoint(path, {"format": FORMAT, "version": VERSION, "trainer": trainer.state_dict()})


CASES = [
    ("ppo",),
    ("ppo", "env.vectorization=serial", "optimizations.batch_inference=true", "optimizations.sync_free_logging=true"),
    ("ppo", "env.vectorization=native"),
    ("ppo", "env.id=Pendulum-v1"),
    ("ppo", "env.id=Acrobot-v1", "env.action_repeat=2", "env.vectorization=serial"),
    ("dqn",),
    ("dqn", "optimizations.replay=tensor", "dqn.prioritized_replay=true", "dqn.n_step=3"),
    ("dqn", "env.vectorization=serial", "dqn.n_step=3", "dqn.double_q=true"),
    ("dqn", "optimizations.numpy_acting=true", "optimizations.batch_inference=true"),
    ("dqn", "optimizations.numpy_acting=true", "optimizations.block_noise=true", "tuning.noise_block_steps=7"),
    ("dqn", "optimizations.replay=tensor", "optimizations.replay_direct_write=true", "optimizations.optimizer_impl=fused",
     "optimizations.direct_adam_step=true"),
    ("dqn", "optimizations.replay=tensor", "dqn.buffer_size=40"),  # a full ring when the checkpoint is taken
    ("dqn", "optimizations.analytic_grads=true", "optimizations.numpy_update=true", "dqn.double_q=true"),
    ("ppo", "optimizations.numpy_acting=true", "optimizations.block_noise=true", "optimizations.lean_rollout=true",
     "optimizations.analytic_grads=true", "optimizations.numpy_update=true", "optimizations.packed_gather=true"),
    ("iqn",),
    ("iqn", "optimizations.replay=tensor", "iqn.prioritized_replay=true", "env.id=Acrobot-v1"),
    ("ppo", "model.recurrent=lstm", "model.recurrent_size=8", "env.id=CartPoleNoVel-v1"),
    ("ppo", "model.recurrent=gru", "model.recurrent_size=8", "optimizations.batch_inference=true"),
]


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c) for c in CASES])
def test_resumed_trainer_ends_with_the_parameters_of_an_uninterrupted_one(case: tuple[str, ...], tmp_path: Path) -> None:
    config = tiny_config(*case)
    straight = trainer_for(config)
    for _ in range(6):
        straight.iterate()

    first = trainer_for(config)
    for _ in range(3):
        first.iterate()
    save(tmp_path / "c.pt", first)
    first.close()
    resumed = trainer_for(config)
    resumed.load_state_dict(load_checkpoint(tmp_path / "c.pt")["trainer"])
    for _ in range(3):
        resumed.iterate()

    assert resumed.env_steps == straight.env_steps and resumed.updates == straight.updates > 0
    for a, b in zip(parameters(straight), parameters(resumed)):
        assert torch.equal(a, b)
    assert torch.equal(resumed.learner.optimizer.state_dict()["state"][0]["step"],
                       straight.learner.optimizer.state_dict()["state"][0]["step"])
    assert resumed.tracker.completed == straight.tracker.completed
    np.testing.assert_array_equal(resumed.next_obs, straight.next_obs)


def test_resume_without_the_env_state_would_diverge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The env state is what keeps episodes going: restoring everything but it changes the outcome."""
    config = tiny_config("ppo")
    straight = trainer_for(config)
    for _ in range(4):
        straight.iterate()
    first = trainer_for(config)
    for _ in range(2):
        first.iterate()
    state = first.state_dict()
    monkeypatch.setattr("reference_trainers.state.trainer_state.restore_env_state", lambda *args: None)
    resumed = trainer_for(config)
    resumed.load_state_dict(state)
    for _ in range(2):
        resumed.iterate()
    assert not all(torch.equal(a, b) for a, b in zip(parameters(straight), parameters(resumed)))


def test_checkpoint_loads_with_weights_only_and_holds_no_float64_tensor(tmp_path: Path) -> None:
    trainer = trainer_for(tiny_config("dqn", "dqn.n_step=2", "dqn.prioritized_replay=true"))
    trainer.iterate()
    save(tmp_path / "c.pt", trainer)
    payload = torch.load(tmp_path / "c.pt", weights_only=True)
    tensors: list[torch.Tensor] = []

    def walk(value: Any) -> None:
        if torch.is_tensor(value):
            tensors.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(payload)
    assert tensors and all(t.dtype != torch.float64 for t in tensors)


@pytest.mark.parametrize("array", [np.arange(6, dtype=np.float64).reshape(2, 3) / 7, np.array([True, False]),
                                   np.float64(0.1), np.zeros((0, 4), dtype=np.float32), np.arange(3, dtype=np.uint32)])
def test_arrays_survive_encoding_bit_for_bit(array: np.ndarray) -> None:
    back = decode_array(encode_array(array))
    assert back.dtype == np.asarray(array).dtype and back.shape == np.asarray(array).shape
    assert np.asarray(array).tobytes() == back.tobytes()


def test_env_state_round_trip_continues_episodes_exactly() -> None:
    from reference_trainers.envs.factory import make_vector_env

    envs = [make_vector_env("CartPole-v1", 3, "sync") for _ in range(2)]
    envs[0].reset(seed=3)
    actions = np.array([1, 0, 1])
    for _ in range(40):
        envs[0].step(actions)
    envs[1].reset(seed=99)
    restore_env_state(envs[1], capture_env_state(envs[0]))
    for _ in range(40):
        a, b = envs[0].step(actions), envs[1].step(actions)
        for x, y in zip(a[:4], b[:4]):
            np.testing.assert_array_equal(x, y)


class _OpaqueStateEnv(gym.Env):
    """An env whose state lives in an object the checkpoint cannot save."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.world = object()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_env_with_state_outside_numpy_is_refused_naming_the_attribute() -> None:
    from reference_trainers.envs.serial_backend import SerialVectorEnv

    envs = SerialVectorEnv([_OpaqueStateEnv])
    envs.reset(seed=0)
    with pytest.raises(CheckpointError, match=r"_OpaqueStateEnv\.world holds a object"):
        capture_env_state(envs)


def test_async_envs_are_refused() -> None:
    from reference_trainers.envs.factory import make_vector_env

    envs = make_vector_env("CartPole-v1", 2, "async")
    try:
        with pytest.raises(CheckpointError, match="async keeps its envs in subprocesses"):
            capture_env_state(envs)
    finally:
        envs.close()


# --------------------------------------------------------------------------- bad checkpoints

def test_missing_corrupt_and_foreign_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a zip file at all")
    with pytest.raises(CheckpointError, match="not a readable checkpoint") as err:
        load_checkpoint(tmp_path / "junk.pt")
    assert "\n" not in str(err.value)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not an rlgauge checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")
    torch.save({"format": FORMAT, "version": VERSION, "evil": _OpaqueStateEnv}, tmp_path / "pickled.pt")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path / "pickled.pt")  # arbitrary pickle is refused by weights_only


def test_state_of_another_algo_or_config_is_refused() -> None:
    ppo = trainer_for(tiny_config("ppo"))
    dqn_state = trainer_for(tiny_config("dqn")).state_dict()
    with pytest.raises(CheckpointError, match="checkpoint is of algo 'dqn', this run is 'ppo'"):
        ppo.load_state_dict(dqn_state)
    other = trainer_for(tiny_config("ppo", "ppo.learning_rate=0.001")).state_dict()
    with pytest.raises(CheckpointError, match=r"another config: ppo\.learning_rate \(checkpoint: 0\.001"):
        ppo.load_state_dict(other)
