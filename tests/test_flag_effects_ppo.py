"""Flag-effect tests for PPO and recurrent PPO: each optimisation flag's optimised path is taken
when the flag is on and the plain path when it is off, shown by what happens while the trainer
runs (calls counted, threads and precision in force, dtypes computed in, graphs compiled,
minibatches gathered ahead), never by reading the config back. A flag made a silent no-op fails
its test here. Registry coverage: tests/test_flag_registry.py reads the ``flag_effect`` markers."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from flag_effects import (
    PrefetchTrace,
    assert_prefetched,
    at_each_update,
    dynamo_graphs,
    iterate_against,
    no_grad_forward_rows,
    running,
    spy,
    tensor_calls,
)
from precision_state import cuda_tf32_enabled

from reference_trainers.nets import mlp as mlp_maths
from reference_trainers.paths import numpy_update
from reference_trainers.runtime import device as dev

PPO_ALGOS = ("ppo", "ppo-lstm")
STEPS, ENVS = 8, 3
"""The rollout of ``flag_effects.TINY['ppo']``: steps per sub-env, sub-envs."""
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


# --------------------------------------------------------------------------- acting

@pytest.mark.flag_effect("optimizations.batch_inference")
@pytest.mark.parametrize("algo", PPO_ALGOS)
@pytest.mark.parametrize("batched", [False, True])
def test_batch_inference_runs_one_acting_forward_per_step_instead_of_one_per_sub_env(algo: str, batched: bool) -> None:
    """Plain: a one-row forward per sub-env and step; on: one forward of all sub-envs per step."""
    with running(algo, f"optimizations.batch_inference={str(batched).lower()}") as trainer:
        rows, remove = no_grad_forward_rows(trainer.model)
        trainer.iterate()
        remove()
    acting = Counter(rows)
    acting[ENVS] -= 1  # the bootstrap value of the last observation, one batched forward either way
    expected = {ENVS: STEPS} if batched else {1: STEPS * ENVS}
    assert +acting == expected


@pytest.mark.flag_effect("optimizations.inference_batch_size")
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
@pytest.mark.parametrize(("chunk", "largest"), [("null", ENVS), (2, 2), (1, 1)])
def test_inference_batch_size_chunks_the_numpy_acting_forward(monkeypatch: pytest.MonkeyPatch, algo: str, chunk: Any,
                                                               largest: int) -> None:
    """Under numpy_acting the acting forwards are NumPy calls: null, one of all sub-envs; k, of at most k rows."""
    shapes = spy(monkeypatch, mlp_maths.NumpyMLP, "__call__", lambda _self, x, *_: x.shape[0])
    with running(algo, "optimizations.numpy_acting=true", "optimizations.batch_inference=true",
                 f"optimizations.inference_batch_size={chunk}") as trainer:
        trainer.iterate()
    rows = Counter(shapes)
    assert rows and max(rows) == largest


@pytest.mark.flag_effect("optimizations.inference_batch_size")
@pytest.mark.parametrize("algo", PPO_ALGOS)
@pytest.mark.parametrize(("chunk", "expected"), [("null", {ENVS: STEPS}), (2, {2: STEPS, 1: STEPS}),
                                                 (1, {1: STEPS * ENVS})])
def test_inference_batch_size_splits_the_batched_forward_into_chunks(algo: str, chunk: Any,
                                                                     expected: dict[int, int]) -> None:
    """Null: one forward of all sub-envs per step; k: forwards of at most k rows per step."""
    with running(algo, "optimizations.batch_inference=true", f"optimizations.inference_batch_size={chunk}") as trainer:
        rows, remove = no_grad_forward_rows(trainer.model)
        trainer.iterate()
        remove()
    acting = Counter(rows)
    acting[ENVS] -= 1  # the bootstrap value
    assert +acting == expected


@pytest.mark.flag_effect("optimizations.numpy_acting")
@pytest.mark.parametrize("on", [False, True])
def test_numpy_acting_acts_through_numpy_instead_of_torch_forwards(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """On: every acting forward runs in NumPy and only the bootstrap value is a torch forward."""
    numpy_calls = spy(monkeypatch, mlp_maths.NumpyMLP, "__call__")
    with running("ppo", f"optimizations.numpy_acting={str(on).lower()}") as trainer:
        rows, remove = no_grad_forward_rows(trainer.model)
        trainer.iterate()
        remove()
    if on:
        assert len(numpy_calls) >= STEPS * ENVS and rows == [ENVS]
    else:
        assert not numpy_calls and len(rows) == STEPS * ENVS + 1


@pytest.mark.flag_effect("optimizations.block_noise")
@pytest.mark.parametrize("on", [False, True])
def test_block_noise_draws_the_rollouts_sampling_noise_in_one_call(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """numpy_acting's sampling uniforms. On: the whole rollout's in one ``torch.rand`` call as it
    starts; off: one call per vector step. Either way the same numbers reach the same steps."""
    draws = spy(monkeypatch, torch, "rand", lambda *args, generator=None, **_: (args, generator))
    with running("ppo", "optimizations.numpy_acting=true", f"optimizations.block_noise={str(on).lower()}") as trainer:
        trainer.collect()
        shapes = [tuple(args[0]) if isinstance(args[0], tuple) else args for args, g in draws
                  if g is trainer.generator]
        actions = trainer.actions_buf.clone()
        assert trainer.numpy_path.noise_block is None  # acting outside a rollout draws as it goes
    assert shapes == ([(STEPS, ENVS)] if on else [(ENVS,)] * STEPS)
    with running("ppo", "optimizations.numpy_acting=true", f"optimizations.block_noise={str(not on).lower()}") as other:
        other.collect()
        assert torch.equal(other.actions_buf, actions)  # bit for bit: the same draws, in the same order


# --------------------------------------------------------------------------- rollout and update paths

@pytest.mark.flag_effect("optimizations.lean_rollout")
@pytest.mark.parametrize("lean", [False, True])
def test_lean_rollout_copies_the_rollout_scalars_once_per_rollout(monkeypatch: pytest.MonkeyPatch, lean: bool) -> None:
    """Plain: reset masks and step results cross to the device twice a step; on: once a rollout."""
    with running("ppo", "optimizations.batch_inference=true", f"optimizations.lean_rollout={str(lean).lower()}") as t:
        copies = spy(monkeypatch, type(t.to_device), "__call__", lambda _self, _array, name, *rest: name)
        t.iterate()
    scalar_copies = [name for name in copies if not name.startswith("obs")]
    assert len(scalar_copies) == (1 if lean else 2 * STEPS)


@pytest.mark.flag_effect("optimizations.analytic_grads")
@pytest.mark.parametrize("on", [False, True])
def test_analytic_grads_sets_ppo_gradients_by_hand_without_autograd(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """Plain: one autograd backward per update; on: none, the actor's and critic's gradients by hand."""
    backwards = spy(monkeypatch, torch.autograd, "backward")
    by_hand = spy(monkeypatch, mlp_maths, "mlp_backward")
    with running("ppo", f"optimizations.analytic_grads={str(on).lower()}") as trainer:
        updates = trainer.iterate().updates
    assert updates > 0
    assert (len(backwards), len(by_hand)) == ((0, 2 * updates) if on else (updates, 0))


@pytest.mark.flag_effect("optimizations.numpy_update")
@pytest.mark.parametrize("on", [False, True])
def test_numpy_update_runs_the_hand_written_step_in_numpy(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """Plain: the hand-written step's torch backward per network and update; on: one NumPy step per
    update and no torch backward, the gradients still in the parameters' ``.grad``."""
    host_steps = spy(monkeypatch, numpy_update.HostPPOStep, "__call__")
    by_hand = spy(monkeypatch, mlp_maths, "mlp_backward")
    with running("ppo", "optimizations.analytic_grads=true", f"optimizations.numpy_update={str(on).lower()}") as t:
        before = [p.detach().clone() for p in t.model.parameters()]
        updates = t.iterate().updates
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in t.model.parameters())
        assert all(not torch.equal(a, p) for a, p in zip(before, t.model.parameters()))
    assert updates > 0
    assert (len(host_steps), len(by_hand)) == ((updates, 0) if on else (0, 2 * updates))


