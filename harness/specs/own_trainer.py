"""Your own trainer, measured as rlgauge measures its own: the public contract and its adapter.

A user's module provides a factory::

    def make_trainer(config: dict, *, device: str, seed: int) -> Trainer: ...

``config`` is the variant's merged ``config:`` section (plain YAML data, the user's own keys);
the object returned has ``iterate() -> int`` (env steps it took, or an object with an
``env_steps`` attribute, and optionally ``updates``: else the ``torch.optim`` steps taken in the
call count as its updates) and ``close()``. Optional: ``mean_recent_return()``,
``state_dict()`` / ``load_state_dict()`` (checkpoints), and phase reporting through the probe the
harness passes (a ``probe`` keyword of the factory, or a ``set_probe(probe)`` method):
``with probe.phase("env"): ...`` for env, inference, update, transfer, logging.

``load_factory`` imports ``MODULE:ATTRIBUTE`` (from the current folder, the YAML file's folder
or ``PYTHONPATH``); ``build_own_config`` validates the variant's data and ``--set`` overrides;
``OwnTrainer`` dresses the user's object as the harness's ``Trainer`` (the runner measures it
like the reference trainers: interleaved repeats, CPU time, sentinels, checkpoints). Bad input
is a ``UserError`` (exit 2, one line naming the module, the attribute and what is expected).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from reference_trainers.config.schema import RunConfig, config_error_from
from reference_trainers.config.files import apply_overrides, deep_merge, parse_override
from reference_trainers.config.errors import ConfigError

from harness.errors import UserError

log = logging.getLogger("rlgauge")

ALGO = "custom"
"""The ``algo`` recorded for a user's trainer (results, RUNS.md)."""
CALL_SIGNATURE = "make_trainer(config: dict, *, device: str, seed: int)"
FACTORY_SIGNATURE = f"{CALL_SIGNATURE} -> an object with iterate() and close()"
RESERVED = ("run", "device", "seed")
"""``--set`` keys that address rlgauge (``run.*``, ``device``, ``seed``); any other key is the user's
(``config.KEY`` addresses a user key of the same name)."""


@runtime_checkable
class OwnTrainerProtocol(Protocol):
    """What rlgauge needs from a user's trainer (the optional methods are listed in the module doc)."""

    def iterate(self) -> int:
        """One chunk of training (a rollout and its update, or N env steps); the env steps it took."""

    def close(self) -> None:
        """Release envs, workers and files."""


class TrainerFactory(Protocol):
    def __call__(self, config: dict[str, Any], *, device: str, seed: int) -> OwnTrainerProtocol: ...


# --------------------------------------------------------------------------- the config of one variant

@dataclass(frozen=True)
class _Threads:
    torch_threads: int | None = None


@dataclass(frozen=True)
class _Envs:
    num_envs: int = 1
    id: str | None = None


@dataclass
class OwnConfig:
    """One variant of a user's trainer: the factory's name, the user's settings and rlgauge's ``run``."""

    trainer: str
    settings: dict[str, Any]
    run: RunConfig = field(default_factory=RunConfig)
    device: str = "auto"
    seed: int = 1
    algo: str = ALGO
    optimizations: _Threads = field(default_factory=_Threads)
    """Torch threads are the trainer's own business: torch's default (capped under fair threads)
    until its factory sets them; the adapter keeps what the factory left in force."""

    @property
    def env(self) -> _Envs:
        """``num_envs`` from the user's settings where it is a positive integer (host syncs per vector step)."""
        count = self.settings.get("num_envs")
        ok = isinstance(count, int) and not isinstance(count, bool) and count > 0
        return _Envs(num_envs=count if ok else 1)

    def plain(self) -> dict[str, Any]:
        """The result file's ``config``: the factory, device, seed, ``run`` and the user's ``config``."""
        return {"trainer": self.trainer, "device": self.device, "seed": self.seed,
                "run": self.run.model_dump(mode="json"), "config": deep_merge({}, self.settings)}


