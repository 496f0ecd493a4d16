"""One arm of a try in a fresh process: ``python -m harness.trials.processes.child REQUEST.json``.

The request (written by ``arms``) names the trainer (a YAML file, or ``--trainer`` with ``--config``), the
variant, the run overrides, the runtime changes and the folder of patched copies. The folder goes first on
``sys.path`` before the factory is imported, so the copies are imported in place of the user's files; the
runtime changes are applied before and around the factory (``runtime_patches``). Then, by ``mode``:

- ``parity``: N ``iterate()`` calls from the seed, then the state of every module the factory built and of every
  optimizer that stepped is saved (``torch.save``) for ``parity`` to compare;
- ``serve``: the trainer built (with ``parity`` true, first the ``parity`` mode's maths check on it, whose
  answer joins the ready answer), warmed up, one checked stretch unless ``checks`` is false
  (``runner.run_checks``: float64 ops and host syncs counted as ``rlgauge run`` counts them), then slices of training on request: JSON lines on stdin
  (``{"env_steps": N}``) answered on stdout (``{"env_steps", "wall", "cpu"}``) until stdin closes. What the
  trainer prints goes to stderr, the arm's log.

The answer (``{"parity"}``, or ``{"error"}`` with one line) goes to the request's ``out``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

BORN = time.monotonic()
"""When the process began importing this module: its answer says how long it took to be ready."""


class Heartbeat:
    """The arm's sign of progress: ``beat()`` touches a file (at most every ``EVERY_S``) whose age the parent reads;
    an arm silent for longer than ``--timeout`` is taken for hung (``arms``)."""

    EVERY_S = 0.5

    def __init__(self, path: str | None) -> None:
        import time

        self.path, self._clock, self._last = path, time.monotonic, float("-inf")
        self.beat()

    def beat(self) -> None:
        now = self._clock()
        if self.path and now - self._last >= self.EVERY_S:
            self._last = now
            Path(self.path).touch()


def _start(request: dict[str, Any]) -> Any:
    """The arm's process made ready for its trainer: heartbeat, import path, threads, process-wide changes; the
    spec."""
    beat = Heartbeat(request.get("heartbeat"))  # before torch is imported: the start's silences stay short
    from harness.trials import runtime_patches

    beat.beat()
    runtime_patches.on_progress = beat.beat
    _arrange_path(request["sys_path"], request.get("patched_dir"))
    _cap_threads(request)
    runtime_patches.apply_process_changes(request["changes"])
    beat.beat()
    spec = _spec(request)
    beat.beat()
    return spec


def _arrange_path(search: list[str], patched: str | None) -> None:
    """The parent's import folders (the user's), then the patched copies before all of them."""
    for folder in reversed(search):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    if patched:
        sys.path.insert(0, patched)


def _cap_threads(request: dict[str, Any]) -> None:
    """The parent's ``run.fair_threads`` decision: torch's default thread count capped as ``rlgauge run`` caps it."""
    if request.get("threads_cap"):
        from reference_trainers.runtime import device as dev

        dev.cap_default_threads(request["threads_cap"])


def _spec(request: dict[str, Any]) -> Any:
    from harness.specs.own_trainer import load_factory
    from harness.specs.presets import load_preset, own_trainer_preset, specs_of
    from harness.trials.runtime_patches import trial_factory

    if request["trainer"]:
        config = request["config"]
        preset = own_trainer_preset(request["trainer"], Path(config) if config else None)
    else:
        preset = load_preset(request["target"])
    (spec,) = specs_of(preset, request["variant"], request["overrides"])
    factory = load_factory(preset.trainer, [preset.folder] if preset.folder else None, preset.trainer_origin)
    wrapped = trial_factory(factory, request["changes"])

    def build(resolution: Any, probe: Any = None) -> Any:
        from harness.specs.own_trainer import OwnTrainer

        return OwnTrainer(wrapped, resolution.config, resolution.device, probe)

    spec.build = build
    return spec


def _parity(spec: Any, iterations: int, params_out: str) -> dict[str, Any]:
    """The maths check in a process of its own (``parity`` mode): a trainer built from the seed, ``_parity_of``."""
    from harness.measurement.metrics import TimingProbe
    from harness.measurement.runner import resolve_specs

    from harness.trials.seeding import SeedAudit

    (resolution,) = resolve_specs([spec])
    with SeedAudit() as audit, OptimizerSteps() as stepped:
        trainer = spec.build(resolution, probe=TimingProbe())
        try:
            answer = _parity_of(trainer, resolution, stepped, iterations, params_out)
        finally:
            trainer.close()
    answer["parity"]["unseeded"] = audit.findings()
    return answer


class OptimizerSteps:
    """Every optimizer step counted while entered, and each optimizer that stepped held (its state is read)."""

    def __init__(self, snapshot: Callable[[], Any] | None = None) -> None:
        self.snapshot = snapshot
        self.before_first: Any = None
        """``snapshot()``'s value just before the first optimizer step (the weights as built)."""

    def __enter__(self) -> OptimizerSteps:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.count, self.optimizers = 0, []
        self._handles = [register_optimizer_step_post_hook(self._stepped),
                         register_optimizer_step_pre_hook(self._stepping)]
        return self

    def _stepping(self, *_: Any) -> None:
        if self.count == 0 and self.before_first is None and self.snapshot is not None:
            self.before_first = self.snapshot()

    def _stepped(self, optimizer: Any, *_: Any) -> None:
        self.count += 1
        if not any(optimizer is seen for seen in self.optimizers):
            self.optimizers.append(optimizer)

    def __exit__(self, *_: object) -> None:
        for handle in self._handles:
            handle.remove()


