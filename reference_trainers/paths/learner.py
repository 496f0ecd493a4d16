"""The update half of every trainer: one optimiser step with every update-side flag.

``Learner`` owns the Adam optimiser (``optimizer_impl``; capturable with a tensor learning
rate under ``cuda_graphs``; its fused kernel called directly under ``direct_adam_step``), the
GradScaler (float16 AMP), the training statistics (``sync_free_logging``), gradient clipping
(``stability.max_grad_norm``) and the NaN/Inf policy (``stability.nan_policy``). A trainer
hands it a loss closure and calls ``step`` per minibatch; the closure is compiled
(``compile_train_step``) or captured in a CUDA graph (``cuda_graphs``) here, once for PPO, DQN
and IQN alike. The model-side flag (``compile_model``) and the process-wide settings
(precision, threads) live here too.
Under ``distributed.enabled`` the model is wrapped in DistributedDataParallel here
(``train_model``), so every trainer averages its gradients over the ranks.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from typing import Any, Callable

import torch
from torch import nn

from reference_trainers.runtime import device as dev
from reference_trainers.runtime import distributed
from reference_trainers.config.schema import OptimizationsConfig, TrainConfig
from reference_trainers.paths.numpy_acting import numpy_blas_threads
from reference_trainers.paths.speedups import CompiledOrEager, CudaGraphedStep, FusedAdamStep, clip_grad_norm, make_adam
from reference_trainers.paths.training_stats import make_stats

log = logging.getLogger("rlgauge")

LossFn = Callable[..., tuple[torch.Tensor, ...]]
"""``loss(*batch) -> (scalar loss, stats)``: 0-d stats are logged; other tensors (e.g.
per-sample TD errors for replay priorities) are handed back to the caller of ``step``.
A closure that sets the gradients (``sets_grads``) may also clip them itself, inside its own
compiled step (``Learner.clipped``), and return ``(loss, stats, gradient norm)``."""


class UpdatePath(abc.ABC):
    """A trainer's update path as the learner's loss closure (``ppo.updates``, ``value.updates``):
    called per minibatch as ``LossFn``; ``bind`` once, by the learner being built with it."""

    sets_grads = False                           # the path writes every gradient itself: no backward
    compiled: CompiledOrEager | None = None      # its compiled step, if any (``compile_fallback``)

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer                   # the trainer whose model, loss and settings the path reads

    def bind(self, learner: Learner) -> None:
        """Take what the path needs of its learner (flat gradients, parameter order)."""

    @abc.abstractmethod
    def __call__(self, *batch: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One minibatch: (loss, stats) or, clipped by the path itself, (loss, stats, gradient norm)."""


class NonFiniteError(RuntimeError):
    """A loss or gradient was NaN/Inf under ``stability.nan_policy: raise``."""


def apply_process_settings(optimizations: OptimizationsConfig) -> None:
    """Apply a trainer's process-wide settings (matmul precision, TF32, intra-op threads, NumPy's
    BLAS threads under ``numpy_acting``).

    Global state: trainers call this at the start of each iteration, so two trainers in one
    process (baseline and optimised, interleaved) each run with their own settings.
    """
    dev.apply_precision(optimizations.matmul_precision, optimizations.tf32)
    dev.apply_threads(optimizations.torch_threads)
    numpy_blas_threads.apply(bool(optimizations.numpy_acting))


def maybe_compile(model: nn.Module, optimizations: OptimizationsConfig, name: str = "model"
                  ) -> nn.Module | CompiledOrEager:
    """``compile_model``: ``torch.compile(model, mode=compile_mode)`` with a logged eager fallback."""
    if optimizations.compile_model:
        return CompiledOrEager(model, name, mode=optimizations.compile_mode)
    return model


