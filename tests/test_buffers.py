"""Replay buffers (reference_trainers/replay/buffers.py, per.py): list vs tensor storage give identical
minibatches, the ring keeps the newest transitions, each storage takes its own copy path, and
prioritized replay samples in proportion to priorities with the right importance weights."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference_trainers.replay.buffers import ListStorage, ReplayBuffer, TensorStorage, UniformSampler, make_replay
from reference_trainers.replay.writers import TransitionBatch
from reference_trainers.replay.per import PrioritizedSampler
from reference_trainers.paths.speedups import HostToDevice

CPU = torch.device("cpu")
CUDA = torch.cuda.is_available()
OBS_DIM = 3


def transitions(ids: list[int]) -> TransitionBatch:
    """Transitions whose every field encodes its id (so a sampled row can be traced back)."""
    ids_f = np.asarray(ids, dtype=np.float32)
    return TransitionBatch(np.stack([ids_f, ids_f + 0.25, -ids_f], axis=1), np.asarray(ids, dtype=np.int64) % 5,
                           ids_f * 0.5, np.stack([ids_f + 1, ids_f, ids_f], axis=1), np.full(len(ids), 0.99, np.float32))


def replay(kind: str, capacity: int, seed: int = 0, prioritized: bool = False, alpha: float = 0.6,
           device: torch.device = CPU, to_device: HostToDevice | None = None) -> ReplayBuffer:
    generator = torch.Generator(device=device).manual_seed(seed)
    return make_replay(kind, capacity, OBS_DIM, device, to_device or HostToDevice(device), generator,
                       prioritized=prioritized, alpha=alpha)


def assert_samples_equal(a: Any, b: Any) -> None:
    for name in ("obs", "actions", "rewards", "next_obs", "bootstrap", "indices", "weights"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
            continue
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(x.cpu(), y.cpu()), name


# --------------------------------------------------------------------------- list vs tensor

@given(capacity=st.integers(1, 40), inserts=st.lists(st.integers(0, 12), min_size=1, max_size=12),
       batch_size=st.integers(1, 16), prioritized=st.booleans(), seed=st.integers(0, 2**16))
def test_tensor_replay_matches_list_replay(capacity: int, inserts: list[int], batch_size: int, prioritized: bool,
                                           seed: int) -> None:
    plain, fast = replay("list", capacity, seed, prioritized), replay("tensor", capacity, seed, prioritized)
    next_id = 0
    for rows in inserts:
        batch = transitions(list(range(next_id, next_id + rows)))
        next_id += rows
        plain.add(batch)
        fast.add(batch)
        assert len(plain) == len(fast) == min(next_id, capacity)
        if len(plain) == 0:
            continue
        a, b = plain.sample(batch_size, beta=0.4), fast.sample(batch_size, beta=0.4)
        assert_samples_equal(a, b)
        assert a.obs.dtype == a.rewards.dtype == a.bootstrap.dtype == torch.float32 and a.actions.dtype == torch.int64
        if prioritized:  # the same priority updates keep them in step
            errors = a.rewards * 3.0 - 1.0
            plain.update_priorities(a.indices, errors)
            fast.update_priorities(b.indices, errors)


def test_ring_buffer_keeps_the_newest_capacity_transitions() -> None:
    for kind in ("list", "tensor"):
        buffer = replay(kind, 5)
        buffer.add(transitions([0, 1, 2]))
        buffer.add(transitions([3, 4, 5, 6]))        # wraps: 5 and 6 overwrite 0 and 1
        assert len(buffer) == 5 and buffer.position == 2
        seen = set(buffer.sample(500).obs[:, 0].tolist())
        assert seen == {2.0, 3.0, 4.0, 5.0, 6.0}, kind
        buffer.add(transitions(list(range(10, 22))))  # more than the capacity in one insert
        assert set(buffer.sample(500).obs[:, 0].tolist()) == {17.0, 18.0, 19.0, 20.0, 21.0}, kind


def test_sampled_fields_belong_to_the_same_transition() -> None:
    for kind in ("list", "tensor"):
        buffer = replay(kind, 50)
        buffer.add(transitions(list(range(37))))
        s = buffer.sample(64)
        ids = s.obs[:, 0]
        torch.testing.assert_close(s.obs[:, 1], ids + 0.25)
        torch.testing.assert_close(s.next_obs[:, 0], ids + 1)
        torch.testing.assert_close(s.rewards, ids * 0.5)
        assert torch.equal(s.actions, ids.long() % 5)
        assert torch.equal(s.indices, ids.long())  # written in order from position 0
        assert s.weights is None


def test_uniform_sampling_draws_only_from_the_filled_part() -> None:
    buffer = replay("tensor", 1000)
    buffer.add(transitions(list(range(7))))
    counts = Counter(buffer.sample(7000).indices.tolist())
    assert set(counts) == set(range(7))
    assert all(800 <= c <= 1200 for c in counts.values()), counts


def test_empty_inserts_change_nothing() -> None:
    for kind in ("list", "tensor"):
        buffer = replay(kind, 4, prioritized=True)
        buffer.add(transitions([]))
        assert len(buffer) == 0 and buffer.position == 0


# --------------------------------------------------------------------------- copy paths

class CountingCopies(HostToDevice):
    def __init__(self) -> None:
        super().__init__(CPU)
        self.names: list[str] = []

    def __call__(self, array: np.ndarray, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self.names.append(name)
        return super().__call__(array, name, dtype)


def test_list_storage_copies_each_field_per_sampled_minibatch_and_nothing_per_insert() -> None:
    copies = CountingCopies()
    buffer = replay("list", 100, to_device=copies)
    assert isinstance(buffer.storage, ListStorage)
    buffer.add(transitions(list(range(10))))
    assert copies.names == []
    buffer.sample(8)
    assert copies.names == ["replay_obs", "replay_actions", "replay_rewards", "replay_next_obs", "replay_bootstrap"]


def test_tensor_storage_on_cpu_inserts_in_place_and_samples_without_copies() -> None:
    """On the CPU the storage tensor is host memory: inserts write its numpy view (no copy at
    all); elsewhere each insert is one host->device copy (``replay_insert``)."""
    copies = CountingCopies()
    buffer = replay("tensor", 100, to_device=copies)
    assert isinstance(buffer.storage, TensorStorage) and isinstance(buffer.sampler, UniformSampler)
    buffer.add(transitions(list(range(10))))
    buffer.add(transitions(list(range(10, 13))))
    buffer.sample(8)
    assert copies.names == []
    assert buffer.storage.rows.dtype == torch.float32 and buffer.storage.rows.device == CPU
    assert buffer.storage.rows[:13, -1].tolist() == [float(i % 5) for i in range(13)]  # the actions column


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tensor_storage_on_cuda_copies_once_per_insert() -> None:
    copies = CountingCopies()
    storage = TensorStorage(100, OBS_DIM, torch.device("cuda"), copies)
    storage.write(0, transitions(list(range(10))))
    storage.write(10, transitions(list(range(10, 13))))
    assert copies.names == ["replay_insert", "replay_insert"]


def test_list_storage_holds_numpy_transitions() -> None:
    buffer = replay("list", 10)
    buffer.add(transitions([4, 5]))
    item = buffer.storage.items[1]
    assert isinstance(item.obs, np.ndarray) and item.obs.dtype == np.float32
    assert (item.action, item.reward) == (0, 2.5) and type(item.action) is int and type(item.reward) is float


@pytest.mark.parametrize("kind", ["list", "tensor"])
def test_replay_keeps_its_own_copy_of_what_it_stores(kind: str) -> None:
    """Writers hand over views of the env's arrays (an env may reuse them): storing must copy."""
    buffer = replay(kind, 10)
    batch = transitions([1, 2])
    buffer.add(batch)
    before = buffer.sample(16)
    for field in (batch.obs, batch.next_obs, batch.rewards, batch.bootstrap):
        field[...] = -7
    assert_samples_equal(buffer.gather(before.indices, before.weights), before)


