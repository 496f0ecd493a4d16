"""Where replay transitions live: the plain list storage and the preallocated tensor storages.

``ListStorage`` (plain) keeps numpy transitions in a Python list; ``TensorStorage`` keeps
preallocated device tensors written once per insert and gathered on the device; ``FrameStorage``
is the tensor storage for uint8 pixels. ``buffers.ReplayBuffer`` composes one with a sampler.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np
import torch

from reference_trainers.replay.writers import TransitionBatch
from reference_trainers.paths.speedups import HostToDevice


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

    def host_gather(self, indices: torch.Tensor) -> tuple[np.ndarray, ...] | None:
        """``gather`` as NumPy arrays, one ``take`` from the rows' host view (``numpy_update``'s
        minibatches); None where the rows are not host memory."""
        if self.host_rows is None:
            return None
        rows, d = self.host_rows.take(indices.numpy(), axis=0), self.obs_dim
        return (rows[:, :d], rows[:, 2 * d + 2].astype(np.int64), rows[:, 2 * d], rows[:, d:2 * d], rows[:, 2 * d + 1])


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


class Storage(Protocol):
    def write(self, start: int, batch: TransitionBatch) -> None: ...
    def gather(self, indices: torch.Tensor) -> tuple[torch.Tensor, ...]: ...
    def state_dict(self) -> dict[str, torch.Tensor]: ...
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...
