"""Data-parallel training (``distributed.enabled``): two gloo processes on CPU keep identical
parameters while stepping different envs; the config is checked against torchrun's environment."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from conftest import TINY
from distributed_worker import train_rank
from reference_trainers.config.schema import ConfigError, build_config
from reference_trainers.config.resolve import resolve_config

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


DQN_EXTRA = ["dqn.prioritized_replay=true", "dqn.n_step=2"]
JOBS = {"ppo": ("ppo", 3, []), "dqn": ("dqn", 3, DQN_EXTRA), "iqn": ("iqn", 3, ["optimizations.replay=tensor"]),
        "ppo-lstm": ("ppo", 3, ["model.recurrent=lstm", "model.recurrent_size=8", "env.id=CartPoleNoVel-v1"]),
        "ppo resumed": ("ppo", 3, [], 1), "dqn resumed": ("dqn", 3, DQN_EXTRA, 2)}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """PPO, DQN and IQN trained by two spawned gloo ranks (one spawn: torch imports once per rank)."""
    out = tmp_path_factory.mktemp("ddp")
    mp.start_processes(train_rank, args=(2, free_port(), list(JOBS.values()), str(out)), nprocs=2,
                       start_method="spawn")
    reports = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]
    return {algo: [reports[0][i], reports[1][i]] for i, algo in enumerate(JOBS)}


@pytest.mark.parametrize("algo", ["ppo", "dqn", "iqn", "ppo-lstm"])
def test_two_ranks_keep_identical_parameters_while_stepping_different_envs(
        algo: str, two_ranks: dict[str, list[dict]]) -> None:
    ranks = two_ranks[algo]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["updates"] == ranks[1]["updates"] > 0
    assert not torch.equal(ranks[0]["first_obs"], ranks[1]["first_obs"])  # each rank seeds its own envs
    for a, b in zip(ranks[0]["params"], ranks[1]["params"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_each_rank_resumed_from_its_own_checkpoint_ends_where_the_uninterrupted_ranks_do(
        algo: str, two_ranks: dict[str, list[dict]]) -> None:
    for straight, resumed in zip(two_ranks[algo], two_ranks[f"{algo} resumed"]):
        assert straight["updates"] == resumed["updates"]
        for a, b in zip(straight["params"], resumed["params"]):
            assert torch.equal(a, b)


@pytest.mark.slow
def test_compiled_model_under_ddp_keeps_ranks_identical_without_falling_back(tmp_path: Path) -> None:
    jobs = [("ppo", 2, ["optimizations.compile_model=true", "optimizations.batch_inference=true"])]
    mp.start_processes(train_rank, args=(2, free_port(), jobs, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True)[0] for r in range(2)]
    assert not any(r["compile_fallback"] for r in ranks)
    for a, b in zip(ranks[0]["params"], ranks[1]["params"]):
        assert torch.equal(a, b)


def test_one_rank_of_ddp_trains_exactly_like_a_single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """With one rank, DDP's averaged gradients are the plain ones: the same parameters as without it."""
    from distributed_worker import train
    from reference_trainers import build_trainer
    from reference_trainers.runtime import distributed

    for name, value in {**TORCHRUN_ENV, "WORLD_SIZE": "1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    try:
        with_ddp = train("ppo", 2, [])
    finally:
        distributed.teardown()
    config = build_config({}, ["device=cpu", "algo=ppo", "env.num_envs=2", "env.vectorization=sync",
                               "model.hidden_sizes=[16,16]", "ppo.num_steps=16", "ppo.num_minibatches=2",
                               "ppo.update_epochs=2"])
    trainer = build_trainer(resolve_config(config))
    for _ in range(2):
        trainer.iterate()
    assert with_ddp["world_size"] == 1
    for a, b in zip(with_ddp["params"], trainer.model.parameters()):
        assert torch.equal(a, b.detach())


# --------------------------------------------------------------------------- config checks

TORCHRUN_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_enabled_without_torchrun_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match=r"distributed.enabled: true needs the environment torchrun sets .*torchrun --nproc-per-node"):
        resolve_config(build_config({}, ["device=cpu", "distributed.enabled=true"]))


@pytest.mark.parametrize("overrides,message", [
    (["distributed.backend=nccl"], "distributed.backend: 'nccl' needs CUDA"),
    (["optimizations.compile_train_step=true"], "optimizations.compile_train_step: true cannot be used here (DDP all-reduces"),
    (["distributed.timeout_s=0"], "distributed.timeout_s: invalid value 0"),
    (["distributed.enabled=1"], "distributed.enabled: invalid value 1: expected true or false"),
    (["distributed.world=2"], "distributed.world: unknown key"),
])
def test_distributed_settings_are_validated(overrides: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        resolve_config(build_config({}, ["device=cpu", "distributed.enabled=true", *overrides]))


def test_backend_auto_is_gloo_on_cpu_and_compile_train_step_auto_stays_off(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    res = resolve_config(build_config({}, ["device=cpu", "distributed.enabled=true", "optimizations.compile_train_step=auto"]))
    assert res.config.distributed.backend == "gloo"
    assert res.config.optimizations.compile_train_step is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_cannot_capture_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="optimizations.cuda_graphs: true cannot be used here \\(a graph cannot capture DDP's gradient all-reduce"):
        resolve_config(build_config({}, ["device=cuda", "distributed.enabled=true", "optimizations.cuda_graphs=true"]))


# --------------------------------------------------------------------------- torchrun

def test_torchrun_two_ranks_writes_one_result_with_summed_throughput(tmp_path: Path) -> None:
    """``torchrun --nproc-per-node 2 -m harness run``: rank 0 alone writes, env steps/sec summed over ranks."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    out = tmp_path / "r.json"
    sets = [arg for item in TINY for arg in ("--set", item)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "harness", "run",
                           "ppo-cartpole", *sets, "--set", "distributed.enabled=true", "--variant", "optimized",
                           "--quiet", "--out", str(out), "--checkpoint-every", "64"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("env_steps_per_sec (median") == 1  # one table, from rank 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["machine"]["world_size"] == 2 and run["config"]["distributed"]["backend"] == "gloo"
    assert run["steps_completed"] >= 2 * 64
    summed, by_rank = run["metrics"]["env_steps_per_sec"], run["metrics"]["env_steps_per_sec_by_rank"]
    assert len(by_rank) == 2
    assert summed["samples"] == pytest.approx([a + b for a, b in zip(by_rank[0]["samples"], by_rank[1]["samples"])])
    for rank in range(2):  # each rank checkpoints its own envs, replay and RNG
        saved = torch.load(tmp_path / "checkpoints" / f"ppo-cartpole.rank{rank}.ckpt.pt", weights_only=True)
        assert saved["finished"] and saved["variants"]["optimized"]["trainer"]["rank"] == rank