def flat_gradients(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """One zeroed buffer holding every parameter's gradient: each ``.grad`` becomes a view of it."""
    first = params[0]
    flat = torch.zeros(sum(p.numel() for p in params), dtype=first.dtype, device=first.device)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def fell_back(*callables: object) -> bool:
    """True if any of these compiled callables fell back to eager (recorded as ``compile_fallback``)."""
    return any(isinstance(f, CompiledOrEager) and f.fell_back for f in callables)


class Learner:
    """Optimiser steps on ``model``'s parameters from a loss closure, with every update-side flag.

    Plain path: eager closure, for-loop Adam and per-tensor gradient clipping, float32,
    ``.item()`` per logged value (``optimizer_impl`` foreach/fused also clips with foreach kernels). Each flag
    swaps one piece (see the module docstring). ``train_model`` is the module a trainer's loss
    must call: ``model`` itself, or its DDP wrapper under ``distributed.enabled``. Guarded by
    tests/test_learner.py and, through the trainers, tests/test_ppo.py, tests/test_value_based.py,
    tests/test_distributed.py.
    """

    def __init__(self, model: nn.Module, loss: LossFn, config: TrainConfig, device: torch.device,
                 learning_rate: float, adam_eps: float, sets_grads: bool = False) -> None:
        o = config.optimizations
        self.model, self.loss, self.device = model, loss, device
        self.sets_grads = sets_grads  # the loss closure sets every gradient itself (analytic_grads): no backward
        self.train_model: nn.Module = distributed.wrap_model(model, device) if config.distributed.enabled else model
        self.nan_policy = config.stability.nan_policy
        self.max_grad_norm = config.stability.max_grad_norm
        self.amp, self.amp_dtype = bool(o.amp), dev.amp_dtype(config)
        self.scaler = dev.grad_scaler(device, enabled=self.amp and self.amp_dtype == torch.float16)
        # a plain bool: compiled steps read it (``GradScaler.is_enabled`` is a graph break under torch.compile)
        self.loss_scaling = self.scaler.is_enabled()
        lr: float | torch.Tensor = learning_rate
        if o.cuda_graphs:
            lr = torch.tensor(lr, dtype=torch.float32, device=device)
        self.optimizer = make_adam(model.parameters(), lr, adam_eps, o.optimizer_impl, capturable=bool(o.cuda_graphs))
        self.params = list(model.parameters())
        # a closure that sets every gradient writes them into one flat buffer: clipping is one norm and one scale
        self.flat_grad = flat_gradients(self.params) if sets_grads else None
        self.foreach_clip = bool(o.foreach_grad_clip)
        # direct_adam_step: the fused kernel called directly on the optimiser's state (resolve allows it with
        # fused Adam, no CUDA graph capture and no GradScaler); plain: ``optimizer.step()``
        self.direct_step = FusedAdamStep(self.optimizer) if o.direct_adam_step else None
        self.stats = make_stats(o.sync_free_logging, device)
        self.cuda_graphs = bool(o.cuda_graphs)
        self.loss_and_grads: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]] = (
            # dynamic=None: static shapes (a minibatch keeps its size), dynamic only if one changes;
            # dynamic=True failed to compile on CUDA with torch 2.11 (a shape guard without a source)
            CompiledOrEager(self._loss_and_grads, "train_step", dynamic=None) if o.compile_train_step and not sets_grads
            else self._loss_and_grads)
        self.graphed: CudaGraphedStep | None = None
        self.nonfinite_events = 0
        if isinstance(loss, UpdatePath):
            loss.bind(self)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast context for forward passes (a no-op when AMP is off)."""
        return dev.autocast(self.device, self.amp, self.amp_dtype)

    # ----------------------------------------------------------------- one step
    def _loss_and_grads(self, *batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """Forward, loss, backward and gradient clipping for one minibatch (the train-step closure)."""
        if self.flat_grad is None:
            self.optimizer.zero_grad(set_to_none=True)
        loss, stats, *clipped_norm = self.loss(*batch)
        if clipped_norm:  # the closure clipped the flat gradients itself (``clipped``)
            return loss.detach(), stats, clipped_norm[0]
        if not self.sets_grads:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        if self.flat_grad is not None:  # every gradient overwritten in place: no zeroing, one norm
            grad_norm = torch.linalg.vector_norm(self.flat_grad)
            if self.max_grad_norm is not None:
                self.flat_grad.mul_(self._clip_scale(grad_norm))
            return loss.detach(), stats, grad_norm
        params = self.params
        if self.max_grad_norm is not None:
            grad_norm = clip_grad_norm(params, self.max_grad_norm, self.foreach_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        return loss.detach(), stats, grad_norm

    def _clip_scale(self, grad_norm: torch.Tensor) -> torch.Tensor:
        """The factor that brings gradients of norm ``grad_norm`` within ``max_grad_norm``."""
        return (self.max_grad_norm / (grad_norm + 1e-6)).clamp(max=1.0)

    def clipped(self, flat: torch.Tensor, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``flat`` gradients clipped to ``stability.max_grad_norm`` (if set), their norm before, and
        ``nonfinite`` (1.0 if the loss or the norm is NaN/Inf): a pure function, for a hand-written
        step that clips inside its compiled graph and reports ``nonfinite`` among its stats."""
        grad_norm = torch.linalg.vector_norm(flat)
        clipped = flat if self.max_grad_norm is None else flat * self._clip_scale(grad_norm)
        return clipped, grad_norm, self._nonfinite(loss, grad_norm)

    def adopt(self, loss: torch.Tensor, stats: dict[str, torch.Tensor], flat: torch.Tensor,
              grad_norm: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """A compiled hand-written step's output as the loss closure returns it: its clipped flat
        gradients copied into ``flat_grad`` (the parameters' ``.grad``), then (loss, stats, norm)."""
        self.flat_grad.copy_(flat)
        return loss, stats, grad_norm

    def _nonfinite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """1.0 if the loss or the gradient norm is NaN/Inf, else 0.0; with float16 AMP only the
        loss counts (gradient overflow is the GradScaler's business)."""
        finite = torch.isfinite(loss)
        if not self.loss_scaling:
            finite = finite & torch.isfinite(grad_norm)
        return (~finite).float()

    def _graphed_step(self, *batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """Loss, grads and the optimiser step in one function, for CUDA graph capture."""
        loss, stats, grad_norm = self._loss_and_grads(*batch)
        self.optimizer.step()
        return loss, stats, grad_norm

    def step(self, *batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """One optimiser step on ``batch``; logs the 0-d stats and returns all of them."""
        if self.cuda_graphs:
            if self.graphed is None:
                self.graphed = CudaGraphedStep(self._graphed_step, self.model, self.optimizer, tuple(batch))
            loss, stats, grad_norm = self.graphed(*batch)
            self._finite_ok(loss, grad_norm)
        else:
            loss, stats, grad_norm = self.loss_and_grads(*batch)
            if self._finite_ok(loss, grad_norm, stats.pop("nonfinite", None), logged=stats):
                if self.direct_step is not None:
                    self.direct_step()
                else:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
        self.stats.add_all({name: value for name, value in stats.items() if value.ndim == 0})
        return stats

    def _finite_ok(self, loss: torch.Tensor, grad_norm: torch.Tensor, nonfinite: torch.Tensor | None = None,
                   logged: dict[str, torch.Tensor] | None = None) -> bool:
        """Apply ``stability.nan_policy``; True if the optimiser step should run.

        ``skip_update`` decides per update (one host sync); ``raise``/``warn`` record the
        flag in the statistics, checked by ``flush`` at the end of the iteration (no extra
        sync). With float16 AMP, gradient overflow is the GradScaler's business: only the
        loss counts. ``nonfinite``: the flag as a compiled step computed it (``clipped``).
        ``logged``: the step's statistics, logged with the flag in one add (else it is logged alone).
        """
        if nonfinite is None:
            nonfinite = self._nonfinite(loss, grad_norm)
        if self.nan_policy == "skip_update":
            if bool(nonfinite):
                self.nonfinite_events += 1
                log.warning("non-finite loss or gradient: update skipped (stability.nan_policy=skip_update)")
                return False
            return True
        if logged is None:
            self.stats.add("nonfinite", nonfinite)
        else:
            logged["nonfinite"] = nonfinite
        return True

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Optimiser and GradScaler state and the non-finite count (statistics are flushed between iterations)."""
        return {"optimizer": self.optimizer.state_dict(), "scaler": self.scaler.state_dict(),
                "nonfinite_events": self.nonfinite_events}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        live_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, live in zip(self.optimizer.param_groups, live_lrs):
            if torch.is_tensor(live):  # cuda_graphs: keep the device tensor the graph reads, with the saved value
                live.fill_(float(group["lr"]))
                group["lr"] = live
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.nonfinite_events = int(state["nonfinite_events"])
        if self.direct_step is not None:
            self.direct_step.refresh()  # the optimiser's state tensors were replaced
        self.graphed = None  # a captured graph holds the old optimiser tensors: capture again

    # ----------------------------------------------------------------- between steps
    def set_learning_rate(self, lr: float) -> None:
        """Set every parameter group's learning rate (in place for a tensor lr, so graphs see it)."""
        for group in self.optimizer.param_groups:
            if torch.is_tensor(group["lr"]):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def flush(self, updates: int, iteration: int) -> dict[str, float]:
        """Means of the logged stats since the last flush; counts non-finite updates and applies
        ``nan_policy`` (``raise``: ``NonFiniteError``; ``warn``: one warning per iteration)."""
        means = self.stats.flush()
        events = round(means.pop("nonfinite", 0.0) * updates)
        if events:
            self.nonfinite_events += events
            message = f"{events} update(s) with a non-finite loss or gradient in iteration {iteration}"
            if self.nan_policy == "raise":
                raise NonFiniteError(message + " (stability.nan_policy=raise)")
            log.warning("%s (stability.nan_policy=warn)", message)
        return means
