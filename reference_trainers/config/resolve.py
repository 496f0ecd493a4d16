"""Turn ``auto`` values into concrete ones for the resolved device, and reject what it cannot honour.

The resolved config is what a run records: every flag with the value actually used.
``Resolution.reasons`` says why each ``auto`` became what it did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import torch

from reference_trainers.runtime import device as dev
from reference_trainers.runtime import distributed
from reference_trainers.config.schema import ConfigError, TrainConfig
from reference_trainers.envs.atari import is_ale_env, is_image_space
from reference_trainers.envs.factory import (EnvConfigError, atari_settings_from, check_env_id, check_spaces, resolve_vectorization,
                   single_spaces)
from reference_trainers.config.flags import ALGORITHM, FLAGS, OPTIMISATION, OPTIMISATION_FLAGS, Context, Flag

VALUE_BASED = ("dqn", "iqn")


@dataclass
class Resolution:
    config: TrainConfig
    device: torch.device
    reasons: dict[str, str] = field(default_factory=dict)


def _pick(reasons: dict[str, str], key: str, value: object, why: str) -> object:
    reasons[key] = f"{value} ({why})"
    return value


def resolve_config(config: TrainConfig) -> Resolution:
    """Resolve the device and every ``auto`` flag; ``ConfigError`` for anything not honourable."""
    device = dev.resolve_device(config.device)
    resolved = config.model_copy(deep=True)
    reasons: dict[str, str] = {}
    if resolved.distributed.backend == "auto":
        resolved.distributed.backend = _pick(reasons, "distributed.backend", "nccl" if device.type == "cuda" else "gloo",
                                             "NCCL on CUDA, gloo on CPU")
    if resolved.distributed.enabled:
        device = _resolve_distributed(resolved, device)
    resolved.device = str(device)

    try:
        check_env_id(resolved.env.id)
        if resolved.env.preprocessing == "atari" and not is_ale_env(resolved.env.id):
            raise EnvConfigError(f"env.preprocessing: 'atari' needs an ALE env id (e.g. 'ALE/Pong-v5'), "
                                 f"{resolved.env.id!r} is not one; accepted for it: 'none'")
        choice = resolve_vectorization(resolved.env.id, resolved.env.vectorization, action_repeat=resolved.env.action_repeat,
                                       preprocessing=resolved.env.preprocessing, num_envs=resolved.env.num_envs,
                                       native_min_envs=resolved.tuning.native_min_envs)
    except EnvConfigError as exc:
        raise ConfigError(str(exc)) from None
    if resolved.env.vectorization == "auto":
        reasons["env.vectorization"] = f"{choice.mode} ({choice.reason})"
    resolved.env.vectorization = choice.mode
    spaces = _spaces(resolved)  # one env built with env.kwargs: a bad keyword fails here, not mid-run
    try:
        check_spaces(resolved.env.id, resolved.algo, *spaces)  # a Tuple observation fails here, not in the trainer
    except EnvConfigError as exc:
        raise ConfigError(str(exc)) from None
    _resolve_observations(resolved, reasons, spaces[0])
    if resolved.model.recurrent != "none" and resolved.model.body == "cnn":
        raise ConfigError(f"model.recurrent: {resolved.model.recurrent!r} runs on the MLP body; accepted with image "
                          "observations (model.body: cnn): none")
    if resolved.model.init != "orthogonal" and (resolved.model.body == "cnn" or resolved.model.recurrent != "none"
                                                  or resolved.algo == "iqn"):
        raise ConfigError(f"model.init: {resolved.model.init!r} applies to feed-forward MLP networks of PPO and DQN; "
                          "accepted here: orthogonal")

    ctx = Context(resolved, device, spaces[0], spaces[1], supports_bf16=dev.supports_bf16(device),
                  supports_fp16_autocast=dev.supports_fp16_autocast(device), supports_tf32=dev.supports_tf32(device),
                  supports_fused_adam=dev.supports_fused_adam(device))
    explicit = [entry for entry in OPTIMISATION_FLAGS  # auto values first: a blocker may read any resolved value
                if not _resolve_auto(entry, ctx, reasons)]
    for entry in explicit:  # then every value the user chose, against the registry's rules
        _check_explicit(entry, ctx)
    if resolved.model.recurrent != "none" and resolved.algo != "ppo":
        raise ConfigError(f"model.recurrent: {resolved.model.recurrent!r} is for algo ppo; accepted for "
                          f"{resolved.algo}: none")

    action_space = spaces[1]
    if resolved.algo in VALUE_BASED:
        _resolve_value_based(resolved, reasons, action_space)
    else:
        _resolve_ppo(resolved, reasons)
    return Resolution(resolved, device, reasons)


def _resolve_distributed(config: TrainConfig, device: torch.device) -> torch.device:
    """``distributed.enabled``: torchrun's environment, a backend for the device, one GPU per rank (the flags
    that cannot run under DDP say so in the registry)."""
    d = config.distributed
    missing = distributed.missing_torchrun_variables()
    if missing:
        raise ConfigError(f"distributed.enabled: true needs the environment torchrun sets ({', '.join(missing)} missing); "
                          "launch with 'torchrun --nproc-per-node N -m harness run ...', or set distributed.enabled=false")
    if device.type == "mps":
        raise ConfigError("distributed.enabled: DDP is not supported on mps; accepted devices with distributed: cpu, cuda")
    if device.type == "cuda":
        local = distributed.local_rank()
        if device.index is not None and config.device != "auto" and ":" in config.device and device.index != local:
            raise ConfigError(f"device: {config.device!r} under torchrun: each rank uses cuda:LOCAL_RANK "
                              f"(cuda:{local} here); accepted with distributed: auto, cpu or cuda")
        device = torch.device("cuda", local)
    if d.backend == "nccl" and device.type != "cuda":
        raise ConfigError(f"distributed.backend: 'nccl' needs CUDA, the resolved device is {device}; accepted here: gloo or auto")
    return device


def _resolve_ppo(config: TrainConfig, reasons: dict[str, str]) -> None:
    ppo = config.ppo
    batch = config.env.num_envs * ppo.num_steps
    if batch % ppo.num_minibatches:
        raise ConfigError(f"ppo.num_minibatches: {ppo.num_minibatches} does not divide the batch env.num_envs*ppo.num_steps={batch}")
    if config.model.recurrent != "none" and config.env.num_envs % ppo.num_minibatches:
        raise ConfigError(f"ppo.num_minibatches: {ppo.num_minibatches} does not divide env.num_envs={config.env.num_envs}; "
                          "recurrent PPO trains on minibatches of whole sub-env sequences, so accepted: a divisor of env.num_envs")


def _show(value: object) -> str:
    """A value as the user writes it in YAML."""
    return "true" if value is True else "false" if value is False else "null" if value is None else repr(value)


def _not_applicable(entry: Flag, ctx: Context) -> str | None:
    """Why ``entry`` does not apply to this algorithm, device or model body (None if it does)."""
    c = ctx.config
    if c.algo not in entry.algos:
        return f"it applies to algo {', '.join(entry.algos)}, not {c.algo!r}"
    if ctx.kind not in entry.devices:
        return f"it runs on {', '.join(entry.devices)}, the resolved device is {ctx.device}"
    if c.model.body not in entry.bodies:
        return f"model.body {c.model.body!r}: it covers the {', '.join(entry.bodies)} body"
    return None


def _why_not(entry: Flag, ctx: Context) -> str | None:
    """Why ``entry``'s optimised path cannot run here: it does not apply, or one of its blockers holds."""
    why_not = _not_applicable(entry, ctx)
    if why_not is None and entry.blockers is not None:
        why_not = next((why for blocked, why in entry.blockers(ctx) if blocked), None)
    return why_not


