"""The value-based optimisations that each switch one path of their own (``direct_adam_step``,
``replay_direct_write``, ``block_noise``, ``gather_in_step``, ``compile_cpp_wrapper``,
``aten_tanh``): for each, a test that the optimised path is taken when the flag is on and the
plain one when it is off (calls counted while ``iterate()`` runs, what ``torch.compile`` was
given, the ops of the graphs it traced), and a tiny DQN run from one seed, flag on against flag
off, that keeps the flag's parity class."""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from flag_effects import running, spy
from properties.parity_runs import Outcome, assert_parity, train

from reference_trainers.replay import buffers
from reference_trainers.paths import speedups
from reference_trainers.config.flags import flag
from reference_trainers.replay.writers import OneStepWriter

VECTOR_STEPS, ENVS = 8, 3
"""One iteration of ``flag_effects.TINY['dqn']``: vector steps, sub-envs."""
ROWS, HIDDEN = 8, 16
"""The tiny DQN's minibatch rows and hidden width: its update's activations hold 128 elements."""
HAND_WRITTEN_STEP = ["optimizations.analytic_grads=true", "optimizations.compile_train_step=true",
                     "optimizations.replay=tensor"]
"""The compiled hand-written DQN step that ``gather_in_step``, ``compile_cpp_wrapper`` and ``aten_tanh`` live in."""


def _switch(name: str, on: bool) -> str:
    return f"optimizations.{name}={str(on).lower()}"


