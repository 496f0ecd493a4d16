"""The rules table: each finding of a diagnosis -> the optimisation that addresses it.

A rule fires only on a finding (its evidence line quotes it). Each recommendation carries the
effect rlgauge measured for the matching flag on its reference trainers on this kind of device
(``reference_effects``: the data file ``rlgauge ablate --effects`` writes, labelled as theirs;
"no reference figure" where it has none) and how to check it on the user's own trainer (a
variant for the YAML and the ``rlgauge run`` that measures it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.diagnosis.frames import short
from harness.diagnosis.reference_effects import effect_of
from harness.diagnosis.host_syncs import (
    BLOCKING_TRANSFER, BRANCH, CUDA_SYNC, DATA_DEPENDENT, DATA_SHAPE, DISTRIBUTION_CHECKS, HOST_COPY, ITEM,
    LIBRARY_CONTROL, LOGGING, OPTIMIZER, PER_ENV_ACTING, STORAGE, TO_CPU)


@dataclass(frozen=True)
class Rule:
    """A finding (``evidence`` returns its line, or None when the diagnosis does not show it) and its fix."""

    name: str
    change: str
    flag: str | None
    evidence: Callable[[dict[str, Any]], str | None]
    variant: str
    """What to add under ``variants:`` of the user's YAML to measure the change (a key of their own)."""
    why: str
    """How the change removes the cost the finding shows."""
    change_for: Callable[[dict[str, Any]], str | None] | None = None
    """The change as this diagnosis needs it (naming what was built), where it differs from ``change``."""


def _syncs(d: dict[str, Any], kinds: tuple[str, ...], causes: tuple[str, ...]) -> tuple[float, str]:
    rows = [s for s in d["host_syncs"] if s["kind"] in kinds and s.get("cause", LOGGING) in causes
            and not s.get("eager_replay_only")]  # compiled code does not run the line as the replay did
    return sum(s["per_env_step"] for s in rows), ", ".join(short(s["where"]) for s in rows[:3])


_ANY_SYNC = (ITEM, HOST_COPY, BRANCH, DATA_SHAPE, TO_CPU, CUDA_SYNC)


def _per_env_acting(d: dict[str, Any]) -> str | None:
    """Actions chosen env by env: more than one acting forward of one row per vector step, or acting syncs
    (``.item()`` of each env's action, say) more than once per vector step."""
    envs = d["loop"].get("envs_per_step", 1.0)
    if envs < 1.5:  # one env per step: one forward and one copy per step is already the minimum
        return None
    parts = []
    per, rows = d["forwards_per_env_step"], d["rows_per_inference_forward"]
    if per * envs > 1.5 and rows < 1.5:
        sites = ", ".join(short(where) for where in d.get("inference_forward_sites", []))
        parts.append(f"{per:.2f} acting forwards per env step of {rows:.1f} row each" + (f" at {sites}" if sites else "")
                     + f" ({per * envs:.1f} per vector step of {envs:g} envs)")
    syncs, where = _syncs(d, _ANY_SYNC, (PER_ENV_ACTING,))
    if syncs:
        parts.append(f"{syncs:.2f} acting host syncs per env step at {where} (one per env, not one per vector step)")
    return "; ".join(parts) + ": actions chosen one env at a time" if parts else None


def _item_syncs(d: dict[str, Any]) -> str | None:
    per, where = _syncs(d, (ITEM, HOST_COPY, TO_CPU), (LOGGING,))
    return None if per < 0.25 else f"{per:.2f} syncs per env step for statistics or logging at {where}"


def _host_copies(d: dict[str, Any]) -> str | None:
    """More host copies per vector step than the one an env step needs (acting and optimizer syncs aside)."""
    per, where = _syncs(d, (HOST_COPY, DATA_SHAPE, TO_CPU), (LOGGING, DATA_DEPENDENT))
    per_vector_step = per * d["loop"].get("envs_per_step", 1.0)
    if per < 0.25 or per_vector_step <= 1.0:
        return None
    return f"{per:.2f} host copies per env step ({per_vector_step:.1f} per vector step) at {where}"