def _parity_of(trainer: Any, resolution: Any, stepped: OptimizerSteps, iterations: int,
               params_out: str) -> dict[str, Any]:
    """``iterations`` calls of a trainer just built from the seed, then more until as many optimizer steps were
    taken (a generator that yields every env step), up to the run's warm-up and steps in env steps; the state
    (``trainer_state``) when first built (after the factory, or a generator's first call) and after the last call,
    saved for ``parity``."""
    import torch

    cap = resolution.config.run.warmup_steps + resolution.config.run.steps
    stepped.snapshot = lambda: trainer_state(trainer.inner.modules, [])
    calls = env_steps = 0
    if not trainer.inner.modules:  # a generator builds them in its first call
        env_steps += trainer.iterate().env_steps
        calls = 1
    initial = trainer_state(trainer.inner.modules, [])
    while calls < iterations or (stepped.count < iterations and env_steps < cap):
        env_steps += trainer.iterate().env_steps
        calls += 1
    modules = trainer.inner.modules
    final = trainer_state(modules, stepped.optimizers)
    torch.save({"initial": initial, "final": final, "before_first_step": stepped.before_first}, params_out)
    nonfinite = sum(int((~torch.isfinite(v)).sum()) for v in final.values() if v.is_floating_point())
    return {"parity": {"modules": [type(m).__name__ for m in modules],
                       "optimizer_classes": [type(o).__name__ for o in stepped.optimizers], "tensors": len(final),
                       "nonfinite": nonfinite, "calls": calls, "optimizer_steps": stepped.count}}


