"""Replay storage for the value-based trainers: one ``ReplayBuffer`` interface, composed of
a storage (where transitions live, ``replay_storage.py``) and a sampler (which ones a minibatch
gets).

storage  ``ListStorage``   plain: a Python list of numpy transitions, minibatches gathered
                           sample by sample and copied to the device per field
         ``TensorStorage`` preallocated device tensors, one host->device copy per insert,
                           device-side gather
         ``FrameStorage``  the tensor storage for uint8 pixels: frames kept as uint8
sampler  ``UniformSampler``      ``torch.randint`` with the buffer's own generator
         ``PrioritizedSampler``  proportional PER (``per.py``)

Both storages return identical minibatches for the same sampler state (the ``replay``
flag is in the exact parity class): guarded by tests/test_buffers.py. Every part has
``state_dict()`` / ``load_state_dict()`` (host tensors) for checkpoints.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from reference_trainers.replay.writers import TransitionBatch
from reference_trainers.replay.per import PrioritizedSampler
from reference_trainers.replay.storages import FrameStorage, ListStorage, Storage, TensorStorage, Transition
from reference_trainers.paths.speedups import HostToDevice

__all__ = ["FrameStorage", "ListStorage", "ReplayBuffer", "Sample", "Storage", "TensorStorage", "Transition",
           "UniformSampler", "make_replay"]


class Sample(NamedTuple):
    """A minibatch on the training device. ``weights`` are importance weights (PER) or None."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    bootstrap: torch.Tensor
    weights: torch.Tensor | None
    indices: torch.Tensor


class UniformSampler:
    """Uniform minibatches: ``torch.randint`` over the filled part, with its own generator."""

    def __init__(self, device: torch.device, generator: torch.Generator) -> None:
        self.device, self.generator = device, generator

    def added(self, start: int, count: int) -> None:
        """New transitions need no bookkeeping."""

    def sample(self, size: int, batch_size: int, beta: float) -> tuple[torch.Tensor, None]:
        return torch.randint(size, (batch_size,), generator=self.generator, device=self.device), None

    def update(self, indices: torch.Tensor, errors: torch.Tensor) -> None:
        """Uniform sampling keeps no priorities."""

    def state_dict(self) -> dict[str, Any]:
        """Nothing but the generator, which its owner saves."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see ``state_dict``)."""


class ReplayBuffer:
    """A ring of ``capacity`` transitions: ``add`` a step's batch, ``sample`` a minibatch,
    ``update_priorities`` after the update (a no-op for uniform sampling)."""

    def __init__(self, storage: Storage, sampler: UniformSampler | PrioritizedSampler, capacity: int) -> None:
        self.storage, self.sampler, self.capacity = storage, sampler, capacity
        self.position = 0
        self.size = 0
        # add_one_step's direct write: a storage that has one, and a sampler that keeps nothing per insert
        self._write_one_step = (getattr(storage, "write_one_step", None)
                                if isinstance(sampler, UniformSampler) else None)

    def __len__(self) -> int:
        return self.size

    def add(self, batch: TransitionBatch) -> None:
        if len(batch) > self.capacity:  # only the newest rows would survive anyway
            batch = TransitionBatch(*(field[-self.capacity:] for field in batch))
        count = len(batch)
        if count == 0:
            return
        self.storage.write(self.position, batch)
        self.sampler.added(self.position, count)
        self._advance(count)

    def _advance(self, count: int) -> None:
        """Move the ring past ``count`` rows just written."""
        self.position = (self.position + count) % self.capacity
        self.size = min(self.size + count, self.capacity)

    def add_one_step(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
                     terminated: np.ndarray, gamma: np.float32) -> bool:
        """``replay_direct_write``: ``add(OneStepWriter.push(...))`` for a step with no reset row,
        written straight into a CPU tensor storage under uniform sampling
        (``TensorStorage.write_one_step``). False, adding nothing, where that path does not apply
        (another storage or sampler, across the ring's end): the caller then takes the general one."""
        write = self._write_one_step
        if write is None or not write(self.position, obs, actions, rewards, next_obs, terminated, gamma):
            return False
        self._advance(len(actions))
        return True

    def sample(self, batch_size: int, beta: float = 1.0) -> Sample:
        return self.gather(*self.draw(batch_size, beta))

    def draw(self, batch_size: int, beta: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The sampler's half of ``sample``: (indices, importance weights or None)."""
        return self.sampler.sample(self.size, batch_size, beta)

    def gather(self, indices: torch.Tensor, weights: torch.Tensor | None) -> Sample:
        """The storage's half of ``sample``: the minibatch at ``indices`` (safe on a worker thread
        while no insert runs)."""
        return Sample(*self.storage.gather(indices), weights, indices)

    def host_gather(self, indices: torch.Tensor, weights: torch.Tensor | None) -> Sample:
        """``gather`` with NumPy arrays for the fields, from a storage in host memory that has a
        ``host_gather`` (``numpy_update``); else ``gather``."""
        host = getattr(self.storage, "host_gather", None)
        fields = host(indices) if host is not None else None
        if fields is None:
            return self.gather(indices, weights)
        return Sample(*fields, None if weights is None else weights.numpy(), indices)

    def update_priorities(self, indices: torch.Tensor, errors: torch.Tensor) -> None:
        self.sampler.update(indices, errors)

    def state_dict(self) -> dict[str, Any]:
        """Ring position and fill, stored transitions and sampler state (priorities under PER)."""
        return {"position": self.position, "size": self.size, "storage": self.storage.state_dict(),
                "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position, self.size = int(state["position"]), int(state["size"])
        self.storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])


def make_replay(kind: str, capacity: int, obs_dim: int, device: torch.device, to_device: HostToDevice,
                generator: torch.Generator, prioritized: bool = False, alpha: float = 0.6, eps: float = 1e-6,
                frame_shape: tuple[int, ...] | None = None) -> ReplayBuffer:
    """``replay: list|tensor`` picks the storage, ``prioritized_replay`` the sampler; tensor
    replay of uint8 frames (``frame_shape`` given) keeps them as uint8 in ``FrameStorage``."""
    storage: Storage
    if kind != "tensor":
        storage = ListStorage(capacity, to_device)
    elif frame_shape is not None:
        storage = FrameStorage(capacity, frame_shape, device, to_device)
    else:
        storage = TensorStorage(capacity, obs_dim, device, to_device)
    sampler = (PrioritizedSampler(capacity, alpha, eps, device, generator) if prioritized
               else UniformSampler(device, generator))
    return ReplayBuffer(storage, sampler, capacity)