def build_own_config(trainer: str, data: dict[str, Any], overrides: list[str], source: str) -> OwnConfig:
    """Validate a variant (``config`` merged with the variant's keys, plus the file's ``run``,
    ``device`` and ``seed``) and the ``--set`` overrides into an ``OwnConfig``."""
    settings = data.get("config") or {}
    run = data.get("run") or {}
    if not isinstance(settings, dict):
        raise ConfigError(f"{source}: config must be a mapping of your trainer's settings")
    if not isinstance(run, dict):
        raise ConfigError(f"{source}: run must be a mapping (steps, warmup_steps, repeats, ...)")
    top = {"device": data.get("device", "auto"), "seed": data.get("seed", 1)}
    user_sets, own_sets = [], []
    for text in overrides:
        path, _ = parse_override(text)
        if path[0] == "config" and len(path) > 1:
            user_sets.append(text.split(".", 1)[1])
        elif path[0] in RESERVED:
            own_sets.append(text)
        else:
            user_sets.append(text)
    own = apply_overrides({**top, "run": run}, own_sets)
    try:
        run_config = RunConfig.model_validate(own["run"])
    except Exception as exc:  # pydantic's ValidationError: one line naming run.KEY
        raise _run_error(exc) from None
    device, seed = own["device"], own["seed"]
    if not isinstance(device, str):
        raise ConfigError(f"device: invalid value {device!r}: expected auto, cpu, cuda[:N] or mps")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise ConfigError(f"seed: invalid value {seed!r}: expected an integer in [0, 2**31 - 1]")
    return OwnConfig(trainer, apply_overrides(settings, user_sets), run_config, device, seed)


def _run_error(exc: Exception) -> ConfigError:
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return ConfigError(f"run: {exc}")
    first = exc.errors()[0]
    if first["type"] == "extra_forbidden":
        key = ".".join(str(part) for part in first["loc"])
        return ConfigError(f"run.{key}: unknown key (accepted in run: {', '.join(RunConfig.model_fields)})")
    error = config_error_from(exc)
    return ConfigError(f"run.{error}" if not str(error).startswith("run.") else str(error))


# --------------------------------------------------------------------------- finding the factory

def check_trainer_text(text: Any, origin: str = "--trainer") -> tuple[str, str]:
    """``(module, attribute)`` of ``MODULE:ATTRIBUTE``; ``UserError`` blaming ``origin`` (``--trainer``,
    or a file's ``trainer:`` key) for anything else."""
    if not isinstance(text, str):
        raise UserError(f"{origin} {text!r}: expected MODULE:ATTRIBUTE (e.g. my_pkg.train:make_trainer)")
    module_name, sep, attribute = text.partition(":")
    if not sep or not module_name or not attribute:
        example = f"{module_name or text or 'my_pkg.train'}:make_trainer"
        raise UserError(f"{origin} {text}: expected MODULE:ATTRIBUTE (e.g. {example})")
    return module_name, attribute


