"""Typed, validated training configuration: a mapping (plus ``--set`` overrides) -> ``TrainConfig``.

Every implementation flag of the design lives in ``OptimizationsConfig`` with its plain
value as the default. Unknown keys, wrong types and out-of-range values raise
``ConfigError`` with one line naming the dotted key, the bad value and what is accepted.
Types are strict: no text becomes a number or a switch (``"16"``, ``"yes"``), no float a
count; only an integer is taken where a float is expected (``1`` for ``1.0``).
Per-device resolution of ``auto`` values lives in ``resolve.py``.
"""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator, model_validator

from reference_trainers.config.files import apply_overrides, safe_load
from reference_trainers.config.errors import ConfigError
from reference_trainers.config.flags import OPTIMISATION_FLAGS, TUNING

Auto = Literal["auto"]


def _accepted_scalars(annotation: Any) -> set[str]:
    """Scalar kinds a field annotation admits: {'bool', 'int', 'float', 'auto', ...}."""
    if annotation in (bool, int, float, str):
        return {annotation.__name__}
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return {str(a) for a in args}
    if get_origin(annotation) is Annotated:
        return _accepted_scalars(args[0])
    return set().union(*(_accepted_scalars(a) for a in args)) if args else set()


class _Section(BaseModel):
    # strict: a quoted "16" or "yes" is a mistake to report, not a value to coerce (int -> float still passes)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True, strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_int_mixups(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML ``true`` is not a count and ``1`` is not a switch: reject either mix-up."""
        accepts = _accepted_scalars(cls.model_fields[info.field_name].annotation)
        if isinstance(value, bool) and "bool" not in accepts and accepts & {"int", "float"}:
            raise ValueError("expected a number, not a boolean")
        if type(value) is int and "bool" in accepts and not accepts & {"int", "float"}:
            raise ValueError("expected true or false" + (" or 'auto'" if "auto" in accepts else ""))
        return value


class AtariConfig(_Section):
    """Standard Atari preprocessing (Mnih et al. 2015; Machado et al. 2018), applied per sub-env
    through gymnasium's ``AtariPreprocessing`` and ``FrameStackObservation`` (or EnvPool's own)."""

    frame_skip: int = Field(4, ge=1, le=64)
    """Emulator frames per agent step (max-pooled over the last two)."""
    screen_size: int = Field(84, ge=36, le=1024)
    """Square grey frames of this side (the Nature CNN needs at least 36)."""
    stack: int = Field(4, ge=1, le=64)
    """Most recent frames stacked into one observation (the CNN's input channels)."""
    noop_max: int = Field(30, ge=0, le=1000)
    """Up to this many no-op actions after each reset."""
    terminal_on_life_loss: bool = False
    """End the episode when a life is lost (off: Machado et al. 2018)."""
    reward_clip: bool = True
    """Clip rewards to their sign, as DQN does."""


class EnvConfig(_Section):
    """Which environment and how its copies are stepped."""

    id: str = "CartPole-v1"
    """Any gymnasium id, including ``module:EnvName-v0`` for a user's own env."""
    num_envs: int = Field(8, ge=1, le=4096)
    """Sub-environments stepped per agent step."""
    vectorization: Literal["serial", "sync", "async", "native", "envpool", "auto"] = "serial"
    """serial: Python loop over single envs (plain); sync/async: gymnasium vector envs;
    native: the env's own vectorised entry point; envpool: EnvPool's C++ thread pool
    (``pip install rlgauge[envpool]``); auto: chosen per env (reason recorded)."""
    action_repeat: int = Field(1, ge=1, le=64)
    """Repeat each action k times, summing rewards (outcome-changing)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for ``gymnasium.make``."""
    preprocessing: Literal["none", "atari"] = "none"
    """none: observations as the env returns them; atari: the ``atari`` block below
    (needs an ALE id such as ``ALE/Pong-v5``: ``pip install rlgauge[atari]``)."""
    atari: AtariConfig = Field(default_factory=AtariConfig)