def _distribution_checks(d: dict[str, Any]) -> str | None:
    per, where = _syncs(d, _ANY_SYNC, (DISTRIBUTION_CHECKS,))
    if per < 0.05:
        return None
    classes = _distribution_classes(d)
    return (f"{per:.2f} host syncs per env step at {where} are torch.distributions"
            + (f" ({', '.join(classes)})" if classes else "") + " validating their arguments")


def _distribution_classes(d: dict[str, Any]) -> list[str]:
    found = [s.get("context") or "" for s in d["host_syncs"] if s.get("cause") == DISTRIBUTION_CHECKS]
    return sorted({c.partition(":")[2] for c in found if c.startswith("distribution:")})


def _distribution_change(d: dict[str, Any]) -> str | None:
    classes = _distribution_classes(d)
    if not classes:
        return None
    built = ", ".join(f"{name}(..., validate_args=False)" for name in classes)
    return (f"distribution argument checks off: {built} where it is built, or "
            "torch.distributions.Distribution.set_default_validate_args(False) once at start-up")


def _storage_copies(d: dict[str, Any]) -> str | None:
    rows = [s for s in d["host_syncs"] if s.get("cause") == STORAGE and not s.get("eager_replay_only")]
    per = sum(s["per_env_step"] for s in rows)
    if per < 0.05:
        return None
    into = sorted({s["context"].partition(":")[2] for s in rows if s.get("context")})
    return (f"{per:.2f} host copies per env step into {', '.join(into)} at "
            f"{', '.join(short(s['where']) for s in rows[:3])} (a step at a time)")


def _library_control(d: dict[str, Any]) -> str | None:
    rows = [s for s in d["host_syncs"] if s.get("cause") == LIBRARY_CONTROL]
    per = sum(s["per_env_step"] for s in rows)
    if per < 0.25:
        return None
    return (f"{per:.2f} control-flow syncs per env step inside the library's done/reset handling and bookkeeping "
            f"at {', '.join(short(s['where']) for s in rows[:3])}")


def _batch_loop(d: dict[str, Any]) -> str | None:
    loops = (d.get("hot_lines") or {}).get("batch_loops", [])
    if not loops:
        return None
    first = loops[0]
    return (f"a Python loop over the batch at {short(first['loop'])} launches {first['kernels_per_update']:.0f} small "
            f"kernels per update ({first['kernel_share']:.0f}% of the update's) at "
            f"{', '.join(short(w) for w in first['lines'][:3])}")


def _graph_acting(d: dict[str, Any]) -> str | None:
    rows = d.get("graph_building_acting", [])
    per = sum(r["per_env_step"] for r in rows)
    if not rows:
        return None
    sites = ", ".join(short(r["where"]) for r in rows[:3] if r["where"] != "?")
    return (f"{per:.2f} acting forwards per env step build an autograd graph nobody uses" + (f" at {sites}" if sites else "")
            + " (no backward follows before the env step)")


def _float64(d: dict[str, Any]) -> str | None:
    rows = d["float64"]
    if not rows:
        return None
    first = rows[0]
    replay = " (seen in an eager replay of compiled code: the only way to see that line)" if first.get(
        "eager_replay_only") else ""
    return (f"{sum(r['count'] for r in rows)} float64 ops at {len(rows)} sites; float64 enters at "
            f"{short(first['where'])} ({first['op']}{_call_named(first)}, {first['count']}x){replay}")


def _call_named(row: dict[str, Any]) -> str:
    """`` in `torch.as_tensor(reward)```: the call on the line that made the op, where the line has several."""
    call = row.get("call")
    return f" in `{call}`" if call else ""


def _env_bound(d: dict[str, Any]) -> str | None:
    share, classes = d["phases"]["env"], d["loop"]["env_classes"]
    if share < 50 or any(name in ("AsyncVectorEnv",) or "Pool" in name for name in classes):
        return None
    return f"env stepping takes {share:.0f}% of the time through {', '.join(classes) or 'gymnasium envs'}"


