"""Hypothesis strategies: valid flag combinations for an algorithm and device, drawn from the flag registry.

A combination is a dict of dotted config keys -> values that differ from the plain path;
``harness.stats.parity.combined_class`` says how its numbers may differ from the reference. Every
registry flag whose parity class is asked for can be drawn (algorithm options such as PER,
n-step and action repeat are outcome-class), so a new flag joins the property tests by
being declared. A drawn combination that the resolver rejects (a blocker, a device that
cannot honour a value) loses the flag the resolver names until it resolves.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from harness.stats.parity import EXACT, FP_REORDER, REDUCED_PRECISION
from reference_trainers.config.schema import ConfigError, build_config
from reference_trainers.config.flags import ALGORITHM, FLAGS, Flag
from reference_trainers.config.resolve import resolve_config

PROPERTY_NUM_ENVS = 3
PIXEL_OVERRIDES = ["env.id=pixel_env:PixelDot-v0", "model.body=cnn", "optimizations.torch_threads=1"]
"""The tiny synthetic image env (tests/pixel_env.py, 2x36x36 uint8 frames) under the Nature CNN:
pixel paths stay fast inside hypothesis examples (no Atari there). One intra-op thread: tiny
convolutions on a busy 2-core machine run ~10x slower with two spinning OpenMP threads."""

COMPILING = {"optimizations.compile_model", "optimizations.compile_train_step", "optimizations.compile_cpp_wrapper",
             "optimizations.aten_tanh", "optimizations.gather_in_step"}
"""Drawn only where a test asks for compile flags (each compiled example costs seconds)."""
NEVER_DRAWN = {"optimizations.compile_mode", "optimizations.amp_dtype", "optimizations.inference_batch_size"}
"""Settings drawn with the flag they belong to (below), or left at their plain value."""
LSTM_OVERRIDES = ["model.recurrent=lstm", "model.recurrent_size=8", f"ppo.num_minibatches={PROPERTY_NUM_ENVS}"]


def _applies(entry: Flag, algo: str, device: str, pixels: bool) -> bool:
    base_algo = "ppo" if algo == "ppo-lstm" else algo
    if entry.role == ALGORITHM and entry.section not in ("env", base_algo):
        return False
    return (base_algo in entry.algos and device.split(":")[0] in entry.devices
            and ("cnn" if pixels else "mlp") in entry.bodies)


def _values(entry: Flag, classes: tuple[str, ...]) -> list[Any]:
    return [v for v in entry.optimised if entry.parity_by_value.get(v, entry.parity) in classes]


def _rejected_key(combo: dict[str, Any], algo: str, device: str, pixels: bool) -> str | None:
    """The key the resolver names when it rejects ``combo`` (its last key if it names none); None if it resolves."""
    base_algo = "ppo" if algo == "ppo-lstm" else algo
    scene = (PIXEL_OVERRIDES if pixels else []) + (LSTM_OVERRIDES if algo == "ppo-lstm" else [])
    try:
        resolve_config(build_config({"algo": base_algo}, [f"device={device}", f"env.num_envs={PROPERTY_NUM_ENVS}",
                                                          *scene, *as_overrides(combo)]))
    except ConfigError as exc:
        named = str(exc).split(":")[0]
        return named if named in combo else next(reversed(combo))
    return None


@st.composite
def optimisation_combos(draw: st.DrawFn, *, algo: str = "ppo", device: str = "cpu",
                        classes: tuple[str, ...] = (EXACT, FP_REORDER, REDUCED_PRECISION),
                        compile_flags: bool = False, pixels: bool = False) -> dict[str, Any]:
    """Draw non-plain values of registry flags from the given parity classes (``pixels``: for the
    image env of ``PIXEL_OVERRIDES``; ``algo`` may be ``ppo-lstm``, recurrent PPO)."""
    combo: dict[str, Any] = {}
    for entry in FLAGS:
        if entry.key in NEVER_DRAWN or (entry.key in COMPILING and not compile_flags):
            continue
        values = _values(entry, classes)
        if not values or not _applies(entry, algo, device, pixels):
            continue
        value = draw(st.sampled_from([None, *values]))
        if value is None:
            continue
        combo[entry.key] = value
        if entry.key == "optimizations.amp":
            combo["optimizations.amp_dtype"] = draw(st.sampled_from(["bfloat16", "float16"]))
        if entry.key == "optimizations.batch_inference" and draw(st.booleans()):
            combo["optimizations.inference_batch_size"] = draw(st.integers(1, PROPERTY_NUM_ENVS))
    if compile_flags and not any(k in combo for k in ("optimizations.compile_model", "optimizations.compile_train_step")):
        combo["optimizations.compile_train_step"] = True
    while combo and (key := _rejected_key(combo, algo, device, pixels)) is not None:
        del combo[key]
        if key == "optimizations.amp":
            combo.pop("optimizations.amp_dtype", None)
    return combo


def as_overrides(combo: dict[str, Any]) -> list[str]:
    """``--set`` strings for a combination (YAML scalars)."""
    def text(value: Any) -> str:
        return "true" if value is True else "false" if value is False else "null" if value is None else str(value)

    return [f"{key}={text(value)}" for key, value in combo.items()]


def parity_settings(combo: dict[str, Any]) -> dict[str, Any]:
    """The flags whose parity class matters (``amp_dtype`` is a parameter of ``amp``)."""
    return {k: v for k, v in combo.items() if k != "optimizations.amp_dtype"}