def _serve(spec: Any, requests: Any, answer: Callable[[dict[str, Any]], None], checks: bool = True,
           parity: tuple[int, str] | None = None) -> None:
    from harness.measurement.metrics import TimingProbe
    from harness.measurement.runner import resolve_specs, run_checks

    from harness.trials.seeding import SeedAudit

    (resolution,) = resolve_specs([spec])
    audit = SeedAudit()
    if parity is not None:
        audit.__enter__()
    trainer = spec.build(resolution, probe=TimingProbe())
    try:
        ready: dict[str, Any] = {"ready": True}
        if parity is not None:  # the maths check first, on the trainer fresh from the seed: its calls warm it up
            try:
                with OptimizerSteps() as stepped:
                    ready.update(_parity_of(trainer, resolution, stepped, *parity))
            finally:
                audit.__exit__()
            ready["parity"]["unseeded"] = audit.findings()
        _train(trainer, max(1, resolution.config.run.warmup_steps))
        ready["optimizers"] = _implementations()
        if checks:
            found = run_checks(trainer, resolution.device, resolution.config.env.num_envs, own=True)
            _train(trainer, 1)  # one call out of the eager checks before the first timed slice
            ready.update(float64_ops=found.float64_ops, host_syncs_per_step=found.host_syncs_per_step)
        answer({**ready, "ready_s": time.monotonic() - BORN})
        for line in requests:
            steps = int(json.loads(line)["env_steps"])
            _train(trainer, 1)  # untimed: a process idle while the others ran starts its slice as warm as theirs
            wall, cpu = time.perf_counter(), time.process_time()
            done = _train(trainer, steps)
            answer({"env_steps": done, "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu})
    finally:
        trainer.close()


def _train(trainer: Any, env_steps: int) -> int:
    """Whole calls until at least ``env_steps`` env steps; the env steps taken."""
    done = 0
    while done < env_steps:
        done += trainer.iterate().env_steps
    return done


def _implementations() -> dict[str, str]:
    from harness.trials import runtime_patches

    return dict(runtime_patches.implementations)


def trainer_state(modules: list[Any], optimizers: list[Any]) -> dict[str, Any]:
    """Every tensor the maths leaves behind, copied to the CPU by name: each module's parameters and buffers
    (persistent or not), and each optimizer's per-parameter state and numeric hyper-parameters."""
    import torch

    state: dict[str, Any] = {}
    for i, module in enumerate(modules):
        prefix = f"{i}.{type(module).__name__}"
        for kind, named in (("", module.named_parameters()), ("buffer:", module.named_buffers())):
            for key, value in named:
                state[f"{prefix}.{kind}{key}"] = value.detach().to("cpu", copy=True)
    for i, optimizer in enumerate(optimizers):
        prefix = f"optimizer{i}.{type(optimizer).__name__}"
        saved = optimizer.state_dict()
        for index, values in saved["state"].items():
            for key, value in values.items():
                if isinstance(value, torch.Tensor):
                    state[f"{prefix}.state.{index}.{key}"] = value.detach().to("cpu", copy=True)
                elif isinstance(value, (int, float)) and not isinstance(value, bool):
                    state[f"{prefix}.state.{index}.{key}"] = torch.tensor(float(value), dtype=torch.float64)
        for g, group in enumerate(saved["param_groups"]):
            for key, value in group.items():
                numbers = value if isinstance(value, tuple) else (value,)
                if key != "params" and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
                    state[f"{prefix}.group{g}.{key}"] = torch.tensor([float(v) for v in numbers], dtype=torch.float64)
    return state


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    spec = _start(request)
    if request["mode"] != "parity":
        raise ValueError(f"unknown mode {request['mode']!r}; accepted: parity, serve")
    answer = _parity(spec, request["iterations"], request["params_out"])
    answer["optimizers"] = _implementations()
    return answer


def serve_main(request: dict[str, Any]) -> int:
    """``serve`` mode: answers on the process's stdout as it was; fd 1 is pointed at stderr (the log), so that
    nothing the trainer prints, from Python or C, mixes with them."""
    import os

    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(data: dict[str, Any]) -> None:
        channel.write(json.dumps(data) + "\n")

    try:
        parity = (request["iterations"], request["params_out"]) if request.get("parity") else None
        _serve(_start(request), sys.stdin, answer, request.get("checks", True), parity)
        return 0
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # noqa: BLE001 - the parent reports it as the trial's one-line cause
        import traceback

        traceback.print_exc()  # into the arm's log
        answer({"error": arm_failure(exc, request["changes"])})
        return 1


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    if request["mode"] == "serve":
        return serve_main(request)
    try:
        answer = run_request(request)
        code = 0
    except KeyboardInterrupt:
        answer, code = {"error": "interrupted"}, 130
    except BaseException as exc:  # noqa: BLE001 - the parent reports it as the trial's one-line cause
        import traceback

        traceback.print_exc()  # into the arm's log
        answer, code = {"error": arm_failure(exc, request["changes"])}, 1
    Path(request["out"]).write_text(json.dumps(answer), encoding="utf-8")
    return code


def arm_failure(exc: BaseException, changes: list[str]) -> str:
    """Why the arm failed, in one line: what a change cannot do where it says so, else ``one_line``."""
    if "autocast_bf16" in changes and type(exc).__name__ == "Unsupported" and \
            type(exc).__module__.startswith("torch._dynamo"):
        from harness.diagnosis.frames import raise_site, short

        where = raise_site(exc)
        return ("autocast_bf16 cannot run here: a module is called inside code compiled with fullgraph=True"
                + (f" (at {short(where)})" if where else "") + ", where the hooks that enter and leave autocast "
                "would break the graph; autocast that code by hand, around the compiled call")
    return one_line(exc)


def one_line(exc: BaseException) -> str:
    """An exception in one line: bad input as its message, anything else with its type."""
    from harness.errors import UserError
    from reference_trainers.config.errors import ConfigError

    message = " ".join(str(exc).split())
    if isinstance(exc, (UserError, ConfigError)):
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