@contextlib.contextmanager
def compiled_into_graphs(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[dict[str, Any]], Counter[str]]]:
    """``torch.compile`` through dynamo with a backend that records each traced graph's ops and runs
    the graph eagerly (no code generated: fast); yields (the keyword arguments of every
    ``torch.compile`` call, the ops of every graph traced, counted)."""
    real = torch.compile
    calls: list[dict[str, Any]] = []
    ops: Counter[str] = Counter()

    def record(gm: torch.fx.GraphModule, _inputs: list[torch.Tensor]) -> Any:
        ops.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    def compile_recording(fn: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        kept = {k: v for k, v in kwargs.items() if k not in ("mode", "options", "backend")}
        return real(fn, backend=record, **kept)

    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", compile_recording)
    try:
        yield calls, ops
    finally:
        torch._dynamo.reset()


def _parity_class(name: str) -> str:
    return flag(f"optimizations.{name}").parity


# --------------------------------------------------------------------------- direct_adam_step

@pytest.mark.flag_effect("optimizations.direct_adam_step")
@pytest.mark.parametrize("on", [False, True])
def test_direct_adam_step_calls_the_fused_kernel_without_optimizer_step(monkeypatch: pytest.MonkeyPatch,
                                                                        on: bool) -> None:
    """On: after the first update (``optimizer.step()`` creates the state) every update goes
    through ``FusedAdamStep``. Off: every update is ``optimizer.step()``. The fused kernel runs
    once per update either way."""
    direct = spy(monkeypatch, speedups.FusedAdamStep, "__call__")
    kernels = spy(monkeypatch, torch, "_fused_adam_")
    with running("dqn", "optimizations.optimizer_impl=fused", _switch("direct_adam_step", on)) as trainer:
        optimizer_steps: list[bool] = []
        trainer.learner.optimizer.register_step_post_hook(lambda *_: optimizer_steps.append(True))
        updates = trainer.iterate().updates
    assert updates > 1
    assert (len(direct), len(optimizer_steps), len(kernels)) == ((updates, 1, updates) if on else (0, updates, updates))


def test_direct_adam_step_keeps_its_parity_class() -> None:
    runs = [train(["optimizations.optimizer_impl=fused", _switch("direct_adam_step", on)], seed=5, algo="dqn")
            for on in (False, True)]
    assert_parity(runs[1], runs[0], _parity_class("direct_adam_step"))


# --------------------------------------------------------------------------- replay_direct_write

@pytest.mark.flag_effect("optimizations.replay_direct_write")
@pytest.mark.parametrize("on", [False, True])
def test_replay_direct_write_skips_the_writers_batch(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """On: steps with no reset row are written straight into tensor replay, without the writer's
    batch or ``add``. Off: every step is the writer's batch, then ``add``."""
    direct = spy(monkeypatch, buffers.TensorStorage, "write_one_step")
    pushes = spy(monkeypatch, OneStepWriter, "push")
    adds = spy(monkeypatch, buffers.ReplayBuffer, "add")
    with running("dqn", "optimizations.replay=tensor", _switch("replay_direct_write", on)) as trainer:
        trainer.iterate()
    assert len(pushes) == len(adds) and len(direct) + len(adds) == VECTOR_STEPS
    assert len(direct) > 0 if on else len(direct) == 0


def test_replay_direct_write_keeps_its_parity_class() -> None:
    runs = [train(["optimizations.replay=tensor", _switch("replay_direct_write", on)], seed=6, algo="dqn")
            for on in (False, True)]
    assert_parity(runs[1], runs[0], _parity_class("replay_direct_write"))


# --------------------------------------------------------------------------- block_noise

@pytest.mark.flag_effect("optimizations.block_noise")
@pytest.mark.parametrize("on", [False, True])
def test_block_noise_draws_a_block_of_steps_per_torch_call(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """numpy_acting's epsilon-greedy draws. On: ``tuning.noise_block_steps`` (3) steps of them in
    each ``torch.rand`` / ``torch.randint`` call. Off: one call of each per vector step."""
    uniform = spy(monkeypatch, torch, "rand", lambda *args, generator=None, **_: (args, generator))
    actions = spy(monkeypatch, torch, "randint", lambda *args, generator=None, **_: (args, generator))
    with running("dqn", "optimizations.numpy_acting=true", "tuning.noise_block_steps=3",
                 _switch("block_noise", on)) as trainer:
        trainer.iterate()
        shapes = ([tuple(args[0]) for args, g in uniform if g is trainer.explore_generator],
                  [tuple(args[1]) for args, g in actions if g is trainer.action_generator])
    expected = [(3, ENVS)] * 3 if on else [(1, ENVS)] * VECTOR_STEPS  # 8 steps: blocks of 3, 3 and 2 used
    assert shapes == (expected, expected)


def test_block_noise_keeps_its_parity_class() -> None:
    runs = [train(["optimizations.numpy_acting=true", "tuning.noise_block_steps=5", _switch("block_noise", on)],
                  seed=7, algo="dqn") for on in (False, True)]
    assert_parity(runs[1], runs[0], _parity_class("block_noise"))


# --------------------------------------------------------------------------- the compiled hand-written step

@pytest.mark.flag_effect("optimizations.gather_in_step")
@pytest.mark.parametrize("on", [False, True])
def test_gather_in_step_hands_the_compiled_step_replay_indices(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """On: the compiled step is ``grads_at``; each update hands it the drawn indices and
    no minibatch is gathered beside it. Off: ``grads`` compiled, fed the five tensors of a
    minibatch gathered from replay first."""
    gathers = spy(monkeypatch, buffers.ReplayBuffer, "gather")
    with compiled_into_graphs(monkeypatch) as (calls, _ops):
        with running("dqn", *HAND_WRITTEN_STEP, _switch("gather_in_step", on)) as trainer:
            arity: list[int] = []
            step = trainer.learner.step
            trainer.learner.step = lambda *batch: arity.append(len(batch)) or step(*batch)
            updates = trainer.iterate().updates
            compiled = trainer.update_path.compiled.eager.__name__
    assert updates > 0 and len(calls) == 1 and not trainer.compile_fallback
    assert (compiled, set(arity), len(gathers)) == (("grads_at", {1}, 0) if on
                                                    else ("grads", {5}, updates))


@pytest.mark.flag_effect("optimizations.compile_cpp_wrapper")
@pytest.mark.parametrize("on", [False, True])
def test_compile_cpp_wrapper_asks_inductor_for_its_cpp_wrapper(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """On: the hand-written step goes to ``torch.compile`` with inductor's ``cpp_wrapper`` option.
    Off: with no inductor options (its Python wrapper)."""
    with compiled_into_graphs(monkeypatch) as (calls, _ops):
        with running("dqn", *HAND_WRITTEN_STEP, _switch("compile_cpp_wrapper", on)) as trainer:
            assert trainer.iterate().updates > 0
    assert [c.get("options") for c in calls] == [{"cpp_wrapper": True} if on else {}]


@pytest.mark.flag_effect("optimizations.aten_tanh")
@pytest.mark.parametrize(("on", "threshold", "aten_calls"),
                         [(False, ROWS * HIDDEN, 0), (True, ROWS * HIDDEN, 2), (True, ROWS * HIDDEN + 1, 0)])
def test_aten_tanh_puts_atens_tanh_in_the_compiled_step(monkeypatch: pytest.MonkeyPatch, on: bool, threshold: int,
                                                       aten_calls: int) -> None:
    """On: the tanh of each of the online Q-network's two hidden layers in the traced step is
    ATen's (one opaque op) where its activation holds at least ``tuning.aten_tanh_min_elements``
    elements. Off, or below the threshold: ``torch.tanh``, which inductor generates code for (as
    for the target network's two, a module forward)."""
    with compiled_into_graphs(monkeypatch) as (_calls, ops):
        with running("dqn", *HAND_WRITTEN_STEP, _switch("aten_tanh", on),
                     f"tuning.aten_tanh_min_elements={threshold}") as trainer:
            assert trainer.iterate().updates > 0
    torch_tanh = sum(n for op, n in ops.items() if op.startswith("<built-in method tanh of"))
    assert (ops["rlgauge.aten_tanh.default"], torch_tanh) == (aten_calls, 4 - aten_calls)


@functools.lru_cache(maxsize=1)
def _compiled_plain_run() -> Outcome:
    """The compiled hand-written DQN step with all three of its flags plain (inductor)."""
    return train([*HAND_WRITTEN_STEP, f"tuning.aten_tanh_min_elements={ROWS * HIDDEN}"], seed=8, algo="dqn",
                 watch_float64=False)


@pytest.mark.slow  # inductor compiles: a few seconds each with a warm cache
@pytest.mark.parametrize("name", ["gather_in_step", "compile_cpp_wrapper", "aten_tanh"])
def test_a_compiled_step_flag_keeps_its_parity_class(name: str) -> None:
    """Each flag of the compiled hand-written step, alone on, against the plain compiled run
    (``aten_tanh`` with the threshold at the update's activation size, so it takes effect)."""
    plain = _compiled_plain_run()
    on = train([*HAND_WRITTEN_STEP, f"tuning.aten_tanh_min_elements={ROWS * HIDDEN}", _switch(name, True)],
               seed=8, algo="dqn", watch_float64=False)
    assert not plain.compile_fallback and not on.compile_fallback
    assert_parity(on, plain, _parity_class(name))


@pytest.mark.flag_effect("optimizations.aten_tanh")
@pytest.mark.flag_effect("optimizations.compile_cpp_wrapper")
@pytest.mark.parametrize("on", [False, True])
def test_ppos_compiled_hand_written_step_takes_both_compile_flags(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    """PPO's compiled hand-written step: with ``aten_tanh`` every hidden tanh of the actor and the critic
    (threshold 1 element) is ATen's, and ``compile_cpp_wrapper`` asks inductor for its C++ wrapper;
    off, ``torch.tanh`` and no options."""
    with compiled_into_graphs(monkeypatch) as (calls, ops):
        with running("ppo", *HAND_WRITTEN_STEP[:2], _switch("aten_tanh", on), _switch("compile_cpp_wrapper", on),
                     "model.activation=tanh", "tuning.aten_tanh_min_elements=1") as trainer:
            trainer.iterate()
    torch_tanh = sum(n for op, n in ops.items() if op.startswith("<built-in method tanh of"))
    assert (ops["rlgauge.aten_tanh.default"] > 0) == on and (torch_tanh > 0) != on
    assert [c.get("options") for c in calls] == [{"cpp_wrapper": True} if on else {}]
