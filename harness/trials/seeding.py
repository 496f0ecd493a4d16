"""Where a trainer's randomness escapes its seed, recorded in the maths check's process so that a "not
reproducible" verdict can name the line and its one-line fix: an env whose first reset has no seed (gymnasium's
envs, wrappers and vector envs), a TorchRL env never given one (``EnvBase.set_seed``), and a factory that leaves
torch's generator unseeded (the two runs' weights differ before their first optimizer step: ``initial_weights_fix``).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable

from harness.diagnosis.frames import SiteFinder, call_text


_PACKAGES = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


class SeedAudit:
    """While entered: each env's first outermost ``reset`` (who called it, and whether with a seed), and whether
    any TorchRL env was seeded. ``findings()`` lists the unseeded sources, each with its fix."""

    def __init__(self) -> None:
        self._finder = SiteFinder()
        self._local = threading.local()
        self._undo: list[Callable[[], None]] = []
        self.first_resets: dict[int, dict[str, Any]] = {}
        self.torchrl_seeded = False
        self.torchrl_resets: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> SeedAudit:
        for cls in _gymnasium_env_classes():
            self._wrap(cls, "reset", self._gymnasium_reset)
            self._wrap(cls, "step", None)  # a vector env's autoreset of its envs is inside its step: not the user's
        torchrl_envs = sys.modules.get("torchrl.envs")
        base = getattr(torchrl_envs, "EnvBase", None) if torchrl_envs else None
        if base is not None:
            for cls in _subclasses(base):
                self._wrap(cls, "reset", self._torchrl_reset)
                self._wrap(cls, "set_seed", self._torchrl_seed)
        return self

    def __exit__(self, *_: object) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _wrap(self, cls: type, name: str, record: Callable[..., None] | None) -> None:
        """``cls.name`` wrapped: ``record`` told of each outermost call (None: only nesting is counted)."""
        original = cls.__dict__.get(name)
        if original is None or not callable(original):
            return
        audit = self

        def wrapper(env: Any, *args: Any, **kwargs: Any) -> Any:
            depth = getattr(audit._local, "depth", 0)
            if depth == 0 and record is not None:
                record(env, args, kwargs)
            audit._local.depth = depth + 1
            try:
                return original(env, *args, **kwargs)
            finally:
                audit._local.depth = depth

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(cls, name, wrapper)
        self._undo.append(lambda: setattr(cls, name, original))

    def _site(self) -> tuple[str, str | None]:
        """The user's line the reset came from: the innermost frame outside every installed package (a library's
        collector that resets its env is not where the user can seed it), rlgauge and the standard library."""
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not self._finder._skip(filename) and not any(part in filename for part in _PACKAGES):
                return f"{filename}:{frame.f_lineno}", call_text(frame)
            frame = frame.f_back
        return "?", None

    def _gymnasium_reset(self, env: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if id(env) in self.first_resets:
            return
        where, call = self._site()
        self.first_resets[id(env)] = {"where": where, "call": call, "seeded": kwargs.get("seed") is not None,
                                      "env": type(env).__name__}

    def _torchrl_reset(self, env: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        where, call = self._site()
        self.torchrl_resets.setdefault(type(env).__name__, {"where": where, "call": call})

    def _torchrl_seed(self, env: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seed = args[0] if args else kwargs.get("seed")
        self.torchrl_seeded = self.torchrl_seeded or seed is not None

    def findings(self) -> list[dict[str, str]]:
        """Each unseeded source: ``{"where", "what", "fix"}`` (a gymnasium env's first reset without a seed; a
        TorchRL env reset but never seeded)."""
        found: list[dict[str, str]] = []
        seen: set[str] = set()
        for reset in self.first_resets.values():
            if reset["seeded"] or reset["where"] in seen:
                continue
            seen.add(reset["where"])
            call = reset["call"] or "reset()"
            fixed = call[:-1] + "seed=seed)" if call.endswith("()") else call[:-1] + ", seed=seed)" \
                if call.endswith(")") else "reset(seed=seed)"
            found.append({"where": reset["where"], "what": f"{call}: the first reset of a {reset['env']} has no "
                          "seed", "fix": f"{fixed} (the factory's seed; later resets need none)"})
        if self.torchrl_resets and not self.torchrl_seeded:
            name, reset = next(iter(self.torchrl_resets.items()))
            found.append({"where": reset["where"], "what": f"the TorchRL env {name} is never seeded",
                          "fix": "env.set_seed(seed) once it is built (the collector's envs too: "
                                 "collector.set_seed(seed))"})
        return found


def initial_weights_fix() -> dict[str, str]:
    """The finding where two runs from one seed build different initial weights."""
    return {"where": "the factory", "what": "the weights before the first optimizer step differ between two runs "
            "from one seed: torch's "
            "generator is not seeded", "fix": "torch.manual_seed(seed) at the top of the factory"}


def _gymnasium_env_classes() -> list[type]:
    gymnasium = sys.modules.get("gymnasium")
    if gymnasium is None:
        return []
    roots = [gymnasium.Env]
    vector = getattr(gymnasium, "vector", None)
    if vector is not None and hasattr(vector, "VectorEnv"):
        roots.append(vector.VectorEnv)
    found: list[type] = []
    for root in roots:
        found += [cls for cls in _subclasses(root) if cls not in found]
    return found


def _subclasses(root: type) -> list[type]:
    """``root`` and every class below it defined so far."""
    found, todo = [], [root]
    while todo:
        cls = todo.pop()
        if cls in found:
            continue
        found.append(cls)
        try:
            todo += cls.__subclasses__()
        except TypeError:
            pass
    return found