def _resolve_auto(entry: Flag, ctx: Context, reasons: dict[str, str]) -> bool:
    """One registry flag at ``auto``: a concrete value with its reason (the plain value, and why, when the
    optimised path cannot run here). False when the value was not ``auto``."""
    section = getattr(ctx.config, entry.section)
    if getattr(section, entry.name) != "auto":
        return False
    why_not = _why_not(entry, ctx) if entry.role == OPTIMISATION else None
    choice, why = (entry.plain, why_not) if why_not else entry.auto(ctx)
    setattr(section, entry.name, _pick(reasons, entry.key, choice, why))
    return True


def _check_explicit(entry: Flag, ctx: Context) -> None:
    """One registry flag at an explicit value other than its plain one: ConfigError naming the key, the value,
    why it cannot run here and what is accepted here, when the flag does not apply or a blocker holds."""
    section = getattr(ctx.config, entry.section)
    value = getattr(section, entry.name)
    if entry.is_plain(value) or value is False or value is None:
        return
    why_not = _why_not(entry, ctx)
    if why_not is None:
        return
    accepted = _accepted_here(entry, ctx)
    if ctx.config.algo not in entry.algos:
        raise ConfigError(f"{entry.key}: {_show(value)} has no effect for algo {ctx.config.algo!r} ({why_not}); "
                          f"accepted for {ctx.config.algo}: {accepted}")
    if entry.devices == ("cuda",) and not ctx.on_cuda:
        raise ConfigError(f"{entry.key}: {_show(value)} needs a CUDA device, but the resolved device is {ctx.device}; "
                          f"accepted here: {accepted}")
    raise ConfigError(f"{entry.key}: {_show(value)} cannot be used here ({why_not}); accepted here: {accepted}")


