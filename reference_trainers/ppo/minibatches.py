"""PPO's minibatch gathers, chosen once from ``packed_gather`` and ``numpy_update``: each takes the rollout
batch (observations, actions, log-probabilities, advantages, returns, values, valid mask) and returns the
function that gathers one minibatch's rows from it, given their indices."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

Batch = tuple[torch.Tensor, ...]


def plain_gather(batch: Batch) -> Callable[[torch.Tensor], Batch]:
    """Plain path: each tensor of the batch indexed on its own."""
    return lambda idx: tuple(x[idx] for x in batch)


def packed_gather(batch: Batch) -> Callable[[torch.Tensor], Batch]:
    """``packed_gather``: the batch packed column-wise into one float32 tensor, so that a
    minibatch is one ``index_select`` and column views (discrete actions travel as float32,
    exact below 2**24; ``evaluate_actions`` takes them back to int64). Observations that are
    not flat float32 vectors are gathered on their own."""
    obs, rest = batch[0], batch[1:]
    pack_obs = obs.dtype == torch.float32 and obs.dim() == 2
    columns = ([obs] if pack_obs else []) + [x.reshape(x.shape[0], -1).float() for x in rest]
    widths = [x.shape[1] for x in columns]
    packed = torch.cat(columns, dim=1)
    flat_action = batch[1].dim() == 1

    def gather(idx: torch.Tensor) -> Batch:
        parts = list(packed.index_select(0, idx).split(widths, dim=1))
        gathered_obs = parts.pop(0) if pack_obs else obs[idx]
        action = parts[0].squeeze(1) if flat_action else parts[0]
        return (gathered_obs, action, *(part.squeeze(1) for part in parts[1:]))
    return gather


def host_packed_gather(batch: Batch) -> Callable[[torch.Tensor], tuple[np.ndarray, ...]]:
    """``packed_gather`` for ``numpy_update``: the batch packed column-wise into one float32 NumPy
    array (observations flattened), so that a minibatch is one ``take`` and column views; the
    rows are the ones the same indices select from the torch batch."""
    rows = batch[0].shape[0]
    columns = [x.reshape(rows, -1).float().numpy() for x in batch]
    packed = np.concatenate(columns, axis=1)
    obs_width = columns[0].shape[1]

    def gather(idx: torch.Tensor) -> tuple[np.ndarray, ...]:
        minibatch = packed.take(idx.numpy(), axis=0)
        return (minibatch[:, :obs_width], *(minibatch[:, obs_width + i] for i in range(len(columns) - 1)))
    return gather


def choose_gather(packed: bool, numpy_update: bool) -> Callable[[Batch], Callable[[torch.Tensor], tuple]]:
    """The gather of ``packed_gather`` (into a NumPy array, which the NumPy step reads views of, under
    ``numpy_update``)."""
    if not packed:
        return plain_gather
    return host_packed_gather if numpy_update else packed_gather
