"""Flag-effect tests for DQN and IQN: each optimisation flag (and each algorithm option) takes its
optimised path when on and its plain path when off, shown by what happens while ``iterate()``
runs (calls counted, threads and precision in force, dtypes computed in, graphs compiled,
minibatches gathered ahead, classes built, values written to replay), never by reading the
config back. Registry coverage: tests/test_flag_registry.py reads the ``flag_effect`` markers."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from flag_effects import (
    PrefetchTrace,
    assert_prefetched,
    dynamo_graphs,
    no_grad_forward_rows,
    running,
    spy,
    tensor_calls,
)

from reference_trainers.nets import mlp as mlp_maths
from reference_trainers.replay import buffers
from reference_trainers.paths import numpy_update
from reference_trainers.replay import per
from reference_trainers.replay.writers import NStepWriter, OneStepWriter

ALGOS = ("dqn", "iqn")
VECTOR_STEPS, ENVS = 8, 3
"""One iteration of ``flag_effects.TINY['dqn']``: vector steps, sub-envs."""
BATCH_FIELDS = {"dqn": 5, "iqn": 8}
"""Tensors a uniform minibatch hands the loss (observations .. bootstrap, and IQN's three fraction sets)."""
CUDA = torch.cuda.is_available()


# --------------------------------------------------------------------------- acting

@pytest.mark.flag_effect("optimizations.batch_inference")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("batched", [False, True])
def test_batch_inference_runs_one_acting_forward_per_step_instead_of_one_per_sub_env(algo: str, batched: bool) -> None:
    """Plain: a one-row forward per sub-env and step; on: one forward of all sub-envs per step."""
    with running(algo, f"optimizations.batch_inference={str(batched).lower()}") as trainer:
        rows, remove = no_grad_forward_rows(trainer.model)
        trainer.iterate()
        remove()
    assert Counter(rows) == ({ENVS: VECTOR_STEPS} if batched else {1: VECTOR_STEPS * ENVS})


@pytest.mark.flag_effect("optimizations.inference_batch_size")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize(("chunk", "expected"), [("null", {ENVS: VECTOR_STEPS}),
                                                 (2, {2: VECTOR_STEPS, 1: VECTOR_STEPS})])
def test_inference_batch_size_splits_the_batched_forward_into_chunks(algo: str, chunk: Any,
                                                                     expected: dict[int, int]) -> None:
    """Null: one forward of all sub-envs per step; k: forwards of at most k rows per step."""
    with running(algo, "optimizations.batch_inference=true", f"optimizations.inference_batch_size={chunk}") as trainer:
        rows, remove = no_grad_forward_rows(trainer.model)
        trainer.iterate()
        remove()
    assert Counter(rows) == expected


@pytest.mark.flag_effect("optimizations.numpy_acting")
@pytest.mark.parametrize("on", [False, True])
def test_numpy_acting_chooses_dqn_actions_without_torch_forwards(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """On: every acting forward (one per sub-env here) runs in NumPy; off: every one is a torch forward."""
    numpy_calls = spy(monkeypatch, mlp_maths.NumpyMLP, "__call__")
    with running("dqn", f"optimizations.numpy_acting={str(on).lower()}") as trainer:
        rows, remove = no_grad_forward_rows(trainer.model)
        trainer.iterate()
        remove()
    acting = VECTOR_STEPS * ENVS
    if on:
        assert len(numpy_calls) >= acting and not rows
    else:
        assert not numpy_calls and len(rows) == acting


# --------------------------------------------------------------------------- update paths

@pytest.mark.flag_effect("optimizations.analytic_grads")
@pytest.mark.parametrize("on", [False, True])
def test_analytic_grads_sets_dqn_gradients_by_hand_without_autograd(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """Plain: one autograd backward per update; on: none, the Q-network's gradients by hand."""
    backwards = spy(monkeypatch, torch.autograd, "backward")
    by_hand = spy(monkeypatch, mlp_maths, "mlp_backward")
    with running("dqn", f"optimizations.analytic_grads={str(on).lower()}") as trainer:
        updates = trainer.iterate().updates
    assert updates > 0
    assert (len(backwards), len(by_hand)) == ((0, updates) if on else (updates, 0))


@pytest.mark.flag_effect("optimizations.numpy_update")
@pytest.mark.parametrize("on", [False, True])
def test_numpy_update_runs_the_dqn_step_in_numpy(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """Plain: the hand-written step's torch backward per update; on: one NumPy step per update and
    no torch backward, the Q-network's gradients still in its ``.grad`` and its weights trained."""
    host_steps = spy(monkeypatch, numpy_update.HostDQNStep, "__call__")
    by_hand = spy(monkeypatch, mlp_maths, "mlp_backward")
    host_gathers = spy(monkeypatch, buffers.ReplayBuffer, "host_gather")
    with running("dqn", "optimizations.analytic_grads=true", "optimizations.replay=tensor",
                 f"optimizations.numpy_update={str(on).lower()}") as t:
        before = [p.detach().clone() for p in t.model.parameters()]
        updates = t.iterate().updates
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in t.model.parameters())
        assert all(not torch.equal(a, p) for a, p in zip(before, t.model.parameters()))
    assert updates > 0
    assert (len(host_steps), len(by_hand)) == ((updates, 0) if on else (0, updates))
    assert len(host_gathers) == (updates if on else 0)  # minibatches as NumPy arrays from the replay's host view


@pytest.mark.flag_effect("optimizations.sync_free_logging")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("sync_free", [False, True])
def test_sync_free_logging_leaves_one_host_sync_per_iteration(algo: str, sync_free: bool) -> None:
    """Plain: an ``.item()`` per logged value and update; on: no ``.item()``, one ``tolist`` per iteration."""
    # fused Adam and tensor replay: the other Adam kernels and the list replay's gather read tensors on the host
    with running(algo, f"optimizations.sync_free_logging={str(sync_free).lower()}",
                 "optimizations.optimizer_impl=fused", "optimizations.replay=tensor") as trainer:
        with tensor_calls("item", "tolist", "__float__", "__bool__") as syncs:
            updates = trainer.iterate().updates
        logged = len(trainer.last_stats)  # the statistics and the non-finite flag, less epsilon
    assert updates > 0
    if sync_free:
        assert syncs == Counter(tolist=1)
    else:
        assert syncs["item"] == updates * logged and syncs["tolist"] == 0


@pytest.mark.flag_effect("optimizations.num_workers")
@pytest.mark.flag_effect("optimizations.num_workers", "1")
@pytest.mark.flag_effect("optimizations.num_workers", "2")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("replay", ["list", "tensor"])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_num_workers_gathers_replay_minibatches_ahead_before_the_first_is_consumed(algo: str, replay: str,
                                                                                   workers: int) -> None:
    """0: replay minibatches gathered inline one at a time; k: k more gathered ahead on background threads."""
    trace = PrefetchTrace(ahead=workers)
    with running(algo, f"{algo}.gradient_steps=3", f"optimizations.replay={replay}",
                 f"optimizations.num_workers={workers}") as trainer:
        trainer.replay.gather = trace.gathering(trainer.replay.gather)
        trainer.learner.step = trace.consuming(trainer.learner.step)
        trainer.iterate()
    assert_prefetched(trace)


# --------------------------------------------------------------------------- torch.compile

@pytest.mark.flag_effect("optimizations.compile_model")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("on", [False, True])
def test_compile_model_runs_the_online_and_target_networks_through_dynamo(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                                          on: bool) -> None:
    """On: the online and target networks, nothing else, are compiled and traced in iterate(); off: none."""
    with dynamo_graphs(monkeypatch) as (compiled, graphs):
        with running(algo, "optimizations.batch_inference=true", f"optimizations.compile_model={str(on).lower()}") as t:
            t.iterate()
        assert [type(fn) for fn in compiled] == ([type(t.model)] * 2 if on else [])
        assert (graphs() > 0) is on and not t.compile_fallback


@pytest.mark.flag_effect("optimizations.compile_train_step")
@pytest.mark.parametrize(("algo", "extra", "steps"), [
    ("dqn", [], {"_loss_and_grads"}), ("iqn", [], {"_loss_and_grads"}),
    ("dqn", ["optimizations.analytic_grads=true"], {"grads", "grads_at"}),
])
@pytest.mark.parametrize("on", [False, True])
def test_compile_train_step_runs_the_update_through_dynamo(monkeypatch: pytest.MonkeyPatch, on: bool, algo: str,
                                                           extra: list[str], steps: set[str]) -> None:
    """On: the train step, not the networks, is compiled and dynamo traces graphs in iterate(); off: nothing is."""
    with dynamo_graphs(monkeypatch) as (compiled, graphs):
        with running(algo, *extra, f"optimizations.compile_train_step={str(on).lower()}") as trainer:
            trainer.iterate()
        names = [getattr(fn, "__name__", type(fn).__name__) for fn in compiled]
        assert (len(names) == 1 and names[0] in steps) if on else names == []
        assert (graphs() > 0) is on and not trainer.compile_fallback


# --------------------------------------------------------------------------- replay and algorithm options

@pytest.mark.flag_effect("optimizations.replay")
@pytest.mark.flag_effect("optimizations.replay", "tensor")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("replay", ["list", "tensor"])
def test_replay_gathers_minibatches_from_the_chosen_storage(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                            replay: str) -> None:
    """list: minibatches gathered from a Python list of transitions; tensor: from preallocated tensors."""
    list_gathers = spy(monkeypatch, buffers.ListStorage, "gather")
    tensor_gathers = spy(monkeypatch, buffers.TensorStorage, "gather")
    with running(algo, f"optimizations.replay={replay}") as trainer:
        updates = trainer.iterate().updates
        items = getattr(trainer.replay.storage, "items", None)
    assert updates > 0
    if replay == "tensor":
        assert (len(list_gathers), len(tensor_gathers)) == (0, updates) and items is None
    else:
        assert (len(list_gathers), len(tensor_gathers)) == (updates, 0)
        assert items and all(isinstance(item, buffers.Transition) for item in items)


@pytest.mark.flag_effect("dqn.n_step")
@pytest.mark.flag_effect("iqn.n_step")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("n", [1, 3])
def test_n_step_writes_transitions_that_bootstrap_after_n_steps(algo: str, n: int) -> None:
    """n = 1: every transition bootstraps with gamma (or 0); n > 1: full n-step ones with gamma ** n."""
    written: list[np.ndarray] = []
    with running(algo, f"{algo}.n_step={n}") as trainer:
        real_add = trainer.replay.add
        trainer.replay.add = lambda batch: written.append(batch.bootstrap.copy()) or real_add(batch)
        trainer.iterate()
        writer, gamma = trainer.writer, trainer.hp.gamma
    assert isinstance(writer, OneStepWriter if n == 1 else NStepWriter)
    bootstraps = np.concatenate(written)
    allowed = np.float32([0.0, *(gamma ** m for m in range(1, n + 1))])
    assert np.isin(bootstraps, allowed).all()
    assert np.isclose(bootstraps.max(), gamma ** n)


@pytest.mark.flag_effect("dqn.prioritized_replay")
@pytest.mark.flag_effect("iqn.prioritized_replay")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("prioritized", [False, True])
def test_prioritized_replay_samples_by_priority_and_weights_the_loss(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                                    prioritized: bool) -> None:
    """Plain: uniform draws, no weights; on: proportional draws, weighted loss, priorities updated."""
    uniform = spy(monkeypatch, buffers.UniformSampler, "sample")
    proportional = spy(monkeypatch, per.PrioritizedSampler, "sample")
    reprioritised = spy(monkeypatch, per.PrioritizedSampler, "update")
    batches: list[tuple[torch.Tensor, ...]] = []
    with running(algo, f"{algo}.prioritized_replay={str(prioritized).lower()}") as trainer:
        real_loss = trainer.learner.loss
        trainer.learner.loss = lambda *batch: batches.append(batch) or real_loss(*batch)
        updates = trainer.iterate().updates
    assert updates > 0 and len(batches) == updates
    if prioritized:
        assert (len(uniform), len(proportional), len(reprioritised)) == (0, updates, updates)
        assert {len(b) for b in batches} == {BATCH_FIELDS[algo] + 1}
        weights = torch.stack([b[-1] for b in batches])
        assert ((weights > 0) & (weights <= 1)).all() and (weights < 1).any()
    else:
        assert (len(uniform), len(proportional), len(reprioritised)) == (updates, 0, 0)
        assert {len(b) for b in batches} == {BATCH_FIELDS[algo]}


# --------------------------------------------------------------------------- CUDA only

@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.flag_effect("optimizations.cuda_graphs")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("on", [False, True])
def test_cuda_graphs_replays_a_captured_update(monkeypatch: pytest.MonkeyPatch, algo: str, on: bool) -> None:
    """On: every update is a replay of the captured CUDA graph; off: no graph is replayed."""
    replays = spy(monkeypatch, torch.cuda.CUDAGraph, "replay")
    with running(algo, "device=cuda", f"optimizations.cuda_graphs={str(on).lower()}") as trainer:
        updates = sum(trainer.iterate().updates for _ in range(2))
    assert len(replays) == (updates if on else 0) and updates > 0
