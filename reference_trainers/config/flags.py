"""The flag registry: every training-speed flag declared once, as data.

Each ``Flag`` says what a switch accepts, its plain and optimised values, what it applies to
(algorithms, devices, model bodies), how ``auto`` resolves and what blocks it, its parity
class, the plain and optimised paths in one line each, and where it takes effect. The config
schema (``config.OptimizationsConfig``), ``resolve``, ``rlgauge config``'s summary, the parity
tolerances, ``ablate``'s arms, ``diagnose``'s advice, ``docs/flags.md`` and the hypothesis
strategies all read this table. Adding a flag is one entry here, its code path, and its
effect test (``tests/test_flag_registry.py`` fails until a test marked
``flag_effect(KEY)`` exists).

Registry order is resolution order: an ``auto`` rule may read flags declared above it.
"""

from __future__ import annotations

import importlib

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field

if TYPE_CHECKING:  # the registry is data: importing it (the CLI does, for --help) loads neither torch nor gymnasium
    import gymnasium as gym
    import torch

    from reference_trainers.config.schema import TrainConfig

Auto = Literal["auto"]
BoolOrAuto = Union[bool, Auto]

EXACT, FP_REORDER, REDUCED_PRECISION, OUTCOME = "exact", "fp-reorder", "reduced-precision", "outcome"
PARITY_CLASSES = (EXACT, FP_REORDER, REDUCED_PRECISION, OUTCOME)
"""From the tightest to the loosest (``harness/stats/parity.py`` holds their tolerances)."""
CLASS_PROMISES = {
    EXACT: "parameters and losses equal to the all-plain run's within float32 round-off",
    FP_REORDER: "the same maths with reassociated float ops: parameters within a few ulps per op",
    REDUCED_PRECISION: "finite everywhere; over several updates the parameter changes point the way the float32 "
                       "run's do and the losses stay within a stated bound (a skipped or reversed update fails)",
    OUTCOME: "changes the sample stream: compared by learning outcome, not by numbers",
}

ALGOS = ("ppo", "dqn", "iqn")
DEVICES = ("cpu", "cuda", "mps")
BODIES = ("mlp", "cnn")
PHASES = ("env", "inference", "update", "transfer", "logging")

OPTIMISATION, SETTING, ALGORITHM = "optimisation", "setting", "algorithm"
"""Roles: an optimisation switches a code path (ablated, parity-tested); a setting is a
parameter of one (``amp_dtype`` of ``amp``); an algorithm option changes the sample stream
(measured by sweeps, compared by learning outcome)."""


@dataclass(frozen=True)
class Tuning:
    """A threshold that feeds an ``auto`` rule or a path: a named default, overridable in config
    (``tuning.NAME``)."""

    name: str
    default: int
    why: str


TUNINGS: tuple[Tuning, ...] = (
    Tuning("small_update_elements", 65_536,
           "rows x width of an update's activations up to which one CPU thread beats several "
           "(``torch_threads: auto``): thread hand-off costs more than it saves below it"),
    Tuning("aten_tanh_min_elements", 32_768,
           "activations of at least this many elements take ATen's tanh kernel inside a compiled CPU "
           "step (``aten_tanh``); below it inductor's vectorised tanh is as fast"),
    Tuning("compile_break_even_env_steps", 500_000,
           "env steps of a run's budget (``run``: warm-up plus timed repeats; a standalone trainer's "
           "``--steps``; ``learn --steps``) from which compiling the CPU hand-written train step "
           "(``compile_train_step: auto``) pays for its seconds of compile time; shorter runs stay eager"),
    Tuning("native_min_envs", 6,
           "sub-envs from which ``env.vectorization: auto`` picks an env's native vector entry point: its "
           "batched array code costs about the same whatever the count, so below this a loop of plain env "
           "steps (``serial``) is faster"),
    Tuning("noise_block_steps", 256,
           "env steps of epsilon-greedy draws taken in one call by ``block_noise`` (the same numbers "
           "as one call per step on the CPU)"),
)
TUNING = {t.name: t for t in TUNINGS}


@dataclass
class Context:
    """What an ``auto`` rule or a blocker may read while a config is being resolved."""

    config: TrainConfig
    device: torch.device
    observation_space: gym.Space
    action_space: gym.Space
    supports_bf16: bool
    supports_fp16_autocast: bool
    supports_tf32: bool
    supports_fused_adam: bool

    @property
    def device_name(self) -> str:
        """The device as its errors name it (``NVIDIA A100``, the CPU's model); asked only when a rule fails."""
        from reference_trainers.runtime.device import device_name

        return device_name(self.device)

    @property
    def kind(self) -> str:
        return self.device.type

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def on_cpu(self) -> bool:
        return self.device.type == "cpu"

    @property
    def o(self) -> Any:
        return self.config.optimizations

    @property
    def algo(self) -> str:
        return self.config.algo


def step_budget(config: TrainConfig) -> int:
    """Env steps the config's run trains for: ``run.warmup_steps`` plus ``run.repeats`` x ``run.steps``
    (a standalone trainer and ``learn`` set these from their ``--steps``: ``budget_overrides``)."""
    run = config.run
    return run.warmup_steps + run.repeats * run.steps


