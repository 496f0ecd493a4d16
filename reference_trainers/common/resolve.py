"""Turn ``auto`` values into concrete ones for the resolved device, and reject what it cannot honour.

The resolved config is what a run records: every flag with the value actually used.
``Resolution.reasons`` says why each ``auto`` became what it did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import torch

from . import device as dev
from . import distributed
from .config import ConfigError, TrainConfig
from .atari import is_ale_env, is_image_space
from .envs import EnvConfigError, atari_settings_from, check_env_id, resolve_vectorization, single_spaces

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
    o = resolved.optimizations
    kind = device.type
    on_cuda = kind == "cuda"

    try:
        check_env_id(resolved.env.id)
        if resolved.env.preprocessing == "atari" and not is_ale_env(resolved.env.id):
            raise EnvConfigError(f"env.preprocessing: 'atari' needs an ALE env id (e.g. 'ALE/Pong-v5'), "
                                 f"{resolved.env.id!r} is not one; accepted for it: 'none'")
        choice = resolve_vectorization(resolved.env.id, resolved.env.vectorization, action_repeat=resolved.env.action_repeat,
                                       preprocessing=resolved.env.preprocessing, num_envs=resolved.env.num_envs)
    except EnvConfigError as exc:
        raise ConfigError(str(exc)) from None
    if resolved.env.vectorization == "auto":
        reasons["env.vectorization"] = f"{choice.mode} ({choice.reason})"
    resolved.env.vectorization = choice.mode
    spaces = _spaces(resolved)  # one env built with env.kwargs: a bad keyword fails here, not mid-run
    _resolve_observations(resolved, reasons, spaces[0])
    if resolved.model.recurrent != "none" and resolved.model.body == "cnn":
        raise ConfigError(f"model.recurrent: {resolved.model.recurrent!r} runs on the MLP body; accepted with image "
                          "observations (model.body: cnn): none")

    def need_cuda(name: str, value: object) -> None:
        if value is True and not on_cuda:
            raise ConfigError(f"optimizations.{name}: true needs a CUDA device, but the resolved device is {device}; accepted here: false or auto")

    # Flags that exist only on CUDA: auto = on where they help.
    for name in ("pinned_memory", "non_blocking", "tf32", "cuda_graphs"):
        need_cuda(name, getattr(o, name))
    if o.pinned_memory == "auto":
        o.pinned_memory = _pick(reasons, "optimizations.pinned_memory", on_cuda, "page-locked staging needs CUDA")
    if o.non_blocking == "auto":
        o.non_blocking = _pick(reasons, "optimizations.non_blocking", on_cuda, "asynchronous copies need CUDA")
    if o.tf32 == "auto":
        o.tf32 = _pick(reasons, "optimizations.tf32", on_cuda and dev.supports_tf32(device), "TF32 needs compute capability 8.0+")
    if o.tf32 and not dev.supports_tf32(device):
        raise ConfigError(f"optimizations.tf32: true needs a GPU of compute capability 8.0+, {dev.device_name(device)} has none; accepted here: false")
    if o.cuda_graphs == "auto":
        o.cuda_graphs = _pick(reasons, "optimizations.cuda_graphs", False, "opt-in: capture is measured per workload")

    if o.matmul_precision == "auto":
        o.matmul_precision = _pick(reasons, "optimizations.matmul_precision", "high" if on_cuda else "highest",
                                   "TF32 matmuls on CUDA" if on_cuda else "reduced-precision CPU matmuls are opt-in")

    # AMP: auto = on for CUDA (bf16 where supported, else fp16 + GradScaler).
    if o.amp_dtype == "auto":
        o.amp_dtype = _pick(reasons, "optimizations.amp_dtype", "bfloat16" if dev.supports_bf16(device) else "float16",
                            "bf16 where the device supports it")
    if o.amp_dtype == "bfloat16" and not dev.supports_bf16(device):
        raise ConfigError(f"optimizations.amp_dtype: 'bfloat16' is not supported on {dev.device_name(device)}; accepted here: float16 or auto")
    if o.amp_dtype == "float16" and not dev.supports_fp16_autocast(device):
        raise ConfigError(f"optimizations.amp_dtype: 'float16' autocast is not supported on {kind}; accepted here: bfloat16 or auto")
    if o.amp == "auto":
        if o.cuda_graphs and o.amp_dtype == "float16":
            o.amp = _pick(reasons, "optimizations.amp", False, "float16 AMP cannot be captured by cuda_graphs")
        else:
            o.amp = _pick(reasons, "optimizations.amp", on_cuda, "tensor cores on CUDA; small CPU models run slower in autocast")

    if o.compile_model == "auto":
        o.compile_model = _pick(reasons, "optimizations.compile_model", on_cuda, "kernel fusion pays on CUDA; tiny CPU models run slower compiled")
    _resolve_analytic_grads(resolved, reasons, spaces[1], on_cpu=kind == "cpu")
    _resolve_numpy_acting(resolved, reasons, kind)
    if o.compile_train_step == "auto":
        # IQN's compiled update on CUDA (torch 2.11, H100) drifted from the eager one: parameters 3e-3 apart
        # after a dozen updates where DQN's stayed 1e-8 apart, and the policy stopped learning; CPU is exact.
        iqn_on_cuda = on_cuda and resolved.algo == "iqn"
        analytic_cpu = kind == "cpu" and bool(o.analytic_grads)
        o.compile_train_step = _pick(reasons, "optimizations.compile_train_step",
                                     on_cuda and not o.cuda_graphs and not resolved.distributed.enabled and not iqn_on_cuda,
                                     "cuda_graphs captures the update instead" if o.cuda_graphs else
                                     "DDP all-reduces inside backward, which a compiled step would break"
                                     if resolved.distributed.enabled else
                                     "IQN's compiled update drifts from the eager one on CUDA" if iqn_on_cuda
                                     else "compiled autograd updates of small CPU models run slower; with analytic_grads "
                                          "the compiled hand-written step is ~10% faster but costs seconds of warm-up: "
                                          "opt in for long runs" if analytic_cpu else "as compile_model")
    if o.compile_mode != "default" and not o.compile_model:
        raise ConfigError(f"optimizations.compile_mode: {o.compile_mode!r} has no effect unless compile_model is true; accepted: default")

    if o.optimizer_impl == "auto":
        o.optimizer_impl = _pick(reasons, "optimizations.optimizer_impl", "fused" if dev.supports_fused_adam(device) else "foreach",
                                 "one fused kernel where the device has it")
    if o.optimizer_impl == "fused" and not dev.supports_fused_adam(device):
        raise ConfigError(f"optimizations.optimizer_impl: 'fused' Adam is not available on {kind} with torch {torch.__version__}; accepted here: forloop, foreach")

    if o.torch_threads == "auto":
        rows = update_rows(resolved)
        width = 512 if resolved.model.body == "cnn" else max(resolved.model.hidden_sizes)
        small = width <= 256 and rows * width <= SMALL_UPDATE_ELEMENTS
        why = (f"one thread: a {rows}x{width} update is too small to split across threads" if small
               else f"torch default: a {rows}x{width} update keeps every core busy")
        o.torch_threads = _pick(reasons, "optimizations.torch_threads", 1 if kind == "cpu" and small else None,
                                why if kind == "cpu" else "torch default")

    if o.inference_batch_size is not None:
        if not o.batch_inference:
            raise ConfigError("optimizations.inference_batch_size: only used with batch_inference: true; set batch_inference or leave it null")
        if o.inference_batch_size > resolved.env.num_envs:
            raise ConfigError(f"optimizations.inference_batch_size: {o.inference_batch_size} exceeds env.num_envs={resolved.env.num_envs}; accepted: 1..{resolved.env.num_envs} or null")

    if o.cuda_graphs:
        if o.amp and o.amp_dtype == "float16":
            raise ConfigError("optimizations.cuda_graphs: cannot capture float16 AMP (GradScaler checks on the host); use amp_dtype: bfloat16")
        if resolved.stability.nan_policy == "skip_update":
            raise ConfigError("stability.nan_policy: 'skip_update' decides on the host per update, which cuda_graphs cannot capture; accepted with cuda_graphs: raise, warn")
        if o.compile_train_step:
            raise ConfigError("optimizations.cuda_graphs: choose one of cuda_graphs and compile_train_step for the update")

    if resolved.model.recurrent != "none":
        if resolved.algo != "ppo":
            raise ConfigError(f"model.recurrent: {resolved.model.recurrent!r} is for algo ppo; accepted for "
                              f"{resolved.algo}: none")
        if o.cuda_graphs:
            raise ConfigError(f"optimizations.cuda_graphs: true cannot capture the recurrent update (a Python loop "
                              f"over time steps); accepted with model.recurrent {resolved.model.recurrent!r}: false or auto")
    if o.num_workers and resolved.algo in VALUE_BASED and getattr(resolved, resolved.algo).prioritized_replay:
        raise ConfigError(f"optimizations.num_workers: {o.num_workers} cannot prefetch prioritized minibatches "
                          f"(each draw needs the previous update's priorities); accepted with "
                          f"{resolved.algo}.prioritized_replay: 0")

    action_space = spaces[1]
    if resolved.algo in VALUE_BASED:
        _resolve_value_based(resolved, reasons, action_space)
    else:
        _resolve_ppo(resolved, reasons)
    return Resolution(resolved, device, reasons)


def _resolve_distributed(config: TrainConfig, device: torch.device) -> torch.device:
    """``distributed.enabled``: torchrun's environment, a backend for the device, one GPU per rank,
    and no update-side flag that cannot run under DDP."""
    d, o = config.distributed, config.optimizations
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
    if o.cuda_graphs is True:
        raise ConfigError("optimizations.cuda_graphs: cannot capture DDP's gradient all-reduce; "
                          "accepted with distributed.enabled: false or auto")
    if o.compile_train_step is True:
        raise ConfigError("optimizations.compile_train_step: DDP all-reduces gradients inside backward, which a compiled "
                          "train step cannot contain; accepted with distributed.enabled: false or auto")
    return device


def _resolve_ppo(config: TrainConfig, reasons: dict[str, str]) -> None:
    ppo, o = config.ppo, config.optimizations
    batch = config.env.num_envs * ppo.num_steps
    if batch % ppo.num_minibatches:
        raise ConfigError(f"ppo.num_minibatches: {ppo.num_minibatches} does not divide the batch env.num_envs*ppo.num_steps={batch}")
    if config.model.recurrent != "none" and config.env.num_envs % ppo.num_minibatches:
        raise ConfigError(f"ppo.num_minibatches: {ppo.num_minibatches} does not divide env.num_envs={config.env.num_envs}; "
                          "recurrent PPO trains on minibatches of whole sub-env sequences, so accepted: a divisor of env.num_envs")
    if o.replay == "tensor":
        raise ConfigError("optimizations.replay: 'tensor' has no effect for algo 'ppo' (it keeps no replay buffer); accepted for ppo: list or auto")
    if o.replay == "auto":
        o.replay = _pick(reasons, "optimizations.replay", "list", "ppo keeps no replay buffer")


def _analytic_grads_blocker(config: TrainConfig, space: gym.Space) -> str | None:
    """Why ``analytic_grads`` cannot run with this config (None if it can)."""
    o = config.optimizations
    blockers = [
        (config.algo not in ("ppo", "dqn"), f"it covers the PPO and DQN updates, not algo {config.algo!r}"),
        (config.model.recurrent != "none", f"model.recurrent {config.model.recurrent!r} needs backpropagation through time"),
        (config.model.body != "mlp", f"model.body {config.model.body!r}: it covers the MLP body"),
        (config.algo == "ppo" and not isinstance(space, gym.spaces.Discrete),
         f"{config.env.id!r} has continuous actions; it covers discrete ones"),
        (bool(o.amp), "amp: its gradients are float32"),
        (o.compile_model is True, "compile_model compiles the module forward it bypasses"),
        (bool(o.cuda_graphs), "cuda_graphs captures the autograd update"),
        (config.distributed.enabled, "distributed training all-reduces inside autograd's backward"),
    ]
    return next((why for blocked, why in blockers if blocked), None)


def _resolve_gated(config: TrainConfig, reasons: dict[str, str], name: str, blocker: str | None, wanted: bool,
                   why: str) -> None:
    """A flag some configs cannot run: ``true`` where ``blocker`` says why is a ConfigError; ``auto``
    turns on where there is no blocker and ``wanted`` (``why`` says why)."""
    o = config.optimizations
    if getattr(o, name) is True and blocker:
        raise ConfigError(f"optimizations.{name}: true cannot be used here ({blocker}); accepted here: false or auto")
    if getattr(o, name) == "auto":
        setattr(o, name, _pick(reasons, f"optimizations.{name}", wanted and blocker is None, blocker or why))


def _resolve_analytic_grads(config: TrainConfig, reasons: dict[str, str], space: gym.Space, on_cpu: bool) -> None:
    _resolve_gated(config, reasons, "analytic_grads", _analytic_grads_blocker(config, space), on_cpu,
                   "per-op overhead dominates small CPU updates; hand-written gradients need no autograd graph"
                   if on_cpu else "measured on the CPU only; autograd on accelerators")


def _numpy_acting_blocker(config: TrainConfig, kind: str) -> str | None:
    """Why ``numpy_acting`` cannot run with this config (None if it can)."""
    o = config.optimizations
    blockers = [
        (kind != "cpu", f"NumPy runs on the host and the model is on {kind}"),
        (config.algo not in ("ppo", "dqn"), f"it covers PPO's and DQN's MLP policies, not algo {config.algo!r}"),
        (config.model.recurrent != "none", f"model.recurrent {config.model.recurrent!r} carries a hidden state"),
        (config.model.body != "mlp", f"model.body {config.model.body!r}: it covers the MLP body"),
        (bool(o.amp), "amp: NumPy computes in float32"),
        (o.matmul_precision != "highest", f"matmul_precision {o.matmul_precision!r}: NumPy multiplies in float32"),
        (bool(o.compile_model), "compile_model compiles the module forward it bypasses"),
    ]
    return next((why for blocked, why in blockers if blocked), None)


def _resolve_numpy_acting(config: TrainConfig, reasons: dict[str, str], kind: str) -> None:
    _resolve_gated(config, reasons, "numpy_acting", _numpy_acting_blocker(config, kind), True,
                   "torch's per-op dispatch dominates a forward of a few rows; NumPy calls cost less")


def _resolve_value_based(config: TrainConfig, reasons: dict[str, str], space: gym.Space) -> None:
    """DQN/IQN: replay storage, replay sizes, and a discrete action space."""
    algo, o = config.algo, config.optimizations
    hp = getattr(config, algo)
    if o.lean_rollout:
        raise ConfigError(f"optimizations.lean_rollout: true has no effect for algo {algo!r} (it keeps no PPO rollout); "
                          f"accepted for {algo}: false")
    if o.replay == "auto":
        o.replay = _pick(reasons, "optimizations.replay", "tensor",
                         "preallocated device tensors: batched inserts, no per-sample conversion")
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
    """``model.body`` and ``optimizations.uint8_transfer`` follow the observation space."""
    model, o = config.model, config.optimizations
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
    if o.uint8_transfer == "auto":
        cpu = config.device.startswith("cpu")
        why = ("only image observations with the cnn body are uint8" if model.body != "cnn"
               else "on the CPU there is no host->device copy to shrink, and scaling in the network adds a "
                    "conversion per forward" if cpu
               else "uint8 pixels cross as one byte each and are normalised on the device")
        o.uint8_transfer = _pick(reasons, "optimizations.uint8_transfer", model.body == "cnn" and not cpu, why)
    if o.uint8_transfer and model.body != "cnn":
        raise ConfigError("optimizations.uint8_transfer: true needs uint8 image observations and model.body cnn, "
                          f"{config.env.id!r} has {space}; accepted here: false or auto")


MIN_CNN_SIDE = 36
"""The Nature CNN's 8x8/4, 4x4/2, 3x3/1 convolutions leave one pixel of a 36x36 image."""

