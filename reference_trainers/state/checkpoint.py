"""Checkpoint files: a trainer's whole state as plain tensors and Python values.

Everything stored loads with ``torch.load(path, weights_only=True)``: numpy arrays become
raw-byte ``uint8`` tensors with their dtype and shape (exact for every dtype, and no
float64 tensor is ever created), RNG states become tensors, ints and lists. Files are
written atomically (a temporary file in the same folder, then a rename), so a crash while
saving leaves the previous checkpoint intact.

What a trainer's state holds is ``trainer_state.Checkpointable``; what an env's is,
``env_state.py``. Guarded by tests/test_checkpoint.py.
"""

from __future__ import annotations

import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reference_trainers.state.atomic_file import write_atomically


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
    """``torch.save`` to a temporary file beside ``path``, then rename it over ``path`` (a symlink's
    target; ``atomic_file.UnsafeTargetError`` for a FIFO, directory or read-only file there)."""
    write_atomically(Path(path), lambda handle: torch.save(payload, handle))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint with ``weights_only=True``; ``CheckpointError`` naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}" if not path.exists() else f"checkpoint {path} is not a file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # whatever an untrusted file makes torch.load raise, it is the file's fault
        raise CheckpointError(f"{path}: not a readable checkpoint: {_why_unreadable(exc)}; accepted: a checkpoint "
                              "file written by rlgauge") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not an rlgauge checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {payload.get('version')!r} is not supported; accepted: {VERSION}")
    return payload


def _why_unreadable(exc: Exception) -> str:
    """Why ``torch.load`` refused a file, in a phrase of our own. torch's message runs to many lines
    and advises loading with ``weights_only=False``, which would run any code an untrusted file holds:
    it is never passed on."""
    text = str(exc)
    if "Unsupported global" in text or "Unsupported operand" in text:
        return "it holds Python objects besides tensors and plain values, so it was not made by rlgauge (left unloaded)"
    if isinstance(exc, OSError) and not isinstance(exc, zipfile.BadZipFile) and exc.strerror:
        return f"the file cannot be read ({exc.strerror})"
    if isinstance(exc, (zipfile.BadZipFile, EOFError)) or "zip archive" in text or "central directory" in text:
        return "the file is truncated or is not a torch archive"
    return "the file is truncated or corrupt, or not a torch archive"


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