class ModelConfig(_Section):
    """Network shape shared by actor and critic."""

    body: Literal["mlp", "cnn", "auto"] = "auto"
    """mlp: fully connected layers over flat observations; cnn: the Nature CNN torso
    (Mnih et al. 2015) over (channels, height, width) pixels; auto: cnn for image
    observation spaces, else mlp (the resolved value is recorded)."""
    hidden_sizes: list[int] = Field(default_factory=lambda: [64, 64], min_length=1)
    activation: Literal["tanh", "relu"] = "tanh"
    recurrent: Literal["none", "lstm", "gru"] = "none"
    """PPO only: a recurrent core between the shared MLP encoder and the heads (memory for
    partially observed tasks); ``none`` is the feed-forward actor-critic."""
    recurrent_size: int = Field(default=128, ge=1, le=65536)
    init: Literal["orthogonal", "torch_default"] = "orthogonal"
    """Weight initialisation of the MLP layers: orthogonal (gain sqrt(2), policy head 0.01, value
    and Q heads 1.0; zero biases: CleanRL's PPO and DQN, Stable-Baselines3's PPO), or torch_default
    (``nn.Linear``'s own: Stable-Baselines3's DQN). The CNN torso and recurrent cores are always
    orthogonal; torch_default is accepted for feed-forward MLP PPO and DQN."""

    @field_validator("hidden_sizes")
    @classmethod
    def _positive(cls, sizes: list[int]) -> list[int]:
        if any(s < 1 or s > 65536 for s in sizes):
            raise ValueError("every hidden size must be in [1, 65536]")
        return sizes


class PPOConfig(_Section):
    """PPO hyper-parameters (CleanRL defaults unless a preset says otherwise)."""

    num_steps: int = Field(128, ge=1, le=100_000)
    """Rollout length per sub-env per iteration."""
    learning_rate: float = Field(2.5e-4, gt=0, le=1.0)
    anneal_lr: bool = True
    """Linearly anneal the learning rate to 0 over ``anneal_steps`` env steps."""
    anneal_steps: int = Field(500_000, ge=1)
    gamma: float = Field(0.99, ge=0, le=1)
    gae_lambda: float = Field(0.95, ge=0, le=1)
    num_minibatches: int = Field(4, ge=1)
    update_epochs: int = Field(4, ge=1, le=1000)
    clip_coef: float = Field(0.2, gt=0)
    clip_vloss: bool = True
    ent_coef: float = Field(0.01, ge=0)
    vf_coef: float = Field(0.5, ge=0)
    norm_adv: bool = True
    adam_eps: float = Field(1e-5, gt=0)


class ValueConfig(_Section):
    """Hyper-parameters shared by the value-based trainers (DQN, IQN). Schedules count agent
    steps (decisions: env steps unless ``env.action_repeat`` > 1) over all sub-envs."""

    learning_rate: float = Field(2.5e-4, gt=0, le=1.0)
    adam_eps: float = Field(1e-8, gt=0)
    gamma: float = Field(0.99, ge=0, le=1)
    buffer_size: int = Field(10_000, ge=1, le=100_000_000)
    """Replay capacity in transitions (at least ``batch_size``)."""
    batch_size: int = Field(128, ge=1, le=1_000_000)
    learning_starts: int = Field(10_000, ge=0)
    """Agent steps collected before the first update (updates also wait for ``batch_size`` transitions)."""
    train_frequency: int = Field(1, ge=1, le=100_000)
    """Vector-env steps between update phases."""
    gradient_steps: int = Field(1, ge=1, le=10_000)
    """Optimiser steps per update phase."""
    target_update_interval: int = Field(500, ge=1)
    """Optimiser steps between target-network updates."""
    tau: float = Field(1.0, gt=0, le=1)
    """Target update: 1.0 copies the online network (hard update); < 1 is Polyak averaging."""
    start_epsilon: float = Field(1.0, ge=0, le=1)
    end_epsilon: float = Field(0.05, ge=0, le=1)
    exploration_steps: int = Field(50_000, ge=1)
    """Agent steps over which epsilon decays linearly from ``start_epsilon`` to ``end_epsilon``."""
    double_q: bool = False
    """Double Q-learning: the online network picks the next action, the target network values it."""
    n_step: int = Field(1, ge=1, le=1000)
    """n-step returns (outcome-changing): 1 = one-step TD targets; n > 1 = the chunked n-step writer."""
    prioritized_replay: bool = False
    """Proportional prioritized replay (Schaul et al. 2016; outcome-changing); false = uniform."""
    per_alpha: float = Field(0.6, ge=0, le=1)
    """Priority exponent: P(i) ~ p_i ** alpha."""
    per_beta: float = Field(0.4, ge=0, le=1)
    """Initial importance-sampling exponent, annealed linearly to 1 over ``per_beta_steps``."""
    per_beta_steps: int = Field(100_000, ge=1)
    per_eps: float = Field(1e-6, gt=0)
    """Added to |TD error| so that no transition has priority zero."""
    log_interval: int = Field(1_000, ge=1)
    """Agent steps per ``iterate()``: statistics are flushed (one host sync with sync_free_logging)
    and non-finite updates checked once per interval. Does not change the algorithm."""