SMALL_UPDATE_ELEMENTS = 65536
"""Rows x width of an update's activations up to which one CPU thread is fastest: measured on
a 2-core CPU, a 256x64 PPO minibatch runs faster on one thread, a 2048x64 IQN batch
(32 samples x 64 fractions) on two."""


def update_rows(config: TrainConfig) -> int:
    """Rows through the network per gradient step: the PPO minibatch, the DQN batch, or the
    IQN batch times its N fractions."""
    if config.algo == "ppo":
        return config.env.num_envs * config.ppo.num_steps // config.ppo.num_minibatches
    hp = getattr(config, config.algo)
    return hp.batch_size * (hp.num_tau_samples if config.algo == "iqn" else 1)


def amp_dtype(config: TrainConfig) -> torch.dtype:
    return torch.bfloat16 if config.optimizations.amp_dtype == "bfloat16" else torch.float16


def optimisation_summary(config: TrainConfig) -> str:
    """One line naming the optimisations in force, e.g. for the start of a run."""
    o = config.optimizations
    onoff = lambda flag: "on" if flag else "off"  # noqa: E731
    parts = [
        f"device={config.device}",
        f"vectorization={config.env.vectorization}",
        f"batch_inference={onoff(o.batch_inference)}",
        f"amp={onoff(o.amp)}({o.amp_dtype.replace('float', 'fp').replace('bfp', 'bf')})",
        f"compile={'model' if o.compile_model else ''}{'+' if o.compile_model and o.compile_train_step else ''}{'step' if o.compile_train_step else ''}{'' if o.compile_model or o.compile_train_step else 'off'}",
        f"matmul={o.matmul_precision}",
        f"tf32={onoff(o.tf32)}",
        f"optimizer={o.optimizer_impl}",
        f"pinned={onoff(o.pinned_memory)}",
        f"non_blocking={onoff(o.non_blocking)}",
        f"sync_free_logging={onoff(o.sync_free_logging)}",
        f"cuda_graphs={onoff(o.cuda_graphs)}",
        f"threads={o.torch_threads or 'default'}",
        f"uint8_transfer={onoff(o.uint8_transfer)}",
        f"num_workers={o.num_workers}",
    ]
    if config.algo == "ppo":
        parts.append(f"lean_rollout={onoff(o.lean_rollout)}")
    parts.append(f"analytic_grads={onoff(o.analytic_grads)}")
    parts.append(f"numpy_acting={onoff(o.numpy_acting)}")
    if config.algo in VALUE_BASED:
        parts.append(f"replay={o.replay}")
    return "Optimisations: " + " ".join(parts)