# --------------------------------------------------------------------------- prioritized replay

def prioritized(capacity: int, priorities: list[float], alpha: float = 1.0, seed: int = 0) -> ReplayBuffer:
    """A PER buffer holding ``len(priorities)`` transitions with exactly these priorities (eps ~ 0)."""
    generator = torch.Generator().manual_seed(seed)
    buffer = make_replay("tensor", capacity, OBS_DIM, CPU, HostToDevice(CPU), generator, prioritized=True,
                         alpha=alpha, eps=1e-12)
    buffer.add(transitions(list(range(len(priorities)))))
    buffer.update_priorities(torch.arange(len(priorities)), torch.tensor(priorities))
    return buffer


def test_per_sampling_frequencies_are_proportional_to_priorities() -> None:
    priorities = [1.0, 2.0, 3.0, 4.0, 10.0, 0.5, 6.0]
    buffer = prioritized(16, priorities)
    draws = 200 * 1024
    counts = np.bincount(torch.cat([buffer.sample(1024).indices for _ in range(200)]).numpy(), minlength=16)
    expected = np.asarray(priorities) / sum(priorities) * draws
    assert counts[len(priorities):].sum() == 0  # never an empty slot
    chi2 = float((((counts[:len(priorities)] - expected) ** 2) / expected).sum())
    assert chi2 < 22.5, (counts, expected)  # chi-square, 6 d.o.f., p = 0.001 (fixed seed: deterministic)
    np.testing.assert_allclose(counts[:len(priorities)] / draws, expected / draws, atol=0.01)