def _accepted_here(entry: Flag, ctx: Context) -> str:
    """The values of ``entry`` that would run here: the plain one, ``auto`` where it has a rule, and each
    optimised value no rule blocks."""
    section = getattr(ctx.config, entry.section)
    value = getattr(section, entry.name)
    accepted = [_show(entry.plain)]
    try:
        for candidate in entry.optimised:
            setattr(section, entry.name, candidate)
            if _show(candidate) not in accepted and _why_not(entry, ctx) is None:
                accepted.append(_show(candidate))
    finally:
        setattr(section, entry.name, value)
    if entry.auto is not None and "'auto'" not in accepted:
        accepted.append("auto")
    return " or ".join(accepted) if len(accepted) < 3 else ", ".join(accepted[:-1]) + " or " + accepted[-1]


def _resolve_value_based(config: TrainConfig, reasons: dict[str, str], space: gym.Space) -> None:
    """DQN/IQN: replay storage, replay sizes, and a discrete action space."""
    algo = config.algo
    hp = getattr(config, algo)
    if hp.buffer_size < hp.batch_size:
        raise ConfigError(f"{algo}.buffer_size: {hp.buffer_size} is smaller than {algo}.batch_size={hp.batch_size}; "
                          f"accepted: an integer >= {hp.batch_size}")
    if not isinstance(space, gym.spaces.Discrete):
        raise ConfigError(f"env.id: {algo} needs a Discrete action space, {config.env.id!r} has {space}; "
                          "accepted: an env with discrete actions (e.g. CartPole-v1, Acrobot-v1), or algo: ppo")


def _spaces(config: TrainConfig) -> tuple[gym.Space, gym.Space]:
    """One sub-env's (observation, action) spaces, as the trainers will see them."""
    try:
        return single_spaces(config.env.id, config.env.kwargs, atari_settings_from(config.env))
    except Exception as exc:  # the env could not be built with these kwargs
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise ConfigError(f"env.kwargs: gymnasium.make({config.env.id!r}, **{config.env.kwargs!r}) failed: "
                          f"{detail[:300]}") from None


def _resolve_observations(config: TrainConfig, reasons: dict[str, str], space: gym.Space) -> None:
    """``model.body`` follows the observation space (``uint8_transfer`` follows the body: the registry)."""
    model = config.model
    image = is_image_space(space)
    if model.body == "auto":
        model.body = _pick(reasons, "model.body", "cnn" if image else "mlp",
                           f"observations {space} are {'' if image else 'not '}uint8 (channels, height, width) images")
    if model.body == "cnn":
        if not image:
            raise ConfigError(f"model.body: 'cnn' needs uint8 (channels, height, width) image observations, "
                              f"{config.env.id!r} has {space}; accepted: mlp or auto (or env.preprocessing: atari)")
        if min(space.shape[1:]) < MIN_CNN_SIDE:
            raise ConfigError(f"model.body: 'cnn' needs images of at least {MIN_CNN_SIDE}x{MIN_CNN_SIDE} pixels, "
                              f"{config.env.id!r} has {space.shape}; accepted: mlp")


MIN_CNN_SIDE = 36
"""The Nature CNN's 8x8/4, 4x4/2, 3x3/1 convolutions leave one pixel of a 36x36 image."""


def optimisation_summary(config: TrainConfig) -> str:
    """One line naming every registry optimisation that applies to this algorithm and device, with the
    value in force (on/off for switches), e.g. for the start of a run."""
    def shown(value: object) -> str:
        return "on" if value is True else "off" if value is False else "default" if value is None else str(value)

    kind = config.device.split(":")[0]
    parts = [f"device={config.device}"]
    for entry in FLAGS:
        if (entry.role == ALGORITHM or config.algo not in entry.algos or kind not in entry.devices
                or config.model.body not in entry.bodies):
            continue
        value = getattr(getattr(config, entry.section), entry.name)
        parts.append(f"{entry.name}={shown(value)}")
    return "Optimisations: " + " ".join(parts)