def load_factory(text: str, search: list[Path] | None = None, origin: str = "--trainer") -> Callable[..., Any]:
    """Import ``MODULE:ATTRIBUTE`` (dotted attributes allowed) from the current folder, ``search``
    folders or ``PYTHONPATH``; ``UserError`` naming ``origin``, what is wrong and what is expected."""
    module_name, attribute = check_trainer_text(text, origin)
    named = f"{origin} {text}"
    for folder in [Path.cwd(), *(search or [])]:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UserError(f"{named}: no module named {module_name!r} in the current folder, the config "
                            f"file's folder or PYTHONPATH; expected an importable module") from None
        raise UserError(f"{named}: importing {module_name} failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises on import is bad input
        raise UserError(f"{named}: importing {module_name} raised {type(exc).__name__}: "
                        f"{' '.join(str(exc).split())}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UserError(f"{named}: module {module_name} has no attribute {attribute!r}; expected a "
                            f"factory {FACTORY_SIGNATURE}")
        target = getattr(target, part)
    if not callable(target):
        raise UserError(f"{named}: {attribute} is a {type(target).__name__}, not callable; expected a "
                        f"factory {FACTORY_SIGNATURE}")
    check_signature(target, named)
    return target


def _factory_kwargs(factory: Callable[..., Any], device: str, seed: int, probe: Any) -> dict[str, Any]:
    """The keywords the factory is called with: ``device``, ``seed`` and ``probe`` where it takes one."""
    kwargs: dict[str, Any] = {"device": device, "seed": seed}
    if _takes_probe(factory):
        kwargs["probe"] = probe
    return kwargs


def check_signature(factory: Callable[..., Any], named: str) -> None:
    """Refuse (``UserError``) a factory that cannot be called as ``make_trainer(config, *, device, seed)``:
    a wrong signature is bad input, not the trainer's failure (a ``TypeError`` raised inside its body is)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read (a builtin, say): the call decides
        return
    try:
        signature.bind({}, **_factory_kwargs(factory, "cpu", 1, None))
    except TypeError as exc:
        name = getattr(factory, "__name__", type(factory).__name__)
        raise UserError(f"{named}: expected a factory {CALL_SIGNATURE}; {name}{signature} cannot be called so "
                        f"({exc})") from None


def _takes_probe(factory: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "probe" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


# --------------------------------------------------------------------------- the adapter

class TrainerExhausted(Exception):
    """``iterate()`` raised ``StopIteration``: the trainer (a generator, say) has no more iterations."""


class GeneratorTrainer:
    """A generator as a trainer: each ``next()`` is one ``iterate()`` (the value yielded: the env
    steps it took), ``close()`` closes the generator (its ``finally`` blocks run).

    So a script's main block becomes a factory without re-indenting it: turn
    ``if __name__ == "__main__":`` into ``def make_trainer(config, *, device, seed):`` and add
    ``yield STEPS`` at the end of its training loop's body."""

    def __init__(self, generator: Any) -> None:
        self.generator = generator

    def iterate(self) -> Any:
        return next(self.generator)

    def close(self) -> None:
        self.generator.close()


def step_count(value: Any, label: str, optimizer_steps: int = 1) -> tuple[int, int, int]:
    """``(env_steps, agent_steps, updates)`` from what ``iterate()`` returned: a positive int, or an
    object with a positive int ``env_steps`` (``agent_steps`` and ``updates`` read where present).
    Without its own ``updates``, the call's updates are ``optimizer_steps``."""
    steps = getattr(value, "env_steps", value)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise UserError(f"{label}: iterate() returned {_short(value)}; expected the env steps it took, a positive "
                        "int (or an object with a positive int env_steps)")
    agent = getattr(value, "agent_steps", steps)
    updates = getattr(value, "updates", None)
    own = isinstance(updates, int) and not isinstance(updates, bool) and updates >= 0
    return steps, agent if isinstance(agent, int) and agent > 0 else steps, updates if own else optimizer_steps


class OptimizerSteps:
    """Counts ``torch.optim.Optimizer`` steps taken in this process while registered (torch's global
    post-step hook: one Python call per step). ``remove()`` unregisters it."""

    def __init__(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.count = 0
        self._handle = register_optimizer_step_post_hook(self)

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.count += 1

    def remove(self) -> None:
        self._handle.remove()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class OwnTrainer:
    """A user's trainer as the harness's ``Trainer``: counts steps and iterations, keeps the torch
    threads its factory left in force (variants interleave in one process), passes the probe."""

    measures_latency = False
    """No ``select_actions``: inference latency is not measured (the phase split still is)."""

    def __init__(self, factory: Callable[..., Any], config: OwnConfig, device: Any, probe: Any) -> None:
        import torch

        from reference_trainers.runtime import device as dev

        self.label, self.config = config.trainer, config
        dev.apply_threads(None)  # torch's default (capped under fair threads) unless the factory says otherwise
        kwargs = _factory_kwargs(factory, str(device), config.seed, probe)
        made = factory(deep_merge({}, config.settings), **kwargs)
        if inspect.isgenerator(made):
            made = GeneratorTrainer(made)
        missing = [name for name in ("iterate", "close") if not callable(getattr(made, name, None))]
        if missing:
            raise UserError(f"--trainer {self.label}: it returned {type(made).__name__}, which has no "
                            f"{' or '.join(m + '()' for m in missing)}; expected an object with iterate() -> int and "
                            "close()")
        if "probe" not in kwargs and callable(getattr(made, "set_probe", None)):
            made.set_probe(probe)
        self.inner = made
        self.optimizer_steps = OptimizerSteps()  # the updates of a call whose result does not carry its own
        self._unhook = weakref.finalize(self, self.optimizer_steps.remove)  # also if never closed
        self.torch_threads = torch.get_num_threads()
        self.validate_args = _distribution_checks()
        """The distribution-argument-checks default this trainer runs with: what its factory left, and what its own
        calls leave (torch's first compile in a process turns it off for the whole process)."""
        self.env_steps = 0
        self.iterations = 0
        self.threads_warned = False

    def activate(self) -> None:
        import torch

        if torch.get_num_threads() != self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        if _distribution_checks() != self.validate_args:  # another variant compiled in this process since
            torch.distributions.Distribution.set_default_validate_args(self.validate_args)

    def iterate(self) -> Any:
        from reference_trainers.runtime.trainer import IterationResult

        import torch

        self.activate()
        self.optimizer_steps.count = 0
        try:
            done = self.inner.iterate()
        except StopIteration:
            raise TrainerExhausted(f"your trainer {self.label} ran out of iterations (iterate() raised StopIteration) "
                                   f"after {self.env_steps:,} env steps in {self.iterations} calls") from None
        if torch.get_num_threads() != self.torch_threads:  # set inside iterate(): kept for the later calls
            if not self.threads_warned:
                log.warning("your trainer %s set torch threads to %d inside iterate() (its factory left %d): kept for "
                            "its later calls; set them in the factory so the warm-up and every call run with them",
                            self.label, torch.get_num_threads(), self.torch_threads)
                self.threads_warned = True
            self.torch_threads = torch.get_num_threads()
        self.validate_args = _distribution_checks()
        env_steps, agent_steps, updates = step_count(done, f"--trainer {self.label}", self.optimizer_steps.count)
        self.env_steps += env_steps
        self.iterations += 1
        return IterationResult(env_steps=env_steps, agent_steps=agent_steps, updates=updates)

    def mean_recent_return(self) -> float | None:
        method = getattr(self.inner, "mean_recent_return", None)
        value = method() if callable(method) else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def nonfinite_events(self) -> int:
        value = getattr(self.inner, "nonfinite_events", 0)
        return value if isinstance(value, int) else 0

    @property
    def compile_fallback(self) -> bool:
        return bool(getattr(self.inner, "compile_fallback", False))

    @property
    def checkpointable(self) -> bool:
        return all(callable(getattr(self.inner, name, None)) for name in ("state_dict", "load_state_dict"))

    def state_dict(self) -> dict[str, Any]:
        if not self.checkpointable:
            raise UserError(f"--trainer {self.label}: checkpoints need state_dict() and load_state_dict() on the "
                            "trainer; accepted: run without --checkpoint-every / --resume")
        return {"trainer": self.inner.state_dict(), "env_steps": self.env_steps, "iterations": self.iterations,
                "config": self.config.plain()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.checkpointable:
            self.state_dict()  # the same one-line refusal
        self.inner.load_state_dict(state["trainer"])
        self.env_steps, self.iterations = int(state["env_steps"]), int(state["iterations"])

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self._unhook()


def _distribution_checks() -> bool:
    """torch.distributions' process-wide default for argument checks."""
    import torch

    return bool(torch.distributions.Distribution._validate_args)


def own_builder(factory_text: str, search: list[Path] | None = None,
                origin: str = "--trainer") -> Callable[..., OwnTrainer]:
    """``VariantSpec.build`` for a user's trainer: the factory is imported and its signature checked
    now (bad input fails before anything runs, blaming ``origin``), the trainer built when the runner asks."""
    factory = load_factory(factory_text, search, origin)

    def build(resolution: Any, probe: Any = None) -> OwnTrainer:
        return OwnTrainer(factory, resolution.config, resolution.device, probe)

    return build


@dataclass
class OwnResolution:
    """What the runner reads of a resolved variant, for a user's trainer (no flags to resolve)."""

    config: OwnConfig
    device: Any
    reasons: dict[str, str] = field(default_factory=dict)


def resolve_own(config: OwnConfig) -> OwnResolution:
    """The variant's device resolved (``auto``: MPS > CUDA > CPU; one not here is a ``DeviceError``)."""
    from reference_trainers.runtime import device as dev

    device = dev.resolve_device(config.device)
    config.device = str(device)
    return OwnResolution(config, device)