def test_per_alpha_flattens_priorities() -> None:
    buffer = prioritized(8, [1.0, 4.0, 16.0], alpha=0.5)
    probs = buffer.sampler.probabilities(torch.arange(3))
    torch.testing.assert_close(probs, torch.tensor([1.0, 2.0, 4.0]) / 7.0)
    uniform = prioritized(8, [1.0, 4.0, 16.0], alpha=0.0)
    torch.testing.assert_close(uniform.sampler.probabilities(torch.arange(3)), torch.full((3,), 1 / 3))


def test_per_importance_weights_match_the_formula() -> None:
    # priorities 1, 2, 4, 8 (alpha 1): P = p/15, N = 4, beta = 0.5.
    # w_i = (N P_i)^-beta / max_j (N P_j)^-beta = (p_i / p_min)^-0.5 = 1, 0.7071, 0.5, 0.3536
    buffer = prioritized(4, [1.0, 2.0, 4.0, 8.0])
    sample = buffer.sample(256, beta=0.5)
    expected = torch.tensor([1.0, 2.0, 4.0, 8.0]) ** -0.5
    torch.testing.assert_close(sample.weights, expected[sample.indices])
    assert set(sample.indices.tolist()) == {0, 1, 2, 3}
    assert torch.equal(buffer.sample(64, beta=0.0).weights, torch.ones(64))  # beta 0: no correction
    full = buffer.sample(64, beta=1.0)
    torch.testing.assert_close(full.weights, (torch.tensor([1.0, 2.0, 4.0, 8.0]) ** -1.0)[full.indices])


def test_per_new_transitions_get_the_largest_priority_seen() -> None:
    buffer = prioritized(8, [1.0, 5.0, 2.0])
    buffer.add(transitions([3, 4]))
    probs = buffer.sampler.probabilities(torch.arange(5))
    torch.testing.assert_close(probs, torch.tensor([1.0, 5.0, 2.0, 5.0, 5.0]) / 18.0)


def test_per_nonfinite_errors_do_not_poison_the_tree() -> None:
    buffer = prioritized(8, [1.0, 2.0, 3.0])
    buffer.update_priorities(torch.tensor([0, 1]), torch.tensor([float("nan"), float("inf")]))
    assert torch.isfinite(buffer.sampler.sums).all()
    torch.testing.assert_close(buffer.sampler.probabilities(torch.arange(3)), torch.tensor([3.0, 3.0, 3.0]) / 9.0)
    assert torch.isfinite(buffer.sample(32).weights).all()


