"""The phase hooks: torch's global module and optimizer hooks and wrappers around env steps, autograd's update
calls, cross-device copies, tensors made from NumPy data and ``torch.compile`` (``phases`` says what each counts).

Nothing of rlgauge's runs inside a compiled region: every hook and wrapper returns at once when
dynamo traces it (``torch.compiler.is_compiling()``), so no guard is taken on rlgauge's state and no
counter of it is put in a graph; the wrappers' own frames are skipped by dynamo when compiled code
calls them eagerly (at a graph break), so they run as plain Python there. A compiled callable is
timed from outside (``compiled``): its role is what it does (stepping an optimizer's parameters: an
update) and its call site is the loop's call.

``hooks`` installs everything at once; a compiled trainer keeps them installed from before it is
built to the end (``HookSet.keep``): dynamo guards on the global hook tables and on the functions
it inlined, so removing them between passes would make recompiles of rlgauge's making.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from harness.diagnosis.compiled import CompiledCalls, is_compiled_module
from harness.diagnosis.phases import LoopCounters, PhaseClock, rows_of

_compiling = torch.compiler.is_compiling


@dataclass
class HookView:
    """What the installed hooks report to; the diagnosis swaps ``clock``/``counters`` between passes."""

    clock: PhaseClock
    counters: LoopCounters
    finder: Any = None
    compiled: CompiledCalls = field(default_factory=CompiledCalls)

    def idle(self) -> bool:
        return _compiling() or not self.clock.enabled


def _device_of(args: tuple, kwargs: dict) -> torch.device | None:
    target = kwargs.get("device")
    if target is None:
        for arg in args:
            if isinstance(arg, (str, torch.device)) and not isinstance(arg, torch.dtype):
                target = arg
                break
            if isinstance(arg, torch.Tensor):
                target = arg.device
                break
    try:
        return None if target is None else torch.device(target)
    except (RuntimeError, TypeError):
        return None


ENV_METHODS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("gymnasium", "Env", ("step", "reset")),
    ("gymnasium.vector", "VectorEnv", ("step", "reset")),
    ("gym", "Env", ("step", "reset")),
    ("torchrl.envs", "EnvBase", ("step", "step_and_maybe_reset", "reset")),
    ("stable_baselines3.common.vec_env", "VecEnv", ("step", "reset")),
    ("envpool.python.envpool", "EnvPoolMixin", ("step", "reset")),
)
"""Env bases whose stepping is env time (module, class, methods), each with every subclass loaded: a library's
wrapper (TorchRL's ``EnvBase``, SB3's ``VecEnv``, EnvPool) is one env call, and so is gymnasium's own step."""

STEP_METHODS = ("step", "step_and_maybe_reset")


def env_classes() -> list[tuple[type, tuple[str, ...]]]:
    """Each env base above whose library is loaded, and every subclass loaded now, with the methods to time."""
    found: list[tuple[type, tuple[str, ...]]] = []
    seen: set[type] = set()
    for module_name, class_name, methods in ENV_METHODS:
        base = getattr(sys.modules.get(module_name), class_name, None)
        todo = [base] if isinstance(base, type) else []
        while todo:
            cls = todo.pop()
            if cls in seen:
                continue
            seen.add(cls)
            found.append((cls, methods))
            todo.extend(cls.__subclasses__())
    return found


def env_name(env: Any) -> str:
    """The class stepped: a gymnasium wrapper's unwrapped env, a TorchRL transformed env's base env."""
    base = getattr(env, "base_env", None)
    if base is not None and base is not env:
        return f"{type(env).__name__}({type(base).__name__})"
    inner = getattr(env, "unwrapped", env) if hasattr(env, "env") else env
    return type(inner).__name__


class Patches:
    """Attribute patches undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def replace(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        had_own = name in vars(owner)
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original) if had_own else delattr(owner, name))

    def handle(self, handle: Any) -> None:
        self._undo.append(handle.remove)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


_SKIPPED: set[Any] = set()


def _skipped_by_dynamo(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """Dynamo runs ``wrapper``'s frame as plain Python when compiled code calls it at a graph break."""
    code = wrapper.__code__
    if code not in _SKIPPED:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))  # and the clock's frames
        _SKIPPED.add(code)
    return wrapper


