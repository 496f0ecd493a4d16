"""Flag advice for rlgauge's own trainers: which of their flags to try, from the probe's phase split,
host syncs, device utilisation and the env-only ceiling (a small table of rules over the config).

The profile is the probe's (``phase_seconds``, ``host_syncs_per_step``, device utilisation),
shown as a share of the timed wall time. The ceiling steps the same vector
backend with the same number of envs on random actions: no network, no learning. A run
near the ceiling cannot gain from learner-side flags; one far below it can.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from reference_trainers import frames_in_step, make_vector_env
from reference_trainers.config.schema import TrainConfig
from reference_trainers.config.flags import REGISTRY
from reference_trainers.runtime.probe import PHASES

from harness.results import RunResult

DIAGNOSE_DEFAULT_STEPS = 4096
LATENCY_BOUND_ENVS = 256
"""Sub-envs up to which an accelerator acts on too few rows per step to hide its kernel launches and
copies: such a run is latency-bound, and the CPU may be the faster device (``latency_bound``)."""


def env_ceiling(config: TrainConfig, steps: int) -> float:
    """Env steps/sec of random actions through the config's (resolved) vector backend and env count."""
    env = config.env
    envs = make_vector_env(env.id, env.num_envs, env.vectorization, action_repeat=env.action_repeat,
                           env_kwargs=env.kwargs)
    try:
        envs.reset(seed=config.seed)
        envs.action_space.seed(config.seed)
        actions = [envs.action_space.sample() for _ in range(max(1, steps // env.num_envs))]
        frames, resetting = 0, None  # a NEXT_STEP reset step takes no transition
        start = time.perf_counter()
        for action in actions:
            _, _, terminated, truncated, info = envs.step(action)
            frames += frames_in_step(info, env.num_envs, resetting)
            resetting = terminated | truncated
        return frames / (time.perf_counter() - start)
    finally:
        envs.close()


def phase_shares(run: RunResult) -> dict[str, float]:
    """Percent of the timed wall time per phase, plus ``other`` (loop overhead not inside a phase)."""
    rate = run.metrics["env_steps_per_sec"]
    samples = rate["samples"]
    per_repeat = run.steps_completed / len(samples)
    wall = sum(per_repeat / s for s in samples if s > 0)
    phases = run.metrics["phase_seconds"]
    shares = {name: 100.0 * phases.get(name, 0.0) / wall for name in PHASES} if wall else {n: 0.0 for n in PHASES}
    shares["other"] = max(0.0, 100.0 - sum(shares.values()))
    return shares


@dataclass(frozen=True)
class Facts:
    """What the rules look at."""

    shares: dict[str, float]
    syncs_per_step: float
    utilization_pct: float | None
    ceiling_fraction: float | None
    config: dict[str, Any]
    compile_works: bool | None
    preset: str = "PRESET"

    @property
    def opt(self) -> dict[str, Any]:
        return self.config["optimizations"]

    @property
    def on_cuda(self) -> bool:
        return str(self.config["device"]).startswith("cuda")

    @property
    def num_envs(self) -> int | None:
        return self.config.get("env", {}).get("num_envs")


@dataclass(frozen=True)
class Rule:
    name: str
    fires: Callable[[Facts], bool]
    advice: Callable[[Facts], str]


def _tip(name: str) -> str:
    """The flag registry's advice for ``optimizations.NAME`` (or ``env.NAME``)."""
    entry = REGISTRY.get(f"optimizations.{name}") or REGISTRY[f"env.{name}"]
    return entry.advice


def _off(facts: Facts, *flags: str) -> list[str]:
    return [flag for flag in flags if not facts.opt.get(flag)]


def _update_advice(f: Facts) -> str:
    text = f"the update takes {f.shares['update']:.0f}% of the time: "
    if f.on_cuda:
        tips = [f"{flag}=true" for flag in _off(f, "compile_train_step", "amp")]
        return text + ", ".join(["bigger batches (fewer minibatches or more envs)", *tips]) + " (GPU kernels want work)"
    tips = []
    if f.opt.get("torch_threads") is None:
        tips.append(_tip("torch_threads"))
    if f.opt.get("optimizer_impl") == "forloop":
        tips.append(_tip("optimizer_impl"))
    if _mlp_policy(f) and not f.opt.get("analytic_grads"):
        tips.append(_tip("analytic_grads"))
    elif f.opt.get("analytic_grads") and not f.opt.get("numpy_update") and not f.opt.get("compile_train_step"):
        tips.append(_tip("numpy_update") + ", or compile_train_step=true for long runs (the hand-written step "
                    "compiled: seconds of warm-up)")
    tips.append("fewer, larger minibatches (ppo.num_minibatches) if the algorithm allows")
    return text + "; ".join(tips)


def _mlp_policy(f: Facts) -> bool:
    """A feed-forward MLP policy of PPO or DQN: what ``numpy_acting`` and ``analytic_grads`` cover."""
    model = f.config.get("model", {})
    return (f.config.get("algo") in ("ppo", "dqn") and model.get("body") == "mlp"
            and model.get("recurrent", "none") == "none")


RULES: list[Rule] = [
    Rule("env_bound",
         lambda f: f.shares["env"] > 50 and f.config["env"]["vectorization"] in ("serial", "sync"),
         lambda f: f"env stepping takes {f.shares['env']:.0f}% of the time with {f.config['env']['vectorization']} "
                   "vectorization: try env.vectorization=native (the env's own batched step, where it has one) or "
                   "async (subprocess workers pay off for slow envs); compare with `rlgauge sweep PRESET "
                   "--param env.vectorization=serial,sync,async,native`"),
    Rule("host_syncs",
         lambda f: f.syncs_per_step > 2,
         lambda f: f"{f.syncs_per_step:.1f} device->host syncs per vector step: "
                   + (" and ".join(f"{flag}=true" for flag in _off(f, "batch_inference", "sync_free_logging"))
                      or "find the remaining .item()/.cpu() calls")
                   + " (one batched action copy per step, one statistics sync per log interval)"),
    Rule("per_env_inference",
         lambda f: f.shares["inference"] > 30 and not f.opt.get("batch_inference"),
         lambda f: f"action selection takes {f.shares['inference']:.0f}% of the time, one forward per env: "
                   + _tip("batch_inference")),
    Rule("torch_acting",
         lambda f: (not f.on_cuda and f.shares["inference"] > 20 and bool(f.opt.get("batch_inference"))
                    and not f.opt.get("numpy_acting") and _mlp_policy(f)),
         lambda f: f"action selection takes {f.shares['inference']:.0f}% of the time in torch ops on the CPU, "
                   "mostly dispatch at these batch sizes: " + _tip("numpy_acting")),
    Rule("update_dominant", lambda f: f.shares["update"] > 50, _update_advice),
    Rule("transfer",
         lambda f: f.shares["transfer"] > 15,
         lambda f: f"host->device copies take {f.shares['transfer']:.0f}% of the time: "
                   + (_tip("pinned_memory") if f.on_cuda else
                      "batch_inference=true (one copy per step instead of one per env)")),
    Rule("logging",
         lambda f: f.shares["logging"] > 10 and not f.opt.get("sync_free_logging"),
         lambda f: f"logging/bookkeeping takes {f.shares['logging']:.0f}% of the time: " + _tip("sync_free_logging")),
    Rule("near_env_ceiling",
         lambda f: f.ceiling_fraction is not None and f.ceiling_fraction >= 0.7,
         lambda f: f"the run reaches {100 * f.ceiling_fraction:.0f}% of the env-only ceiling: learner-side flags "
                   "cannot give much more; a faster env backend or more envs can"),
    Rule("gpu_idle",
         lambda f: f.on_cuda and f.utilization_pct is not None and f.utilization_pct < 30,
         lambda f: f"the GPU is busy {f.utilization_pct:.0f}% of the time: it waits for the host; raise "
                   "env.num_envs or the batch size, batch_inference=true, cuda_graphs=true for the update"),
    Rule("latency_bound",
         lambda f: f.on_cuda and f.num_envs is not None and f.num_envs <= LATENCY_BOUND_ENVS,
         lambda f: f"{f.num_envs} envs on {f.config['device']}: each step launches the same kernels and copies for "
                   f"only {f.num_envs} rows, so the GPU is latency-bound at this batch size and the CPU may be the "
                   f"faster device (device: auto picks the accelerator, not the fastest device); measure both: "
                   f"`rlgauge run {f.preset} --device cpu,{f.config['device']}`, or run a GPU-scale preset (-gpu: "
                   "thousands of envs)"),
    Rule("compile_broken",
         lambda f: f.compile_works is False and bool(f.opt.get("compile_model") or f.opt.get("compile_train_step")),
         lambda f: "torch.compile fails on this machine but the config asks for it: compile_model=false and "
                   "compile_train_step=false (the run fell back to eager)"),
]


def advise(facts: Facts) -> list[dict[str, str]]:
    """Every rule that fires, in table order, as {rule, advice}."""
    return [{"rule": rule.name, "advice": rule.advice(facts)} for rule in RULES if rule.fires(facts)]


def facts_from(run: RunResult, ceiling: float | None, compile_works: bool | None) -> Facts:
    rate = run.metrics["env_steps_per_sec"]["median"]
    return Facts(shares=phase_shares(run), syncs_per_step=float(run.metrics.get("host_syncs_per_step") or 0.0),
                 utilization_pct=run.metrics.get("device_utilization_pct"),
                 ceiling_fraction=(rate / ceiling) if ceiling else None, config=run.config,
                 compile_works=compile_works, preset=run.preset)


def diagnosis(run: RunResult, ceiling: float | None, compile_works: bool | None) -> dict[str, Any]:
    """The run's profile, its ceiling fraction and the advice, as plain data."""
    facts = facts_from(run, ceiling, compile_works)
    rate = run.metrics["env_steps_per_sec"]
    return {
        "preset": run.preset, "variant": run.variant, "status": run.status, "device": run.config["device"],
        "vectorization": run.config["env"]["vectorization"], "num_envs": run.config["env"]["num_envs"],
        "env_steps_per_sec": rate, "phase_pct": {k: round(v, 1) for k, v in facts.shares.items()},
        "host_syncs_per_step": facts.syncs_per_step, "device_utilization_pct": facts.utilization_pct,
        "env_ceiling_steps_per_sec": ceiling,
        "fraction_of_ceiling": facts.ceiling_fraction,
        "advice": advise(facts),
        "machine": machine_load(run),
    }


def machine_load(run: RunResult) -> dict[str, Any]:
    """The machine's load while the profiled run was timed, and what it does to its figures."""
    state, verdict = run.machine_state or {}, run.quality or {}
    share = (state.get("others_cpu_share") or {}).get("median")
    cpu = (run.metrics.get("cpu_seconds_per_1k_env_steps") or {}).get("median")
    if share is None:
        effect = "not recorded"
    elif verdict.get("trustworthy", True):
        effect = ("other processes took little CPU while it was timed: the rates above are this code's own "
                  "on this machine")
    else:
        effect = ("the machine was busy while it was timed: the wall-time rates above are lower than on a quiet "
                  "machine and the phase shares shift towards whatever waits most; "
                  + (f"CPU seconds per 1k env steps ({cpu:.3f}) hold better, " if cpu is not None else "")
                  + "re-run on a quieter machine before acting on them")
    return {"load_avg_before": state.get("load_avg_before"), "load_avg_after": state.get("load_avg_after"),
            "usable_cores": state.get("usable_cores"), "others_cpu_share": share,
            "threads": state.get("threads"), "trustworthy": verdict.get("trustworthy"),
            "reasons": verdict.get("reasons", []), "effect": effect}


def diagnosis_lines(d: dict[str, Any]) -> list[str]:
    """The diagnosis as short human-readable lines."""
    rate = d["env_steps_per_sec"]
    util = "-" if d["device_utilization_pct"] is None else f"{d['device_utilization_pct']:.0f}%"
    lines = [f"profiled run: {d['preset']} {d['variant']} on {d['device']}, {d['num_envs']} envs "
             f"({d['vectorization']}): {rate['median']:,.0f} env steps/s [{rate['min']:,.0f}-{rate['max']:,.0f}]",
             "phase breakdown (% of timed wall time): "
             + ", ".join(f"{name} {pct:.1f}%" for name, pct in d["phase_pct"].items()),
             f"host syncs per vector step: {d['host_syncs_per_step']:.2f}; device utilisation: {util}"]
    if d["env_ceiling_steps_per_sec"]:
        lines.append(f"env-only ceiling (random actions, same backend and envs): {d['env_ceiling_steps_per_sec']:,.0f} "
                     f"env steps/s; this run reaches {100 * d['fraction_of_ceiling']:.1f}% of it")
    machine = d.get("machine") or {}
    if machine.get("others_cpu_share") is not None:
        load = machine.get("load_avg_before")
        lines.append(f"machine load: load average {load[0] if load else '-'} before the run; other processes took "
                     f"{machine['others_cpu_share']:.0%} of the {machine['usable_cores']} usable cores while it was "
                     f"timed: {machine['effect']}")
        lines += [f"  ! {reason}" for reason in machine["reasons"]]
    lines.append("advice:" if d["advice"] else "advice: no rule fired (no phase dominates; nothing obvious to try)")
    lines += [f"  - [{a['rule']}] {a['advice']}" for a in d["advice"]]
    return lines