def budget_overrides(steps: int) -> list[str]:
    """``--set`` overrides that make ``step_budget`` read ``steps``, for commands whose budget is one
    run of ``--steps`` env steps (what ``auto`` rules that weigh a fixed cost against it read)."""
    return [f"run.steps={steps}", "run.warmup_steps=0", "run.repeats=1"]


AutoRule = Callable[[Context], tuple[Any, str]]
Blockers = Callable[[Context], list[tuple[bool, str]]]


@dataclass(frozen=True)
class Flag:
    """One switch: everything the schema, resolver, docs, parity tests and ablation need to know."""

    key: str
    """Dotted config key, e.g. ``optimizations.batch_inference``."""
    annotation: Any
    """The pydantic type of the value (schema)."""
    plain: Any
    """The plain path's value: the schema default and the baseline's."""
    optimised: tuple[Any, ...]
    """Values that take an optimised path (one effect test each where there are several)."""
    preset: Any
    """What an optimized preset variant sets unless it says otherwise (often ``auto``)."""
    parity: str
    """Parity class of the optimised path against the plain one."""
    parity_why: str
    plain_path: str
    optimised_path: str
    where: tuple[str, ...]
    """Where it takes effect: importable references, ``reference_trainers.module:Class.method`` (``_at``)."""
    phase: str
    """The phase of a training step it speeds up (``diagnose`` advises it there)."""
    role: str = OPTIMISATION
    algos: tuple[str, ...] = ALGOS
    devices: tuple[str, ...] = DEVICES
    bodies: tuple[str, ...] = BODIES
    auto: AutoRule | None = None
    """``auto`` -> (value, one-line reason); None where ``auto`` is not accepted."""
    blockers: Blockers | None = None
    """(blocked, why) pairs: an explicit optimised value where one is blocked is a ConfigError,
    and ``auto`` resolves to the plain value with the first reason."""
    parity_by_value: dict[Any, str] = field(default_factory=dict)
    """Value-specific classes where the values of one key differ (``env.vectorization``)."""
    constraints: dict[str, Any] = field(default_factory=dict)
    """pydantic ``Field`` constraints (``ge``, ``le``)."""
    advice: str = ""
    """What ``diagnose`` suggests when this flag is off in the phase that dominates."""

    @property
    def section(self) -> str:
        return self.key.split(".")[0]

    @property
    def name(self) -> str:
        return self.key.split(".", 1)[1]

    def is_plain(self, value: Any) -> bool:
        return value == self.plain or (value is None and self.plain is None)

    def schema_field(self) -> tuple[Any, Any]:
        """(annotation, pydantic Field) for ``pydantic.create_model``."""
        return self.annotation, Field(self.plain, description=self.doc_line(), **self.constraints)

    def doc_line(self) -> str:
        return f"Plain: {self.plain_path} Optimised: {self.optimised_path}"


# --------------------------------------------------------------------------- auto rules and blockers

def _on_cuda(why: str) -> AutoRule:
    return lambda ctx: (ctx.on_cuda, why)


def _amp_dtype_auto(ctx: Context) -> tuple[Any, str]:
    return ("bfloat16" if ctx.supports_bf16 else "float16"), "bf16 where the device supports it"


def _amp_auto(ctx: Context) -> tuple[Any, str]:
    if ctx.o.cuda_graphs and ctx.o.amp_dtype == "float16":
        return False, "float16 AMP cannot be captured by cuda_graphs"
    return ctx.on_cuda, "tensor cores on CUDA; small CPU models run slower in autocast"


def _matmul_auto(ctx: Context) -> tuple[Any, str]:
    return (("high", "TF32 matmuls on CUDA") if ctx.on_cuda
            else ("highest", "reduced-precision CPU matmuls are opt-in"))


def _analytic_blockers(ctx: Context) -> list[tuple[bool, str]]:
    import gymnasium as gym

    c, o = ctx.config, ctx.o
    return [
        (c.model.recurrent != "none", f"model.recurrent {c.model.recurrent!r} needs backpropagation through time"),
        (c.algo == "ppo" and not isinstance(ctx.action_space, gym.spaces.Discrete),
         f"{c.env.id!r} has continuous actions; it covers discrete ones"),
        (bool(o.amp), "amp: its gradients are float32"),
        (o.compile_model is True, "compile_model compiles the module forward it bypasses"),
        (bool(o.cuda_graphs), "cuda_graphs captures the autograd update"),
        (c.distributed.enabled, "distributed training all-reduces inside autograd's backward"),
    ]


def _numpy_acting_blockers(ctx: Context) -> list[tuple[bool, str]]:
    c, o = ctx.config, ctx.o
    return [
        (c.model.recurrent != "none", f"model.recurrent {c.model.recurrent!r} carries a hidden state"),
        (bool(o.amp), "amp: NumPy computes in float32"),
        (o.matmul_precision != "highest", f"matmul_precision {o.matmul_precision!r}: NumPy multiplies in float32"),
        (bool(o.compile_model), "compile_model compiles the module forward it bypasses"),
    ]