def _timed(view: HookView, phase: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` timed as ``phase``; an outermost update call decides the pending forwards' role."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if _compiling():
            return original(*args, **kwargs)
        clock = view.clock
        if clock.enabled and clock.current is None:
            view.counters.resolve(phase)
        clock.enter(phase)
        try:
            return original(*args, **kwargs)
        finally:
            clock.leave()

    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    return _skipped_by_dynamo(wrapped)


def _eager(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper`` never traced by dynamo: compiled code breaks its graph at the call, as it does at the original."""
    disabled = torch._dynamo.disable(wrapper)
    disabled.__wrapped__ = wrapper.__wrapped__  # type: ignore[attr-defined]
    return disabled


def _copy(view: HookView, original: Callable[..., Any], default_target: str | None) -> Callable[..., Any]:
    """A tensor method that copies across devices when its target device differs from the tensor's."""

    def wrapped(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if view.idle():
            return original(tensor, *args, **kwargs)
        target = torch.device(default_target) if default_target else _device_of(args, kwargs)
        if target is None or target.type == tensor.device.type:
            return original(tensor, *args, **kwargs)
        view.clock.enter("transfer")
        try:
            return original(tensor, *args, **kwargs)
        finally:
            view.clock.leave()

    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    return _skipped_by_dynamo(wrapped)


def _env_call(view: HookView, original: Callable[..., Any]) -> Callable[..., Any]:
    """An env's ``step``/``reset``: env time, and the class of the outermost env called."""

    def wrapped(env: Any, *args: Any, **kwargs: Any) -> Any:
        clock, counters = view.clock, view.counters
        if clock.enabled and clock.current is None:
            counters.env_classes[env_name(env)] += 1
            if original.__name__ in STEP_METHODS:
                counters.env_step_calls += 1
                counters.resolve("inference")
        clock.enter("env")
        try:
            return original(env, *args, **kwargs)
        finally:
            clock.leave()

    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapped


def _from_host(view: HookView, original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.tensor``/``as_tensor``/``from_numpy``: a NumPy input is a host->device copy's start."""

    def wrapped(data: Any, *args: Any, **kwargs: Any) -> Any:
        if _compiling() or not isinstance(data, np.ndarray):
            return original(data, *args, **kwargs)
        clock = view.clock
        if clock.enabled:
            clock.count_host_tensor()
        clock.enter("transfer")
        try:
            return original(data, *args, **kwargs)
        finally:
            clock.leave()
            clock.host_tensor_made()

    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    return _skipped_by_dynamo(wrapped)


def _item_in_compiled(view: HookView, original: Callable[..., Any]) -> Callable[..., Any]:
    """``Tensor.item``: counted where a compiled call runs it (its generated code, or eager code at a graph break),
    by the compiled function: the syncs of the path that runs, which the eager replay of the audit cannot show."""

    def wrapped(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not _compiling() and view.clock.enabled:
            running = view.compiled.running()
            if running is not None:
                view.counters.compiled_syncs[running] += 1
        return original(tensor, *args, **kwargs)

    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    return _skipped_by_dynamo(wrapped)


def _compile(view: HookView, original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile``: a compiled function comes back wrapped so that its calls are timed from outside."""

    def wrapped(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        if model is None:  # used as @torch.compile(mode=...)
            return lambda fn: wrapped(fn, *args, **kwargs)
        compiled = original(model, *args, **kwargs)
        if isinstance(compiled, torch.nn.Module) or not callable(compiled):
            return compiled
        return view.compiled.wrap(view, compiled, model)

    wrapped.__wrapped__ = original  # type: ignore[attr-defined]
    return wrapped


class HookSet:
    """The hooks of ``hooks``, installed and removed on demand (``keep``: installed until ``close``)."""

    def __init__(self, clock: PhaseClock, counters: LoopCounters, finder: Any = None) -> None:
        self.view = HookView(clock, counters, finder)
        self._torch = Patches()
        self._envs = Patches()
        self.keep = False

    def install(self) -> None:
        """The torch-side hooks (once; kept while ``keep``) and the env wrappers of every env class loaded now."""
        if not self._torch._undo:
            self._install_torch()
        self._envs.undo()  # env classes loaded since (gym.make imports them) are wrapped too
        for cls, methods in env_classes():
            for name in methods:
                if name in vars(cls):
                    self._envs.replace(cls, name, lambda f: _env_call(self.view, f))

    def remove(self) -> None:
        """The env wrappers, and the torch-side hooks unless kept."""
        self._envs.undo()
        if not self.keep:
            self._torch.undo()

    def close(self) -> None:
        self.keep = False
        self.remove()

    def _install_torch(self) -> None:
        view, patches = self.view, self._torch
        forward_pre, forward_post = _module_hooks(view)
        step_pre, step_post = _optimizer_hooks(view)
        patches.handle(nn_module.register_module_forward_pre_hook(forward_pre))
        patches.handle(nn_module.register_module_forward_hook(forward_post, always_call=True))
        patches.handle(optim_module.register_optimizer_step_pre_hook(step_pre))
        patches.handle(optim_module.register_optimizer_step_post_hook(step_post))
        for owner, name in ((torch.Tensor, "backward"), (torch.nn.utils, "clip_grad_norm_")):
            patches.replace(owner, name, lambda f: _timed(view, "update", f))
        # calls dynamo breaks the graph at anyway: the break stays at the user's call, and the wrapper runs eagerly
        for owner, name in ((torch.autograd, "backward"), (torch.autograd, "grad"), (torch.optim.Optimizer, "zero_grad")):
            patches.replace(owner, name, lambda f: _eager(_timed(view, "update", f)))
        patches.replace(torch.Tensor, "to", lambda f: _copy(view, f, None))
        patches.replace(torch.Tensor, "cpu", lambda f: _copy(view, f, "cpu"))
        patches.replace(torch.Tensor, "cuda", lambda f: _copy(view, f, "cuda"))
        for name in ("tensor", "as_tensor", "from_numpy"):
            patches.replace(torch, name, lambda f: _from_host(view, f))
        patches.replace(torch, "compile", lambda f: _compile(view, f))
        patches.replace(torch.Tensor, "item", lambda f: _item_in_compiled(view, f))
        patches.replace(torch.optim.Optimizer, "__init__", lambda f: view.compiled.stepping.registering(f))


def _module_hooks(view: HookView) -> tuple[Callable[..., None], Callable[..., None]]:
    def forward_pre(module: torch.nn.Module, inputs: tuple) -> None:
        if _compiling():
            return
        clock, counters = view.clock, view.counters
        if counters.depth == 0 and is_compiled_module(module):
            view.compiled.enter(view, module, inputs)
        elif counters.depth == 0:
            builds_graph = _builds_graph(module, inputs)
            if clock.enabled and clock.current is None:
                counters.forward_seen(builds_graph, rows_of(inputs), view.finder)
            clock.enter_forward(builds_graph)
        else:
            clock.enter("inference")  # nested: the outer phase already runs, this one is not counted
        counters.depth += 1

    def forward_post(module: torch.nn.Module, inputs: tuple, output: Any) -> None:
        if _compiling():
            return
        counters = view.counters
        counters.depth = max(0, counters.depth - 1)
        if counters.depth == 0 and is_compiled_module(module):
            view.compiled.leave(view, module, output)
            return
        if counters.depth == 0 and view.clock.enabled:
            counters.watch_graph(output)
        view.clock.leave()

    return forward_pre, forward_post


def _optimizer_hooks(view: HookView) -> tuple[Callable[..., None], Callable[..., None]]:
    def step_pre(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if _compiling():
            return
        clock, counters = view.clock, view.counters
        counters.eager_steps += 1
        if clock.enabled:
            counters.optimizers[id(optimizer)] = optimizer
            counters.eager_optimizers.add(id(optimizer))
            counters.optimizer_steps += 1
            if clock.current is None:
                counters.resolve("update")
        clock.enter("update")

    def step_post(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if not _compiling():
            view.clock.leave()

    return step_pre, step_post


def _builds_graph(module: torch.nn.Module, inputs: tuple) -> bool:
    if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return False
    if any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs):
        return True
    return any(p.requires_grad for p in module.parameters())


@contextlib.contextmanager
def hooks(clock: PhaseClock, counters: LoopCounters, finder: Any = None) -> Iterator[HookSet]:
    """Install every hook and wrapper; remove them all on leaving, whatever happens. ``finder``
    (a ``frames.SiteFinder``) notes where inference forwards are called from."""
    hook_set = HookSet(clock, counters, finder)
    try:
        hook_set.install()
        yield hook_set
    finally:
        hook_set.close()
