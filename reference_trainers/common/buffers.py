"""Replay storage for the value-based trainers: one ``ReplayBuffer`` interface, composed of
a storage (where transitions live) and a sampler (which ones a minibatch gets).

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

from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from .nstep import TransitionBatch
from .per import PrioritizedSampler
from .speedups import HostToDevice


class Sample(NamedTuple):
    """A minibatch on the training device. ``weights`` are importance weights (PER) or None."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    bootstrap: torch.Tensor
    weights: torch.Tensor | None
    indices: torch.Tensor


class Transition(NamedTuple):
    """One stored transition of the list storage."""

    obs: np.ndarray
    action: int
    reward: float
    next_obs: np.ndarray
    bootstrap: float


class ListStorage:
    """Plain path: a Python list of ``Transition``s; a minibatch is gathered sample by sample,
    stacked per field on the host and copied to the device field by field."""

    def __init__(self, capacity: int, to_device: HostToDevice) -> None:
        self.capacity = capacity
        self.to_device = to_device
        self.items: list[Transition] = []

    def write(self, start: int, batch: TransitionBatch) -> None:
        """Stores copies of the observations (a batch may view arrays the env hands out again)."""
        for i, row in enumerate(zip(*batch)):
            position = (start + i) % self.capacity
            item = Transition(row[0].copy(), int(row[1]), float(row[2]), row[3].copy(), float(row[4]))
            if position == len(self.items):
                self.items.append(item)
            else:
                self.items[position] = item

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The stored transitions, field by field, in ring order (float32; actions int64)."""
        if not self.items:
            return {}
        fields = list(zip(*self.items))
        return {"obs": torch.from_numpy(np.stack(fields[0])), "actions": torch.tensor(fields[1], dtype=torch.int64),
                "rewards": torch.tensor(fields[2], dtype=torch.float32),
                "next_obs": torch.from_numpy(np.stack(fields[3])),
                "bootstrap": torch.tensor(fields[4], dtype=torch.float32)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not state:
            self.items = []
            return
        obs, next_obs = state["obs"].numpy().copy(), state["next_obs"].numpy().copy()
        self.items = [Transition(o, int(a), float(r), n, float(b)) for o, a, r, n, b in
                      zip(obs, state["actions"].tolist(), state["rewards"].tolist(), next_obs, state["bootstrap"].tolist())]

    def gather(self, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows = [self.items[i] for i in indices.tolist()]
        obs = np.stack([r.obs for r in rows])
        actions = np.array([r.action for r in rows], dtype=np.int64)
        rewards = np.array([r.reward for r in rows], dtype=np.float32)
        next_obs = np.stack([r.next_obs for r in rows])
        bootstrap = np.array([r.bootstrap for r in rows], dtype=np.float32)
        put = self.to_device
        return (put.observations(obs, "replay_obs"), put(actions, "replay_actions", torch.int64),
                put(rewards, "replay_rewards"), put.observations(next_obs, "replay_next_obs"),
                put(bootstrap, "replay_bootstrap"))


class TensorStorage:
    """Optimised path: one preallocated float32 tensor on the device, a row per transition
    (``obs | next_obs | reward | bootstrap | action``). An insert packs a step's transitions
    into one host array, copies it once (pinned / non_blocking when those flags are on) and
    writes it with at most two slice copies (on the CPU, where the tensor is host memory,
    straight into its numpy view); a minibatch is one device gather."""

    def __init__(self, capacity: int, obs_dim: int, device: torch.device, to_device: HostToDevice) -> None:
        self.capacity, self.obs_dim = capacity, obs_dim
        self.to_device = to_device
        self.rows = torch.zeros(capacity, 2 * obs_dim + 3, dtype=torch.float32, device=device)
        self.host_rows = self.rows.numpy() if self.rows.device.type == "cpu" else None

    def write(self, start: int, batch: TransitionBatch) -> None:
        # actions are stored as float32: exact for any action index below 2**24
        count, d, store = len(batch), self.obs_dim, self.host_rows
        if store is not None and start + count <= self.capacity:  # CPU: each field straight into its columns
            rows = store[start:start + count]
            rows[:, :d] = batch.obs.reshape(count, d)
            rows[:, d:2 * d] = batch.next_obs.reshape(count, d)
            rows[:, 2 * d] = batch.rewards
            rows[:, 2 * d + 1] = batch.bootstrap
            rows[:, 2 * d + 2] = batch.actions
            return
        packed = np.concatenate([batch.obs, batch.next_obs, batch.rewards[:, None], batch.bootstrap[:, None],
                                 batch.actions[:, None].astype(np.float32)], axis=1)
        store = self.host_rows
        rows: np.ndarray | torch.Tensor = packed
        if store is None:
            store, rows = self.rows, self.to_device(packed, "replay_insert")
        first = min(len(batch), self.capacity - start)
        store[start:start + first] = rows[:first]
        if first < len(batch):
            store[:len(batch) - first] = rows[first:]

    def write_one_step(self, start: int, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                       next_obs: np.ndarray, terminated: np.ndarray, gamma: np.float32) -> bool:
        """On the CPU, one-step transitions (every row valid) written field by field straight
        from the env step's arrays: what ``OneStepWriter.push`` then ``write`` store, bit for bit,
        without the batch between them. False, writing nothing, off the CPU or across the
        ring's end."""
        count, d, store = len(actions), self.obs_dim, self.host_rows
        if store is None or start + count > self.capacity:
            return False
        rows = store[start:start + count]
        rows[:, :d] = obs.reshape(count, d)
        rows[:, d:2 * d] = next_obs.reshape(count, d)
        rows[:, 2 * d] = rewards
        np.multiply(~terminated, gamma, out=rows[:, 2 * d + 1])
        rows[:, 2 * d + 2] = actions
        return True

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"rows": self.rows.detach().cpu().clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.rows.copy_(state["rows"])

    def gather(self, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows, d = self.rows.index_select(0, indices), self.obs_dim
        return (rows[:, :d], rows[:, 2 * d + 2].long(), rows[:, 2 * d], rows[:, d:2 * d], rows[:, 2 * d + 1])


class FrameStorage:
    """Optimised path for uint8 pixel observations: ``obs`` and ``next_obs`` in preallocated
    uint8 device tensors (one byte a pixel, as the env gives them; float32 would take four),
    reward, bootstrap and action packed in one float32 tensor. An insert is three copies (the
    frames as uint8 with ``uint8_transfer``, else as float32 cast back on the device); a
    minibatch is a device gather of uint8 frames, scaled by the network."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], device: torch.device, to_device: HostToDevice) -> None:
        self.capacity = capacity
        self.to_device = to_device
        self.obs = torch.zeros((capacity, *obs_shape), dtype=torch.uint8, device=device)
        self.next_obs = torch.zeros((capacity, *obs_shape), dtype=torch.uint8, device=device)
        self.scalars = torch.zeros(capacity, 3, dtype=torch.float32, device=device)

    def write(self, start: int, batch: TransitionBatch) -> None:
        scalars = np.stack([batch.rewards, batch.bootstrap, batch.actions.astype(np.float32)], axis=1)
        put = self.to_device
        pairs = ((self.obs, put.observations(batch.obs, "replay_insert_obs")),
                 (self.next_obs, put.observations(batch.next_obs, "replay_insert_next_obs")),
                 (self.scalars, put(scalars, "replay_insert")))
        first = min(len(batch), self.capacity - start)
        for store, rows in pairs:
            store[start:start + first] = rows[:first]
            if first < len(batch):
                store[:len(batch) - first] = rows[first:]

    def gather(self, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scalars = self.scalars.index_select(0, indices)
        obs, next_obs = self.obs.index_select(0, indices), self.next_obs.index_select(0, indices)
        return (obs, scalars[:, 2].long(), scalars[:, 0], next_obs, scalars[:, 1])


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


class Storage(Protocol):
    def write(self, start: int, batch: TransitionBatch) -> None: ...
    def gather(self, indices: torch.Tensor) -> tuple[torch.Tensor, ...]: ...
    def state_dict(self) -> dict[str, torch.Tensor]: ...
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


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