@given(capacity=st.integers(1, 70), updates=st.lists(st.tuples(st.integers(0, 69), st.floats(0, 100)), max_size=40))
def test_per_tree_nodes_are_the_sums_and_minima_of_their_leaves(capacity: int, updates: list[tuple[int, float]]) -> None:
    sampler = PrioritizedSampler(capacity, alpha=1.0, eps=1e-3, device=CPU, generator=torch.Generator())
    sampler.added(0, capacity)
    for index, error in updates:
        sampler.update(torch.tensor([index % capacity]), torch.tensor([error]))
    leaves = sampler.sums[sampler.leaves:sampler.leaves + capacity]
    torch.testing.assert_close(sampler.sums[1], leaves.sum(), rtol=1e-5, atol=1e-5)
    assert sampler.mins[1] == leaves.min()
    assert (sampler.sums[sampler.leaves + capacity:] == 0).all()


def test_per_batch_update_with_repeated_indices_is_consistent() -> None:
    sampler = PrioritizedSampler(6, alpha=1.0, eps=0.0, device=CPU, generator=torch.Generator())
    sampler.added(0, 6)
    sampler.update(torch.tensor([2, 2, 4, 2]), torch.tensor([3.0, 3.0, 7.0, 3.0]))
    leaves = sampler.sums[sampler.leaves:sampler.leaves + 6]
    assert leaves.tolist() == [1.0, 1.0, 3.0, 1.0, 7.0, 1.0]
    assert sampler.sums[1] == 14.0


# --------------------------------------------------------------------------- pinned staging (CUDA)

@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_pinned_non_blocking_tensor_replay_matches_pageable_copies() -> None:
    cuda = torch.device("cuda")
    plain = replay("tensor", 64, device=cuda)
    fast = replay("tensor", 64, device=cuda, to_device=HostToDevice(cuda, pinned=True, non_blocking=True))
    for start in range(0, 90, 9):  # varying sizes reuse the grow-only pinned staging buffer
        batch = transitions(list(range(start, start + 1 + start % 7)))
        plain.add(batch)
        fast.add(batch)
        assert_samples_equal(plain.sample(16), fast.sample(16))
    assert fast.storage.to_device._staging["replay_insert"].is_pinned()


@pytest.mark.parametrize("rows", [1, 3])
def test_one_step_insert_stores_what_the_writer_and_add_store(rows: int) -> None:
    """The direct insert of a step with no reset row writes the rows ``OneStepWriter.push`` then
    ``add`` write, bit for bit (float64 rewards, int64 actions, terminations), and steps aside
    (nothing written) across the ring's end, for list storage and for prioritized sampling."""
    from reference_trainers.replay.writers import OneStepWriter

    rng = np.random.default_rng(0)
    gamma, capacity = 0.99, 7
    writer = OneStepWriter(rows, gamma)
    direct, general = (make_replay("tensor", capacity, 4, torch.device("cpu"), HostToDevice(torch.device("cpu")),
                                   torch.Generator()) for _ in range(2))
    valid = np.ones(rows, dtype=bool)
    for _ in range(12):
        obs, next_obs = rng.standard_normal((2, rows, 4)).astype(np.float32)
        actions = rng.integers(0, 3, rows)
        rewards = rng.standard_normal(rows)  # float64, as envs give them
        terminated = rng.random(rows) < 0.3
        fits = direct.position + rows <= capacity
        assert direct.add_one_step(obs, actions, rewards, next_obs, terminated, writer.gamma) is fits
        if not fits:
            direct.add(writer.push(obs, actions, rewards, next_obs, terminated, ~terminated, valid))
        general.add(writer.push(obs, actions, rewards, next_obs, terminated, ~terminated, valid))
        assert (direct.position, direct.size) == (general.position, general.size)
        assert torch.equal(direct.storage.rows, general.storage.rows)
    for other in (make_replay("list", capacity, 4, torch.device("cpu"), HostToDevice(torch.device("cpu")),
                              torch.Generator()),
                  make_replay("tensor", capacity, 4, torch.device("cpu"), HostToDevice(torch.device("cpu")),
                              torch.Generator(), prioritized=True)):
        assert not other.add_one_step(obs, actions, rewards, next_obs, terminated, writer.gamma)
        assert len(other) == 0

