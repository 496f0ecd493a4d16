"""Ranks of small data-parallel training runs (gloo on CPU), for tests/test_distributed.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

TINY_DISTRIBUTED = {
    "ppo": ["ppo.num_steps=16", "ppo.num_minibatches=2", "ppo.update_epochs=2"],
    "dqn": ["dqn.learning_starts=32", "dqn.batch_size=16", "dqn.log_interval=32", "dqn.buffer_size=200",
            "dqn.target_update_interval=4"],
    "iqn": ["iqn.learning_starts=32", "iqn.batch_size=16", "iqn.log_interval=32", "iqn.buffer_size=200",
            "iqn.num_tau_samples=8", "iqn.num_tau_prime_samples=8", "iqn.num_quantile_samples=8"],
}


def train(algo: str, iterations: int, extra: list[str], resume_at: int | None = None) -> dict[str, Any]:
    """Build a distributed trainer (torchrun's variables already set), train, report what the test compares.

    With ``resume_at``, the trainer is rebuilt from its own ``state_dict()`` after that many iterations."""
    from reference_trainers import build_trainer
    from reference_trainers.runtime import distributed
    from reference_trainers.config.schema import build_config
    from reference_trainers.config.resolve import resolve_config

    overrides = ["device=cpu", f"algo={algo}", "env.num_envs=2", "env.vectorization=sync", "model.hidden_sizes=[16,16]",
                 "distributed.enabled=true", "distributed.timeout_s=60", *TINY_DISTRIBUTED[algo], *extra]
    resolution = resolve_config(build_config({}, overrides))
    trainer = build_trainer(resolution)
    first_obs = torch.as_tensor(trainer.next_obs, dtype=torch.float32).clone()
    for i in range(iterations):
        if i == resume_at:
            state = trainer.state_dict()
            trainer.close()
            trainer = build_trainer(resolution)
            trainer.load_state_dict(state)
        trainer.iterate()
    trainer.close()
    return {"params": [p.detach().clone() for p in trainer.model.parameters()], "first_obs": first_obs,
            "updates": trainer.updates, "world_size": distributed.world_size(),
            "compile_fallback": trainer.compile_fallback}


def train_rank(rank: int, world_size: int, port: int, jobs: list[tuple[Any, ...]], out_dir: str) -> None:
    """One rank: join the group through torchrun's variables, run every job, save the reports."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    from reference_trainers.runtime import distributed

    reports = [train(*job) for job in jobs]
    distributed.teardown()
    torch.save(reports, Path(out_dir) / f"rank{rank}.pt")
