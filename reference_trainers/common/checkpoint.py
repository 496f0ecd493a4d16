"""Checkpoint files: a trainer's whole state as plain tensors and Python values.

Everything stored loads with ``torch.load(path, weights_only=True)``: numpy arrays become
raw-byte ``uint8`` tensors with their dtype and shape (exact for every dtype, and no
float64 tensor is ever created), RNG states become tensors, ints and lists. Files are
written atomically (a temporary file in the same folder, then a rename), so a crash while
saving leaves the previous checkpoint intact.

``Checkpointable`` gives every trainer ``state_dict()`` / ``load_state_dict()``: model,
learner (optimiser, GradScaler), RNG states (torch global, every generator the trainer
owns, numpy, Python ``random``), the vector env's state (``env_state.py``), episode
bookkeeping and counters; a trainer adds its own part in ``extra_state``.
Checkpoints are taken between ``iterate()`` calls, where a PPO rollout has been consumed
and the statistics flushed. Guarded by tests/test_checkpoint.py.
"""

from __future__ import annotations

import abc
import os
import pickle
import random
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import to_plain_dict

FORMAT = "rlgauge-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable or does not belong to this run; ``str(err)`` is one line."""


# --------------------------------------------------------------------------- numpy <-> tensors

def encode_array(array: np.ndarray | np.generic) -> dict[str, Any]:
    """A numpy array (or scalar) as raw bytes in a ``uint8`` tensor with its dtype and shape (exact)."""
    array = np.asarray(array)
    if array.dtype.hasobject:
        raise CheckpointError(f"cannot store a numpy array of dtype {array.dtype} in a checkpoint")
    data = torch.frombuffer(bytearray(np.ascontiguousarray(array).tobytes()), dtype=torch.uint8) if array.nbytes \
        else torch.zeros(0, dtype=torch.uint8)
    return {"__ndarray__": True, "dtype": array.dtype.str, "shape": list(array.shape), "data": data}


def decode_array(encoded: dict[str, Any]) -> np.ndarray:
    """The numpy array ``encode_array`` stored."""
    raw = encoded["data"].numpy().tobytes()
    return np.frombuffer(raw, dtype=np.dtype(encoded["dtype"])).reshape(encoded["shape"]).copy()


def is_encoded_array(value: Any) -> bool:
    return isinstance(value, dict) and value.get("__ndarray__") is True


# --------------------------------------------------------------------------- RNG states

def capture_rng(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Torch (global, CUDA, each named generator), numpy's global and Python's ``random`` states."""
    np_state = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "generators": {name: gen.get_state() for name, gen in generators.items()},
        "numpy": [np_state[0], encode_array(np_state[1]), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_version, list(py_internal), py_gauss],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    """Put back what ``capture_rng`` recorded (the generator names must match)."""
    if set(state["generators"]) != set(generators):
        raise CheckpointError(f"checkpoint holds generators {sorted(state['generators'])}, "
                              f"this trainer owns {sorted(generators)}")
    torch.set_rng_state(state["torch"])
    for name, gen in generators.items():
        gen.set_state(state["generators"][name])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, decode_array(keys), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --------------------------------------------------------------------------- files

def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; ``CheckpointError`` naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}" if not path.exists() else f"checkpoint {path} is not a file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile, EOFError, ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({first[:200]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an rlgauge checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {payload.get('version')!r} is not supported; accepted: {VERSION}")
    return payload


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain config dicts, with both values."""
    out: list[str] = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(config_differences(a, b, name + "."))
        elif a != b:
            out.append(f"{name} (checkpoint: {a!r}, this run: {b!r})")
    return out


# --------------------------------------------------------------------------- trainers

class Checkpointable(abc.ABC):
    """``state_dict()`` / ``load_state_dict()`` shared by PPO, DQN and IQN.

    A trainer provides ``rng_generators()`` (every ``torch.Generator`` it owns, by name),
    ``COUNTERS`` (the counter attributes) and may override ``extra_state`` /
    ``load_extra_state`` for what only it keeps (target network, replay, n-step writer).
    """

    COUNTERS: tuple[str, ...] = ("env_steps", "agent_steps", "updates", "iterations")

    @abc.abstractmethod
    def rng_generators(self) -> dict[str, torch.Generator]:
        """Every ``torch.Generator`` the trainer draws from, by a stable name."""

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Nothing beyond the shared state by default."""

    def state_dict(self) -> dict[str, Any]:
        """The trainer's whole state, ready for ``save_checkpoint`` (loads with ``weights_only=True``)."""
        from .distributed import rank, world_size
        from .env_state import capture_env_state

        return {
            "algo": self.algo, "config": to_plain_dict(self.config), "rank": rank(), "world_size": world_size(),
            "model": self.model.state_dict(), "learner": self.learner.state_dict(),
            "rng": capture_rng(self.rng_generators()), "envs": capture_env_state(self.envs),
            "next_obs": encode_array(self.next_obs), "episode_over": encode_array(self.episode_over),
            "tracker": self.tracker.state_dict(), "counters": {name: int(getattr(self, name)) for name in self.COUNTERS},
            "last_stats": dict(self.last_stats), "extra": self.extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: it must come from the same algorithm, config and rank layout."""
        from .distributed import rank, world_size
        from .env_state import restore_env_state

        if state.get("algo") != self.algo:
            raise CheckpointError(f"checkpoint is of algo {state.get('algo')!r}, this run is {self.algo!r}")
        differences = config_differences(state.get("config") or {}, to_plain_dict(self.config))
        if differences:
            more = f" and {len(differences) - 1} more" if len(differences) > 1 else ""
            raise CheckpointError(f"checkpoint was taken with another config: {differences[0]}{more}")
        if (state.get("rank"), state.get("world_size")) != (rank(), world_size()):
            raise CheckpointError(f"checkpoint is of rank {state.get('rank')} of {state.get('world_size')}, "
                                  f"this process is rank {rank()} of {world_size()}")
        self.model.load_state_dict(state["model"])
        self.learner.load_state_dict(state["learner"])
        restore_env_state(self.envs, state["envs"])
        self.next_obs = decode_array(state["next_obs"])
        self.episode_over = decode_array(state["episode_over"])
        self.tracker.load_state_dict(state["tracker"])
        for name in self.COUNTERS:
            setattr(self, name, int(state["counters"][name]))
        self.last_stats = dict(state["last_stats"])
        self.load_extra_state(state["extra"])
        restore_rng(state["rng"], self.rng_generators())