def _compile_step_auto(ctx: Context) -> tuple[Any, str]:
    o, c = ctx.o, ctx.config
    iqn_on_cuda = ctx.on_cuda and c.algo == "iqn"
    value = ctx.on_cuda and not o.cuda_graphs and not c.distributed.enabled and not iqn_on_cuda
    if o.cuda_graphs:
        return value, "cuda_graphs captures the update instead"
    if c.distributed.enabled:
        return value, "DDP all-reduces inside backward, which a compiled step would break"
    if iqn_on_cuda:
        return value, "IQN's compiled update drifts from the eager one on CUDA"
    if ctx.on_cpu and o.numpy_update:
        return False, ("numpy_update runs the hand-written step in NumPy: on the CPU within a few percent of the "
                       "compiled step's rate or faster, with no compile time")
    if ctx.on_cpu and o.analytic_grads:
        budget, pays_from = step_budget(c), c.tuning.compile_break_even_env_steps
        if budget >= pays_from:
            return True, (f"the compiled hand-written step is faster, and a budget of {budget:,} env steps pays for "
                          f"its seconds of compile time (from tuning.compile_break_even_env_steps = {pays_from:,})")
        return False, (f"a budget of {budget:,} env steps is below tuning.compile_break_even_env_steps = "
                       f"{pays_from:,}: the compile would cost more than the faster step saves")
    return value, "as compile_model"


def _optimizer_auto(ctx: Context) -> tuple[Any, str]:
    return ("fused" if ctx.supports_fused_adam else "foreach"), "one fused kernel where the device has it"


def update_rows(config: TrainConfig) -> int:
    """Rows through the network per gradient step: the PPO minibatch, the DQN batch, or the
    IQN batch times its N fractions."""
    if config.algo == "ppo":
        return config.env.num_envs * config.ppo.num_steps // config.ppo.num_minibatches
    hp = getattr(config, config.algo)
    return hp.batch_size * (hp.num_tau_samples if config.algo == "iqn" else 1)


def _threads_auto(ctx: Context) -> tuple[Any, str]:
    c = ctx.config
    rows = update_rows(c)
    width = 512 if c.model.body == "cnn" else max(c.model.hidden_sizes)
    small = width <= 256 and rows * width <= c.tuning.small_update_elements
    if not ctx.on_cpu:
        return None, "torch default"
    return ((1, f"one thread: a {rows}x{width} update is too small to split across threads") if small
            else (None, f"torch default: a {rows}x{width} update keeps every core busy"))


def _uint8_auto(ctx: Context) -> tuple[Any, str]:
    if ctx.config.model.body != "cnn":
        return False, "only image observations with the cnn body are uint8"
    if ctx.on_cpu:
        return False, ("on the CPU there is no host->device copy to shrink, and scaling in the network adds a "
                       "conversion per forward")
    return True, "uint8 pixels cross as one byte each and are normalised on the device"


def _replay_auto(ctx: Context) -> tuple[Any, str]:
    return "tensor", "preallocated device tensors: batched inserts, no per-sample conversion"


def _compiled_hand_written_step(ctx: Context) -> list[tuple[bool, str]]:
    o = ctx.o
    return [(not o.analytic_grads, "it lives in the hand-written step: needs analytic_grads"),
            (not o.compile_train_step, "it lives in the compiled train step: needs compile_train_step")]


def _gather_in_step_blockers(ctx: Context) -> list[tuple[bool, str]]:
    o = ctx.o
    return [*_compiled_hand_written_step(ctx),
            (o.num_workers != 0, f"num_workers {o.num_workers} gathers minibatches on prefetch threads"),
            (o.replay != "tensor", "it gathers from tensor replay: needs replay 'tensor'")]


def _direct_write_blockers(ctx: Context) -> list[tuple[bool, str]]:
    hp = getattr(ctx.config, ctx.algo)
    return [(ctx.o.replay != "tensor", "it writes into tensor replay: needs replay 'tensor'"),
            (not ctx.on_cpu, f"it writes host arrays into host tensors; the replay lives on {ctx.kind}"),
            (hp.n_step != 1, f"{ctx.algo}.n_step {hp.n_step}: n-step transitions go through the writer"),
            (hp.prioritized_replay, "prioritized replay records each insert's priority")]


def _direct_adam_blockers(ctx: Context) -> list[tuple[bool, str]]:
    o = ctx.o
    return [(o.optimizer_impl != "fused", f"it calls the fused Adam kernel: needs optimizer_impl 'fused', "
                                          f"not {o.optimizer_impl!r}"),
            (bool(o.cuda_graphs), "cuda_graphs captures the optimiser's own step"),
            (bool(o.amp) and o.amp_dtype == "float16", "float16 AMP steps through the GradScaler")]


def _packed_gather_blockers(ctx: Context) -> list[tuple[bool, str]]:
    return [(ctx.config.model.recurrent != "none",
             f"model.recurrent {ctx.config.model.recurrent!r}: the recurrent update gathers whole sub-env sequences")]