def _forloop_optimizer(d: dict[str, Any]) -> str | None:
    loops = [o["class"] for o in d["loop"]["optimizers"] if o["impl"] == "for-loop" and o["class"] in _FUSABLE]
    syncs, where = _syncs(d, _ANY_SYNC, (OPTIMIZER,))
    if not loops or (d["phases"]["update"] < 20 and syncs < 0.05):
        return None
    text = f"{', '.join(loops)} in its for-loop implementation, the update at {d['phases']['update']:.0f}% of the time"
    if syncs:
        text += f"; {syncs:.2f} host syncs per env step at {where} are its per-parameter step counters (.item())"
    return text


def _many_kernels(d: dict[str, Any]) -> str | None:
    loop = d["loop"]
    if loop["frames_compiled"] or loop["kernels_per_env_step"] < 20 or d["phases"]["update"] < 30:
        return None
    return (f"{loop['kernels_per_env_step']:.0f} kernels per env step, uncompiled, with the update at "
            f"{d['phases']['update']:.0f}% of the time")


def _graph_breaks(d: dict[str, Any]) -> str | None:
    loop = d["loop"]
    if not loop["graph_breaks"] and not loop["recompiles"]:
        return None
    sites = loop.get("graph_break_sites", [])
    named = "; ".join(f"{s['kind']} at {short(s['where'])}" for s in sites[:5])
    text = f"torch.compile: {loop['graph_breaks']} graph breaks" + (f" ({named})" if named else "")
    if loop["recompiles"]:
        reasons = loop.get("recompile_reasons", [])
        text += f"; {loop['recompiles']} recompiles while diagnosed" + (f" ({reasons[0]})" if reasons else "")
    return text


def _transfer(d: dict[str, Any]) -> str | None:
    share = d["phases"]["transfer"]
    rows = [s for s in d["host_syncs"] if s.get("cause") == BLOCKING_TRANSFER]
    per = sum(s["per_env_step"] for s in rows)
    if not d["device"].startswith("cuda") or (share < 15 and per < 0.05):
        return None
    blocking = (f"{per:.2f} blocking copies to the device per env step at "
                f"{', '.join(short(s['where']) for s in rows[:3])}") if per >= 0.05 else ""
    timed = f"host->device copies take {share:.0f}% of the time on {d['device']}" if share >= 15 else ""
    return "; ".join(part for part in (timed, blocking) if part)


def _cuda_update(d: dict[str, Any]) -> str | None:
    if not d["device"].startswith("cuda") or d["phases"]["update"] < 30:
        return None
    return f"the update takes {d['phases']['update']:.0f}% of the time on {d['device']}"


def _threads(d: dict[str, Any]) -> str | None:
    loop = d["loop"]
    busy = d["phases"]["inference"] + d["phases"]["update"]
    if not d["device"].startswith("cpu") or loop["torch_threads"] <= 1 or busy < 30:
        return None
    return (f"{loop['torch_threads']} torch threads on small tensors, inference and update at {busy:.0f}% of the "
            "time (thread hand-offs can cost more than they share)")


def _replay_conversions(d: dict[str, Any]) -> str | None:
    per = d["loop"]["host_tensors_per_update"]
    if per < 8:
        return None
    return f"{per:.0f} tensors made from NumPy data per optimizer step on the way into it (a sample at a time)"


_FUSABLE = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam")

