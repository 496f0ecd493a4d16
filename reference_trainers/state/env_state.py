"""The state of an in-process vector env, for checkpoints (envs themselves cannot be pickled).

Every layer (vector env, each sub-env and each of its wrappers) is saved as its instance
attributes that are plain data: numpy arrays and scalars, Python numbers, strings and
containers of them, plus the bit-generator state of every numpy ``Generator`` (the env's
``np_random``, a space's sampler). That covers episode state held in Python/numpy: the
classic-control physics state, ``TimeLimit``'s step count, autoreset flags. Restoring
them into freshly built envs of the same config continues every episode bit for bit.

An env that keeps state in anything else (a Box2D world, a MuJoCo ``MjData``) is refused
with a ``CheckpointError`` naming the attribute rather than resumed inexactly, and so are
``async`` envs, whose copies live in subprocesses.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from reference_trainers.state.checkpoint import CheckpointError, decode_array, encode_array, is_encoded_array

# Construction arguments, spaces' shapes, specs and rendering handles: not episode state.
_NOT_STATE = frozenset({
    "env", "envs", "env_fns", "_saved_kwargs", "spec", "_cached_spec", "metadata", "_metadata", "render_mode",
    "screen", "clock", "screens", "surf", "autoreset_mode", "_previous_data", "_action_space", "_observation_space",
})
_SCALARS = (type(None), bool, int, float, str)


def _encode(value: Any, where: str) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        return encode_array(value)
    if isinstance(value, np.random.Generator):
        return {"__np_generator__": value.bit_generator.state}
    if isinstance(value, gym.Space):
        rng = value._np_random  # noqa: SLF001 - a space's sampler, None until seeded or used
        return {"__space_rng__": None if rng is None else rng.bit_generator.state}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict) and all(isinstance(k, (str, int)) for k in value):
        return {k: _encode(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise CheckpointError(f"{where} holds a {type(value).__name__}, whose state cannot be saved; checkpoints support "
                          "envs whose state is numpy arrays and Python values (e.g. gymnasium's classic control)")


def _decode(value: Any, current: Any) -> Any:
    if is_encoded_array(value):
        array = decode_array(value)
        return array[()] if array.ndim == 0 and isinstance(current, np.generic) else array
    if isinstance(value, dict) and "__np_generator__" in value:
        state = value["__np_generator__"]
        generator = current if isinstance(current, np.random.Generator) else \
            np.random.Generator(getattr(np.random, state["bit_generator"])())
        generator.bit_generator.state = state
        return generator
    if isinstance(value, dict) and "__space_rng__" in value:
        if value["__space_rng__"] is not None:
            if current._np_random is None:  # noqa: SLF001
                current.seed(0)
            current._np_random.bit_generator.state = value["__space_rng__"]  # noqa: SLF001
        return current
    if isinstance(value, list):
        return [_decode(v, None) for v in value]
    if isinstance(value, tuple):
        return tuple(_decode(v, None) for v in value)
    if isinstance(value, dict):
        return {k: _decode(v, None) for k, v in value.items()}
    return value


def _layers(env: Any) -> list[Any]:
    """The env and every env it wraps, outermost first."""
    layers = [env]
    while isinstance(getattr(layers[-1], "env", None), (gym.Env, gym.vector.VectorEnv)):
        layers.append(layers[-1].env)
    return layers


def _capture_layers(env: Any, where: str) -> list[dict[str, Any]]:
    out = []
    for layer in _layers(env):
        name = type(layer).__name__
        attrs = {k: _encode(v, f"{where}: {name}.{k}") for k, v in vars(layer).items() if k not in _NOT_STATE}
        out.append({"type": name, "attrs": attrs})
    return out


def _restore_layers(env: Any, saved: list[dict[str, Any]], where: str) -> None:
    layers = _layers(env)
    if [type(layer).__name__ for layer in layers] != [entry["type"] for entry in saved]:
        raise CheckpointError(f"{where}: checkpoint holds env layers {[e['type'] for e in saved]}, "
                              f"this run builds {[type(layer).__name__ for layer in layers]}")
    for layer, entry in zip(layers, saved):
        for key, value in entry["attrs"].items():
            setattr(layer, key, _decode(value, getattr(layer, key, None)))


_ASYNC = ("env.vectorization: async keeps its envs in subprocesses, whose state cannot be saved; "
          "accepted with checkpoints: serial, sync or native")


def _sub_envs(vector_env: gym.vector.VectorEnv) -> list[gym.Env]:
    if isinstance(vector_env, gym.vector.AsyncVectorEnv):
        raise CheckpointError(_ASYNC)
    return list(getattr(vector_env, "envs", []))


def capture_env_state(vector_env: gym.vector.VectorEnv) -> dict[str, Any]:
    """The vector env's own state and each sub-env's, layer by layer."""
    subs = _sub_envs(vector_env)
    return {"vector": _capture_layers(vector_env, "vector env"),
            "envs": [_capture_layers(env, f"sub-env {i}") for i, env in enumerate(subs)]}


def restore_env_state(vector_env: gym.vector.VectorEnv, state: dict[str, Any]) -> None:
    """Write ``capture_env_state``'s record back into envs built from the same config."""
    subs = _sub_envs(vector_env)
    if len(subs) != len(state["envs"]):
        raise CheckpointError(f"checkpoint holds {len(state['envs'])} sub-envs, this run has {len(subs)}")
    _restore_layers(vector_env, state["vector"], "vector env")
    for i, (env, saved) in enumerate(zip(subs, state["envs"])):
        _restore_layers(env, saved, f"sub-env {i}")


def check_checkpointable(vectorization: str) -> None:
    """Fail before a run starts if its envs cannot be checkpointed."""
    if vectorization == "async":
        raise CheckpointError(_ASYNC)