def _stacked_blockers(ctx: Context) -> list[tuple[bool, str]]:
    c, o = ctx.config, ctx.o
    return [(c.model.recurrent != "none", f"model.recurrent {c.model.recurrent!r}: the actor and critic share a "
                                          "recurrent core, not two MLPs"),
            (bool(o.compile_model), "compile_model compiles the model's own forward, which acting would bypass"),
            (c.distributed.enabled, "DDP wraps the model's own forward, which acting would bypass")]


def _block_noise_blockers(ctx: Context) -> list[tuple[bool, str]]:
    import gymnasium as gym

    return [(not ctx.o.numpy_acting, "it draws the NumPy acting path's noise: needs numpy_acting"),
            (ctx.algo == "ppo" and not isinstance(ctx.action_space, gym.spaces.Discrete),
             f"{ctx.config.env.id!r} has continuous actions: one call for a block of normal draws gives other "
             "numbers than one call per step")]


def _aten_tanh_blockers(ctx: Context) -> list[tuple[bool, str]]:
    return [*_compiled_hand_written_step(ctx),
            (ctx.config.model.activation != "tanh", f"model.activation {ctx.config.model.activation!r} has no tanh")]


def _numpy_update_blockers(ctx: Context) -> list[tuple[bool, str]]:
    o = ctx.o
    return [(not o.analytic_grads, "it runs the hand-written step in NumPy: needs analytic_grads"),
            (o.compile_train_step is True, "compile_train_step compiles the torch hand-written step instead"),
            (o.matmul_precision != "highest", f"matmul_precision {o.matmul_precision!r}: NumPy multiplies in float32")]


def _tf32_blockers(ctx: Context) -> list[tuple[bool, str]]:
    blocked = ctx.on_cuda and not ctx.supports_tf32
    return [(blocked, f"TF32 needs compute capability 8.0+, which {ctx.device_name} lacks" if blocked else "")]


def _cuda_graphs_blockers(ctx: Context) -> list[tuple[bool, str]]:
    c, o = ctx.config, ctx.o
    return [(o.amp is True and o.amp_dtype == "float16",
             "float16 AMP's GradScaler checks on the host, which a graph cannot capture; use amp_dtype bfloat16"),
            (c.stability.nan_policy == "skip_update",
             "stability.nan_policy 'skip_update' decides on the host per update, which a graph cannot capture"),
            (o.compile_train_step is True, "choose one of cuda_graphs and compile_train_step for the update"),
            (c.model.recurrent != "none",
             f"model.recurrent {c.model.recurrent!r}: its update is a Python loop over time steps"),
            (c.distributed.enabled, "a graph cannot capture DDP's gradient all-reduce")]


def _compile_step_blockers(ctx: Context) -> list[tuple[bool, str]]:
    return [(ctx.config.distributed.enabled,
             "DDP all-reduces gradients inside backward, which a compiled train step cannot contain")]


def _amp_dtype_blockers(ctx: Context) -> list[tuple[bool, str]]:
    dtype = ctx.o.amp_dtype
    no_bf16 = dtype == "bfloat16" and not ctx.supports_bf16
    return [(no_bf16, f"bfloat16 autocast is not supported on {ctx.device_name}" if no_bf16 else ""),
            (dtype == "float16" and not ctx.supports_fp16_autocast, f"float16 autocast is not supported on {ctx.kind}")]


def _compile_mode_blockers(ctx: Context) -> list[tuple[bool, str]]:
    return [(ctx.o.compile_model is not True, "a mode has no effect unless compile_model is true")]


def _optimizer_impl_blockers(ctx: Context) -> list[tuple[bool, str]]:
    import torch

    return [(ctx.o.optimizer_impl == "fused" and not ctx.supports_fused_adam,
             f"fused Adam is not available on {ctx.kind} with torch {torch.__version__}")]


def _num_workers_blockers(ctx: Context) -> list[tuple[bool, str]]:
    hp = getattr(ctx.config, ctx.algo)
    return [(ctx.algo in ("dqn", "iqn") and hp.prioritized_replay,
             f"{ctx.algo}.prioritized_replay: prioritized minibatches cannot be prefetched (each draw needs the "
             "previous update's priorities)")]


def _inference_batch_size_blockers(ctx: Context) -> list[tuple[bool, str]]:
    o, envs = ctx.o, ctx.config.env.num_envs
    return [(o.batch_inference is not True, "it chunks the batched forward: needs batch_inference"),
            (o.inference_batch_size is not None and o.inference_batch_size > envs,
             f"it exceeds env.num_envs={envs} (accepted: 1..{envs} or null)")]


def _always(why: str) -> AutoRule:
    return lambda ctx: (True, why)


# --------------------------------------------------------------------------- the table

def _at(*references: str) -> tuple[str, ...]:
    """``"paths.speedups:make_adam"`` -> ``"reference_trainers.paths.speedups:make_adam"`` (a test imports each)."""
    return tuple(f"reference_trainers.{reference}" for reference in references)


