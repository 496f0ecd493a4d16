"""The runtime changes, applied in the trainer's own (fresh) process: process settings before the factory is
imported, and a factory wrapper that applies the rest around the factory and each ``iterate()``.

- ``apply_process_changes``: distribution checks off, optimizer classes patched (fused / foreach),
  TF32 matmuls, cuDNN benchmark;
- ``trial_factory``: the user's factory with threads set after it, the modules it built recorded (torch's
  global parameter and submodule registration hooks, during the factory and the first ``iterate()``: a
  generator builds them there), compiled where asked, and the update's forwards under autocast where asked
  (``AutocastForwards``).
Guarded by ``tests/test_try.py``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils import _pytree as pytree

OPTIMIZER_CLASSES = ("Adam", "AdamW", "SGD", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta", "ASGD",
                     "Rprop")

implementations: dict[str, str] = {}
"""What the optimizer patch built, by class: ``fused`` or ``foreach`` (read back into the arm's result)."""
on_progress: Callable[[], None] = lambda: None  # noqa: E731
"""Called after every ``iterate()`` of a trial's trainer: the child's heartbeat (``child.Heartbeat``)."""


def apply_process_changes(names: list[str]) -> None:
    """The changes that are process settings (idempotent: applied again after the factory)."""
    if "no_validate_args" in names:
        torch.distributions.Distribution.set_default_validate_args(False)
    if "matmul_precision" in names:
        torch.set_float32_matmul_precision("high")
    if "cudnn_benchmark" in names:
        torch.backends.cudnn.benchmark = True
    if "fused_optimizer" in names or "foreach_optimizer" in names:
        _patch_optimizers("fused" if "fused_optimizer" in names else "foreach")


def _patch_optimizers(mode: str) -> None:
    """Every ``torch.optim`` class in ``OPTIMIZER_CLASSES`` built with ``fused=True`` (``mode`` fused, where the
    class has it and the device runs it; else ``foreach=True``)."""
    for name in OPTIMIZER_CLASSES:
        cls = getattr(torch.optim, name, None)
        if cls is None or getattr(cls.__init__, "_rlgauge_try", False):
            continue
        cls.__init__ = _patched_init(cls.__init__, name, mode)


def _patched_init(original: Callable[..., None], name: str, mode: str) -> Callable[..., None]:
    has_fused = "fused" in inspect.signature(original).parameters

    @functools.wraps(original)
    def init(self: Any, params: Any, *args: Any, **kwargs: Any) -> None:
        params = list(params)  # a generator is read once: kept for a second try
        if mode == "fused" and has_fused:
            try:
                original(self, params, *args, **{**kwargs, "fused": True, "foreach": None})
                implementations[name] = "fused"
                return
            except (RuntimeError, ValueError):  # fused does not run on these parameters' device
                pass
        fused = {"fused": None} if has_fused else {}
        original(self, params, *args, **{**kwargs, **fused, "foreach": True})
        implementations[name] = "foreach"

    init._rlgauge_try = True  # type: ignore[attr-defined]
    return init


class ModuleRecorder:
    """While active, records every ``nn.Module`` that gets a parameter, a buffer or a submodule, or is made by
    ``copy.deepcopy`` or unpickling (a target network), weakly held; an id reused after a module died is a new
    module."""

    def __init__(self) -> None:
        self._seen: dict[int, weakref.ref] = {}
        self._handles: list[Any] = []
        self._setstate: Callable[..., None] | None = None

    def _add(self, module: nn.Module) -> None:
        known = self._seen.get(id(module))
        if known is not None and known() is module:
            return
        self._seen.pop(id(module), None)  # a dead module's id: the new one goes last, in the order first seen
        self._seen[id(module)] = weakref.ref(module)

    def _on_tensor(self, module: nn.Module, name: str, tensor: Any) -> None:
        self._add(module)

    def _on_module(self, module: nn.Module, name: str, submodule: Any) -> None:
        self._add(module)
        if isinstance(submodule, nn.Module):
            self._add(submodule)

    def __enter__(self) -> "ModuleRecorder":
        self._handles = [module_hooks.register_module_parameter_registration_hook(self._on_tensor),
                         module_hooks.register_module_buffer_registration_hook(self._on_tensor),
                         module_hooks.register_module_module_registration_hook(self._on_module)]
        original = self._setstate = nn.Module.__setstate__
        add = self._add

        def setstate(module: nn.Module, state: dict[str, Any]) -> None:  # copy.deepcopy and pickle end here
            original(module, state)
            add(module)

        nn.Module.__setstate__ = setstate  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._setstate is not None:
            nn.Module.__setstate__ = self._setstate  # type: ignore[method-assign]
            self._setstate = None

    def top_level(self) -> list[nn.Module]:
        """The recorded modules alive and inside no other recorded one, in the order first recorded."""
        alive = [m for m in (ref() for ref in self._seen.values()) if m is not None]
        inner = {id(child) for m in alive for child in m.modules() if child is not m}
        return [m for m in alive if id(m) not in inner]


class AutocastForwards:
    """Autocast as AMP is used: the forward of each module called outermost while grad is enabled (the update's
    forwards, whatever method calls them; not acting under ``no_grad``) runs under ``torch.autocast(device_type,
    dtype=torch.bfloat16)``, and its outputs in a reduced precision leave as float32, so the loss, ``.numpy()`` and
    in-place ops on float32 tensors see float32; the optimizer step and the code between forwards stay float32.

    Those modules are found by global module hooks until the ``iterate()`` in which an optimizer stepped (its
    forwards came first), then hooked one by one: hooks, not wrappers, so a module copied later
    (``copy.deepcopy``) keeps them and calls its own forward."""

    def __init__(self, device_type: str) -> None:
        self._device_type = device_type
        self._open: list[contextlib.AbstractContextManager | None] = []  # one a hooked call in progress
        self._hooked: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self._depth = 0  # module calls in progress, while finding
        self._stepped = False
        self._finding = [module_hooks.register_module_forward_pre_hook(self._find),
                         module_hooks.register_module_forward_hook(self._found, always_call=True),
                         register_optimizer_step_post_hook(self._on_step)]

    def hook(self, module: nn.Module) -> None:
        """``module``'s forward under autocast from its next call (once per module)."""
        if module in self._hooked:
            return
        self._hooked.add(module)
        module.register_forward_pre_hook(self._enter, prepend=True)  # the user's hooks see float32 outputs
        module.register_forward_hook(self._leave, prepend=True, always_call=True)

    def iteration_done(self) -> None:
        """Stop finding once an ``iterate()`` stepped an optimizer."""
        if self._stepped:
            self.close()

    def close(self) -> None:
        for handle in self._finding:
            handle.remove()
        self._finding = []

    def _find(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0 and module not in self._hooked and self._autocasts():
            self.hook(module)
            self._enter(module, args)  # this call too: its pre-hooks were read before ours was added
        self._depth += 1

    def _found(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped = True

    def _autocasts(self) -> bool:
        return torch.is_grad_enabled() and not torch.is_autocast_enabled(self._device_type)

    @torch.compiler.disable
    def _enter(self, module: nn.Module, args: Any) -> None:
        """Run eagerly even where the module is called inside compiled code (a traced ``__enter__`` would be
        replayed by the graph while ``_leave`` ran for real): a graph break around the module's call."""
        context = None
        if self._autocasts():
            context = torch.autocast(device_type=self._device_type, dtype=torch.bfloat16)
            context.__enter__()
        self._open.append(context)

    @torch.compiler.disable
    def _leave(self, module: nn.Module, args: Any, output: Any) -> Any:
        context = self._open.pop() if self._open else None
        if context is None:
            return None
        context.__exit__(None, None, None)
        return pytree.tree_map_only(torch.Tensor, _as_float32, output)


def _as_float32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor


class TrialTrainer:
    """The user's trainer with the per-call changes: modules recorded until the first call has run (then compiled
    where asked), the update's forwards under autocast where asked. Anything else is the user's object's."""

    def __init__(self, inner: Any, names: list[str], recorder: ModuleRecorder, device_type: str) -> None:
        self._inner, self._names, self._recorder = inner, names, recorder
        self._first_done = False
        self._compiled: set[int] = set()
        self._autocast = AutocastForwards(device_type) if "autocast_bf16" in names else None
        self._compile_found()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def modules(self) -> list[nn.Module]:
        """The top-level modules the factory (and a generator's first call) built."""
        return self._recorder.top_level()

    def _compile_found(self) -> None:
        if "compile_modules" not in self._names:
            return
        for module in callable_roots(self._recorder.top_level()):
            if id(module) not in self._compiled:
                compile_module(module)
                self._compiled.add(id(module))

    def iterate(self) -> Any:
        if self._first_done:
            done = self._inner.iterate()
            if self._autocast is not None:
                self._autocast.iteration_done()
            on_progress()
            return done
        with self._recorder:
            done = self._inner.iterate()
        if self._autocast is not None:
            self._autocast.iteration_done()
        self._first_done = True
        after_factory(self._names)
        self._compile_found()
        on_progress()
        return done

    def close(self) -> None:
        if self._autocast is not None:
            self._autocast.close()
        self._inner.close()


def callable_roots(modules: list[nn.Module]) -> list[nn.Module]:
    """The modules to compile: each top-level module with a ``forward``; for a holder without one (CleanRL's
    ``Agent``, called through ``get_action_and_value``), its children, and so on down."""
    roots = []
    for module in modules:
        if type(module).forward is nn.Module.forward:
            roots += callable_roots(list(module.children()))
        else:
            roots.append(module)
    return roots


def compile_module(module: nn.Module) -> None:
    """``module``'s calls compiled, as ``nn.Module.compile()`` means them to be. The compiled frame is a function
    of this file: torch's own ``Module._call_impl`` is in dynamo's skip list, so ``module.compile()`` would leave
    the module eager (torch 2.13)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return module._call_impl(*args, **kwargs)

    module._compiled_call_impl = torch.compile(call)


def after_factory(names: list[str]) -> None:
    """What the factory (or a generator's first call) may have set back: threads, process settings."""
    if "threads_1" in names:
        torch.set_num_threads(1)
    apply_process_changes([n for n in names if n not in ("fused_optimizer", "foreach_optimizer")])


def trial_factory(factory: Callable[..., Any], names: list[str]) -> Callable[..., TrialTrainer]:
    """``factory`` with the runtime changes ``names`` applied around it and its trainer's calls."""
    from harness.specs.own_trainer import GeneratorTrainer

    try:
        parameters = inspect.signature(factory).parameters
        takes_probe = "probe" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                                   for p in parameters.values())
    except (TypeError, ValueError):
        takes_probe = False

    def build(config: dict[str, Any], **kwargs: Any) -> TrialTrainer:
        if not takes_probe:
            kwargs.pop("probe", None)
        if "threads_1" in names:
            torch.set_num_threads(1)
        recorder = ModuleRecorder()
        with recorder:
            made = factory(config, **kwargs)
        if inspect.isgenerator(made):
            made = GeneratorTrainer(made)
        after_factory(names)
        return TrialTrainer(made, names, recorder, torch.device(kwargs.get("device") or "cpu").type)

    return build