@pytest.mark.flag_effect("optimizations.sync_free_logging")
@pytest.mark.parametrize("algo", PPO_ALGOS)
@pytest.mark.parametrize("sync_free", [False, True])
def test_sync_free_logging_leaves_one_host_sync_per_iteration(algo: str, sync_free: bool) -> None:
    """Plain: an ``.item()`` per logged value and update; on: no ``.item()``, one ``tolist`` per iteration."""
    # fused Adam: the for-loop and foreach kernels read their CPU step counters with .item() themselves
    with running(algo, f"optimizations.sync_free_logging={str(sync_free).lower()}",
                 "optimizations.optimizer_impl=fused") as trainer:
        with tensor_calls("item", "tolist", "__float__", "__bool__") as syncs:
            updates = trainer.iterate().updates
        logged = len(trainer.last_stats) + 1  # the statistics and the non-finite flag
    assert updates > 0
    if sync_free:
        assert syncs == Counter(tolist=1)
    else:
        assert syncs["item"] == updates * logged and syncs["tolist"] == 0


@pytest.mark.flag_effect("optimizations.num_workers")
@pytest.mark.flag_effect("optimizations.num_workers", "1")
@pytest.mark.flag_effect("optimizations.num_workers", "2")
@pytest.mark.parametrize("algo", PPO_ALGOS)
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_num_workers_gathers_minibatches_ahead_before_the_first_is_consumed(algo: str, workers: int) -> None:
    """0: minibatches gathered inline one at a time; k: k more gathered ahead on background threads."""
    trace = PrefetchTrace(ahead=workers)
    minibatches = "ppo.num_minibatches=3" if algo == "ppo-lstm" else "ppo.num_minibatches=4"
    with running(algo, minibatches, f"optimizations.num_workers={workers}") as trainer:
        real_map = trainer.prefetcher.map
        trainer.prefetcher.map = lambda gather, items: real_map(trace.gathering(gather), items)
        trainer.learner.step = trace.consuming(trainer.learner.step)
        trainer.iterate()
    assert_prefetched(trace)


