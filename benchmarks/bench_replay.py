"""Replay buffers (DQN / IQN): one insert of a vector-env step and one minibatch sample, list
vs tensor storage, on a buffer filled to capacity with seeded transitions
(``harness.analyses.replay_bench`` builds them, so the suite and ``python -m harness.analyses.replay_bench``
measure the same thing)."""

from __future__ import annotations

import numpy as np

from harness.analyses.replay_bench import filled_buffer, random_transitions
from reference_trainers.runtime import device as dev

from .common import DEVICES, REPLAY_BATCH_SIZE, REPLAY_CAPACITIES, REPLAY_KINDS, REPLAY_OBS_DIM, \
    REPLAY_ROWS_PER_INSERT, skip_unless_available


class Replay:
    params = (REPLAY_KINDS, REPLAY_CAPACITIES, DEVICES)
    param_names = ["kind", "capacity", "device"]
    timeout = 120

    def setup(self, kind: str, capacity: int, device: str) -> None:
        skip_unless_available(device)
        self.device = dev.resolve_device(device)
        self.buffer = filled_buffer(kind, capacity, REPLAY_OBS_DIM, self.device)
        self.rows = random_transitions(REPLAY_ROWS_PER_INSERT, REPLAY_OBS_DIM, np.random.default_rng(1))

    def time_insert_vector_step(self, kind: str, capacity: int, device: str) -> None:
        self.buffer.add(self.rows)
        dev.synchronize(self.device)

    def time_sample_minibatch(self, kind: str, capacity: int, device: str) -> None:
        self.buffer.sample(REPLAY_BATCH_SIZE)
        dev.synchronize(self.device)