class DQNConfig(ValueConfig):
    """DQN (Mnih et al. 2015): Huber TD loss, target network, epsilon-greedy acting."""


class IQNConfig(ValueConfig):
    """IQN (Dabney et al. 2018): quantile function of the return, sampled fractions tau."""

    num_tau_samples: int = Field(64, ge=1, le=4096)
    """N: fractions sampled for the online network's quantiles in the loss."""
    num_tau_prime_samples: int = Field(64, ge=1, le=4096)
    """N': fractions sampled for the target quantiles in the loss."""
    num_quantile_samples: int = Field(32, ge=1, le=4096)
    """K: fractions averaged into Q-values for acting and next-action selection (risk-neutral)."""
    quantile_embedding_dim: int = Field(64, ge=1, le=4096)
    """Cosine features of tau: cos(pi * i * tau) for i = 0..dim-1."""
    kappa: float = Field(1.0, gt=0)
    """Huber threshold of the quantile Huber loss."""


OptimizationsConfig: type[_Section] = create_model(
    "OptimizationsConfig", __base__=_Section, __doc__="Training-speed flags (``flags.py``); each default is the plain path.",
    **{f.name: f.schema_field() for f in OPTIMISATION_FLAGS},
)


class TuningConfig(_Section):
    """Thresholds that feed ``auto`` rules and optimised paths (``flags.TUNINGS`` says why each)."""

    small_update_elements: int = Field(TUNING["small_update_elements"].default, ge=1)
    aten_tanh_min_elements: int = Field(TUNING["aten_tanh_min_elements"].default, ge=1)
    noise_block_steps: int = Field(TUNING["noise_block_steps"].default, ge=1, le=1_000_000)
    compile_break_even_env_steps: int = Field(TUNING["compile_break_even_env_steps"].default, ge=0)
    native_min_envs: int = Field(TUNING["native_min_envs"].default, ge=1)


class StabilityConfig(_Section):
    max_grad_norm: float | None = Field(0.5, gt=0)
    """Clip the global gradient norm (None = no clipping)."""
    nan_policy: Literal["raise", "skip_update", "warn"] = "raise"


class DistributedConfig(_Section):
    """Data-parallel training (DistributedDataParallel) over processes started by ``torchrun``."""

    enabled: bool = False
    """false: one process (plain); true: join torchrun's process group, average gradients over ranks."""
    backend: Literal["gloo", "nccl", "auto"] = "auto"
    """auto: NCCL on CUDA, gloo on CPU."""
    timeout_s: int = Field(600, ge=1, le=86_400)
    """How long a collective may wait for the other ranks before the run fails."""