# --------------------------------------------------------------------------- torch.compile

@pytest.mark.flag_effect("optimizations.compile_model")
@pytest.mark.parametrize("on", [False, True])
def test_compile_model_runs_the_model_through_dynamo(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """On: the model, nothing else, is compiled and dynamo traces graphs in iterate(); off: nothing is."""
    with dynamo_graphs(monkeypatch) as (compiled, graphs):
        with running("ppo", "optimizations.batch_inference=true", f"optimizations.compile_model={str(on).lower()}") as t:
            t.iterate()
        assert [type(fn) for fn in compiled] == ([type(t.model)] if on else [])
        assert (graphs() > 0) is on and not t.compile_fallback


@pytest.mark.flag_effect("optimizations.compile_mode")
@pytest.mark.flag_effect("optimizations.compile_mode", "reduce-overhead")
@pytest.mark.flag_effect("optimizations.compile_mode", "max-autotune")
@pytest.mark.flag_effect("optimizations.compile_mode", "max-autotune-no-cudagraphs")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_compile_mode_is_the_mode_the_model_is_compiled_with(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The model is compiled with the configured inductor mode, and the compiled model runs."""
    with dynamo_graphs(monkeypatch) as (_compiled, graphs):
        modes = spy(monkeypatch, torch, "compile", lambda fn, **kwargs: kwargs.get("mode"))
        with running("ppo", "optimizations.batch_inference=true", "optimizations.compile_model=true",
                     f"optimizations.compile_mode={mode}") as trainer:
            trainer.iterate()
        assert modes == [mode] and graphs() > 0 and not trainer.compile_fallback


@pytest.mark.flag_effect("optimizations.compile_train_step")
@pytest.mark.parametrize("analytic_grads", [False, True])
@pytest.mark.parametrize("on", [False, True])
def test_compile_train_step_runs_the_update_through_dynamo(monkeypatch: pytest.MonkeyPatch, on: bool,
                                                           analytic_grads: bool) -> None:
    """On: the train step, not the model, is compiled and dynamo traces graphs in iterate(); off: nothing is."""
    step = "grads" if analytic_grads else "_loss_and_grads"
    with dynamo_graphs(monkeypatch) as (compiled, graphs):
        with running("ppo", f"optimizations.analytic_grads={str(analytic_grads).lower()}",
                     f"optimizations.compile_train_step={str(on).lower()}") as trainer:
            trainer.iterate()
        assert [getattr(fn, "__name__", type(fn).__name__) for fn in compiled] == ([step] if on else [])
        assert (graphs() > 0) is on and not trainer.compile_fallback


# --------------------------------------------------------------------------- CUDA only

@pytest.mark.skipif(not CUDA or not dev.supports_tf32(torch.device("cuda")), reason="needs a GPU with TF32")
@pytest.mark.flag_effect("optimizations.tf32")
@pytest.mark.parametrize("on", [False, True])
def test_tf32_is_in_force_while_iterate_runs(on: bool) -> None:
    """Every update runs with CUDA's TF32 matmul switch as configured."""
    seen: list[bool] = []
    with running("ppo", "device=cuda", f"optimizations.tf32={str(on).lower()}") as trainer:
        at_each_update(trainer, lambda: seen.append(cuda_tf32_enabled()))
        iterate_against(trainer, lambda: dev.apply_precision("highest", not on))
    assert seen and set(seen) == {on}


@needs_cuda
@pytest.mark.flag_effect("optimizations.cuda_graphs")
@pytest.mark.parametrize("on", [False, True])
def test_cuda_graphs_replays_a_captured_update(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """On: every update is a replay of the captured CUDA graph; off: no graph is replayed."""
    replays = spy(monkeypatch, torch.cuda.CUDAGraph, "replay")
    with running("ppo", "device=cuda", f"optimizations.cuda_graphs={str(on).lower()}") as trainer:
        updates = sum(trainer.iterate().updates for _ in range(2))
    assert len(replays) == (updates if on else 0) and updates > 0


@pytest.mark.flag_effect("optimizations.foreach_grad_clip")
@pytest.mark.parametrize("algo", ["ppo", "dqn", "iqn"])
@pytest.mark.parametrize("on", [False, True])
def test_foreach_grad_clip_clips_with_multi_tensor_kernels(monkeypatch: pytest.MonkeyPatch, algo: str, on: bool) -> None:
    """Plain: ``torch.nn.utils.clip_grad_norm_`` at every autograd update; on: one ``torch._foreach_norm``
    per update of its own, and torch's clipping is never called."""
    torch_clips = spy(monkeypatch, torch.nn.utils, "clip_grad_norm_")
    foreach_norms = spy(monkeypatch, torch, "_foreach_norm")
    with running(algo, f"optimizations.foreach_grad_clip={str(on).lower()}") as trainer:
        updates = trainer.iterate().updates
    assert updates > 0
    assert len(torch_clips) == (0 if on else updates)
    if on:
        assert len(foreach_norms) == updates