RULES: list[Rule] = [
    Rule("per_env_inference", "batched acting: one forward over all envs per vector step, actions copied to the "
         "host once (obs of shape [num_envs, ...], one argmax/sample, one .cpu().numpy())", "batch_inference",
         _per_env_acting, "batched: {batched_acting: true}",
         "one forward and one host copy per vector step instead of one per env: the per-call overhead (Python, dispatch, kernel launches) is paid once"),
    Rule("item_per_step", "sync-free logging: keep statistics in device tensors, one .item() per log interval",
         "sync_free_logging", _item_syncs, "sync_free: {sync_free_logging: true}",
         "each .item() waits for the device and costs a Python round-trip; device-side accumulators pay it once per interval"),
    Rule("host_copies", "keep statistics on the device until one batched host copy per step",
         None, _host_copies, "one_copy: {one_host_copy: true}",
         "every host copy synchronises with the device; one copy per step is the minimum an env step needs"),
    Rule("distribution_checks", "distribution argument checks off: validate_args=False where the distribution is "
         "built, or torch.distributions.Distribution.set_default_validate_args(False) once at start-up", None,
         _distribution_checks, "no_checks: {validate_args: false}",
         "each distribution built checks its arguments on the host (a bool(tensor) per check): a sync and Python work per "
         "step; the checks find bugs, not speed, once a trainer works", _distribution_change),
    Rule("storage_copies", "keep rollout/replay storage as tensors on the training device and copy to the host once "
         "per rollout (or sample on the device), not one .cpu().numpy() per step and field", None, _storage_copies,
         "tensor_storage: {tensor_storage: true}",
         "each per-step copy into a NumPy buffer synchronises with the device and pays a Python round-trip per field; "
         "device tensors filled in place need none, and one copy per rollout pays it once"),
    Rule("library_control", "fewer, larger library calls: more envs per vector step (the library's done/reset checks "
         "run once per call, not per env), or the library's own batched/compiled collector", None,
         _library_control, "more_envs: {num_envs: 2x}",
         "the library tests done/reset flags with bool(tensor) on every call: a sync per check that does not grow with "
         "the number of envs stepped together"),
    Rule("acting_builds_graph", "act under torch.no_grad() (or torch.inference_mode()): the acting forward builds an "
         "autograd graph that no backward uses", None, _graph_acting, "no_grad_acting: {no_grad_acting: true}",
         "recording the graph costs time and memory on every acting forward; without it the forward runs plain kernels"),
    Rule("float64", "float32 at the source: dtype=torch.float32 where a tensor is made from NumPy data (or "
         ".astype(np.float32)); float64 doubles memory traffic and does not run on MPS", None, _float64,
         "float32: {float32_inputs: true}",
         "float64 kernels are slower and twice the bytes; MPS has no float64 and raises on it"),
    Rule("env_bound", "a vector env backend that steps envs in parallel or natively (gymnasium AsyncVectorEnv, "
         "an env's own vectorised step, EnvPool)", "vectorization", _env_bound, "async_envs: {vectorization: async}",
         "the envs step one after another in this process; another backend steps them in parallel or in one native call"),
    Rule("forloop_optimizer", "fused Adam: torch.optim.Adam(..., fused=True) (foreach=True where fused is not "
         "available)", "optimizer_impl", _forloop_optimizer, "fused_adam: {fused_adam: true}",
         "the for-loop Adam launches several kernels per parameter tensor; fused runs one kernel over all of them"),
    Rule("batch_loop", "a Python loop over the batch: vectorise it (one op over all rows: index_add_/scatter_add_ "
         "with the rows' indices, a gather, or torch.vmap), so the update launches one kernel per op, not one per row",
         None, _batch_loop, "vectorised: {vectorised_update: true}",
         "each iteration of the loop dispatches its small kernels from Python: the launch and dispatch overhead grows "
         "with the batch, while one batched op pays it once"),
    Rule("uncompiled_update", "torch.compile the update step (measure it: compiled tiny networks can be slower "
         "on a CPU)", "compile_train_step", _many_kernels, "compiled: {compile_update: true}",
         "compilation fuses the update's many small kernels and removes their Python dispatch"),
    Rule("graph_breaks", "remove the graph breaks the finding names where you can (print, .item(), data-dependent "
         "branches inside the compiled function); breaks at backward() and zero_grad() are dynamo's own: compile the "
         "forward and loss as one function and leave backward and the optimizer step outside it", None, _graph_breaks,
         "no_breaks: {}",
         "each graph break splits the compiled region and returns to Python; each recompile pays compilation again"),
    Rule("transfer", "pinned host buffers and .to(device, non_blocking=True)", "pinned_memory", _transfer,
         "pinned: {pinned_memory: true}",
         "pageable copies are staged and block; pinned memory lets the copy overlap with compute"),
    Rule("cuda_update", "AMP (bfloat16 autocast) and TF32 matmuls for the update on CUDA", "amp", _cuda_update,
         "amp: {amp: true}",
         "tensor cores run bfloat16/TF32 matmuls several times faster than float32"),
    Rule("threads", "torch.set_num_threads(1) in the factory (or the count of free cores)", "torch_threads",
         _threads, "one_thread: {torch_threads: 1}",
         "small ops do not split across threads profitably; the hand-offs and neighbours' load cost more"),
    Rule("per_sample_replay", "tensor replay: preallocated tensors, indices sampled with torch.randint, one "
         "gather per minibatch", "replay", _replay_conversions, "tensor_replay: {tensor_replay: true}",
         "one tensor per sample means one conversion and allocation per sample; a preallocated buffer gathers a minibatch in one op"),
]