class RunConfig(_Section):
    """How the harness measures: budgets are in env steps (frames)."""

    steps: int = Field(16_384, ge=1, le=10**12)
    """Timed env-step budget of each repeat."""
    warmup_steps: int = Field(2_048, ge=0, le=10**12)
    """Env steps run (and compiled) before the clock starts."""
    repeats: int = Field(3, ge=1, le=100)
    return_window: int = Field(20, ge=1)
    """Episodes averaged into ``mean_return_last_k``."""
    latency_samples: int = Field(100, ge=1)
    fair_threads: bool = True
    """Cap torch's default intra-op thread count (a variant with ``torch_threads`` unset) at the
    cores other processes leave free, measured just before the run, so that a busy neighbour
    cannot make default-threaded variants spin against it. A quiet machine is unaffected."""
    heap_retention: bool = True
    """Fix glibc's malloc thresholds high before the arms are built (``harness/measurement/allocator.py``), so
    that what the process allocated before cannot decide whether an arm faults its per-step arrays
    in afresh. Every arm of the run shares the setting; false leaves glibc's adaptive thresholds.
    Off Linux/glibc there is nothing to fix."""
    planted_slowdown_pct: float = Field(0.0, ge=0.0, lt=100.0)
    """Calibration knob: each timed iteration busy-waits so that throughput falls by this percent
    (20 -> 0.8x env steps/s). Used by ``rlgauge calibrate``; 0 (no delay) for measurements."""


