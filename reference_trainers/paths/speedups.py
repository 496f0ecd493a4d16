"""One small helper per optimisation, each with its plain path beside it.

compile_or_eager   torch.compile with a logged, recorded eager fallback
hand_written_step  compiling a hand-written train step (behind inductor's C++ wrapper: compile_cpp_wrapper)
make_adam          forloop / foreach / fused Adam
FusedAdamStep      the fused Adam kernel called directly, without the optimiser's per-step bookkeeping
                   (direct_adam_step)
clip_grad_norm     per-tensor norms (torch.nn.utils), or multi-tensor foreach kernels
HostToDevice       pageable blocking copies, or pinned staging + non_blocking copies;
                   uint8 pixels as float32 from the host, or as uint8 (``uint8_transfer``)
CudaGraphedStep    capture a fixed-shape step once, replay it (CUDA only)
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

import numpy as np
import torch

log = logging.getLogger("rlgauge")


class CompiledOrEager:
    """Call ``torch.compile(fn)``; on the first failure log once, fall back to ``fn`` for good.

    ``fell_back`` and ``reason`` record what happened for the run's stability block.
    The wrapped step must be safe to re-run eagerly after a failed compiled call (the
    trainers zero gradients at the start of each step). Guarded by
    ``test_compile_failure_falls_back_once``.
    """

    def __init__(self, fn: Callable[..., Any], name: str, **compile_kwargs: Any) -> None:
        self.eager = fn
        self.name = name
        self.compile_kwargs = compile_kwargs
        self.fell_back = False
        self.reason = ""
        try:
            self._call = torch.compile(fn, **compile_kwargs)
        except Exception as exc:  # compile can fail eagerly on unsupported platforms
            self._fall_back(exc)

    def _fall_back(self, exc: BaseException) -> None:
        self.fell_back = True
        self.reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        log.warning("torch.compile of %s failed, running it eagerly from now on (%s)", self.name, self.reason)
        self._call = self.eager

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fell_back:
            return self.eager(*args, **kwargs)
        try:
            return self._call(*args, **kwargs)
        except Exception as exc:
            self._fall_back(exc)
            return self.eager(*args, **kwargs)


def hand_written_step(fn: Callable[..., Any], *, cpp_wrapper: bool) -> CompiledOrEager:
    """``fn`` (a train step with no autograd in it, fixed shapes) compiled as ``train_step``, as one
    graph. ``cpp_wrapper`` (``compile_cpp_wrapper``, CPU only): its kernels are called from
    inductor's C++ wrapper instead of its Python one, for seconds more compile time, once.
    Guarded by tests/test_unbundled_value.py."""
    options = {"cpp_wrapper": True} if cpp_wrapper else {}
    # fullgraph: a graph break would split the step into several compiled regions, each with its own
    # guards and wrappers: fall back to eager instead
    return CompiledOrEager(fn, "train_step", dynamic=False, fullgraph=True, options=options)


def make_adam(params: Iterable[torch.nn.Parameter], lr: float | torch.Tensor, eps: float, impl: str,
              capturable: bool = False) -> torch.optim.Adam:
    """Adam with the chosen implementation: ``forloop`` (per-tensor Python loop, the plain
    path), ``foreach`` (multi-tensor kernels) or ``fused`` (one fused kernel per group)."""
    choice = {"forloop": {"foreach": False, "fused": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]
    return torch.optim.Adam(params, lr=lr, eps=eps, capturable=capturable, **choice)


class FusedAdamStep:
    """``direct_adam_step``: ``optimizer.step()`` of a fused, single-device Adam, as the same two
    calls torch makes (``_foreach_add_`` on the step counters, ``_fused_adam_``) on the
    optimiser's own state tensors, without its per-step regrouping and checks.

    Resolve allows it with ``optimizer_impl: fused`` only, without CUDA graph capture or a
    GradScaler. Where the step needs more (a tensor learning rate, a parameter without a
    gradient) and for the first step (which creates the state) it calls ``optimizer.step()``.
    ``refresh()`` after the optimiser's state is replaced (a checkpoint load). Bit-identical to
    ``optimizer.step()``: guarded by ``test_fused_adam_step_matches_the_optimizer``.
    """

    def __init__(self, optimizer: torch.optim.Adam) -> None:
        self.optimizer = optimizer
        self._state: tuple[list[torch.Tensor], ...] | None = None
        self._counters = torch.zeros(0)

    def refresh(self) -> None:
        self._state = None

    def _collect(self) -> tuple[list[torch.Tensor], ...] | None:
        groups = self.optimizer.param_groups
        if len(groups) != 1:
            return None
        group = groups[0]
        params = list(group["params"])
        states = [self.optimizer.state.get(p) for p in params]
        plain = (group["fused"] and not group["amsgrad"] and not group["maximize"] and not group["capturable"]
                 and not group["differentiable"] and not group["decoupled_weight_decay"]
                 and len({(p.device, p.dtype) for p in params}) == 1)
        if not plain or any(not st for st in states):
            return None
        # the step counters become elements of one tensor (each state keeps a 0-d view of its own):
        # one add advances them all (``_foreach_add_`` on the CPU is a loop of adds)
        counters = torch.stack([st["step"] for st in states])
        for i, st in enumerate(states):
            st["step"] = counters[i]
        self._counters = counters
        return (params, [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states],
                [st["step"] for st in states])

    def __call__(self) -> None:
        group = self.optimizer.param_groups[0]
        if self._state is None:
            self._state = self._collect()
        if self._state is None or torch.is_tensor(group["lr"]):
            self.optimizer.step()
            self._state = self._collect()
            return
        params, exp_avgs, exp_avg_sqs, steps = self._state
        grads = [p.grad for p in params]
        if any(g is None for g in grads):
            self.optimizer.step()
            return
        beta1, beta2 = group["betas"]
        self._counters.add_(1)
        torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                           beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                           maximize=False, grad_scale=None, found_inf=None)


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float, foreach: bool) -> torch.Tensor:
    """Scale the gradients to a global L2 norm of at most ``max_norm``; returns the norm before clipping.

    Plain path: ``torch.nn.utils.clip_grad_norm_``. ``foreach`` (``foreach_grad_clip``):
    the same formula in three multi-tensor ops (norms, their norm, the
    scale), without the per-call checks. Guarded by ``test_foreach_clip_matches_torch``."""
    if not foreach:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


class HostToDevice:
    """Copy float32 host arrays to the training device.

    Plain path: ``torch.as_tensor(x).to(device)`` (pageable memory, blocking copy).
    ``pinned=True`` stages through a reused, grow-only page-locked buffer per name (CUDA
    only); ``non_blocking=True`` issues the copy asynchronously, and the next copy through
    the same buffer first waits for it (a CUDA event), so staging is never overwritten early. Arrays are made float32 on the
    host first, so no float64 tensor is ever created (MPS has none).
    """

    def __init__(self, device: torch.device, pinned: bool = False, non_blocking: bool = False,
                 uint8: bool = False) -> None:
        self.device = device
        self.pinned = pinned
        self.non_blocking = non_blocking
        self.uint8 = uint8
        self._staging: dict[str, torch.Tensor] = {}
        self._copied: dict[str, torch.cuda.Event] = {}

    def __call__(self, array: np.ndarray, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        host = torch.from_numpy(np.ascontiguousarray(array, dtype=_NUMPY[dtype]))
        if not self.pinned:
            return host.to(self.device, non_blocking=self.non_blocking)
        # one grow-only staging buffer per name (replay inserts vary in size from step to step)
        buffer = self._staging.get(name)
        if buffer is None or buffer.numel() < host.numel() or buffer.dtype != dtype:
            buffer = self._staging[name] = torch.empty(max(host.numel(), 1), dtype=dtype, pin_memory=True)
        previous = self._copied.pop(name, None)
        if previous is not None:
            previous.synchronize()  # an asynchronous copy may still be reading the staging buffer
        staged = buffer[:host.numel()].view(host.shape)
        staged.copy_(host)
        out = staged.to(self.device, non_blocking=self.non_blocking)
        if self.non_blocking and self.device.type == "cuda":
            self._copied[name] = torch.cuda.Event()
            self._copied[name].record()
        return out


    def observations(self, array: np.ndarray, name: str) -> torch.Tensor:
        """Copy observations. Plain path: float32 on the host, then the copy (4 bytes a pixel).
        ``uint8=True`` (``optimizations.uint8_transfer``): uint8 pixels cross as uint8, one byte
        each, through the same pinned staging, and the network scales them on the device
        (``networks.normalise_pixels``). Guarded by ``test_uint8_transfer_feeds_identical_inputs``."""
        keep = self.uint8 and array.dtype == np.uint8
        return self(array, name, torch.uint8 if keep else torch.float32)


_NUMPY = {torch.float32: np.float32, torch.int64: np.int64, torch.bool: np.bool_, torch.uint8: np.uint8}


class CudaGraphedStep:
    """Capture ``step(*inputs)`` once in a CUDA graph and replay it for same-shape inputs.

    Needs: CUDA, fixed input shapes, no host syncs inside ``step``, an optimiser built with
    ``capturable=True``. Warm-up iterations run on a side stream before capture; parameter
    and optimiser state are restored afterwards so capture does not change training.
    Inputs of another shape run ``step`` eagerly (counted in ``eager_calls``).
    Guarded by ``test_cuda_graphs_match_eager`` (CUDA only).
    """

    def __init__(self, step: Callable[..., Any], module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 example_inputs: tuple[torch.Tensor, ...], warmup: int = 3) -> None:
        self.step = step
        self.eager_calls = 0
        self.static_inputs = tuple(x.detach().clone() for x in example_inputs)
        saved = _snapshot(module, optimizer)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                step(*self.static_inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_outputs = step(*self.static_inputs)
        _restore(module, optimizer, saved)

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if any(x.shape != s.shape for x, s in zip(inputs, self.static_inputs)):
            self.eager_calls += 1
            return self.step(*inputs)
        for static, x in zip(self.static_inputs, inputs):
            static.copy_(x)
        self.graph.replay()
        return self.static_outputs


def _snapshot(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, torch.Tensor | None]:
    saved: dict[int, torch.Tensor | None] = {id(p): p.detach().clone() for p in module.parameters()}
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                saved[id(value)] = value.detach().clone()
    return saved


def _restore(module: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[int, torch.Tensor | None]) -> None:
    """Copy saved values back in place (graph replay uses these very tensors)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(saved[id(p)])
        for state in optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    before = saved.get(id(value))
                    value.copy_(before) if before is not None else value.zero_()
