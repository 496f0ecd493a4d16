"""Hypothesis strategies: valid optimisation combinations for an algorithm and device.

A combination is a dict of dotted config keys -> values that differ from the plain path;
``harness.parity.combined_class`` says how its numbers may differ from the reference.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from harness.parity import EXACT, FP_REORDER, REDUCED_PRECISION
from reference_trainers.common import device as dev

PROPERTY_NUM_ENVS = 3
PIXEL_OVERRIDES = ["env.id=pixel_env:PixelDot-v0", "model.body=cnn", "optimizations.torch_threads=1"]
"""The tiny synthetic image env (tests/pixel_env.py, 2x36x36 uint8 frames) under the Nature CNN:
pixel paths stay fast inside hypothesis examples (no Atari there). One intra-op thread: tiny
convolutions on a busy 2-core machine run ~10x slower with two spinning OpenMP threads."""


@st.composite
def optimisation_combos(draw: st.DrawFn, *, algo: str = "ppo", device: str = "cpu",
                        classes: tuple[str, ...] = (EXACT, FP_REORDER, REDUCED_PRECISION),
                        compile_flags: bool = False, pixels: bool = False) -> dict[str, Any]:
    """Draw a set of non-plain flag values from the given parity classes (``pixels``: for the
    image env of ``PIXEL_OVERRIDES``, where ``uint8_transfer`` applies)."""
    import torch

    on_cuda = device.startswith("cuda")
    combo: dict[str, Any] = {}

    def maybe(key: str, values: st.SearchStrategy[Any]) -> None:
        value = draw(values)
        if value is not None:
            combo[key] = value

    if EXACT in classes:
        maybe("env.vectorization", st.sampled_from([None, "sync"]))
        if draw(st.booleans()):
            combo["optimizations.batch_inference"] = True
            maybe("optimizations.inference_batch_size", st.none() | st.integers(1, PROPERTY_NUM_ENVS))
        if draw(st.booleans()):
            combo["optimizations.sync_free_logging"] = True
        if algo in ("dqn", "iqn") and draw(st.booleans()):
            combo["optimizations.replay"] = "tensor"
        maybe("optimizations.num_workers", st.sampled_from([None, 1, 2]))
        if pixels and draw(st.booleans()):
            combo["optimizations.uint8_transfer"] = True
        if on_cuda:
            if draw(st.booleans()):
                combo["optimizations.pinned_memory"] = True
            if draw(st.booleans()):
                combo["optimizations.non_blocking"] = True
    if FP_REORDER in classes:
        # capturable Adam (device-side step counts): recurrent PPO's update loops over time steps in Python
        if on_cuda and algo != "ppo-lstm" and draw(st.booleans()):
            combo["optimizations.cuda_graphs"] = True
        impls = ["foreach"] + (["fused"] if dev.supports_fused_adam(torch.device(device)) else [])
        maybe("optimizations.optimizer_impl", st.sampled_from([None, *impls]))
        if device == "cpu":
            maybe("optimizations.torch_threads", st.sampled_from([None, 1]))
        if algo == "ppo" and draw(st.booleans()):
            combo["optimizations.lean_rollout"] = True
        # NumPy acting: CPU MLP policies in float32 (no autocast, no reduced-precision matmuls below)
        if device == "cpu" and algo in ("ppo", "dqn") and not pixels and not compile_flags and draw(st.booleans()):
            combo["optimizations.numpy_acting"] = True
        if compile_flags:
            which = draw(st.sampled_from(["compile_model", "compile_train_step", "both"]))
            if which in ("compile_model", "both"):
                combo["optimizations.compile_model"] = True
            if which in ("compile_train_step", "both") and not combo.get("optimizations.cuda_graphs"):
                combo["optimizations.compile_train_step"] = True
    if REDUCED_PRECISION in classes and not combo.get("optimizations.numpy_acting"):
        dtypes = ["bfloat16"] if dev.supports_bf16(torch.device(device)) else []
        if not combo.get("optimizations.cuda_graphs"):
            dtypes.append("float16")
        amp = draw(st.sampled_from([None, *dtypes]))
        if amp is not None:
            combo["optimizations.amp"] = True
            combo["optimizations.amp_dtype"] = amp
        maybe("optimizations.matmul_precision", st.sampled_from([None, "high", "medium"]))
        if on_cuda and dev.supports_tf32(torch.device(device)):
            maybe("optimizations.tf32", st.sampled_from([None, True]))
    return combo


def as_overrides(combo: dict[str, Any]) -> list[str]:
    """``--set`` strings for a combination (YAML scalars)."""
    def text(value: Any) -> str:
        return "true" if value is True else "false" if value is False else "null" if value is None else str(value)

    return [f"{key}={text(value)}" for key, value in combo.items()]


def parity_settings(combo: dict[str, Any]) -> dict[str, Any]:
    """The flags whose parity class matters (``amp_dtype`` is a parameter of ``amp``)."""
    return {k: v for k, v in combo.items() if k != "optimizations.amp_dtype"}
