"""Helpers of the flag-effect tests (tests/test_flag_effects_*.py): tiny trainers, and spies that
observe what a flag changes while ``iterate()`` runs (calls made, threads and precision in force,
dtypes computed in, graphs compiled, minibatches gathered ahead)."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from matmul_dtypes import MatmulDtypes
from precision_state import float32_matmul_precision

from reference_trainers import build_trainer
from reference_trainers.runtime import device as dev
from reference_trainers.config.schema import build_config
from reference_trainers.config.resolve import resolve_config

_COMMON = ["device=cpu", "env.id=CartPole-v1", "env.num_envs=3", "env.vectorization=serial",
           "model.hidden_sizes=[16,16]", "optimizations.torch_threads=1"]
_VALUE = ["buffer_size=64", "batch_size=8", "learning_starts=12", "train_frequency=1", "gradient_steps=1",
          "target_update_interval=2", "exploration_steps=30", "log_interval=24"]
TINY: dict[str, list[str]] = {
    "ppo": ["algo=ppo", *_COMMON, "ppo.num_steps=8", "ppo.num_minibatches=2", "ppo.update_epochs=1"],
    "ppo-lstm": ["algo=ppo", *_COMMON, "model.recurrent=lstm", "model.recurrent_size=8", "ppo.num_steps=8",
                 "ppo.num_minibatches=3", "ppo.update_epochs=1"],
    "dqn": ["algo=dqn", *_COMMON, *(f"dqn.{kv}" for kv in _VALUE)],
    "iqn": ["algo=iqn", *_COMMON, *(f"iqn.{kv}" for kv in _VALUE), "iqn.num_tau_samples=8",
            "iqn.num_tau_prime_samples=8", "iqn.num_quantile_samples=4", "iqn.quantile_embedding_dim=16"],
}
"""Per algorithm (``ppo-lstm``: recurrent PPO), a configuration whose ``iterate()`` makes a few
optimiser updates in well under a second, on one torch thread."""

PIXELS = ["env.id=pixel_env:PixelDot-v0", "model.body=cnn"]
"""The tiny synthetic image env (tests/pixel_env.py) under the Nature CNN."""


def build(algo: str, *overrides: str) -> Any:
    """A tiny trainer of ``algo`` (a key of ``TINY``) with extra ``--set`` overrides (later ones win)."""
    return build_trainer(resolve_config(build_config({}, TINY[algo] + list(overrides))))


@contextlib.contextmanager
def running(algo: str, *overrides: str) -> Iterator[Any]:
    """``build``, closed on the way out."""
    trainer = build(algo, *overrides)
    try:
        yield trainer
    finally:
        trainer.close()


def at_each_update(trainer: Any, record: Callable[[], None]) -> None:
    """Call ``record()`` at the start of every optimiser step the trainer takes."""
    real = trainer.learner.step

    def step(*batch: torch.Tensor) -> Any:
        record()
        return real(*batch)

    trainer.learner.step = step


def iterate_against(trainer: Any, contrary: Callable[[], None], iterations: int = 1) -> None:
    """Run ``iterations`` iterations, each after ``contrary()`` has put the process in a state the
    trainer's own settings must override (another trainer ran since it was built, say)."""
    for _ in range(iterations):
        contrary()
        trainer.iterate()


def spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str,
        record: Callable[..., Any] | None = None) -> list[Any]:
    """Wrap ``owner.name`` so that each call appends ``record(*args, **kwargs)`` (default: True)
    to the returned list, then calls through."""
    real = getattr(owner, name)
    calls: list[Any] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(True if record is None else record(*args, **kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


@contextlib.contextmanager
def tensor_calls(*names: str) -> Iterator[Counter[str]]:
    """Count calls of the named ``torch.Tensor`` methods (each still calls through) inside the block."""
    counts: Counter[str] = Counter()
    patched = pytest.MonkeyPatch()
    for name in names:
        original = getattr(torch.Tensor, name)

        def counting(self: torch.Tensor, *args: Any, _name: str = name, _orig: Any = original, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _orig(self, *args, **kwargs)

        patched.setattr(torch.Tensor, name, counting)
    try:
        yield counts
    finally:
        patched.undo()


# --------------------------------------------------------------------------- process settings

OTHER_THREADS = 1 if dev.DEFAULT_THREADS != 1 else 2
"""A thread count other than torch's default here."""


def threads_during_updates(algo: str, setting: int | None) -> list[int]:
    """The intra-op thread counts in force at each optimiser step of an iteration, with the
    process set to another count after the trainer was built."""
    expected = setting or dev.DEFAULT_THREADS
    contrary = dev.DEFAULT_THREADS if expected != dev.DEFAULT_THREADS else OTHER_THREADS
    seen: list[int] = []
    with running(algo, f"optimizations.torch_threads={'null' if setting is None else setting}") as trainer:
        at_each_update(trainer, lambda: seen.append(torch.get_num_threads()))
        iterate_against(trainer, lambda: torch.set_num_threads(contrary))
    assert seen, "no optimiser step ran"
    return seen


def precision_during_updates(algo: str, precision: str) -> list[str]:
    """The float32 matmul precision in force at each optimiser step of an iteration, with the
    process set to another precision after the trainer was built."""
    contrary = "medium" if precision != "medium" else "highest"
    seen: list[str] = []
    with running(algo, f"optimizations.matmul_precision={precision}") as trainer:
        at_each_update(trainer, lambda: seen.append(float32_matmul_precision()))
        iterate_against(trainer, lambda: torch.set_float32_matmul_precision(contrary))
    assert seen, "no optimiser step ran"
    return seen


def matmul_dtypes_of_iterate(algo: str, *overrides: str) -> tuple[set[torch.dtype], set[torch.dtype], int]:
    """(dtypes of the update's matmuls, of the acting matmuls, optimiser steps) over one iterate()."""
    with running(algo, *overrides) as trainer:
        with MatmulDtypes() as seen:
            result = trainer.iterate()
    assert result.updates > 0
    return seen.dtypes_where(grad_enabled=True), seen.dtypes_where(grad_enabled=False), result.updates


# --------------------------------------------------------------------------- torch.compile

@contextlib.contextmanager
def dynamo_graphs(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[Any], Callable[[], int]]]:
    """``torch.compile`` through dynamo with its eager backend (frames traced into graphs and
    guarded, no code generated: fast); yields (what was passed to ``torch.compile``, a function
    returning how many graphs dynamo has compiled so far)."""
    from torch._dynamo.utils import counters

    real = torch.compile
    compiled: list[Any] = []

    def compile_eagerly(fn: Any, **kwargs: Any) -> Any:
        compiled.append(fn)
        kwargs.pop("mode", None)
        kwargs.pop("options", None)
        return real(fn, backend="eager", **kwargs)

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(torch, "compile", compile_eagerly)
    try:
        yield compiled, lambda: counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()


# --------------------------------------------------------------------------- num_workers

class PrefetchTrace:
    """Records each minibatch gather (on which thread it ran) and how many gathers had started
    when the first minibatch was consumed by an optimiser step."""

    GRACE_S = 5.0
    """How long the first step waits for the gathers it expects ahead to start before counting (a
    background gather starts at once; an inline one can only start after the step returns)."""

    def __init__(self, ahead: int) -> None:
        self.ahead = ahead
        self.on_main_thread: list[bool] = []
        self.started_at_first_step: int | None = None
        self._lock = threading.Lock()
        self._all_ahead = threading.Event()

    def gathering(self, gather: Callable[..., Any]) -> Callable[..., Any]:
        def traced(*args: Any) -> Any:
            with self._lock:
                self.on_main_thread.append(threading.current_thread() is threading.main_thread())
                if len(self.on_main_thread) > self.ahead:
                    self._all_ahead.set()
            return gather(*args)
        return traced

    def consuming(self, step: Callable[..., Any]) -> Callable[..., Any]:
        def traced(*args: Any) -> Any:
            if self.started_at_first_step is None:
                if self.ahead:
                    self._all_ahead.wait(self.GRACE_S)
                with self._lock:
                    self.started_at_first_step = len(self.on_main_thread)
            return step(*args)
        return traced


def assert_prefetched(trace: PrefetchTrace) -> None:
    """Inline (0 workers): one gather at a time on the main thread. k workers: k + 1 gathers
    started before the first step consumed a minibatch, none of them on the main thread."""
    workers = trace.ahead
    assert trace.on_main_thread, "no minibatch was gathered"
    if workers == 0:
        assert trace.started_at_first_step == 1
        assert all(trace.on_main_thread)
    else:
        assert trace.started_at_first_step == workers + 1, trace.started_at_first_step
        assert not any(trace.on_main_thread), "a minibatch was gathered on the main thread"


# --------------------------------------------------------------------------- acting forwards

def no_grad_forward_rows(module: torch.nn.Module) -> tuple[list[int], Callable[[], None]]:
    """Rows of each forward of ``module`` run without autograd (acting, bootstrap values), and a
    function that removes the hook."""
    rows: list[int] = []

    def hook(_module: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
        if not torch.is_grad_enabled():
            rows.append(int(inputs[0].shape[0]))

    handle = module.register_forward_pre_hook(hook)
    return rows, handle.remove