def recommend(d: dict[str, Any], target: str, effects: Path | None = None,
              tried_by: Callable[[str], list[str]] | None = None) -> list[dict[str, str]]:
    """Every rule whose finding shows, in table order, as ``{rule, change, why, evidence, effect, check}``;
    ``effect`` quotes the reference trainers' figures from ``effects`` (the packaged file ``ablate`` writes)."""
    found = []
    for rule in RULES:
        evidence = rule.evidence(d)
        if evidence is None:
            continue
        flag = rule.flag
        check = (f"rlgauge run {target} --variant {_flag_variant(flag)}" if d["kind"] == "preset" else
                 own_check(rule.variant, target, d["variant"], rule.name, tried_by))
        change = (rule.change_for(d) if rule.change_for else None) or rule.change
        found.append({"rule": rule.name, "change": change, "why": rule.why, "evidence": evidence,
                      "effect": effect_of(flag, d["device"], effects), "check": check})
    return found


def own_check(variant: str, target: str, diagnosed: str, rule: str = "",
              tried_by: Callable[[str], list[str]] | None = None) -> str:
    """How to measure a change on a user's trainer: ``rlgauge try --only`` where it makes the change itself
    (``tried_by(rule)``: the names of try's changes for a rule, given by the caller, since try builds on a diagnosis
    and not the reverse), and a variant added to its YAML (a switch the factory reads) with the ``rlgauge run`` that
    measures it."""
    tried = tried_by(rule) if tried_by is not None and rule else []
    by_try = f"without editing: rlgauge try {target} --only {','.join(tried)}; or " if tried else ""
    return by_try + _own_variant_check(variant, target, diagnosed)


def _own_variant_check(variant: str, target: str, diagnosed: str) -> str:
    name = variant.split(":")[0]
    path = target.split("--config ", 1)[1].strip() if "--config " in target else target
    if not path.endswith((".yaml", ".yml")):
        return (f"write a YAML with `trainer:` and `variants: {{baseline: {{}}, {variant}}}` (a switch your factory "
                f"reads), then rlgauge run FILE.yaml --variant baseline,{name}")
    reference = diagnosed if diagnosed != "config" else "baseline"
    added = f"`{variant}`" if diagnosed != "config" else f"`baseline: {{}}` and `{variant}`"
    return (f"add under variants: in {path} {added} (a switch your factory reads), then "
            f"rlgauge run {path} --variant {reference},{name}")


def _flag_variant(flag: str | None) -> str:
    """``--variant both``, or the baseline with the flag at its optimised value (the flag registry's)."""
    from reference_trainers.config.flags import REGISTRY

    entry = REGISTRY.get(_dotted(flag)) if flag is not None else None
    if entry is None:
        return "both"
    values = list(entry.optimised)
    value = next((v for v in ("fused", "native") if v in values), values[0] if values else None)
    shown = str(value).lower() if isinstance(value, bool) else value
    return f"baseline --set {_dotted(flag)}={shown} (or --variant both)"


def _dotted(flag: str) -> str:
    return f"env.{flag}" if flag == "vectorization" else f"optimizations.{flag}"
