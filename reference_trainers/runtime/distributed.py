"""Data-parallel training (``distributed.enabled``) over processes started by ``torchrun``.

The process group comes from torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``); the backend is gloo on CPU and NCCL on
CUDA. Each rank steps its own envs: rank r seeds its envs and generators with
``seed + r * num_envs``, as if its sub-envs were copies r*N .. r*N+N-1 of one large vector
env; the network starts from ``seed`` on every rank (and DDP broadcasts rank 0's weights).
The shared ``Learner`` wraps the model in ``DistributedDataParallel``, which averages the
gradients of every optimiser step over the ranks, so parameters stay identical.
Guarded by tests/test_distributed.py (two gloo processes on CPU).
"""

from __future__ import annotations

import datetime as dt
import os
import inspect
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def missing_torchrun_variables() -> list[str]:
    """torchrun's environment variables this process lacks (none when launched by torchrun)."""
    return [name for name in TORCHRUN_VARIABLES if name not in os.environ]


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_active() -> bool:
    """True once this process has joined a process group."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_active() else 0


def world_size() -> int:
    return dist.get_world_size() if is_active() else 1


def is_main_process() -> bool:
    """Rank 0 (or a single process): the one that prints and writes results."""
    return rank() == 0


def setup(backend: str, device: torch.device, timeout_s: int) -> None:
    """Join the process group described by torchrun's environment (once per process)."""
    if is_active():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, timeout=dt.timedelta(seconds=timeout_s))


def join(config: Any, device: torch.device) -> None:
    """Join the process group if ``config`` (a resolved ``DistributedConfig``) enables it."""
    if config.enabled:
        setup(config.backend, device, config.timeout_s)


def rank_seed(seed: int, num_envs: int) -> int:
    """The seed of this rank's envs and generators: ``seed + rank * num_envs`` (``seed`` on rank 0)."""
    return seed + rank() * num_envs


def wrap_model(model: nn.Module, device: torch.device) -> DistributedDataParallel:
    """DDP over ``model`` (its parameters stay shared): gradients are averaged in ``backward``."""
    device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, **_NO_FORWARD_BUFFER_SYNC)


# The models keep no buffers that need syncing before each forward; torch 2.13 renamed the switch.
_NO_FORWARD_BUFFER_SYNC = ({"forward_sync_buffers": False}
                           if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
                           else {"broadcast_buffers": False})


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def agreed_min(value: int) -> int:
    """The smallest ``value`` over the ranks (``value`` itself in a single process).

    Loop decisions taken on this (warm-up done, repeat done, checkpoint due, replay ready)
    are the same on every rank, so every rank runs the same optimiser steps in step.
    """
    if not is_active():
        return int(value)
    tensor = torch.tensor([int(value)], dtype=torch.int64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def gather(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (``[value]`` in a single process)."""
    if not is_active():
        return [value]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, value)
    return out


def teardown() -> None:
    """Leave the process group (if joined)."""
    if is_active():
        dist.destroy_process_group()