class TrainConfig(_Section):
    """The whole configuration of one training run."""

    algo: Literal["ppo", "dqn", "iqn"] = "ppo"
    """Which trainer runs; it reads its own section (``ppo``, ``dqn`` or ``iqn``). The other
    algorithms' sections are validated but ignored, and left out of the recorded config."""
    seed: int = Field(1, ge=0, le=2**31 - 1)
    device: str = "auto"
    env: EnvConfig = Field(default_factory=EnvConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    dqn: DQNConfig = Field(default_factory=DQNConfig)
    iqn: IQNConfig = Field(default_factory=IQNConfig)
    optimizations: OptimizationsConfig = Field(default_factory=OptimizationsConfig)  # type: ignore[valid-type]
    tuning: TuningConfig = Field(default_factory=TuningConfig)
    stability: StabilityConfig = Field(default_factory=StabilityConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="before")
    @classmethod
    def _empty_sections(cls, data: Any) -> Any:
        """A section written with no keys (``optimizations:``) means all defaults."""
        if isinstance(data, dict):
            data = {k: ({} if v is None and k in _SECTIONS else v) for k, v in data.items()}
        return data

    @field_validator("device")
    @classmethod
    def _device_syntax(cls, value: str) -> str:
        base, sep, index = value.partition(":")
        if base not in ("auto", "cpu", "cuda", "mps") or (sep and (base != "cuda" or not index.isdigit())):
            raise ValueError("expected auto, cpu, cuda, cuda:N or mps")
        return value


ALGORITHM_SECTIONS = ("ppo", "dqn", "iqn")
_SECTIONS = ("env", "model", *ALGORITHM_SECTIONS, "optimizations", "tuning", "stability", "distributed", "run")

# --------------------------------------------------------------------------- errors

def _dotted(loc: tuple[Any, ...]) -> str:
    """The user's dotted key of an error location, without pydantic's union/constraint tags."""
    parts: list[str] = []
    model: type[BaseModel] | None = TrainConfig
    for part in loc:
        if model is not None and str(part) in model.model_fields:
            parts.append(str(part))
            annotation = model.model_fields[str(part)].annotation
            model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        elif model is not None or isinstance(part, int):
            parts.append(str(part))  # an unknown key, or a list index
            model = None
    return ".".join(parts)


def _section_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = TrainConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _describe(error: dict[str, Any]) -> str:
    loc = tuple(error["loc"])
    key = _dotted(loc)
    value = error.get("input")
    if error["type"] == "extra_forbidden":
        section = _section_at(loc)
        known = sorted(section.model_fields) if section else []
        guess = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"; did you mean '{guess[0]}'?" if guess else ""
        return f"{key}: unknown key{hint} (accepted: {', '.join(known)})"
    message = error["msg"].removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    ctx = error.get("ctx") or {}
    if "expected" in ctx:
        message = f"expected {ctx['expected']}"
    elif error["type"] in _EXPECTED_TYPES:
        message = f"expected {_EXPECTED_TYPES[error['type']]}{' or null' if _optional(loc) else ''}"
        if isinstance(value, str):
            quoted_number = error["type"] in ("int_type", "float_type") and _numeric_text(value)
            if error["type"] == "float_type" and _non_finite_text(value):
                message = "expected a finite number"
            else:
                message += ", not a string" + (" (write it without quotes)" if quoted_number else "")
    return f"{key}: invalid value {_short_repr(value)}: {message}"


_EXPECTED_TYPES = {
    "int_type": "an integer", "float_type": "a number", "bool_type": "a boolean (true or false)",
    "string_type": "a string", "list_type": "a list", "dict_type": "a mapping",
}
"""Strict-mode type errors, as the phrase naming the type that is accepted."""


def _numeric_text(text: str) -> bool:
    """Whether ``text`` reads as a number once unquoted (``'16'``, ``'1e-3'``)."""
    try:
        value = safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _non_finite_text(text: str) -> bool:
    """Whether ``text`` spells NaN or an infinity (``'nan'``, ``'inf'``, ``'-Infinity'``)."""
    try:
        return not math.isfinite(float(text))
    except ValueError:
        return False


def _optional(loc: tuple[Any, ...]) -> bool:
    """Whether the last schema field on the path ``loc`` also accepts null (``stability.max_grad_norm``)."""
    model: type[BaseModel] | None = TrainConfig
    annotation: Any = None
    for part in loc:
        field = model.model_fields.get(str(part)) if model is not None else None
        if field is None:
            break
        annotation = field.annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return type(None) in get_args(annotation)


def config_error_from(exc: ValidationError) -> ConfigError:
    """Turn pydantic's report into one line (the first problem, with a count of others)."""
    errors = exc.errors()
    # Union[bool, Literal['auto']] reports one error per branch; keep one per key.
    seen: dict[str, dict[str, Any]] = {}
    for err in errors:
        seen.setdefault(_dotted(tuple(err["loc"])), err)
    first_key, first = next(iter(seen.items()))
    text = _describe(first)
    accepted = _union_accepts(first_key)
    if first["type"] != "extra_forbidden" and accepted:
        text = f"{first_key}: invalid value {_short_repr(first.get('input'))}: expected {accepted}"
    more = len(seen) - 1
    return ConfigError(text + (f" (and {more} more problem{'s' * (more > 1)})" if more else ""))


def _union_accepts(key: str) -> str | None:
    """For the union-typed flags, one phrase naming everything accepted."""
    section, _, name = key.rpartition(".")
    if section != "optimizations":
        return None
    if name == "torch_threads":
        return "an integer in 1..1024, 'auto' or null"
    field = OptimizationsConfig.model_fields.get(name)
    return "true, false or 'auto'" if field is not None and field.annotation == Union[bool, Auto] else None


def build_config(data: dict[str, Any], overrides: list[str] | None = None) -> TrainConfig:
    """Validate a raw mapping (plus ``--set`` overrides) into a ``TrainConfig``."""
    merged = apply_overrides(data, overrides or [])
    try:
        return TrainConfig.model_validate(merged)
    except ValidationError as exc:
        raise config_error_from(exc) from None


def to_plain_dict(config: BaseModel) -> dict[str, Any]:
    """The config as plain YAML/JSON-ready data; a ``TrainConfig`` keeps only its own algorithm's section."""
    data = config.model_dump(mode="json")
    if isinstance(config, TrainConfig):
        for name in ALGORITHM_SECTIONS:
            if name != config.algo:
                data.pop(name)
    return data