def _o(name: str) -> str:
    return f"optimizations.{name}"


FLAGS: tuple[Flag, ...] = (
    Flag("env.vectorization", Literal["serial", "sync", "async", "native", "envpool", "auto"], "serial",
         ("sync", "async", "native", "envpool"), "auto", EXACT,
         "sync/async step the same sub-envs with the same seeds; native/envpool are other implementations of the env",
         "a Python loop over single envs.", "gymnasium's SyncVectorEnv / AsyncVectorEnv (shared memory), the env's "
         "own vectorised entry point (native) or EnvPool's C++ threads; auto: chosen per env.",
         _at("envs.factory:make_vector_env"), "env", role=OPTIMISATION,
         parity_by_value={"native": OUTCOME, "envpool": OUTCOME},
         advice="env.vectorization=native (the env's own batched step) or async for slow envs"),
    Flag("env.action_repeat", int, 1, (2, 4), 1, OUTCOME, "fewer decisions per frame change what the agent sees",
         "one decision per env step.", "each action repeated k times, rewards summed.", _at("envs.factory:ActionRepeat"), "env",
         role=ALGORITHM, constraints={"ge": 1, "le": 64}),
    Flag(_o("pinned_memory"), BoolOrAuto, False, (True,), "auto", EXACT, "the same bytes, copied from page-locked memory",
         "pageable host buffers.", "page-locked staging buffers for host->device copies.", _at("paths.speedups:HostToDevice"),
         "transfer", devices=("cuda",), auto=_on_cuda("page-locked staging needs CUDA"),
         advice="pinned_memory=true and non_blocking=true"),
    Flag(_o("non_blocking"), BoolOrAuto, False, (True,), "auto", EXACT, "the same copies, overlapped with host work",
         "blocking host->device copies.", "`.to(device, non_blocking=True)`.", _at("paths.speedups:HostToDevice"), "transfer",
         devices=("cuda",), auto=_on_cuda("asynchronous copies need CUDA")),
    Flag(_o("tf32"), BoolOrAuto, False, (True,), "auto", REDUCED_PRECISION, "TF32 keeps 10 significand bits in matmuls",
         "float32 matmuls and convolutions.", "TF32 tensor-core matmuls and cuDNN convolutions.",
         _at("runtime.device:apply_precision"), "update", devices=("cuda",),
         auto=lambda ctx: (ctx.on_cuda and ctx.supports_tf32, "TF32 needs compute capability 8.0+"), blockers=_tf32_blockers),
    Flag(_o("cuda_graphs"), BoolOrAuto, False, (True,), "auto", FP_REORDER,
         "a graph needs capturable Adam: step counts and bias corrections as float32 device tensors",
         "the update's kernels launched one by one.", "the fixed-shape update captured once and replayed.",
         _at("paths.speedups:CudaGraphedStep", "paths.learner:Learner._graphed_step"), "update", devices=("cuda",),
         auto=lambda ctx: (False, "opt-in: capture is measured per workload"),
         advice="cuda_graphs=true for the update", blockers=_cuda_graphs_blockers),
    Flag(_o("replay"), Literal["list", "tensor", "auto"], "list", ("tensor",), "auto", EXACT,
         "the same transitions drawn by the same sampler RNG",
         "a Python list of numpy transitions, converted per sampled minibatch.",
         "preallocated device tensors, batched insert, device-side gather.", _at("replay.buffers:make_replay"), "update",
         algos=("dqn", "iqn"), auto=_replay_auto),
    Flag(_o("matmul_precision"), Literal["highest", "high", "medium", "auto"], "highest", ("high", "medium"), "auto",
         REDUCED_PRECISION, "reduced-precision matmul kernels (TF32 or bf16 passes)",
         "float32 matmuls (`highest`).", "`torch.set_float32_matmul_precision('high'|'medium')` while the trainer runs.",
         _at("runtime.device:apply_precision"), "update", auto=_matmul_auto),
    Flag(_o("amp_dtype"), Literal["bfloat16", "float16", "auto"], "auto", ("bfloat16", "float16"), "auto",
         REDUCED_PRECISION, "bf16 keeps 8 significand bits, fp16 10",
         "(with amp off, unused)", "the autocast dtype: bfloat16, or float16 with a GradScaler.",
         _at("runtime.device:autocast"), "update", role=SETTING, auto=_amp_dtype_auto, blockers=_amp_dtype_blockers),
    Flag(_o("amp"), BoolOrAuto, False, (True,), "auto", REDUCED_PRECISION, "forwards computed in bf16 or fp16",
         "float32 forwards.", "forwards under `torch.autocast` (bf16, or fp16 with a GradScaler).",
         _at("runtime.device:autocast"), "update", auto=_amp_auto, advice="amp=true (tensor cores)"),
    Flag(_o("compile_model"), BoolOrAuto, False, (True,), "auto", FP_REORDER, "inductor reassociates float ops",
         "the eager module forward.", "`torch.compile(model, mode=compile_mode)`, eager fallback on failure.",
         _at("paths.learner:maybe_compile"), "inference",
         auto=_on_cuda("kernel fusion pays on CUDA; tiny CPU models run slower compiled")),
    Flag(_o("compile_mode"), Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
         "default", ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"), "default", FP_REORDER,
         "a mode of compile_model", "inductor's default mode.", "another inductor mode for compile_model.",
         _at("paths.learner:maybe_compile"), "inference", role=SETTING, blockers=_compile_mode_blockers),
    Flag(_o("analytic_grads"), BoolOrAuto, False, (True,), "auto", FP_REORDER,
         "the same gradients by hand: other float op order than autograd's",
         "autograd records the forward and runs its backward.",
         "the gradients of the loss and of every layer computed by hand under no_grad.",
         _at("nets.mlp:mlp_backward", "ppo.updates:HandWrittenUpdate", "value.updates:HandWrittenUpdate"), "update",
         algos=("ppo", "dqn"), bodies=("mlp",), blockers=_analytic_blockers,
         auto=lambda ctx: (ctx.on_cpu, "per-op overhead dominates small CPU updates; hand-written gradients need no "
                                       "autograd graph" if ctx.on_cpu else "measured on the CPU only; autograd on accelerators"),
         advice="analytic_grads=true (hand-written gradients, no autograd graph)"),
    Flag(_o("numpy_acting"), BoolOrAuto, False, (True,), "auto", FP_REORDER,
         "NumPy's float32 matmul sums in another order than torch's",
         "the acting forward and action choice in torch ops.",
         "the acting forward and action choice in NumPy over zero-copy views of the weights.",
         _at("nets.mlp:NumpyMLP", "ppo.policy:NumpyPPOActing", "value.acting:NumpyEpsilonGreedy"), "inference", algos=("ppo", "dqn"), devices=("cpu",), bodies=("mlp",),
         blockers=_numpy_acting_blockers,
         auto=_always("torch's per-op dispatch dominates a forward of a few rows; NumPy calls cost less"),
         advice="numpy_acting=true (the acting forward in NumPy over the same weights)"),
    Flag(_o("block_noise"), BoolOrAuto, False, (True,), "auto", EXACT,
         "one call for a block of draws gives the same numbers as one call per step on the CPU",
         "the acting draws taken with torch calls every step (DQN: epsilon-greedy, two; PPO: the sampling "
         "uniforms, one).",
         "the draws of a block of steps taken in one call each, used row by row (DQN: "
         "`tuning.noise_block_steps` steps; PPO: the rollout's, drawn as it starts).",
         _at("value.acting:HostNoise", "ppo.policy:NumpyPPOActing.noise"), "inference", algos=("ppo", "dqn"), devices=("cpu",),
         bodies=("mlp",), blockers=_block_noise_blockers,
         auto=_always("a torch call per step costs more than the draws")),
    Flag(_o("numpy_update"), BoolOrAuto, False, (True,), "auto", FP_REORDER,
         "NumPy's float32 kernels sum and round in another order than torch's",
         "the hand-written step's forward, loss gradients, backward and clipping as torch ops.",
         "the same step as NumPy calls over zero-copy views of the weights and the flat gradient buffer "
         "(the fused Adam step stays torch's), its minibatches taken as NumPy arrays.",
         _at("paths.numpy_update:HostPPOStep", "paths.numpy_update:HostDQNStep"), "update", algos=("ppo", "dqn"), devices=("cpu",),
         bodies=("mlp",),
         blockers=_numpy_update_blockers,
         auto=_always("torch's per-op dispatch (and its CPU tanh) costs more than NumPy's calls on a small minibatch"),
         advice="numpy_update=true (the hand-written update in NumPy)"),
    Flag(_o("compile_train_step"), BoolOrAuto, False, (True,), "auto", FP_REORDER, "inductor reassociates float ops",
         "the eager train step.", "the train step compiled (`torch.compile`), eager fallback on failure.",
         _at("paths.speedups:CompiledOrEager"), "update", auto=_compile_step_auto, blockers=_compile_step_blockers,
         advice="compile_train_step=true (the update compiled)"),
    Flag(_o("compile_cpp_wrapper"), BoolOrAuto, False, (True,), "auto", EXACT,
         "the same kernels, called from C++ instead of Python",
         "inductor's Python wrapper calls the compiled step's kernels.",
         "inductor's C++ wrapper calls them (seconds more compile time, once).",
         _at("paths.speedups:hand_written_step"), "update", algos=("ppo", "dqn"), devices=("cpu",), bodies=("mlp",),
         blockers=_compiled_hand_written_step, auto=_always("the Python wrapper's per-kernel calls dominate small steps")),
    Flag(_o("aten_tanh"), BoolOrAuto, False, (True,), "auto", FP_REORDER, "ATen's tanh rounds differently from inductor's",
         "inductor's generated tanh inside the compiled step.",
         "ATen's tanh kernel for activations of at least `tuning.aten_tanh_min_elements` elements.",
         _at("nets.mlp:tanh"), "update", algos=("ppo", "dqn"), devices=("cpu",), bodies=("mlp",),
         blockers=_aten_tanh_blockers, auto=_always("ATen's vectorised tanh is faster on large CPU activations")),
    Flag(_o("gather_in_step"), BoolOrAuto, False, (True,), "auto", EXACT,
         "the same rows gathered inside the step instead of before it",
         "the minibatch gathered from replay, then passed to the compiled step.",
         "the compiled step takes the drawn indices and gathers its minibatch itself: one call per update.",
         _at("value.updates:CompiledHandWrittenUpdate.grads_at"), "update", algos=("dqn",), devices=("cpu",), bodies=("mlp",),
         blockers=_gather_in_step_blockers, auto=_always("one compiled call per update instead of a gather beside it")),
    Flag(_o("optimizer_impl"), Literal["forloop", "foreach", "fused", "auto"], "forloop", ("foreach", "fused"), "auto",
         FP_REORDER, "multi-tensor and fused kernels reassociate the Adam update",
         "Adam's per-tensor Python loop.", "multi-tensor (`foreach`) or one fused kernel (`fused`) per group.",
         _at("paths.speedups:make_adam"), "update", auto=_optimizer_auto,
         advice="optimizer_impl=fused (one kernel for the Adam step)", blockers=_optimizer_impl_blockers),
    Flag(_o("foreach_grad_clip"), BoolOrAuto, False, (True,), "auto", FP_REORDER,
         "the same global norm, summed by multi-tensor kernels",
         "`torch.nn.utils.clip_grad_norm_` (with its per-call checks).",
         "the global norm and the scale in three multi-tensor ops (norms, their norm, one multiply).",
         _at("paths.speedups:clip_grad_norm"), "update", auto=_always("three kernels instead of a loop over tensors")),
    Flag(_o("direct_adam_step"), BoolOrAuto, False, (True,), "auto", EXACT,
         "the same fused kernel on the same state, without the optimiser's bookkeeping",
         "`optimizer.step()` of the fused Adam.",
         "the fused Adam kernel called directly, its step counters one tensor advanced by one add.",
         _at("paths.speedups:FusedAdamStep"), "update", blockers=_direct_adam_blockers,
         auto=_always("the optimiser's per-step bookkeeping costs more than the kernel on small models")),
    Flag(_o("torch_threads"), Union[Annotated[int, Field(ge=1, le=1024)], Auto, None], None, (1, 2), "auto",
         FP_REORDER, "another thread count splits reductions differently",
         "torch's default intra-op threads (all cores).", "a set number of intra-op threads while the trainer runs.",
         _at("runtime.device:apply_threads"), "update", auto=_threads_auto,
         advice="torch_threads=1 (small models lose more to thread hand-off than they gain)"),
    Flag(_o("uint8_transfer"), BoolOrAuto, False, (True,), "auto", EXACT, "uint8 -> float32 / 255 on either side",
         "pixel observations become float32 on the host before the copy.",
         "pixels cross as uint8 (a quarter of the bytes) and are normalised on the device.",
         _at("paths.speedups:HostToDevice"), "transfer", bodies=("cnn",), auto=_uint8_auto),
    Flag(_o("num_workers"), int, 0, (1, 2), 0, EXACT, "the same minibatches, assembled earlier",
         "minibatches assembled inline.", "background threads assemble the next minibatches during the update.",
         _at("paths.prefetch:Prefetcher"), "update", constraints={"ge": 0, "le": 64}, blockers=_num_workers_blockers),
    Flag(_o("batch_inference"), bool, False, (True,), True, EXACT, "the same rows, one batched matmul",
         "one forward per env and a host copy per sample.", "one batched forward per step, one host copy.",
         _at("paths.acting:BatchedActing"), "inference",
         advice="batch_inference=true (one forward for all envs)"),
    Flag(_o("inference_batch_size"), Union[Annotated[int, Field(ge=1)], None], None, (2,), None, EXACT,
         "the same rows in chunks", "one forward of num_envs rows.", "forwards of this many rows.",
         _at("paths.numpy_acting:chunk_rows"), "inference", role=SETTING, blockers=_inference_batch_size_blockers),
    Flag(_o("sync_free_logging"), bool, False, (True,), True, EXACT, "the same float32 sums, read once per interval",
         "`.item()` per logged value.", "float32 device accumulators, one sync per log interval.",
         _at("paths.training_stats:make_stats"), "logging", advice="sync_free_logging=true"),
    Flag(_o("lean_rollout"), BoolOrAuto, False, (True,), "auto", EXACT, "the same values, copied once per rollout",
         "each rollout step's reset mask, rewards and done flags cross to the device, and its actions, "
         "log-probabilities and values are written to storage, as they come.",
         "the reset mask, rewards and done flags are staged on the host and cross once per rollout; actions, "
         "log-probabilities and values are stacked once (with numpy_acting, staged on the host with the "
         "observations and copied once each); episodes and transitions are counted once per rollout from the "
         "staged arrays.", _at("ppo.rollout:LeanRollout"), "transfer",
         algos=("ppo",), auto=_always("one host->device copy per rollout, not per step")),
    Flag(_o("stacked_mlps"), BoolOrAuto, False, (True,), "auto", FP_REORDER,
         "one block-diagonal matmul per layer sums in another order",
         "the actor and the critic run as two networks when acting (in torch, or in NumPy with numpy_acting).",
         "they run as one stacked network (first layers concatenated, later ones block-diagonal: one matmul per "
         "layer), a snapshot per rollout: `StackedMLPs` in torch, `NumpyMLP.side_by_side` with numpy_acting.",
         _at("ppo.policy:PPOPolicy.actor_critic", "ppo.policy:NumpyPPOActing.forward"),
         "inference", algos=("ppo",), bodies=("mlp",), blockers=_stacked_blockers,
         auto=_always("half the forwards when acting")),
    Flag(_o("fused_gae"), BoolOrAuto, False, (True,), "auto", FP_REORDER,
         "GAE's terms precomputed for the whole rollout: another op order",
         "GAE as a loop of elementwise ops per step.",
         "the rollout-wide terms at once, then one fused multiply-add per step (on the CPU, two NumPy calls on views).",
         _at("ppo.trainer:compute_gae_fused"), "update", algos=("ppo",), auto=_always("fewer ops per time step")),
    Flag(_o("packed_gather"), BoolOrAuto, False, (True,), "auto", EXACT, "the same rows, gathered from one tensor",
         "a minibatch is one gather per field.", "the batch packed column-wise once; a minibatch is one gather.",
         _at("ppo.minibatches:packed_gather"), "update", algos=("ppo",), blockers=_packed_gather_blockers,
         auto=_always("one gather per minibatch instead of one per field")),
    Flag(_o("replay_direct_write"), BoolOrAuto, False, (True,), "auto", EXACT,
         "the writer's rows, bit for bit",
         "one-step transitions go through the n-step writer's batch, then into replay.",
         "a step with no reset row is written field by field straight into tensor replay.",
         _at("replay.buffers:ReplayBuffer.add_one_step"), "env", algos=("dqn", "iqn"), devices=("cpu",), bodies=("mlp",),
         blockers=_direct_write_blockers, auto=_always("no batch between the env step and replay")),
    Flag(_o("hand_written_quantile_loss"), BoolOrAuto, False, (True,), "auto", FP_REORDER,
         "the same loss and gradient by hand: another op order",
         "the quantile Huber loss in ordinary tensor ops, differentiated by autograd.",
         "a custom autograd function with its own backward (fewer saved tensors and ops).",
         _at("value.iqn:quantile_huber_loss"), "update", algos=("iqn",),
         auto=_always("fewer ops and saved tensors in the loss's backward")),
    Flag("dqn.n_step", int, 1, (3,), 1, OUTCOME, "n-step targets change the learning signal",
         "one-step TD targets.", "the chunked n-step writer.", _at("replay.writers:make_writer"), "update", role=ALGORITHM,
         algos=("dqn",)),
    Flag("dqn.prioritized_replay", bool, False, (True,), False, OUTCOME, "prioritised sampling changes the sample stream",
         "uniform sampling.", "tensorised proportional PER.", _at("replay.per:PrioritizedSampler"), "update", role=ALGORITHM,
         algos=("dqn",)),
    Flag("iqn.n_step", int, 1, (3,), 1, OUTCOME, "n-step targets change the learning signal",
         "one-step TD targets.", "the chunked n-step writer.", _at("replay.writers:make_writer"), "update", role=ALGORITHM,
         algos=("iqn",)),
    Flag("iqn.prioritized_replay", bool, False, (True,), False, OUTCOME, "prioritised sampling changes the sample stream",
         "uniform sampling.", "tensorised proportional PER.", _at("replay.per:PrioritizedSampler"), "update", role=ALGORITHM,
         algos=("iqn",)),
)

REGISTRY: dict[str, Flag] = {f.key: f for f in FLAGS}
OPTIMISATION_FLAGS = tuple(f for f in FLAGS if f.section == "optimizations")


def resolve_reference(reference: str) -> Any:
    """The object a ``where`` reference names (``module:Qualified.name``, or a bare module); ImportError or
    AttributeError when it names nothing."""
    module_name, _, qualname = reference.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        target = getattr(target, part)
    return target


def flag(key: str) -> Flag:
    """The registry entry of a dotted key (KeyError naming it when there is none)."""
    try:
        return REGISTRY[key]
    except KeyError:
        raise KeyError(f"{key} is not a registry flag") from None


def ablation_keys() -> tuple[str, ...]:
    """Keys whose value an ablation arm may switch (optimisations, not settings or algorithm options)."""
    return tuple(f.key for f in FLAGS if f.role == OPTIMISATION)


def optimised_variant() -> dict[str, dict[str, Any]]:
    """The registry's optimized-preset values, nested by section (only those that differ from plain)."""
    out: dict[str, dict[str, Any]] = {}
    for f in FLAGS:
        if f.role == OPTIMISATION and not f.is_plain(f.preset):
            out.setdefault(f.section, {})[f.name] = f.preset
    return out
